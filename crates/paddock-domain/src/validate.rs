//! Validation rules of request bodies. Each check adds to a list of field errors, so one answer
//! names every invalid field at once. The bounds here match the schema attributes in
//! `paddock-types`.

use std::sync::LazyLock;

use paddock_types::machine::{BmcCreate, MachineEnroll};
use paddock_types::machine_class::MachineClassCreate;
use paddock_types::problem::FieldError;
use paddock_types::tenant::TenantCreate;
use paddock_types::Labels;
use regex::Regex;

use crate::Error;

static DNS_LABEL: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(paddock_types::DNS_LABEL_PATTERN).expect("static regex"));
static LABEL_NAME: LazyLock<Regex> =
    LazyLock::new(|| Regex::new("^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$").expect("static regex"));
static DNS_SUBDOMAIN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new("^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$").expect("static regex")
});

/// Whether `c` is a control character that no text field of the API gives a meaning to: every
/// C0 control but tab, line feed and carriage return (NUL among them, which PostgreSQL cannot
/// store), DEL and the C1 controls. Bodies (`json::decode`) and query parameters (the API's
/// `Query` extractor) are refused with it, before any field reaches a service or the database.
pub fn is_forbidden_control(c: char) -> bool {
    c.is_control() && !matches!(c, '\t' | '\n' | '\r')
}

/// The message of a value refused by [`is_forbidden_control`].
pub const CONTROL_MESSAGE: &str = "must not contain control characters (other than tab and line breaks)";

/// Most labels on one object.
pub const MAX_LABELS: usize = 64;

/// Collects field errors.
#[derive(Debug, Default)]
pub struct Checks(Vec<FieldError>);

impl Checks {
    /// No errors yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records an error on `field`.
    pub fn fail(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError { field: field.into(), message: message.into() });
    }

    /// Records an error on `field` unless `ok`.
    pub fn check(&mut self, ok: bool, field: &str, message: impl Into<String>) {
        if !ok {
            self.fail(field, message);
        }
    }

    /// A DNS-1123 label of at most `max` characters.
    pub fn dns_label(&mut self, field: &str, value: &str, max: usize) {
        if value.is_empty() || value.len() > max || !DNS_LABEL.is_match(value) {
            self.fail(
                field,
                format!(
                    "must be a DNS-1123 label of at most {max} characters: lowercase letters, \
                     digits and '-', starting and ending with a letter or digit"
                ),
            );
        }
    }

    /// A string of at most `max` characters.
    pub fn max_len(&mut self, field: &str, value: &str, max: usize) {
        self.check(value.chars().count() <= max, field, format!("must be at most {max} characters"));
    }

    /// A non-empty string of at most `max` characters.
    pub fn text(&mut self, field: &str, value: &str, max: usize) {
        if value.is_empty() {
            self.fail(field, "must not be empty");
        } else {
            self.max_len(field, value, max);
        }
    }

    /// Kubernetes label syntax.
    pub fn labels(&mut self, field: &str, labels: &Labels) {
        if labels.len() > MAX_LABELS {
            self.fail(field, format!("at most {MAX_LABELS} labels"));
        }
        for (key, value) in labels {
            let (prefix, name) = match key.split_once('/') {
                Some((prefix, name)) => (Some(prefix), name),
                None => (None, key.as_str()),
            };
            let prefix_ok = prefix.is_none_or(|p| !p.is_empty() && p.len() <= 253 && DNS_SUBDOMAIN.is_match(p));
            if !prefix_ok || name.is_empty() || name.len() > 63 || !LABEL_NAME.is_match(name) {
                self.fail(format!("{field}.{key}"), "is not a valid label key");
            }
            if value.len() > 63 || !(value.is_empty() || LABEL_NAME.is_match(value)) {
                self.fail(format!("{field}.{key}"), "is not a valid label value (at most 63 characters)");
            }
        }
    }

    /// Ends the checks: `Invalid` with every error, or Ok.
    pub fn finish(self) -> Result<(), Error> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(Error::Invalid(self.0))
        }
    }
}

/// Checks a tenant spec.
pub fn tenant(spec: &TenantCreate) -> Result<(), Error> {
    let mut c = Checks::new();
    c.dns_label("name", &spec.name, 40);
    c.max_len("display_name", &spec.display_name, 200);
    c.labels("labels", &spec.labels);
    for (field, value) in [
        ("quotas.max_clusters", spec.quotas.max_clusters),
        ("quotas.max_nodes", spec.quotas.max_nodes),
        ("quotas.max_gpus", spec.quotas.max_gpus),
    ] {
        c.check(value.is_none_or(|v| v <= 1_000_000), field, "must be at most 1000000");
    }
    c.finish()
}

