package main

import (
	"fmt"

	"google.golang.org/grpc/grpclog"
	"k8s.io/klog/v2"
)

// quietGRPCLogger routes grpc-go's logging to klog like kube-apiserver does
// (k8s.io/apiserver/pkg/storage/etcd3/logger.go), except that warnings are
// only shown at -v=2 and above: the etcd clients of the in-process API
// servers are created and closed all the time (e.g. whenever a CRD changes),
// and every close of a client still dialing logs a harmless
// "createTransport failed ... operation was canceled" warning.
type quietGRPCLogger struct{}

// useQuietGRPCLogger installs quietGRPCLogger. grpclog.SetLoggerV2 is not
// synchronised, so this must run before any API server starts (etcd's own
// grpc server is idle at that point; it also replaces the logger etcd's
// embed package installs).
func useQuietGRPCLogger() { grpclog.SetLoggerV2(quietGRPCLogger{}) }

const grpcLogDepth = 4

func (quietGRPCLogger) Info(args ...any) {
	if v := klog.V(5); v.Enabled() {
		v.InfoSDepth(grpcLogDepth, fmt.Sprint(args...))
	}
}
func (l quietGRPCLogger) Infoln(args ...any) { l.Info(fmt.Sprintln(args...)) }
func (l quietGRPCLogger) Infof(format string, args ...any) {
	l.Info(fmt.Sprintf(format, args...))
}

func (quietGRPCLogger) Warning(args ...any) {
	if v := klog.V(2); v.Enabled() {
		klog.WarningDepth(grpcLogDepth, args...)
	}
}
func (l quietGRPCLogger) Warningln(args ...any) { l.Warning(fmt.Sprintln(args...)) }
func (l quietGRPCLogger) Warningf(format string, args ...any) {
	l.Warning(fmt.Sprintf(format, args...))
}

func (quietGRPCLogger) Error(args ...any)     { klog.ErrorDepth(grpcLogDepth, args...) }
func (l quietGRPCLogger) Errorln(args ...any) { l.Error(fmt.Sprintln(args...)) }
func (l quietGRPCLogger) Errorf(format string, args ...any) {
	l.Error(fmt.Sprintf(format, args...))
}

func (quietGRPCLogger) Fatal(args ...any)     { klog.FatalDepth(grpcLogDepth, args...) }
func (l quietGRPCLogger) Fatalln(args ...any) { l.Fatal(fmt.Sprintln(args...)) }
func (l quietGRPCLogger) Fatalf(format string, args ...any) {
	l.Fatal(fmt.Sprintf(format, args...))
}

// V reports whether verbosity level l is enabled (grpclog.LoggerV2).
func (quietGRPCLogger) V(l int) bool { return klog.V(klog.Level(l)).Enabled() }
