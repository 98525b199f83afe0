//! cloud-init NoCloud seed images of paddock (SPEC §5: `seed.iso`, volume label `cidata`).
//!
//! [`nocloud_iso`] writes a small ISO 9660 (ECMA-119) image holding a flat list of files in its root
//! directory; [`seed_iso`] is the NoCloud shape of it (`meta-data`, `user-data`, optionally
//! `network-config`, label `cidata`). Pure Rust, std only, all in memory.
//!
//! Format decisions (the invariants this crate keeps):
//! - Two directory trees over the same file extents, like `genisoimage -joliet`: a Primary Volume
//!   Descriptor whose names are mangled to ISO 9660 level 1 (`meta-data` -> `META_DAT.;1`), and a
//!   Joliet Supplementary Volume Descriptor (UCS-2, escape sequence `%/E`, level 3) with the real
//!   names, which Linux (and so cloud-init) mounts by preference. Joliet names carry no `;1`.
//! - Layout: 16 zero system-area sectors, PVD (16), Joliet SVD (17), terminator (18), the PVD's L
//!   and M path tables (19, 20), the Joliet ones (21, 22), the PVD root directory, the Joliet root
//!   directory, then every file at a sector boundary, in the order given. Each file gets at least
//!   one sector, so an empty file still has an extent of its own. No trailing padding.
//! - Deterministic: the same input gives the same bytes. Every date in the image is the constant
//!   [`SEED_TIMESTAMP`] (2020-01-01T00:00:00Z), so images can be cached and compared by hash.
//! - Limits: at most [`MAX_FILES`] files of at most [`MAX_TOTAL_BYTES`] bytes together; names are
//!   1..=[`MAX_NAME_LEN`] printable ASCII characters without `/` or the characters Joliet forbids.
//!
//! ```
//! let iso = paddock_seed::seed_iso(b"instance-id: m-1\n", b"#cloud-config\n", None)?;
//! assert_eq!(iso.len() % 2048, 0);
//! assert_eq!(&iso[16 * 2048 + 40..16 * 2048 + 46], b"cidata");
//! # Ok::<(), paddock_seed::SeedError>(())
//! ```

use std::collections::BTreeSet;

/// The volume label cloud-init's NoCloud data source looks for.
pub const NOCLOUD_LABEL: &str = "cidata";
/// Largest total size of all files in one image, in bytes (16 MiB).
pub const MAX_TOTAL_BYTES: usize = 16 * 1024 * 1024;
/// Most files one image may hold (they all live in the root directory).
pub const MAX_FILES: usize = 256;
/// Longest file name, in characters (the Joliet limit is 64 UCS-2 characters).
pub const MAX_NAME_LEN: usize = 64;
/// Longest volume label: the Joliet volume identifier holds 16 UCS-2 characters.
pub const MAX_LABEL_LEN: usize = 16;
/// The fixed date of every timestamp in the image, as an RFC 3339 string (for documentation).
pub const SEED_TIMESTAMP: &str = "2020-01-01T00:00:00Z";

/// ISO 9660 logical sector and block size.
const SECTOR: usize = 2048;
/// [`SEED_TIMESTAMP`] as a 17-byte volume descriptor date: digits, then the GMT offset (0).
const VD_DATE: &[u8; 17] = b"2020010100000000\0";
/// [`SEED_TIMESTAMP`] as a 7-byte directory record date: years since 1900, month, day, h, m, s, offset.
const DIR_DATE: [u8; 7] = [120, 1, 1, 0, 0, 0, 0];
/// Characters Joliet forbids in names, besides control characters.
const JOLIET_FORBIDDEN: &[char] = &['*', '/', ':', ';', '?', '\\'];

