//! cloud-init NoCloud seed images of paddock (docs/security.md: `seed.iso`, volume label `cidata`).
//!
//! [`iso_image`] writes a small ISO 9660 (ECMA-119) image holding files in its root directory and in
//! directories one level below it; [`nocloud_iso`] is the flat case; [`seed_iso`] is the NoCloud
//! shape of it (`meta-data`, `user-data`, optionally `network-config`, label `cidata`), and
//! [`agent_seed_iso`] a run's seed: NoCloud plus `paddock/agent.json`, at least [`MIN_SEED_BYTES`]
//! long. Pure Rust, std only, all in memory.
//!
//! Format decisions (the invariants this crate keeps):
//! - Two directory trees over the same file extents, like `genisoimage -joliet`: a Primary Volume
//!   Descriptor whose names are mangled to ISO 9660 level 1 (`meta-data` -> `META_DAT.;1`), and a
//!   Joliet Supplementary Volume Descriptor (UCS-2, escape sequence `%/E`, level 3) with the real
//!   names, which Linux (and so cloud-init) mounts by preference. Joliet names carry no `;1`.
//! - Layout: 16 zero system-area sectors, PVD (16), Joliet SVD (17), terminator (18), the PVD's L
//!   and M path tables (19, 20), the Joliet ones (21, 22), the PVD root directory and its
//!   subdirectories, the Joliet root directory and its subdirectories, then every file at a sector
//!   boundary, in the order given (the root's first). Each file gets at least one sector, so an
//!   empty file still has an extent of its own. Zero sectors at the end only up to a minimum size
//!   the caller asks for (the volume size counts them).
//! - Deterministic: the same input gives the same bytes. Every date in the image is the constant
//!   [`SEED_TIMESTAMP`] (2020-01-01T00:00:00Z), so images can be cached and compared by hash.
//! - Limits: at most [`MAX_FILES`] files of at most [`MAX_TOTAL_BYTES`] bytes together, at most
//!   [`MAX_DIRS`] directories; names (of files and directories) are 1..=[`MAX_NAME_LEN`] printable
//!   ASCII characters without `/` or the characters Joliet forbids.
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
/// Most directories beside the root's files (each one level deep).
pub const MAX_DIRS: usize = 8;
/// The smallest agent seed, in bytes: a 1.44 MB floppy, so a floppy-type virtual media device
/// can carry it.
pub const MIN_SEED_BYTES: usize = 1_474_560;
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

/// Writes a run's agent seed (docs/security.md): `meta-data` and `user-data` for cloud-init's NoCloud
/// data source, and `paddock/agent.json` for the agent, label `cidata`, padded to at least
/// [`MIN_SEED_BYTES`] so that a floppy-type virtual media device can carry it.
pub fn agent_seed_iso(meta_data: &[u8], user_data: &[u8], agent_json: &[u8]) -> Result<Vec<u8>, SeedError> {
    let root: [(&str, &[u8]); 2] = [("meta-data", meta_data), ("user-data", user_data)];
    let agent: [(&str, &[u8]); 1] = [("agent.json", agent_json)];
    iso_image(&root, &[Dir { name: "paddock", files: &agent }], NOCLOUD_LABEL, MIN_SEED_BYTES)
}

/// Writes an ISO 9660 + Joliet image with `files` (name, contents) in its root directory.
///
/// `volume_label` is 1..=16 characters of `[A-Za-z0-9_-]`, written as is (not upper-cased) into
/// both volume descriptors, since cloud-init and `blkid` compare it with `cidata`.
pub fn nocloud_iso(files: &[(&str, &[u8])], volume_label: &str) -> Result<Vec<u8>, SeedError> {
    iso_image(files, &[], volume_label, 0)
}

/// A directory under the root and its files (one level deep: no directories inside).
#[derive(Debug, Clone, Copy)]
pub struct Dir<'a> {
    /// Its name, under the same rules as a file name.
    pub name: &'a str,
    /// Its files (name, contents).
    pub files: &'a [(&'a str, &'a [u8])],
}

