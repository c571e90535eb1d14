//! Export-policy enforcement with a real NFS server and real clients: bootplane's
//! ganesha backend runs nfs-ganesha + rpcbind inside a network namespace this test
//! creates; `nfs-cat`/`nfs-ls` (libnfs-utils) read the export from distinct loopback
//! source addresses. Needs root (netns, mount namespace).
//!
//! Client addresses: libnfs cannot bind a source address, so the namespace gets
//! `local 127.0.0.N/32 src 127.0.0.N` routes; a client connecting to 127.0.0.N then
//! has source address 127.0.0.N, which is what ganesha matches rules against.

use std::path::PathBuf;
use std::time::Duration;

use bootplane::nfs::ganesha::{Ganesha, GaneshaConfig};
use bootplane::nfs::{Access, ExportBackend, ExportRule, NfsError, Protocol};

use crate::support;
use support::netns::Netns;
use support::nfs::{assert_denied, nfs_client};
use support::process::must;
use support::require::require_tools;

fn require_nfs_tools() {
    require_tools(&[
        "ganesha.nfsd",
        "rpcbind",
        "nfs-cat",
        "nfs-ls",
        "ip",
        "unshare",
        "timeout",
    ]);
}

/// Run an NFS client inside the namespace; Ok(stdout) or Err(stderr).
fn client(ns: &Netns, tool: &str, url: &str) -> Result<String, String> {
    nfs_client(ns, tool, url).map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// ganesha's warnings and errors, for failure messages.
fn log_problems(g: &Ganesha) -> String {
    let text = std::fs::read_to_string(g.log_path()).unwrap_or_default();
    text.lines()
        .filter(|l| l.contains(":CRIT") || l.contains(":MAJ") || l.contains(":WARN"))
        .collect::<Vec<_>>()
        .join("\n")
}

struct Setup {
    ns: Netns,
    tmp: tempfile::TempDir,
    data: PathBuf,
    cfg: GaneshaConfig,
    g: Ganesha,
}

fn setup() -> Setup {
    require_nfs_tools();
    let ns = Netns::with_loopback_sources("nfs");
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("images");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("disk.img"), b"bootplane-image-bytes\n").unwrap();
    let cfg = GaneshaConfig {
        dir: Some(tmp.path().join("ganesha")),
        netns: Some(ns.name.clone()),
        ..Default::default()
    };
    let g = Ganesha::new(cfg.clone(), tmp.path()).unwrap();
    Setup {
        ns,
        data,
        cfg,
        g,
        tmp,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_grant_and_revoke_access_for_real_clients() {
    let s = setup();
    let t = tokio::time::timeout(Duration::from_secs(150), async {
        s.g.start().await.expect("starting ganesha");
        s.g.health().await.expect("healthy after start");
        s.g.ensure_export("/images/test", &s.data).await.unwrap();
        let v3 = |a: &str| format!("nfs://{a}/images/test/disk.img");
        let v3dir = |a: &str| format!("nfs://{a}/images/test");
        let v4 = |a: &str| format!("nfs://{a}/images/test/disk.img?version=4");

        // No rule yet: denied.
        assert_denied(
            client(&s.ns, "nfs-cat", &v3("127.0.0.2")),
            "nfs-cat before the rule",
        );
        assert_denied(
            client(&s.ns, "nfs-ls", &v3dir("127.0.0.2")),
            "nfs-ls before the rule",
        );

        // A read-only rule for 127.0.0.2 only.
        s.g.set_rules(
            "/images/test",
            vec![ExportRule::read_only(1, "127.0.0.2".parse().unwrap())],
        )
        .await
        .unwrap();
        assert_eq!(
            client(&s.ns, "nfs-cat", &v3("127.0.0.2")).expect("nfs-cat with the rule"),
            "bootplane-image-bytes\n"
        );
        let ls = client(&s.ns, "nfs-ls", &v3dir("127.0.0.2")).expect("nfs-ls with the rule");
        assert!(ls.contains("disk.img"), "{ls}");
        assert_eq!(
            client(&s.ns, "nfs-cat", &v4("127.0.0.2")).expect("NFSv4 read with the rule"),
            "bootplane-image-bytes\n"
        );
        // Other addresses still have no access.
        assert_denied(
            client(&s.ns, "nfs-cat", &v3("127.0.0.3")),
            "nfs-cat from an address without a rule",
        );
        assert!(
            client(&s.ns, "nfs-cat", &v4("127.0.0.3")).is_err(),
            "NFSv4 from an address without a rule"
        );

        // Rule order: an explicit deny for .3 before a /29 allow; .4 gets in via the network.
        s.g.set_rules(
            "/images/test",
            vec![
                ExportRule {
                    index: 1,
                    client: "127.0.0.3".parse().unwrap(),
                    access: Access::None,
                    protocols: vec![],
                    superuser: false,
                },
                ExportRule {
                    index: 2,
                    client: "127.0.0.0/29".parse().unwrap(),
                    access: Access::Ro,
                    protocols: vec![Protocol::Nfs3],
                    superuser: false,
                },
            ],
        )
        .await
        .unwrap();
        assert_denied(
            client(&s.ns, "nfs-cat", &v3("127.0.0.3")),
            "explicit deny before a broader allow",
        );
        assert_eq!(
            client(&s.ns, "nfs-cat", &v3("127.0.0.4")).expect("allowed by CIDR"),
            "bootplane-image-bytes\n"
        );
        assert!(
            client(&s.ns, "nfs-cat", &v4("127.0.0.4")).is_err(),
            "rule limited to NFSv3 must not allow NFSv4"
        );

        // Rule deleted: denied again, at once.
        s.g.set_rules("/images/test", vec![]).await.unwrap();
        assert_denied(
            client(&s.ns, "nfs-cat", &v3("127.0.0.2")),
            "nfs-cat after the rule was deleted",
        );
        assert_denied(
            client(&s.ns, "nfs-ls", &v3dir("127.0.0.4")),
            "nfs-ls after the rule was deleted",
        );

        // Export removed while a rule exists: gone for everyone.
        s.g.set_rules(
            "/images/test",
            vec![ExportRule::read_only(1, "127.0.0.2".parse().unwrap())],
        )
        .await
        .unwrap();
        client(&s.ns, "nfs-cat", &v3("127.0.0.2")).expect("re-granted");
        s.g.remove_export("/images/test").await.unwrap();
        assert!(
            client(&s.ns, "nfs-cat", &v3("127.0.0.2")).is_err(),
            "read after remove_export"
        );
        s.g.remove_export("/images/test").await.unwrap();
        assert!(matches!(
            s.g.set_rules("/images/test", vec![]).await,
            Err(NfsError::UnknownExport(_))
        ));

        // The server going away is reported with a reason.
        s.g.stop().await;
        let err = s.g.health().await.unwrap_err();
        assert!(
            matches!(err, NfsError::Down(_)) && err.to_string().contains("not running"),
            "{err}"
        );
    })
    .await;
    s.g.stop().await;
    t.expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_server_is_reported_and_restarted_on_next_change() {
    let s = setup();
    let t = tokio::time::timeout(Duration::from_secs(120), async {
        s.g.ensure_export("/images/k", &s.data).await.unwrap(); // starts ganesha
        s.g.set_rules(
            "/images/k",
            vec![ExportRule::read_only(1, "127.0.0.2".parse().unwrap())],
        )
        .await
        .unwrap();
        let url = "nfs://127.0.0.2/images/k/disk.img".to_string();
        client(&s.ns, "nfs-cat", &url).expect("read with rule");

        // Kill ganesha behind bootplane's back.
        let pid = std::fs::read_to_string(s.g.log_path().with_file_name("ganesha.pid")).unwrap();
        must("kill", &["-9", pid.trim()]);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let err = s.g.health().await.unwrap_err();
        assert!(err.to_string().contains("ganesha exited"), "{err}");
        assert!(client(&s.ns, "nfs-cat", &url).is_err(), "server is down");

        // The next change starts it again, with the persisted exports and new rules.
        s.g.set_rules(
            "/images/k",
            vec![ExportRule::read_only(1, "127.0.0.3".parse().unwrap())],
        )
        .await
        .unwrap();
        s.g.health().await.expect("restarted");
        let r = client(&s.ns, "nfs-cat", "nfs://127.0.0.3/images/k/disk.img");
        assert_eq!(
            r.unwrap_or_else(|e| panic!("read after restart: {e}; log: {}", log_problems(&s.g))),
            "bootplane-image-bytes\n"
        );
        assert_denied(
            client(&s.ns, "nfs-cat", &url),
            "old rule gone after restart",
        );
    })
    .await;
    s.g.stop().await;
    t.expect("test timed out");
}

/// bootplane killed without stopping ganesha (simulated by leaking the manager): a new
/// bootplane process finds the leftover server, replaces it, and restores the exports
/// and rules from its state dir; later changes apply to the new server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_replaces_leftover_server_and_restores_exports() {
    let Setup {
        ns,
        tmp,
        data,
        cfg,
        g,
    } = setup();
    let url = "nfs://127.0.0.2/images/r/disk.img".to_string();
    let result = tokio::time::timeout(Duration::from_secs(120), async {
        g.ensure_export("/images/r", &data).await.unwrap();
        g.set_rules(
            "/images/r",
            vec![ExportRule::read_only(1, "127.0.0.2".parse().unwrap())],
        )
        .await
        .unwrap();
        client(&ns, "nfs-cat", &url).expect("read with rule");
        let old_pid: i32 = std::fs::read_to_string(g.log_path().with_file_name("ganesha.pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        std::mem::forget(g); // "crash": nothing stops the old ganesha

        let g2 = Ganesha::new(cfg, tmp.path()).unwrap();
        assert!(
            g2.health().await.is_err(),
            "a new manager has not started anything yet"
        );
        g2.start()
            .await
            .expect("start replaces the leftover server");
        let stat = std::fs::read_to_string(format!("/proc/{old_pid}/stat")).unwrap_or_default();
        assert!(
            stat.is_empty() || stat.contains(") Z "),
            "old ganesha still running"
        );
        assert_eq!(
            client(&ns, "nfs-cat", &url).expect("rule restored"),
            "bootplane-image-bytes\n"
        );
        g2.set_rules("/images/r", vec![]).await.unwrap();
        assert_denied(client(&ns, "nfs-cat", &url), "revoked on the new server");
        g2.stop().await;
    })
    .await;
    drop(ns);
    result.expect("test timed out");
}

/// `supervise` restarts a ganesha that died (no rule change needed) and stops it on
/// shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn supervisor_restarts_a_dead_server_and_stops_on_shutdown() {
    let s = std::sync::Arc::new(setup());
    let url = "nfs://127.0.0.2/images/s/disk.img".to_string();
    let coord = bootplane::shutdown::Coordinator::new();
    let result = tokio::time::timeout(Duration::from_secs(120), async {
        s.g.ensure_export("/images/s", &s.data).await.unwrap();
        s.g.set_rules(
            "/images/s",
            vec![ExportRule::read_only(1, "127.0.0.2".parse().unwrap())],
        )
        .await
        .unwrap();
        let sup = {
            let (s, h) = (s.clone(), coord.handle());
            tokio::spawn(async move { s.g.run(h).await })
        };
        let pid_file = s.g.log_path().with_file_name("ganesha.pid");
        let old = std::fs::read_to_string(&pid_file).unwrap();
        must("kill", &["-9", old.trim()]);
        let start = std::time::Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let now = std::fs::read_to_string(&pid_file).unwrap_or_default();
            if s.g.health().await.is_ok() && now.trim() != old.trim() && !now.trim().is_empty() {
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "not restarted");
        }
        assert_eq!(
            client(&s.ns, "nfs-cat", &url).expect("served again"),
            "bootplane-image-bytes\n"
        );
        assert!(
            coord.drain(Duration::from_secs(15)).await,
            "supervisor did not stop"
        );
        sup.await.unwrap();
        assert!(s.g.health().await.is_err(), "stopped on shutdown");
        assert!(client(&s.ns, "nfs-cat", &url).is_err());
    })
    .await;
    s.g.stop().await;
    result.expect("test timed out");
}

/// Revoking a rule also stops a client that mounted while it had access: ganesha checks
/// the client's export permissions on each READ, not only at MOUNT. The client is held
/// mid-file by a pipe whose reader starts late, the rule is removed, then the rest of
/// the reads must fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revocation_stops_a_client_in_the_middle_of_a_file() {
    let s = setup();
    let size: u64 = 64 << 20;
    let f = std::fs::File::create(s.data.join("big.img")).unwrap();
    f.set_len(size).unwrap(); // sparse: reads as zeros
    drop(f);
    let result = tokio::time::timeout(Duration::from_secs(120), async {
        s.g.ensure_export("/images/big", &s.data).await.unwrap();
        s.g.set_rules(
            "/images/big",
            vec![ExportRule::read_only(1, "127.0.0.2".parse().unwrap())],
        )
        .await
        .unwrap();
        let script = format!(
            "set -o pipefail; timeout 60 ip netns exec {} nfs-cat nfs://127.0.0.2/images/big/big.img | (sleep 3; wc -c)",
            s.ns.name
        );
        let child = tokio::process::Command::new("bash")
            .args(["-c", &script])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        // Let the client mount and fill the pipe, then revoke.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        s.g.set_rules("/images/big", vec![]).await.unwrap();
        let out = child.wait_with_output().await.unwrap();
        let got: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(0);
        assert!(got > 0, "the client never read anything: {}", String::from_utf8_lossy(&out.stderr));
        assert!(
            got < size && !out.status.success(),
            "client read {got} of {size} bytes after its rule was removed (status {}, stderr {})",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    })
    .await;
    s.g.stop().await;
    result.expect("test timed out");
}
