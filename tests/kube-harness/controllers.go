package main

import (
	"context"
	"fmt"
	"sort"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	quotageneric "k8s.io/apiserver/pkg/quota/v1/generic"
	cacheddiscovery "k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/informers"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	restclient "k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/util/keyutil"
	"k8s.io/controller-manager/pkg/informerfactory"
	"k8s.io/klog/v2"
	pkgcontroller "k8s.io/kubernetes/pkg/controller"
	"k8s.io/kubernetes/pkg/controller/certificates/rootcacertpublisher"
	"k8s.io/kubernetes/pkg/controller/garbagecollector"
	namespacecontroller "k8s.io/kubernetes/pkg/controller/namespace"
	resourcequotacontroller "k8s.io/kubernetes/pkg/controller/resourcequota"
	serviceaccountcontroller "k8s.io/kubernetes/pkg/controller/serviceaccount"
	quotainstall "k8s.io/kubernetes/pkg/quota/v1/install"
	"k8s.io/kubernetes/pkg/serviceaccount"
)

// The kube-controller-manager controllers the harness can run in-process
// against each API server. They are the real controllers from
// k8s.io/kubernetes/pkg/controller, wired up the way
// cmd/kube-controller-manager/app and test/integration/util do it.
const (
	// Finalizes deleted namespaces: deletes every namespaced object and then
	// removes the "kubernetes" finalizer, so the namespace really disappears.
	ctrlNamespace = "namespace"
	// Creates the "default" ServiceAccount in every namespace.
	ctrlServiceAccount = "serviceaccount"
	// Fills legacy Secrets of type kubernetes.io/service-account-token.
	// (TokenRequest, i.e. `serviceaccounts/<sa>/token`, is served by the API
	// server itself and needs no controller.)
	ctrlServiceAccountToken = "serviceaccount-token"
	// Deletes dependents whose ownerReferences point to deleted owners
	// (background and foreground cascading deletion).
	ctrlGarbageCollector = "garbagecollector"
	// Publishes the kube-root-ca.crt ConfigMap into every namespace.
	ctrlRootCACertPublisher = "root-ca-cert-publisher"
	// Computes ResourceQuota status.used. Without it quotas are stored but
	// not enforced (admission only checks quotas whose status.hard is set).
	ctrlResourceQuota = "resourcequota"
)

// defaultControllers is the "defaults" group: the set started for each API
// server when a request names no controllers.
var defaultControllers = []string{ctrlNamespace, ctrlServiceAccount, ctrlServiceAccountToken,
	ctrlGarbageCollector, ctrlRootCACertPublisher, ctrlResourceQuota}

// controllerGroups maps a group name to the controllers it stands for.
var controllerGroups = map[string][]string{
	groupDefaults:  defaultControllers,
	groupWorkloads: workloadControllers,
	groupNodeJoin:  joinControllers,
}

// expandControllers resolves a request's controller list (group names and
// single controller names, in any mix) into single names, without
// duplicates, in the order given. nil means the "defaults" group.
func expandControllers(requested *[]string) ([]string, error) {
	if requested == nil {
		return append([]string(nil), defaultControllers...), nil
	}
	known := map[string]bool{}
	for _, group := range controllerGroups {
		for _, n := range group {
			known[n] = true
		}
	}
	seen := map[string]bool{}
	out := []string{}
	for _, n := range *requested {
		members, isGroup := controllerGroups[n]
		if !isGroup {
			if !known[n] {
				return nil, fmt.Errorf("unknown controller %q (groups: %s, %s, %s; controllers: %v %v %v)",
					n, groupDefaults, groupWorkloads, groupNodeJoin, defaultControllers, workloadControllers, joinControllers)
			}
			members = []string{n}
		}
		for _, m := range members {
			if !seen[m] {
				seen[m] = true
				out = append(out, m)
			}
		}
	}
	return out, nil
}

