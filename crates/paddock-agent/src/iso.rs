//! Reading one file from an ISO 9660 image (ECMA-119), preferring the Joliet tree, without
//! mounting: the seed is read the same way whatever file systems the running kernel has. Small
//! files are read whole; a large one (the node OS image's `node/disk.img`) is found as its extent
//! and streamed.

use std::io::{self, Read, Seek, SeekFrom};

use anyhow::{bail, Context};

const SECTOR: u64 = 2048;
/// Largest file this reader returns (the seed's files are small).
const MAX_FILE: u32 = 1 << 20;
/// Most volume descriptors looked at before giving up on a terminator.
const MAX_DESCRIPTORS: u64 = 32;

/// A directory record's extent: where a file's bytes are (one extent: files under 4 GiB).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// First logical block (of 2048 bytes).
    pub lba: u32,
    /// Length in bytes.
    pub len: u32,
    dir: bool,
}

impl Extent {
    /// Byte offset of the extent in the image.
    pub fn offset(&self) -> u64 {
        u64::from(self.lba) * SECTOR
    }
}

/// The extent of the file at `path` (components separated by `/`), matched case-insensitively;
/// `None` when the image has no such file.
pub fn find(dev: &mut (impl Read + Seek), path: &str) -> anyhow::Result<Option<Extent>> {
    let (root, joliet) = root(dev)?;
    let mut at = root;
    for component in path.split('/').filter(|c| !c.is_empty()) {
        if !at.dir {
            return Ok(None);
        }
        match lookup(dev, at, component, joliet)? {
            Some(e) => at = e,
            None => return Ok(None),
        }
    }
    if at.dir {
        bail!("{path} is a directory");
    }
    Ok(Some(at))
}

/// A reader of the file at `extent`, positioned at its start and ending with it.
pub fn open<R: Read + Seek>(mut dev: R, extent: Extent) -> io::Result<io::Take<R>> {
    dev.seek(SeekFrom::Start(extent.offset()))?;
    Ok(dev.take(u64::from(extent.len)))
}

/// The contents of the small file at `path` (see [`find`]); `None` when the image has no such
/// file.
pub fn read_file(dev: &mut (impl Read + Seek), path: &str) -> anyhow::Result<Option<Vec<u8>>> {
    let Some(at) = find(dev, path)? else { return Ok(None) };
    if at.len > MAX_FILE {
        bail!("{path} is {} bytes, more than {MAX_FILE}", at.len);
    }
    Ok(Some(read_at(dev, at.offset(), at.len as usize)?))
}

/// Length in bytes of the ISO 9660 image at the start of `dev`: the Primary Volume Descriptor's
/// volume space size times its logical block size.
pub fn image_len(dev: &mut (impl Read + Seek)) -> anyhow::Result<u64> {
    let pvd = read_at(dev, 16 * SECTOR, SECTOR as usize)?;
    if pvd[0] != 1 || &pvd[1..6] != b"CD001" {
        bail!("no ISO 9660 primary volume descriptor");
    }
    let blocks = u32::from_le_bytes([pvd[80], pvd[81], pvd[82], pvd[83]]);
    let block_size = u16::from_le_bytes([pvd[128], pvd[129]]);
    Ok(u64::from(blocks) * u64::from(block_size))
}

/// The root directory of the Joliet tree if there is one, else of the primary tree.
fn root(dev: &mut (impl Read + Seek)) -> anyhow::Result<(Extent, bool)> {
    let mut primary = None;
    for i in 16..16 + MAX_DESCRIPTORS {
        let vd = read_at(dev, i * SECTOR, SECTOR as usize)?;
        if &vd[1..6] != b"CD001" {
            bail!("not an ISO 9660 image (no volume descriptor at sector {i})");
        }
        let root = record(&vd[156..190]).context("bad root directory record")?;
        match vd[0] {
            1 => primary = Some(root),
            // A Supplementary Volume Descriptor with a UCS-2 escape sequence is Joliet.
            2 if matches!(&vd[88..91], b"%/@" | b"%/C" | b"%/E") => return Ok((root, true)),
            255 => break,
            _ => {}
        }
    }
    primary.map(|r| (r, false)).context("the image has no primary volume descriptor")
}

