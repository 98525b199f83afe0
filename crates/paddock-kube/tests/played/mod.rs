//! What the tests PLAY around the REAL Slinky slurm-operator, shared by paddock-kube's operator
//! test (`tests/kube/operator.rs`) and the API's end-to-end test with the real Kubernetes drivers
//! (`tests/api/kubernetes.rs`, which includes this directory by path): the kubelets
//! ([`kubelet`]), a volume provisioner ([`provisioner`]), a labelled slurmrestd STAND-IN
//! ([`restd`]), and the operator process itself ([`operator`]); around the REAL KubeRay
//! operator, a labelled Ray head STAND-IN ([`rayhead`]).

pub mod kubelet;
pub mod operator;
pub mod provisioner;
pub mod rayhead;
pub mod restd;