// startControllers starts the named controllers against the API server
// reachable with restConfig (the API server's in-process loopback config,
// which is a system:masters identity). They stop when ctx is cancelled.
// files are the API server's credentials: its CA (published in token secrets
// and kube-root-ca.crt, and signing CSRs) and service-account key.
func startControllers(ctx context.Context, restConfig *restclient.Config, names []string, files *serverFiles) error {
	if len(names) == 0 {
		return nil
	}
	names = append([]string(nil), names...)
	sort.Strings(names)
	logger := klog.FromContext(ctx)

	newClient := func(userAgent string, qpsFactor float32) (*restclient.Config, clientset.Interface, error) {
		cfg := restclient.CopyConfig(restConfig)
		restclient.AddUserAgent(cfg, userAgent)
		// kube-controller-manager defaults, multiplied like it does for
		// the chatty namespace and GC controllers.
		cfg.QPS = 20 * qpsFactor
		cfg.Burst = int(30 * qpsFactor)
		cs, err := clientset.NewForConfig(cfg)
		return cfg, cs, err
	}

	// Shared informer factories, like kube-controller-manager: typed
	// informers for built-in types, metadata-only informers for the rest
	// (custom resources), combined for the GC and quota controllers.
	informerConfig, informerClient, err := newClient("kube-harness-shared-informers", 1)
	if err != nil {
		return err
	}
	factory := informers.NewSharedInformerFactory(informerClient, 12*time.Hour)
	metadataInformerClient, err := metadata.NewForConfig(informerConfig)
	if err != nil {
		return err
	}
	metadataInformers := metadatainformer.NewSharedInformerFactory(metadataInformerClient, 12*time.Hour)
	objectOrMetadataInformers := informerfactory.NewInformerFactory(factory, metadataInformers)
	// Closed once the factories are started; GC and quota monitors wait for it.
	informersStarted := make(chan struct{})
	var runs []func()
	wantScheduler := false // the scheduler has informers of its own

	for _, name := range names {
		switch name {
		case ctrlNamespace:
			cfg, cs, err := newClient("namespace-controller", 20)
			if err != nil {
				return err
			}
			metadataClient, err := metadata.NewForConfig(cfg)
			if err != nil {
				return err
			}
			nc := namespacecontroller.NewNamespaceController(ctx, cs, metadataClient,
				cs.Discovery().ServerPreferredNamespacedResources,
				factory.Core().V1().Namespaces(), 5*time.Minute, v1.FinalizerKubernetes)
			runs = append(runs, func() { nc.Run(ctx, 5) })

		case ctrlServiceAccount:
			_, cs, err := newClient("service-account-controller", 1)
			if err != nil {
				return err
			}
			sac, err := serviceaccountcontroller.NewServiceAccountsController(logger,
				factory.Core().V1().ServiceAccounts(), factory.Core().V1().Namespaces(), cs,
				serviceaccountcontroller.DefaultServiceAccountsControllerOptions())
			if err != nil {
				return fmt.Errorf("serviceaccount controller: %w", err)
			}
			runs = append(runs, func() { sac.Run(ctx, 1) })

		case ctrlServiceAccountToken:
			_, cs, err := newClient("tokens-controller", 1)
			if err != nil {
				return err
			}
			key, err := keyutil.PrivateKeyFromFile(files.SAKeyFile)
			if err != nil {
				return err
			}
			gen, err := serviceaccount.JWTTokenGenerator(serviceaccount.LegacyIssuer, key)
			if err != nil {
				return err
			}
			tc, err := serviceaccountcontroller.NewTokensController(logger,
				factory.Core().V1().ServiceAccounts(), factory.Core().V1().Secrets(), cs,
				serviceaccountcontroller.TokensControllerOptions{TokenGenerator: gen, RootCA: files.CAData})
			if err != nil {
				return fmt.Errorf("serviceaccount-token controller: %w", err)
			}
			runs = append(runs, func() { tc.Run(ctx, 1) })

		case ctrlGarbageCollector:
			cfg, cs, err := newClient("generic-garbage-collector", 2)
			if err != nil {
				return err
			}
			metadataClient, err := metadata.NewForConfig(cfg)
			if err != nil {
				return err
			}
			mapper := restmapper.NewDeferredDiscoveryRESTMapper(cacheddiscovery.NewMemCacheClient(cs.Discovery()))
			mapper.Reset()
			gc, err := garbagecollector.NewGarbageCollector(ctx, cs, metadataClient, mapper,
				garbagecollector.DefaultIgnoredResources(), objectOrMetadataInformers, informersStarted)
			if err != nil {
				return fmt.Errorf("garbage collector: %w", err)
			}
			const syncPeriod = 5 * time.Second // kube-controller-manager: 30s; faster CRD pickup for tests
			runs = append(runs,
				func() { wait.Until(mapper.Reset, syncPeriod, ctx.Done()) },
				func() { gc.Run(ctx, 5, syncPeriod) },
				func() { gc.Sync(ctx, cs.Discovery(), syncPeriod) })

		case ctrlRootCACertPublisher:
			_, cs, err := newClient("root-ca-cert-publisher", 1)
			if err != nil {
				return err
			}
			p, err := rootcacertpublisher.NewPublisher(factory.Core().V1().ConfigMaps(),
				factory.Core().V1().Namespaces(), cs, files.CAData)
			if err != nil {
				return fmt.Errorf("root-ca-cert-publisher: %w", err)
			}
			runs = append(runs, func() { p.Run(ctx, 1) })

		case ctrlResourceQuota:
			_, cs, err := newClient("resourcequota-controller", 1)
			if err != nil {
				return err
			}
			discoveryFunc := cs.Discovery().ServerPreferredNamespacedResources
			quotaConfig := quotainstall.NewQuotaConfigurationForControllers(
				quotageneric.ListerFuncForResourceFunc(factory.ForResource), factory)
			// The full recount every 15 s, not kube-controller-manager's 5 min: the
			// quota monitor replenishes on updates and deletes only (admission counts
			// creates), so a create admitted while the controller recounts from a cache
			// that has not seen it yet is undercounted until the next full recount.
			// Tests that wait for status.used to settle wait for that recount.
			rq, err := resourcequotacontroller.NewController(ctx, &resourcequotacontroller.ControllerOptions{
				QuotaClient:               cs.CoreV1(),
				ResourceQuotaInformer:     factory.Core().V1().ResourceQuotas(),
				ResyncPeriod:              pkgcontroller.StaticResyncPeriodFunc(15 * time.Second),
				InformerFactory:           objectOrMetadataInformers,
				ReplenishmentResyncPeriod: pkgcontroller.StaticResyncPeriodFunc(12 * time.Hour),
				DiscoveryFunc:             discoveryFunc,
				IgnoredResourcesFunc:      quotaConfig.IgnoredResources,
				InformersStarted:          informersStarted,
				Registry:                  quotageneric.NewRegistry(quotaConfig.Evaluators()),
				UpdateFilter:              quotainstall.DefaultUpdateFilter(),
			})
			if err != nil {
				return fmt.Errorf("resourcequota controller: %w", err)
			}
			runs = append(runs,
				func() { rq.Run(ctx, 5) },
				func() { rq.Sync(ctx, discoveryFunc, 30*time.Second) })

		case ctrlScheduler:
			wantScheduler = true

		case ctrlCSRApproving, ctrlCSRSigning, ctrlBootstrapSigner, ctrlTokenCleaner, ctrlNodeLifecycle:
			_, cs, err := newClient(name+"-controller", 1)
			if err != nil {
				return err
			}
			run, err := newJoinController(ctx, name, cs, factory, files.CAFile, files.CAKeyFile)
			if err != nil {
				return fmt.Errorf("%s controller: %w", name, err)
			}
			runs = append(runs, run)

		default:
			_, cs, err := newClient(name+"-controller", 1)
			if err != nil {
				return err
			}
			run, err := newWorkloadController(ctx, name, cs, factory)
			if err != nil {
				return fmt.Errorf("%s controller: %w", name, err)
			}
			runs = append(runs, run)
		}
	}

	// Informers must be requested (above) before the factories are started.
	factory.Start(ctx.Done())
	metadataInformers.Start(ctx.Done())
	close(informersStarted)
	for _, run := range runs {
		go run()
	}
	if wantScheduler {
		if err := startScheduler(ctx, restConfig); err != nil {
			return err
		}
	}
	logger.Info("Started in-process controllers", "controllers", names)
	return nil
}
