//! Claim-binding throughput: register N servers, apply N claims (selector-based,
//! from many concurrent API clients), and measure how fast they all become Bound.
//!
//! ```sh
//! cargo bench --bench claims                       # 10,000 servers and claims
//! cargo bench --bench claims -- --count 2000 --clients 16
//! ```
//!
//! Prints claims bound per second, the time from the first apply to the last Bound,
//! and p50/p99 of each claim's apply→Bound latency (apply = the POST being sent,
//! Bound = the watch event carrying `status.phase: Bound`). Goal on a 2-core
//! machine: 10,000 bound within 10 s, p99 ≤ 2 s.

use std::collections::HashMap;
use std::io::BufRead;
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

fn port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[path = "support/args.rs"]
mod args;
use args::arg;

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

#[path = "support/procfs.rs"]
mod procfs;
use procfs::proc_cpu;

fn main() {
    let count = arg("--count", 10_000usize);
    let clients = arg("--clients", 32usize);
    // 0 = the config default (controller.workers).
    let workers = arg("--workers", 0usize);
    let dir = tempfile::tempdir().unwrap();
    let (api_port, http_port) = (port(), port());
    let api = format!("http://127.0.0.1:{api_port}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_bootplane"))
        .args(["serve", "--power-driver", "test"])
        .arg("--state-dir")
        .arg(dir.path())
        .arg("--api-listen")
        .arg(format!("127.0.0.1:{api_port}"))
        .arg("--http-listen")
        .arg(format!("127.0.0.1:{http_port}"))
        .env("BOOTPLANE_LOG", "warn")
        .envs((workers > 0).then(|| ("BOOTPLANE_CONTROLLER_WORKERS", workers.to_string())))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting bootplane");
    let deadline = Instant::now() + Duration::from_secs(30);
    while ureq::get(&format!("{api}/healthz")).call().is_err() {
        assert!(Instant::now() < deadline, "bootplane did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let token = std::fs::read_to_string(dir.path().join("api-token"))
        .unwrap()
        .trim()
        .to_string();
    let auth = format!("Bearer {token}");
    let servers = "/apis/metal.ironcore.dev/v1alpha1/servers";
    let claims = "/apis/metal.ironcore.dev/v1alpha1/namespaces/default/serverclaims";

    // Register servers.
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for c in 0..clients {
            let (api, auth) = (&api, &auth);
            s.spawn(move || {
                let agent = ureq::AgentBuilder::new().build();
                for i in (c..count).step_by(clients) {
                    let body = json!({
                        "apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "Server",
                        "metadata": {"name": format!("srv-{i:05}"), "labels": {"pool": "bench"}},
                        "spec": {"systemUUID": format!("00000000-0000-0000-0000-{i:012}")},
                        "status": {"state": "Available", "powerState": "Off"},
                    });
                    agent
                        .post(&format!("{api}{servers}"))
                        .set("Authorization", auth)
                        .set("Content-Type", "application/json")
                        .send_string(&body.to_string())
                        .expect("register server");
                }
            });
        }
    });
    let reg = t0.elapsed();
    println!(
        "registered {count} servers in {:.2}s ({:.0}/s)",
        reg.as_secs_f64(),
        count as f64 / reg.as_secs_f64()
    );
    // Let the controller see every server before claims arrive.
    std::thread::sleep(Duration::from_millis(500));
    let cpu_registered = proc_cpu(child.id());

    // Watch claims from now on.
    let rv: String = {
        let v: Value = serde_json::from_str(
            &ureq::get(&format!("{api}{claims}"))
                .set("Authorization", &auth)
                .call()
                .unwrap()
                .into_string()
                .unwrap(),
        )
        .unwrap();
        v["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let bound_at: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let watcher = {
        let (bound_at, url, auth) = (
            bound_at.clone(),
            format!("{api}{claims}?watch=true&resourceVersion={rv}"),
            auth.clone(),
        );
        std::thread::spawn(move || {
            let r = ureq::get(&url).set("Authorization", &auth).call().unwrap();
            for line in std::io::BufReader::new(r.into_reader()).lines() {
                let Ok(line) = line else { return };
                let ev: Value = serde_json::from_str(&line).unwrap();
                if ev["object"]["status"]["phase"] == "Bound" {
                    let n = ev["object"]["metadata"]["name"]
                        .as_str()
                        .unwrap()
                        .to_string();
                    let mut b = bound_at.lock().unwrap();
                    b.entry(n).or_insert_with(Instant::now);
                    if b.len() == count {
                        return;
                    }
                }
            }
        })
    };

    let applied_at: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let t1 = Instant::now();
    std::thread::scope(|s| {
        for c in 0..clients {
            let (api, auth, applied_at) = (&api, &auth, &applied_at);
            s.spawn(move || {
                let agent = ureq::AgentBuilder::new().build();
                for i in (c..count).step_by(clients) {
                    let name = format!("claim-{i:05}");
                    let body = json!({
                        "apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "ServerClaim",
                        "metadata": {"name": name},
                        "spec": {"power": "On", "image": "os-image:latest", "serverSelector": {"matchLabels": {"pool": "bench"}}},
                    });
                    let sent = Instant::now();
                    agent.post(&format!("{api}{claims}")).set("Authorization", auth).set("Content-Type", "application/json").send_string(&body.to_string()).expect("apply claim");
                    applied_at.lock().unwrap().insert(name, sent);
                }
            });
        }
    });
    let apply_done = t1.elapsed();
    let deadline = Instant::now() + Duration::from_secs(300);
    while !watcher.is_finished() {
        if Instant::now() > deadline {
            eprintln!(
                "timed out: only {} of {count} bound",
                bound_at.lock().unwrap().len()
            );
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let bound_at = bound_at.lock().unwrap();
    let applied_at = applied_at.lock().unwrap();
    let last = bound_at
        .values()
        .max()
        .copied()
        .unwrap_or_else(Instant::now);
    let total = last.duration_since(t1);
    let mut lat: Vec<f64> = bound_at
        .iter()
        .filter_map(|(n, t)| {
            applied_at
                .get(n)
                .map(|a| t.saturating_duration_since(*a).as_secs_f64())
        })
        .collect();
    lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
    // the server's resident memory with N servers, claims and boot configurations
    let kib = |field: &str| procfs::status_kib(child.id(), field).unwrap_or(0);
    println!(
        "server memory with {count} machines: RSS {:.1} MiB, peak {:.1} MiB",
        kib("VmRSS:") as f64 / 1024.0,
        kib("VmHWM:") as f64 / 1024.0
    );
    // CPU is steadier than wall time on a shared, noisy host: what A/B runs compare.
    let cpu_done = proc_cpu(child.id());
    println!(
        "server CPU: {:.2}s registering (to 0.5s after), {:.2}s for the claims",
        cpu_registered,
        cpu_done - cpu_registered
    );
    let _ = child.kill();
    let _ = child.wait();
    println!(
        "applied {count} claims in {:.2}s ({:.0}/s) from {clients} clients",
        apply_done.as_secs_f64(),
        count as f64 / apply_done.as_secs_f64()
    );
    println!(
        "bound {} of {count} claims in {:.2}s: {:.0} claims bound/s; apply->Bound p50 {:.3}s p99 {:.3}s max {:.3}s",
        bound_at.len(),
        total.as_secs_f64(),
        bound_at.len() as f64 / total.as_secs_f64(),
        pct(&lat, 0.5),
        pct(&lat, 0.99),
        lat.last().copied().unwrap_or(f64::NAN)
    );
    let ok = bound_at.len() == count && total <= Duration::from_secs(10) && pct(&lat, 0.99) <= 2.0;
    println!(
        "goal (all bound <= 10s, p99 <= 2s): {}",
        if ok { "met" } else { "NOT met" }
    );
}