/// Writes an ISO 9660 + Joliet image with `files` in its root directory and `dirs` beside them,
/// at least `min_bytes` long (zero sectors at the end; the volume size counts them).
pub fn iso_image(
    files: &[(&str, &[u8])],
    dirs: &[Dir<'_>],
    volume_label: &str,
    min_bytes: usize,
) -> Result<Vec<u8>, SeedError> {
    validate_label(volume_label)?;
    if dirs.len() > MAX_DIRS {
        return Err(SeedError::TooManyFiles { count: dirs.len(), limit: MAX_DIRS });
    }
    let count = files.len() + dirs.iter().map(|d| d.files.len()).sum::<usize>();
    if count > MAX_FILES {
        return Err(SeedError::TooManyFiles { count, limit: MAX_FILES });
    }
    let mut total = 0usize;
    let root_names = files.iter().map(|(n, _)| *n).chain(dirs.iter().map(|d| d.name));
    check_names(root_names)?;
    for (_, data) in files.iter().chain(dirs.iter().flat_map(|d| d.files)) {
        total = total.saturating_add(data.len());
    }
    for dir in dirs {
        check_names(dir.files.iter().map(|(n, _)| *n))?;
    }
    if total > MAX_TOTAL_BYTES {
        return Err(SeedError::TooLarge { total, limit: MAX_TOTAL_BYTES });
    }
    Ok(Layout::new(files, dirs).write(volume_label, min_bytes))
}

/// Names of one directory: each valid, none twice.
fn check_names<'a>(names: impl Iterator<Item = &'a str>) -> Result<(), SeedError> {
    let mut seen = BTreeSet::new();
    for name in names {
        validate_name(name)?;
        if !seen.insert(name) {
            return Err(SeedError::DuplicateName { name: name.to_owned() });
        }
    }
    Ok(())
}

/// A file of the image: its identifier in each tree, its extent and its contents.
struct Placed<'a> {
    iso: IsoName,
    joliet: Vec<u8>,
    lba: usize,
    data: &'a [u8],
}

/// One directory of both trees: identifiers, extents, sizes and its files.
struct PlacedDir<'a> {
    iso: IsoName,
    joliet: Vec<u8>,
    iso_lba: usize,
    iso_size: usize,
    joliet_lba: usize,
    joliet_size: usize,
    files: Vec<Placed<'a>>,
}

/// Where everything goes. Directory sizes depend only on identifier lengths, so they are known
/// before any extent is. Mangled primary names are made unique in input order, so the result
/// depends only on the input.
struct Layout<'a> {
    root: PlacedDir<'a>,
    dirs: Vec<PlacedDir<'a>>,
    total_sectors: usize,
}