/// Why a seed image could not be written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SeedError {
    /// A file name breaks the naming rules.
    #[error("seed file name {name:?} is invalid: {reason}")]
    InvalidName {
        /// The offending name.
        name: String,
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// Two files have the same name.
    #[error("seed file name {name:?} is given more than once")]
    DuplicateName {
        /// The repeated name.
        name: String,
    },
    /// The volume label breaks the label rules.
    #[error("seed volume label {label:?} is invalid: {reason}")]
    InvalidLabel {
        /// The offending label.
        label: String,
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// The files together are larger than [`MAX_TOTAL_BYTES`].
    #[error("seed files total {total} bytes, more than the limit of {limit} bytes")]
    TooLarge {
        /// Total size of the files given.
        total: usize,
        /// The limit, [`MAX_TOTAL_BYTES`].
        limit: usize,
    },
    /// More files than [`MAX_FILES`].
    #[error("{count} seed files given, more than the limit of {limit}")]
    TooManyFiles {
        /// Number of files given.
        count: usize,
        /// The limit, [`MAX_FILES`].
        limit: usize,
    },
}

/// Writes a NoCloud seed image: `meta-data`, `user-data` and, when given, `network-config`, label `cidata`.
pub fn seed_iso(meta_data: &[u8], user_data: &[u8], network_config: Option<&[u8]>) -> Result<Vec<u8>, SeedError> {
    let mut files: Vec<(&str, &[u8])> = vec![("meta-data", meta_data), ("user-data", user_data)];
    if let Some(network_config) = network_config {
        files.push(("network-config", network_config));
    }
    nocloud_iso(&files, NOCLOUD_LABEL)
}

/// Writes an ISO 9660 + Joliet image with `files` (name, contents) in its root directory.
///
/// `volume_label` is 1..=16 characters of `[A-Za-z0-9_-]`, written as is (not upper-cased) into
/// both volume descriptors, since cloud-init and `blkid` compare it with `cidata`.
pub fn nocloud_iso(files: &[(&str, &[u8])], volume_label: &str) -> Result<Vec<u8>, SeedError> {
    validate_label(volume_label)?;
    if files.len() > MAX_FILES {
        return Err(SeedError::TooManyFiles { count: files.len(), limit: MAX_FILES });
    }
    let mut seen = BTreeSet::new();
    let mut total = 0usize;
    for (name, data) in files {
        validate_name(name)?;
        if !seen.insert(*name) {
            return Err(SeedError::DuplicateName { name: (*name).to_owned() });
        }
        total = total.saturating_add(data.len());
    }
    if total > MAX_TOTAL_BYTES {
        return Err(SeedError::TooLarge { total, limit: MAX_TOTAL_BYTES });
    }

    // Identifiers of both trees. Mangled primary names are made unique in input order, so the
    // result depends only on the input.
    let mut taken = BTreeSet::new();
    let iso_names: Vec<IsoName> = files.iter().map(|(name, _)| mangle(name, &mut taken)).collect();
    let joliet_names: Vec<Vec<u8>> = files.iter().map(|(name, _)| ucs2(name)).collect();

    // Directory sizes depend only on identifier lengths, so they are known before any extent is.
    let pvd_root_size = dir_size(iso_names.iter().map(|n| n.ident.len()));
    let joliet_root_size = dir_size(joliet_names.iter().map(Vec::len));
    let pvd_root_lba = 23usize;
    let joliet_root_lba = pvd_root_lba + pvd_root_size / SECTOR;
    let mut next_lba = joliet_root_lba + joliet_root_size / SECTOR;
    let mut extents = Vec::with_capacity(files.len());
    for (_, data) in files {
        extents.push(next_lba);
        // Even an empty file gets a sector, so no two records share an extent by accident.
        next_lba += data.len().div_ceil(SECTOR).max(1);
    }
    let total_sectors = next_lba;

    // Records in each tree are sorted by identifier (ECMA-119 9.3, Joliet: by UCS-2 code).
    let mut pvd_order: Vec<usize> = (0..files.len()).collect();
    pvd_order.sort_by(|&a, &b| iso_names[a].sort_key.cmp(&iso_names[b].sort_key));
    let mut joliet_order: Vec<usize> = (0..files.len()).collect();
    joliet_order.sort_by(|&a, &b| joliet_names[a].cmp(&joliet_names[b]));

    let pvd_root = directory(
        pvd_root_lba,
        pvd_root_size,
        pvd_order.iter().map(|&i| (iso_names[i].ident.as_slice(), extents[i], files[i].1.len())),
    );
    let joliet_root = directory(
        joliet_root_lba,
        joliet_root_size,
        joliet_order.iter().map(|&i| (joliet_names[i].as_slice(), extents[i], files[i].1.len())),
    );

    let mut image = vec![0u8; total_sectors * SECTOR];
    let geometry = Geometry { label: volume_label, total_sectors };
    write_sector(
        &mut image,
        16,
        &volume_descriptor(
            &geometry,
            Tree::Primary { pt_l: 19, pt_m: 20, root: pvd_root_lba, root_size: pvd_root_size },
        ),
    );
    write_sector(
        &mut image,
        17,
        &volume_descriptor(
            &geometry,
            Tree::Joliet { pt_l: 21, pt_m: 22, root: joliet_root_lba, root_size: joliet_root_size },
        ),
    );
    write_sector(&mut image, 18, &terminator());
    write_sector(&mut image, 19, &path_table(pvd_root_lba, Endian::Little));
    write_sector(&mut image, 20, &path_table(pvd_root_lba, Endian::Big));
    write_sector(&mut image, 21, &path_table(joliet_root_lba, Endian::Little));
    write_sector(&mut image, 22, &path_table(joliet_root_lba, Endian::Big));
    write_sector(&mut image, pvd_root_lba, &pvd_root);
    write_sector(&mut image, joliet_root_lba, &joliet_root);
    for ((_, data), lba) in files.iter().zip(&extents) {
        write_sector(&mut image, *lba, data);
    }
    Ok(image)
}

fn validate_label(label: &str) -> Result<(), SeedError> {
    let reason = if label.is_empty() {
        Some("it is empty")
    } else if label.len() > MAX_LABEL_LEN {
        Some("it is longer than 16 characters")
    } else if !label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
        Some("only ASCII letters, digits, '_' and '-' are allowed")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(SeedError::InvalidLabel { label: label.to_owned(), reason }),
        None => Ok(()),
    }
}

