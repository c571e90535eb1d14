//! Secrets at rest (issue 22, item 5), through the real `bootplane serve`: a Secret
//! and a BMCSecret holding a marker are readable through the API, but no file under
//! the state dir (the store, the log, everything) holds the marker or its base64
//! forms; they stay readable after a restart, after a key rotation (a new key first,
//! re-encryption in the background, the old key removed) and not when the key they
//! need is gone (a clear error naming it). On etcd, the value etcd holds is sealed
//! and another appliance's mirror reads it; an older sealed value put back with
//! etcdctl is not served, nor is an APIToken written to etcd directly (401).

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine as _;
use support::bootplane::{bin, Bootplane};
use support::etcd::EtcdCluster;

const MARKER: &str = "Sw0rdf1sh-at-rest-7c1e";

const SECRET_PATH: &str = "/api/v1/namespaces/default/secrets/marker-secret";
const BMCSECRET_PATH: &str = "/apis/metal.ironcore.dev/v1alpha1/bmcsecrets/marker-bmc";

fn objects() -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: marker-secret\n  namespace: default\n\
         type: Opaque\nstringData:\n  password: {MARKER}\n---\n\
         apiVersion: metal.ironcore.dev/v1alpha1\nkind: BMCSecret\nmetadata:\n  name: marker-bmc\n\
         stringData:\n  username: admin\n  password: {MARKER}\n"
    )
}

/// The marker and every base64 form it can take inside a longer base64 text (the
/// three alignments, without the characters that depend on its neighbours).
fn needles() -> Vec<Vec<u8>> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut out = vec![MARKER.as_bytes().to_vec()];
    for pad in 0..3 {
        let mut bytes = vec![b'x'; pad];
        bytes.extend_from_slice(MARKER.as_bytes());
        let enc = b64.encode(&bytes);
        // Skip the characters mixing in the padding, and the last (mixes what follows).
        let skip = (pad * 8).div_ceil(6);
        out.push(enc.as_bytes()[skip..enc.len() - 4].to_vec());
    }
    out
}

/// Every regular file under `dir`, recursively.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let t = e.file_type().unwrap();
        if t.is_dir() {
            out.extend(files(&e.path()));
        } else if t.is_file() {
            out.push(e.path());
        }
    }
    out
}

/// Panics naming the file when any file under `dir` holds the marker in any form.
fn assert_no_marker_under(dir: &Path) {
    let needles = needles();
    let all = files(dir);
    assert!(
        all.iter().any(|f| f.ends_with("store.redb")),
        "the store is among the files checked: {all:?}"
    );
    for f in &all {
        let bytes = std::fs::read(f).unwrap();
        for n in &needles {
            assert!(
                !bytes.windows(n.len()).any(|w| w == n.as_slice()),
                "{} holds the marker as {:?}",
                f.display(),
                String::from_utf8_lossy(n)
            );
        }
    }
}

/// Both objects read back through the API with the marker in them.
fn assert_readable(b: &Bootplane) {
    let b64 = base64::engine::general_purpose::STANDARD.encode(MARKER);
    let s = b.get(SECRET_PATH);
    assert_eq!(s["data"]["password"], b64.as_str(), "{s}");
    let m = b.get(BMCSECRET_PATH);
    let text = m.to_string();
    assert!(text.contains(&b64) || text.contains(MARKER), "{m}");
}

fn by_key(b: &Bootplane, key: &str) -> Option<i64> {
    b.secrets_by_key(key)
}

fn apply(b: &Bootplane) {
    let (code, out, err) = b.cli_stdin(&["apply", "-f", "-"], Some(&objects()));
    assert_eq!(code, 0, "{out} {err}");
    assert_eq!(out.matches("created").count(), 2, "{out}");
}

fn key_entry(name: &str, byte: u8) -> String {
    let secret = base64::engine::general_purpose::STANDARD.encode([byte; 32]);
    format!("[[keys]]\nname = \"{name}\"\nsecret = \"{secret}\"\n")
}

