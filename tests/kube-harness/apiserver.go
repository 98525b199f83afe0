package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	neturl "net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/spf13/pflag"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/util/compatibility"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	clientset "k8s.io/client-go/kubernetes"
	restclient "k8s.io/client-go/rest"
	basecompatibility "k8s.io/component-base/compatibility"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
	"k8s.io/kubernetes/cmd/kube-apiserver/app/options"
)

// adminUser is the static-token user; it is in group system:masters, which
// the authorizer lets do anything, whatever RBAC says.
const adminUser = "kube-harness-admin"

// serviceAccountIssuer is the --service-account-issuer of every API server
// (kubeadm's default). The signing keys differ per API server, so tokens of
// one are still rejected by the others.
const serviceAccountIssuer = "https://kubernetes.default.svc.cluster.local"

// startRequest is the body of POST /apiservers.
type startRequest struct {
	Name string `json:"name"`
	// CRD files (YAML/JSON, multi-document) to install and wait for
	// Established before the API server is reported ready.
	CRDs []string `json:"crds,omitempty"`
	// In-process controllers to run: group names ("defaults", "workloads")
	// and single controller names; nil means "defaults", an empty list
	// means none.
	Controllers *[]string `json:"controllers,omitempty"`
	// Extra kube-apiserver flags, e.g. "--feature-gates=..."; they are
	// parsed after (and so override) the harness's own flags.
	Args []string `json:"args,omitempty"`
	// NodeURL is the URL nodes dial to reach this API server when it is
	// not the loopback URL (a VM's kubelet dials an address its network
	// forwards here, e.g. https://10.0.2.100:6443): the serving certificate
	// is valid for its host too, and cluster-info names it, so that token
	// discovery hands nodes the address they can reach.
	NodeURL string `json:"node_url,omitempty"`
}

// apiServerInfo is what the control endpoint reports for one API server.
type apiServerInfo struct {
	Name        string   `json:"name"`
	URL         string   `json:"url"`
	Kubeconfig  string   `json:"kubeconfig"`
	Token       string   `json:"token"`
	CAFile      string   `json:"ca_file"`
	Dir         string   `json:"dir"`
	EtcdPrefix  string   `json:"etcd_prefix"`
	Controllers []string `json:"controllers"`
	CRDs        []string `json:"crds,omitempty"` // names of the installed CRDs
	// NodeURL is the URL cluster-info gives nodes (node_url, or URL).
	NodeURL string `json:"node_url"`
	// StartupSeconds is the time from the request to readiness (including CRDs).
	StartupSeconds float64 `json:"startup_seconds"`
}

// apiServer is one running in-process kube-apiserver.
type apiServer struct {
	info apiServerInfo
	// loopback is the API server's own in-process client config
	// (system:masters); used by the harness's controllers and CRD installer.
	loopback *restclient.Config
	stop     context.CancelFunc // stops the API server and its controllers
	done     chan struct{}      // closed once the API server's Run returned
	runErr   error              // Run's error; read only after done is closed
}

