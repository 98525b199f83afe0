//! Matching the drives found to the drives `config` lists (docs/security.md): by serial where the
//! serial is unique on both sides, else by (protocol, capacity); the basis is recorded.

pub use paddock_types::agent::MatchBasis;
use paddock_types::agent::WipeDrive;

use crate::device::Identity;

/// A drive as `config` lists it: what the BMC reported of it.
pub type ConfigDrive = WipeDrive;

/// For each found drive, the index of its config drive and the basis (or `None` for a drive the
/// BMC did not list); and the indexes of the config drives no found drive matched.
pub fn match_drives(config: &[ConfigDrive], found: &[Identity]) -> (Vec<Option<(usize, MatchBasis)>>, Vec<usize>) {
    let mut by_found: Vec<Option<(usize, MatchBasis)>> = vec![None; found.len()];
    let mut matched = vec![false; config.len()];
    let norm = |s: &Option<String>| s.as_deref().map(str::trim).filter(|s| !s.is_empty()).map(str::to_ascii_lowercase);
    for (ci, drive) in config.iter().enumerate() {
        let Some(serial) = norm(&drive.serial) else { continue };
        let in_config = config.iter().filter(|d| norm(&d.serial).as_deref() == Some(&serial)).count();
        let hits: Vec<usize> =
            (0..found.len()).filter(|&fi| norm(&found[fi].serial).as_deref() == Some(&serial)).collect();
        if let ([fi], 1) = (hits.as_slice(), in_config) {
            by_found[*fi] = Some((ci, MatchBasis::Serial));
            matched[ci] = true;
        }
    }
    let lower = |s: &Option<String>| s.as_deref().map(str::to_ascii_lowercase);
    for (ci, drive) in config.iter().enumerate() {
        let (Some(protocol), Some(capacity)) = (lower(&drive.protocol), drive.capacity_bytes) else { continue };
        if matched[ci] {
            continue;
        }
        let free = (0..found.len()).find(|&fi| {
            by_found[fi].is_none()
                && found[fi].size_bytes == capacity
                && lower(&found[fi].protocol).as_deref() == Some(&protocol)
        });
        if let Some(fi) = free {
            by_found[fi] = Some((ci, MatchBasis::ProtocolCapacity));
            matched[ci] = true;
        }
    }
    let unmatched = (0..config.len()).filter(|&ci| !matched[ci]).collect();
    (by_found, unmatched)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(id: &str, serial: Option<&str>, cap: Option<u64>, proto: Option<&str>) -> ConfigDrive {
        ConfigDrive {
            id: id.into(),
            serial: serial.map(Into::into),
            capacity_bytes: cap,
            protocol: proto.map(Into::into),
        }
    }

    fn found(serial: Option<&str>, size: u64, proto: &str) -> Identity {
        Identity {
            serial: serial.map(Into::into),
            size_bytes: size,
            protocol: Some(proto.into()),
            ..Identity::default()
        }
    }

    #[test]
    fn unique_serials_match_by_serial_and_the_rest_by_protocol_and_capacity() {
        let config = [
            cfg("a", Some("S1"), Some(100), Some("NVMe")),
            cfg("b", None, Some(200), Some("SATA")),
            cfg("c", Some("S9"), Some(300), Some("sas")),
        ];
        let drives = [
            found(Some("x"), 200, "sata"),
            found(Some(" s1 "), 100, "nvme"),
            found(None, 300, "sas"),
            found(None, 400, "virtio"),
        ];
        let (by_found, unmatched) = match_drives(&config, &drives);
        assert_eq!(
            by_found,
            [
                Some((1, MatchBasis::ProtocolCapacity)),
                Some((0, MatchBasis::Serial)),
                Some((2, MatchBasis::ProtocolCapacity)),
                None
            ]
        );
        assert!(unmatched.is_empty());
    }

    #[test]
    fn a_shared_serial_falls_back_to_protocol_and_capacity() {
        let config = [cfg("a", Some("DUP"), Some(100), Some("nvme")), cfg("b", Some("DUP"), Some(100), Some("nvme"))];
        let drives = [found(Some("DUP"), 100, "nvme"), found(Some("DUP"), 100, "nvme")];
        let (by_found, unmatched) = match_drives(&config, &drives);
        assert_eq!(by_found, [Some((0, MatchBasis::ProtocolCapacity)), Some((1, MatchBasis::ProtocolCapacity))]);
        assert!(unmatched.is_empty());
    }

    #[test]
    fn a_listed_drive_that_is_not_found_stays_unmatched() {
        let config = [cfg("a", Some("S1"), Some(100), Some("nvme")), cfg("b", None, None, None)];
        let drives = [found(Some("S2"), 999, "nvme")];
        let (by_found, unmatched) = match_drives(&config, &drives);
        assert_eq!(by_found, [None]);
        assert_eq!(unmatched, [0, 1]);
    }
}
