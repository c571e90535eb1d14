//! Redfish power at fleet scale: N Servers behind fake BMCs (`tests/support/fakebmc.rs`,
//! in this process, real loopback sockets), claimed at once; how long until every one is
//! On, what bootplane spent doing it, and whether any BMC ever saw more requests at once
//! than `power.redfish.per_bmc_concurrency` allows (counted by each fake BMC itself,
//! server-side).
//!
//! ```sh
//! cargo bench --bench redfish_power                            # 1,000 servers, 100 BMCs, 3 rounds
//! cargo bench --bench redfish_power -- --count 200 --bmcs 20 --rounds 1 --power-delay-ms 0
//! ```
//!
//! Each round starts a fresh bootplane (default `[power.redfish]` but the limit given with
//! `--per-bmc`) and fresh BMCs (`--count / --bmcs` systems each, every reset applied after
//! `--power-delay-ms`, as a real machine takes a moment to report On; every answer after
//! `--bmc-latency-ms`, default 50, so requests overlap at a BMC), registers a
//! BMCSecret, BMC and Server per machine, then applies N claims from 16 API clients.
//! Measured from the first claim sent: until every Server's `status.powerState` is On
//! (a watch on Servers) and until every fake system is On; bootplane's CPU seconds and
//! peak RSS; requests per Server; the highest concurrency any one BMC saw. Prints the
//! median and spread over the rounds and every goal, met or not. There is no peer run
//! side by side: metal-operator needs a Kubernetes API server, which this machine cannot
//! run (see docs/benchmarks.md).

use std::collections::HashSet;
use std::io::BufRead;
use std::sync::{Arc, Mutex};
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
use support::fakebmc::{uuid_for, FakeBmc};

#[path = "support/args.rs"]
mod args;
#[path = "support/post.rs"]
mod post;
use args::arg;
use post::post_all;

struct Round {
    all_on_api: f64,
    all_on_bmc: f64,
    cpu: f64,
    rss_mib: f64,
    requests_per_server: f64,
    max_bmc_concurrency: u64,
}

