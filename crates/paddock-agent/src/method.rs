//! Erase methods (the names of docs/security.md) and the pure choice of them from what a device advertises.
//!
//! The capabilities come from the field's own tools: nvme-cli's `id-ctrl`/`id-ns -o json` for NVMe,
//! `hdparm -I` for ATA, sysfs for discard. [`candidates`] orders the methods a device supports,
//! strongest first; the agent tries them in that order and the first one whose verification passes
//! is the one reported. `overwrite-zeroes` ends every list: every writable device supports it.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// One erase method, strongest first in declaration order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Method {
    /// NVMe Sanitize, crypto erase (SANACT 100b).
    NvmeSanitizeCrypto,
    /// NVMe Sanitize, block erase (SANACT 010b).
    NvmeSanitizeBlock,
    /// NVMe Format NVM with Secure Erase Setting 2 (cryptographic erase).
    NvmeFormatCrypto,
    /// NVMe Format NVM with Secure Erase Setting 1 (user data erase).
    NvmeFormatUserData,
    /// ATA SECURITY ERASE UNIT, enhanced mode.
    AtaSecureEraseEnhanced,
    /// ATA SECURITY ERASE UNIT, normal mode.
    AtaSecureErase,
    /// Discard of the whole device, where the device guarantees zeroes after discard.
    DiscardZeroes,
    /// The kernel's zero-out of the whole device (BLKZEROOUT: WRITE ZEROES or written zero pages).
    OverwriteZeroes,
}

impl Method {
    /// Every method, strongest first.
    pub const ALL: [Method; 8] = [
        Method::NvmeSanitizeCrypto,
        Method::NvmeSanitizeBlock,
        Method::NvmeFormatCrypto,
        Method::NvmeFormatUserData,
        Method::AtaSecureEraseEnhanced,
        Method::AtaSecureErase,
        Method::DiscardZeroes,
        Method::OverwriteZeroes,
    ];

    /// The method's name in the agent's report (docs/security.md).
    pub fn name(self) -> &'static str {
        match self {
            Method::NvmeSanitizeCrypto => "nvme-sanitize-crypto",
            Method::NvmeSanitizeBlock => "nvme-sanitize-block",
            Method::NvmeFormatCrypto => "nvme-format-crypto",
            Method::NvmeFormatUserData => "nvme-format-user-data",
            Method::AtaSecureEraseEnhanced => "ata-secure-erase-enhanced",
            Method::AtaSecureErase => "ata-secure-erase",
            Method::DiscardZeroes => "discard-zeroes",
            Method::OverwriteZeroes => "overwrite-zeroes",
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Method {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Method::ALL.into_iter().find(|m| m.name() == s).ok_or_else(|| {
            let names: Vec<_> = Method::ALL.iter().map(|m| m.name()).collect();
            anyhow::anyhow!("unknown method {s:?}; expected auto or one of {}", names.join(", "))
        })
    }
}

/// What an NVMe controller and namespace advertise (NVMe Base Specification, Identify).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NvmeCaps {
    /// Identify Controller OACS: bit 1 is Format NVM.
    pub oacs: u64,
    /// Identify Controller SANICAP: bit 0 crypto erase, bit 1 block erase, bit 2 overwrite.
    pub sanicap: u64,
    /// Identify Controller FNA: bit 2 is crypto erase as part of Format NVM.
    pub fna: u64,
    /// Identify Namespace DLFEAT: bits 2:0 = 001b means deallocated blocks read as zeroes.
    pub dlfeat: u64,
}

/// What `hdparm -I` shows of a SATA drive's security feature set and TRIM.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AtaCaps {
    /// The security feature set is supported.
    pub security_supported: bool,
    /// A user password is set (the agent does not know it, so it cannot erase).
    pub security_enabled: bool,
    /// The drive is locked.
    pub locked: bool,
    /// The drive is frozen (the BIOS froze it; SECURITY commands are refused until a power cycle).
    pub frozen: bool,
    /// Too many wrong passwords: the security count expired.
    pub count_expired: bool,
    /// SECURITY ERASE UNIT in enhanced mode is supported.
    pub enhanced_erase: bool,
    /// "Deterministic read ZEROs after TRIM".
    pub trim_reads_zeroes: bool,
}

