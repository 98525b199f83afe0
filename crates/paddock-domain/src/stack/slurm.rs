//! A stack definition's Slurm catalogue (its `slurm` section): the Slurm releases the stack's
//! operator runs, the images of each (a registry and a pinned tag, never `latest`), the MariaDB
//! image of the accounting, the default release of new clusters, and, per release, the
//! slurmrestd data-parser versions paddock speaks ([`RestApiVersions`]).
//!
//! A deployment may name another registry for every image of the catalogue
//! (`PADDOCK_SLURM_IMAGE_REGISTRY`, [`is_image_registry`] is its rule): a provider mirroring the
//! images, and the tests, which run paddock's own builds under `paddock.local/slurm`.

use std::collections::BTreeSet;
use std::sync::LazyLock;

use regex::Regex;
use serde::{Deserialize, Serialize};

/// A registry (and repository path) of images: `host[:port][/path...]`, without a scheme, a tag, a
/// digest or a trailing `/` (the grammar of an image reference's name, lowercase paths).
static REGISTRY: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"^[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)*(:[0-9]{1,5})?(/[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*)*$",
    )
    .expect("static regex")
});

/// An image tag (the OCI grammar).
static TAG: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$").expect("static regex"));

/// A slurmrestd data-parser version, `v0.0.<n>`.
static REST_VERSION: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^v([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})$").expect("static regex"));

/// Whether `registry` may prefix the catalogue's images (`<registry>/slurmctld:<tag>`): a host,
/// an optional port and optional lowercase path components, at most 200 characters; no scheme,
/// tag, digest or trailing `/`.
pub fn is_image_registry(registry: &str) -> bool {
    registry.len() <= 200 && REGISTRY.is_match(registry)
}

/// The images of a stack's Slurm, by Slurm version: never `latest`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlurmImages {
    /// Free text for the reader.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notes: Option<String>,
    /// Where the Slinky images live: `<registry>/{slurmctld,slurmd,slurmdbd,slurmrestd,login}:<tag>`
    /// (a release may name its own).
    pub registry: String,
    /// The Slurm versions the stack runs, each with its image tag.
    pub releases: Vec<SlurmRelease>,
    /// The release a new cluster on this stack runs when its spec names none (None: the newest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_release: Option<String>,
    /// MariaDB for accounting (`<registry path>/<name>:<tag>`; a deployment's registry replaces
    /// everything before the name).
    pub mariadb_image: String,
}

/// A Slurm release a stack runs: its version and the tag of its images.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlurmRelease {
    /// `spec.version`.
    pub version: String,
    /// The tag of its images.
    pub image_tag: String,
    /// Where its images live when not in the catalogue's `registry`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry: Option<String>,
    /// The slurmrestd data-parser versions it serves and those paddock and the operator speak.
    pub rest_api: RestApiVersions,
}

/// The slurmrestd data-parser versions of a release (`/slurm/<version>/...`): the oldest and
/// newest its slurmrestd serves (Slurm keeps a few parsers), the one paddock's probe and drain
/// speak, and the one the stack's operator speaks (None where the stack's operator cannot run the
/// release).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestApiVersions {
    /// The oldest version its slurmrestd serves.
    pub oldest: String,
    /// The newest version its slurmrestd serves.
    pub newest: String,
    /// The version paddock speaks to it (ping, drain).
    pub paddock: String,
    /// The version the stack's Slurm operator speaks to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator: Option<String>,
}

impl SlurmImages {
    /// The release of Slurm `version`, if the stack runs it.
    pub fn release(&self, version: &str) -> Option<&SlurmRelease> {
        self.releases.iter().find(|r| r.version == version)
    }

    /// The Slurm versions the stack runs.
    pub fn versions(&self) -> Vec<&str> {
        self.releases.iter().map(|r| r.version.as_str()).collect()
    }

    /// The release of new clusters: `default_release`, else the last listed.
    pub fn default_version(&self) -> Option<&str> {
        self.default_release.as_deref().or_else(|| self.releases.last().map(|r| r.version.as_str()))
    }

    /// Where `release`'s images live (its own registry, else the catalogue's).
    pub fn registry_of<'a>(&'a self, release: &'a SlurmRelease) -> &'a str {
        release.registry.as_deref().unwrap_or(&self.registry)
    }

