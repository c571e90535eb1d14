//! Issue 35, item 1: one secrets key for the cluster. Real `bootplane serve` appliances
//! on a real etcd: `store keygen` on the first (adopting its key file), a second with a
//! fresh state dir refuses to start naming `join` and `admit`, joins, is admitted by the
//! first (a wrong fingerprint refused), starts and reads the first's Secret; `store
//! rotate` re-seals everything under the new key on both, which still read it; `rotate
//! --drop-old` once nothing is under the old key; and a ring sealed to an appliance's
//! public key by someone who can write etcd (sealed boxes are anonymous) is refused
//! by the running appliance and at its next start (the pin), and by a rotation until
//! that appliance is removed from the keyring. At the library level: a mirror opened
//! with keys read before a rotation lists a value under the new key by reading its
//! keyring record again.

use crate::support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use base64::Engine as _;
use serde_json::json;
use support::bootplane::{bin, Bootplane};
use support::etcd::EtcdCluster;

const SECRET: &str = "/api/v1/namespaces/default/secrets/keyring-secret";
const PASSWORD: &str = "one-key-for-the-cluster";

/// The `--set` arguments that put appliance `name` on `etcd` under `prefix` (with the
/// default key file: `<state_dir>/secrets.key`).
fn etcd_args(etcd: &EtcdCluster, prefix: &str, name: &str) -> Vec<String> {
    [
        "store.backend=\"etcd\"".to_string(),
        format!("store.etcd.endpoints={:?}", etcd.endpoints()),
        format!("store.etcd.prefix={prefix:?}"),
        format!("store.etcd.name={name:?}"),
        "store.etcd.lease_ttl_secs=3".to_string(),
        "store.etcd.request_timeout_ms=2000".to_string(),
    ]
    .into_iter()
    .flat_map(|kv| ["--set".to_string(), kv])
    .collect()
}

