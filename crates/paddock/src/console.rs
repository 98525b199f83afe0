//! The console's sign-in through the provider's OIDC issuer (`PADDOCK_CONSOLE_OIDC_*`,
//! docs/console.md): the settings' rules and what the API's console routes get of them.

use anyhow::anyhow;
use paddock_api::console::Oidc;

use crate::config::Settings;

/// The path of a discovery document under its issuer (OpenID Connect Discovery 1.0, section 4).
const DISCOVERY_PATH: &str = "/.well-known/openid-configuration";

/// The settings that are set together or not at all.
const TOGETHER: [&str; 3] =
    ["PADDOCK_CONSOLE_OIDC_DISCOVERY_URL", "PADDOCK_CONSOLE_OIDC_CLIENT_ID", "PADDOCK_CONSOLE_OIDC_REDIRECT_URI"];

impl Settings {
    /// The console's OIDC sign-in, if configured; Err names every problem of its settings.
    pub fn console_oidc(&self) -> anyhow::Result<Option<Oidc>> {
        self.console_oidc_checked().map_err(|problems| anyhow!(problems.join("; ")))
    }

    /// The console's OIDC sign-in, if configured, or every problem of its settings, each naming
    /// its variable.
    pub(crate) fn console_oidc_checked(&self) -> Result<Option<Oidc>, Vec<String>> {
        let (discovery, client_id, redirect) =
            match (&self.console_oidc_discovery_url, &self.console_oidc_client_id, &self.console_oidc_redirect_uri) {
                (None, None, None) => return Ok(None),
                (Some(d), Some(c), Some(r)) => (d, c, r),
                (d, c, r) => {
                    let missing: Vec<&str> = TOGETHER
                        .iter()
                        .zip([d.is_none(), c.is_none(), r.is_none()])
                        .filter(|(_, m)| *m)
                        .map(|(n, _)| *n)
                        .collect();
                    return Err(vec![format!(
                        "{} are set together or not at all (sign-in through the OIDC issuer); missing: {}",
                        TOGETHER.join(", "),
                        missing.join(", ")
                    )]);
                }
            };
        let issuer = discovery.as_str().strip_suffix(DISCOVERY_PATH).unwrap_or(discovery.as_str()).to_owned();
        let scopes: Vec<&str> = self.console_oidc_scopes.split_whitespace().collect();
        let problems = self.oidc_problems(discovery, client_id, redirect, &issuer, &scopes);
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(Some(Oidc {
            issuer,
            discovery_url: discovery.to_string(),
            client_id: client_id.clone(),
            redirect_uri: redirect.to_string(),
            scope: scopes.join(" "),
            origin: discovery.origin().ascii_serialization(),
        }))
    }

    /// The problems of a complete OIDC configuration, each naming its variable.
    fn oidc_problems(
        &self,
        discovery: &url::Url,
        client_id: &str,
        redirect: &url::Url,
        issuer: &str,
        scopes: &[&str],
    ) -> Vec<String> {
        let mut problems = Vec::new();
        let mut check = |ok: bool, problem: String| {
            if !ok {
                problems.push(problem);
            }
        };
        let name = TOGETHER[0];
        check(
            secure(discovery),
            format!(
                "{name} must be an https URL (plain http only to a loopback address), not {}://...",
                discovery.scheme()
            ),
        );
        check(
            discovery.path().ends_with(DISCOVERY_PATH) && discovery.query().is_none() && discovery.fragment().is_none(),
            format!("{name} must be the issuer's discovery document, <issuer>{DISCOVERY_PATH} (no query or fragment)"),
        );
        check(
            issuer.trim_end_matches('/') == self.jwt_issuer.trim_end_matches('/'),
            format!(
                "{name} must be the discovery document of PADDOCK_JWT_ISSUER ({}): the console's tokens are the \
                 issuer's, and the API accepts that issuer's only (here {issuer})",
                self.jwt_issuer
            ),
        );
        check(
            !client_id.is_empty() && client_id.len() <= 255 && client_id.chars().all(|c| c.is_ascii_graphic()),
            "PADDOCK_CONSOLE_OIDC_CLIENT_ID must be 1 to 255 printable ASCII characters, no space".to_owned(),
        );
        let name = TOGETHER[2];
        check(
            secure(redirect),
            format!(
                "{name} must be an https URL (plain http only to a loopback address), not {}://...",
                redirect.scheme()
            ),
        );
        check(
            redirect.path().ends_with("/console/") && redirect.query().is_none() && redirect.fragment().is_none(),
            format!("{name} must be the console's URL, ending in /console/ (no query or fragment)"),
        );
        check(
            scopes.contains(&"openid")
                && scopes.iter().all(|s| s.chars().all(|c| c.is_ascii_graphic() && c != '"' && c != '\\')),
            "PADDOCK_CONSOLE_OIDC_SCOPES must be space-separated scopes including `openid` (no quote or backslash)"
                .to_owned(),
        );
        check(
            self.jwt_jwks_url.is_some() || self.jwt_public_keys.is_some(),
            "PADDOCK_JWT_JWKS_URL (or PADDOCK_JWT_PUBLIC_KEYS) is required for the console's sign-in through \
             the OIDC issuer (PADDOCK_CONSOLE_OIDC_*): the API verifies the issuer's tokens with its keys"
                .to_owned(),
        );
        problems
    }
}