fn round(
    count: usize,
    bmcs: usize,
    per_bmc: u64,
    power_delay: Duration,
    latency: Duration,
) -> Round {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let per = count.div_ceil(bmcs);
    let fakes: Vec<FakeBmc> = rt.block_on(async {
        let mut v = Vec::new();
        for k in 0..bmcs {
            v.push(
                FakeBmc::builder()
                    .systems(per)
                    .seed(k as u16)
                    .credentials("admin", "bench-password")
                    .power_delay(power_delay)
                    .delay(latency)
                    .start()
                    .await,
            );
        }
        v
    });
    let b = Bootplane::start(&[
        "--set",
        &format!("power.redfish.per_bmc_concurrency={per_bmc}"),
    ]);
    let pid = b.child.as_ref().unwrap().id();
    let (mut secrets, mut bmc_objs, mut servers) = (Vec::new(), Vec::new(), Vec::new());
    for (k, f) in fakes.iter().enumerate() {
        let (secret, bmc) = bmc_objects(&format!("bmc-{k:04}"), &f.base_url, "bench-password");
        secrets.push(secret);
        bmc_objs.push(bmc);
    }
    for i in 0..count {
        let (k, j) = (i / per, i % per);
        servers.push(json!({"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "Server",
            "metadata": {"name": format!("srv-{i:05}"), "labels": {"pool": "bench"}},
            "spec": {"systemUUID": uuid_for(k as u16, j).to_lowercase(), "bmcRef": {"name": format!("bmc-{k:04}")}},
            "status": {"state": "Available", "powerState": "Off"}}));
    }
    post_all(
        &b.agent,
        &b.api,
        &b.token,
        "/apis/metal.ironcore.dev/v1alpha1/bmcsecrets",
        secrets,
        16,
    );
    post_all(
        &b.agent,
        &b.api,
        &b.token,
        "/apis/metal.ironcore.dev/v1alpha1/bmcs",
        bmc_objs,
        16,
    );
    post_all(
        &b.agent,
        &b.api,
        &b.token,
        "/apis/metal.ironcore.dev/v1alpha1/servers",
        servers,
        16,
    );
    // Let the BMC reconciler's first look and the claimable index settle.
    std::thread::sleep(Duration::from_secs(2));

    // Watch Servers from now on: the first event with powerState On per Server.
    let list = b.get("/apis/metal.ironcore.dev/v1alpha1/servers?limit=1");
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let on: Arc<Mutex<HashSet<String>>> = Arc::default();
    let all_on_api: Arc<Mutex<Option<Instant>>> = Arc::default();
    let watcher = {
        let (on, all_on_api) = (on.clone(), all_on_api.clone());
        let url = format!(
            "{}/apis/metal.ironcore.dev/v1alpha1/servers?watch=true&resourceVersion={rv}",
            b.api
        );
        let auth = format!("Bearer {}", b.token);
        let agent = b.agent.clone();
        std::thread::spawn(move || {
            let r = agent.get(&url).set("Authorization", &auth).call().unwrap();
            for line in std::io::BufReader::new(r.into_reader()).lines() {
                let Ok(line) = line else { return };
                let ev: Value = serde_json::from_str(&line).unwrap();
                if ev["object"]["status"]["powerState"] == "On" {
                    let mut s = on.lock().unwrap();
                    s.insert(
                        ev["object"]["metadata"]["name"]
                            .as_str()
                            .unwrap()
                            .to_string(),
                    );
                    if s.len() == count {
                        *all_on_api.lock().unwrap() = Some(Instant::now());
                        return;
                    }
                }
            }
        })
    };
    let requests_before: u64 = fakes.iter().map(|f| f.total_requests()).sum();
    let cpu0 = procfs::proc_cpu(pid);
    let claims: Vec<Value> = (0..count)
        .map(|i| {
            json!({"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "ServerClaim",
            "metadata": {"name": format!("claim-{i:05}"), "namespace": "default"},
            "spec": {"power": "On", "image": "os-image:latest",
                     "serverSelector": {"matchLabels": {"pool": "bench"}}}})
        })
        .collect();
    let t0 = Instant::now();
    post_all(
        &b.agent,
        &b.api,
        &b.token,
        "/apis/metal.ironcore.dev/v1alpha1/namespaces/default/serverclaims",
        claims,
        16,
    );
    let deadline = t0 + Duration::from_secs(600);
    let mut all_on_bmc = None;
    while Instant::now() < deadline {
        if all_on_bmc.is_none() && fakes.iter().map(|f| f.powered_on()).sum::<usize>() >= count {
            all_on_bmc = Some(t0.elapsed().as_secs_f64());
        }
        if all_on_bmc.is_some() && watcher.is_finished() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let cpu = procfs::proc_cpu(pid) - cpu0;
    let rss_kib = procfs::status_kib(pid, "VmHWM:").unwrap_or(0);
    let requests: u64 = fakes.iter().map(|f| f.total_requests()).sum::<u64>() - requests_before;
    let all_on_api = all_on_api.lock().unwrap().map(|t| (t - t0).as_secs_f64());
    let r = Round {
        all_on_api: all_on_api.unwrap_or_else(|| {
            eprintln!(
                "timed out: {} of {count} Servers On",
                on.lock().unwrap().len()
            );
            f64::NAN
        }),
        all_on_bmc: all_on_bmc.unwrap_or(f64::NAN),
        cpu,
        rss_mib: rss_kib as f64 / 1024.0,
        requests_per_server: requests as f64 / count as f64,
        max_bmc_concurrency: fakes.iter().map(|f| f.max_concurrent()).max().unwrap_or(0),
    };
    drop(b);
    drop(fakes);
    r
}

/// `power.redfish.global_concurrency`'s default: BMC requests in flight at once.
const GLOBAL_CONCURRENCY: f64 = 64.0;

fn main() {
    let count = arg("--count", 1000usize);
    let bmcs = arg("--bmcs", 100usize);
    let rounds = arg("--rounds", 3u64).max(1);
    let per_bmc = arg("--per-bmc", 4u64);
    let delay = Duration::from_millis(arg("--power-delay-ms", 1000u64));
    // Every answer takes this long (real BMCs answer in tens to hundreds of ms), so
    // requests overlap at a BMC and its concurrency limit is exercised.
    let latency = Duration::from_millis(arg("--bmc-latency-ms", 50u64));
    println!(
        "redfish_power: {count} servers on {bmcs} fake BMCs ({} systems each, {} ms per answer), \
         per-BMC limit {per_bmc}, power applied {} ms after a reset, {rounds} rounds",
        count.div_ceil(bmcs),
        latency.as_millis(),
        delay.as_millis()
    );
    let mut all = Vec::new();
    for i in 0..rounds {
        let r = round(count, bmcs, per_bmc, delay, latency);
        println!(
            "round {}: all On (API) {:.2} s, all On (BMCs) {:.2} s, bootplane CPU {:.2} s, peak RSS {:.0} MiB, \
             {:.1} requests/server, max concurrency at one BMC {}",
            i + 1,
            r.all_on_api,
            r.all_on_bmc,
            r.cpu,
            r.rss_mib,
            r.requests_per_server,
            r.max_bmc_concurrency
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
        println!("{what:<34} median {m:>8.2} {unit:<4} (min {lo:.2}, max {hi:.2})");
        m
    };
    let on = show(
        "all Servers On (status), from claim",
        "s",
        all.iter().map(|r| r.all_on_api).collect(),
    );
    show(
        "all systems On (at the BMCs)",
        "s",
        all.iter().map(|r| r.all_on_bmc).collect(),
    );
    let cpu = show("bootplane CPU", "s", all.iter().map(|r| r.cpu).collect());
    show(
        "bootplane peak RSS",
        "MiB",
        all.iter().map(|r| r.rss_mib).collect(),
    );
    show(
        "requests per Server",
        "",
        all.iter().map(|r| r.requests_per_server).collect(),
    );
    let maxc = all.iter().map(|r| r.max_bmc_concurrency).max().unwrap_or(0);
    let floor = delay.as_secs_f64();
    println!("goals:");
    println!(
        "  no BMC sees more than {per_bmc} requests at once: max {maxc}: {}",
        if maxc <= per_bmc { "met" } else { "NOT met" }
    );
    println!(
        "  every Server On: {}",
        if all.iter().all(|r| r.all_on_api.is_finite()) {
            "met"
        } else {
            "NOT met"
        }
    );
    println!(
        "  all On within 30 s of the claims (the machines' own {floor:.1} s included): {on:.2} s: {}",
        if on <= 30.0 { "met" } else { "NOT met" }
    );
    // The arithmetic bound (docs/benchmarks.md): every BMC request holds one of the global
    // concurrency slots (power.redfish.global_concurrency, default 64) for the BMC's answer
    // time, and the last machine still takes its own power delay after its reset.
    let per_server = rounds::Stat::of(
        &all.iter()
            .map(|r| r.requests_per_server)
            .collect::<Vec<_>>(),
    )
    .median;
    // One BMC's share is bounded by its own limit the same way; the larger bound holds.
    let requests = per_server * count as f64;
    let bound = (requests / GLOBAL_CONCURRENCY).max(requests / bmcs as f64 / per_bmc as f64)
        * latency.as_secs_f64()
        + floor;
    println!(
        "  all On within 1.1x the arithmetic bound ({:.0} BMC requests x {} ms / {GLOBAL_CONCURRENCY} slots (or one BMC's share / {per_bmc}) + {floor:.1} s = {bound:.2} s): {:.2}x: {}",
        per_server * count as f64,
        latency.as_millis(),
        on / bound,
        if on <= 1.1 * bound { "met" } else { "NOT met" }
    );
    println!(
        "  bootplane CPU under 10 ms per Server: {:.1} ms: {}",
        cpu * 1000.0 / count as f64,
        if cpu * 1000.0 / count as f64 <= 10.0 {
            "met"
        } else {
            "NOT met"
        }
    );
}
