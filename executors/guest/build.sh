#!/usr/bin/env bash
# Builds the sbxlog guest's kernel and initramfs from Debian packages and prints
# the directory that holds them (last line of stdout). Booted alone they are the
# "busybox" template (the fast test guest); with a root disk made by
# executors/guest/template.sh, every other template (the initramfs switches into
# the disk's root, see executors/guest/init):
#
#   <dir>/vmlinuz      kernel of the linux-image-*-cloud-amd64 package that
#                      linux-image-cloud-amd64 depends on (apt-get download, dpkg-deb -x)
#   <dir>/initrd.img   gzip'd newc cpio: busybox-static, executors/guest/init as /init,
#                      sbx-agent (cmd/sbx-agent, static Go) as /sbin/sbx-agent, and the
#                      kernel's modules for the agent's NIC and a template's root
#                      disk (MODULES and what they depend on) in /lib/modules, with
#                      their load order in /lib/modules/load
#   <dir>/manifest     the inputs the directory name hashes
#
# The output is cached in ${SBX_CACHE:-$HOME/.cache/sbxlog}/guest/<hash>, where hash
# covers this script, executors/guest/init, the sbx-agent binary, the busybox binary and the
# kernel package's name and version; a second run with the same inputs only
# rebuilds the agent (a cached go build), marks the build the newest (touches its
# manifest) and prints the directory.
#
# Needs: go, busybox-static, cpio, gzip, dpkg-deb and apt lists (apt-get update).
# SBX_KERNEL_DEB=/path/to/linux-image-...deb uses that package instead of asking apt.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# The modules the guest loads: virtio over PCI, the virtio NIC that carries
# the agent's data plane and the virtio disk a template's root is on (the
# cloud kernel builds them as modules; ext4 is built in).
MODULES="virtio_pci virtio_net virtio_blk"
CACHE=${SBX_CACHE:-${HOME:-/root}/.cache/sbxlog}/guest
GO=${GO:-go}

die() { echo "executors/guest/build.sh: $*" >&2; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || die "$1 not found (apt-get install $2)"; }

need cpio cpio
need gzip gzip
need dpkg-deb dpkg
need sha256sum coreutils
need flock util-linux
command -v "$GO" >/dev/null 2>&1 || die "go not found (set GO=/path/to/go)"
bb_version=$(dpkg-query -W -f='${Status} ${Version}' busybox-static 2>/dev/null || true)
case "$bb_version" in
"install ok installed "*) bb_version=${bb_version#install ok installed } ;;
*) die "busybox-static is not installed (apt-get install busybox-static)" ;;
esac
BUSYBOX=/bin/busybox
[ -x "$BUSYBOX" ] || die "$BUSYBOX missing although busybox-static is installed"

mkdir -p "$CACHE"
work=$(mktemp -d "$CACHE/.build-XXXXXX")
trap 'rm -rf "$work"' EXIT

# The agent first: its binary is part of the hash. -trimpath and an empty build id
# make the binary a function of the sources and the toolchain.
(cd "$ROOT" && CGO_ENABLED=0 GOOS=linux GOARCH=amd64 "$GO" build -trimpath \
	-ldflags='-s -w -buildid=' -o "$work/sbx-agent" ./cmd/sbx-agent) ||
	die "building sbx-agent failed"

# Kernel package: the one the cloud meta package depends on, or SBX_KERNEL_DEB.
if [ -n "${SBX_KERNEL_DEB:-}" ]; then
	[ -f "$SBX_KERNEL_DEB" ] || die "SBX_KERNEL_DEB=$SBX_KERNEL_DEB does not exist"
	kpkg=$(dpkg-deb -f "$SBX_KERNEL_DEB" Package)
	kver=$(dpkg-deb -f "$SBX_KERNEL_DEB" Version)
