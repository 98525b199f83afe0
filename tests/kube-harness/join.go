package main

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	certificatesinformers "k8s.io/client-go/informers/certificates/v1"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"
	kubeadmconstants "k8s.io/kubernetes/cmd/kubeadm/app/constants"
	"k8s.io/kubernetes/pkg/controller/bootstrap"
	"k8s.io/kubernetes/pkg/controller/certificates/approver"
	"k8s.io/kubernetes/pkg/controller/certificates/signer"
	"k8s.io/kubernetes/pkg/controller/nodelifecycle"
)

// The controllers a real kubelet's TLS bootstrap and registration need, as
// a kubeadm (and so a Kamaji) control plane runs them: kube-controller-manager
// with `--controllers=*,bootstrapsigner,tokencleaner`. Opt-in (the
// "node-join" group): the node-lifecycle controller marks a Node whose
// kubelet stops posting status (as every Node a test plays) Unknown after
// the grace period.
const (
	// Approves CSRs of kubelets' client certificates (kubeadm's RBAC says
	// whose: the bootstrap token group's, and nodes' own renewals).
	ctrlCSRApproving = "csrapproving"
	// Signs approved CSRs of the kubelet-serving, kube-apiserver-client-kubelet,
	// kube-apiserver-client and legacy-unknown signers with the API server's CA.
	ctrlCSRSigning = "csrsigning"
	// Signs the kube-public/cluster-info ConfigMap with a JWS per bootstrap
	// token (key `jws-kubeconfig-<token id>`), for kubeadm's token discovery.
	ctrlBootstrapSigner = "bootstrapsigner"
	// Deletes expired bootstrap token Secrets.
	ctrlTokenCleaner = "tokencleaner"
	// Node health from status and Leases: lifts the not-ready taint of a
	// Ready Node, marks a silent one Unknown (and taints it).
	ctrlNodeLifecycle = "node-lifecycle"
)

// joinControllers is the "node-join" group.
var joinControllers = []string{ctrlCSRApproving, ctrlCSRSigning, ctrlBootstrapSigner,
	ctrlTokenCleaner, ctrlNodeLifecycle}

const groupNodeJoin = "node-join"

// kube-controller-manager's defaults (its ComponentConfig).
const (
	concurrentCSRSyncs        = 5
	clusterSigningDuration    = 365 * 24 * time.Hour
	nodeMonitorPeriod         = 5 * time.Second
	nodeStartupGracePeriod    = 60 * time.Second
	nodeMonitorGracePeriod    = 50 * time.Second
	nodeEvictionRate          = 0.1
	secondaryNodeEvictionRate = 0.01
	largeClusterSizeThreshold = 50
	unhealthyZoneThreshold    = 0.55
	// kubeadm's Role and RoleBinding letting anonymous users read cluster-info.
	bootstrapSignerClusterInfo = "kubeadm:bootstrap-signer-clusterinfo"
	anonymousUser              = "system:anonymous"
)

// newJoinController builds one controller of the "node-join" group on the
// shared informer factory, like cmd/kube-controller-manager/app
// (certificates.go, bootstrap.go, core.go), and returns what runs it.
// caFile and caKeyFile are the API server's CA, which signs the CSRs.
func newJoinController(ctx context.Context, name string, cs clientset.Interface, factory informers.SharedInformerFactory, caFile, caKeyFile string) (func(), error) {
	core := factory.Core().V1()
	switch name {
	case ctrlCSRApproving:
		ac := approver.NewCSRApprovingController(ctx, cs, factory.Certificates().V1().CertificateSigningRequests())
		return func() { ac.Run(ctx, concurrentCSRSyncs) }, nil
	case ctrlCSRSigning:
		csrs := factory.Certificates().V1().CertificateSigningRequests()
		var runs []func()
		for _, newSigner := range []func(context.Context, clientset.Interface, certificatesinformers.CertificateSigningRequestInformer, string, string, time.Duration) (*signer.CSRSigningController, error){
			signer.NewKubeletServingCSRSigningController,
			signer.NewKubeletClientCSRSigningController,
			signer.NewKubeAPIServerClientCSRSigningController,
			signer.NewLegacyUnknownCSRSigningController,
		} {
			sc, err := newSigner(ctx, cs, csrs, caFile, caKeyFile, clusterSigningDuration)
			if err != nil {
				return nil, err
			}
			runs = append(runs, func() { sc.Run(ctx, concurrentCSRSyncs) })
		}
		return func() {
			for _, run := range runs {
				go run()
			}
		}, nil
	case ctrlBootstrapSigner:
		bs, err := bootstrap.NewSigner(cs, core.Secrets(), core.ConfigMaps(), bootstrap.DefaultSignerOptions())
		if err != nil {
			return nil, err
		}
		return func() { bs.Run(ctx) }, nil
	case ctrlTokenCleaner:
		tc, err := bootstrap.NewTokenCleaner(cs, core.Secrets(), bootstrap.DefaultTokenCleanerOptions())
		if err != nil {
			return nil, err
		}
		return func() { tc.Run(ctx) }, nil
	case ctrlNodeLifecycle:
		nlc, err := nodelifecycle.NewNodeLifecycleController(ctx,
			factory.Coordination().V1().Leases(), core.Pods(), core.Nodes(), factory.Apps().V1().DaemonSets(),
			cs, nodeMonitorPeriod, nodeStartupGracePeriod, nodeMonitorGracePeriod,
			nodeEvictionRate, secondaryNodeEvictionRate, largeClusterSizeThreshold, unhealthyZoneThreshold)
		if err != nil {
			return nil, err
		}
		return func() { nlc.Run(ctx) }, nil
	}
	return nil, fmt.Errorf("not a node-join controller: %q", name)
}

