//! Verification: the agent's own O_DIRECT reads of the first and last MiB and of [`SAMPLES`] ranges
//! of [`SAMPLE_LEN`] spread evenly over the device, each of which must read as zeroes.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use sha2::{Digest, Sha256};

/// Ranges sampled between the first and the last MiB.
pub const SAMPLES: u64 = 64;
/// Length of the first and the last range: 1 MiB.
pub const END_LEN: u64 = 1 << 20;
/// Length of each sampled range: 64 KiB (16 pages, 128 sectors of 512 bytes).
pub const SAMPLE_LEN: u64 = 64 << 10;
/// Ranges read concurrently (a queue depth, so a device's latency is not paid 66 times over).
const READERS: usize = 8;
/// Alignment of the read buffer and of offsets (covers 512- and 4096-byte logical blocks).
const ALIGN: usize = 4096;

/// What verification read (the report's `verification`, docs/security.md).
pub type Verification = paddock_types::agent::Verification;

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
/// [`SAMPLES`] ranges at evenly spaced offsets aligned down to 4 KiB, and the last MiB (each cut to
/// the device's size).
pub fn ranges(size: u64) -> Vec<(u64, u64)> {
    let end = END_LEN.min(size);
    if end == 0 {
        return Vec::new();
    }
    let sample = SAMPLE_LEN.min(size);
    let span = size - sample;
    let mut out = vec![(0, end)];
    out.extend((1..=SAMPLES).map(|i| ((span * i / (SAMPLES + 1)) / ALIGN as u64 * ALIGN as u64, sample)));
    out.push((size - end, end));
    out
}

/// Reads every range of [`ranges`] from `path` with O_DIRECT, [`READERS`] ranges in flight at a
/// time, checks each is all zeroes and digests them in order.
pub fn verify(path: &Path, size: u64) -> Result<Verification, VerifyError> {
    let file = OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path).map_err(VerifyError::Io)?;
    let plan = ranges(size);
    // One aligned buffer, a slot per range, each slot starting on an ALIGN boundary.
    let slot = |len: u64| (len as usize).div_ceil(ALIGN) * ALIGN;
    let total: usize = plan.iter().map(|&(_, len)| slot(len)).sum();
    let mut backing = vec![0u8; total + ALIGN];
    let start = backing.as_ptr().align_offset(ALIGN);
    let mut rest = &mut backing[start..start + total];
    let mut slots = Vec::with_capacity(plan.len());
    for &(offset, len) in &plan {
        let (this, tail) = std::mem::take(&mut rest).split_at_mut(slot(len));
        slots.push((offset, &mut this[..len as usize]));
        rest = tail;
    }
    let outcomes: Vec<Result<(), VerifyError>> = std::thread::scope(|s| {
        let mut lanes: Vec<Vec<(u64, &mut [u8])>> = (0..READERS).map(|_| Vec::new()).collect();
        for (i, slot) in slots.iter_mut().enumerate() {
            lanes[i % READERS].push((slot.0, &mut *slot.1));
        }
        let file = &file;
        let handles: Vec<_> = lanes.into_iter().map(|lane| s.spawn(move || read_lane(file, lane))).collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(VerifyError::Io(io::Error::other("reader panicked")))))
            .collect()
    });
    outcomes.into_iter().collect::<Result<Vec<()>, _>>()?;
    let mut hasher = Sha256::new();
    for (_, data) in &slots {
        hasher.update(&**data);
    }
    let bytes_read = plan.iter().map(|&(_, len)| len).sum();
    Ok(Verification { ranges: plan.len() as u64, bytes_read, sha256: hex::encode(hasher.finalize()) })
}

/// Reads one reader's ranges and checks each is all zeroes.
fn read_lane(file: &File, lane: Vec<(u64, &mut [u8])>) -> Result<(), VerifyError> {
    for (offset, buf) in lane {
        read_exact_at(file, buf, offset).map_err(VerifyError::Io)?;
        if let Some(i) = first_non_zero(buf) {
            return Err(VerifyError::NotErased { offset: offset + i as u64 });
        }
    }
    Ok(())
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
        assert_eq!(r[0], (0, END_LEN));
        assert_eq!(*r.last().expect("ranges"), (size - END_LEN, END_LEN));
        assert!(r[1..65].iter().all(|&(_, l)| l == SAMPLE_LEN));
        assert!(r.windows(2).all(|w| w[0].0 < w[1].0), "offsets strictly increase");
        assert!(r.iter().all(|(o, l)| o % 4096 == 0 && o + l <= size));
        // Spread over the whole device: no gap between samples wider than a 65th of it.
        assert!(r.windows(2).all(|w| w[1].0 - w[0].0 <= size / 65 + 4096));
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