/// https, or plain http to this host (as PADDOCK_JWT_JWKS_URL): the browser would send a code or
/// trust a discovery document from nowhere else in the clear.
fn secure(url: &url::Url) -> bool {
    let loopback = match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
        None => false,
    };
    let credentials = url.username().is_empty() && url.password().is_none();
    credentials && (url.scheme() == "https" || (url.scheme() == "http" && loopback))
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

    const ISSUER: &str = "https://id.example/realms/cloud";

    /// The settings of these flags (each given once: a later pair replaces an earlier one).
    fn parse(pairs: &[(&str, &str)]) -> Settings {
        let mut merged: Vec<(&str, &str)> = Vec::new();
        for &(flag, value) in pairs {
            merged.retain(|(f, _)| *f != flag);
            merged.push((flag, value));
        }
        let args = merged.into_iter().flat_map(|(flag, value)| [flag, value]);
        Cli::try_parse_from(std::iter::once("paddock").chain(args)).expect("arguments").settings
    }

    /// The issuer's keys, then `extra`.
    fn settings(extra: &[(&str, &str)]) -> Settings {
        let base = [("--jwt-issuer", ISSUER), ("--jwt-jwks-url", "https://id.example/realms/cloud/certs")];
        parse(&[&base[..], extra].concat())
    }

    /// A valid configuration, then `extra`.
    fn full<'a>(extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
        let args = [
            ("--console-oidc-discovery-url", "https://id.example/realms/cloud/.well-known/openid-configuration"),
            ("--console-oidc-client-id", "paddock-console"),
            ("--console-oidc-redirect-uri", "https://paddock.example/console/"),
        ];
        [&args[..], extra].concat()
    }

    fn problems(extra: &[(&str, &str)]) -> String {
        settings(extra).console_oidc_checked().expect_err("refused").join("\n")
    }

    #[test]
    fn none_set_is_no_oidc_and_all_set_is_the_pages_configuration() {
        assert_eq!(settings(&[]).console_oidc_checked(), Ok(None));
        let oidc = settings(&full(&[("--console-oidc-scopes", "openid  api://paddock/console")]))
            .console_oidc_checked()
            .expect("valid")
            .expect("configured");
        assert_eq!(oidc.issuer, ISSUER);
        assert_eq!(oidc.origin, "https://id.example");
        assert_eq!(oidc.scope, "openid api://paddock/console");
        assert_eq!(oidc.redirect_uri, "https://paddock.example/console/");
        let lab = [
            ("--jwt-issuer", "http://127.0.0.1:9000"),
            ("--console-oidc-discovery-url", "http://127.0.0.1:9000/.well-known/openid-configuration"),
            ("--console-oidc-redirect-uri", "http://localhost:8080/console/"),
        ];
        let oidc = settings(&full(&lab)).console_oidc_checked().expect("loopback http").expect("configured");
        assert_eq!(oidc.origin, "http://127.0.0.1:9000");
    }

    #[test]
    fn the_three_settings_go_together_and_the_refusal_names_the_missing_ones() {
        let why = problems(&[("--console-oidc-client-id", "paddock-console")]);
        assert!(
            why.contains("missing: PADDOCK_CONSOLE_OIDC_DISCOVERY_URL, PADDOCK_CONSOLE_OIDC_REDIRECT_URI"),
            "{why}"
        );
    }

    #[test]
    fn urls_are_https_or_loopback_and_point_where_they_should() {
        for (arg, name) in [
            (
                ("--console-oidc-discovery-url", "http://id.example/realms/cloud/.well-known/openid-configuration"),
                "PADDOCK_CONSOLE_OIDC_DISCOVERY_URL must be an https URL",
            ),
            (
                ("--console-oidc-redirect-uri", "http://paddock.example/console/"),
                "PADDOCK_CONSOLE_OIDC_REDIRECT_URI must be an https URL",
            ),
            (
                ("--console-oidc-redirect-uri", "https://paddock.example/"),
                "PADDOCK_CONSOLE_OIDC_REDIRECT_URI must be the console's URL",
            ),
            (
                ("--console-oidc-redirect-uri", "https://paddock.example/console/?x=1"),
                "PADDOCK_CONSOLE_OIDC_REDIRECT_URI must be the console's URL",
            ),
            (
                ("--console-oidc-discovery-url", "https://id.example/realms/cloud"),
                "discovery document, <issuer>/.well-known",
            ),
            (
                ("--console-oidc-discovery-url", "https://other.example/.well-known/openid-configuration"),
                "of PADDOCK_JWT_ISSUER",
            ),
            (("--console-oidc-client-id", "has space"), "PADDOCK_CONSOLE_OIDC_CLIENT_ID"),
            (("--console-oidc-scopes", "profile email"), "PADDOCK_CONSOLE_OIDC_SCOPES"),
        ] {
            let why = problems(&full(&[arg]));
            assert!(why.contains(name), "{arg:?}: {why}");
        }
    }

    #[test]
    fn the_issuers_tokens_need_its_keys() {
        let settings = parse(&full(&[("--jwt-issuer", ISSUER)]));
        let why = settings.console_oidc_checked().expect_err("refused").join("\n");
        assert!(why.contains("PADDOCK_JWT_JWKS_URL"), "{why}");
    }
}
