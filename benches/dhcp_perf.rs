//! DHCP lease throughput: Kea's `perfdhcp` (full DORA, many distinct clients)
//! against bootplane (authoritative, leases fsync'd), `kea-dhcp4` (memfile with a
//! lease file) and dnsmasq (lease file), one after another in the same run, the
//! same namespaces, veth, subnet, pool and lease time. For each server the offered
//! rate climbs (interleaved across servers, so load drift hits all alike) until loss
//! reaches 1% twice in a row; the highest rate with < 1% loss is its score, printed
//! with the ratios and with where packets were dropped (perfdhcp's or the server's
//! socket buffer).
//!
//! `cargo bench --bench dhcp_perf` (defaults: 4 s per step). Environment:
//! `DHCP_BENCH_SECS` (seconds per step), `DHCP_BENCH_ATTEMPTS` (tries per step,
//! default 2), `DHCP_BENCH_RATES` (comma list of offered
//! rates), `DHCP_BENCH_SERVERS` (subset of `bootplane,kea,dnsmasq`).
//! Traffic stays on a veth between two network namespaces this bench creates.

#[path = "../tests/dhcp_support/mod.rs"]
mod dhcp_support;

use std::process::Stdio;
use std::time::Duration;

use dhcp_support::*;

const POOL_START: &str = "10.199.1.0";
const POOL_END: &str = "10.199.250.255";
const CLIENTS: u32 = 50_000;

struct Step {
    offered: u32,
    rate: f64,
    loss_pct: f64,
}

struct Setup {
    server: Netns,
    client: Netns,
    dir: tempfile::TempDir,
}

fn setup() -> Setup {
    let (server, client) = veth_pair("ps", "pc", "10.199.0.1/16");
    client.ip(&["addr", "add", "10.199.0.2/16", "dev", "vc"]);
    // perfdhcp's clients have made-up MACs: take every frame.
    client.ip(&["link", "set", "vc", "promisc", "on"]);
    Setup {
        server,
        client,
        dir: tempfile::tempdir().unwrap(),
    }
}

fn start(s: &Setup, which: &str, run: usize) -> Proc {
    let d = s.dir.path().join(format!("{which}-{run}"));
    std::fs::create_dir_all(&d).unwrap();
    let log = std::fs::File::create(d.join("server.log")).unwrap();
    let p = match which {
        "bootplane" => {
            let cfg = d.join("bootplane.toml");
            std::fs::write(
                &cfg,
                format!("state_dir = \"{}\"\n[dhcp]\nlease_time_secs = 3600\nprefix_len = 16\nrouter = \"10.199.0.1\"\n", d.join("state").display()),
            )
            .unwrap();
            let mut c = s.server.cmd(env!("CARGO_BIN_EXE_bootplane"));
            c.args([
                "serve",
                "--config",
                cfg.to_str().unwrap(),
                "--dhcp-interface",
                "vs",
                "--dhcp-mode",
                "authoritative",
                "--dhcp-range",
                &format!("{POOL_START}-{POOL_END}"),
            ])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(log);
            Proc::spawn(c)
        }
        "kea" => {
            let cfg = d.join("kea.json");
            std::fs::write(
                &cfg,
                format!(
                    r#"{{"Dhcp4": {{
  "interfaces-config": {{"interfaces": ["vs"], "dhcp-socket-type": "raw"}},
  "lease-database": {{"type": "memfile", "persist": true, "name": "{leases}", "lfc-interval": 0}},
  "valid-lifetime": 3600,
  "subnet4": [{{"id": 1, "subnet": "10.199.0.0/16", "pools": [{{"pool": "{POOL_START} - {POOL_END}"}}],
               "option-data": [{{"name": "routers", "data": "10.199.0.1"}}]}}],
  "loggers": [{{"name": "kea-dhcp4", "output_options": [{{"output": "{log}"}}], "severity": "WARN"}}]
}}}}"#,
                    leases = d.join("kea-leases4.csv").display(),
                    log = d.join("kea.log").display()
                ),
            )
            .unwrap();
            let mut c = s.server.cmd("kea-dhcp4");
            c.args(["-c", cfg.to_str().unwrap()])
                .env("KEA_PIDFILE_DIR", &d)
                .env("KEA_LOCKFILE_DIR", &d)
                .stdout(Stdio::null())
                .stderr(log);
            Proc::spawn(c)
        }
        "dnsmasq" => {
            let mut c = s.server.cmd("dnsmasq");
            c.args([
                "--no-daemon",
                "--conf-file=/dev/null",
                "--port=0",
                "--interface=vs",
                "--bind-interfaces",
                "--no-ping",
                "--dhcp-authoritative",
                "--dhcp-lease-max=100000",
                &format!("--dhcp-range={POOL_START},{POOL_END},255.255.0.0,1h"),
                "--dhcp-option=option:router,10.199.0.1",
                &format!("--dhcp-leasefile={}", d.join("dnsmasq.leases").display()),
                &format!("--pid-file={}", d.join("dnsmasq.pid").display()),
            ])
            .stdout(Stdio::null())
            .stderr(log);
            Proc::spawn(c)
        }
        other => panic!("unknown server {other}"),
    };
    std::thread::sleep(Duration::from_millis(1500));
    p
}

