//! Verification: the agent's own O_DIRECT reads of the first and last MiB and of [`SAMPLES`] ranges
//! spread evenly over the device, each of which must read as zeroes.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Ranges sampled between the first and the last MiB.
pub const SAMPLES: u64 = 64;
/// Length of every range read, and of the first and last ones: 1 MiB.
pub const RANGE_LEN: u64 = 1 << 20;
/// Alignment of the read buffer and of offsets (covers 512- and 4096-byte logical blocks).
const ALIGN: usize = 4096;

/// What verification read (SPEC: `verification`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verification {
    /// Ranges read.
    pub ranges: u64,
    /// Bytes read, all ranges together.
    pub bytes_read: u64,
    /// SHA-256 (hex) of the bytes read, in the order read.
    pub sha256: String,
}

/// Why verification did not pass.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// A read failed.
    #[error("verification read failed")]
    Io(#[source] io::Error),
    /// A range held a non-zero byte.
    #[error("verification found a non-zero byte at offset {offset}")]
    NotErased {
        /// Device offset of the first non-zero byte found.
        offset: u64,
    },
}

/// The byte ranges (offset, length) verification reads on a device of `size` bytes: the first MiB,
/// [`SAMPLES`] ranges at evenly spaced offsets aligned down to 4 KiB, and the last MiB.
pub fn ranges(size: u64) -> Vec<(u64, u64)> {
    let len = RANGE_LEN.min(size);
    if len == 0 {
        return Vec::new();
    }
    let span = size - len;
    let mut out = vec![(0, len)];
    out.extend((1..=SAMPLES).map(|i| ((span * i / (SAMPLES + 1)) / ALIGN as u64 * ALIGN as u64, len)));
    out.push((span, len));
    out
}

/// Reads every range of [`ranges`] from `path` with O_DIRECT and checks it is all zeroes.
pub fn verify(path: &Path, size: u64) -> Result<Verification, VerifyError> {
    let file = OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path).map_err(VerifyError::Io)?;
    let mut backing = vec![0u8; RANGE_LEN as usize + ALIGN];
    let start = backing.as_ptr().align_offset(ALIGN);
    let buf = &mut backing[start..start + RANGE_LEN as usize];
    let mut hasher = Sha256::new();
    let plan = ranges(size);
    let mut bytes_read = 0;
    for &(offset, len) in &plan {
        let chunk = &mut buf[..len as usize];
        read_exact_at(&file, chunk, offset).map_err(VerifyError::Io)?;
        if let Some(i) = first_non_zero(chunk) {
            return Err(VerifyError::NotErased { offset: offset + i as u64 });
        }
        hasher.update(&*chunk);
        bytes_read += len;
    }
    Ok(Verification { ranges: plan.len() as u64, bytes_read, sha256: hex::encode(hasher.finalize()) })
}

fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("end of device at {}", offset + done as u64),
                ))
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Index of the first non-zero byte, word by word.
fn first_non_zero(buf: &[u8]) -> Option<usize> {
    let words =
        buf.chunks_exact(8).position(|w| u64::from_ne_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]) != 0);
    let from = words.map_or(buf.len() / 8 * 8, |w| w * 8);
    buf[from..].iter().position(|&b| b != 0).map(|i| from + i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_both_ends_and_sixty_four_samples() {
        let size = 10 << 30;
        let r = ranges(size);
        assert_eq!(r.len(), 66);
        assert_eq!(r[0], (0, RANGE_LEN));
        assert_eq!(*r.last().expect("ranges"), (size - RANGE_LEN, RANGE_LEN));
        assert!(r.windows(2).all(|w| w[0].0 < w[1].0), "offsets strictly increase");
        assert!(r.iter().all(|(o, l)| o % 4096 == 0 && o + l <= size));
    }

    #[test]
    fn a_device_smaller_than_a_mib_is_read_whole() {
        let r = ranges(8192);
        assert!(r.iter().all(|&(o, l)| (o, l) == (0, 8192)));
        assert_eq!(ranges(0), Vec::new());
    }

    #[test]
    fn first_non_zero_finds_the_byte() {
        let mut b = vec![0u8; 4099];
        assert_eq!(first_non_zero(&b), None);
        b[4098] = 1;
        assert_eq!(first_non_zero(&b), Some(4098));
        b[17] = 9;
        assert_eq!(first_non_zero(&b), Some(17));
    }
}