fn validate_name(name: &str) -> Result<(), SeedError> {
    let reason = if name.is_empty() {
        Some("it is empty")
    } else if !name.is_ascii() {
        Some("it is not ASCII")
    } else if name.len() > MAX_NAME_LEN {
        Some("it is longer than 64 characters")
    } else if name.contains('/') {
        Some("it contains '/'")
    } else if name.bytes().any(|b| b.is_ascii_control()) {
        Some("it contains a control character")
    } else if name.contains(JOLIET_FORBIDDEN) {
        Some("it contains one of * : ; ? \\")
    } else if name == "." || name == ".." {
        Some("'.' and '..' are reserved")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(SeedError::InvalidName { name: name.to_owned(), reason }),
        None => Ok(()),
    }
}

/// A primary-tree identifier (`NAME.EXT;1`) and its ECMA-119 sort key (name, extension, each
/// space-padded, so that `A.;1` sorts before `A.1;1`).
struct IsoName {
    ident: Vec<u8>,
    sort_key: ([u8; 8], [u8; 3]),
}

/// Maps `name` to a unique level-1 identifier: d-characters only, 8.3, upper case.
fn mangle(name: &str, taken: &mut BTreeSet<(Vec<u8>, Vec<u8>)>) -> IsoName {
    let d_chars = |s: &str| -> Vec<u8> {
        s.bytes()
            .map(|b| b.to_ascii_uppercase())
            .map(|b| if b.is_ascii_uppercase() || b.is_ascii_digit() { b } else { b'_' })
            .collect()
    };
    let (base, ext) = match name.rsplit_once('.') {
        Some((base, ext)) => (d_chars(base), d_chars(ext)),
        None => (d_chars(name), Vec::new()),
    };
    let mut base: Vec<u8> = if base.is_empty() { b"_".to_vec() } else { base };
    base.truncate(8);
    let mut ext = ext;
    ext.truncate(3);
    // On a collision, end the base name with a counter until it is unique.
    let mut candidate = base.clone();
    let mut counter = 1usize;
    while taken.contains(&(candidate.clone(), ext.clone())) {
        let suffix = counter.to_string().into_bytes();
        candidate = base[..base.len().min(8 - suffix.len())].to_vec();
        candidate.extend_from_slice(&suffix);
        counter += 1;
    }
    taken.insert((candidate.clone(), ext.clone()));
    let mut sort_key = ([b' '; 8], [b' '; 3]);
    sort_key.0[..candidate.len()].copy_from_slice(&candidate);
    sort_key.1[..ext.len()].copy_from_slice(&ext);
    let mut ident = candidate;
    ident.push(b'.');
    ident.extend_from_slice(&ext);
    ident.extend_from_slice(b";1");
    IsoName { ident, sort_key }
}

/// UCS-2 big-endian, as Joliet stores names; `s` is ASCII, so one code unit per byte.
fn ucs2(s: &str) -> Vec<u8> {
    s.encode_utf16().flat_map(u16::to_be_bytes).collect()
}

