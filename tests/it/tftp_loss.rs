//! Packet loss: the server and real clients run inside a fresh network namespace
//! whose loopback drops 5% or 20% of all UDP packets, both directions; transfers must
//! still complete byte-identical.
//!
//! Loss comes from `tc qdisc ... netem loss` when the kernel has sch_netem; kernels
//! built without it (this project's CI VMs: `CONFIG_NET_SCH_NETEM` is not set) get
//! the same random drop from an nftables rule in the namespace (`numgen random mod
//! 100 < N drop` on the input hook, which every loopback packet crosses once; dropping
//! on output would instead fail the sender's sendto with EPERM, which real loss never does).

use crate::support;

use std::time::Duration;

use bootplane::tftp::TftpConfig;
use support::data::*;
use support::netns::Netns;
use support::require::require;
use support::tftp::*;

const LIMIT: Duration = Duration::from_secs(150);

/// Drop `percent`% of UDP packets inside `ns`; returns which mechanism did it.
fn add_loss(ns: &Netns, percent: u32) -> &'static str {
    let netem = ns
        .cmd("tc")
        .args([
            "qdisc",
            "add",
            "dev",
            "lo",
            "root",
            "netem",
            "loss",
            &format!("{percent}%"),
        ])
        .output()
        .unwrap();
    if netem.status.success() {
        return "netem";
    }
    let err = String::from_utf8_lossy(&netem.stderr);
    assert!(
        err.contains("qdisc kind is unknown"),
        "tc netem failed: {err}"
    );
    require("nft");
    ns.exec(&["nft", "add", "table", "inet", "bploss"]);
    ns.exec(&[
        "nft",
        "add",
        "chain",
        "inet",
        "bploss",
        "out",
        "{ type filter hook input priority 0 ; policy accept ; }",
    ]);
    let n = percent.to_string();
    ns.exec(&[
        "nft", "add", "rule", "inet", "bploss", "out", "meta", "l4proto", "udp", "numgen",
        "random", "mod", "100", "<", &n, "drop",
    ]);
    "nftables"
}

fn lossy(percent: u32) -> (tempfile::TempDir, Netns, TestServer) {
    require("tc");
    require("ip");
    let d = tmpdir();
    let root = d.path().join("root");
    std::fs::create_dir(&root).unwrap();
    write_files(
        &root,
        &[("f300k", 300_000), ("f1m", 1 << 20), ("f513", 513)],
    );
    let ns = Netns::new("loss");
    let how = add_loss(&ns, percent);
    eprintln!("{percent}% loss via {how} in {}", ns.name);
    let cfg = TftpConfig {
        retransmit_min_ms: 20,
        retransmit_initial_ms: 100,
        max_retries: 10,
        ..TftpConfig::default()
    };
    let srv = start_server("127.0.0.1:0", &root, cfg, Some(&ns.name));
    (d, ns, srv)
}

fn fetch_all(percent: u32, files: &[&str]) {
    require("tftp");
    require("atftp");
    let (d, ns, srv) = lossy(percent);
    let root = d.path().join("root");
    let port = srv.addr.port().to_string();
    for name in files {
        // tftp-hpa: lockstep, no options, retransmits its ACK every second
        let out = d.path().join(format!("hpa-{name}"));
        let mut c = ns.cmd("sh");
        c.args(["-c", &format!("printf 'mode binary\\nrexmt 1\\ntimeout 60\\nget {name} {}\\nquit\\n' | tftp 127.0.0.1 {port}", out.display())]);
        let r = run_client(&mut c, LIMIT);
        assert!(
            r.ok && out.exists(),
            "tftp-hpa {name} at {percent}%: {} {}",
            r.stdout,
            r.stderr
        );
        assert_eq!(
            sha256_file(&out),
            sha256_file(&root.join(name)),
            "tftp-hpa {name} at {percent}% loss"
        );

        // atftp: blksize + windowsize (go-back-N on loss). atftp 0.8 aborts with
        // "unexpected OACK" when its ACK 0 is lost and the server (correctly, RFC 2347)
        // retransmits the OACK; that client limitation gets a fresh attempt, anything
        // else (a wrong byte, another error) fails the test.
        let out = d.path().join(format!("at-{name}"));
        let mut attempts = 0;
        loop {
            attempts += 1;
            let _ = std::fs::remove_file(&out);
            let mut c = ns.cmd("atftp");
            c.args([
                "--tftp-timeout",
                "1",
                "-g",
                "-r",
                name,
                "-l",
                out.to_str().unwrap(),
                "--option",
                "blksize 1428",
                "--option",
                "windowsize 8",
                "127.0.0.1",
                &port,
            ]);
            let r = run_client(&mut c, LIMIT);
            if r.ok {
                assert_eq!(
                    sha256_file(&out),
                    sha256_file(&root.join(name)),
                    "atftp {name} at {percent}% loss"
                );
                break;
            }
            assert!(
                r.stderr.contains("unexpected OACK") && attempts < 8,
                "atftp {name} at {percent}% (attempt {attempts}): {} {}",
                r.stdout,
                r.stderr
            );
            eprintln!(
                "atftp {name} at {percent}%: client aborted on a retransmitted OACK, retrying"
            );
        }
    }
    assert!(srv.metrics.retransmits.get() > 0, "loss was not in effect");
    drop(srv);
    drop(ns);
}

#[test]
fn transfers_complete_with_5_percent_loss() {
    fetch_all(5, &["f513", "f1m"]);
}

#[test]
fn transfers_complete_with_20_percent_loss() {
    fetch_all(20, &["f513", "f300k"]);
}
