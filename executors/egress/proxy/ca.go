package proxy

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/sbxlog/sbxlog/executors/fsx"
)

// CA is the node's interception CA: a self-signed ECDSA P-256 root whose
// leaves the proxy presents for intercepted hosts. The guest trusts it once
// its PEM is installed (PEM, agent.GuestCAFile); nothing else does.
type CA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	pem     []byte
	leafKey *ecdsa.PrivateKey // one key for every leaf: signing a leaf is then one signature
	now     func() time.Time

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// CA file names in the directory LoadOrCreateCA keeps it in.
const (
	CACertFile = "ca.crt"
	CAKeyFile  = "ca.key"
)

const (
	caValidity   = 10 * 365 * 24 * time.Hour
	leafValidity = 90 * 24 * time.Hour
	leafRenew    = 24 * time.Hour
	maxLeaves    = 1024
)

// ErrBadCA: the CA files are not a certificate and its key.
var ErrBadCA = errors.New("proxy: bad CA files")

// LoadOrCreateCA loads the CA kept in dir, or makes one there (the key
// 0600, written before the certificate, each replaced atomically and
// fsynced with its directory, so a crash or a power loss leaves no
// certificate without its key, nor an empty file).
func LoadOrCreateCA(dir string) (*CA, error) {
	certPath, keyPath := filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile)
	certPEM, err := os.ReadFile(certPath)
	if errors.Is(err, os.ErrNotExist) {
		ca, err := NewCA("sbxlog egress CA")
		if err != nil {
			return nil, err
		}
		der, err := x509.MarshalECPrivateKey(ca.key)
		if err != nil {
			return nil, err
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
		if err := fsx.WriteFileAtomic(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
			return nil, err
		}
		if err := fsx.WriteFileAtomic(certPath, ca.pem, 0o644); err != nil {
			return nil, err
		}
		// dir itself may be new: its entry in the parent too.
		if err := fsx.SyncTree(dir); err != nil {
			return nil, err
		}
		return ca, nil
	}
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, err
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, fmt.Errorf("%w in %s", ErrBadCA, dir)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadCA, err)
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadCA, err)
	}
	if !key.PublicKey.Equal(cert.PublicKey) || !cert.IsCA {
		return nil, fmt.Errorf("%w: the key does not match a CA certificate", ErrBadCA)
	}
	return newCA(cert, key, certPEM)
}

// NewCA makes a CA in memory.
func NewCA(cn string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: cn},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(caValidity),
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return newCA(cert, key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

func newCA(cert *x509.Certificate, key *ecdsa.PrivateKey, pemBytes []byte) (*CA, error) {
	lk, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	return &CA{cert: cert, key: key, pem: pemBytes, leafKey: lk, now: time.Now, leaves: map[string]*tls.Certificate{}}, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		panic(err)
	}
	return n
}

// PEM is the CA certificate, for the guest to trust.
func (c *CA) PEM() []byte { return append([]byte(nil), c.pem...) }

// Pool is a pool holding the CA (for tests standing in for a guest).
func (c *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(c.cert)
	return p
}

// Leaf returns the certificate the proxy presents for host, made on first
// use and renewed a day before it expires.
func (c *CA) Leaf(host string) (*tls.Certificate, error) {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.leaves[host]; ok && now.Add(leafRenew).Before(l.Leaf.NotAfter) {
		return l, nil
	}
	notAfter := now.Add(leafValidity)
	if notAfter.After(c.cert.NotAfter) {
		notAfter = c.cert.NotAfter
	}
	tpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: host},
		NotBefore: now.Add(-time.Hour), NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		tpl.IPAddresses = append(tpl.IPAddresses, ip.AsSlice())
	} else {
		tpl.DNSNames = []string{host}
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, c.cert, &c.leafKey.PublicKey, c.key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	if len(c.leaves) >= maxLeaves {
		clear(c.leaves)
	}
	l := &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: c.leafKey, Leaf: leaf}
	c.leaves[host] = l
	return l, nil
}
