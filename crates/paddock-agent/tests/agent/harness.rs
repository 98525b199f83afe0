//! Loop devices over temporary files, and running the agent binary.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

use sha2::{Digest, Sha256};

/// A loop device over a file of its own; detached and removed on drop.
pub struct Loop {
    pub dev: PathBuf,
    pub file: PathBuf,
}

impl Loop {
    /// A loop device of `size` bytes filled with a pseudo-random pattern from `seed`.
    pub fn random(size: usize, seed: u64) -> Loop {
        Loop::with_contents(&pattern(size, seed), false)
    }

    /// A loop device holding `bytes` (read-only when `read_only`).
    pub fn with_contents(bytes: &[u8], read_only: bool) -> Loop {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let file = std::env::temp_dir().join(format!(
            "paddock-agent-test-{}-{}.img",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        fs::File::create(&file).and_then(|mut f| f.write_all(bytes)).expect("writing the backing file");
        let mut cmd = Command::new("losetup");
        if read_only {
            cmd.arg("--read-only");
        }
        let out = cmd.args(["--find", "--show"]).arg(&file).output().expect("running losetup");
        assert!(out.status.success(), "losetup failed (tests run as root): {}", String::from_utf8_lossy(&out.stderr));
        let dev = PathBuf::from(String::from_utf8(out.stdout).expect("utf-8").trim());
        Loop { dev, file }
    }

    /// The size of the device (of its backing file), in bytes.
    pub fn size(&self) -> usize {
        let len = fs::metadata(&self.file).expect("the backing file").len();
        usize::try_from(len).expect("a test-sized file")
    }

    /// The device's whole contents, read through the device.
    pub fn contents(&self) -> Vec<u8> {
        fs::read(&self.dev).expect("reading the loop device")
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
        let _ = fs::remove_file(&self.file);
    }
}

/// `size` bytes of xorshift64 output: no two MiB alike, nothing a zero check could miss.
pub fn pattern(size: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(size + 8);
    while out.len() < size {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(size);
    out
}

/// Runs `paddock-agent` with `args`.
pub fn agent(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_paddock-agent")).args(args).output().expect("running paddock-agent")
}

pub fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}
