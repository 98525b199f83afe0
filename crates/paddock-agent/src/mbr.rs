//! Reading a partition of an MBR partition table (the node OS image's disk.img: the installer
//! finds where to write the join archive in the table it has just written).

use anyhow::{bail, Context};

/// Bytes of a sector as the MBR counts them.
pub const SECTOR: u64 = 512;
/// Partition type of the join archive: 0xda, non-file-system data.
pub const JOIN_ARCHIVE_TYPE: u8 = 0xda;

/// One primary partition of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Partition {
    /// The partition type byte.
    pub kind: u8,
    /// Byte offset on the disk.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

/// Primary partition `number` (1 to 4) of the MBR in `sector0` (the disk's first 512 bytes).
pub fn partition(sector0: &[u8], number: usize) -> anyhow::Result<Partition> {
    if !(1..=4).contains(&number) {
        bail!("an MBR has primary partitions 1 to 4, not {number}");
    }
    let sector0 = sector0.get(..512).context("an MBR is 512 bytes")?;
    if sector0[510..512] != [0x55, 0xaa] {
        bail!("no MBR (no 0x55aa signature)");
    }
    let entry = &sector0[446 + 16 * (number - 1)..446 + 16 * number];
    let le32 = |at: usize| u32::from_le_bytes([entry[at], entry[at + 1], entry[at + 2], entry[at + 3]]);
    let (kind, start, sectors) = (entry[4], le32(8), le32(12));
    if kind == 0 || sectors == 0 {
        bail!("partition {number} is empty");
    }
    Ok(Partition { kind, offset: u64::from(start) * SECTOR, len: u64::from(sectors) * SECTOR })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The partition entries sfdisk wrote (`xxd -s 446 -l 32`) for `label: dos`,
    /// `start=2048,size=131072,type=c,bootable` and `start=133120,size=2048,type=da` on an 80 MiB
    /// file: the node image's first two partitions.
    fn table() -> Vec<u8> {
        let mut mbr = vec![0u8; 512];
        mbr[446..462].copy_from_slice(&[
            0x80, 0x20, 0x21, 0x00, 0x0c, 0x49, 0x01, 0x08, 0x00, 0x08, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00,
        ]);
        mbr[462..478].copy_from_slice(&[
            0x00, 0x49, 0x02, 0x08, 0xda, 0x69, 0x21, 0x08, 0x00, 0x08, 0x02, 0x00, 0x00, 0x08, 0x00, 0x00,
        ]);
        mbr[510] = 0x55;
        mbr[511] = 0xaa;
        mbr
    }

    #[test]
    fn reads_the_partitions_of_the_node_images_layout() {
        let mbr = table();
        assert_eq!(partition(&mbr, 1).expect("p1"), Partition { kind: 0x0c, offset: 1 << 20, len: 64 << 20 });
        assert_eq!(
            partition(&mbr, 2).expect("p2"),
            Partition { kind: JOIN_ARCHIVE_TYPE, offset: 65 << 20, len: 1 << 20 }
        );
        assert!(format!("{:#}", partition(&mbr, 3).expect_err("p3")).contains("empty"));
        assert!(partition(&mbr, 5).is_err());
    }

    #[test]
    fn no_signature_no_table() {
        let mut mbr = table();
        mbr[511] = 0;
        assert!(format!("{:#}", partition(&mbr, 1).expect_err("unsigned")).contains("0x55aa"));
        assert!(partition(&mbr[..100], 1).is_err());
    }
}
