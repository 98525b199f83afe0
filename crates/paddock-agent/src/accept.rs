//! The acceptance checks (docs/acceptance.md): what an acceptance run of `paddock-agent run`
//! reports as its `checks`: the drives `config` lists are all found (matched as a wipe matches
//! them: by serial where unique, else by protocol and capacity), and the memory the machine has
//! covers its class's `memory_gib`. A production acceptance image adds its own checks (a GPU
//! burn-in) beside these. Nothing here writes to a disk.

use std::path::Path;

use paddock_types::agent::AcceptanceConfig;
use paddock_types::health::{HealthCheck, HealthStatus};

use crate::device::Identity;
use crate::matching::match_drives;

/// The share of the class's memory the machine must show: firmware, the kernel and memory holes
/// take a little of what is installed.
const MEMORY_SHARE: f64 = 0.95;

/// The checks of an acceptance against `config`: the disks found (their identities) and the
/// memory in bytes as the kernel counts it (`None`: unreadable).
pub fn checks(config: &AcceptanceConfig, found: &[Identity], memory_bytes: Option<u64>) -> Vec<HealthCheck> {
    vec![drives(config, found), memory(config, memory_bytes)]
}

fn check(name: &str, healthy: bool, detail: String) -> HealthCheck {
    let status = if healthy { HealthStatus::Healthy } else { HealthStatus::Failed };
    HealthCheck { name: name.to_owned(), status, detail }
}

fn drives(config: &AcceptanceConfig, found: &[Identity]) -> HealthCheck {
    let (_, unmatched) = match_drives(&config.drives, found);
    if unmatched.is_empty() {
        let detail = format!("{} listed drives found among {} disks", config.drives.len(), found.len());
        return check("drives", true, detail);
    }
    let missing: Vec<&str> = unmatched.iter().map(|i| config.drives[*i].id.as_str()).collect();
    check("drives", false, format!("listed drives not found: {}", missing.join(", ")))
}

fn memory(config: &AcceptanceConfig, bytes: Option<u64>) -> HealthCheck {
    let promised = u64::from(config.memory_gib) << 30;
    let Some(bytes) = bytes else {
        return check("memory", false, "the machine's memory could not be read".to_owned());
    };
    // Memory sizes are far below 2^52 bytes: exact as f64.
    let enough = bytes as f64 >= promised as f64 * MEMORY_SHARE;
    let gib = |b: u64| format!("{:.1}", b as f64 / f64::from(1u32 << 30));
    check("memory", enough, format!("found {} GiB, the class promises {} GiB", gib(bytes), config.memory_gib))
}

/// The machine's memory as the kernel's memory blocks count it (`<sys>/devices/system/memory`:
/// the block size times the online blocks): the installed memory, less holes, unlike `MemTotal`,
/// which leaves out what the kernel reserved.
pub fn memory_bytes(sys: &Path) -> Option<u64> {
    let dir = sys.join("devices/system/memory");
    let size = std::fs::read_to_string(dir.join("block_size_bytes")).ok()?;
    let size = u64::from_str_radix(size.trim(), 16).ok()?;
    let mut online = 0u64;
    for entry in std::fs::read_dir(&dir).ok()?.flatten() {
        let name = entry.file_name();
        let is_block =
            name.to_str().is_some_and(|n| n.strip_prefix("memory").is_some_and(|d| d.parse::<u64>().is_ok()));
        if is_block && std::fs::read_to_string(entry.path().join("online")).is_ok_and(|s| s.trim() == "1") {
            online += 1;
        }
    }
    (online > 0).then(|| online * size)
}

#[cfg(test)]
mod tests {
    use paddock_types::agent::WipeDrive;

    use super::*;

    fn config(memory_gib: u32) -> AcceptanceConfig {
        AcceptanceConfig {
            image_sha256: "a".repeat(64),
            machine_class: "small".into(),
            cpu_cores: 1,
            memory_gib,
            gpu_model: String::new(),
            gpu_count: 0,
            drives: vec![WipeDrive {
                id: "Disk0".into(),
                serial: Some("S1".into()),
                capacity_bytes: Some(1 << 26),
                protocol: Some("nvme".into()),
            }],
        }
    }

    fn disk(serial: &str) -> Identity {
        Identity {
            serial: Some(serial.into()),
            size_bytes: 1 << 26,
            protocol: Some("nvme".into()),
            ..Identity::default()
        }
    }

    #[test]
    fn every_listed_drive_and_the_class_memory_pass() {
        let checks = checks(&config(4), &[disk("S1"), disk("S2")], Some(4 << 30));
        assert!(checks.iter().all(|c| c.status == HealthStatus::Healthy), "{checks:?}");
    }

    #[test]
    fn a_missing_drive_or_too_little_memory_fails_naming_it() {
        // Another serial of another size: neither the serial nor (protocol, capacity) matches.
        let other = Identity { size_bytes: 1 << 30, ..disk("S9") };
        let checks = checks(&config(4), &[other], Some(2 << 30));
        assert_eq!(checks[0].status, HealthStatus::Failed);
        assert!(checks[0].detail.contains("Disk0"), "{checks:?}");
        assert_eq!(checks[1].status, HealthStatus::Failed);
        assert_eq!(checks[1].detail, "found 2.0 GiB, the class promises 4 GiB");
        let unreadable = super::checks(&config(4), &[disk("S1")], None);
        assert_eq!(unreadable[1].status, HealthStatus::Failed);
    }

    #[test]
    fn memory_is_counted_in_online_blocks() {
        let root = std::env::temp_dir().join(format!("paddock-accept-{}", std::process::id()));
        let dir = root.join("devices/system/memory");
        for (block, online) in [("memory0", "1"), ("memory1", "1"), ("memory2", "0")] {
            std::fs::create_dir_all(dir.join(block)).expect("dir");
            std::fs::write(dir.join(block).join("online"), online).expect("online");
        }
        std::fs::write(dir.join("block_size_bytes"), "8000000\n").expect("size");
        assert_eq!(memory_bytes(&root), Some(2 * 0x800_0000));
        std::fs::remove_dir_all(&root).expect("clean up");
    }
}
