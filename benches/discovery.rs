//! Discovery at fleet scale: N systems behind fake BMCs (`tests/support/fakebmc.rs`, in
//! this process, real loopback sockets) become Servers, each boots once into the
//! discovery image through its BMC, a simulated agent per machine posts its inventory to
//! the real boot listener (signed per-boot URL, identity and shape checks), and every
//! Server ends `Available` and powered off. How long that takes from the BMCs' creation,
//! what bootplane spent doing it, and the BMC requests per machine.
//!
//! ```sh
//! cargo bench --bench discovery                          # 1,000 systems, 100 BMCs, 3 rounds
//! cargo bench --bench discovery -- --count 200 --bmcs 20 --rounds 1
//! ```
//!
//! Each round starts a fresh bootplane (`[discovery] enabled`, the catalog's test image as
//! the discovery image) and fresh fake BMCs (`--count / --bmcs` systems each, every answer
//! after `--bmc-latency-ms`, power applied `--power-delay-ms` after a reset), then applies
//! a BMCSecret + BMC per fake BMC from 16 API clients. A watch on Servers hands each
//! Server in `Discovery` whose discovery boot was asked for (its attempt annotation) to
//! one of `--agents` agent threads; once the fake system has been reset and is On (the
//! machine booted), the agent reads the inventory URL from the Server's discovery script (the operator's preview route: the
//! same script the machine gets) and post a 2-NIC, 2-disk, 2-CPU inventory there.
//! Measured from the first BMC applied: every Server `Available` (as a watch on Servers sees it);
//! bootplane's CPU seconds and peak RSS; BMC requests per Server. Prints the median and
//! spread over the rounds and every goal, met or not. No peer runs side by side:
//! metal-operator's discovery needs a Kubernetes API server and its metalprobe image,
//! which this machine cannot run (see docs/benchmarks.md).

use std::collections::HashSet;
use std::io::BufRead;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

#[path = "support/procfs.rs"]
mod procfs;
#[path = "support/rounds.rs"]
mod rounds;
#[path = "../tests/support/mod.rs"]
mod support;

use support::api::bmc_objects;
use support::bootplane::Bootplane;
use support::fakebmc::{mac_for, uuid_for, FakeBmc};

#[path = "support/args.rs"]
mod args;
#[path = "support/post.rs"]
mod post;
use args::arg;
use post::post_all;

struct Round {
    available: f64,
    cpu: f64,
    rss_mib: f64,
    requests_per_server: f64,
}

/// The inventory the agent of system `i` of the fake BMC seeded `seed` posts.
fn inventory(seed: u16, i: usize) -> String {
    json!({
        "systemUUID": uuid_for(seed, i).to_lowercase(),
        "system": {"manufacturer": "Fake", "product": "Fake-1"},
        "nics": [
            {"name": "eth0", "macAddress": mac_for(seed, i, 0), "carrier": true, "ips": ["10.0.0.9"]},
            {"name": "eth1", "macAddress": mac_for(seed, i, 1), "carrier": false},
        ],
        "disks": [
            {"name": "sda", "sizeBytes": 480u64 << 30, "model": "SSD 480", "serial": format!("S{seed}-{i}a"), "transport": "sata"},
            {"name": "sdb", "sizeBytes": 480u64 << 30, "model": "SSD 480", "serial": format!("S{seed}-{i}b"), "transport": "sata"},
        ],
        "cpus": [
            {"id": "CPU 0", "manufacturer": "Intel", "model": "Xeon", "architecture": "x86_64", "cores": 16, "threads": 32},
            {"id": "CPU 1", "manufacturer": "Intel", "model": "Xeon", "architecture": "x86_64", "cores": 16, "threads": 32},
        ],
        "memoryBytes": 256u64 << 30,
    })
    .to_string()
}

