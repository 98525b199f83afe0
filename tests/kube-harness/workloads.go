package main

import (
	"context"
	"fmt"
	"time"

	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	clientset "k8s.io/client-go/kubernetes"
	restclient "k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	scaleclient "k8s.io/client-go/scale"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/controller/daemon"
	"k8s.io/kubernetes/pkg/controller/deployment"
	"k8s.io/kubernetes/pkg/controller/disruption"
	endpointcontroller "k8s.io/kubernetes/pkg/controller/endpoint"
	endpointslicecontroller "k8s.io/kubernetes/pkg/controller/endpointslice"
	"k8s.io/kubernetes/pkg/controller/job"
	"k8s.io/kubernetes/pkg/controller/replicaset"
	"k8s.io/kubernetes/pkg/controller/statefulset"
	persistentvolumecontroller "k8s.io/kubernetes/pkg/controller/volume/persistentvolume"
	"k8s.io/kubernetes/pkg/controller/volume/pvcprotection"
	"k8s.io/kubernetes/pkg/controller/volume/pvprotection"
	"k8s.io/kubernetes/pkg/scheduler"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/latest"
	"k8s.io/kubernetes/pkg/scheduler/profile"
	"k8s.io/kubernetes/pkg/volume"
	"k8s.io/kubernetes/pkg/volume/hostpath"
)

// The workload controllers: what turns workloads into pods, plus the real
// kube-scheduler. Opt-in (the "workloads" group), since they change what a
// test sees (Pods appear, get bound to Nodes) and cost goroutines.
const (
	ctrlDeployment  = "deployment"  // Deployment -> ReplicaSets (rollouts)
	ctrlReplicaSet  = "replicaset"  // ReplicaSet -> Pods
	ctrlStatefulSet = "statefulset" // StatefulSet -> Pods <name>-0, -1, ... and their PVCs
	ctrlDaemonSet   = "daemonset"   // DaemonSet -> one Pod per eligible Node
	ctrlJob         = "job"         // Job -> Pods
	// PodDisruptionBudget status (disruptionsAllowed): without it every
	// eviction of a budgeted pod is refused, as in no real cluster.
	ctrlDisruption = "disruption"
	// Service with a selector -> EndpointSlices / Endpoints of its ready pods.
	ctrlEndpointSlice = "endpointslice"
	ctrlEndpoints     = "endpoints"
	// Binds PersistentVolumeClaims to matching PersistentVolumes (static
	// binding; dynamic provisioning is left to an external provisioner).
	ctrlPVBinder = "persistentvolume-binder"
	// The finalizers every PersistentVolumeClaim and PersistentVolume gets
	// (kubernetes.io/pvc-protection, pv-protection), removed once no pod
	// uses the claim and no claim the volume: without them a deleted claim
	// stays Terminating, as in no real cluster.
	ctrlPVCProtection = "pvc-protection"
	ctrlPVProtection  = "pv-protection"
	// The real kube-scheduler (default profile): binds Pods to Nodes.
	ctrlScheduler = "scheduler"
)

// workloadControllers is the "workloads" group.
var workloadControllers = []string{ctrlDeployment, ctrlReplicaSet, ctrlStatefulSet,
	ctrlDaemonSet, ctrlJob, ctrlDisruption, ctrlEndpointSlice, ctrlEndpoints, ctrlPVBinder,
	ctrlPVCProtection, ctrlPVProtection, ctrlScheduler}

// Names of controller groups a request may use instead of single names.
const (
	groupDefaults  = "defaults"  // defaultControllers (what an omitted list means)
	groupWorkloads = "workloads" // workloadControllers
)

// kube-controller-manager's default worker counts (its ComponentConfig).
const (
	concurrentDeploymentSyncs = 5
	concurrentRSSyncs         = 5
	concurrentStatefulSyncs   = 5
	concurrentDaemonSetSyncs  = 2
	concurrentJobSyncs        = 5
	concurrentEndpointSyncs   = 5
	maxEndpointsPerSlice      = 100
	pvClaimBinderSyncPeriod   = 15 * time.Second
)