/// `bootplane store ARGS` for the appliance with state dir `dir`: (exit code, stdout,
/// stderr).
fn store(dir: &Path, etcd_args: &[String], args: &[&str]) -> (i32, String, String) {
    let mut c = Command::new(bin());
    c.arg("store")
        .args(args)
        .arg("--state-dir")
        .arg(dir)
        .args(etcd_args)
        .env("RUST_LOG", "warn");
    let o = support::process::run_bounded(c, 30);
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn store_ok(dir: &Path, etcd_args: &[String], args: &[&str]) -> String {
    let (code, out, err) = store(dir, etcd_args, args);
    assert_eq!(code, 0, "store {args:?}: {out}\n{err}");
    out
}

/// `bootplane serve` on state dir `dir`, expected to refuse to start: its output.
fn refused_start(dir: &Path, extra: &[String]) -> String {
    let (api, http) = support::bootplane::two_free_ports();
    let mut c = Command::new(bin());
    c.arg("serve")
        .arg("--state-dir")
        .arg(dir)
        .arg("--api-listen")
        .arg(format!("127.0.0.1:{api}"))
        .arg("--http-listen")
        .arg(format!("127.0.0.1:{http}"))
        .args(["--power-driver", "test"])
        .args(extra);
    let out = support::process::run_bounded(c, 20);
    assert!(!out.status.success(), "bootplane started");
    support::process::text(&out)
}

fn start(dir: &Path, extra: &[String]) -> Bootplane {
    Bootplane::start_in(dir, &extra.iter().map(String::as_str).collect::<Vec<_>>())
}

fn by_key(b: &Bootplane, key: &str) -> Option<i64> {
    b.secrets_by_key(key)
}

/// The Secret's password as `b` serves it, None until it does.
fn password(b: &Bootplane) -> Option<String> {
    let (code, v) = b.call("GET", SECRET, None);
    if code != 200 {
        return None;
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(v["data"]["password"].as_str()?)
        .ok()?;
    String::from_utf8(raw).ok()
}

/// The key name the value etcd holds at `key` is sealed with.
fn sealed_with(etcd: &EtcdCluster, key: &str) -> String {
    let o = etcd.etcdctl(&["get", key, "--print-value-only"]);
    assert!(o.status.success(), "{}", support::process::text(&o));
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let rest = text
        .strip_prefix("bootplane:enc:xchacha20poly1305:v2:")
        .unwrap_or_else(|| panic!("{key} is not sealed: {text:?}"));
    rest.split(':').next().unwrap().to_string()
}

fn write_private(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

#[test]
fn appliances_join_by_admission_and_rotate_the_cluster_key_together() {
    let etcd = EtcdCluster::start(1);
    let prefix = format!("/bp-keyring-{}/", std::process::id());
    let secret_key = format!("{prefix}objects/core/secrets/default/keyring-secret");
    let (a_tmp, b_tmp) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a_dir, b_dir) = (a_tmp.path().join("a"), b_tmp.path().join("b"));
    let (a_args, b_args) = (
        etcd_args(&etcd, &prefix, "a"),
        etcd_args(&etcd, &prefix, "b"),
    );

    // A: a key file made by hand before (as clusters copied it), adopted by keygen.
    std::fs::create_dir(&a_dir).unwrap();
    let secret = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
    write_private(
        &a_dir.join("secrets.key"),
        &format!("[[keys]]\nname = \"cluster1\"\nsecret = \"{secret}\"\n"),
    );
    let out = store_ok(&a_dir, &a_args, &["keygen"]);
    assert!(
        out.contains("cluster1") && out.contains("fingerprint: "),
        "{out}"
    );
    let (code, _, err) = store(&a_dir, &a_args, &["keygen"]);
    assert_ne!(code, 0);
    assert!(
        err.contains("already has a keyring") && err.contains("store join"),
        "{err}"
    );
    // The identity file is private; etcd holds no key bytes.
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(a_dir.join("store-identity.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o077, 0, "{mode:o}");
    let all = etcd.etcdctl(&["get", "--prefix", &prefix]);
    assert!(!String::from_utf8_lossy(&all.stdout).contains(&secret));

    let a = start(&a_dir, &a_args);
    let obj = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "keyring-secret", "namespace": "default"},
        "stringData": {"password": PASSWORD}});
    let (code, v) = a.call("POST", "/api/v1/namespaces/default/secrets", Some(&obj));
    assert_eq!(code, 201, "{v}");
    assert_eq!(sealed_with(&etcd, &secret_key), "cluster1");

    // B: a fresh state dir, no key file: refuses to start, naming the fix.
    let err = refused_start(&b_dir, &b_args);
    assert!(
        err.contains("store join") && err.contains("store admit b --fingerprint"),
        "{err}"
    );
    assert!(
        !b_dir.join("secrets.key").exists(),
        "no key of its own made"
    );
    let out = store_ok(&b_dir, &b_args, &["join"]);
    let fp = out
        .lines()
        .find_map(|l| l.strip_prefix("fingerprint: "))
        .unwrap_or_else(|| panic!("{out}"))
        .trim()
        .to_string();
    assert!(
        out.contains(&format!("bootplane store admit b --fingerprint {fp}")),
        "{out}"
    );
    // Joined but not admitted yet: still refused, with its own fingerprint.
    let err = refused_start(&b_dir, &b_args);
    assert!(
        err.contains(&format!("store admit b --fingerprint {fp}")),
        "{err}"
    );
    // A wrong fingerprint: refused, nothing written.
    let wrong = "0000-1111-2222-3333-4444-5555-6666-7777";
    let (code, _, err) = store(&a_dir, &a_args, &["admit", "b", "--fingerprint", wrong]);
    assert_ne!(code, 0);
    assert!(err.contains(&fp) && err.contains(wrong), "{err}");
    let listed = store_ok(&a_dir, &a_args, &["keys"]);
    assert!(
        listed.contains("join requested") && listed.contains(&fp),
        "{listed}"
    );
    let out = store_ok(&a_dir, &a_args, &["admit", "b", "--fingerprint", &fp]);
    assert!(out.contains("admitted b"), "{out}");

    let b = start(&b_dir, &b_args);
    b.wait_for(10, "b to read a's Secret", || password(&b));
    assert_eq!(password(&b).as_deref(), Some(PASSWORD));
    assert!(!b_dir.join("secrets.key").exists());

    // Rotation on A: both take the new ring and re-seal; both still read.
    let out = store_ok(&a_dir, &a_args, &["rotate"]);
    assert!(
        out.contains("generation 2") && out.contains("key2, cluster1"),
        "{out}"
    );
    for x in [&a, &b] {
        x.wait_for(20, "everything re-sealed under key2", || {
            (by_key(x, "key2") >= Some(1) && by_key(x, "cluster1") == Some(0)).then_some(())
        });
        assert_eq!(password(x).as_deref(), Some(PASSWORD));
    }
    assert_eq!(sealed_with(&etcd, &secret_key), "key2");
    // A Secret B writes after the rotation: sealed with key2, read by A.
    let obj2 = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "from-b", "namespace": "default"}, "stringData": {"k": "v"}});
    let (code, v) = b.call("POST", "/api/v1/namespaces/default/secrets", Some(&obj2));
    assert_eq!(code, 201, "{v}");
    a.wait_for(10, "a to read b's Secret", || {
        (a.call("GET", "/api/v1/namespaces/default/secrets/from-b", None)
            .0
            == 200)
            .then_some(())
    });
    assert_eq!(
        sealed_with(
            &etcd,
            &format!("{prefix}objects/core/secrets/default/from-b")
        ),
        "key2"
    );

    // The old key goes once nothing is under it (the sealing marker, re-sealed by the
    // pass after the objects, may take another second).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let out = loop {
        let (code, out, err) = store(&a_dir, &a_args, &["rotate", "--drop-old"]);
        if code == 0 {
            break out;
        }
        assert!(err.contains("still under keys older than key2"), "{err}");
        assert!(std::time::Instant::now() < deadline, "{err}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        out.contains("generation 3") && out.contains("keys key2;"),
        "{out}"
    );
    for x in [&a, &b] {
        x.wait_for(10, "the keyring's generation 3", || {
            x.log()
                .lines()
                .any(|l| l.contains("keyring changed") && l.contains("generation=3"))
                .then_some(())
        });
        assert_eq!(password(x).as_deref(), Some(PASSWORD));
    }

    forged_ring_is_refused(&etcd, &prefix, b, &b_dir, &b_args);

    // A rotation wraps the keys only for public keys the keyring endorsed: b's record is
    // the forged one now, so it is refused, naming b; once b is removed, it goes on.
    let (code, _, err) = store(&a_dir, &a_args, &["rotate"]);
    assert_ne!(code, 0);
    assert!(err.contains("record for b is not endorsed"), "{err}");
    let (code, _, err) = store(&a_dir, &a_args, &["remove", "a"]);
    assert_ne!(code, 0);
    assert!(err.contains("this appliance"), "{err}");
    let out = store_ok(&a_dir, &a_args, &["remove", "b"]);
    assert!(out.contains("removed b"), "{out}");
    let out = store_ok(&a_dir, &a_args, &["rotate"]);
    assert!(
        out.contains("generation 4") && out.contains("wrapped for a;"),
        "{out}"
    );
    a.wait_for(10, "a to take generation 4", || {
        a.log()
            .lines()
            .any(|l| l.contains("keyring changed") && l.contains("generation=4"))
            .then_some(())
    });
    assert_eq!(password(&a).as_deref(), Some(PASSWORD));
    let listed = store_ok(&a_dir, &a_args, &["keys"]);
    assert!(!listed.lines().any(|l| l.starts_with("b\t")), "{listed}");
    // A restart takes the keys from etcd again (its pin agrees), no key file made.
    let mut a = a;
    a.stop();
    a.spawn();
    assert_eq!(password(&a).as_deref(), Some(PASSWORD));
    assert!(a.log().contains("keys from the cluster's keyring"));
    // `store migrate --to embedded` reads etcd with the keyring's keys and seals the
    // embedded store with the key file's.
    a.stop();
    let out = Command::new(bin())
        .args(["store", "migrate", "--to", "embedded", "--state-dir"])
        .arg(&a_dir)
        .args(&a_args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && err.contains("into the embedded store"),
        "{err}"
    );
    let sealer = bootplane::store::seal::Sealer::load(&a_dir.join("secrets.key")).unwrap();
    let embedded = bootplane::store::Store::open_with(&a_dir, sealer).unwrap();
    let secret = bootplane::model::registry::Registry::global()
        .resolve("secret")
        .unwrap();
    let got = embedded
        .get(&secret, Some("default"), "keyring-secret")
        .unwrap();
    let raw = base64::engine::general_purpose::STANDARD
        .decode(got["data"]["password"].as_str().unwrap())
        .unwrap();
    assert_eq!(raw, PASSWORD.as_bytes());
    embedded.close();
}