fn record(r: &[u8]) -> Option<Extent> {
    let lba = u32::from_le_bytes(r.get(2..6)?.try_into().ok()?);
    let len = u32::from_le_bytes(r.get(10..14)?.try_into().ok()?);
    Some(Extent { lba, len, dir: r.get(25)? & 0b10 != 0 })
}

/// The entry called `name` in directory `dir`.
fn lookup(dev: &mut (impl Read + Seek), dir: Extent, name: &str, joliet: bool) -> anyhow::Result<Option<Extent>> {
    if dir.len > MAX_FILE {
        bail!("directory of {} bytes is too large", dir.len);
    }
    let data = read_at(dev, u64::from(dir.lba) * SECTOR, dir.len as usize)?;
    let mut pos = 0;
    while pos < data.len() {
        let len = usize::from(data[pos]);
        if len == 0 {
            // Records never cross a sector boundary: the rest of this sector is padding.
            pos = (pos / SECTOR as usize + 1) * SECTOR as usize;
            continue;
        }
        let r = data.get(pos..pos + len).context("directory record runs past its directory")?;
        let id = r.get(33..33 + usize::from(r[32])).context("directory record name runs past the record")?;
        if decode_name(id, joliet).eq_ignore_ascii_case(name) {
            // A multi-extent file (4 GiB or more) is not what the node image holds.
            if r[25] & 0x80 != 0 {
                bail!("{name} spans more than one extent");
            }
            return Ok(record(r));
        }
        pos += len;
    }
    Ok(None)
}

/// A record's name as text: UCS-2 big-endian in Joliet, else d-characters without `;1` and a
/// trailing dot.
fn decode_name(id: &[u8], joliet: bool) -> String {
    let name = if joliet {
        let units: Vec<u16> = id.chunks_exact(2).map(|c| u16::from_be_bytes([c[0], c[1]])).collect();
        String::from_utf16_lossy(&units)
    } else {
        String::from_utf8_lossy(id).into_owned()
    };
    let name = name.split(';').next().unwrap_or_default();
    name.strip_suffix('.').unwrap_or(name).to_owned()
}

fn read_at(dev: &mut (impl Read + Seek), offset: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    dev.seek(SeekFrom::Start(offset))?;
    dev.read_exact(&mut buf)?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;

    #[test]
    fn reads_files_of_a_paddock_seed_by_their_joliet_names() {
        let files: &[(&str, &[u8])] =
            &[("meta-data", b"instance-id: m-1\n"), ("agent.json", b"{\"a\":1}"), ("user-data", b"#cloud-config\n")];
        let iso = paddock_seed::nocloud_iso(files, "cidata").expect("image");
        let mut dev = Cursor::new(iso);
        for (name, contents) in files {
            assert_eq!(read_file(&mut dev, name).expect("read").as_deref(), Some(*contents), "{name}");
        }
        assert_eq!(read_file(&mut dev, "AGENT.JSON").expect("read").as_deref(), Some(&b"{\"a\":1}"[..]));
        assert_eq!(read_file(&mut dev, "paddock/agent.json").expect("read"), None);
        assert_eq!(read_file(&mut dev, "nothing").expect("read"), None);
        assert_eq!(image_len(&mut dev).expect("length"), dev.get_ref().len() as u64);
    }

    #[test]
    fn primary_names_lose_their_version_and_dot() {
        assert_eq!(decode_name(b"META_DAT.;1", false), "META_DAT");
        assert_eq!(decode_name(b"AGENT.JSO;1", false), "AGENT.JSO");
        assert_eq!(decode_name(&[0, b'a', 0, b'b'], true), "ab");
    }

    #[test]
    fn random_bytes_are_not_an_image() {
        let mut dev = Cursor::new(vec![7u8; 40 * 2048]);
        assert!(read_file(&mut dev, "x").is_err());
    }
}
