#!/usr/bin/env bash
# Builds a template's root disk from Debian packages (packages in, template
# out) and prints the directory that holds it (last line of stdout):
#
#   <dir>/rootfs.img   raw ext4 image (SIZE, sparse) of a Debian system:
#                      mmdebstrap --variant=minbase of SUITE from the host's apt
#                      sources, with BASE_PACKAGES and EXTRA_PACKAGES, no
#                      recommends, no docs, man pages or locales. Read only: the
#                      backing file of every VM's disk, never written
#   <dir>/disk.qcow2   an empty qcow2 overlay over rootfs.img (absolute path):
#                      what executors/qemu clones into each VM's run dir, so a
#                      VM's disk holds only what the VM wrote
#   <dir>/packages     the installed packages and their versions
#   <dir>/manifest     the inputs the directory name hashes
#
# Usage: executors/guest/template.sh [NAME]     (NAME defaults to "default")
#   EXTRA_PACKAGES="pkg ..."   Debian packages to add (e.g. "nodejs build-essential")
#   SUITE                      default: the host's VERSION_CODENAME
#   SOURCES                    apt sources file (one-line or deb822) to build from;
#                              default: the host's Debian sources
#   SIZE                       image size (default 2G; a sparse file)
#
# The image holds nothing of the project's: the kernel and initramfs of
# executors/guest/build.sh boot it (the initramfs mounts it on sbx.root=/dev/vda
# and runs executors/guest/init's second stage in it: the SSH server, the agent).
# So the agent can change without a rebuild here, and sandboxd serves template
# NAME from ${SBX_CACHE:-$HOME/.cache/sbxlog}/template/NAME/<hash>, the newest
# build (executors/qemu.CachedTemplates), with the newest kernel and initramfs.
# The hash covers this script, the package list, the suite, the sources file,
# SIZE and mmdebstrap's version; the archive's contents are not pinned (see
# <dir>/packages for what a build got).
#
# Needs: mmdebstrap, mke2fs (e2fsprogs), qemu-img (qemu-utils), root (mmdebstrap's
# chroot and the image's file owners).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
NAME=${1:-default}
# What every template has: a shell and the usual tools, Python, git, TLS roots,
# and an SSH server on port 22 (dropbear: small, and quick to start under TCG).
BASE_PACKAGES="bash coreutils python3 python3-pip git ca-certificates curl netcat-openbsd dropbear-bin iproute2 procps"
EXTRA_PACKAGES=${EXTRA_PACKAGES:-}
SIZE=${SIZE:-2G}
CACHE=${SBX_CACHE:-${HOME:-/root}/.cache/sbxlog}/template

die() { echo "executors/guest/template.sh: $*" >&2; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || die "$1 not found (apt-get install $2)"; }

[[ "$NAME" =~ ^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$ ]] || die "template name $NAME: want [a-zA-Z0-9][a-zA-Z0-9._-]*, at most 63 characters"
[ "$NAME" != busybox ] || die "template name busybox is the initramfs guest's (executors/guest/build.sh)"
[ "$(id -u)" = 0 ] || die "must run as root (mmdebstrap's chroot, the image's file owners)"
need mmdebstrap mmdebstrap
need mkfs.ext4 e2fsprogs
need qemu-img qemu-utils
need sha256sum coreutils
need flock util-linux

if [ -z "${SUITE:-}" ]; then
	SUITE=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
	[ -n "$SUITE" ] || die "cannot tell the host's suite from /etc/os-release: set SUITE"
fi
if [ -z "${SOURCES:-}" ]; then
	for f in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list; do
		if [ -s "$f" ] && grep -qs '^[^#]*debian' "$f"; then
			SOURCES=$f
			break
		fi
	done
	[ -n "${SOURCES:-}" ] || die "no Debian apt sources found: set SOURCES to a sources file"
