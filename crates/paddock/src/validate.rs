//! The settings' rules, checked at a process's start (and by `paddock check-config`): every missing
//! or invalid setting is reported at once, each problem naming its variable, so that a new
//! configuration takes one correction rather than one start per mistake. The chart
//! (`deploy/helm/paddock`) refuses to render what these rules refuse of the settings its values own;
//! a test (crates/paddock/tests/chart.rs) holds the two to the same list.

use clap::ValueEnum;

use crate::config::{secret_value, BmcDriver, KubeDriver, Settings, SIMULATED_IMAGE_HOST};

/// The process whose start is checked: what it needs besides the rules every process shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Process {
    /// The API and the worker (`paddock serve`, and `paddock dev` once it has made its keys).
    Serve,
    /// The API alone.
    Api,
    /// The worker alone.
    Worker,
    /// The migrations.
    Migrate,
    /// The re-seal request.
    Reseal,
}

impl Process {
    /// Whether it opens the sealed values and writes the custody ledger.
    fn needs_keys(self) -> bool {
        matches!(self, Self::Serve | Self::Api | Self::Worker)
    }

    /// Whether it verifies tokens.
    fn serves_api(self) -> bool {
        matches!(self, Self::Serve | Self::Api)
    }
}

/// Every problem of a configuration, each naming its setting.
#[derive(Debug)]
pub struct Invalid {
    /// One line per problem.
    pub problems: Vec<String>,
}

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.problems.len();
        write!(f, "the configuration has {n} problem{} (docs/configuration.md):", if n == 1 { "" } else { "s" })?;
        for problem in &self.problems {
            write!(f, "\n  - {problem}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Invalid {}

/// The problems found so far.
#[derive(Default)]
struct Problems(Vec<String>);

impl Problems {
    /// Records `problem` unless `ok`.
    fn check(&mut self, ok: bool, problem: impl FnOnce() -> String) {
        if !ok {
            self.0.push(problem());
        }
    }

    /// Records a failed reading of a setting (its whole chain, which names the setting).
    fn result<T>(&mut self, result: anyhow::Result<T>) -> Option<T> {
        result.map_err(|e| self.0.push(format!("{e:#}"))).ok()
    }
}

impl Settings {
    /// Checks every rule for `process`'s start; Err lists every problem.
    pub fn validate(&self, process: Process) -> Result<(), Invalid> {
        let mut problems = Problems::default();
        self.check_keys(process, &mut problems);
        if process.serves_api() {
            self.check_tokens(&mut problems);
            if let Err(oidc) = self.console_oidc_checked() {
                problems.0.extend(oidc);
            }
        }
        self.check_drivers(&mut problems);
        self.check_agent(&mut problems);
        self.check_listeners(&mut problems);
        self.check_limits(&mut problems);
        match problems.0.is_empty() {
            true => Ok(()),
            false => Err(Invalid { problems: problems.0 }),
        }
    }

    /// The database and the keys.
    fn check_keys(&self, process: Process, problems: &mut Problems) {
        problems.check(self.database_url.is_some(), || {
            "PADDOCK_DATABASE_URL is required: the PostgreSQL URL (or run `paddock dev`)".to_owned()
        });
        problems.result(self.signing_key());
        let ledger = problems.result(secret_value(&self.ledger_key, &self.ledger_key_file, "PADDOCK_LEDGER_KEY"));
        match ledger {
            Some(Some(key)) => {
                problems.check(key.len() >= 32, || "PADDOCK_LEDGER_KEY must be at least 32 characters".to_owned())
            }
            Some(None) if process.needs_keys() => {
                problems.result(self.ledger_key());
            }
            _ => {}
        }
        if process.needs_keys() {
            problems.result(self.cipher());
        }
    }

    /// What the API verifies tokens with (the verifier's own refusals, checked before it is made).
    fn check_tokens(&self, problems: &mut Problems) {
        let secret = problems.result(self.hs256_secret()).flatten();
        if let Some(secret) = &secret {
            let min = paddock_auth::MIN_HS256_SECRET_LEN;
            problems.check(secret.len() >= min, || format!("PADDOCK_JWT_HS256_SECRET must be at least {min} bytes"));
        }
        let keys = secret.is_some() || self.jwt_public_keys.is_some() || self.jwt_jwks_url.is_some();
        let secret_failed = self.jwt_hs256_secret_file.is_some() && secret.is_none();
        problems.check(keys || secret_failed, || {
            "no token key: set PADDOCK_JWT_HS256_SECRET (or its _FILE), PADDOCK_JWT_PUBLIC_KEYS or PADDOCK_JWT_JWKS_URL"
                .to_owned()
        });
        if let Some(path) = &self.jwt_public_keys {
            problems.check(path.exists(), || format!("PADDOCK_JWT_PUBLIC_KEYS {} does not exist", path.display()));
        }
        problems.check(!self.jwt_issuer.is_empty(), || "PADDOCK_JWT_ISSUER must not be empty".to_owned());
        problems.check(!self.jwt_audience.is_empty(), || "PADDOCK_JWT_AUDIENCE must not be empty".to_owned());
    }

    /// What a chosen driver needs.
    fn check_drivers(&self, problems: &mut Problems) {
        if self.kube_driver == KubeDriver::Kubernetes {
            problems.check(self.stacks_dir.is_some(), || {
                "PADDOCK_KUBE_DRIVER=kubernetes needs PADDOCK_STACKS_DIR (the tenant base stack's manifests; see scripts/stacks-fetch)".to_owned()
            });
        }
        if let Some(dir) = &self.stacks_dir {
            problems.check(dir.is_dir(), || format!("PADDOCK_STACKS_DIR {} is not a directory", dir.display()));
        }
        if let Some(registry) = &self.slurm_image_registry {
            problems.check(paddock_domain::stack::is_image_registry(registry), || {
                format!(
                    "PADDOCK_SLURM_IMAGE_REGISTRY {registry:?} is not an image registry: a host, an optional port \
                     and path (lowercase), no scheme, tag or trailing '/', e.g. registry.example:5000/slurm"
                )
            });
        }
        problems.result(self.identity_range());
        if let Some(role) = &self.kube_namespace_role {
            let named = !role.is_empty() && role.len() <= 253 && !role.contains(['/', '%']);
            problems.check(named && !role.contains(char::is_whitespace), || {
                "PADDOCK_KUBE_NAMESPACE_ROLE must be a ClusterRole's name (1 to 253 characters, no '/', '%' or space)"
                    .to_owned()
            });
        }
        if self.bmc_driver == BmcDriver::Redfish {
            for (name, url, what) in [
                ("PADDOCK_WIPE_IMAGE_URL", &self.wipe_image_url, "the image machines boot to be wiped"),
                ("PADDOCK_OS_IMAGE_URL", &self.os_image_url, "the node OS image machines are provisioned with"),
            ] {
                problems.check(url.is_some(), || format!("PADDOCK_BMC_DRIVER=redfish needs {name} ({what})"));
            }
        }
    }

    /// The agent transport and image digests: https agent URLs unless PADDOCK_AGENT_INSECURE_HTTP,
    /// and with the Redfish driver both URLs and both digests set explicitly.
    fn check_agent(&self, problems: &mut Problems) {
        let redfish = self.bmc_driver == BmcDriver::Redfish;
        let insecure = self.agent_insecure_http;
        // The images travel the same provisioning network as the seeds, fetched by the BMCs: the
        // same rule and the same opt-in (no other setting exists for them). The simulated images'
        // default URLs are fetched by nothing.
        let simulated =
            |url: &url::Url| self.bmc_driver == BmcDriver::Simulated && url.host_str() == Some(SIMULATED_IMAGE_HOST);
        for (name, url, who) in [
            ("PADDOCK_AGENT_BASE_URL", &self.agent_base_url, Some("machines")),
            ("PADDOCK_AGENT_SEED_BASE_URL", &self.agent_seed_base_url, Some("BMCs")),
            ("PADDOCK_WIPE_IMAGE_URL", &self.wipe_image_url, None),
            ("PADDOCK_OS_IMAGE_URL", &self.os_image_url, None),
        ] {
            match (url, who) {
                (None, Some(who)) if redfish => problems.0.push(format!(
                    "PADDOCK_BMC_DRIVER=redfish needs {name} (https; the URL {who} reach paddock's agent endpoints at)"
                )),
                (Some(url), _) if !simulated(url) => problems.check(
                    url.scheme() == "https" || (insecure && url.scheme() == "http"),
                    || {
                        format!(
                        "{name} must be an https URL (plain http only with PADDOCK_AGENT_INSECURE_HTTP=true), not {}://...",
                        url.scheme()
                    )
                    },
                ),
                _ => {}
            }
        }
        // Without an explicit URL the default is http:// + the listen address: a lab's choice.
        // (With the Redfish driver the missing URL is reported above.)
        if !redfish && self.bmc_driver != BmcDriver::None {
            problems.check(self.agent_base_url.is_some() || insecure, || {
                "PADDOCK_AGENT_BASE_URL is not set and its default is plain http: set an https URL, or PADDOCK_AGENT_INSECURE_HTTP=true for a lab".to_owned()
            });
        }
        for (name, digest) in
            [("PADDOCK_WIPE_IMAGE_SHA256", &self.wipe_image_sha256), ("PADDOCK_OS_IMAGE_SHA256", &self.os_image_sha256)]
        {
            match digest {
                None if redfish => problems.0.push(format!(
                    "PADDOCK_BMC_DRIVER=redfish needs {name} (the image's SHA-256, 64 hex digits: `sha256sum`)"
                )),
                Some(d) => problems.check(paddock_domain::agent::is_sha256_hex(d), || {
                    format!("{name} must be a SHA-256 in lower-case hex (64 digits)")
                }),
                None => {}
            }
        }
        if let Some(path) = &self.agent_ca_cert_file {
            problems.check(path.is_file(), || "PADDOCK_AGENT_CA_CERT_FILE is not a readable file".to_owned());
        }
    }

    /// The listeners are distinct.
    fn check_listeners(&self, problems: &mut Problems) {
        if let Some(metrics) = self.metrics_listen {
            problems.check(metrics != self.listen, || {
                format!("PADDOCK_METRICS_LISTEN must differ from PADDOCK_LISTEN ({metrics})")
            });
        }
        if let Some(agent) = self.agent_listen {
            problems.check(agent != self.listen && Some(agent) != self.metrics_listen, || {
                format!("PADDOCK_AGENT_LISTEN must differ from PADDOCK_LISTEN and PADDOCK_METRICS_LISTEN ({agent})")
            });
        }
    }

    /// The numeric settings' ranges.
    fn check_limits(&self, problems: &mut Problems) {
        let within = |value: u64, range: std::ops::RangeInclusive<u64>| range.contains(&value);
        let count = |value: usize| u64::try_from(value).unwrap_or(u64::MAX);
        for (ok, problem) in [
            (within(self.agent_token_ttl, 1..=604_800), "PADDOCK_AGENT_TOKEN_TTL must be between 1 and 604800 seconds"),
            (within(self.join_token_ttl, 1..=86_400), "PADDOCK_JOIN_TOKEN_TTL must be between 1 and 86400 seconds"),
            (within(self.release_timeout, 1..=604_800), "PADDOCK_RELEASE_TIMEOUT must be between 1 and 604800 seconds"),
            (within(count(self.worker_concurrency), 1..=256), "PADDOCK_WORKER_CONCURRENCY must be between 1 and 256"),
            (within(count(self.worker_tenant_slots), 1..=256), "PADDOCK_WORKER_TENANT_SLOTS must be between 1 and 256"),
            (within(self.worker_lease, 3..=600), "PADDOCK_WORKER_LEASE must be between 3 and 600 seconds"),
            (
                within(self.power_sync_interval, 10..=86_400),
                "PADDOCK_POWER_SYNC_INTERVAL must be between 10 and 86400 seconds",
            ),
            (
                self.drift_interval == 0 || within(self.drift_interval, 10..=604_800),
                "PADDOCK_DRIFT_INTERVAL must be 0 (never) or between 10 and 604800 seconds",
            ),
            (
                within(self.node_not_ready_grace, 10..=86_400),
                "PADDOCK_NODE_NOT_READY_GRACE must be between 10 and 86400 seconds",
            ),
            (
                within(self.autoscale_interval, 1..=3600),
                "PADDOCK_AUTOSCALE_INTERVAL must be between 1 and 3600 seconds",
            ),
            (
                self.database_statement_timeout <= 3600,
                "PADDOCK_DATABASE_STATEMENT_TIMEOUT must be at most 3600 seconds (0 = no limit)",
            ),
            (within(self.shutdown_grace, 1..=3600), "PADDOCK_SHUTDOWN_GRACE must be between 1 and 3600 seconds"),
            ((0.0..=100.0).contains(&self.sim_latency_scale), "PADDOCK_SIM_LATENCY_SCALE must be between 0 and 100"),
        ] {
            problems.check(ok, || problem.to_owned());
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        settings: Settings,
    }

    const DIGEST: &str = "0fe69a4d69d37826b61d5cf3668142a99abf86c090c214078aa9042b6d24937a";

    /// What `paddock migrate` (which needs the database URL only) says of `args`.
    fn refusal(args: &[&str]) -> Option<String> {
        let database = ["--database-url", "postgres://paddock@db.example/paddock"];
        let args = std::iter::once("paddock").chain(database).chain(args.iter().copied());
        let cli = Cli::try_parse_from(args).expect("arguments");
        cli.settings.validate(Process::Migrate).err().map(|e| e.to_string())
    }

    fn redfish(extra: &[&'static str]) -> Vec<&'static str> {
        let mut args = vec![
            "--bmc-driver",
            "redfish",
            "--wipe-image-url",
            "https://images.example/wipe.iso",
            "--os-image-url",
            "https://images.example/os.iso",
        ];
        args.extend_from_slice(extra);
        args
    }

    /// The variables a refusal names, in its order.
    fn named(args: &[&str]) -> Vec<String> {
        let Some(why) = refusal(args) else { return Vec::new() };
        why.lines()
            .filter_map(|l| l.trim().strip_prefix("- "))
            .map(|l| {
                let l = l.strip_prefix("PADDOCK_BMC_DRIVER=redfish needs ").unwrap_or(l);
                l.split(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
                    .next()
                    .unwrap_or(l)
                    .to_owned()
            })
            .collect()
    }

    #[test]
    fn the_redfish_driver_needs_https_agent_urls_and_both_image_digests_and_says_all_at_once() {
        let all = [
            "PADDOCK_AGENT_BASE_URL",
            "PADDOCK_AGENT_SEED_BASE_URL",
            "PADDOCK_WIPE_IMAGE_SHA256",
            "PADDOCK_OS_IMAGE_SHA256",
        ];
        assert_eq!(named(&redfish(&[])), all, "every missing setting in one refusal");
        let base = ["--agent-base-url", "https://paddock.example"];
        let seed = ["--agent-seed-base-url", "https://seeds.example"];
        let wipe = ["--wipe-image-sha256", DIGEST];
        let os = ["--os-image-sha256", DIGEST];
        assert_eq!(named(&redfish(&[&base[..], &wipe[..]].concat())), [all[1], all[3]]);
        assert_eq!(named(&redfish(&[&base[..], &seed[..], &wipe[..], &os[..]].concat())), Vec::<String>::new());
        let only_driver = ["--bmc-driver", "redfish"];
        let mut expected = all.to_vec();
        expected.extend(["PADDOCK_WIPE_IMAGE_URL", "PADDOCK_OS_IMAGE_URL"]);
        let mut got = named(&only_driver);
        got.sort();
        expected.sort();
        assert_eq!(got, expected);
    }

    #[test]
    fn a_process_names_every_missing_key_and_every_bad_value_at_once() {
        let cli = Cli::try_parse_from(["paddock", "--worker-lease", "1", "--ledger-key", "short"]).expect("arguments");
        let why = cli.settings.validate(Process::Serve).expect_err("refused").to_string();
        for name in [
            "PADDOCK_DATABASE_URL",
            "PADDOCK_ENCRYPTION_KEY",
            "PADDOCK_LEDGER_KEY must be at least 32",
            "no token key",
            "PADDOCK_WORKER_LEASE",
        ] {
            assert!(why.contains(name), "{name} missing from: {why}");
        }
        assert!(why.starts_with("the configuration has 5 problems"), "{why}");
        let cli = Cli::try_parse_from(["paddock"]).expect("arguments");
        let why = cli.settings.validate(Process::Migrate).expect_err("refused").to_string();
        assert!(why.contains("PADDOCK_DATABASE_URL") && !why.contains("PADDOCK_LEDGER_KEY"), "{why}");
    }

    #[test]
    fn plain_http_agent_urls_need_the_insecure_setting() {
        let http = ["--bmc-driver", "simulated", "--agent-base-url", "http://10.0.0.1:8080"];
        let why = refusal(&http).expect("refused");
        assert!(why.contains("PADDOCK_AGENT_BASE_URL") && why.contains("PADDOCK_AGENT_INSECURE_HTTP"), "{why}");
        let why = refusal(&["--bmc-driver", "simulated"]).expect("the default is plain http");
        assert!(why.contains("PADDOCK_AGENT_INSECURE_HTTP"), "{why}");
        assert_eq!(refusal(&[&http[..], &["--agent-insecure-http", "true"]].concat()), None);
        assert_eq!(refusal(&["--bmc-driver", "none"]), None, "no machines, no agents");
        let https = ["paddock", "--database-url=postgres://db.example/p", "--bmc-driver=simulated"];
        let mut settings = Cli::try_parse_from([&https[..], &["--agent-base-url=https://a.example"]].concat())
            .expect("arguments")
            .settings;
        settings.simulated_defaults();
        let verdict = settings.validate(Process::Migrate).map_err(|e| e.to_string());
        assert_eq!(verdict, Ok(()), "the simulated images' default URLs are fetched by nothing");
        let seed = ["--agent-insecure-http", "true", "--agent-seed-base-url", "ftp://x"];
        assert!(refusal(&seed).expect("refused").contains("PADDOCK_AGENT_SEED_BASE_URL"));
        for (flag, name) in [("--wipe-image-url", "PADDOCK_WIPE_IMAGE_URL"), ("--os-image-url", "PADDOCK_OS_IMAGE_URL")]
        {
            for url in ["http://images.example/i.iso", "ftp://images.example/i.iso", "file:///srv/i.iso"] {
                let why = refusal(&["--bmc-driver", "none", flag, url]).expect("refused");
                assert!(why.contains(name), "{url}: {why}");
            }
            assert_eq!(refusal(&["--bmc-driver", "none", flag, "https://images.example/i.iso"]), None);
            let lab = ["--agent-insecure-http", "true", flag, "http://images.example/i.iso"];
            assert_eq!(refusal(&lab), None, "plain http with the opt-in");
        }
        let bad = ["--wipe-image-sha256", "ABC"];
        assert!(refusal(&bad).expect("refused").contains("PADDOCK_WIPE_IMAGE_SHA256"));
    }

    #[test]
    fn the_agent_listener_is_one_of_its_own_and_the_default_agent_url() {
        let none = ["--bmc-driver", "none", "--listen", "127.0.0.1:8080", "--metrics-listen", "127.0.0.1:9090"];
        for taken in ["127.0.0.1:8080", "127.0.0.1:9090"] {
            let why = refusal(&[&none[..], &["--agent-listen", taken]].concat()).expect("refused");
            assert!(why.contains("PADDOCK_AGENT_LISTEN"), "{taken}: {why}");
        }
        let own = [&none[..], &["--agent-listen", "127.0.0.1:8081"]].concat();
        assert_eq!(refusal(&own), None);
        let cli = Cli::try_parse_from(std::iter::once("paddock").chain(own)).expect("arguments");
        assert_eq!(cli.settings.agent().expect("agent settings").base_url, "http://127.0.0.1:8081");
    }

    #[test]
    fn the_namespace_role_is_a_cluster_roles_name() {
        for bad in ["", "a/b", "a b", "50%"] {
            let why = refusal(&["--bmc-driver", "none", "--kube-namespace-role", bad]).expect("refused");
            assert!(why.contains("PADDOCK_KUBE_NAMESPACE_ROLE"), "{bad:?}: {why}");
        }
        assert_eq!(refusal(&["--bmc-driver", "none", "--kube-namespace-role", "paddock-worker-namespace"]), None);
    }

    #[test]
    fn the_identity_id_range_starts_past_the_system_ids() {
        for bad in ["401-2000", "10000", "60000-50000", "1000-3000000000"] {
            let why = refusal(&["--bmc-driver", "none", "--identity-id-range", bad]).expect("refused");
            assert!(why.contains("PADDOCK_IDENTITY_ID_RANGE"), "{bad}: {why}");
        }
        assert_eq!(refusal(&["--bmc-driver", "none", "--identity-id-range", "100000-199999"]), None);
        assert_eq!(refusal(&["--bmc-driver", "none"]), None, "the default range is valid");
    }

    #[test]
    fn the_slurm_image_registry_is_a_registry_without_scheme_or_tag() {
        for bad in ["", "https://registry.example/slurm", "registry.example/slurm/", "paddock.local/slurm:26.05.5"] {
            let why = refusal(&["--bmc-driver", "none", "--slurm-image-registry", bad]).expect("refused");
            assert!(
                why.contains("PADDOCK_SLURM_IMAGE_REGISTRY") && why.contains("not an image registry"),
                "{bad}: {why}"
            );
        }
        for good in ["paddock.local/slurm", "registry.example:5000/mirror/slinky"] {
            assert_eq!(refusal(&["--bmc-driver", "none", "--slurm-image-registry", good]), None, "{good}");
        }
    }
}
