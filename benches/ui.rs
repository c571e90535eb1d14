//! The dashboard with a big fleet, measured in Debian's headless Chromium
//! (chromedriver, tests/support/webdriver.rs): N servers (10,000) registered, then per
//! round the Fleet page is loaded (a reload; the token stays in sessionStorage) and
//! timed until all N are in its model and the rows in view are in the DOM, and then
//! M servers per second (1,000) change `status.state` (Available ↔ Maintenance) for a few
//! seconds while the page stays live through the watch API.
//!
//! ```sh
//! cargo bench --bench ui                                   # 10,000 servers, 1,000/s, 3 rounds
//! cargo bench --bench ui -- --servers 2000 --rate 500 --secs 5 --rounds 1
//! ```
//!
//! All times come from the browser's Performance API: page load → rendered is the
//! `bootplane:fleet-rendered` mark (from the navigation's start), list → rendered its
//! distance from the servers list's `responseEnd` (resource timing); update latency is
//! what the page records per frame (watch event arrival → rows updated), and
//! write → screen is end to end: a probe row at the top is written every 100 ms (the
//! time taken just before the PATCH is sent) and a MutationObserver notes when its
//! state cell changes (`performance.timeOrigin + now()`, the same clock on one
//! machine). Long tasks (> 50 ms on the main thread) during the load are counted.
//! Printed per round, then the medians.

#[path = "support/args.rs"]
mod args;
use args::arg;

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use support::api::SERVERS;
use support::bootplane::Bootplane;
use support::webdriver::Browser;

fn epoch_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        * 1000.0
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn median(v: &[f64]) -> f64 {
    pct(&mut v.to_vec(), 0.5)
}

fn name(i: usize) -> String {
    format!("srv-{i:05}")
}

fn register(b: &Bootplane, n: usize) {
    let t = Instant::now();
    let threads = 8;
    std::thread::scope(|s| {
        for k in 0..threads {
            let agent = b.agent.clone();
            let (api, token) = (b.api.clone(), b.token.clone());
            s.spawn(move || {
                for i in (k..n).step_by(threads) {
                    let body = json!({
                        "apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "Server",
                        "metadata": {"name": name(i), "labels": {"rack": format!("r{}", i % 40)}},
                        "spec": {"systemUUID": format!("00000000-0000-0000-0000-{i:012x}")},
                        "status": {"state": "Available", "powerState": "Off"},
                    });
                    agent
                        .post(&format!("{api}{SERVERS}"))
                        .set("Authorization", &format!("Bearer {token}"))
                        .set("Content-Type", "application/json")
                        .send_string(&body.to_string())
                        .unwrap_or_else(|e| panic!("registering {}: {e}", name(i)));
                }
            });
        }
    });
    eprintln!(
        "registered {n} servers in {:.1} s",
        t.elapsed().as_secs_f64()
    );
}

fn set_state(agent: &ureq::Agent, api: &str, token: &str, server: &str, state: &str) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if let Err(e) = agent
        .request("PATCH", &format!("{api}{SERVERS}/{server}/status"))
        .set("Authorization", &format!("Bearer {token}"))
        .set("Content-Type", "application/merge-patch+json")
        .send_string(&json!({"status": {"state": state}}).to_string())
    {
        if !WARNED.swap(true, Ordering::Relaxed) {
            let msg = match e {
                ureq::Error::Status(c, r) => format!("{c} {}", r.into_string().unwrap_or_default()),
                e => e.to_string(),
            };
            eprintln!("warning: setting {server} {state}: {msg}");
        }
    }
}

struct Round {
    load_ms: f64,
    list_to_render_ms: f64,
    upd_p50: f64,
    upd_p99: f64,
    e2e_p50: f64,
    e2e_p99: f64,
    rate: f64,
    long_tasks: u64,
}

const PROBE_JS: &str = r#"
window.benchProbe = { seen: [], long: 0 };
const probe = arguments[0];
let last = '';
new MutationObserver(() => {
  const r = document.querySelector(`#fleet-rows a.row[data-name="${probe}"]`);
  const s = r && r.children[1].textContent;
  if (s && s !== last) { last = s; window.benchProbe.seen.push([s, performance.timeOrigin + performance.now()]); }
}).observe(document.getElementById('fleet-rows'), { subtree: true, childList: true, characterData: true });
try {
  new PerformanceObserver((l) => { window.benchProbe.long += l.getEntries().length; })
    .observe({ type: 'longtask', buffered: false });
} catch (_) {}
const s = window.bootplaneFleetStats; s.updates = []; s.next = 0;
"#;