// startAPIServer starts one kube-apiserver in this process the way
// k8s.io/kubernetes/cmd/kube-apiserver/app/testing.StartTestServer does:
// fresh option structs and flag set, its own component-globals registry,
// then NewConfig -> Complete -> CreateServerChain -> PrepareRun -> Run.
// It returns once /readyz answers ok, the default namespace exists, the
// controllers run and the requested CRDs are Established.
func startAPIServer(parent context.Context, dataDir, etcdURL string, req startRequest) (_ *apiServer, retErr error) {
	begin := time.Now()
	dir := filepath.Join(dataDir, "apiservers", req.Name)
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	token := randomToken()
	nodeHost, err := nodeURLHost(req.NodeURL)
	if err != nil {
		return nil, err
	}
	files, err := generateServerFiles(dir, req.Name, token, nodeHost)
	if err != nil {
		return nil, fmt.Errorf("generating certificates: %w", err)
	}

	controllers, err := expandControllers(req.Controllers)
	if err != nil {
		return nil, err
	}

	// Listen first so that the port is known (and ours) before anything else.
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := listener.Addr().(*net.TCPAddr).Port
	url := "https://127.0.0.1:" + strconv.Itoa(port)

	ctx, cancel := context.WithCancel(parent)
	// Controllers stop first, so that they do not log errors about the API
	// server going away.
	ctrlCtx, ctrlCancel := context.WithCancel(ctx)
	srv := &apiServer{
		stop: func() { ctrlCancel(); cancel() },
		done: make(chan struct{}),
		info: apiServerInfo{
			Name:        req.Name,
			URL:         url,
			Kubeconfig:  files.KubeconfigFile,
			Token:       token,
			CAFile:      files.CAFile,
			Dir:         dir,
			EtcdPrefix:  etcdPrefix(req.Name),
			Controllers: controllers,
		},
	}
	started := false
	defer func() {
		if retErr == nil {
			return
		}
		srv.stop()
		if started {
			srv.wait(30 * time.Second)
		} else {
			listener.Close()
		}
	}()

	// A registry of its own, as in StartTestServer: the global default one
	// can only be Set once per process. The feature gate is a copy of the
	// process-wide one (which most feature checks still read).
	featureGate := utilfeature.DefaultMutableFeatureGate.DeepCopy()
	effectiveVersion := compatibility.DefaultBuildEffectiveVersion()
	registry := basecompatibility.NewComponentGlobalsRegistry()
	if err := registry.Register(basecompatibility.DefaultKubeComponent, effectiveVersion, featureGate); err != nil {
		return nil, err
	}

	s := options.NewServerRunOptions()
	s.GenericServerRunOptions.ComponentGlobalsRegistry = registry
	fs := pflag.NewFlagSet("kube-apiserver-"+req.Name, pflag.ContinueOnError)
	for _, f := range s.Flags().FlagSets {
		fs.AddFlagSet(f)
	}
	args := []string{
		"--etcd-servers=" + etcdURL,
		"--etcd-prefix=" + srv.info.EtcdPrefix,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		// The "kubernetes" Endpoints may not point at a loopback address,
		// and nothing in a test can route to the service anyway.
		"--endpoint-reconciler-type=none",
		"--secure-port=" + strconv.Itoa(port),
		"--tls-cert-file=" + files.ServingCert,
		"--tls-private-key-file=" + files.ServingKey,
		"--token-auth-file=" + files.TokenAuthFile,
		// The client certificate it shows kubelets (logs, exec, port-forward).
		"--kubelet-client-certificate=" + files.KubeletClientCert,
		"--kubelet-client-key=" + files.KubeletClientKey,
		// What a kubelet's TLS bootstrap and registration need on the API
		// server side, as in a kubeadm (Kamaji) control plane: bootstrap
		// tokens authenticate, certificates of its CA (which the csrsigning
		// controller signs with) too, and the Node authorizer with
		// NodeRestriction confine a node to its own objects.
		"--enable-bootstrap-token-auth",
		"--client-ca-file=" + files.CAFile,
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--service-account-issuer=" + serviceAccountIssuer,
		"--service-account-key-file=" + files.SAKeyFile,
		"--service-account-signing-key-file=" + files.SAKeyFile,
		"--service-cluster-ip-range=10.96.0.0/12",
		"--profiling=false",
		// Privileged pods (calico-node) are accepted. The flag is only
		// read by the first API server of the process (capabilities.Setup
		// is a sync.Once); main's init sets the same value process-wide.
		"--allow-privileged=true",
	}
	if err := fs.Parse(append(args, req.Args...)); err != nil {
		return nil, fmt.Errorf("kube-apiserver flags: %w", err)
	}
	s.SecureServing.Listener = listener
	if err := registry.Set(); err != nil {
		return nil, err
	}

	completed, err := s.Complete(ctx)
	if err != nil {
		return nil, fmt.Errorf("completing kube-apiserver options: %w", err)
	}
	if errs := completed.Validate(); len(errs) != 0 {
		return nil, fmt.Errorf("invalid kube-apiserver options: %w", utilerrors.NewAggregate(errs))
	}
	config, err := app.NewConfig(completed)
	if err != nil {
		return nil, err
	}
	completedConfig, err := config.Complete()
	if err != nil {
		return nil, err
	}
	server, err := app.CreateServerChain(completedConfig)
	if err != nil {
		return nil, fmt.Errorf("creating server chain: %w", err)
	}
	prepared, err := server.PrepareRun()
	if err != nil {
		return nil, err
	}
	srv.loopback = restclient.CopyConfig(server.GenericAPIServer.LoopbackClientConfig)
	srv.loopback.QPS, srv.loopback.Burst = 100, 200

	klog.InfoS("Starting kube-apiserver", "name", req.Name, "url", url, "etcdPrefix", srv.info.EtcdPrefix)
	started = true
	go func() {
		defer close(srv.done)
		srv.runErr = prepared.Run(ctx)
	}()

	if err := srv.waitReady(ctx, files.CAData, token); err != nil {
		return nil, err
	}
	clusterInfoURL := url
	if req.NodeURL != "" {
		clusterInfoURL = req.NodeURL
	}
	srv.info.NodeURL = clusterInfoURL
	if err := srv.setUpNodeBootstrap(ctx, clusterInfoURL, files.CAData); err != nil {
		return nil, fmt.Errorf("node bootstrap RBAC and cluster-info: %w", err)
	}
	if err := startControllers(ctrlCtx, srv.loopback, controllers, files); err != nil {
		return nil, fmt.Errorf("starting controllers: %w", err)
	}
	if len(req.CRDs) > 0 {
		names, err := installCRDs(ctx, srv.loopback, req.CRDs)
		if err != nil {
			return nil, err
		}
		srv.info.CRDs = names
	}
	if err := writeKubeconfig(files.KubeconfigFile, req.Name, url, files.CAData, token); err != nil {
		return nil, err
	}
	srv.info.StartupSeconds = time.Since(begin).Seconds()
	klog.InfoS("kube-apiserver ready", "name", req.Name, "url", url, "seconds", srv.info.StartupSeconds)
	return srv, nil
}

