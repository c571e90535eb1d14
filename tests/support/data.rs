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

/// An exclusive lock on `CARGO_TARGET_TMPDIR/<name>.lock`, held until the returned file
/// drops: what a cache under `CARGO_TARGET_TMPDIR` (a downloaded kernel, a built image)
/// is filled under. A static `Mutex` alone guards one process only, and the tests run as
/// threads of one process (`cargo test`) or as a process each (`cargo nextest run`).
pub fn cache_lock(name: &str) -> std::fs::File {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join(format!("{name}.lock"));
    let f =
        std::fs::File::create(&path).unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
    f.lock()
        .unwrap_or_else(|e| panic!("locking {}: {e}", path.display()));
    f
}

/// Runs `build` under [`cache_lock`]`(name)` unless it already ran for `name` in this
/// test run: one `cargo nextest run` (its `NEXTEST_RUN_ID`, shared by the run's test
/// processes) or, under `cargo test`, this process. So a cache is rebuilt once per run
/// (it may depend on this checkout's sources), not once per test.
pub fn once_per_run(name: &str, build: impl FnOnce()) {
    let _lock = cache_lock(name);
    let run =
        std::env::var("NEXTEST_RUN_ID").unwrap_or_else(|_| format!("pid-{}", std::process::id()));
    let stamp = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}.run"));
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s == run) {
        return;
    }
    build();
    std::fs::write(&stamp, &run).unwrap_or_else(|e| panic!("writing {}: {e}", stamp.display()));
}