/// Length of a directory record with an identifier of `ident_len` bytes (padded to even).
fn record_len(ident_len: usize) -> usize {
    // An even-length identifier is followed by one padding byte, so the record length is even.
    33 + ident_len + 1 - ident_len % 2
}

/// Size in bytes (whole sectors) of a root directory holding records with these identifier lengths.
fn dir_size(ident_lens: impl Iterator<Item = usize>) -> usize {
    // "." and ".." have one-byte identifiers.
    let mut used = 2 * record_len(1);
    for len in ident_lens {
        let len = record_len(len);
        // A record never crosses a sector boundary (ECMA-119 6.8.1.1).
        if used % SECTOR + len > SECTOR {
            used = used.next_multiple_of(SECTOR);
        }
        used += len;
    }
    used.next_multiple_of(SECTOR)
}

/// A root directory extent: ".", "..", then one record per (identifier, extent, size).
fn directory<'a>(lba: usize, size: usize, entries: impl Iterator<Item = (&'a [u8], usize, usize)>) -> Vec<u8> {
    let mut out = Vec::with_capacity(size);
    // The root is its own parent, so "." and ".." are the same record apart from the identifier.
    out.extend_from_slice(&dir_record(&[0], lba, size, true));
    out.extend_from_slice(&dir_record(&[1], lba, size, true));
    for (ident, extent, len) in entries {
        let record = dir_record(ident, extent, len, false);
        if out.len() % SECTOR + record.len() > SECTOR {
            out.resize(out.len().next_multiple_of(SECTOR), 0);
        }
        out.extend_from_slice(&record);
    }
    out.resize(size, 0);
    out
}

/// One directory record (ECMA-119 9.1).
fn dir_record(ident: &[u8], extent: usize, data_len: usize, is_dir: bool) -> Vec<u8> {
    let mut r = vec![0u8; record_len(ident.len())];
    // Lengths are bounded by MAX_NAME_LEN and the image by MAX_TOTAL_BYTES, so these casts never truncate.
    r[0] = r.len() as u8;
    both_u32(&mut r, 2, extent as u32);
    both_u32(&mut r, 10, data_len as u32);
    r[18..25].copy_from_slice(&DIR_DATE);
    r[25] = if is_dir { 0x02 } else { 0x00 };
    both_u16(&mut r, 28, 1);
    r[32] = ident.len() as u8;
    r[33..33 + ident.len()].copy_from_slice(ident);
    r
}

#[derive(Clone, Copy)]
enum Endian {
    Little,
    Big,
}

/// A path table with the root directory only (ECMA-119 9.4): 10 bytes.
fn path_table(root_lba: usize, endian: Endian) -> Vec<u8> {
    let mut t = vec![0u8; 10];
    t[0] = 1; // identifier length; the root's identifier is one 0x00 byte
    let (lba, parent) = match endian {
        Endian::Little => ((root_lba as u32).to_le_bytes(), 1u16.to_le_bytes()),
        Endian::Big => ((root_lba as u32).to_be_bytes(), 1u16.to_be_bytes()),
    };
    t[2..6].copy_from_slice(&lba);
    t[6..8].copy_from_slice(&parent);
    t
}

/// What differs between the primary and the Joliet volume descriptor.
enum Tree {
    Primary { pt_l: u32, pt_m: u32, root: usize, root_size: usize },
    Joliet { pt_l: u32, pt_m: u32, root: usize, root_size: usize },
}

/// What both volume descriptors share.
struct Geometry<'a> {
    label: &'a str,
    total_sectors: usize,
}