else
	need apt-cache apt
	# One apt-cache call (each costs a second where apt keeps no binary cache): the
	# meta package pins its image package to an exact version.
	dep=$(apt-cache show --no-all-versions linux-image-cloud-amd64 2>/dev/null |
		sed -n 's/^Depends:.*\(linux-image-[^ ,]*-cloud-amd64\(-unsigned\)\{0,1\}\) (= \([^)]*\)).*/\1 \3/p' | head -n1)
	[ -n "$dep" ] || die "cannot resolve linux-image-cloud-amd64 to its image package (run apt-get update)"
	kpkg=${dep% *}
	kver=${dep#* }
fi

{
	echo "format 1"
	echo "build.sh $(sha256sum <"$ROOT/executors/guest/build.sh" | cut -d' ' -f1)"
	echo "init $(sha256sum <"$ROOT/executors/guest/init" | cut -d' ' -f1)"
	echo "sbx-agent $(sha256sum <"$work/sbx-agent" | cut -d' ' -f1)"
	echo "busybox-static $bb_version $(sha256sum <"$BUSYBOX" | cut -d' ' -f1)"
	echo "kernel $kpkg $kver"
	# What the initramfs can do: switch into a template's root disk
	# (sbx.root=). executors/qemu pairs template disks only with builds
	# that say so.
	echo "features root-disk"
} >"$work/manifest"
key=$(sha256sum <"$work/manifest" | cut -c1-16)
out="$CACHE/$key"

done_already() { [ -s "$out/vmlinuz" ] && [ -s "$out/initrd.img" ] && [ -s "$out/manifest" ]; }
# A reused build becomes the newest: CachedGuest takes the one asked for last.
reuse() {
	touch "$out/manifest"
	echo "$out"
	exit 0
}
if done_already; then
	reuse
fi

# Concurrent test packages may build at once; one builds, the others wait and reuse.
exec 9>"$CACHE/.lock-$key"
flock 9
if done_already; then
	reuse
fi

echo "executors/guest/build.sh: building guest $key (kernel $kpkg $kver)" >&2
stage="$work/out"
mkdir -p "$stage" "$work/deb"
if [ -n "${SBX_KERNEL_DEB:-}" ]; then
	deb=$SBX_KERNEL_DEB
else
	need apt-get apt
	sandbox=()
	# apt drops to the _apt user for downloads, which cannot write a root-only dir.
	[ "$(id -u)" = 0 ] && sandbox=(-o APT::Sandbox::User=root)
	(cd "$work/deb" && apt-get -q "${sandbox[@]}" download "$kpkg=$kver" >&2) ||
		die "apt-get download $kpkg=$kver failed"
	deb=$(ls "$work/deb"/*.deb)
fi
dpkg-deb -x "$deb" "$work/kernel"
vmlinuz=$(ls "$work/kernel"/boot/vmlinuz-* 2>/dev/null | head -n1)
[ -n "$vmlinuz" ] || die "no boot/vmlinuz-* in $deb"
cp "$vmlinuz" "$stage/vmlinuz"

rootfs="$work/rootfs"
mkdir -p "$rootfs"/{bin,sbin,dev,proc,sys,tmp,lib/modules}

# MODULES and their dependencies (each module's modinfo "depends=" line; the
# package has no modules.dep), dependencies first. Built-in ones need nothing.
kmods=$(ls -d "$work/kernel"/lib/modules/*/ 2>/dev/null | head -n1)
[ -n "$kmods" ] || die "no lib/modules in $deb"
declare -A modfile=() loaded=()
while IFS= read -r f; do
	n=$(basename "$f" .ko)
	modfile[${n//-/_}]=$f
done < <(find "$kmods" -name '*.ko')
load=()
add_module() {
	local m=${1//-/_} dep
	[ -n "${loaded[$m]:-}" ] && return 0
	loaded[$m]=1
	if [ -z "${modfile[$m]:-}" ]; then
		grep -q "/$m.ko\$" "$kmods/modules.builtin" 2>/dev/null && return 0
		die "kernel module $m is neither in $kpkg nor built in (compressed modules are not supported)"
	fi
	for dep in $(tr '\0' '\n' <"${modfile[$m]}" | sed -n 's/^depends=//p' | tr ',' ' '); do
		add_module "$dep"
	done
	load+=("$m")
	cp "${modfile[$m]}" "$rootfs/lib/modules/$m.ko"
}
for m in $MODULES; do
	add_module "$m"
done
printf '%s\n' "${load[@]}" >"$rootfs/lib/modules/load"

cp "$BUSYBOX" "$rootfs/bin/busybox"
ln -s busybox "$rootfs/bin/sh"
install -m 0755 "$ROOT/executors/guest/init" "$rootfs/init"
install -m 0755 "$work/sbx-agent" "$rootfs/sbin/sbx-agent"
find "$rootfs" -exec touch -h -d @0 {} +
(cd "$rootfs" && find . -mindepth 1 | LC_ALL=C sort |
	cpio --quiet -o -H newc -R 0:0 --reproducible) | gzip -9n >"$stage/initrd.img"
cp "$work/manifest" "$stage/manifest"

rm -rf "$out"
mv "$stage" "$out"
echo "executors/guest/build.sh: guest $key ready in $out" >&2
echo "$out"
