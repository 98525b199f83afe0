//! The block-device ioctls the agent issues itself (linux/fs.h), and dropping a device's cached
//! pages. The only module with unsafe code.
#![expect(unsafe_code, reason = "BLKDISCARD, BLKZEROOUT and friends have no safe wrapper: the ioctls are called here")]

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// `_IO(0x12, 119)`: discard a byte range.
const BLKDISCARD: u32 = 0x1277;
/// `_IO(0x12, 127)`: zero a byte range (WRITE ZEROES where the device has it, else zero pages).
const BLKZEROOUT: u32 = 0x127f;

/// Zeroes `len` bytes at `offset` of the block device `dev` (BLKZEROOUT).
pub fn zero_out(dev: &File, offset: u64, len: u64) -> io::Result<()> {
    range_ioctl(dev, BLKZEROOUT, offset, len)
}

/// Discards `len` bytes at `offset` of the block device `dev` (BLKDISCARD).
pub fn discard(dev: &File, offset: u64, len: u64) -> io::Result<()> {
    range_ioctl(dev, BLKDISCARD, offset, len)
}

/// Drops the cached pages of `file` (flushed first by the caller), so that what is read next comes
/// from the device (`posix_fadvise(POSIX_FADV_DONTNEED)` over the whole file).
pub fn drop_cache(file: &File) -> io::Result<()> {
    // SAFETY: posix_fadvise only reads its integer arguments; the descriptor is owned by `file`.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(rc))
    }
}

fn range_ioctl(dev: &File, request: u32, offset: u64, len: u64) -> io::Result<()> {
    let range: [u64; 2] = [offset, len];
    // SAFETY: both requests read a `uint64_t[2]` {start, length} through the pointer, which is
    // valid for that read for the whole call; the descriptor is owned by `dev` and open.
    let rc = unsafe { libc::ioctl(dev.as_raw_fd(), request as _, range.as_ptr()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