/// Agent threads: take a Server name whose discovery boot was asked for, wait until its
/// fake system has been reset and is On (the machine booted the discovery image), read
/// its inventory URL from its discovery script, post the inventory (retrying while the
/// boot side has not yet served it a script).
fn agents(
    b: &Bootplane,
    n: usize,
    rx: mpsc::Receiver<String>,
    fakes: &Arc<Vec<FakeBmc>>,
) -> Vec<std::thread::JoinHandle<()>> {
    let rx = Arc::new(Mutex::new(rx));
    (0..n)
        .map(|_| {
            let (rx, api, token, agent, fakes) = (
                rx.clone(),
                b.api.clone(),
                b.token.clone(),
                b.agent.clone(),
                fakes.clone(),
            );
            std::thread::spawn(move || loop {
                let Ok(name) = rx.lock().unwrap().recv() else {
                    return;
                };
                let (k, i) = name
                    .strip_prefix("bmc-")
                    .and_then(|r| r.split_once('-'))
                    .map(|(k, i)| (k.parse::<u16>().unwrap(), i.parse::<usize>().unwrap() - 1))
                    .expect("server name bmc-KKKK-I");
                // The machine runs its agent only once it has booted: reset, power applied.
                let booted = Instant::now() + Duration::from_secs(120);
                while Instant::now() < booted {
                    let st = fakes[k as usize].state(i);
                    if st.pending.is_none() && st.power == "On" && !st.resets.is_empty() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                for _ in 0..200 {
                    let script = agent
                        .get(&format!(
                            "{api}/apis/boot.bootplane.dev/v1alpha1/render/ipxe/{name}"
                        ))
                        .set("Authorization", &format!("Bearer {token}"))
                        .call()
                        .ok()
                        .and_then(|r| r.into_string().ok())
                        .unwrap_or_default();
                    let Some(url) = script
                        .split_whitespace()
                        .find_map(|w| w.strip_prefix("bootplane.inventory="))
                    else {
                        std::thread::sleep(Duration::from_millis(50));
                        continue;
                    };
                    match agent
                        .post(url)
                        .set("Content-Type", "application/json")
                        .send_string(&inventory(k, i))
                    {
                        Ok(_) => break,
                        Err(e) => {
                            eprintln!("agent {name}: {e}");
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    }
                }
            })
        })
        .collect()
}

fn round(
    count: usize,
    bmcs: usize,
    n_agents: usize,
    power_delay: Duration,
    latency: Duration,
) -> Round {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let per = count.div_ceil(bmcs);
    let fakes: Arc<Vec<FakeBmc>> = Arc::new(rt.block_on(async {
        let mut v = Vec::new();
        for k in 0..bmcs {
            v.push(
                FakeBmc::builder()
                    .systems(per.min(count - k * per))
                    .seed(k as u16)
                    .credentials("admin", "bench-password")
                    .power_delay(power_delay)
                    .delay(latency)
                    .ignore_graceful(false)
                    .start()
                    .await,
            );
        }
        v
    }));
    let b = Bootplane::start(&[
        "--set",
        "discovery.enabled=true",
        "--set",
        "discovery.image=os-image:latest",
        "--set",
        "power.redfish.poll_interval_secs=30",
        "--set",
        "discovery.approved_bmcs=[\"127.0.0.1\"]",
    ]);
    let pid = b.child.as_ref().unwrap().id();
    let (mut secrets, mut bmc_objs) = (Vec::new(), Vec::new());
    for (k, f) in fakes.iter().enumerate() {
        let (secret, bmc) = bmc_objects(&format!("bmc-{k:04}"), &f.base_url, "bench-password");
        secrets.push(secret);
        bmc_objs.push(bmc);
    }
    post_all(
        &b.agent,
        &b.api,
        &b.token,
        "/apis/metal.ironcore.dev/v1alpha1/bmcsecrets",
        secrets,
        16,
    );
    // Watch Servers from now on.
    let list = b.get("/apis/metal.ironcore.dev/v1alpha1/servers?limit=1");
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let (tx, rx) = mpsc::channel::<String>();
    let workers = agents(&b, n_agents, rx, &fakes);
    let done: Arc<Mutex<Option<Instant>>> = Arc::default();
    let watcher = {
        let done = done.clone();
        let url = format!(
            "{}/apis/metal.ironcore.dev/v1alpha1/servers?watch=true&resourceVersion={rv}",
            b.api
        );
        let auth = format!("Bearer {}", b.token);
        let agent = b.agent.clone();
        std::thread::spawn(move || {
            let (mut sent, mut avail) = (HashSet::new(), HashSet::new());
            let r = agent.get(&url).set("Authorization", &auth).call().unwrap();
            for line in std::io::BufReader::new(r.into_reader()).lines() {
                let Ok(line) = line else { return };
                let ev: Value = serde_json::from_str(&line).unwrap();
                let o = &ev["object"];
                let name = o["metadata"]["name"].as_str().unwrap_or("").to_string();
                // A Server in Discovery whose boot was asked for (the attempt is recorded
                // before the reset, with the boot generation its inventory URL is minted for).
                let booting =
                    o["metadata"]["annotations"]["bootplane.dev/discovery-attempt"].is_string();
                match o["status"]["state"].as_str() {
                    Some("Discovery") if booting && sent.insert(name.clone()) => {
                        let _ = tx.send(name);
                    }
                    Some("Available") => {
                        avail.insert(name);
                        if avail.len() == count {
                            *done.lock().unwrap() = Some(Instant::now());
                            return;
                        }
                    }
                    _ => {}
                }
            }
        })
    };
    let requests_before: u64 = fakes.iter().map(|f| f.total_requests()).sum();
    let cpu0 = procfs::proc_cpu(pid);
    let t0 = Instant::now();
    post_all(
        &b.agent,
        &b.api,
        &b.token,
        "/apis/metal.ironcore.dev/v1alpha1/bmcs",
        bmc_objs,
        16,
    );
    let deadline = t0 + Duration::from_secs(900);
    while Instant::now() < deadline && !watcher.is_finished() {
        std::thread::sleep(Duration::from_millis(20));
    }
    let cpu = procfs::proc_cpu(pid) - cpu0;
    let rss_kib = procfs::status_kib(pid, "VmHWM:").unwrap_or(0);
    let requests: u64 = fakes.iter().map(|f| f.total_requests()).sum::<u64>() - requests_before;
    let available = *done.lock().unwrap();
    let secs = |t: Option<Instant>| t.map(|t| (t - t0).as_secs_f64()).unwrap_or(f64::NAN);
    drop(b);
    for w in workers {
        let _ = w.join();
    }
    drop(fakes);
    Round {
        available: secs(available),
        cpu,
        rss_mib: rss_kib as f64 / 1024.0,
        requests_per_server: requests as f64 / count as f64,
    }
}

/// `power.redfish.global_concurrency`'s default: BMC requests in flight at once.
const GLOBAL_CONCURRENCY: f64 = 64.0;
/// `power.redfish.per_bmc_concurrency`'s default.
const PER_BMC: f64 = 4.0;

fn main() {
    let count = arg("--count", 1000usize);
    let bmcs = arg("--bmcs", 100usize);
    let rounds = arg("--rounds", 3u64).max(1);
    let n_agents = arg("--agents", 32usize);
    let delay = Duration::from_millis(arg("--power-delay-ms", 1000u64));
    let latency = Duration::from_millis(arg("--bmc-latency-ms", 50u64));
    println!(
        "discovery: {count} systems on {bmcs} fake BMCs ({} each, {} ms per answer, power applied {} ms after a reset), \
         {n_agents} agent threads, {rounds} rounds",
        count.div_ceil(bmcs),
        latency.as_millis(),
        delay.as_millis()
    );
    let mut all = Vec::new();
    for i in 0..rounds {
        let r = round(count, bmcs, n_agents, delay, latency);
        println!(
            "round {}: all Available {:.2} s, bootplane CPU {:.2} s, peak RSS {:.0} MiB, \
             {:.1} BMC requests/server",
            i + 1,
            r.available,
            r.cpu,
            r.rss_mib,
            r.requests_per_server
        );
        all.push(r);
    }
    let show = |what: &str, unit: &str, v: Vec<f64>| {
        let rounds::Stat {
            median: m,
            min: lo,
            max: hi,
            ..
        } = rounds::Stat::of(&v);
        println!("{what:<36} median {m:>8.2} {unit:<4} (min {lo:.2}, max {hi:.2})");
        m
    };
    let avail = show(
        "all Servers Available",
        "s",
        all.iter().map(|r| r.available).collect(),
    );
    let cpu = show("bootplane CPU", "s", all.iter().map(|r| r.cpu).collect());
    show(
        "bootplane peak RSS",
        "MiB",
        all.iter().map(|r| r.rss_mib).collect(),
    );
    show(
        "BMC requests per Server",
        "",
        all.iter().map(|r| r.requests_per_server).collect(),
    );
    println!("goals:");
    println!(
        "  every Server Available: {}",
        if all.iter().all(|r| r.available.is_finite()) {
            "met"
        } else {
            "NOT met"
        }
    );
    println!(
        "  all Available within 60 s of the BMCs (two power changes of {:.1} s each included): {avail:.2} s: {}",
        delay.as_secs_f64(),
        if avail <= 60.0 { "met" } else { "NOT met" }
    );
    // The arithmetic bound (docs/benchmarks.md): every BMC request this bootplane made
    // holds one of the global concurrency slots (power.redfish.global_concurrency,
    // default 64) for the BMC's answer time, so the requests cannot finish sooner.
    let per_server = rounds::Stat::of(
        &all.iter()
            .map(|r| r.requests_per_server)
            .collect::<Vec<_>>(),
    )
    .median;
    // One BMC's share is bounded by its own limit (power.redfish.per_bmc_concurrency,
    // default 4) the same way; the larger bound holds.
    let requests = per_server * count as f64;
    // A machine's own two power changes are a floor under any scale.
    let bound = ((requests / GLOBAL_CONCURRENCY).max(requests / bmcs as f64 / PER_BMC)
        * latency.as_secs_f64())
    .max(2.0 * delay.as_secs_f64());
    println!(
        "  all Available within 1.1x the arithmetic bound (the larger of {:.0} BMC requests x {} ms / {GLOBAL_CONCURRENCY} slots, one BMC's share / {PER_BMC}, two power changes: {bound:.2} s): {:.2}x: {}",
        per_server * count as f64,
        latency.as_millis(),
        avail / bound,
        if avail <= 1.1 * bound { "met" } else { "NOT met" }
    );
    println!(
        "  bootplane CPU under 20 ms per Server: {:.1} ms: {}",
        cpu * 1000.0 / count as f64,
        if cpu * 1000.0 / count as f64 <= 20.0 {
            "met"
        } else {
            "NOT met"
        }
    );
}
