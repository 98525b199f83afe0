//! A stack definition's Ray catalogue (its `ray` section): the Ray releases `ray` clusters on the
//! stack may run (`ray.version`), each with its images (a registry and pinned tags, never
//! `latest`): the CPU image, and the CUDA image for worker groups whose machines have GPUs.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::slurm::is_image_registry;

/// The images of a stack's Ray, by Ray version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RayImages {
    /// Free text for the reader.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notes: Option<String>,
    /// Where the images live: `<registry>/ray:<tag>`.
    pub registry: String,
    /// The Ray versions the stack runs.
    pub releases: Vec<RayRelease>,
    /// The release a new cluster runs when its spec names none (None: the last listed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_release: Option<String>,
}

/// A Ray release a stack runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RayRelease {
    /// `ray.version`.
    pub version: String,
    /// The tag of its CPU image.
    pub image_tag: String,
    /// The tag of its CUDA image (pools with GPUs).
    pub gpu_image_tag: String,
}

impl RayImages {
    /// The release of Ray `version`, if the stack runs it.
    pub fn release(&self, version: &str) -> Option<&RayRelease> {
        self.releases.iter().find(|r| r.version == version)
    }

    /// The Ray versions the stack runs.
    pub fn versions(&self) -> Vec<&str> {
        self.releases.iter().map(|r| r.version.as_str()).collect()
    }

    /// The release of new clusters: `default_release`, else the last listed.
    pub fn default_version(&self) -> Option<&str> {
        self.default_release.as_deref().or_else(|| self.releases.last().map(|r| r.version.as_str()))
    }

    /// The image of `release`, its CUDA one with `gpus`.
    pub fn image(&self, release: &RayRelease, gpus: bool) -> String {
        let tag = if gpus { &release.gpu_image_tag } else { &release.image_tag };
        format!("{}/ray:{tag}", self.registry)
    }

    /// Checks the registry, tags and versions; Err says what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if !is_image_registry(&self.registry) {
            return Err(format!("registry {:?} is not an image registry", self.registry));
        }
        if self.releases.is_empty() {
            return Err("no release".to_owned());
        }
        let mut seen = BTreeSet::new();
        for r in &self.releases {
            if !seen.insert(r.version.as_str()) {
                return Err(format!("release {} appears twice", r.version));
            }
            let version_ok = r.version.split('.').count() == 3
                && r.version.split('.').all(|p| !p.is_empty() && p.len() <= 4 && p.bytes().all(|b| b.is_ascii_digit()));
            if !version_ok {
                return Err(format!("release {:?} is not a Ray version such as 2.46.0", r.version));
            }
            for tag in [&r.image_tag, &r.gpu_image_tag] {
                let tag_ok = !tag.is_empty()
                    && tag.len() <= 128
                    && tag.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
                    && !tag.starts_with(['.', '-']);
                if !tag_ok || tag == "latest" {
                    return Err(format!("release {}: {tag:?} is not a pinned image tag", r.version));
                }
            }
        }
        if let Some(d) = &self.default_release {
            if self.release(d).is_none() {
                return Err(format!("default_release {d} is not a release"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn images() -> RayImages {
        RayImages {
            notes: None,
            registry: "docker.io/rayproject".to_owned(),
            releases: vec![RayRelease {
                version: "2.46.0".to_owned(),
                image_tag: "2.46.0".to_owned(),
                gpu_image_tag: "2.46.0-gpu".to_owned(),
            }],
            default_release: None,
        }
    }

    #[test]
    fn images_are_pinned_by_tag() {
        let ray = images();
        assert_eq!(ray.validate(), Ok(()));
        let release = ray.release("2.46.0").expect("the release");
        assert_eq!(ray.image(release, false), "docker.io/rayproject/ray:2.46.0");
        assert_eq!(ray.image(release, true), "docker.io/rayproject/ray:2.46.0-gpu");
        let mut latest = images();
        latest.releases[0].image_tag = "latest".to_owned();
        assert!(latest.validate().is_err());
        let mut bad = images();
        bad.releases[0].version = "2.46".to_owned();
        assert!(bad.validate().is_err());
    }
}