/// A Primary (type 1) or Joliet Supplementary (type 2) Volume Descriptor (ECMA-119 8.4, 8.5).
fn volume_descriptor(geometry: &Geometry<'_>, tree: Tree) -> Vec<u8> {
    let (joliet, pt_l, pt_m, root, root_size) = match tree {
        Tree::Primary { pt_l, pt_m, root, root_size } => (false, pt_l, pt_m, root, root_size),
        Tree::Joliet { pt_l, pt_m, root, root_size } => (true, pt_l, pt_m, root, root_size),
    };
    let mut d = vec![0u8; SECTOR];
    d[0] = if joliet { 2 } else { 1 };
    d[1..6].copy_from_slice(b"CD001");
    d[6] = 1;
    text(&mut d, 8, 32, "", joliet); // system identifier
    text(&mut d, 40, 32, geometry.label, joliet); // volume identifier
    both_u32(&mut d, 80, geometry.total_sectors as u32);
    if joliet {
        // UCS-2 level 3 escape sequence.
        d[88..91].copy_from_slice(b"%/E");
    }
    both_u16(&mut d, 120, 1); // volume set size
    both_u16(&mut d, 124, 1); // volume sequence number
    both_u16(&mut d, 128, SECTOR as u16); // logical block size
    both_u32(&mut d, 132, 10); // path table size: the root entry only
    d[140..144].copy_from_slice(&pt_l.to_le_bytes());
    d[148..152].copy_from_slice(&pt_m.to_be_bytes());
    d[156..190].copy_from_slice(&dir_record(&[0], root, root_size, true));
    text(&mut d, 190, 128, "", joliet); // volume set identifier
    text(&mut d, 318, 128, "", joliet); // publisher
    text(&mut d, 446, 128, "", joliet); // data preparer
    text(&mut d, 574, 128, "PADDOCK", joliet); // application
    text(&mut d, 702, 37, "", joliet); // copyright file
    text(&mut d, 739, 37, "", joliet); // abstract file
    text(&mut d, 776, 37, "", joliet); // bibliographic file
    d[813..830].copy_from_slice(VD_DATE); // creation
    d[830..847].copy_from_slice(VD_DATE); // modification
                                          // Expiration and effective dates "not specified": all digits zero, offset zero.
    d[847..863].fill(b'0');
    d[864..880].fill(b'0');
    d[881] = 1; // file structure version
    d
}

/// A space-padded text field: ASCII in the PVD, UCS-2 big-endian in the Joliet SVD (an odd
/// trailing byte stays 0x00, as the field cannot hold half a character).
fn text(d: &mut [u8], offset: usize, len: usize, value: &str, joliet: bool) {
    let field = &mut d[offset..offset + len];
    if joliet {
        let mut units = value.encode_utf16().chain(std::iter::repeat(u16::from(b' ')));
        for pair in field.chunks_exact_mut(2) {
            // The iterator is endless (repeat), so `next` always yields.
            let unit = units.next().unwrap_or(u16::from(b' '));
            pair.copy_from_slice(&unit.to_be_bytes());
        }
    } else {
        field.fill(b' ');
        field[..value.len()].copy_from_slice(value.as_bytes());
    }
}

/// The Volume Descriptor Set Terminator (ECMA-119 8.3).
fn terminator() -> Vec<u8> {
    let mut d = vec![0u8; SECTOR];
    d[0] = 255;
    d[1..6].copy_from_slice(b"CD001");
    d[6] = 1;
    d
}

fn write_sector(image: &mut [u8], lba: usize, bytes: &[u8]) {
    let start = lba * SECTOR;
    image[start..start + bytes.len()].copy_from_slice(bytes);
}

/// A both-byte-order 32-bit field (ECMA-119 7.3.3): little-endian, then big-endian.
fn both_u32(buf: &mut [u8], offset: usize, v: u32) {
    buf[offset..offset + 4].copy_from_slice(&v.to_le_bytes());
    buf[offset + 4..offset + 8].copy_from_slice(&v.to_be_bytes());
}

/// A both-byte-order 16-bit field (ECMA-119 7.2.3).
fn both_u16(buf: &mut [u8], offset: usize, v: u16) {
    buf[offset..offset + 2].copy_from_slice(&v.to_le_bytes());
    buf[offset + 2..offset + 4].copy_from_slice(&v.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mangled_names_are_level_one_and_unique() {
        let mut taken = BTreeSet::new();
        let names: Vec<String> = ["meta-data", "meta_data", "network-config", "a.tar.gz", ".x"]
            .iter()
            .map(|n| String::from_utf8(mangle(n, &mut taken).ident).expect("ascii"))
            .collect();
        assert_eq!(names, ["META_DAT.;1", "META_DA1.;1", "NETWORK_.;1", "A_TAR.GZ;1", "_.X;1"]);
    }

    #[test]
    fn directory_records_never_cross_a_sector_boundary() {
        let lens = vec![128usize; 40];
        let size = dir_size(lens.iter().copied());
        let idents: Vec<Vec<u8>> = (0..40).map(|_| vec![0u8; 128]).collect();
        let dir = directory(23, size, idents.iter().map(|i| (i.as_slice(), 30, 1)));
        assert_eq!(dir.len(), size);
        assert_eq!(size % SECTOR, 0);
        assert!(size > SECTOR, "40 records of 162 bytes need more than one sector");
    }
}