/// A ring of someone's own sealed to b's public key and put into etcd around bootplane
/// (a sealed box needs only the public key): the running b keeps its keys, and b
/// refuses to start with it (its pin).
fn forged_ring_is_refused(
    etcd: &EtcdCluster,
    prefix: &str,
    mut b: Bootplane,
    b_dir: &Path,
    b_args: &[String],
) {
    use bootplane::store::keyring::{parse_record, wrap, Ring};
    let key = format!("{prefix}keyring/members/b");
    let o = etcd.etcdctl(&["get", &key, "--print-value-only"]);
    assert!(o.status.success());
    let value = o.stdout.strip_suffix(b"\n").unwrap_or(&o.stdout).to_vec();
    let rec = parse_record(&value, "b").unwrap();
    let mut forged = Ring::first(vec![]).unwrap();
    forged.generation = 99;
    let bytes = wrap(&forged, "b", &rec.public_key);
    etcd.put(&key, std::str::from_utf8(&bytes).unwrap())
        .unwrap();
    b.wait_for(10, "b to refuse the forged ring", || {
        b.log().contains("shares no key").then_some(())
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(password(&b).as_deref(), Some(PASSWORD));
    assert_eq!(by_key(&b, "key1"), None, "the forged key is not b's");
    b.stop();
    let err = refused_start(b_dir, b_args);
    assert!(err.contains("shares no key"), "{err}");
}

/// A mirror opened with keys read before a rotation (an appliance starting while
/// another rotates) lists a value sealed with the new key: it reads its keyring
/// record again and lists again instead of refusing to start. At the library level,
/// so the order is forced: b's keys are read, then the rotation, then a re-seals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_reads_its_keyring_again_before_a_value_under_a_newer_key() {
    use bootplane::model::registry::Registry;
    use bootplane::store::etcd::{keyring as k, EtcdKv};
    use bootplane::store::settings::{BackendKind, EtcdConfig, StoreConfig};
    use bootplane::store::{Backend, Part, Store};
    let etcd = EtcdCluster::start(1);
    let prefix = format!("/bp-keyring-lib-{}/", std::process::id());
    let cfg = |name: &str| StoreConfig {
        backend: BackendKind::Etcd,
        etcd: EtcdConfig {
            endpoints: etcd.endpoints(),
            prefix: prefix.clone(),
            name: Some(name.into()),
            request_timeout_ms: 2_000,
            dial_timeout_ms: 500,
            ..EtcdConfig::default()
        },
        ..StoreConfig::default()
    };
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    k::keygen(&cfg("a"), da.path()).await.unwrap();
    let joined = k::join(&cfg("b"), db.path()).await.unwrap();
    assert!(!joined.already);
    k::admit(&cfg("a"), da.path(), "b", &joined.fingerprint)
        .await
        .unwrap();
    let a = Store::from_config(&cfg("a"), da.path()).await.unwrap();
    let secret = Registry::global().resolve("secret").unwrap();
    a.create(
        &secret,
        json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "s", "namespace": "default"},
            "stringData": {"password": PASSWORD}}),
    )
    .await
    .unwrap();
    // b's keys: generation 1.
    let (b_sealer, b_follower) = k::sealer_for(&cfg("b"), db.path()).await.unwrap();
    assert!(b_sealer.is_cluster() && b_follower.is_some());
    let r = k::rotate(&cfg("a"), da.path(), false).await.unwrap();
    assert_eq!((r.generation, r.keys[0].as_str()), (2, "key2"));
    // a takes generation 2; its writes are sealed with key2.
    let key = format!("{prefix}objects/core/secrets/default/s");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let cur = (*a.get(&secret, Some("default"), "s").unwrap()).clone();
        let mut upd = cur.clone();
        upd["metadata"]["labels"] = json!({"n": format!("{}", rand_label())});
        a.update(&secret, upd, Part::Main).await.unwrap();
        if sealed_with(&etcd, &key) == "key2" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "a never sealed with key2"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // b's mirror, with its generation-1 keys: the listing meets key2, b reads its
    // record again (generation 2) and lists again.
    let b = EtcdKv::open_keyed(&cfg("b").etcd, b_sealer.clone(), b_follower)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    let b = Store::with_backend(Backend::Etcd(b));
    let got = b.get(&secret, Some("default"), "s").unwrap();
    let raw = base64::engine::general_purpose::STANDARD
        .decode(got["data"]["password"].as_str().unwrap())
        .unwrap();
    assert_eq!(raw, PASSWORD.as_bytes());
    for s in [a, b] {
        tokio::task::spawn_blocking(move || s.close())
            .await
            .unwrap();
    }
}

fn rand_label() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}
