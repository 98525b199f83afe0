//! The REAL Slinky slurm-operator process (built by `scripts/slurm-operator`, path in
//! `PADDOCK_TEST_SLURM_OPERATOR`), run as it would run in a tenant cluster: the args of its
//! chart's Deployment, a token of its chart's ServiceAccount, and a private `/etc/hosts` (under
//! `unshare --mount`) where the slurmrestd Service name it dials resolves to the stand-in.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use serde_json::Value;

/// The operator process (killed when dropped) and its log.
pub struct Operator {
    child: tokio::process::Child,
    log: PathBuf,
}

impl Operator {
    /// Runs `binary` with `args` and `kubeconfig`, in a private mount namespace whose
    /// `/etc/hosts` is `hosts` (the Service name of slurmrestd resolves to the stand-in).
    pub fn start(binary: &Path, args: &[String], kubeconfig: &Path, hosts: &Path, log: PathBuf) -> Self {
        let out = std::fs::File::create(&log).expect("the operator's log file");
        let err = out.try_clone().expect("the log file, twice");
        let child = tokio::process::Command::new("unshare")
            .args(["--mount", "--", "sh", "-c", r#"mount --bind "$1" /etc/hosts && shift && exec "$@""#, "sh"])
            .arg(hosts)
            .arg(binary)
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            .stdin(std::process::Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {} under unshare: {e}", binary.display()));
        Self { child, log }
    }

    /// The last lines of its log.
    pub fn tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Fails the test, with the end of its log, when the operator exited.
    pub fn check(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("the operator exited ({status}); its log ends:\n{}", self.tail());
        }
    }
}

/// The operator container's args and the pod's ServiceAccount, from the chart's Deployment (as
/// rendered, or as the tenant API server holds it), checking it runs the operator of `version`.
pub fn deployment_args(deployment: &Value, version: &str) -> (Vec<String>, String) {
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(container["image"], format!("ghcr.io/slinkyproject/slurm-operator:{version}"));
    let args = container["args"].as_array().expect("the operator's args");
    let args = args.iter().map(|a| a.as_str().expect("string args").to_owned()).collect();
    (args, pod["serviceAccountName"].as_str().expect("a ServiceAccount").to_owned())
}

/// The chart's args with the listen addresses moved off ports others use on this machine (8080,
/// 8081): metrics off, the health probe on a free loopback port. Everything else is kept.
pub fn local_args(args: &[String]) -> Vec<String> {
    let health_port = free_port();
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        out.push(arg.clone());
        let replaced = match arg.as_str() {
            "--metrics-addr" => "0".to_owned(),
            "--health-addr" => format!("127.0.0.1:{health_port}"),
            _ => continue,
        };
        it.next();
        out.push(replaced);
    }
    out
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address").port()
}

/// A private `/etc/hosts` for the operator in `dir`: this machine's, plus `name` at `ip`.
pub fn hosts_file(dir: &Path, name: &str, ip: Ipv4Addr) -> PathBuf {
    let mut hosts = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
    hosts.push_str(&format!("\n# paddock's operator tests: the slurmrestd stand-in\n{ip} {name}\n"));
    let path = dir.join("hosts");
    std::fs::write(&path, hosts).expect("write the private hosts file");
    path
}

/// A random loopback address (127.x.y.z) for the stand-in the operator dials.
pub fn random_loopback() -> Ipv4Addr {
    let octets = *uuid::Uuid::new_v4().as_bytes();
    Ipv4Addr::new(127, octets[0] | 1, octets[1], octets[2] | 1)
}

/// This host's address on its default route (the API server's service proxy refuses loopback),
/// where the stand-in also listens for paddock's probe; None when there is none.
pub fn routable_ip() -> Option<IpAddr> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("192.0.2.1:9").or_else(|_| socket.connect("10.255.255.1:9")).ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// A kubeconfig (YAML) for the API server at `url` holding a fresh TokenRequest token (an hour)
/// of the ServiceAccount `namespace/account`, as a pod's projected token would be: its holder gets
/// exactly that account's RBAC, not admin. `admin` requests the token; `admin_kubeconfig` (the
/// server's admin kubeconfig, text) gives the CA.
pub async fn service_account_kubeconfig(
    admin: &kube::Client,
    url: &str,
    admin_kubeconfig: &str,
    namespace: &str,
    account: &str,
) -> String {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    let accounts: kube::Api<ServiceAccount> = kube::Api::namespaced(admin.clone(), namespace);
    let request = TokenRequest {
        spec: TokenRequestSpec { expiration_seconds: Some(3600), ..TokenRequestSpec::default() },
        ..TokenRequest::default()
    };
    let token = accounts
        .create_token_request(account, &kube::api::PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("a token of the ServiceAccount {namespace}/{account}: {e}"))
        .status
        .expect("token status")
        .token;
    let ca_line = admin_kubeconfig
        .lines()
        .find(|l| l.trim_start().starts_with("certificate-authority-data:"))
        .expect("the admin kubeconfig embeds its CA");
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: harness\n  cluster:\n    server: {url}\n    {}\n\
         users:\n- name: {account}\n  user:\n    token: {token}\ncontexts:\n- name: harness\n  context:\n    \
         cluster: harness\n    user: {account}\ncurrent-context: harness\n",
        ca_line.trim_start()
    )
}
