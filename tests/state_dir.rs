//! The state directory holds Secret data (the store, the API token, the boot-token
//! key): `bootplane serve` keeps it 0700 and every file in it 0600, fixing (and
//! saying so in its log) a directory or file left more open.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use support::bootplane::*;

/// The permission bits, in octal.
fn mode(p: &Path) -> String {
    let m = std::fs::symlink_metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .permissions()
        .mode();
    format!("{:o}", m & 0o7777)
}

fn chmod(p: &Path, m: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
}

/// Every regular file directly in `dir` (the ones bootplane keeps there).
fn files(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| std::fs::symlink_metadata(p).unwrap().is_file())
        .collect()
}

#[test]
fn fresh_state_dir_is_private() {
    // A state dir that does not exist yet, below a world-readable parent.
    let tmp = tempfile::tempdir().unwrap();
    chmod(tmp.path(), 0o755);
    let dir = tmp.path().join("var/bootplane");
    let mut b = Bootplane::start_in(&dir, &[]);
    b.kill9();
    assert_eq!(mode(&dir), "700", "state dir");
    let fs = files(&dir);
    for f in ["store.redb", "api-token", "http-token-key", "secrets.key"] {
        assert!(fs.contains(&dir.join(f)), "{f} missing: {fs:?}");
    }
    for f in &fs {
        assert_eq!(mode(f), "600", "{}", f.display());
    }
}

#[test]
fn open_state_dir_and_files_are_fixed_at_start_and_logged() {
    let mut b = Bootplane::start(&[]);
    assert!(b.stop().success());
    // What an older bootplane (or a careless operator) left behind.
    chmod(&b.dir, 0o755);
    for f in ["store.redb", "api-token", "http-token-key", "secrets.key"] {
        chmod(&b.dir.join(f), 0o644);
    }
    b.spawn();
    assert_eq!(mode(&b.dir), "700", "state dir");
    for f in files(&b.dir) {
        assert_eq!(mode(&f), "600", "{}", f.display());
    }
    let log = b.log();
    let fixed: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("0o"))
        .collect();
    for what in ["store.redb", "api-token", "http-token-key", "secrets.key"] {
        assert!(
            fixed.iter().any(|l| l.contains(what)),
            "no warning naming {what}: {fixed:#?}\n{}",
            tail(&log, 30)
        );
    }
    assert!(
        fixed
            .iter()
            .any(|l| l.contains(&*b.dir.to_string_lossy()) && l.contains("0o755")),
        "no warning for the state dir itself: {fixed:#?}"
    );
    // The fix holds across a restart: nothing more to say the second time.
    assert!(b.stop().success());
    let before = b.log().len();
    b.spawn();
    assert!(
        !b.log()[before..].contains("0o644"),
        "{}",
        &b.log()[before..]
    );
}
