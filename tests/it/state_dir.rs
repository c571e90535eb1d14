//! The state directory holds Secret data (the store, the API token, the boot-token
//! key): `bootplane serve` keeps it 0700 and every file in it 0600, fixing (and
//! saying so in its log) a directory or file left more open.

use crate::support;

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
    // Below it too: whoever reads tls/ca.key can mint an admin client certificate.
    let tls = b.dir.join("tls");
    chmod(&tls, 0o755);
    for f in ["ca.key", "server.key", "ca.crt"] {
        chmod(&tls.join(f), 0o644);
    }
    b.spawn();
    assert_eq!(mode(&b.dir), "700", "state dir");
    for f in files(&b.dir) {
        assert_eq!(mode(&f), "600", "{}", f.display());
    }
    assert_eq!(mode(&tls), "700", "tls dir");
    for f in ["ca.key", "server.key", "ca.crt"] {
        assert_eq!(mode(&tls.join(f)), "600", "tls/{f}");
    }
    let log = b.log();
    let fixed: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("0o"))
        .collect();
    for what in [
        "store.redb",
        "api-token",
        "http-token-key",
        "secrets.key",
        "ca.key",
        "server.key",
    ] {
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

#[test]
fn a_token_key_file_others_may_read_is_refused() {
    // Outside the state dir (a key shared by a cluster), so nothing restricts it at start.
    let tmp = tempfile::tempdir().unwrap();
    let key = tmp.path().join("http-token-key");
    std::fs::write(&key, [7u8; 32]).unwrap();
    chmod(&key, 0o644);
    let (api, http) = two_free_ports();
    let mut child = std::process::Command::new(bin())
        .arg("serve")
        .arg("--state-dir")
        .arg(tmp.path().join("state"))
        .args(["--api-listen", &format!("127.0.0.1:{api}")])
        .args(["--http-listen", &format!("127.0.0.1:{http}")])
        .args(["--power-driver", "test", "--set"])
        .arg(format!(
            "http.token_key_file={:?}",
            key.display().to_string()
        ))
        .env("RUST_LOG", "info")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("serve started with a token key others may read");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success());
    assert!(
        err.contains("token key") && err.contains("0644") && err.contains("group or others"),
        "{err}"
    );
    assert_eq!(
        mode(&key),
        "644",
        "refused, not changed behind the operator's back"
    );
}
