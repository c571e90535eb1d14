//! The store on etcd (`[store] backend = "etcd"`), at the library level against real
//! Debian etcd members on loopback: the semantics the embedded engine has (compare-
//! and-swap, errors naming the key and revision, cascading deletion in one
//! transaction, watches in order from a revision, 410 for a revision before the
//! mirror), several appliances' mirrors on one cluster, fenced writes after a lost
//! leadership, 503 without quorum while reads go on, and `store migrate` both ways;
//! sealed values bound to their etcd key's version (an older value put back is not
//! served; values of before are re-sealed; a deleted key's first value put back is
//! refused; legacy values end with the cluster's marker) and plain `http://` refused
//! off loopback.

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bootplane::model::registry::{Registry, ResourceType};
use bootplane::store::backend::KvBackend as _;
use bootplane::store::etcd::election::Election;
use bootplane::store::etcd::EtcdKv;
use bootplane::store::seal::Sealer;
use bootplane::store::settings::EtcdConfig;
use bootplane::store::{Backend, Part, Store, StoreError};
use serde_json::{json, Value};
use support::etcd::EtcdCluster;

fn rt(name: &str) -> Arc<ResourceType> {
    Registry::global().resolve(name).unwrap()
}

/// The keys every store of this test binary seals Secrets with (one key file).
fn sealer() -> Sealer {
    static S: std::sync::OnceLock<(tempfile::TempDir, Sealer)> = std::sync::OnceLock::new();
    S.get_or_init(|| {
        let d = tempfile::tempdir().unwrap();
        let s = Sealer::load(&d.path().join("secrets.key")).unwrap();
        (d, s)
    })
    .1
    .clone()
}

fn cfg(c: &EtcdCluster, prefix: &str) -> EtcdConfig {
    EtcdConfig {
        endpoints: c.endpoints(),
        prefix: prefix.into(),
        request_timeout_ms: 2_000,
        dial_timeout_ms: 500,
        lease_ttl_secs: 3,
        name: Some("t".into()),
        ..EtcdConfig::default()
    }
}

async fn open(c: &EtcdCluster, prefix: &str) -> Store {
    Store::with_backend(Backend::Etcd(
        EtcdKv::open(&cfg(c, prefix), sealer()).await.unwrap(),
    ))
}

fn server(name: &str) -> Value {
    let mut s = support::api::server(name, json!({}), "Recycle");
    s.as_object_mut().unwrap().remove("status");
    s
}