    /// MariaDB's image name and tag (`mariadb:10.11.19`): what follows the image's last `/`.
    pub fn mariadb_name(&self) -> &str {
        self.mariadb_image.rsplit('/').next().unwrap_or(&self.mariadb_image)
    }

    /// Checks registries, tags, versions and REST pins; Err says what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        let mut registries = vec![("registry", self.registry.as_str())];
        let mut versions = BTreeSet::new();
        if self.releases.is_empty() {
            return Err("the slurm section lists no release".to_owned());
        }
        for r in &self.releases {
            if !versions.insert(r.version.as_str()) {
                return Err(format!("Slurm {} appears twice", r.version));
            }
            if !TAG.is_match(&r.image_tag) || r.image_tag == "latest" {
                return Err(format!("Slurm {}: image_tag {:?} is not a pinned tag", r.version, r.image_tag));
            }
            if let Some(registry) = &r.registry {
                registries.push(("a release's registry", registry));
            }
            r.rest_api.validate().map_err(|e| format!("Slurm {}: {e}", r.version))?;
        }
        for (what, registry) in registries {
            if !is_image_registry(registry) {
                return Err(format!("{what} {registry:?} is not an image registry (host[:port][/path])"));
            }
        }
        if let Some(default) = &self.default_release {
            if !versions.contains(default.as_str()) {
                return Err(format!("default_release {default} is not one of the releases"));
            }
        }
        let (path, name) = self.mariadb_image.rsplit_once('/').unwrap_or(("", &self.mariadb_image));
        let tag = name.split_once(':').map(|(_, t)| t);
        if !is_image_registry(path) || tag.is_none_or(|t| !TAG.is_match(t) || t == "latest") {
            return Err(format!("mariadb_image {:?} must be <registry>/<name>:<pinned tag>", self.mariadb_image));
        }
        Ok(())
    }
}

impl SlurmRelease {
    /// The slurmrestd data-parser version paddock speaks to this release.
    pub fn rest_api_version(&self) -> &str {
        &self.rest_api.paddock
    }
}

/// `v0.0.42` as `(0, 0, 42)`.
fn rest_version(v: &str) -> Option<(u16, u16, u16)> {
    let c = REST_VERSION.captures(v)?;
    let part = |i: usize| c.get(i).and_then(|m| m.as_str().parse().ok());
    Some((part(1)?, part(2)?, part(3)?))
}

impl RestApiVersions {
    /// Whether slurmrestd of this release serves `version`.
    pub fn serves(&self, version: &str) -> bool {
        match (rest_version(&self.oldest), rest_version(&self.newest), rest_version(version)) {
            (Some(oldest), Some(newest), Some(v)) => oldest <= v && v <= newest,
            _ => false,
        }
    }

