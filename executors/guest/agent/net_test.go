package agent

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testCA is a PEM certificate as large as the node CA's (P-256).
func testCA(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sbxlog egress CA"},
		NotBefore: time.Unix(0, 0), NotAfter: time.Unix(1<<32, 0), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

func goodNet(ca string) NetConfig {
	return NetConfig{V: NetConfigVersion, PCI: "0000:00:10.0", MAC: "02:11:22:33:44:55", Addr: "10.77.0.9/24",
		Gateway: "10.77.0.1", Proxy: "http://10.77.0.1:20001", CA: ca}
}

// TestSetNet: the net verb carries a config with the node CA through the
// serial protocol's line limit to the Server's hook; a bad or newer
// config and an agent without the hook are refused with a RemoteError.
func TestSetNet(t *testing.T) {
	s := newServer(t)
	var got []NetConfig
	s.Net = func(c NetConfig) error { got = append(got, c); return nil }
	c := pipe(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	want := goodNet(testCA(t))
	if err := c.SetNet(ctx, want); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != want {
		t.Fatalf("the hook got %+v, want %+v", got, want)
	}
	newer := want
	newer.V = NetConfigVersion + 1
	arg, _ := EncodeNet(newer)
	var re *RemoteError
	if _, err := c.Do(ctx, VerbNet, arg); !errors.As(err, &re) || !strings.Contains(re.Msg, "version") {
		t.Fatalf("a newer config: %v, want refused for its version", err)
	}
	for name, mut := range map[string]func(*NetConfig){
		"multicast mac":      func(n *NetConfig) { n.MAC = "01:00:5e:00:00:01" },
		"gateway off subnet": func(n *NetConfig) { n.Gateway = "10.78.0.1" },
		"pci path":           func(n *NetConfig) { n.PCI = "../x" },
		"https proxy":        func(n *NetConfig) { n.Proxy = "https://10.77.0.1:1" },
		"ca not pem":         func(n *NetConfig) { n.CA = "nope" },
	} {
		n := want
		mut(&n)
		if n.Validate() == nil {
			t.Errorf("%s: valid", name)
		}
		arg, _ := EncodeNet(n)
		if _, err := c.Do(ctx, VerbNet, arg); !errors.As(err, &re) {
			t.Errorf("%s: %v, want a RemoteError", name, err)
		}
	}
	if len(got) != 1 {
		t.Fatalf("the hook ran for refused configs: %+v", got)
	}
	// An agent without the hook is one that predates the verb.
	old := pipe(t, newServer(t))
	if err := old.SetNet(ctx, want); !errors.As(err, &re) || re.Verb != VerbNet {
		t.Fatalf("an agent without net: %v, want a RemoteError on net", err)
	}
}

// TestInstallTrust: the bundle is the image's system bundle and the node
// CA (once, however often it is installed), the CA sits where
// update-ca-certificates reads it, the profile exports the proxy and TLS
// variables; without a CA the CA files go and the proxy stays.
func TestInstallTrust(t *testing.T) {
	root := t.TempDir()
	sys := "-----BEGIN CERTIFICATE-----\nSYSTEMROOT\n-----END CERTIFICATE-----\n"
	if err := os.MkdirAll(filepath.Join(root, "etc/ssl/certs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, SystemBundles[0]), []byte(sys), 0o644); err != nil {
		t.Fatal(err)
	}
	ca := testCA(t)
	c := goodNet(ca)
	for range 2 { // a wake gives the same config again
		if err := InstallTrust(root, c); err != nil {
			t.Fatal(err)
		}
	}
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	bundle := read(GuestBundle)
	if !strings.HasPrefix(bundle, sys) || strings.Count(bundle, strings.TrimSpace(ca)) != 1 {
		t.Fatalf("bundle:\n%s", bundle)
	}
	if read(GuestCAFile) != ca {
		t.Fatal("the CA file is not the CA")
	}
	prof := read(GuestProfile)
	for _, want := range []string{"export HTTPS_PROXY='http://10.77.0.1:20001'", "export http_proxy=", "export NO_PROXY='" + DefaultNoProxy + "'",
		"export SSL_CERT_FILE='" + GuestBundle + "'", "export REQUESTS_CA_BUNDLE=", "export PIP_CERT=", "export CURL_CA_BUNDLE="} {
		if !strings.Contains(prof, want) {
			t.Errorf("profile lacks %q:\n%s", want, prof)
		}
	}
	// A busybox guest has no system bundle: the bundle is the CA alone.
	bare := t.TempDir()
	if err := InstallTrust(bare, c); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(bare, GuestBundle)); strings.TrimSpace(string(b)) != strings.TrimSpace(ca) {
		t.Fatalf("bare bundle: %q", b)
	}
	c.CA = ""
	if err := InstallTrust(root, c); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{GuestCAFile, GuestBundle} {
		if _, err := os.Stat(filepath.Join(root, p)); !os.IsNotExist(err) {
			t.Errorf("%s kept without a CA: %v", p, err)
		}
	}
	if prof := read(GuestProfile); strings.Contains(prof, "SSL_CERT_FILE") || !strings.Contains(prof, "HTTP_PROXY") {
		t.Errorf("profile without a CA:\n%s", prof)
	}
}