// newWorkloadController builds one workload controller (not the scheduler)
// on the shared informer factory and returns the function that runs it
// until ctx is cancelled, like cmd/kube-controller-manager/app's
// constructors (apps.go, batch.go, core.go, discovery.go).
func newWorkloadController(ctx context.Context, name string, cs clientset.Interface, factory informers.SharedInformerFactory) (func(), error) {
	core, apps := factory.Core().V1(), factory.Apps().V1()
	switch name {
	case ctrlDeployment:
		dc, err := deployment.NewDeploymentController(ctx, apps.Deployments(), apps.ReplicaSets(), core.Pods(), cs)
		if err != nil {
			return nil, err
		}
		return func() { dc.Run(ctx, concurrentDeploymentSyncs) }, nil
	case ctrlReplicaSet:
		rsc := replicaset.NewReplicaSetController(ctx, apps.ReplicaSets(), core.Pods(), cs, replicaset.BurstReplicas)
		return func() { rsc.Run(ctx, concurrentRSSyncs) }, nil
	case ctrlStatefulSet:
		ssc := statefulset.NewStatefulSetController(ctx, core.Pods(), apps.StatefulSets(),
			core.PersistentVolumeClaims(), apps.ControllerRevisions(), cs)
		return func() { ssc.Run(ctx, concurrentStatefulSyncs) }, nil
	case ctrlDaemonSet:
		dsc, err := daemon.NewDaemonSetsController(ctx, apps.DaemonSets(), apps.ControllerRevisions(),
			core.Pods(), core.Nodes(), cs, flowcontrol.NewBackOff(1*time.Second, 15*time.Minute))
		if err != nil {
			return nil, err
		}
		return func() { dsc.Run(ctx, concurrentDaemonSetSyncs) }, nil
	case ctrlJob:
		jc, err := job.NewController(ctx, core.Pods(), factory.Batch().V1().Jobs(), cs)
		if err != nil {
			return nil, err
		}
		return func() { jc.Run(ctx, concurrentJobSyncs) }, nil
	case ctrlDisruption:
		// As kube-controller-manager's policy.go builds it: a discovery-backed
		// REST mapper and a scale client for the pods' controllers.
		mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(cs.Discovery()))
		scales := scaleclient.New(cs.Discovery().RESTClient(), mapper, dynamic.LegacyAPIPathResolverFunc,
			scaleclient.NewDiscoveryScaleKindResolver(cs.Discovery()))
		dc := disruption.NewDisruptionController(ctx, core.Pods(), factory.Policy().V1().PodDisruptionBudgets(),
			core.ReplicationControllers(), apps.ReplicaSets(), apps.Deployments(), apps.StatefulSets(),
			cs, mapper, scales, cs.Discovery())
		return func() { dc.Run(ctx) }, nil
	case ctrlEndpointSlice:
		esc := endpointslicecontroller.NewController(ctx, core.Pods(), core.Services(), core.Nodes(),
			factory.Discovery().V1().EndpointSlices(), maxEndpointsPerSlice, cs, 0)
		return func() { esc.Run(ctx, concurrentEndpointSyncs) }, nil
	case ctrlEndpoints:
		ec := endpointcontroller.NewEndpointController(ctx, core.Pods(), core.Services(), core.Endpoints(), cs, 0)
		return func() { ec.Run(ctx, concurrentEndpointSyncs) }, nil
	case ctrlPVBinder:
		return newPVBinder(ctx, cs, factory)
	case ctrlPVCProtection:
		pc, err := pvcprotection.NewPVCProtectionController(klog.FromContext(ctx),
			core.PersistentVolumeClaims(), core.Pods(), cs)
		if err != nil {
			return nil, err
		}
		return func() { pc.Run(ctx, 1) }, nil
	case ctrlPVProtection:
		pc := pvprotection.NewPVProtectionController(klog.FromContext(ctx), core.PersistentVolumes(), cs)
		return func() { pc.Run(ctx, 1) }, nil
	}
	return nil, fmt.Errorf("unknown workload controller %q", name)
}