/// Poll `f` until it is true or `secs` pass.
async fn until(secs: u64, what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_cas_and_errors_as_on_the_embedded_engine() {
    let c = EtcdCluster::start(1);
    let s = open(&c, "/t1/").await;
    let srv = rt("server");
    let o = s.create(&srv, server("a")).await.unwrap();
    let rv: u64 = o["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(rv > 0);
    // Read-your-writes: the mirror shows it as soon as create returned.
    assert_eq!(
        s.get(&srv, None, "a").unwrap()["metadata"]["resourceVersion"],
        o["metadata"]["resourceVersion"]
    );
    assert_eq!(
        s.get_text(&srv, None, "a").unwrap().as_ref(),
        o.to_string(),
        "the stored text is the returned object's"
    );
    let err = s.create(&srv, server("a")).await.unwrap_err();
    assert!(matches!(err, StoreError::AlreadyExists { .. }), "{err}");
    let mut stale = (*o).clone();
    let mut upd = (*o).clone();
    upd["spec"]["power"] = json!("On");
    let o2 = s.update(&srv, upd, Part::Main).await.unwrap();
    assert_eq!(o2["metadata"]["generation"], 2);
    assert_eq!(o2["metadata"]["uid"], o["metadata"]["uid"]);
    stale["spec"]["power"] = json!("Off");
    let err = s.update(&srv, stale, Part::Main).await.unwrap_err();
    assert!(matches!(err, StoreError::Conflict { .. }), "{err}");
    let mut st = (*o2).clone();
    st["status"] = json!({"state": "Available"});
    let o3 = s.update(&srv, st, Part::Status).await.unwrap();
    assert_eq!(o3["status"]["state"], "Available");
    // Cascading deletion: the claim's boot configuration goes in the same transaction.
    let claim = rt("serverclaim");
    let sbc = rt("sbc");
    let cl = s
        .create(
            &claim,
            json!({"metadata": {"name": "c"}, "spec": {"image": "i", "power": "On"}}),
        )
        .await
        .unwrap();
    let owner = json!([{"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "ServerClaim", "name": "c", "uid": cl["metadata"]["uid"]}]);
    s.create(&sbc, json!({"metadata": {"name": "c", "ownerReferences": owner}, "spec": {"serverRef": {"name": "a"}}}))
        .await
        .unwrap();
    let before = s.revision();
    s.delete(&claim, None, "c", None).await.unwrap();
    assert!(matches!(
        s.get(&claim, None, "c"),
        Err(StoreError::NotFound { .. })
    ));
    assert!(
        matches!(s.get(&sbc, None, "c"), Err(StoreError::NotFound { .. })),
        "cascaded"
    );
    assert_eq!(
        s.revision(),
        before + 1,
        "owner and dependent deleted in one revision"
    );
    let err = s.delete(&claim, None, "c", None).await.unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }), "{err}");
    s.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appliances_share_one_truth_watch_in_order_and_cas_has_one_winner() {
    let c = EtcdCluster::start(1);
    let a = open(&c, "/t2/").await;
    let b = open(&c, "/t2/").await;
    let srv = rt("server");
    let from = b.revision();
    let mut w = b.watch(&srv, None, from).unwrap();
    for i in 0..30 {
        a.create(&srv, server(&format!("s{i:02}"))).await.unwrap();
    }
    let mut names = Vec::new();
    while names.len() < 30 {
        let e = tokio::time::timeout(Duration::from_secs(5), w.next())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(e.kind, "ADDED");
        names.push(e.object["metadata"]["name"].as_str().unwrap().to_string());
    }
    let want: Vec<String> = (0..30).map(|i| format!("s{i:02}")).collect();
    assert_eq!(names, want, "every change once, in order");
    until(5, "b's mirror", || b.get(&srv, None, "s29").is_ok()).await;
    assert_eq!(
        a.list_text(&srv, None, None).0,
        b.list_text(&srv, None, None).0
    );
    // 32 writers on two appliances update the same version: one wins.
    let cur = a.get(&srv, None, "s00").unwrap();
    let mut tasks = Vec::new();
    for i in 0..32 {
        let s = if i % 2 == 0 { a.clone() } else { b.clone() };
        let (srv, mut o) = (srv.clone(), (*cur).clone());
        o["metadata"]["labels"] = json!({"writer": i.to_string()});
        tasks.push(tokio::spawn(async move {
            s.update(&srv, o, Part::Main).await.is_ok()
        }));
    }
    let mut wins = 0;
    for t in tasks {
        wins += t.await.unwrap() as usize;
    }
    assert_eq!(wins, 1);
    // A watch from before the mirror's listing has no history: 410, re-list.
    let late = open(&c, "/t2/").await;
    let err = late
        .watch(&srv, None, from)
        .err()
        .expect("a revision before the listing");
    assert!(matches!(err, StoreError::Gone(_)), "{err}");
    for s in [a, b, late] {
        s.close();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_lost_its_lease_cannot_write() {
    let c = EtcdCluster::start(1);
    let s = open(&c, "/t3/").await;
    let Backend::Etcd(kv) = s.kv().clone() else {
        unreachable!()
    };
    let cfg = cfg(&c, "/t3/");
    let e1 = Election::new(kv.client().clone(), &cfg, "metal");
    let stop = tokio_util::sync::CancellationToken::new();
    let l1 = e1.campaign(&stop).await.unwrap();
    let fenced = s.fenced(l1.fence.clone());
    let srv = rt("server");
    fenced.create(&srv, server("x")).await.unwrap();
    // A second candidate waits while the first leads.
    let e2 = Election::new(kv.client().clone(), &cfg, "metal");
    let second = tokio::spawn(async move {
        let stop = tokio_util::sync::CancellationToken::new();
        e2.campaign(&stop).await.map(|l| l.fence)
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!second.is_finished(), "one leader at a time");
    // The first leader's lease ends (as when it is paused past its TTL).
    l1.resign().await;
    let f2 = tokio::time::timeout(Duration::from_secs(5), second)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let err = fenced.create(&srv, server("y")).await.unwrap_err();
    assert!(
        matches!(err, StoreError::Unavailable(ref m) if m.contains("no longer the leader")),
        "{err}"
    );
    assert!(s.get(&srv, None, "y").is_err(), "nothing written");
    s.fenced(f2).create(&srv, server("y")).await.unwrap();
    s.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_quorum_writes_get_unavailable_reads_go_on_and_it_recovers() {
    let mut c = EtcdCluster::start(3);
    let s = open(&c, "/t4/").await;
    let srv = rt("server");
    s.create(&srv, server("a")).await.unwrap();
    // Followers go first: killing etcd's leader holds writes for an election (a write
    // in flight then may time out, as docs/cluster.md says), which is not this test.
    let leader = c.leader().expect("an etcd leader");
    let followers: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    c.kill(followers[0]);
    s.create(&srv, server("b"))
        .await
        .expect("one member down: no effect");
    c.kill(followers[1]);
    let t = Instant::now();
    let err = s.create(&srv, server("c")).await.unwrap_err();
    println!(
        "write without quorum refused after {:?}: {err}",
        t.elapsed()
    );
    // Refused before it was sent (no member with a leader took it: 503, nothing
    // written), or sent to etcd's leader, which still held it when the time ran out
    // (504: it may apply once the quorum is back, and the error says to read again).
    match &err {
        StoreError::Unavailable(_) => {
            assert!(err.to_string().starts_with("store unavailable"), "{err}")
        }
        StoreError::OutcomeUnknown(_) => {
            assert!(
                err.to_string().contains("read it again before retrying"),
                "{err}"
            )
        }
        e => panic!("{e}"),
    }
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "bounded by the request timeout"
    );
    assert!(
        s.get(&srv, None, "a").is_ok() && s.get(&srv, None, "b").is_ok(),
        "reads go on"
    );
    c.restart(followers[0]);
    c.restart(followers[1]);
    let t = Instant::now();
    loop {
        match s.create(&srv, server("c")).await {
            Ok(_) => break,
            Err(StoreError::Unavailable(_))
            | Err(StoreError::OutcomeUnknown(_))
            | Err(StoreError::AlreadyExists { .. })
                if t.elapsed() < Duration::from_secs(30) =>
            {
                if s.get(&srv, None, "c").is_ok() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(e) => panic!("{e}"),
        }
    }
    println!(
        "writes accepted again {:?} after the members restarted",
        t.elapsed()
    );
    // The mirror followed: a write through a second appliance shows up here.
    let other = open(&c, "/t4/").await;
    other.create(&srv, server("d")).await.unwrap();
    until(10, "the first mirror to resume", || {
        s.get(&srv, None, "d").is_ok()
    })
    .await;
    s.close();
    other.close();
}

/// A follower killed while the appliance holds a connection to it: writes sent on that
/// connection before the client notices (broken pipe, connection reset) go to another
/// member; none fails. Each round kills one follower and at once sends 32 creates side
/// by side, so some are written into the dead member's socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_sent_to_a_member_as_it_dies_go_to_another() {
    let mut c = EtcdCluster::start(3);
    let s = open(&c, "/t9/").await;
    let srv = rt("server");
    let mut n = 0;
    for round in 0..12 {
        // Every member's connection in use before the kill.
        for _ in 0..6 {
            n += 1;
            s.create(&srv, server(&format!("w{n}"))).await.unwrap();
        }
        let leader = c.leader().expect("an etcd leader");
        let f = (0..3).find(|i| *i != leader).unwrap();
        c.kill(f);
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..32 {
            n += 1;
            let (s, srv, name) = (s.clone(), srv.clone(), format!("w{n}"));
            set.spawn(async move { s.create(&srv, server(&name)).await.map(|_| ()) });
        }
        while let Some(r) = set.join_next().await {
            if let Err(e) = r.unwrap() {
                panic!("round {round}: a write failed with one member of three down: {e}");
            }
        }
        c.restart(f);
        until(30, "the member back", || c.leader().is_some()).await;
    }
    s.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_into_etcd_and_back_keeps_every_object() {
    let c = EtcdCluster::start(1);
    let dir = tempfile::tempdir().unwrap();
    let embedded = Store::open(&dir.path().join("a")).unwrap();
    let srv = rt("server");
    let secret = rt("secret");
    for i in 0..250 {
        embedded
            .create(&srv, server(&format!("m{i:03}")))
            .await
            .unwrap();
    }
    embedded
        .create(
            &secret,
            json!({"metadata": {"name": "s", "namespace": "default"}, "data": {"k": "dg=="}}),
        )
        .await
        .unwrap();
    let etcd = open(&c, "/t5/").await;
    let n = bootplane::store::migrate::migrate(&embedded, &etcd)
        .await
        .unwrap();
    assert_eq!(n, 251);
    let strip = |s: &Store| -> Vec<Value> {
        let mut out = Vec::new();
        for t in [&srv, &secret] {
            for o in s.list(t, None, None).0 {
                let mut o = (*o).clone();
                o["metadata"]
                    .as_object_mut()
                    .unwrap()
                    .remove("resourceVersion");
                out.push(o);
            }
        }
        out
    };
    let want = strip(&embedded);
    assert_eq!(strip(&etcd), want, "uids, timestamps and bodies kept");
    let err = bootplane::store::migrate::migrate(&embedded, &etcd)
        .await
        .unwrap_err();
    assert!(format!("{err:#}").contains("never merges"), "{err:#}");
    let back = Store::open(&dir.path().join("b")).unwrap();
    bootplane::store::migrate::migrate(&etcd, &back)
        .await
        .unwrap();
    assert_eq!(strip(&back), want);
    for s in [embedded, etcd, back] {
        tokio::task::spawn_blocking(move || s.close())
            .await
            .unwrap();
    }
}

/// `openssl` with `args` in `dir`; panics with its output on failure.
fn openssl(dir: &std::path::Path, args: &[&str]) {
    let out = support::process::run_cmd(
        std::process::Command::new("openssl")
            .current_dir(dir)
            .args(args),
        60,
    );
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA (`{name}-ca.pem`) and a certificate it signed for `cn` (`{name}-{cn}.pem`/.key).
fn ca(dir: &std::path::Path, name: &str) {
    let subj = format!("/CN={name}-ca");
    let (key, pem) = (format!("{name}-ca.key"), format!("{name}-ca.pem"));
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &subj,
            "-keyout",
            &key,
            "-out",
            &pem,
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
}

fn signed(dir: &std::path::Path, ca_name: &str, cn: &str, usage: &str) {
    let ext = format!("{cn}.ext");
    std::fs::write(
        dir.join(&ext),
        format!(
            "basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1\nextendedKeyUsage={usage}\n"
        ),
    )
    .unwrap();
    let (key, csr, pem) = (
        format!("{cn}.key"),
        format!("{cn}.csr"),
        format!("{cn}.pem"),
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            &format!("/CN={cn}"),
            "-keyout",
            &key,
            "-out",
            &csr,
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &format!("{ca_name}-ca.pem"),
            "-CAkey",
            &format!("{ca_name}-ca.key"),
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            &pem,
            "-extfile",
            &ext,
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_over_tls_with_a_client_certificate() {
    support::require::require("openssl");
    support::require::require("etcd");
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    ca(dir, "good");
    ca(dir, "other");
    signed(dir, "good", "server", "serverAuth");
    signed(dir, "good", "client", "clientAuth");
    signed(dir, "other", "stranger", "clientAuth");
    let ports = support::etcd::free_ports(2);
    let url = format!("https://127.0.0.1:{}", ports[0]);
    let peer = format!("http://127.0.0.1:{}", ports[1]);
    let mut cmd = std::process::Command::new("etcd");
    cmd.current_dir(dir)
        .args(["--name", "tls", "--data-dir", "data"])
        .args([
            "--listen-client-urls",
            &url,
            "--advertise-client-urls",
            &url,
        ])
        .args([
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
        ])
        .args(["--initial-cluster", &format!("tls={peer}")])
        .args(["--cert-file", "server.pem", "--key-file", "server.key"])
        .args(["--trusted-ca-file", "good-ca.pem", "--client-cert-auth"])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.join("etcd.log")).unwrap());
    let _etcd = support::process::Proc::spawn(cmd);
    let base = EtcdConfig {
        endpoints: vec![url.clone()],
        prefix: "/tls/".into(),
        request_timeout_ms: 2_000,
        dial_timeout_ms: 1_000,
        ca_file: Some(dir.join("good-ca.pem")),
        cert_file: Some(dir.join("client.pem")),
        key_file: Some(dir.join("client.key")),
        ..EtcdConfig::default()
    };
    base.validate().unwrap();
    // The member takes a moment to start: retry the good configuration.
    let t = Instant::now();
    let kv = loop {
        match EtcdKv::open(&base, sealer()).await {
            Ok(kv) => break kv,
            Err(e) if t.elapsed() < Duration::from_secs(20) => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(e) => panic!("{e:#}\n{}", support::process::read(&dir.join("etcd.log"))),
        }
    };
    let s = Store::with_backend(Backend::Etcd(kv));
    s.create(&rt("server"), server("tls")).await.unwrap();
    assert!(s.get(&rt("server"), None, "tls").is_ok());
    s.close();
    // No client certificate, a certificate of another CA, or a wrong CA: refused.
    let refusals = [
        EtcdConfig {
            cert_file: None,
            key_file: None,
            ..base.clone()
        },
        EtcdConfig {
            cert_file: Some(dir.join("stranger.pem")),
            key_file: Some(dir.join("stranger.key")),
            ..base.clone()
        },
        EtcdConfig {
            ca_file: Some(dir.join("other-ca.pem")),
            ..base.clone()
        },
    ];
    for (i, c) in refusals.iter().enumerate() {
        let err = EtcdKv::open(c, sealer())
            .await
            .err()
            .unwrap_or_else(|| panic!("case {i} was accepted"));
        let msg = format!("{err:#}");
        assert!(
            msg.contains("listing /tls/objects from etcd"),
            "case {i}: {msg}"
        );
    }
    // A missing key file is a configuration error named as such.
    let err = EtcdKv::open(
        &EtcdConfig {
            key_file: Some(dir.join("nope.key")),
            ..base.clone()
        },
        sealer(),
    )
    .await
    .err()
    .unwrap();
    assert!(
        format!("{err:#}").contains("store.etcd.key_file"),
        "{err:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_behind_a_compaction_lists_again_and_its_watchers_relist() {
    let mut c = EtcdCluster::start(3);
    let eps = c.endpoints();
    // This appliance reaches member 0 only; the other, members 1 and 2.
    let s = Store::with_backend(Backend::Etcd(
        EtcdKv::open(
            &EtcdConfig {
                endpoints: vec![eps[0].clone()],
                ..cfg(&c, "/t6/")
            },
            sealer(),
        )
        .await
        .unwrap(),
    ));
    let other = Store::with_backend(Backend::Etcd(
        EtcdKv::open(
            &EtcdConfig {
                endpoints: eps[1..].to_vec(),
                ..cfg(&c, "/t6/")
            },
            sealer(),
        )
        .await
        .unwrap(),
    ));
    let srv = rt("server");
    s.create(&srv, server("a")).await.unwrap();
    let mut w = s.watch(&srv, None, s.revision()).unwrap();
    c.kill(0);
    // Member 0 may have been etcd's leader: writes get Unavailable until the other two
    // have elected one (a client retries a 503; what is tested here is the compaction).
    for i in 0..10 {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match other.create(&srv, server(&format!("b{i}"))).await {
                Ok(_) => break,
                Err(StoreError::Unavailable(m) | StoreError::OutcomeUnknown(m))
                    if Instant::now() < deadline =>
                {
                    eprintln!("b{i}: {m}; again");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                // A create retried after a timeout may have been applied the first time.
                Err(StoreError::AlreadyExists { .. }) => break,
                Err(e) => panic!("b{i}: {e}"),
            }
        }
    }
    // Compact the whole history: the cut-off mirror cannot resume where it stopped.
    let Backend::Etcd(kv) = other.kv().clone() else {
        unreachable!()
    };
    let mut client = kv.client().clone();
    let rev = client
        .get("/", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    client.compact(rev, None).await.unwrap();
    c.restart(0);
    until(30, "the mirror to list again", || {
        s.get(&srv, None, "b9").is_ok()
    })
    .await;
    assert_eq!(
        s.list_text(&srv, None, None).0,
        other.list_text(&srv, None, None).0
    );
    // Its local watcher missed history it can no longer replay: 410, re-list.
    let e = tokio::time::timeout(Duration::from_secs(5), w.next())
        .await
        .unwrap();
    assert!(
        matches!(e, Err(StoreError::Gone(_))),
        "{:?}",
        e.map(|e| e.kind)
    );
    // And it follows again from the new listing.
    let mut w = s.watch(&srv, None, s.revision()).unwrap();
    other.create(&srv, server("c")).await.unwrap();
    let e = tokio::time::timeout(Duration::from_secs(5), w.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(e.object["metadata"]["name"], "c");
    s.close();
    other.close();
}

#[test]
fn bootplane_store_migrate_copies_a_state_dir_into_etcd_once() {
    let c = EtcdCluster::start(1);
    let dir = tempfile::tempdir().unwrap();
    let rt_ = tokio::runtime::Runtime::new().unwrap();
    rt_.block_on(async {
        let s = Store::open(dir.path()).unwrap();
        for i in 0..5 {
            s.create(&rt("server"), server(&format!("m{i}")))
                .await
                .unwrap();
        }
        tokio::task::spawn_blocking(move || s.close())
            .await
            .unwrap();
    });
    let migrate = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_bootplane"))
            .args(["store", "migrate", "--to", "etcd", "--state-dir"])
            .arg(dir.path())
            .args([
                "--set",
                &format!("store.etcd.endpoints={:?}", c.endpoints()),
            ])
            .args(["--set", "store.etcd.prefix=\"/t7/\""])
            .env("BOOTPLANE_LOG", "warn")
            .output()
            .unwrap()
    };
    let out = migrate();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("copied 5 objects into etcd"), "{err}");
    rt_.block_on(async {
        let e = open(&c, "/t7/").await;
        assert_eq!(e.list(&rt("server"), None, None).0.count(), 5);
        e.close();
    });
    let again = migrate();
    let err = String::from_utf8_lossy(&again.stderr);
    assert_eq!(again.status.code(), Some(1), "{err}");
    assert!(err.contains("never merges"), "{err}");
}

fn secret(name: &str, password: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret",
           "metadata": {"name": name, "namespace": "default"},
           "stringData": {"password": password}})
}

/// The password a Secret holds, as `store` serves it.
fn password(store: &Store, name: &str) -> Option<String> {
    use base64::Engine as _;
    let s = store.get(&rt("secret"), Some("default"), name).ok()?;
    let b = base64::engine::general_purpose::STANDARD
        .decode(s["data"]["password"].as_str()?)
        .ok()?;
    String::from_utf8(b).ok()
}

/// The bytes etcd holds at `key`.
async fn raw(client: &mut etcd_client::Client, key: &str) -> Vec<u8> {
    let r = client.get(key, None).await.unwrap();
    r.kvs()[0].value().to_vec()
}

/// A Secret's value sealed as appliances of before sealed it (bound to its key only):
/// the embedded engine's envelope, read out of its redb file.
async fn v1_value(name: &str, password: &str) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open_with(dir.path(), sealer()).unwrap();
    s.create(&rt("secret"), secret(name, password))
        .await
        .unwrap();
    tokio::task::spawn_blocking(move || s.close())
        .await
        .unwrap();
    use redb::ReadableDatabase as _;
    let db = redb::Database::open(dir.path().join("store.redb")).unwrap();
    let r = db.begin_read().unwrap();
    let t = r
        .open_table(redb::TableDefinition::<&str, &[u8]>::new("kv"))
        .unwrap();
    let rec = t
        .get(format!("/core/secrets/default/{name}").as_str())
        .unwrap()
        .unwrap();
    let v1 = rec.value()[16..].to_vec();
    assert!(v1.starts_with(b"bootplane:enc:xchacha20poly1305:v1:"));
    v1
}

/// `etcdctl put KEY` with `value` (bytes, which an argument cannot hold) on its
/// standard input.
fn etcdctl_put(c: &EtcdCluster, key: &str, value: &[u8]) {
    use std::io::Write as _;
    let mut child = std::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", c.endpoints_csv()))
        .args(["--dial-timeout=1s", "--command-timeout=2s", "put", key])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("etcdctl");
    child.stdin.take().unwrap().write_all(value).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// The etcd key's (mod revision, version).
async fn stat(client: &mut etcd_client::Client, key: &str) -> (u64, i64) {
    let r = client.get(key, None).await.unwrap();
    (r.kvs()[0].mod_revision() as u64, r.kvs()[0].version())
}

/// Issue 32 item 6: a create is bound to its real create revision, so a deleted
/// Secret's first value put back (`etcdctl del`, `etcdctl put` of the old ciphertext,
/// which etcd gives version 1 again) is refused, not served; a create that lands at
/// another revision than it was sealed for (a write elsewhere in etcd in between) is
/// rewritten bound at once and served. Legacy values (`v1`) open until the rotation pass has
/// re-sealed them all and written the cluster's marker; put back after it: refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_value_put_back_after_delete_is_refused_and_the_marker_ends_legacy_values() {
    let c = EtcdCluster::start(1);
    let mut client = etcd_client::Client::connect(c.endpoints(), None)
        .await
        .unwrap();
    let legacy = v1_value("old", "legacy").await;
    let old_key = "/t9/objects/core/secrets/default/old";
    client.put(old_key, legacy.clone(), None).await.unwrap();
    let s = open(&c, "/t9/").await;
    let kv = match s.kv() {
        Backend::Etcd(kv) => kv.clone(),
        _ => unreachable!(),
    };
    assert_eq!(password(&s, "old").as_deref(), Some("legacy"));

    // The first value of a Secret, put back after a delete.
    let key = "/t9/objects/core/secrets/default/s";
    s.create(&rt("secret"), secret("s", "one")).await.unwrap();
    let first = raw(&mut client, key).await;
    assert_eq!(
        stat(&mut client, key).await.1,
        1,
        "guessed right: one write"
    );
    let mut upd = (*s.get(&rt("secret"), Some("default"), "s").unwrap()).clone();
    upd["stringData"] = json!({"password": "two"});
    s.update(&rt("secret"), upd, Part::Main).await.unwrap();
    let o = c.etcdctl(&["del", key]);
    assert!(o.status.success(), "{o:?}");
    etcdctl_put(&c, key, &first);
    let (rev, version) = stat(&mut client, key).await;
    assert_eq!(version, 1, "etcd gives the re-created key version 1 again");
    until(5, "the mirror past the put", || s.revision() >= rev).await;
    assert_eq!(password(&s, "s"), None, "the first value was served again");
    let late = open(&c, "/t9/").await;
    assert_eq!(password(&late, "s"), None);
    late.close();

    // Writes elsewhere in etcd all the time: some creates land at another revision
    // than the one they were sealed for, and are bound again at once; all are served.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (mut client, stop) = (client.clone(), stop.clone());
        tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                i += 1;
                let k = format!("/elsewhere/{}", i % 8);
                client.put(k, "x", None).await.unwrap();
            }
        })
    };
    let mut rebound = 0;
    let mut made = Vec::new();
    for i in 0..150 {
        let n = format!("m{i}");
        s.create(&rt("secret"), secret(&n, &n)).await.unwrap();
        let key = format!("/t9/objects/core/secrets/default/{n}");
        rebound += usize::from(stat(&mut client, &key).await.1 == 2);
        made.push(n);
        if rebound >= 2 {
            break;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.await.unwrap();
    assert!(
        rebound >= 1,
        "no create raced a write elsewhere in {} tries",
        made.len()
    );
    let late = open(&c, "/t9/").await;
    for n in &made {
        assert_eq!(password(&s, n).as_deref(), Some(n.as_str()));
        assert_eq!(password(&late, n).as_deref(), Some(n.as_str()));
    }
    late.close();

    // Legacy values: no marker while one is left; re-sealed, then the marker.
    assert!(!kv.settle_sealing().await.unwrap());
    assert!(!kv.sealing().strict());
    assert_eq!(s.reseal(10).await.unwrap().rewritten, 1);
    assert!(kv.settle_sealing().await.unwrap());
    assert!(kv.sealing().strict());
    assert!(!kv.settle_sealing().await.unwrap(), "written once");
    let mut o = (*s.get(&rt("secret"), Some("default"), "old").unwrap()).clone();
    o["stringData"] = json!({"password": "current"});
    s.update(&rt("secret"), o, Part::Main).await.unwrap();
    // The legacy value put back: refused by this mirror and by a new one.
    etcdctl_put(&c, old_key, &legacy);
    let (rev, _) = stat(&mut client, old_key).await;
    until(5, "the mirror past the put", || s.revision() >= rev).await;
    assert_eq!(password(&s, "old").as_deref(), Some("current"));
    let late = open(&c, "/t9/").await;
    assert_eq!(
        password(&late, "old"),
        None,
        "a legacy value served after the marker"
    );
    let late_kv = match late.kv() {
        Backend::Etcd(kv) => kv.clone(),
        _ => unreachable!(),
    };
    assert!(late_kv.sealing().strict(), "the marker read at listing");
    assert_eq!(password(&late, "m0").as_deref(), Some("m0"));
    for x in [s, late] {
        x.close();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_value_put_back_is_not_served_and_values_of_before_are_resealed() {
    let c = EtcdCluster::start(1);
    let mut client = etcd_client::Client::connect(c.endpoints(), None)
        .await
        .unwrap();
    let v1 = v1_value("old", "first").await;
    let old_key = "/t8/objects/core/secrets/default/old";
    client.put(old_key, v1, None).await.unwrap();
    // It opens; it counts as stale (`@v1`) and one reseal pass rewrites it bound.
    let s = open(&c, "/t8/").await;
    assert_eq!(password(&s, "old").as_deref(), Some("first"));
    let counts = s.kv().sealing().ledger.counts();
    assert!(counts.keys().any(|k| k.ends_with("@v1")), "{counts:?}");
    assert_eq!(s.reseal(10).await.unwrap().rewritten, 1);
    assert!(raw(&mut client, old_key)
        .await
        .starts_with(b"bootplane:enc:xchacha20poly1305:v2:"));
    assert!(!s
        .kv()
        .sealing()
        .ledger
        .counts()
        .keys()
        .any(|k| k.ends_with("@v1")));
    assert_eq!(password(&s, "old").as_deref(), Some("first"));

    // A Secret created, then changed; its first value put back around bootplane.
    let key = "/t8/objects/core/secrets/default/s";
    s.create(&rt("secret"), secret("s", "one")).await.unwrap();
    let first = raw(&mut client, key).await;
    let mut upd = (*s.get(&rt("secret"), Some("default"), "s").unwrap()).clone();
    upd["stringData"] = json!({"password": "two"});
    s.update(&rt("secret"), upd, Part::Main).await.unwrap();
    let other = open(&c, "/t8/").await;
    let put = client.put(key, first, None).await.unwrap();
    let rev = put.header().unwrap().revision() as u64;
    until(5, "both mirrors past the put", || {
        s.revision() >= rev && other.revision() >= rev
    })
    .await;
    // Not served: each mirror keeps the value it had.
    assert_eq!(password(&s, "s").as_deref(), Some("two"));
    assert_eq!(password(&other, "s").as_deref(), Some("two"));
    // An appliance listing now leaves it out (and starts).
    let late = open(&c, "/t8/").await;
    assert_eq!(password(&late, "s"), None);
    assert_eq!(password(&late, "old").as_deref(), Some("first"));
    // Writes through bootplane of the other objects go on, bound each time.
    for p in ["a", "b"] {
        let mut o = (*s.get(&rt("secret"), Some("default"), "old").unwrap()).clone();
        o["stringData"] = json!({"password": p});
        s.update(&rt("secret"), o, Part::Main).await.unwrap();
        until(5, "the late mirror reads it", || {
            password(&late, "old").as_deref() == Some(p)
        })
        .await;
    }
    for x in [s, other, late] {
        x.close();
    }
}

#[test]
fn plain_http_etcd_is_refused_off_loopback_and_schemes_do_not_mix() {
    let dir = tempfile::tempdir().unwrap();
    let run = |cmd: &str, endpoints: &str, extra: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_bootplane"))
            .args([cmd, "--state-dir"])
            .arg(dir.path())
            .args(["--set", "store.backend=\"etcd\""])
            .args(["--set", &format!("store.etcd.endpoints={endpoints}")])
            .args(["--set", "store.etcd.ca_file=\"/nonexistent/ca.pem\""])
            .args(extra)
            .env("BOOTPLANE_LOG", "warn")
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for cmd in ["check-config", "serve"] {
        let (ok, err) = run(cmd, r#"["http://10.0.0.11:2379"]"#, &[]);
        assert!(!ok, "{cmd}: {err}");
        assert!(
            err.contains("http://10.0.0.11:2379")
                && err.contains("not loopback")
                && err.contains("allow_plaintext"),
            "{cmd}: {err}"
        );
    }
    let (ok, err) = run(
        "check-config",
        r#"["https://10.0.0.11:2379", "http://127.0.0.1:2379"]"#,
        &[],
    );
    assert!(!ok && err.contains("mixes http:// and https://"), "{err}");
    let (ok, err) = run(
        "check-config",
        r#"["https://10.0.0.11:2379", "http://10.0.0.12:2379"]"#,
        &["--set", "store.etcd.allow_plaintext=true"],
    );
    assert!(!ok && err.contains("mixes"), "{err}");
    // Loopback, or explicitly allowed: accepted.
    for (eps, extra) in [
        (r#"["http://127.0.0.1:2379"]"#, &[][..]),
        (
            r#"["http://10.0.0.11:2379"]"#,
            &["--set", "store.etcd.allow_plaintext=true"][..],
        ),
    ] {
        let (ok, err) = run("check-config", eps, extra);
        assert!(ok, "{eps}: {err}");
    }
}
