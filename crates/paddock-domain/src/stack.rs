//! The tenant base stack's definition format (docs/architecture.md, cluster reconciler step 4): the project's versioned
//! stack definitions, `stacks/<version>.json` at the repository root, embedded into the binary
//! ([`DEFINITIONS`]). A definition lists its components in apply order; each names its upstream
//! `version`, its manifests (`file` inside the version's directory, upstream `source`, `sha256` of
//! the file, for Helm-only upstreams the `render` command that produced it, for files of a Go
//! module the `go_module` ([`GoModuleFile`]) that holds the same bytes, and for files kept in the
//! shared upstream directory their `upstream` copy ([`UpstreamCopy`])) and its readiness rules
//! ([`ReadinessRule`]); its `slurm` section ([`SlurmImages`]) names the Slurm releases the stack
//! runs and their images.
//!
//! Parsing and validation only, no I/O: reading, verifying and applying the manifests is the
//! stack driver's (`paddock_kube::stack`).

use std::collections::BTreeSet;
use std::path::{Component, Path};
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

mod ray;
mod slurm;

pub use ray::{RayImages, RayRelease};
pub use slurm::{is_image_registry, RestApiVersions, SlurmImages, SlurmRelease};

/// The stack definitions the binary carries, `(version, JSON)`, oldest first.
pub const DEFINITIONS: &[(&str, &str)] = &[
    ("2026.11.0", include_str!("../../../stacks/2026.11.0.json")),
    ("2026.12.0", include_str!("../../../stacks/2026.12.0.json")),
    ("2026.12.1", include_str!("../../../stacks/2026.12.1.json")),
    ("2026.12.2", include_str!("../../../stacks/2026.12.2.json")),
    ("2026.12.3", include_str!("../../../stacks/2026.12.3.json")),
];

/// The version of the newest embedded stack definition: the base stack of new clusters.
pub fn latest_version() -> &'static str {
    // DEFINITIONS is a non-empty constant (a unit test checks it).
    DEFINITIONS.last().map(|(v, _)| *v).unwrap_or_default()
}

/// The embedded definition of `version`, parsed once per process.
pub fn definition(version: &str) -> Result<&'static StackDefinition, DefinitionError> {
    static PARSED: OnceLock<Vec<StackDefinition>> = OnceLock::new();
    let all = PARSED.get_or_init(|| {
        DEFINITIONS
            .iter()
            .map(|(v, _)| {
                StackDefinition::embedded(v)
                    .expect("the embedded stack definitions are valid (a unit test checks each)")
            })
            .collect()
    });
    all.iter().find(|d| d.version == version).ok_or_else(|| unknown_version(version))
}

/// Every embedded definition, oldest first.
pub fn definitions() -> impl Iterator<Item = &'static StackDefinition> {
    DEFINITIONS.iter().filter_map(|(v, _)| definition(v).ok())
}

/// The Slurm versions the embedded stack `version` runs (none for an unknown stack).
pub fn slurm_versions(version: &str) -> Vec<&'static str> {
    definition(version).ok().and_then(|d| d.slurm.as_ref()).map(SlurmImages::versions).unwrap_or_default()
}

/// The Slurm version new clusters on the embedded stack `version` run when their spec names none.
pub fn default_slurm_version(version: &str) -> Option<&'static str> {
    definition(version).ok().and_then(|d| d.slurm.as_ref()).and_then(SlurmImages::default_version)
}

/// The Ray versions the embedded stack `version` runs (none for an unknown stack or one without
/// Ray).
pub fn ray_versions(version: &str) -> Vec<&'static str> {
    definition(version).ok().and_then(|d| d.ray.as_ref()).map(RayImages::versions).unwrap_or_default()
}

/// The Ray version new `ray` clusters on the embedded stack `version` run when their spec names
/// none.
pub fn default_ray_version(version: &str) -> Option<&'static str> {
    definition(version).ok().and_then(|d| d.ray.as_ref()).and_then(RayImages::default_version)
}

