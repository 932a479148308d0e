package agent

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// VerbNet gives the guest its egress network (see NetConfig):
//
//	net <base64url(JSON NetConfig)>  -> net
//
// The host sends it after key, after every boot and restore of a VM on an
// egress lane: a restored guest holds the network of the VM it was
// snapshotted from (a golden's, for a clone), whose MAC and address are
// another VM's. An agent that does not know the verb answers "error net
// unknown command", and its guest has no egress (the host logs it); a
// config of a newer version than the agent knows is refused the same way.
const VerbNet = "net"

// NetConfigVersion is the version of NetConfig this package speaks.
const NetConfigVersion = 1

// NetConfig is a guest's egress network: the NIC on its tap (found by its
// PCI address, since restores keep the golden's interface names and MAC),
// the MAC and address the host gave it, its gateway (the door's address),
// and the proxy the guest's processes use, with the node CA they trust
// when intercepted TLS is on.
type NetConfig struct {
	V int `json:"v"`
	// PCI is the NIC's PCI address, e.g. "0000:00:10.0".
	PCI string `json:"pci"`
	MAC string `json:"mac"`
	// Addr is the guest's address with its subnet's prefix length.
	Addr string `json:"addr"`
	// Gateway is the door's address: the default route.
	Gateway string `json:"gw"`
	// Proxy is the door's URL (http://<door>), set as every proxy variable.
	Proxy string `json:"proxy"`
	// NoProxy is NO_PROXY / no_proxy (default "localhost,127.0.0.1,::1").
	NoProxy string `json:"no_proxy,omitempty"`
	// CA is the node CA's PEM ("" when nothing is intercepted).
	CA string `json:"ca,omitempty"`
}

// DefaultNoProxy is NO_PROXY when the host names none: the guest's own
// loopback (port_forward targets) never goes through the proxy.
const DefaultNoProxy = "localhost,127.0.0.1,::1"

// Validate reports what makes c unusable.
func (c NetConfig) Validate() error {
	if c.V != NetConfigVersion {
		return fmt.Errorf("net config version %d (this agent speaks %d)", c.V, NetConfigVersion)
	}
	if c.PCI == "" || strings.ContainsAny(c.PCI, "/\x00") || c.PCI == "." || c.PCI == ".." {
		return fmt.Errorf("net config: bad PCI address %q", c.PCI)
	}
	if m, err := net.ParseMAC(c.MAC); err != nil || len(m) != 6 || m[0]&1 != 0 {
		return fmt.Errorf("net config: bad MAC %q", c.MAC)
	}
	p, err := netip.ParsePrefix(c.Addr)
	if err != nil || !p.Addr().Is4() {
		return fmt.Errorf("net config: bad address %q", c.Addr)
	}
	gw, err := netip.ParseAddr(c.Gateway)
	if err != nil || !gw.Is4() || !p.Masked().Contains(gw) {
		return fmt.Errorf("net config: gateway %q is not in %s", c.Gateway, c.Addr)
	}
	if u, err := url.Parse(c.Proxy); err != nil || u.Scheme != "http" || u.Host == "" {
		return fmt.Errorf("net config: bad proxy %q", c.Proxy)
	}
	if strings.ContainsAny(c.NoProxy, "\n\x00") {
		return errors.New("net config: bad no_proxy")
	}
	if c.CA != "" && !strings.Contains(c.CA, "-----BEGIN CERTIFICATE-----") {
		return errors.New("net config: CA is not a PEM certificate")
	}
	return nil
}

// EncodeNet is the argument of a net request.
func EncodeNet(c NetConfig) (string, error) {
	return encodeArg(c)
}

// DecodeNet reads and validates a net request's argument.
func DecodeNet(arg string) (NetConfig, error) {
	var c NetConfig
	if err := decodeArg(arg, &c, false); err != nil {
		return c, fmt.Errorf("net config: %w", err)
	}
	return c, c.Validate()
}

