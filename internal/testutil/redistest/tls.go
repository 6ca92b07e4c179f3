package redistest

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
	"strconv"
	"testing"
	"time"
)

// TLSServer is a redis-server that speaks only TLS, with a CA, a server
// certificate and a client certificate generated for the test, and an ACL
// user (the default user is off).
type TLSServer struct {
	*Server
	CAFile         string // PEM of the CA that signed both certificates
	ClientCertFile string // PEM of a client certificate signed by the CA
	ClientKeyFile  string
	Username       string
	Password       string
	roots          *x509.CertPool
	client         tls.Certificate
}

// StartTLS starts redis-server with TLS on a free port (plain port off) and
// the ACL user username/password allowed everything. Clients must present
// a certificate unless requireClientCert is false.
func StartTLS(tb testing.TB, username, password string, requireClientCert bool, opts ...Option) *TLSServer {
	tb.Helper()
	dir := tb.TempDir()
	ca, caKey := newCA(tb)
	srvCert := leaf(tb, ca, caKey, "redis-server", false)
	cliCert := leaf(tb, ca, caKey, username, true)
	t := &TLSServer{
		CAFile:         writePEM(tb, dir, "ca.pem", "CERTIFICATE", ca.Raw),
		ClientCertFile: writePEM(tb, dir, "client.pem", "CERTIFICATE", cliCert.Certificate[0]),
		ClientKeyFile:  writeKey(tb, dir, "client-key.pem", cliCert.PrivateKey.(*ecdsa.PrivateKey)),
		Username:       username,
		Password:       password,
		roots:          x509.NewCertPool(),
		client:         cliCert,
	}
	t.roots.AddCert(ca)
	srvCertFile := writePEM(tb, dir, "server.pem", "CERTIFICATE", srvCert.Certificate[0])
	srvKeyFile := writeKey(tb, dir, "server-key.pem", srvCert.PrivateKey.(*ecdsa.PrivateKey))
	auth := "yes"
	if !requireClientCert {
		auth = "no"
	}
	args := []string{
		"--tls-cert-file", srvCertFile, "--tls-key-file", srvKeyFile, "--tls-ca-cert-file", t.CAFile,
		"--tls-auth-clients", auth,
		"--user", "default", "off",
		"--user", username, "on", ">" + password, "~*", "&*", "+@all",
	}
	s := &Server{tb: tb, dir: tb.TempDir(), port: FreePort(tb), args: args,
		tlsCfg: t.TLSConfig(), username: username, password: password}
	for _, o := range opts {
		s.args = append(s.args, o...)
	}
	s.start()
	tb.Cleanup(s.Stop)
	t.Server = s
	return t
}

// TLSConfig trusts the test CA and presents the client certificate.
func (t *TLSServer) TLSConfig() *tls.Config {
	return &tls.Config{RootCAs: t.roots, Certificates: []tls.Certificate{t.client}, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
}

// URL is a rediss:// URL with the ACL user and password.
func (t *TLSServer) URL() string {
	u := url.URL{Scheme: "rediss", User: url.UserPassword(t.Username, t.Password), Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(t.Port()))}
	return u.String()
}

func newCA(tb testing.TB) (*x509.Certificate, *ecdsa.PrivateKey) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "redistest CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	return cert, key
}

// leaf makes a certificate signed by the CA, for 127.0.0.1 (server) or a
// client.
func leaf(tb testing.TB, ca *x509.Certificate, caKey *ecdsa.PrivateKey, cn string, client bool) tls.Certificate {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	if client {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
		tmpl.IPAddresses = nil
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		tb.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func writePEM(tb testing.TB, dir, name, typ string, der []byte) string {
	tb.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		tb.Fatal(err)
	}
	return path
}

func writeKey(tb testing.TB, dir, name string, key *ecdsa.PrivateKey) string {
	tb.Helper()
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	return writePEM(tb, dir, name, "EC PRIVATE KEY", der)
}
