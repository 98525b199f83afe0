//! The Redfish emulator `scripts/test` starts (sushy-tools, `PADDOCK_TEST_REDFISH_*`), as the
//! worker's tests reach it. Without it these tests skip ([`skip`]: a notice, or a failure under
//! `CI=true`).

use std::collections::HashMap;

use paddock_redfish::{Password, PowerState, RedfishClient, RedfishConfig, RedfishError, Url};
use paddock_testkit::skip;

/// Skips the rest of a test (returns) when `$e` is `None`.
macro_rules! require {
    ($e:expr) => {
        match $e {
            Some(v) => v,
            None => return,
        }
    };
}

/// The main emulator: URL and credentials.
#[derive(Clone)]
pub struct Emulator {
    pub url: String,
    pub user: String,
    pub password: String,
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// The emulator, or `None` (the test is skipped, [`skip`] naming `tests`) when it is not
/// configured.
pub fn emulator(tests: &str) -> Option<Emulator> {
    match var("PADDOCK_TEST_REDFISH_URL") {
        Some(url) => Some(Emulator {
            url,
            user: var("PADDOCK_TEST_REDFISH_USER").unwrap_or_default(),
            password: var("PADDOCK_TEST_REDFISH_PASSWORD").unwrap_or_default(),
        }),
        None => {
            skip::skip(format_args!(
                "{tests}: PADDOCK_TEST_REDFISH_URL is not set: run `scripts/test -p paddock-worker`, which starts \
                 the Redfish emulator"
            ));
            None
        }
    }
}

impl Emulator {
    /// A client configuration for the system `system_id` (by `Id` or `UUID`), or for none.
    pub fn config(&self, system_id: Option<&str>) -> RedfishConfig {
        let mut config = RedfishConfig::new(
            Url::parse(&self.url).expect("url"),
            self.user.clone(),
            Password::new(self.password.clone()),
        );
        config.system_id = system_id.map(str::to_owned);
        config
    }

    /// A client of the system `system` (its `Id` or `UUID`).
    pub fn client(&self, system: &str) -> RedfishClient {
        RedfishClient::new(self.config(Some(system))).expect("client")
    }

    /// The `Id`s of the emulator's systems (asking without a system id lists them).
    pub async fn system_ids(&self) -> Vec<String> {
        match RedfishClient::new(self.config(None)).expect("client").system().await {
            Err(RedfishError::AmbiguousSystem { ids }) => ids,
            other => panic!("the emulator lists several systems: {other:?}"),
        }
    }

    /// The UUID of the system named `name` (`node-NNN`): the client addresses systems by `Id` or
    /// `UUID` only, so the systems are listed and read until the name matches.
    pub async fn uuid_of(&self, name: &str) -> String {
        for id in self.system_ids().await {
            let inv = self.client(&id).system().await.expect("system");
            if inv.name.as_deref() == Some(name) {
                return inv.uuid.expect("the emulator reports UUIDs").as_str().to_owned();
            }
        }
        panic!("the emulator has no system named {name}");
    }
}

/// What the emulator shows of a system: power, boot override target, virtual media.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    pub power: Option<PowerState>,
    pub boot_target: Option<String>,
    /// Device id -> inserted image (`None` = empty).
    pub media: HashMap<String, Option<String>>,
}

impl Seen {
    /// Reads the system through `client`.
    pub async fn read(client: &RedfishClient) -> Seen {
        let inv = client.system().await.expect("system");
        let media = client
            .virtual_media_devices()
            .await
            .expect("virtual media")
            .into_iter()
            .map(|d| {
                let image = d.image.filter(|i| !i.is_empty() && d.inserted != Some(false));
                (d.id, image)
            })
            .collect();
        Seen { power: inv.power_state.and_then(|p| p.settled()), boot_target: inv.boot.and_then(|b| b.target), media }
    }

    pub fn image(&self, device: &str) -> Option<&str> {
        self.media.get(device).and_then(|i| i.as_deref())
    }

    /// The image of the device that is not `Cd` (the seed's).
    pub fn seed(&self) -> Option<&str> {
        self.media.iter().filter(|(d, _)| d.as_str() != "Cd").find_map(|(_, i)| i.as_deref())
    }

    pub fn all_ejected(&self) -> bool {
        self.media.values().all(Option::is_none)
    }
}

/// The emulator after a boot into a run's media: on, `image` in `Cd`, a seed in the other device,
/// booting from `Cd`.
pub fn assert_booted(seen: &Seen, image: &str) {
    assert_eq!(seen.power, Some(PowerState::On), "{seen:?}");
    assert_eq!(seen.image("Cd"), Some(image), "{seen:?}");
    assert!(seen.seed().is_some_and(|s| s.contains("/v1/agent/seed/") && s.ends_with(".iso")), "{seen:?}");
    assert_eq!(seen.boot_target.as_deref(), Some("Cd"), "{seen:?}");
}

/// The emulator after a run ended: `power`, everything ejected, booting from disk.
pub fn assert_finished(seen: &Seen, power: PowerState) {
    assert_eq!(seen.power, Some(power), "{seen:?}");
    assert!(seen.all_ejected(), "{seen:?}");
    assert_eq!(seen.boot_target.as_deref(), Some("Hdd"), "{seen:?}");
}

/// The seed token in a seed URL `<base>/v1/agent/seed/<seed token>.iso`.
pub fn token_of(seed_url: &str) -> String {
    let rest = seed_url.split("/v1/agent/seed/").nth(1).unwrap_or_else(|| panic!("not a seed URL: {seed_url}"));
    rest.strip_suffix(".iso").unwrap_or_else(|| panic!("not a seed URL: {seed_url}")).to_owned()
}