/// Checks a machine class spec.
pub fn machine_class(spec: &MachineClassCreate) -> Result<(), Error> {
    let mut c = Checks::new();
    c.dns_label("name", &spec.name, 63);
    c.check((1..=65536).contains(&spec.cpu_cores), "cpu_cores", "must be between 1 and 65536");
    c.check((1..=1_048_576).contains(&spec.memory_gib), "memory_gib", "must be between 1 and 1048576");
    c.max_len("gpu_model", &spec.gpu_model, 100);
    c.check(spec.gpu_count <= 64, "gpu_count", "must be between 0 and 64");
    c.check(
        spec.gpu_count == 0 || !spec.gpu_model.is_empty(),
        "gpu_model",
        "must name the GPU model when gpu_count is above 0",
    );
    c.max_len("description", &spec.description, 1000);
    if let Some(price) = &spec.price {
        let upper = |s: &str| s.len() == 3 && s.bytes().all(|b| b.is_ascii_uppercase());
        c.check(upper(&price.currency), "price.currency", "must be an ISO 4217 code such as USD");
        c.check(
            crate::usage::parse_micros(&price.node_hour).is_some(),
            "price.node_hour",
            "must be a non-negative decimal string with at most 15 digits before the point and 6 after",
        );
    }
    if let Some(acceptance) = &spec.acceptance {
        machine_class_acceptance(&mut c, acceptance);
    }
    c.finish()
}

/// The bounds of an acceptance's timeout, in seconds: a minute to three days (a GPU burn-in
/// takes hours).
pub const ACCEPTANCE_TIMEOUT_SECONDS: std::ops::RangeInclusive<u32> = 60..=259_200;

/// Checks a class's acceptance image: an `https` URL (the BMC fetches it; nothing in between may
/// swap it, and its digest is checked besides), a SHA-256 in hex, a timeout within bounds.
fn machine_class_acceptance(c: &mut Checks, acceptance: &paddock_types::machine_class::MachineClassAcceptance) {
    let url = url::Url::parse(&acceptance.image_url).ok();
    let https = url.as_ref().is_some_and(|u| u.scheme() == "https" && u.host_str().is_some_and(|h| !h.is_empty()));
    c.check(
        https && acceptance.image_url.len() <= 2048,
        "acceptance.image_url",
        "must be an https URL of at most 2048 characters",
    );
    c.check(
        crate::agent::is_sha256_hex(&acceptance.image_sha256),
        "acceptance.image_sha256",
        "must be 64 lower-case hex digits",
    );
    let (low, high) = (ACCEPTANCE_TIMEOUT_SECONDS.start(), ACCEPTANCE_TIMEOUT_SECONDS.end());
    c.check(
        ACCEPTANCE_TIMEOUT_SECONDS.contains(&acceptance.timeout_seconds),
        "acceptance.timeout_seconds",
        format!("must be between {low} and {high}"),
    );
}

/// Checks an enrollment.
pub fn machine_enroll(spec: &MachineEnroll) -> Result<(), Error> {
    let mut c = Checks::new();
    c.dns_label("name", &spec.name, 63);
    c.dns_label("machine_class", &spec.machine_class, 63);
    c.labels("labels", &spec.labels);
    bmc(&mut c, &spec.bmc);
    c.finish()
}

/// Checks BMC access given at enrollment.
pub fn bmc(c: &mut Checks, bmc: &BmcCreate) {
    let access = BmcAccess {
        url: &bmc.url,
        system_id: bmc.system_id.as_deref(),
        username: &bmc.username,
        ca_cert: bmc.ca_cert.as_deref(),
        insecure_tls: bmc.insecure_tls,
        allow_insecure_http: bmc.allow_insecure_http,
    };
    bmc_access(c, &access);
    c.text("bmc.password", &bmc.password, 1024);
}

/// BMC access without the password, as enrolled or after a patch.
#[derive(Debug)]
pub struct BmcAccess<'a> {
    /// Service URL.
    pub url: &'a str,
    /// System `Id` or `UUID`.
    pub system_id: Option<&'a str>,
    /// BMC user.
    pub username: &'a str,
    /// PEM CA certificate.
    pub ca_cert: Option<&'a str>,
    /// Skip TLS verification.
    pub insecure_tls: bool,
    /// Allow a plain `http` URL.
    pub allow_insecure_http: bool,
}

/// Checks BMC access without the password (also after a patch).
pub fn bmc_access(c: &mut Checks, a: &BmcAccess<'_>) {
    bmc_url(c, "bmc.url", a.url, a.allow_insecure_http);
    if let Some(system_id) = a.system_id {
        c.text("bmc.system_id", system_id, 256);
    }
    c.text("bmc.username", a.username, 256);
    if let Some(ca) = a.ca_cert {
        c.max_len("bmc.ca_cert", ca, 65536);
        c.check(is_pem_certificates(ca), "bmc.ca_cert", "must be one or more PEM certificates");
    }
    c.check(!(a.insecure_tls && a.ca_cert.is_some()), "bmc.insecure_tls", "cannot be combined with ca_cert");
}

