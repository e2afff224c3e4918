// Package testpki issues throwaway certificates for tests: a CA, and
// certificates it signs for 127.0.0.1, usable by servers and clients.
// Each function that takes a testing.TB has a twin that returns its error
// instead, for a program that is no test (cmd/sluice-attack).
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority that lives for one test.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	Pool *x509.CertPool // holds Cert alone
}

// NewCA returns a CA named name, valid for an hour either side of now.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	return must[*CA](t)(New(name))
}

// New is NewCA for a program that is no test.
func New(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &CA{Cert: cert, Key: key, Pool: pool}, nil
}

// must returns a function that fails the test on an error, and otherwise
// returns the value.
func must[T any](t testing.TB) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// Issue returns a certificate for name, for server and client use, valid
// for 127.0.0.1 and "localhost".
func (ca *CA) Issue(t testing.TB, name string) tls.Certificate {
	t.Helper()
	return ca.IssueWith(t, name)
}

// IssueWith is Issue with the URI SANs uris besides, such as a peer
// identity spiffe://sluice.test/peer.
func (ca *CA) IssueWith(t testing.TB, name string, uris ...string) tls.Certificate {
	t.Helper()
	return must[tls.Certificate](t)(ca.IssueCert(name, uris...))
}

// IssueCert is IssueWith for a program that is no test.
func (ca *CA) IssueCert(name string, uris ...string) (tls.Certificate, error) {
	var us []*url.URL
	for _, u := range uris {
		p, err := url.Parse(u)
		if err != nil {
			return tls.Certificate{}, err
		}
		us = append(us, p)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost"},
		URIs:         us,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// Config returns a TLS config presenting cert and trusting ca for both
// peers and callers.
func (ca *CA) Config(cert tls.Certificate) *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		RootCAs:      ca.Pool,
		ClientCAs:    ca.Pool,
		MinVersion:   tls.VersionTLS12,
	}
}

// WriteCA writes the CA certificate as PEM to dir/name and returns the path.
func (ca *CA) WriteCA(t testing.TB, dir, name string) string {
	t.Helper()
	return must[string](t)(ca.WriteCAFile(dir, name))
}

// WriteCAFile is WriteCA for a program that is no test.
func (ca *CA) WriteCAFile(dir, name string) (string, error) {
	return writePEM(filepath.Join(dir, name), "CERTIFICATE", ca.Cert.Raw)
}

// WriteCert writes cert and its key as PEM files in dir, named after name,
// and returns their paths.
func WriteCert(t testing.TB, dir, name string, cert tls.Certificate) (certFile, keyFile string) {
	t.Helper()
	certFile, keyFile, err := WriteCertFiles(dir, name, cert)
	if err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// WriteCertFiles is WriteCert for a program that is no test.
func WriteCertFiles(dir, name string, cert tls.Certificate) (certFile, keyFile string, err error) {
	key, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		return "", "", err
	}
	if certFile, err = writePEM(filepath.Join(dir, name+".crt"), "CERTIFICATE", cert.Certificate[0]); err != nil {
		return "", "", err
	}
	if keyFile, err = writePEM(filepath.Join(dir, name+".key"), "PRIVATE KEY", key); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

func writePEM(path, typ string, der []byte) (string, error) {
	return path, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}