fn write_private(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// `bootplane serve` on `b`'s state dir and ports (`b` stopped) with `extra`
/// arguments, expected to refuse to start: its stderr (killed after 20 s if it starts).
fn refused_start(b: &Bootplane, extra: &[&str]) -> String {
    let mut c = Command::new(bin());
    c.args(["serve", "--state-dir", b.dir.to_str().unwrap()])
        .arg("--api-listen")
        .arg(format!("127.0.0.1:{}", b.api_port))
        .arg("--http-listen")
        .arg(format!("127.0.0.1:{}", b.http_port))
        .args(["--power-driver", "test"])
        .args(extra);
    let out = support::process::run_bounded(c, 20);
    assert!(!out.status.success(), "bootplane started");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn secrets_are_sealed_on_disk_readable_after_restart_and_after_key_rotation() {
    let mut b = Bootplane::start(&[]);
    let key_file = b.dir.join("secrets.key");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&key_file).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600, "the generated key file is private");
    apply(&b);
    assert_readable(&b);
    b.wait_for(10, "2 objects under key1", || {
        (by_key(&b, "key1") == Some(2)).then_some(())
    });
    // Nothing on disk holds the marker: not the store, not the log, nothing.
    b.stop();
    assert_no_marker_under(&b.dir);
    b.spawn();
    assert_readable(&b);

    // Rotation: a new key first, the file re-read on SIGHUP, everything re-encrypted.
    let old = std::fs::read_to_string(&key_file).unwrap();
    write_private(&key_file, &format!("{}{old}", key_entry("key2", 7)));
    let pid = b.child.as_ref().unwrap().id() as i32;
    // SAFETY: kill(2) on our own running child.
    unsafe { libc::kill(pid, libc::SIGHUP) };
    b.wait_for(20, "every secret re-encrypted under key2", || {
        (by_key(&b, "key1") == Some(0) && by_key(&b, "key2") == Some(2)).then_some(())
    });
    b.wait_for(10, "the log line saying the old key may go", || {
        b.log()
            .contains("the older keys may be removed")
            .then_some(())
    });
    assert_readable(&b);
    b.stop();
    // The old key removed: still readable after a restart.
    write_private(&key_file, &key_entry("key2", 7));
    b.spawn();
    assert_readable(&b);
    b.stop();
    assert_no_marker_under(&b.dir);

    // A key file without the key the values need: a clear error naming it.
    write_private(&key_file, &key_entry("key3", 9));
    let err = refused_start(&b, &[]);
    assert!(
        err.contains("encrypted with key \"key2\"") && err.contains("secrets.key"),
        "{err}"
    );
    assert!(!err.contains(MARKER), "{err}");
    // A key file others may read: refused, naming it (outside the state dir, whose
    // files bootplane makes private itself at start).
    let elsewhere = tempfile::tempdir().unwrap();
    let open_file = elsewhere.path().join("open.key");
    std::fs::write(&open_file, key_entry("key2", 7)).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&open_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let set = format!(
        "store.encryption_key_file={:?}",
        open_file.display().to_string()
    );
    let err = refused_start(&b, &["--set", &set]);
    assert!(err.contains("open.key") && err.contains("0644"), "{err}");
    // With the right key, from a file elsewhere: readable again.
    std::fs::set_permissions(&open_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    b.extra = vec!["--set".into(), set];
    b.spawn();
    assert_readable(&b);
}

#[test]
fn on_etcd_the_value_etcd_holds_is_sealed_and_another_appliance_reads_it() {
    let etcd = EtcdCluster::start(1);
    let keys = tempfile::tempdir().unwrap();
    let key_file = keys.path().join("cluster.key");
    write_private(&key_file, &key_entry("cluster1", 3));
    let prefix = format!("/bp-seal-{}/", std::process::id());
    let args: Vec<String> = [
        "store.backend=\"etcd\"".to_string(),
        format!("store.etcd.endpoints={:?}", etcd.endpoints()),
        format!("store.etcd.prefix={prefix:?}"),
        format!(
            "store.encryption_key_file={:?}",
            key_file.display().to_string()
        ),
    ]
    .into_iter()
    .flat_map(|kv| ["--set".to_string(), kv])
    .collect();
    let with_name = |n: &str| {
        let mut a = args.clone();
        a.extend(["--set".to_string(), format!("store.etcd.name={n:?}")]);
        a
    };
    let a_args = with_name("a");
    let a = Bootplane::start(&a_args.iter().map(String::as_str).collect::<Vec<_>>());
    let b_args = with_name("b");
    let b = Bootplane::start(&b_args.iter().map(String::as_str).collect::<Vec<_>>());
    apply(&a);
    assert_readable(&a);
    b.wait_for(10, "the other appliance's mirror to read both", || {
        (b.call("GET", SECRET_PATH, None).0 == 200 && b.call("GET", BMCSECRET_PATH, None).0 == 200)
            .then_some(())
    });
    assert_readable(&b);
    // What etcd holds, read with etcd's own client: sealed, without the marker.
    for key in [
        format!("{prefix}objects/core/secrets/default/marker-secret"),
        format!("{prefix}objects/metal.ironcore.dev/bmcsecrets/marker-bmc"),
    ] {
        let o = etcd.etcdctl(&["get", &key, "--print-value-only"]);
        assert!(o.status.success(), "{}", support::process::text(&o));
        assert!(
            o.stdout
                .starts_with(b"bootplane:enc:xchacha20poly1305:v2:cluster1:"),
            "{key}: {}",
            String::from_utf8_lossy(&o.stdout)
        );
        for n in needles() {
            assert!(
                !o.stdout.windows(n.len()).any(|w| w == n.as_slice()),
                "{key} holds the marker"
            );
        }
    }
    // Every object under the prefix: the marker is nowhere in etcd.
    let o = etcd.etcdctl(&["get", &prefix, "--prefix"]);
    assert!(o.status.success());
    assert!(!o
        .stdout
        .windows(MARKER.len())
        .any(|w| w == MARKER.as_bytes()));
    // Each appliance counts the objects under the key (its mirror's ledger).
    for x in [&a, &b] {
        x.wait_for(10, "2 objects under cluster1", || {
            (by_key(x, "cluster1") == Some(2)).then_some(())
        });
    }
    written_around_bootplane(&etcd, &prefix, &a, &b);
}

/// What etcd holds at `key`, exactly (etcdctl's JSON output, base64).
fn etcd_value(etcd: &EtcdCluster, key: &str) -> Vec<u8> {
    let o = etcd.etcdctl(&["get", key, "-w", "json"]);
    assert!(o.status.success(), "{}", support::process::text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let b64 = v["kvs"][0]["value"].as_str().unwrap();
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap()
}

/// `etcdctl put KEY` with `value` on its stdin (exact bytes, NULs too).
fn etcdctl_put(etcd: &EtcdCluster, key: &str, value: &[u8]) {
    use std::io::Write as _;
    let mut c = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", etcd.endpoints_csv()))
        .args(["put", key])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(value).unwrap();
    let o = c.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", support::process::text(&o));
}

/// Write a Secret `name` through `a` and wait until `b` serves it: both mirrors have
/// then seen every etcd write made before.
fn sync(a: &Bootplane, b: &Bootplane, name: &str) {
    let obj = serde_json::json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": "default"}, "stringData": {"k": "v"}});
    let (code, v) = a.call("POST", "/api/v1/namespaces/default/secrets", Some(&obj));
    assert_eq!(code, 201, "{v}");
    let path = format!("/api/v1/namespaces/default/secrets/{name}");
    b.wait_for(10, "the other appliance to read it", || {
        (b.call("GET", &path, None).0 == 200).then_some(())
    });
}

/// The status of a list of tokens asked for with `token`.
fn status_as(b: &Bootplane, token: &str) -> u16 {
    let r = b
        .req("GET", "/apis/auth.bootplane.dev/v1alpha1/apitokens")
        .set("Authorization", &format!("Bearer {token}"))
        .call();
    match r {
        Ok(r) => r.status(),
        Err(ureq::Error::Status(c, _)) => c,
        Err(e) => panic!("{e}"),
    }
}

/// Writes to etcd that did not go through bootplane: a Secret rolled back to its first
/// sealed value (etcdctl), an admin APIToken in clear. Neither is served.
fn written_around_bootplane(etcd: &EtcdCluster, prefix: &str, a: &Bootplane, b: &Bootplane) {
    const UPDATED: &str = "Upd4ted-after-the-first";
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let secret_key = format!("{prefix}objects/core/secrets/default/marker-secret");
    let first = etcd_value(etcd, &secret_key);
    let mut s = a.get(SECRET_PATH);
    s["data"]["password"] = b64(UPDATED).into();
    let (code, v) = a.call("PUT", SECRET_PATH, Some(&s));
    assert_eq!(code, 200, "{v}");
    etcdctl_put(etcd, &secret_key, &first);
    sync(a, b, "sync-1");
    for x in [a, b] {
        assert_eq!(
            x.get(SECRET_PATH)["data"]["password"],
            b64(UPDATED).as_str()
        );
        assert!(
            x.log().contains("rolled back to an older value"),
            "{}",
            x.log()
        );
    }

    let (code, tok, err) = a.cli(&["token", "create", "ops", "--role", "admin"]);
    assert_eq!(code, 0, "{err}");
    let evil = serde_json::json!({"apiVersion": "auth.bootplane.dev/v1alpha1", "kind": "APIToken",
        "metadata": {"name": "evil", "uid": "u"},
        "spec": {"role": "admin", "secretHash": format!("sha256:{}", sha256_hex("x"))}});
    let o = etcd.etcdctl(&[
        "put",
        &format!("{prefix}objects/auth.bootplane.dev/apitokens/evil"),
        &evil.to_string(),
    ]);
    assert!(o.status.success(), "{}", support::process::text(&o));
    sync(a, b, "sync-2");
    for x in [a, b] {
        assert_eq!(
            status_as(x, tok.trim()),
            200,
            "a token made through the CLI"
        );
        assert_eq!(status_as(x, "bp1.evil.x"), 401, "a token written to etcd");
        assert!(x.log().contains("APIToken in clear"), "{}", x.log());
    }
}

fn sha256_hex(s: &str) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(s.as_bytes()))
}