fn unknown_version(version: &str) -> DefinitionError {
    let known = DEFINITIONS.iter().map(|(v, _)| *v).collect::<Vec<_>>().join(", ");
    DefinitionError::UnknownVersion { version: version.to_owned(), known }
}

/// A versioned stack definition (`stacks/<version>.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StackDefinition {
    /// The stack version (also the directory of its manifests under the stacks directory).
    pub version: String,
    /// Free text for the reader.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notes: Option<String>,
    /// The components, in apply order.
    pub components: Vec<StackComponent>,
    /// The images the stack's Slurm operator runs (the Slurm driver takes them from here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<SlurmImages>,
    /// The Ray releases `ray` clusters on the stack may run, and their images.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ray: Option<RayImages>,
}

/// One component of a stack (a CNI, a device plugin, ...).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StackComponent {
    /// Its name, unique in the stack.
    pub name: String,
    /// The upstream release it comes from.
    pub version: String,
    /// The namespace of its namespaced objects that name none; paddock creates it first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Free text for the reader.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notes: Option<String>,
    /// The cluster kinds it is applied into (`slurm`, `kubernetes`, `ray`); empty: every kind.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kinds: Vec<String>,
    /// Its manifests, in apply order.
    pub manifests: Vec<StackManifest>,
    /// When it counts as ready (all rules hold; none: once applied).
    #[serde(default)]
    pub ready: Vec<ReadinessRule>,
}

/// One upstream manifest file of a component.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StackManifest {
    /// Its path relative to `<stacks dir>/<stack version>/` (no `..`, not absolute).
    pub file: String,
    /// Where it comes from (a release URL, or the chart for a rendered one).
    pub source: String,
    /// The command that renders it, for upstreams that publish only a Helm chart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub render: Option<String>,
    /// Where the same bytes as `source` can also be had: a file of a Go module version, fetched
    /// through the Go module proxy (`scripts/stacks-fetch` falls back to it). Only where to fetch
    /// from: paddock checks the file against `sha256` whichever way it came.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub go_module: Option<GoModuleFile>,
    /// Where the same bytes are kept in the shared upstream directory (`scripts/stacks-fetch`
    /// tries it first; for a rendered manifest, the tarball its `render` command runs in).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<UpstreamCopy>,
    /// Lowercase hex SHA-256 of the file; None while not pinned (the file is then refused).
    pub sha256: Option<String>,
}

/// A file inside a Go module version. The module zip the Go module proxy serves holds the
/// repository's files at the version's tag byte for byte, and `go mod download` checks the zip
/// against the Go checksum database (sum.golang.org), so the file is the upstream's even where
/// the upstream's own host cannot be reached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GoModuleFile {
    /// The module path, e.g. `github.com/rancher/local-path-provisioner`.
    pub module: String,
    /// The module version (a tag), e.g. `v0.0.30`.
    pub version: String,
    /// The file's path inside the module (no `..`, not absolute).
    pub path: String,
}

/// A file kept, byte for byte, in the shared upstream directory beside the repository
/// (`PADDOCK_UPSTREAM_DIR` of `scripts/stacks-fetch`, default `../shared/upstream`), for machines
/// that cannot reach the upstream's own host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamCopy {
    /// Its path in that directory (no `..`, not absolute).
    pub file: String,
    /// For a tar archive, the member that is the manifest (no `..`, not absolute).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
}

/// A readiness rule of a component.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReadinessRule {
    /// Every CustomResourceDefinition of the component has `Established=True`.
    CrdsEstablished,
    /// Every Deployment, DaemonSet and StatefulSet of the component has observed its generation
    /// and has all its desired replicas updated and available.
    WorkloadsAvailable,
}

impl StackComponent {
    /// Whether it is applied into clusters of `kind` (its `kinds`, empty: every kind).
    pub fn applies_to(&self, kind: &str) -> bool {
        self.kinds.is_empty() || self.kinds.iter().any(|k| k == kind)
    }
}