// waitReady polls /readyz over the real TLS port with the admin token (so
// certificates and token authentication are exercised too), then waits for
// the "default" namespace, like StartTestServer.
func (s *apiServer) waitReady(ctx context.Context, caData []byte, token string) error {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caData)
	httpClient := &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
	}
	defer httpClient.CloseIdleConnections()
	var lastStatus string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		select {
		case <-s.done:
			return false, fmt.Errorf("kube-apiserver exited: %v", s.runErr)
		default:
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.info.URL+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := httpClient.Do(req)
		if err != nil {
			lastStatus = err.Error()
			return false, nil
		}
		resp.Body.Close()
		lastStatus = resp.Status
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for %s/readyz (last: %s): %w", s.info.URL, lastStatus, err)
	}

	client, err := clientset.NewForConfig(s.loopback)
	if err != nil {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := client.CoreV1().Namespaces().Get(ctx, metav1.NamespaceDefault, metav1.GetOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			klog.V(2).InfoS("Waiting for the default namespace", "err", err)
		}
		return err == nil, nil
	})
}

// setUpNodeBootstrap writes kubeadm's bootstrap-token RBAC and cluster-info
// (join.go) with the loopback identity.
func (s *apiServer) setUpNodeBootstrap(ctx context.Context, url string, caData []byte) error {
	client, err := clientset.NewForConfig(s.loopback)
	if err != nil {
		return err
	}
	return setUpNodeBootstrap(ctx, client, url, caData)
}

// nodeURLHost is the host of a request's node_url ("" when it has none); a
// node_url must be an https URL with a host and nothing after the port.
func nodeURLHost(nodeURL string) (string, error) {
	if nodeURL == "" {
		return "", nil
	}
	u, err := neturl.Parse(nodeURL)
	if err != nil || u.Scheme != "https" || u.Hostname() == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return "", fmt.Errorf("node_url must be https://host[:port], got %q", nodeURL)
	}
	return u.Hostname(), nil
}

// shutdown stops the API server and its controllers and waits (up to
// timeout) for the API server's Run to return.
func (s *apiServer) shutdown(timeout time.Duration) error {
	s.stop()
	return s.wait(timeout)
}

func (s *apiServer) wait(timeout time.Duration) error {
	select {
	case <-s.done:
		if s.runErr != nil && !errors.Is(s.runErr, context.Canceled) {
			return s.runErr
		}
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("kube-apiserver %s did not stop within %s", s.info.Name, timeout)
	}
}

// etcdPrefix is the --etcd-prefix of the named API server.
func etcdPrefix(name string) string {
	return "/kube-harness/" + name
}