fn round(br: &Browser, b: &Bootplane, n: usize, rate: u64, secs: u64) -> Round {
    br.exec("window.benchOldPage = true; location.reload()", json!([]));
    std::thread::sleep(Duration::from_millis(200));
    let rendered = br.wait(120, "fleet rendered", |br| {
        let v = br.exec(
            "const s = window.bootplaneFleetStats; const t = document.getElementById('fleet-total'); \
             return !window.benchOldPage && s && s.rendered !== null && t && t.textContent === arguments[0] ? s.rendered : null",
            json!([format!("{n} servers")]),
        );
        v.as_f64()
    });
    let list_end = br
        .exec(
            "const e = performance.getEntriesByType('resource').filter(e => /\\/servers$/.test(e.name)); \
             return e.length ? e[e.length - 1].responseEnd : null",
            json!([]),
        )
        .as_f64()
        .unwrap_or(f64::NAN);
    let probe = name(0);
    br.exec(PROBE_JS, json!([probe]));

    // The load: `rate` state changes per second over the fleet but the probe, and the
    // probe every 100 ms.
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let threads = 4u64;
    let mut probe_writes: Vec<(String, f64)> = Vec::new();
    std::thread::scope(|s| {
        for k in 0..threads {
            let (agent, api, token) = (b.agent.clone(), b.api.clone(), b.token.clone());
            let (stop, sent) = (stop.clone(), sent.clone());
            s.spawn(move || {
                let per = rate / threads;
                let start = Instant::now();
                let mut j: u64 = 0;
                while !stop.load(Ordering::Relaxed) {
                    let due = start + Duration::from_secs_f64(j as f64 / per as f64);
                    if let Some(d) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(d);
                    }
                    let i = 1 + ((j * threads + k) as usize * 7919) % (n - 1);
                    let st = if (j / (n as u64 / threads).max(1)).is_multiple_of(2) {
                        "Maintenance"
                    } else {
                        "Available"
                    };
                    set_state(&agent, &api, &token, &name(i), st);
                    sent.fetch_add(1, Ordering::Relaxed);
                    j += 1;
                }
            });
        }
        let start = Instant::now();
        let mut k = 0u64;
        while start.elapsed() < Duration::from_secs(secs) {
            let st = if k.is_multiple_of(2) {
                "Maintenance"
            } else {
                "Available"
            };
            probe_writes.push((st.to_string(), epoch_ms()));
            set_state(&b.agent, &b.api, &b.token, &probe, st);
            k += 1;
            std::thread::sleep(Duration::from_millis(100));
        }
        stop.store(true, Ordering::Relaxed);
    });
    let achieved = sent.load(Ordering::Relaxed) as f64 / secs as f64;
    std::thread::sleep(Duration::from_millis(500));
    let v: Value = br.exec(
        "return {probe: window.benchProbe, updates: window.bootplaneFleetStats.updates}",
        json!([]),
    );
    let mut upd: Vec<f64> = v["updates"]
        .as_array()
        .map(|a| a.iter().filter_map(|u| u["first"].as_f64()).collect())
        .unwrap_or_default();
    let seen: Vec<(String, f64)> = v["probe"]["seen"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| {
                    (
                        p[0].as_str().unwrap_or("").to_string(),
                        p[1].as_f64().unwrap_or(0.0),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let mut e2e = Vec::new();
    let mut from = 0;
    for (st, t) in &probe_writes {
        if let Some(i) = seen[from..]
            .iter()
            .position(|(s, ts)| s == st && *ts >= *t - 5.0)
        {
            e2e.push(seen[from + i].1 - t);
            from += i + 1;
        }
    }
    if e2e.len() < probe_writes.len() * 9 / 10 {
        eprintln!(
            "warning: only {} of {} probe writes seen",
            e2e.len(),
            probe_writes.len()
        );
    }
    // Back to all Available for the next round.
    for i in 0..n {
        set_state(&b.agent, &b.api, &b.token, &name(i), "Available");
    }
    Round {
        load_ms: rendered,
        list_to_render_ms: rendered - list_end,
        upd_p50: pct(&mut upd, 0.5),
        upd_p99: pct(&mut upd, 0.99),
        e2e_p50: pct(&mut e2e, 0.5),
        e2e_p99: pct(&mut e2e, 0.99),
        rate: achieved,
        long_tasks: v["probe"]["long"].as_u64().unwrap_or(0),
    }
}

fn main() {
    let n: usize = arg("--servers", 10_000);
    let rate: u64 = arg("--rate", 1000);
    let secs: u64 = arg("--secs", 10);
    let rounds: usize = arg("--rounds", 3);
    let b = Bootplane::start(&[]);
    register(&b, n);
    let br = Browser::start(1280, 900);
    br.goto(&format!("{}/ui/", b.api));
    let input = br.wait(20, "sign-in form", |br| br.find("#token"));
    br.type_into(&input, &b.token);
    br.click(&br.find("#signin-submit").unwrap());
    br.wait(120, "first render", |br| {
        br.exec(
            "return window.bootplaneFleetStats && window.bootplaneFleetStats.rendered",
            json!([]),
        )
        .as_f64()
    });
    println!("ui bench: {n} servers, {rate} state changes/s for {secs} s, {rounds} rounds (headless chromium)");
    println!(
        "{:>5} {:>12} {:>14} {:>10} {:>10} {:>10} {:>10} {:>9} {:>6}",
        "round",
        "load→DOM ms",
        "list→DOM ms",
        "upd p50",
        "upd p99",
        "e2e p50",
        "e2e p99",
        "writes/s",
        "long"
    );
    let mut all = Vec::new();
    for r in 0..rounds {
        let x = round(&br, &b, n, rate, secs);
        println!(
            "{:>5} {:>12.0} {:>14.0} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>9.0} {:>6}",
            r + 1,
            x.load_ms,
            x.list_to_render_ms,
            x.upd_p50,
            x.upd_p99,
            x.e2e_p50,
            x.e2e_p99,
            x.rate,
            x.long_tasks
        );
        all.push(x);
    }
    let m = |f: fn(&Round) -> f64| median(&all.iter().map(f).collect::<Vec<_>>());
    println!(
        "median: page load → rendered {:.0} ms, list → rendered {:.0} ms (goal < 1000), \
         update latency p50 {:.1} ms / p99 {:.1} ms, write → screen p50 {:.1} ms / p99 {:.1} ms, \
         at {:.0} writes/s",
        m(|r| r.load_ms),
        m(|r| r.list_to_render_ms),
        m(|r| r.upd_p50),
        m(|r| r.upd_p99),
        m(|r| r.e2e_p50),
        m(|r| r.e2e_p99),
        m(|r| r.rate)
    );
}
