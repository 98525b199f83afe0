package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/keyutil"
)

// serverFiles are the generated credentials of one API server, all inside its
// own directory.
type serverFiles struct {
	CAFile      string // CA that signed the serving certificate (kubeconfig trusts it)
	CAData      []byte
	CAKeyFile   string // the CA's key: the csrsigning controller signs with it
	ServingCert string // serving certificate for 127.0.0.1, ::1 and localhost
	ServingKey  string
	SAKeyFile   string // service-account signing key (ECDSA P-256, private: also verifies)
	// The client certificate the API server shows kubelets (CN
	// kube-apiserver-kubelet-client, group system:masters, as kubeadm's).
	KubeletClientCert string
	KubeletClientKey  string
	TokenAuthFile     string // static token file: the admin token, group system:masters
	KubeconfigFile    string
}

// generateServerFiles writes a fresh CA, serving certificate, service-account
// key and token auth file for one API server into dir.
// nodeHost, when not empty, is one more name (IP or DNS) the serving
// certificate is valid for: the host of the URL nodes dial.
func generateServerFiles(dir, name, token, nodeHost string) (*serverFiles, error) {
	f := &serverFiles{
		CAFile:            filepath.Join(dir, "ca.crt"),
		CAKeyFile:         filepath.Join(dir, "ca.key"),
		ServingCert:       filepath.Join(dir, "serving.crt"),
		ServingKey:        filepath.Join(dir, "serving.key"),
		SAKeyFile:         filepath.Join(dir, "sa.key"),
		KubeletClientCert: filepath.Join(dir, "kubelet-client.crt"),
		KubeletClientKey:  filepath.Join(dir, "kubelet-client.key"),
		TokenAuthFile:     filepath.Join(dir, "tokens.csv"),
		KubeconfigFile:    filepath.Join(dir, "kubeconfig"),
	}

	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{CommonName: "kube-harness-ca-" + name},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		return nil, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	f.CAData = pemCert(caDER)

	servingKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	servingTmpl := &x509.Certificate{
		SerialNumber: randomSerial(),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{"localhost", "kubernetes", "kubernetes.default",
			"kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		// 10.96.0.1: the `kubernetes` Service's address (the first of
		// --service-cluster-ip-range), as kubeadm and Kamaji sign it, for pods
		// that reach the API server through the Service.
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.IPv6loopback, net.ParseIP("10.96.0.1")},
	}
	if ip := net.ParseIP(nodeHost); ip != nil {
		servingTmpl.IPAddresses = append(servingTmpl.IPAddresses, ip)
	} else if nodeHost != "" {
		servingTmpl.DNSNames = append(servingTmpl.DNSNames, nodeHost)
	}
	servingDER, err := x509.CreateCertificate(rand.Reader, servingTmpl, caCert, servingKey.Public(), caKey)
	if err != nil {
		return nil, err
	}

	kubeletClientKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	kubeletClientTmpl := &x509.Certificate{
		SerialNumber: randomSerial(),
		Subject:      pkix.Name{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	kubeletClientDER, err := x509.CreateCertificate(rand.Reader, kubeletClientTmpl, caCert, kubeletClientKey.Public(), caKey)
	if err != nil {
		return nil, err
	}

	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}

	writes := []struct {
		path string
		data func() ([]byte, error)
	}{
		{f.CAFile, func() ([]byte, error) { return f.CAData, nil }},
		{f.CAKeyFile, func() ([]byte, error) { return keyutil.MarshalPrivateKeyToPEM(caKey) }},
		{f.ServingCert, func() ([]byte, error) { return pemCert(servingDER), nil }},
		{f.ServingKey, func() ([]byte, error) { return keyutil.MarshalPrivateKeyToPEM(servingKey) }},
		{f.SAKeyFile, func() ([]byte, error) { return keyutil.MarshalPrivateKeyToPEM(saKey) }},
		{f.KubeletClientCert, func() ([]byte, error) { return pemCert(kubeletClientDER), nil }},
		{f.KubeletClientKey, func() ([]byte, error) { return keyutil.MarshalPrivateKeyToPEM(kubeletClientKey) }},
		// Static token file format: token,user,uid,"group1,group2".
		{f.TokenAuthFile, func() ([]byte, error) {
			return []byte(fmt.Sprintf("%s,%s,%s,\"system:masters\"\n", token, adminUser, adminUser)), nil
		}},
	}
	for _, w := range writes {
		data, err := w.data()
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(w.path, data, 0o600); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// writeKubeconfig writes a self-contained kubeconfig (CA embedded, static
// admin token) for the API server at url.
func writeKubeconfig(path, name, url string, caData []byte, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[name] = &clientcmdapi.Cluster{Server: url, CertificateAuthorityData: caData}
	cfg.AuthInfos[adminUser] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: adminUser}
	cfg.CurrentContext = name
	return clientcmd.WriteToFile(*cfg, path)
}

func pemCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func randomSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		panic(err)
	}
	return n.Add(n, big.NewInt(1))
}

// randomToken returns 32 random hex characters.
func randomToken() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}