/// Everything the choice looks at for one device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// NVMe Identify data, for an NVMe namespace whose controller answered.
    pub nvme: Option<NvmeCaps>,
    /// `hdparm -I` data, for an ATA drive that answered.
    pub ata: Option<AtaCaps>,
    /// The queue accepts discards (sysfs `queue/discard_max_bytes` > 0).
    pub discard: bool,
    /// The kernel says discarded blocks read as zeroes (sysfs `queue/discard_zeroes_data`).
    pub discard_zeroes_data: bool,
}

/// The methods `caps` supports, strongest first; always ends with [`Method::OverwriteZeroes`].
pub fn candidates(caps: &Capabilities) -> Vec<Method> {
    let mut out = Vec::new();
    if let Some(n) = caps.nvme {
        if n.sanicap & 0b001 != 0 {
            out.push(Method::NvmeSanitizeCrypto);
        }
        if n.sanicap & 0b010 != 0 {
            out.push(Method::NvmeSanitizeBlock);
        }
        if n.oacs & 0b10 != 0 {
            if n.fna & 0b100 != 0 {
                out.push(Method::NvmeFormatCrypto);
            }
            out.push(Method::NvmeFormatUserData);
        }
    }
    if let Some(a) = caps.ata {
        let usable = a.security_supported && !a.security_enabled && !a.locked && !a.frozen && !a.count_expired;
        if usable {
            if a.enhanced_erase {
                out.push(Method::AtaSecureEraseEnhanced);
            }
            out.push(Method::AtaSecureErase);
        }
    }
    if caps.discard && discard_guarantees_zeroes(caps) {
        out.push(Method::DiscardZeroes);
    }
    out.push(Method::OverwriteZeroes);
    out
}

/// Whether the device promises zeroes on reads of discarded blocks (not merely "may").
fn discard_guarantees_zeroes(caps: &Capabilities) -> bool {
    caps.discard_zeroes_data
        || caps.nvme.is_some_and(|n| n.dlfeat & 0b111 == 0b001)
        || caps.ata.is_some_and(|a| a.trim_reads_zeroes)
}

/// Reads the fields the choice needs from nvme-cli's `id-ctrl -o json` output.
pub fn parse_nvme_id_ctrl(json: &str) -> anyhow::Result<NvmeCaps> {
    let v: serde_json::Value = serde_json::from_str(json)?;
    let field = |name: &str| -> anyhow::Result<u64> {
        v.get(name)
            .and_then(serde_json::Value::as_u64)
            .ok_or_else(|| anyhow::anyhow!("id-ctrl has no numeric {name:?}"))
    };
    Ok(NvmeCaps { oacs: field("oacs")?, sanicap: field("sanicap")?, fna: field("fna")?, dlfeat: 0 })
}

/// Reads DLFEAT from nvme-cli's `id-ns -o json` output.
pub fn parse_nvme_id_ns_dlfeat(json: &str) -> anyhow::Result<u64> {
    let v: serde_json::Value = serde_json::from_str(json)?;
    v.get("dlfeat")
        .and_then(serde_json::Value::as_u64)
        .ok_or_else(|| anyhow::anyhow!("id-ns has no numeric \"dlfeat\""))
}

/// Reads the security section and the TRIM line of `hdparm -I` output; `None` when the output has
/// no security section (not an ATA drive, or hdparm could not identify it).
pub fn parse_hdparm_identify(text: &str) -> Option<AtaCaps> {
    let section = text.split_once("\nSecurity:")?.1;
    // The section's lines are indented; it ends at the next heading (e.g. "Logical Unit WWN ...").
    let lines: Vec<String> = section
        .lines()
        .skip(1)
        .take_while(|l| l.is_empty() || l.starts_with(char::is_whitespace))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|l| !l.is_empty())
        .collect();
    let has = |s: &str| lines.iter().any(|l| l == s);
    Some(AtaCaps {
        security_supported: has("supported"),
        security_enabled: has("enabled"),
        locked: has("locked"),
        frozen: has("frozen"),
        count_expired: has("expired: security count"),
        enhanced_erase: has("supported: enhanced erase"),
        trim_reads_zeroes: text.contains("Deterministic read ZEROs after TRIM"),
    })
}

#[cfg(test)]
mod tests {
    //! Selection on Identify and `hdparm -I` data written in the tools' own output formats
    //! (testdata/), for the drives QEMU and loop devices cannot stand in for.
    use super::*;
    use Method::*;

