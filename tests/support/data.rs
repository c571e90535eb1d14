//! Test data: deterministic bytes, their SHA-256, and the repository's fixtures.

use std::path::Path;

use sha2::{Digest, Sha256};

/// Deterministic pseudo-random bytes (xorshift), different per seed.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// The SHA-256 of `b`, lowercase hex.
pub fn sha256_hex(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

/// The SHA-256 of the file `p`, lowercase hex; panics when it cannot be read.
pub fn sha256_file(p: &Path) -> String {
    sha256_hex(&std::fs::read(p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display())))
}

/// `tests/fixtures` in the repository.
pub fn fixtures() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures"))
}