    fn validate(&self) -> Result<(), String> {
        for v in [&self.oldest, &self.newest, &self.paddock].into_iter().chain(&self.operator) {
            if rest_version(v).is_none() {
                return Err(format!("REST version {v:?} is not of the form v0.0.42"));
            }
        }
        if rest_version(&self.oldest) > rest_version(&self.newest) {
            return Err(format!("it serves no REST version: {} is newer than {}", self.oldest, self.newest));
        }
        for (who, v) in [("paddock", Some(&self.paddock)), ("the operator", self.operator.as_ref())] {
            if let Some(v) = v.filter(|v| !self.serves(v)) {
                return Err(format!(
                    "{who} speaks REST {v}, which it does not serve ({}-{})",
                    self.oldest, self.newest
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn release(version: &str, oldest: &str, newest: &str, paddock: &str, operator: Option<&str>) -> SlurmRelease {
        SlurmRelease {
            version: version.to_owned(),
            image_tag: format!("{version}.1"),
            registry: None,
            rest_api: RestApiVersions {
                oldest: oldest.to_owned(),
                newest: newest.to_owned(),
                paddock: paddock.to_owned(),
                operator: operator.map(str::to_owned),
            },
        }
    }

    fn images(releases: Vec<SlurmRelease>) -> SlurmImages {
        SlurmImages {
            notes: None,
            registry: "ghcr.io/slinkyproject".to_owned(),
            releases,
            default_release: None,
            mariadb_image: "docker.io/library/mariadb:10.11.19".to_owned(),
        }
    }

    #[test]
    fn registries_are_a_host_and_a_path_without_scheme_tag_or_digest() {
        for ok in ["paddock.local/slurm", "ghcr.io/slinkyproject", "registry.example:5000/mirror/slinky", "localhost"] {
            assert!(is_image_registry(ok), "{ok}");
        }
        for bad in [
            "",
            "https://ghcr.io/slinkyproject",
            "ghcr.io/slinkyproject/",
            "ghcr.io/Slinky",
            "ghcr.io/slinky:1.0",
            "ghcr.io/slinky@sha256:00",
            "ghcr.io//slinky",
            "ghcr.io/slinky project",
            "-ghcr.io",
        ] {
            assert!(!is_image_registry(bad), "{bad}");
        }
        assert!(!is_image_registry(&format!("r.example/{}", "a".repeat(200))));
    }

    #[test]
    fn every_pinned_rest_version_is_one_its_release_serves() {
        let ok = images(vec![release("26.05", "v0.0.42", "v0.0.45", "v0.0.42", Some("v0.0.44"))]);
        assert_eq!(ok.validate(), Ok(()));
        assert!(ok.releases[0].rest_api.serves("v0.0.45") && !ok.releases[0].rest_api.serves("v0.0.46"));
        assert!(!ok.releases[0].rest_api.serves("v0.0.9") && !ok.releases[0].rest_api.serves("0.0.43"));

        let paddock_too_new = images(vec![release("25.11", "v0.0.42", "v0.0.44", "v0.0.45", None)]);
        let e = paddock_too_new.validate().expect_err("paddock speaks a version 25.11 does not serve");
        assert!(e.contains("Slurm 25.11: paddock speaks REST v0.0.45") && e.contains("v0.0.42-v0.0.44"), "{e}");
        let operator_too_new = images(vec![release("24.11", "v0.0.40", "v0.0.42", "v0.0.42", Some("v0.0.44"))]);
        let e = operator_too_new.validate().expect_err("the operator speaks a version 24.11 does not serve");
        assert!(e.contains("the operator speaks REST v0.0.44"), "{e}");
        let backwards = images(vec![release("25.11", "v0.0.44", "v0.0.42", "v0.0.42", None)]);
        assert!(backwards.validate().expect_err("no range").contains("serves no REST version"));
        let malformed = images(vec![release("25.11", "v0.0.42", "v0.0.44", "0.0.42", None)]);
        assert!(malformed.validate().expect_err("malformed").contains("not of the form"));
    }

    #[test]
    fn tags_registries_defaults_and_mariadb_are_checked() {
        let good = || images(vec![release("25.11", "v0.0.42", "v0.0.44", "v0.0.42", Some("v0.0.44"))]);
        let mut latest = good();
        latest.releases[0].image_tag = "latest".to_owned();
        let mut twice = good();
        twice.releases.push(twice.releases[0].clone());
        let mut bad_registry = good();
        bad_registry.releases[0].registry = Some("https://paddock.local/slurm".to_owned());
        let mut unknown_default = good();
        unknown_default.default_release = Some("26.05".to_owned());
        let mut untagged_mariadb = good();
        untagged_mariadb.mariadb_image = "docker.io/library/mariadb".to_owned();
        let mut latest_mariadb = good();
        latest_mariadb.mariadb_image = "mariadb:latest".to_owned();
        for (bad, says) in [
            (latest, "not a pinned tag"),
            (twice, "appears twice"),
            (bad_registry, "not an image registry"),
            (unknown_default, "default_release 26.05"),
            (untagged_mariadb, "mariadb_image"),
            (latest_mariadb, "mariadb_image"),
            (images(Vec::new()), "no release"),
        ] {
            let e = bad.validate().expect_err(says);
            assert!(e.contains(says), "{says}: {e}");
        }
        let ok = good();
        assert_eq!(ok.mariadb_name(), "mariadb:10.11.19");
        assert_eq!(ok.default_version(), Some("25.11"));
        assert_eq!(ok.registry_of(&ok.releases[0]), "ghcr.io/slinkyproject");
    }
}