impl StackDefinition {
    /// The embedded definition of `version`.
    /// (Parses it; [`definition`] keeps the parsed ones.)
    pub fn embedded(version: &str) -> Result<Self, DefinitionError> {
        let Some((_, text)) = DEFINITIONS.iter().find(|(v, _)| *v == version) else {
            return Err(unknown_version(version));
        };
        let definition: Self = serde_json::from_str(text)
            .map_err(|source| DefinitionError::Parse { version: version.to_owned(), source })?;
        if definition.version != version {
            let reason = format!("it says it is version {}", definition.version);
            return Err(DefinitionError::Invalid { version: version.to_owned(), reason });
        }
        definition.validate()?;
        Ok(definition)
    }

    /// Checks names, paths and digests are well-formed.
    pub fn validate(&self) -> Result<(), DefinitionError> {
        let bad = |reason: String| DefinitionError::Invalid { version: self.version.clone(), reason };
        if !is_plain_relative(&self.version) || self.version.contains('/') {
            return Err(bad("the version must be a plain directory name".to_owned()));
        }
        let mut names = BTreeSet::new();
        for c in &self.components {
            if !names.insert(c.name.as_str()) {
                return Err(bad(format!("component {} appears twice", c.name)));
            }
            if c.manifests.is_empty() {
                return Err(bad(format!("component {} has no manifests", c.name)));
            }
            for m in &c.manifests {
                if !is_plain_relative(&m.file) {
                    return Err(bad(format!("file {} must be a relative path without `..`", m.file)));
                }
                let hex_ok = |d: &str| d.len() == 64 && d.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
                if m.sha256.as_deref().is_some_and(|d| !hex_ok(d)) {
                    return Err(bad(format!("the sha256 of {} is not 64 lowercase hex digits", m.file)));
                }
                if let Some(u) = &m.upstream {
                    if !is_plain_relative(&u.file) || u.member.as_deref().is_some_and(|m| !is_plain_relative(m)) {
                        return Err(bad(format!(
                            "the upstream copy of {} must be a relative path without `..`",
                            m.file
                        )));
                    }
                }
                if let Some(g) = &m.go_module {
                    // The fetch script passes these to `go mod download` and joins `path` to the
                    // module's directory: keep them plain.
                    let plain = |s: &str| !s.is_empty() && !s.starts_with('-') && !s.contains(char::is_whitespace);
                    if !plain(&g.module) || !plain(&g.version) || !is_plain_relative(&g.path) {
                        return Err(bad(format!(
                            "the go_module of {} needs a module, a version and a relative path",
                            m.file
                        )));
                    }
                }
            }
        }
        if let Some(slurm) = &self.slurm {
            slurm.validate().map_err(|reason| bad(format!("slurm: {reason}")))?;
        }
        if let Some(ray) = &self.ray {
            ray.validate().map_err(|reason| bad(format!("ray: {reason}")))?;
        }
        for c in &self.components {
            if let Some(k) = c.kinds.iter().find(|k| !matches!(k.as_str(), "slurm" | "kubernetes" | "ray")) {
                return Err(bad(format!("component {} names the unknown cluster kind {k}", c.name)));
            }
        }
        Ok(())
    }
}

/// Whether `path` stays inside the directory it is joined to.
fn is_plain_relative(path: &str) -> bool {
    !path.is_empty() && Path::new(path).components().all(|c| matches!(c, Component::Normal(_)))
}

/// A stack definition that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DefinitionError {
    /// No embedded definition has this version.
    #[error("no stack definition has version {version} (known: {known})")]
    UnknownVersion {
        /// The version asked for.
        version: String,
        /// The embedded versions.
        known: String,
    },
    /// An embedded definition is not valid JSON of the expected shape.
    #[error("stack definition {version} does not parse")]
    Parse {
        /// The version.
        version: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// A definition is malformed.
    #[error("stack definition {version} is invalid: {reason}")]
    Invalid {
        /// The version.
        version: String,
        /// What is wrong.
        reason: String,
    },
}