    fn nvme(ctrl: &str, ns: &str) -> Capabilities {
        let mut caps = parse_nvme_id_ctrl(ctrl).expect("id-ctrl");
        caps.dlfeat = parse_nvme_id_ns_dlfeat(ns).expect("id-ns");
        Capabilities { nvme: Some(caps), discard: true, ..Capabilities::default() }
    }

    fn ata(text: &str) -> Capabilities {
        Capabilities { ata: parse_hdparm_identify(text), discard: true, ..Capabilities::default() }
    }

    #[test]
    fn a_datacenter_nvme_drive_gets_sanitize_then_format_then_discard() {
        let caps = nvme(
            include_str!("../testdata/nvme-id-ctrl-datacenter.json"),
            include_str!("../testdata/nvme-id-ns-zeroes.json"),
        );
        assert_eq!(
            candidates(&caps),
            [
                NvmeSanitizeCrypto,
                NvmeSanitizeBlock,
                NvmeFormatCrypto,
                NvmeFormatUserData,
                DiscardZeroes,
                OverwriteZeroes
            ]
        );
    }

    #[test]
    fn a_client_nvme_drive_without_sanitize_formats_with_crypto_erase() {
        let caps = nvme(
            include_str!("../testdata/nvme-id-ctrl-client.json"),
            include_str!("../testdata/nvme-id-ns-undefined.json"),
        );
        // DLFEAT 0: what a deallocated block reads is not reported, so no discard-zeroes.
        assert_eq!(candidates(&caps), [NvmeFormatCrypto, NvmeFormatUserData, OverwriteZeroes]);
    }

    #[test]
    fn qemus_nvme_controller_offers_only_a_user_data_format() {
        let caps = nvme(
            include_str!("../testdata/nvme-id-ctrl-qemu.json"),
            include_str!("../testdata/nvme-id-ns-undefined.json"),
        );
        assert_eq!(candidates(&caps), [NvmeFormatUserData, OverwriteZeroes]);
    }

    #[test]
    fn a_ready_sata_ssd_gets_enhanced_then_normal_secure_erase_then_discard() {
        let caps = ata(include_str!("../testdata/hdparm-I-ready.txt"));
        let a = caps.ata.expect("security section");
        assert!(a.security_supported && !a.security_enabled && !a.locked && !a.frozen && !a.count_expired);
        assert_eq!(candidates(&caps), [AtaSecureEraseEnhanced, AtaSecureErase, DiscardZeroes, OverwriteZeroes]);
    }

    #[test]
    fn a_frozen_drive_gets_no_secure_erase() {
        let caps = ata(include_str!("../testdata/hdparm-I-frozen.txt"));
        assert!(caps.ata.expect("security section").frozen);
        assert_eq!(candidates(&caps), [DiscardZeroes, OverwriteZeroes]);
    }

    #[test]
    fn a_locked_drive_with_a_password_gets_no_secure_erase() {
        let caps = ata(include_str!("../testdata/hdparm-I-locked.txt"));
        let a = caps.ata.expect("security section");
        assert!(a.locked && a.security_enabled && !a.enhanced_erase);
        assert_eq!(candidates(&caps), [DiscardZeroes, OverwriteZeroes]);
    }

    #[test]
    fn a_drive_without_enhanced_erase_or_trim_zeroes_gets_normal_secure_erase() {
        let caps = ata(include_str!("../testdata/hdparm-I-normal-only.txt"));
        assert_eq!(candidates(&caps), [AtaSecureErase, OverwriteZeroes]);
    }

    #[test]
    fn a_device_that_says_nothing_is_overwritten() {
        assert_eq!(candidates(&Capabilities::default()), [OverwriteZeroes]);
        assert_eq!(parse_hdparm_identify("\n/dev/sdx:\n SG_IO: bad/missing sense data\n"), None);
        let kernel_says_zeroes = Capabilities { discard: true, discard_zeroes_data: true, ..Capabilities::default() };
        assert_eq!(candidates(&kernel_says_zeroes), [DiscardZeroes, OverwriteZeroes]);
    }

    #[test]
    fn names_round_trip_and_order_is_strongest_first() {
        for m in Method::ALL {
            assert_eq!(m.name().parse::<Method>().expect("name"), m);
            assert_eq!(serde_json::to_value(m).expect("json"), serde_json::json!(m.name()));
        }
        assert!(Method::ALL.windows(2).all(|w| w[0] < w[1]));
        assert!("shred".parse::<Method>().is_err());
    }
}