impl<'a> Layout<'a> {
    fn new(files: &[(&str, &'a [u8])], dirs: &[Dir<'a>]) -> Self {
        let mut taken = BTreeSet::new();
        let mut root = PlacedDir::unplaced(IsoName::root(), vec![0], files, &mut taken);
        let mut placed: Vec<PlacedDir<'a>> = dirs
            .iter()
            .map(|d| {
                let iso = mangle_dir(d.name, &mut taken);
                PlacedDir::unplaced(iso, ucs2(d.name), d.files, &mut BTreeSet::new())
            })
            .collect();
        // Sized in the order the records are written (sorted by identifier), since where a
        // record would cross a sector boundary depends on the order.
        let iso = |f: &Placed<'_>| (f.iso.sort_key(), f.iso.ident.len());
        let joliet = |f: &Placed<'_>| (f.joliet.clone(), f.joliet.len());
        let sub_iso = placed.iter().map(|d| (d.sort_key(false), d.iso.ident.len()));
        root.iso_size = sorted_size(root.files.iter().map(iso).chain(sub_iso));
        let sub_joliet = placed.iter().map(|d| (d.sort_key(true), d.joliet.len()));
        root.joliet_size = sorted_size(root.files.iter().map(joliet).chain(sub_joliet));
        for d in &mut placed {
            d.iso_size = sorted_size(d.files.iter().map(iso));
            d.joliet_size = sorted_size(d.files.iter().map(joliet));
        }
        // The path tables (19..=22), then the primary directories, then the Joliet ones, then
        // every file at a sector boundary, in the order given.
        let mut next = 23usize;
        root.iso_lba = next;
        next += root.iso_size / SECTOR;
        for d in &mut placed {
            d.iso_lba = next;
            next += d.iso_size / SECTOR;
        }
        root.joliet_lba = next;
        next += root.joliet_size / SECTOR;
        for d in &mut placed {
            d.joliet_lba = next;
            next += d.joliet_size / SECTOR;
        }
        for f in root.files.iter_mut().chain(placed.iter_mut().flat_map(|d| d.files.iter_mut())) {
            f.lba = next;
            // Even an empty file gets a sector, so no two records share an extent by accident.
            next += f.data.len().div_ceil(SECTOR).max(1);
        }
        Layout { root, dirs: placed, total_sectors: next }
    }

    fn write(&self, label: &str, min_bytes: usize) -> Vec<u8> {
        let total_sectors = self.total_sectors.max(min_bytes.div_ceil(SECTOR));
        let mut image = vec![0u8; total_sectors * SECTOR];
        let geometry = Geometry { label, total_sectors };
        for (joliet, vd_lba, pt_l, pt_m) in [(false, 16, 19, 20), (true, 17, 21, 22)] {
            let table = self.path_table(joliet);
            let (root, root_size) = self.root.extent(joliet);
            let tree = Tree { joliet, pt_l, pt_m, pt_size: table.little.len(), root, root_size };
            write_sector(&mut image, vd_lba, &volume_descriptor(&geometry, tree));
            write_sector(&mut image, pt_l as usize, &table.little);
            write_sector(&mut image, pt_m as usize, &table.big);
            write_sector(&mut image, root, &self.root_directory(joliet));
            for d in &self.dirs {
                let (lba, size) = d.extent(joliet);
                let records = d.file_records(joliet);
                write_sector(&mut image, lba, &directory(lba, size, (root, root_size), records));
            }
        }
        write_sector(&mut image, 18, &terminator());
        for f in self.root.files.iter().chain(self.dirs.iter().flat_map(|d| &d.files)) {
            write_sector(&mut image, f.lba, f.data);
        }
        image
    }

    /// The root directory of a tree: its files and its directories, sorted by identifier
    /// (ECMA-119 9.3; Joliet: by UCS-2 code).
    fn root_directory(&self, joliet: bool) -> Vec<u8> {
        let mut records = self.root.file_records(joliet);
        for d in &self.dirs {
            let (lba, size) = d.extent(joliet);
            let ident = if joliet { d.joliet.clone() } else { d.iso.ident.clone() };
            records.push(Record { key: d.sort_key(joliet), ident, extent: lba, len: size, is_dir: true });
        }
        records.sort_by(|a, b| a.key.cmp(&b.key));
        let (lba, size) = self.root.extent(joliet);
        directory(lba, size, (lba, size), records)
    }

    /// The path table of a tree (ECMA-119 9.4): the root, then its directories by identifier.
    fn path_table(&self, joliet: bool) -> PathTable {
        let mut dirs: Vec<&PlacedDir<'_>> = self.dirs.iter().collect();
        dirs.sort_by_key(|d| d.sort_key(joliet));
        let (root, _) = self.root.extent(joliet);
        let mut entries = vec![(vec![0u8], root)];
        entries.extend(dirs.iter().map(|d| {
            let ident = if joliet { d.joliet.clone() } else { d.iso.ident.clone() };
            (ident, d.extent(joliet).0)
        }));
        PathTable::of(&entries)
    }
}

impl<'a> PlacedDir<'a> {
    fn unplaced(
        iso: IsoName,
        joliet: Vec<u8>,
        files: &[(&str, &'a [u8])],
        taken: &mut BTreeSet<(Vec<u8>, Vec<u8>)>,
    ) -> Self {
        let files = files
            .iter()
            .map(|(name, data)| Placed { iso: mangle(name, taken), joliet: ucs2(name), lba: 0, data })
            .collect();
        PlacedDir { iso, joliet, iso_lba: 0, iso_size: 0, joliet_lba: 0, joliet_size: 0, files }
    }

    fn extent(&self, joliet: bool) -> (usize, usize) {
        if joliet {
            (self.joliet_lba, self.joliet_size)
        } else {
            (self.iso_lba, self.iso_size)
        }
    }

    fn sort_key(&self, joliet: bool) -> Vec<u8> {
        if joliet {
            self.joliet.clone()
        } else {
            self.iso.sort_key()
        }
    }

    /// The records of this directory's files, sorted by identifier.
    fn file_records(&self, joliet: bool) -> Vec<Record> {
        let mut records: Vec<Record> = self
            .files
            .iter()
            .map(|f| {
                let (key, ident) =
                    if joliet { (f.joliet.clone(), f.joliet.clone()) } else { (f.iso.sort_key(), f.iso.ident.clone()) };
                Record { key, ident, extent: f.lba, len: f.data.len(), is_dir: false }
            })
            .collect();
        records.sort_by(|a, b| a.key.cmp(&b.key));
        records
    }
}

/// A directory record to write, with the key it sorts by.
struct Record {
    key: Vec<u8>,
    ident: Vec<u8>,
    extent: usize,
    len: usize,
    is_dir: bool,
}

/// Both byte orders of one path table.
struct PathTable {
    little: Vec<u8>,
    big: Vec<u8>,
}

impl PathTable {
    /// Entries (identifier, extent): the root first (directory number 1), every other entry
    /// a child of the root.
    fn of(entries: &[(Vec<u8>, usize)]) -> Self {
        let mut little = Vec::new();
        let mut big = Vec::new();
        for (ident, lba) in entries {
            // Identifiers are at most 128 bytes and extents fit the image: the casts never truncate.
            let head = [ident.len() as u8, 0];
            little.extend_from_slice(&head);
            big.extend_from_slice(&head);
            little.extend_from_slice(&(*lba as u32).to_le_bytes());
            big.extend_from_slice(&(*lba as u32).to_be_bytes());
            little.extend_from_slice(&1u16.to_le_bytes());
            big.extend_from_slice(&1u16.to_be_bytes());
            for t in [&mut little, &mut big] {
                t.extend_from_slice(ident);
                if ident.len() % 2 == 1 {
                    t.push(0);
                }
            }
        }
        PathTable { little, big }
    }
}

/// Reads the file at `path` (`dir/name`, real names) back from an image this crate wrote,
/// through its Joliet tree; `None` when there is no such file or the image is not one. For the
/// simulated agents, which read their seed as a booted machine would; tests check images with
/// independent readers instead.
pub fn read_file(image: &[u8], path: &str) -> Option<Vec<u8>> {
    let sector = |lba: usize| image.get(lba * SECTOR..(lba + 1) * SECTOR);
    let joliet = (16..32).map_while(sector).take_while(|d| d[0] != 255).find(|d| d[0] == 2 && &d[88..91] == b"%/E")?;
    let mut record = joliet[156..190].to_vec();
    for part in path.split('/') {
        let (lba, len) = (u32_le(&record, 2)?, u32_le(&record, 10)?);
        let dir = image.get(lba * SECTOR..lba * SECTOR + len)?;
        record = records(dir).find(|r| r.get(33..33 + usize::from(r[32])) == Some(ucs2(part).as_slice()))?.to_vec();
    }
    let (lba, len) = (u32_le(&record, 2)?, u32_le(&record, 10)?);
    (record[25] & 0x02 == 0).then(|| image.get(lba * SECTOR..lba * SECTOR + len).map(<[u8]>::to_vec))?
}

/// The directory records of a directory extent (a zero length byte skips to the next sector).
fn records(dir: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut at = 0usize;
    std::iter::from_fn(move || loop {
        let len = usize::from(*dir.get(at)?);
        if len == 0 {
            at = (at / SECTOR + 1) * SECTOR;
            continue;
        }
        let record = dir.get(at..at + len)?;
        at += len;
        return Some(record);
    })
}

fn u32_le(record: &[u8], offset: usize) -> Option<usize> {
    let bytes: [u8; 4] = record.get(offset..offset + 4)?.try_into().ok()?;
    usize::try_from(u32::from_le_bytes(bytes)).ok()
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

/// A primary-tree identifier (`NAME.EXT;1`, or `NAME` for a directory) and its ECMA-119 sort
/// key (name, extension, each space-padded, so that `A.;1` sorts before `A.1;1`).
struct IsoName {
    ident: Vec<u8>,
    key: ([u8; 8], [u8; 3]),
}

impl IsoName {
    /// The root directory's (its identifier is the byte 0x00 where it appears).
    fn root() -> Self {
        IsoName { ident: vec![0], key: ([0; 8], [0; 3]) }
    }

    fn sort_key(&self) -> Vec<u8> {
        self.key.0.iter().chain(&self.key.1).copied().collect()
    }
}

/// Maps `name` to d-characters, upper case.
fn d_chars(s: &str) -> Vec<u8> {
    s.bytes()
        .map(|b| b.to_ascii_uppercase())
        .map(|b| if b.is_ascii_uppercase() || b.is_ascii_digit() { b } else { b'_' })
        .collect()
}

/// Maps `name` to a unique level-1 identifier: d-characters only, 8.3, upper case.
fn mangle(name: &str, taken: &mut BTreeSet<(Vec<u8>, Vec<u8>)>) -> IsoName {
    let (base, ext) = match name.rsplit_once('.') {
        Some((base, ext)) => (d_chars(base), d_chars(ext)),
        None => (d_chars(name), Vec::new()),
    };
    let mut ext = ext;
    ext.truncate(3);
    let candidate = unique(base, &ext, taken);
    let mut key = ([b' '; 8], [b' '; 3]);
    key.0[..candidate.len()].copy_from_slice(&candidate);
    key.1[..ext.len()].copy_from_slice(&ext);
    let mut ident = candidate;
    ident.push(b'.');
    ident.extend_from_slice(&ext);
    ident.extend_from_slice(b";1");
    IsoName { ident, key }
}

/// Maps a directory's `name` to a unique level-1 directory identifier: at most 8 d-characters.
fn mangle_dir(name: &str, taken: &mut BTreeSet<(Vec<u8>, Vec<u8>)>) -> IsoName {
    // A directory has no extension; `/` keeps it apart from a file of the same base name.
    let candidate = unique(d_chars(name), b"/", taken);
    let mut key = ([b' '; 8], [b' '; 3]);
    key.0[..candidate.len()].copy_from_slice(&candidate);
    IsoName { ident: candidate, key }
}

/// `base` cut to 8 characters, ending with a counter until (base, ext) is not taken; takes it.
fn unique(base: Vec<u8>, ext: &[u8], taken: &mut BTreeSet<(Vec<u8>, Vec<u8>)>) -> Vec<u8> {
    let mut base: Vec<u8> = if base.is_empty() { b"_".to_vec() } else { base };
    base.truncate(8);
    let mut candidate = base.clone();
    let mut counter = 1usize;
    while taken.contains(&(candidate.clone(), ext.to_vec())) {
        let suffix = counter.to_string().into_bytes();
        candidate = base[..base.len().min(8 - suffix.len())].to_vec();
        candidate.extend_from_slice(&suffix);
        counter += 1;
    }
    taken.insert((candidate.clone(), ext.to_vec()));
    candidate
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

/// [`dir_size`] of records (sort key, identifier length) in sort-key order.
fn sorted_size(records: impl Iterator<Item = (Vec<u8>, usize)>) -> usize {
    let mut records: Vec<(Vec<u8>, usize)> = records.collect();
    records.sort_by(|a, b| a.0.cmp(&b.0));
    dir_size(records.into_iter().map(|(_, len)| len))
}

/// Size in bytes (whole sectors) of a directory holding records with these identifier lengths.
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

/// A directory extent: "." (itself), ".." (`parent`, the root's own extent for the root), then
/// `records` in the order given.
fn directory(lba: usize, size: usize, parent: (usize, usize), records: Vec<Record>) -> Vec<u8> {
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&dir_record(&[0], lba, size, true));
    out.extend_from_slice(&dir_record(&[1], parent.0, parent.1, true));
    for r in records {
        let record = dir_record(&r.ident, r.extent, r.len, r.is_dir);
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

/// What differs between the primary and the Joliet volume descriptor.
struct Tree {
    joliet: bool,
    pt_l: u32,
    pt_m: u32,
    pt_size: usize,
    root: usize,
    root_size: usize,
}

/// What both volume descriptors share.
struct Geometry<'a> {
    label: &'a str,
    total_sectors: usize,
}

/// A Primary (type 1) or Joliet Supplementary (type 2) Volume Descriptor (ECMA-119 8.4, 8.5).
fn volume_descriptor(geometry: &Geometry<'_>, tree: Tree) -> Vec<u8> {
    let Tree { joliet, pt_l, pt_m, pt_size, root, root_size } = tree;
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
    both_u32(&mut d, 132, pt_size as u32); // path table size
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
        let records = idents
            .iter()
            .map(|i| Record { key: i.clone(), ident: i.clone(), extent: 30, len: 1, is_dir: false })
            .collect();
        let dir = directory(23, size, (23, size), records);
        assert_eq!(dir.len(), size);
        assert_eq!(size % SECTOR, 0);
        assert!(size > SECTOR, "40 records of 162 bytes need more than one sector");
    }
}