// encodeArg is a request argument that carries a structure (net, mount):
// v as base64url JSON, which fits a line.
func encodeArg(v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// decodeArg reads an encodeArg argument into v. strict refuses fields v
// does not have.
func decodeArg(arg string, v any, strict bool) error {
	b, err := base64.RawURLEncoding.DecodeString(arg)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if strict {
		dec.DisallowUnknownFields()
	}
	return dec.Decode(v)
}

// SetNet gives the guest its egress network (VerbNet).
func (c *Client) SetNet(ctx context.Context, nc NetConfig) error {
	if err := nc.Validate(); err != nil {
		return err
	}
	arg, err := EncodeNet(nc)
	if err != nil {
		return err
	}
	if len(arg)+len(VerbNet)+64 > MaxLine {
		return fmt.Errorf("agent: net config of %d bytes does not fit a line of %d", len(arg), MaxLine)
	}
	resp, err := c.Do(ctx, VerbNet, arg)
	if err != nil {
		return err
	}
	_, err = expect(resp, VerbNet)
	return err
}

// Files of the guest's trust store and environment (under Trust.Root).
const (
	// GuestCAFile is the node CA where update-ca-certificates looks (a
	// Debian guest); the bundle is complete without it running.
	GuestCAFile = "/usr/local/share/ca-certificates/sbx-egress.crt"
	// GuestBundle is the bundle every TLS variable points at: the system
	// bundle (when the image has one) followed by the node CA.
	GuestBundle = "/etc/ssl/certs/sbx-egress-bundle.crt"
	// GuestProfile exports the environment for login shells.
	GuestProfile = "/etc/profile.d/sbx-egress.sh"
)

// SystemBundles are the system bundles a guest image may have, first found
// first.
var SystemBundles = []string{"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem"}

// Env is the environment the agent's processes get from c: the proxy
// variables and, with a CA, the TLS variables pointing at GuestBundle.
func (c NetConfig) Env() map[string]string {
	np := c.NoProxy
	if np == "" {
		np = DefaultNoProxy
	}
	env := map[string]string{
		"HTTP_PROXY": c.Proxy, "HTTPS_PROXY": c.Proxy, "http_proxy": c.Proxy, "https_proxy": c.Proxy,
		"NO_PROXY": np, "no_proxy": np,
	}
	if c.CA != "" {
		for _, k := range []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "CURL_CA_BUNDLE"} {
			env[k] = GuestBundle
		}
	}
	return env
}

// InstallTrust writes c's CA and environment into the guest's filesystem
// under root ("/" in the guest; a temp dir in tests): GuestCAFile, the
// bundle GuestBundle (the first of SystemBundles that exists, then the CA)
// and GuestProfile. Without a CA, the CA file and bundle are removed and
// the profile exports the proxy variables only. Every file is replaced
// whole (temp file, rename), so a wake that gives the same config again
// changes nothing.
func InstallTrust(root string, c NetConfig) error {
	at := func(p string) string { return filepath.Join(root, p) }
	if c.CA == "" {
		for _, p := range []string{GuestCAFile, GuestBundle} {
			if err := os.Remove(at(p)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
	} else {
		ca := strings.TrimSpace(c.CA) + "\n"
		var bundle []byte
		for _, p := range SystemBundles {
			if b, err := os.ReadFile(at(p)); err == nil {
				bundle = append(b, '\n')
				break
			}
		}
		if !bytes.Contains(bundle, []byte(strings.TrimSpace(c.CA))) {
			bundle = append(bundle, ca...)
		}
		if err := writeFile(at(GuestCAFile), []byte(ca)); err != nil {
			return err
		}
		if err := writeFile(at(GuestBundle), bundle); err != nil {
			return err
		}
	}
	env := c.Env()
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var sh strings.Builder
	sh.WriteString("# written by sbx-agent: the sandbox's egress proxy\n")
	for _, k := range keys {
		fmt.Fprintf(&sh, "export %s='%s'\n", k, strings.ReplaceAll(env[k], "'", `'\''`))
	}
	return writeFile(at(GuestProfile), []byte(sh.String()))
}

func writeFile(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