/// Whether `text` is one or more complete PEM `CERTIFICATE` blocks whose bodies decode to DER
/// (an ASN.1 SEQUENCE), with nothing but whitespace around them.
fn is_pem_certificates(text: &str) -> bool {
    use base64::Engine;
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let mut rest = text.trim();
    let mut blocks = 0;
    while !rest.is_empty() {
        let Some(body) = rest.strip_prefix(BEGIN) else { return false };
        let Some((body, after)) = body.split_once(END) else { return false };
        let body: String = body.chars().filter(|c| !c.is_ascii_whitespace()).collect();
        match base64::engine::general_purpose::STANDARD.decode(body) {
            Ok(der) if der.first() == Some(&0x30) && der.len() > 16 => blocks += 1,
            _ => return false,
        }
        rest = after.trim_start();
    }
    blocks > 0
}

/// A BMC URL: `https`, plain `http` only with the explicit opt-in, or `sim://<name>`; never with
/// credentials in it (they would be stored, audited and shown in the clear).
fn bmc_url(c: &mut Checks, field: &str, value: &str, allow_insecure_http: bool) {
    if value.len() > 2048 {
        c.fail(field, "must be at most 2048 characters");
        return;
    }
    let Ok(u) = url::Url::parse(value) else {
        return c.fail(field, "must be an https URL of the BMC (or sim://<name> for the simulated driver)");
    };
    if !u.username().is_empty() || u.password().is_some() {
        return c
            .fail(field, "must not carry credentials (user:password@); give them as bmc.username and bmc.password");
    }
    match u.scheme() {
        "https" if u.host_str().is_some() => {}
        "http" if u.host_str().is_some() && allow_insecure_http => {}
        "http" if u.host_str().is_some() => c.fail(field, "must be https unless bmc.allow_insecure_http is true"),
        "sim" if u.host_str().is_some_and(|h| !h.is_empty()) => {}
        _ => c.fail(field, "must be an https URL of the BMC (or sim://<name> for the simulated driver)"),
    }
}

static CHECK_NAME: LazyLock<Regex> = LazyLock::new(|| Regex::new("^[a-z0-9][a-z0-9._-]*$").expect("static regex"));

/// Most checks in one health report.
pub const MAX_HEALTH_CHECKS: usize = 64;

/// Checks the checks of a health report (or of an acceptance image's report): how many, their
/// names and details.
pub fn health_checks(c: &mut Checks, checks: &[paddock_types::health::HealthCheck]) {
    if checks.len() > MAX_HEALTH_CHECKS {
        c.fail("checks", format!("at most {MAX_HEALTH_CHECKS} checks"));
    }
    for (i, check) in checks.iter().enumerate() {
        let ok = (1..=63).contains(&check.name.len()) && CHECK_NAME.is_match(&check.name);
        c.check(
            ok,
            &format!("checks[{i}].name"),
            "must be 1-63 of a-z, 0-9, '.', '_' and '-', starting with a letter or digit",
        );
        c.max_len(&format!("checks[{i}].detail"), &check.detail, 1000);
    }
}

/// Checks a health report made at `now`: its checks' names and details, and that it was not
/// observed in the future (a minute of clock skew allowed).
pub fn health_report(
    report: &paddock_types::health::HealthReportCreate,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(), Error> {
    let mut c = Checks::new();
    health_checks(&mut c, &report.checks);
    let latest = now + chrono::Duration::minutes(1);
    c.check(report.observed_at.is_none_or(|at| at <= latest), "observed_at", "must not be in the future");
    c.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_labels() {
        for ok in ["a", "a-b", "abc123", "0a"] {
            let mut c = Checks::new();
            c.dns_label("n", ok, 40);
            assert!(c.finish().is_ok(), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", &"a".repeat(41)] {
            let mut c = Checks::new();
            c.dns_label("n", bad, 40);
            assert!(c.finish().is_err(), "{bad}");
        }
    }

    #[test]
    fn ca_certificates_must_be_complete_pem_blocks() {
        use base64::Engine;
        let der = [0x30u8; 64];
        let body = base64::engine::general_purpose::STANDARD.encode(der);
        let pem = format!("-----BEGIN CERTIFICATE-----\n{body}\n-----END CERTIFICATE-----\n");
        assert!(is_pem_certificates(&pem));
        assert!(is_pem_certificates(&format!("{pem}{pem}")));
        assert!(!is_pem_certificates("-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----"));
        assert!(!is_pem_certificates(&format!("-----BEGIN CERTIFICATE-----\n{body}\n")));
        assert!(!is_pem_certificates(&format!("junk {pem}")));
        assert!(!is_pem_certificates(""));
    }

    #[test]
    fn labels_follow_kubernetes_syntax() {
        let mut c = Checks::new();
        c.labels("labels", &[("example.com/team".into(), "a.b_c".into()), ("x".into(), "".into())].into());
        assert!(c.finish().is_ok());
        let mut c = Checks::new();
        c.labels("labels", &[("bad key".into(), "v".into())].into());
        assert!(c.finish().is_err());
    }
}
