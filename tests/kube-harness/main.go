// kube-harness hosts real Kubernetes API servers for tests.
//
// One process runs one embedded etcd and, on request over a loopback HTTP
// control endpoint, any number of in-process kube-apiservers (from
// k8s.io/kubernetes, the same code as the kube-apiserver binary), each with
// its own etcd prefix, port, certificates, static admin token, service
// account issuer and kubeconfig, plus the kube-controller-manager controllers
// that tests cannot do without (namespace deletion, service accounts,
// garbage collection).
//
// On start it prints `CONTROL_ADDR=127.0.0.1:NNNN` and then `READY` on
// stdout; everything else (logs) goes to stderr. See README.md for the
// control API.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	restclient "k8s.io/client-go/rest"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/capabilities"
)

func init() {
	// Several API servers in one process each try to apply the logging
	// configuration; applying the same one again must not be an error
	// (StartTestServer does the same).
	logsapi.ReapplyHandling = logsapi.ReapplyHandlingIgnoreUnchanged

	// kube-apiserver's --allow-privileged is a process-wide capability, not
	// a per-server setting: CreateKubeAPIServerConfig calls
	// capabilities.Setup, which is a sync.Once (capabilities.Initialize), so
	// the first API server of the process would fix it for all. Set it here,
	// once, before any API server starts: every API server of the harness
	// accepts privileged containers (e.g. calico-node), and a per-server
	// --allow-privileged=false in "args" has no effect.
	capabilities.Setup(true, 0)
}

func main() {
	controlAddr := flag.String("control-addr", "127.0.0.1:0", "loopback address of the HTTP control endpoint")
	dir := flag.String("dir", "", "data directory for etcd, certificates and kubeconfigs (default: a temporary directory, removed on exit)")
	exitOnStdinEOF := flag.Bool("exit-on-stdin-eof", false, "shut down when stdin is closed (lets a test's child process die with the test)")
	klog.InitFlags(flag.CommandLine) // -v, --log_file, ...
	flag.Parse()

	if err := run(*controlAddr, *dir, *exitOnStdinEOF); err != nil {
		fmt.Fprintln(os.Stderr, "kube-harness:", err)
		os.Exit(1)
	}
}

func run(controlAddr, dir string, exitOnStdinEOF bool) error {
	// kube-apiserver's loopback clients should not log self-issued warnings.
	restclient.SetDefaultWarningHandler(restclient.NoWarnings{})

	if dir == "" {
		tmp, err := os.MkdirTemp("", "kube-harness-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		dir = tmp
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	// A fresh start every time: old API server directories would only
	// confuse (their etcd data is gone anyway).
	if err := os.RemoveAll(filepath.Join(dir, "apiservers")); err != nil {
		return err
	}

	etcd, err := startEtcd(filepath.Join(dir, "etcd"))
	if err != nil {
		return err
	}
	defer etcd.close()
	klog.InfoS("Embedded etcd ready", "url", etcd.clientURL)
	useQuietGRPCLogger()

	ln, err := net.Listen("tcp", controlAddr)
	if err != nil {
		return err
	}
	if tcp, ok := ln.Addr().(*net.TCPAddr); !ok || !tcp.IP.IsLoopback() {
		ln.Close()
		return fmt.Errorf("--control-addr must be a loopback address, got %s", ln.Addr())
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h := newHarness(ctx, dir, etcd, cancel)
	httpServer := &http.Server{Handler: h.routes(), ReadHeaderTimeout: 10 * time.Second}
	serveErr := make(chan error, 1)
	go func() { serveErr <- httpServer.Serve(ln) }()

	// The contract with the test that started us: these two lines, in this
	// order, on stdout.
	fmt.Printf("CONTROL_ADDR=%s\n", ln.Addr())
	fmt.Println("READY")
	os.Stdout.Sync()

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	stdinEOF := make(chan struct{})
	if exitOnStdinEOF {
		go func() {
			io.Copy(io.Discard, bufio.NewReader(os.Stdin))
			close(stdinEOF)
		}()
	}

	select {
	case sig := <-signals:
		klog.InfoS("Shutting down", "signal", sig)
	case <-stdinEOF:
		klog.InfoS("Shutting down: stdin closed")
	case <-ctx.Done():
		klog.InfoS("Shutting down: requested over the control endpoint")
	case err := <-serveErr:
		klog.ErrorS(err, "Control endpoint failed")
	}
	// A second signal kills us at once.
	go func() {
		<-signals
		os.Exit(130)
	}()

	shutdownCtx, stop := context.WithTimeout(context.Background(), 5*time.Second)
	httpServer.Shutdown(shutdownCtx)
	stop()
	cancel() // API servers (and starts in flight) begin stopping together
	h.stopAll()
	klog.InfoS("Stopped")
	klog.Flush()
	return nil
}