fn num_after(text: &str, key: &str, nth: usize) -> f64 {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix(key))
        .nth(nth)
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

fn perfdhcp(s: &Setup, rate: u32, secs: u32) -> Step {
    let mut c = s.client.cmd("perfdhcp");
    c.args([
        "-4",
        "-l",
        "vc",
        "-B",
        "-r",
        &rate.to_string(),
        "-p",
        &secs.to_string(),
        "-R",
        &CLIENTS.to_string(),
        "-W",
        "500000",
    ]);
    let out = run_bounded(c, secs + 30);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let rate_done = num_after(&text, "Rate:", 0);
    let sent_do = num_after(&text, "sent packets:", 0);
    let drops = num_after(&text, "drops:", 0) + num_after(&text, "drops:", 1);
    let loss_pct = if sent_do > 0.0 {
        100.0 * drops / sent_do
    } else {
        100.0
    };
    if sent_do == 0.0 {
        eprintln!(
            "perfdhcp output: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Step {
        offered: rate,
        rate: rate_done,
        loss_pct,
    }
}

/// `Udp: ... RcvbufErrors` of a namespace (absolute).
fn rcvbuf_errors(ns: &Netns) -> u64 {
    let out = run("ip", &["netns", "exec", &ns.name, "cat", "/proc/net/snmp"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines().filter(|l| l.starts_with("Udp:"));
    let (Some(h), Some(v)) = (lines.next(), lines.next()) else {
        return 0;
    };
    h.split_whitespace()
        .zip(v.split_whitespace())
        .find(|(k, _)| *k == "RcvbufErrors")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

fn main() {
    for t in ["perfdhcp", "kea-dhcp4", "dnsmasq"] {
        require(t);
    }
    let secs: u32 = std::env::var("DHCP_BENCH_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let attempts: u32 = std::env::var("DHCP_BENCH_ATTEMPTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2)
        .max(1);
    let rates: Vec<u32> = std::env::var("DHCP_BENCH_RATES")
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| {
            vec![
                100, 200, 400, 700, 1000, 1500, 2000, 2500, 3000, 3500, 4000, 5000, 6000, 7000,
                8000, 10000, 12000, 16000,
            ]
        });
    let servers: Vec<String> = std::env::var("DHCP_BENCH_SERVERS")
        .map(|v| v.split(',').map(|s| s.trim().to_string()).collect())
        .unwrap_or_else(|_| vec!["bootplane".into(), "kea".into(), "dnsmasq".into()]);

    let s = setup();
    // (server, best clean rate, offered, consecutive failures)
    let mut best: Vec<(String, f64, u32, u32)> =
        servers.iter().map(|w| (w.clone(), 0.0, 0, 0)).collect();
    let mut run_no = 0;
    // Interleaved: each offered rate is tried on every server back to back, so
    // drifting load on the machine hits all of them alike. A step that loses >= 1%
    // is retried (attempts, default 2) and the best attempt counts.
    for &r in &rates {
        if best.iter().all(|b| b.3 >= 2) {
            break;
        }
        for b in best.iter_mut() {
            if b.3 >= 2 {
                continue;
            }
            let mut got: Option<Step> = None;
            for _ in 0..attempts {
                run_no += 1;
                let mut p = start(&s, &b.0, run_no);
                let (c0, s0) = (rcvbuf_errors(&s.client), rcvbuf_errors(&s.server));
                let step = perfdhcp(&s, r, secs);
                let (c1, s1) = (rcvbuf_errors(&s.client), rcvbuf_errors(&s.server));
                p.kill9();
                println!(
                    "{:>9}: offered {:>6}/s  completed {:>9.1} leases/s  loss {:>6.2}%  (socket-buffer drops: perfdhcp {}, server {})",
                    b.0, step.offered, step.rate, step.loss_pct, c1 - c0, s1 - s0
                );
                let better = got.as_ref().is_none_or(|g| step.loss_pct < g.loss_pct);
                if better {
                    got = Some(step);
                }
                if got.as_ref().is_some_and(|g| g.loss_pct < 1.0) {
                    break;
                }
            }
            let g = got.expect("at least one attempt");
            if g.loss_pct < 1.0 {
                if g.rate > b.1 {
                    b.1 = g.rate;
                    b.2 = g.offered;
                }
                b.3 = 0;
            } else {
                b.3 += 1;
            }
        }
    }
    println!();
    println!("leases/s at < 1% loss ({secs} s per step, best of {attempts}, {CLIENTS} distinct clients, pool {POOL_START}-{POOL_END}):");
    for (w, r, o, _) in &best {
        println!("  {w:>9}: {r:>9.1} leases/s (offered {o}/s)");
    }
    let get = |n: &str| best.iter().find(|b| b.0 == n).map(|b| b.1);
    for peer in ["kea", "dnsmasq"] {
        match (get("bootplane"), get(peer)) {
            (Some(b), Some(p)) if p > 0.0 => {
                println!("  ratio bootplane/{peer:<7} = {:.2}x", b / p)
            }
            (Some(_), Some(_)) => {
                println!("  ratio bootplane/{peer:<7} = n/a ({peer} had no step under 1% loss)")
            }
            _ => {}
        }
    }
    drop(s);
}