// setUpNodeBootstrap writes what kubeadm's bootstrap-token phase writes into
// a new control plane (Kamaji runs the same phase for its tenant control
// planes), so that a kubelet can join with a bootstrap token:
//   - the RBAC of cmd/kubeadm/app/phases/bootstraptoken/node: the token group
//     may post CSRs (kubeadm:kubelet-bootstrap), get Nodes (kubeadm:get-nodes),
//     and have its node-client CSRs auto-approved
//     (kubeadm:node-autoapprove-bootstrap); nodes' own renewals are
//     auto-approved too (kubeadm:node-autoapprove-certificate-rotation);
//   - the kube-public/cluster-info ConfigMap (server URL and CA, for token
//     discovery) and the Role/RoleBinding letting system:anonymous read it
//     (phases/bootstraptoken/clusterinfo).
//
// kubeadm's own functions print to stdout, which is the harness's contract,
// hence this copy of what they create (same names and rules).
func setUpNodeBootstrap(ctx context.Context, cs clientset.Interface, url string, caData []byte) error {
	tokenGroup := rbacv1.Subject{Kind: rbacv1.GroupKind, Name: kubeadmconstants.NodeBootstrapTokenAuthGroup}
	nodesGroup := rbacv1.Subject{Kind: rbacv1.GroupKind, Name: kubeadmconstants.NodesGroup}
	binding := func(name, role string, subject rbacv1.Subject) *rbacv1.ClusterRoleBinding {
		return &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{subject},
		}
	}
	getNodes := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: kubeadmconstants.GetNodesClusterRoleName},
		Rules:      []rbacv1.PolicyRule{{Verbs: []string{"get"}, APIGroups: []string{""}, Resources: []string{"nodes"}}},
	}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, getNodes, metav1.CreateOptions{}); ignoreExists(err) != nil {
		return fmt.Errorf("ClusterRole %s: %w", getNodes.Name, err)
	}
	for _, b := range []*rbacv1.ClusterRoleBinding{
		binding(kubeadmconstants.NodeKubeletBootstrap, kubeadmconstants.NodeBootstrapperClusterRoleName, tokenGroup),
		binding(kubeadmconstants.GetNodesClusterRoleName, kubeadmconstants.GetNodesClusterRoleName, tokenGroup),
		binding(kubeadmconstants.NodeAutoApproveBootstrapClusterRoleBinding, kubeadmconstants.CSRAutoApprovalClusterRoleName, tokenGroup),
		binding(kubeadmconstants.NodeAutoApproveCertificateRotationClusterRoleBinding, kubeadmconstants.NodeSelfCSRAutoApprovalClusterRoleName, nodesGroup),
	} {
		if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, b, metav1.CreateOptions{}); ignoreExists(err) != nil {
			return fmt.Errorf("ClusterRoleBinding %s: %w", b.Name, err)
		}
	}
	return createClusterInfo(ctx, cs, url, caData)
}

// createClusterInfo writes kube-public/cluster-info (a kubeconfig with one
// unnamed cluster: server and CA, no user) and lets anonymous users get it.
func createClusterInfo(ctx context.Context, cs clientset.Interface, url string, caData []byte) error {
	kubeconfig, err := clientcmd.Write(clientcmdapi.Config{
		Clusters: map[string]*clientcmdapi.Cluster{"": {Server: url, CertificateAuthorityData: caData}},
	})
	if err != nil {
		return err
	}
	cm := &v1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: bootstrapapi.ConfigMapClusterInfo, Namespace: metav1.NamespacePublic},
		Data:       map[string]string{bootstrapapi.KubeConfigKey: string(kubeconfig)},
	}
	if _, err := cs.CoreV1().ConfigMaps(metav1.NamespacePublic).Create(ctx, cm, metav1.CreateOptions{}); ignoreExists(err) != nil {
		return fmt.Errorf("ConfigMap %s/%s: %w", cm.Namespace, cm.Name, err)
	}
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: bootstrapSignerClusterInfo, Namespace: metav1.NamespacePublic},
		Rules: []rbacv1.PolicyRule{{Verbs: []string{"get"}, APIGroups: []string{""},
			Resources: []string{"configmaps"}, ResourceNames: []string{bootstrapapi.ConfigMapClusterInfo}}},
	}
	if _, err := cs.RbacV1().Roles(metav1.NamespacePublic).Create(ctx, role, metav1.CreateOptions{}); ignoreExists(err) != nil {
		return fmt.Errorf("Role %s: %w", role.Name, err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: bootstrapSignerClusterInfo, Namespace: metav1.NamespacePublic},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: bootstrapSignerClusterInfo},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: anonymousUser}},
	}
	if _, err := cs.RbacV1().RoleBindings(metav1.NamespacePublic).Create(ctx, rb, metav1.CreateOptions{}); ignoreExists(err) != nil {
		return fmt.Errorf("RoleBinding %s: %w", rb.Name, err)
	}
	return nil
}

func ignoreExists(err error) error {
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}