fi
[ -s "$SOURCES" ] || die "SOURCES=$SOURCES is missing or empty"
packages=$(printf '%s\n' $BASE_PACKAGES $EXTRA_PACKAGES | LC_ALL=C sort -u | tr '\n' ' ')
packages=${packages% }
for p in $packages; do
	[[ "$p" =~ ^[a-z0-9][a-z0-9.+-]+$ ]] || die "package name $p is not a Debian package name"
done

mkdir -p "$CACHE/$NAME"
work=$(mktemp -d "$CACHE/$NAME/.build-XXXXXX")
trap 'rm -rf "$work"' EXIT
{
	echo "format 1"
	echo "template.sh $(sha256sum <"$ROOT/executors/guest/template.sh" | cut -d' ' -f1)"
	echo "mmdebstrap $(mmdebstrap --version | head -n1)"
	echo "suite $SUITE"
	echo "sources $(sha256sum <"$SOURCES" | cut -d' ' -f1)"
	echo "size $SIZE"
	echo "packages $packages"
} >"$work/manifest"
key=$(sha256sum <"$work/manifest" | cut -c1-16)
out="$CACHE/$NAME/$key"

done_already() { [ -s "$out/rootfs.img" ] && [ -s "$out/disk.qcow2" ] && [ -s "$out/manifest" ]; }
if done_already; then
	echo "$out"
	exit 0
fi
exec 9>"$CACHE/$NAME/.lock-$key"
flock 9
if done_already; then
	echo "$out"
	exit 0
fi

echo "executors/guest/template.sh: building template $NAME ($key): $SUITE, $packages" >&2
stage="$work/out"
rootfs="$work/rootfs"
mkdir -p "$stage"
start=$(date +%s)
# --customize-hook: per-VM state out of the image. The hostname is the
# init's; SSH host keys are made in each VM (dropbear -R) or at its first
# boot (ssh-keygen -A), never shared through the image.
mmdebstrap --variant=minbase --mode=root --format=directory \
	--include="${packages// /,}" \
	--aptopt='APT::Install-Recommends "false"' \
	--dpkgopt=force-unsafe-io \
	--dpkgopt='path-exclude=/usr/share/doc/*' \
	--dpkgopt='path-include=/usr/share/doc/*/copyright' \
	--dpkgopt='path-exclude=/usr/share/man/*' \
	--dpkgopt='path-exclude=/usr/share/info/*' \
	--dpkgopt='path-exclude=/usr/share/locale/*' \
	--dpkgopt='path-exclude=/usr/share/lintian/*' \
	--customize-hook='echo sandbox >"$1/etc/hostname"' \
	--customize-hook='printf "127.0.0.1\tlocalhost\n127.0.1.1\tsandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n" >"$1/etc/hosts"' \
	--customize-hook='rm -f "$1"/etc/dropbear/dropbear_*_host_key "$1"/etc/ssh/ssh_host_*' \
	--customize-hook="chroot \"\$1\" dpkg-query -W -f='\${Package} \${Version}\n' >'$stage/packages'" \
	"$SUITE" "$rootfs" "$SOURCES" >&2 || die "mmdebstrap failed"

truncate -s "$SIZE" "$stage/rootfs.img"
mkfs.ext4 -q -F -L sbxroot -m 0 -E root_owner=0:0 -d "$rootfs" "$stage/rootfs.img" >&2 ||
	die "mkfs.ext4 -d failed"
chmod 0444 "$stage/rootfs.img"
# -u: the backing file is named by its final path, where it is not yet.
qemu-img create -q -f qcow2 -F raw -b "$out/rootfs.img" -u "$stage/disk.qcow2" "$SIZE" ||
	die "qemu-img create failed"
cp "$work/manifest" "$stage/manifest"
sync -f "$stage/rootfs.img"

rm -rf "$out"
mv "$stage" "$out"
used=$(du -sh --apparent-size "$rootfs" | cut -f1)
echo "executors/guest/template.sh: template $NAME ready in $out ($used of files, $(($(date +%s) - start)) s)" >&2
echo "$out"
