package main

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3client"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// embeddedEtcd is the single etcd member shared by every API server of the
// harness. Each API server stores its data under its own key prefix.
type embeddedEtcd struct {
	etcd *embed.Etcd
	// client talks to the server in-process (no network); used to wipe the
	// key prefix of a deleted API server.
	client *clientv3.Client
	// clientURL is what the API servers use (--etcd-servers).
	clientURL string
	// logLevel of etcd's logger; raised before closing, since etcd logs
	// its own orderly shutdown as errors.
	logLevel zap.AtomicLevel
}

// startEtcd starts an embedded single-member etcd with its data in dataDir
// (wiped first: the harness never reuses data across runs), listening on two
// free loopback ports.
func startEtcd(dataDir string) (*embeddedEtcd, error) {
	if err := os.RemoveAll(dataDir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, err
	}

	// Free ports are picked by binding port 0 and closing again; another
	// process could grab one in between, so retry a few times.
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		ports, err := freePorts(2)
		if err != nil {
			return nil, err
		}
		clientURL := url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))}
		peerURL := url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1]))}

		cfg := embed.NewConfig()
		cfg.Name = "kube-harness"
		cfg.Dir = dataDir
		cfg.ListenClientUrls = []url.URL{clientURL}
		cfg.AdvertiseClientUrls = []url.URL{clientURL}
		cfg.ListenPeerUrls = []url.URL{peerURL}
		cfg.AdvertisePeerUrls = []url.URL{peerURL}
		cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
		// Test data is thrown away on exit: fsync only costs time.
		cfg.UnsafeNoFsync = true
		logLevel := zap.NewAtomicLevelAt(zapcore.ErrorLevel)
		zapCfg := zap.NewProductionConfig()
		zapCfg.Level = logLevel
		logger, err := zapCfg.Build()
		if err != nil {
			return nil, err
		}
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(logger.Named("etcd"))
		// No metrics endpoint, no pprof: nothing the tests need.
		cfg.Metrics = "basic"

		e, err := embed.StartEtcd(cfg)
		if err != nil {
			lastErr = err
			continue
		}
		select {
		case <-e.Server.ReadyNotify():
		case <-time.After(60 * time.Second):
			e.Close()
			return nil, fmt.Errorf("embedded etcd did not become ready within 60s")
		}
		return &embeddedEtcd{
			etcd:      e,
			client:    v3client.New(e.Server),
			clientURL: clientURL.String(),
			logLevel:  logLevel,
		}, nil
	}
	return nil, fmt.Errorf("starting embedded etcd: %w", lastErr)
}

// deletePrefix removes every key below prefix (an API server's --etcd-prefix).
// The trailing "/" makes sure "/x/platform" does not also wipe "/x/platform2".
func (e *embeddedEtcd) deletePrefix(ctx context.Context, prefix string) (int64, error) {
	resp, err := e.client.Delete(ctx, prefix+"/", clientv3.WithPrefix())
	if err != nil {
		return 0, err
	}
	return resp.Deleted, nil
}

// countPrefix returns the number of keys below prefix.
func (e *embeddedEtcd) countPrefix(ctx context.Context, prefix string) (int64, error) {
	resp, err := e.client.Get(ctx, prefix+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	return resp.Count, nil
}

func (e *embeddedEtcd) close() {
	e.logLevel.SetLevel(zapcore.FatalLevel)
	e.client.Close()
	e.etcd.Close()
}

// freePorts returns n distinct currently free TCP ports on 127.0.0.1.
func freePorts(n int) ([]int, error) {
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