impl DefinitionError {
    /// The stable snake_case code of this kind of failure.
    pub fn code(&self) -> &'static str {
        match self {
            Self::UnknownVersion { .. } => "stack_version_unknown",
            Self::Parse { .. } | Self::Invalid { .. } => "stack_definition_invalid",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_embedded_definition_parses_and_validates() {
        assert!(!DEFINITIONS.is_empty());
        for (version, _) in DEFINITIONS {
            let d = StackDefinition::embedded(version).expect("embedded definition");
            assert_eq!(d.version, *version);
            assert!(!d.components.is_empty());
            // The Slurm driver takes its images from the stack: every embedded stack has them.
            let slurm = d.slurm.as_ref().expect("a slurm section");
            assert!(!slurm.releases.is_empty() && !slurm.registry.is_empty());
        }
        assert_eq!(StackDefinition::embedded(latest_version()).expect("latest").version, latest_version());
        let e = StackDefinition::embedded("1999.1.0").expect_err("unknown");
        assert_eq!(e.code(), "stack_version_unknown");
    }

    #[test]
    fn the_latest_stack_is_fully_pinned_and_runs_the_slurm_its_operator_supports() {
        let latest = definition(latest_version()).expect("latest");
        for c in &latest.components {
            for m in &c.manifests {
                assert!(m.sha256.is_some(), "{}: {} is not pinned", latest.version, m.file);
            }
        }
        // slurm-operator 1.2.1 supports Slurm 25.11 and newer; the older stacks keep their releases.
        assert_eq!(slurm_versions("2026.12.1"), ["25.11", "26.05"]);
        assert_eq!(slurm_versions("2026.12.0"), ["25.11"]);
        assert_eq!(slurm_versions("2026.11.0"), ["24.11", "25.05", "25.11"]);
        // New clusters run 26.05 (the default of the spec's `slurm.version`); 2026.12.0's stays 25.11.
        assert_eq!(default_slurm_version(latest_version()), Some("26.05"));
        assert_eq!(default_slurm_version(latest_version()), Some(paddock_types::cluster::DEFAULT_SLURM_VERSION));
        assert_eq!(default_slurm_version("2026.12.0"), Some("25.11"));
        assert_eq!(default_slurm_version("1999.1.0"), None);
        assert!(slurm_versions("1999.1.0").is_empty());
        assert_eq!(definition("1999.1.0").expect_err("unknown").code(), "stack_version_unknown");
        assert!(std::ptr::eq(definition(latest_version()).expect("again"), latest), "parsed once");
    }

    #[test]
    fn every_embedded_release_pins_rest_versions_it_serves() {
        for d in definitions() {
            for r in &d.slurm.as_ref().expect("a slurm section").releases {
                let rest = &r.rest_api;
                assert!(rest.serves(r.rest_api_version()), "{} {}: {rest:?}", d.version, r.version);
                assert!(rest.operator.as_ref().is_none_or(|o| rest.serves(o)), "{} {}", d.version, r.version);
            }
        }
        // The operator of the newest stack speaks v0.0.44 to every release it runs; paddock v0.0.42.
        let latest = definition(latest_version()).expect("latest").slurm.as_ref().expect("slurm");
        let pins: Vec<(&str, &str, Option<&str>, &str)> = latest
            .releases
            .iter()
            .map(|r| {
                (r.version.as_str(), r.rest_api_version(), r.rest_api.operator.as_deref(), r.rest_api.newest.as_str())
            })
            .collect();
        assert_eq!(
            pins,
            [("25.11", "v0.0.42", Some("v0.0.44"), "v0.0.44"), ("26.05", "v0.0.42", Some("v0.0.44"), "v0.0.45")]
        );

        // A definition whose pinned version its release does not serve does not load.
        let mut broken = definition(latest_version()).expect("latest").clone();
        let release = &mut broken.slurm.as_mut().expect("slurm").releases[0];
        release.rest_api.paddock = "v0.0.45".to_owned();
        let e = broken.validate().expect_err("25.11 does not serve v0.0.45");
        assert_eq!(e.code(), "stack_definition_invalid");
        assert!(e.to_string().contains("Slurm 25.11: paddock speaks REST v0.0.45"), "{e}");
    }

    #[test]
    fn definitions_with_escaping_paths_or_bad_digests_are_refused() {
        let manifest = |file: &str, sha: Option<&str>| StackManifest {
            file: file.to_owned(),
            source: "https://example.invalid".to_owned(),
            render: None,
            go_module: None,
            upstream: None,
            sha256: sha.map(str::to_owned),
        };
        let def = |m: StackManifest| StackDefinition {
            slurm: None,
            ray: None,
            version: "1.0.0".to_owned(),
            notes: None,
            components: vec![StackComponent {
                name: "c".to_owned(),
                version: "v1".to_owned(),
                namespace: None,
                notes: None,
                kinds: Vec::new(),
                manifests: vec![m],
                ready: vec![],
            }],
        };
        assert!(def(manifest("a/b.yaml", None)).validate().is_ok());
        for bad in ["../x.yaml", "/etc/passwd", "a/../../x", ""] {
            assert!(def(manifest(bad, None)).validate().is_err(), "{bad}");
        }
        assert!(def(manifest("a.yaml", Some("ABC"))).validate().is_err());

        let copy = |file: &str, member: Option<&str>| StackManifest {
            upstream: Some(UpstreamCopy { file: file.to_owned(), member: member.map(str::to_owned) }),
            ..manifest("a.yaml", None)
        };
        assert!(def(copy("x/y.tar.gz", Some("y-1/a.yaml"))).validate().is_ok());
        for (file, member) in [("../y.tar.gz", None), ("/y.yaml", None), ("y.tar.gz", Some("../a")), ("", None)] {
            assert!(def(copy(file, member)).validate().is_err(), "{file} {member:?}");
        }

        let go = |module: &str, version: &str, path: &str| StackManifest {
            go_module: Some(GoModuleFile {
                module: module.to_owned(),
                version: version.to_owned(),
                path: path.to_owned(),
            }),
            ..manifest("a.yaml", None)
        };
        assert!(def(go("github.com/o/r", "v1.0.0", "deploy/a.yaml")).validate().is_ok());
        for (module, version, path) in [
            ("github.com/o/r", "v1.0.0", "../a.yaml"),
            ("github.com/o/r", "v1.0.0", "/a.yaml"),
            ("", "v1.0.0", "a.yaml"),
            ("-modfile=x", "v1.0.0", "a.yaml"),
            ("github.com/o/r", "", "a.yaml"),
            ("github.com/o/r", "v1 x", "a.yaml"),
        ] {
            assert!(def(go(module, version, path)).validate().is_err(), "{module}@{version} {path}");
        }
    }

    #[test]
    fn go_module_sources_parse_strictly_and_name_the_components_release() {
        let text = r#"{"file": "a.yaml", "source": "https://example.invalid/a.yaml", "sha256": null,
                       "go_module": {"module": "github.com/o/r", "version": "v1.0.0", "path": "a.yaml"}}"#;
        let m: StackManifest = serde_json::from_str(text).expect("parses");
        assert_eq!(m.go_module.as_ref().map(|g| g.module.as_str()), Some("github.com/o/r"));
        let extra = text.replace("\"path\": \"a.yaml\"", "\"path\": \"a.yaml\", \"sum\": \"h1:x\"");
        assert_ne!(extra, text);
        assert!(serde_json::from_str::<StackManifest>(&extra).is_err(), "unknown go_module fields are refused");

        // In the embedded definitions, a file from a Go module is of the component's own release
        // and is pinned (its bytes could be had, so there is no reason to leave it unpinned).
        for (version, _) in DEFINITIONS {
            let d = StackDefinition::embedded(version).expect("embedded definition");
            for c in &d.components {
                for m in &c.manifests {
                    let Some(g) = &m.go_module else { continue };
                    assert_eq!(g.version, c.version, "{version}: {}", m.file);
                    assert!(m.sha256.is_some(), "{version}: {} comes from a Go module but is not pinned", m.file);
                }
            }
        }
    }
}