// newPVBinder is kube-controller-manager's persistentvolume-binder with
// only the hostPath volume plugin (for Recycle/Delete of hostPath PVs;
// hostPath provisioning off, as kcm's default). Binding a claim to an
// existing volume needs no plugin; claims of a StorageClass with another
// provisioner get the volume.kubernetes.io/storage-provisioner annotation
// and wait for that (external, here test-played) provisioner.
func newPVBinder(ctx context.Context, cs clientset.Interface, factory informers.SharedInformerFactory) (func(), error) {
	plugins := hostpath.ProbeVolumePlugins(volume.VolumeConfig{
		RecyclerMinimumTimeout:   60,
		RecyclerTimeoutIncrement: 30,
		RecyclerPodTemplate:      volume.NewPersistentVolumeRecyclerPodTemplate(),
	})
	pvc, err := persistentvolumecontroller.NewController(ctx, persistentvolumecontroller.ControllerParameters{
		KubeClient:                cs,
		SyncPeriod:                pvClaimBinderSyncPeriod,
		VolumePlugins:             plugins,
		VolumeInformer:            factory.Core().V1().PersistentVolumes(),
		ClaimInformer:             factory.Core().V1().PersistentVolumeClaims(),
		ClassInformer:             factory.Storage().V1().StorageClasses(),
		PodInformer:               factory.Core().V1().Pods(),
		NodeInformer:              factory.Core().V1().Nodes(),
		EnableDynamicProvisioning: true,
	})
	if err != nil {
		return nil, err
	}
	return func() { pvc.Run(ctx) }, nil
}

// startScheduler runs the real kube-scheduler (k8s.io/kubernetes/pkg/scheduler,
// the default profile of the current config API, as cmd/kube-scheduler's
// Setup and Run build it, without leader election, health or metrics
// serving) against the API server until ctx is cancelled. It returns once
// its informers and event handlers are synced, so a pod created after the
// API server is reported ready is seen.
func startScheduler(ctx context.Context, restConfig *restclient.Config) error {
	cfg := restclient.CopyConfig(restConfig)
	restclient.AddUserAgent(cfg, "kube-scheduler")
	cfg.QPS, cfg.Burst = 50, 100 // kube-scheduler's defaults (clientConnection)
	cs, err := clientset.NewForConfig(cfg)
	if err != nil {
		return err
	}
	componentConfig, err := latest.Default()
	if err != nil {
		return err
	}
	informerFactory := scheduler.NewInformerFactory(cs, 0)
	broadcaster := events.NewEventBroadcasterAdapterWithContext(ctx, cs)
	recorderFactory := func(name string) events.EventRecorder { return broadcaster.NewRecorder(name) }
	sched, err := scheduler.New(ctx, cs, informerFactory, nil, profile.RecorderFactory(recorderFactory),
		scheduler.WithComponentConfigVersion(componentConfig.TypeMeta.APIVersion),
		scheduler.WithKubeConfig(cfg),
		scheduler.WithProfiles(componentConfig.Profiles...),
		scheduler.WithPercentageOfNodesToScore(componentConfig.PercentageOfNodesToScore),
		scheduler.WithPodMaxBackoffSeconds(componentConfig.PodMaxBackoffSeconds),
		scheduler.WithPodInitialBackoffSeconds(componentConfig.PodInitialBackoffSeconds),
		scheduler.WithExtenders(componentConfig.Extenders...),
		scheduler.WithParallelism(componentConfig.Parallelism),
	)
	if err != nil {
		return fmt.Errorf("kube-scheduler: %w", err)
	}
	broadcaster.StartRecordingToSink(ctx.Done())
	informerFactory.Start(ctx.Done())
	informerFactory.WaitForCacheSync(ctx.Done())
	if err := sched.WaitForHandlersSync(ctx); err != nil {
		broadcaster.Shutdown()
		return fmt.Errorf("kube-scheduler handlers: %w", err)
	}
	go func() {
		defer broadcaster.Shutdown()
		sched.Run(ctx)
		klog.FromContext(ctx).V(2).Info("kube-scheduler stopped")
	}()
	return nil
}
