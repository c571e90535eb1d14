//! Ignition rendering throughput: a 20-file per-machine config (Butane template filled
//! with machine facts + a Butane claim secret merged on top, validated, serialized).
//!
//! - cold: every machine rendered from scratch (template render, translate, merge,
//!   schema + semantic validation, JSON serialization) through `RenderCache::get_or_render`
//!   with a fresh key; median / p99 latency and renders/s. Goal: p99 ≤ 1 ms.
//! - warm: `RenderCache::get` hits returning the serialized body (what the HTTP
//!   handler does per request), and hits + re-serializing the config JSON (an upper
//!   bound if a handler serialized per request). Goal: ≥ 20,000 req/s.
//! - peer, same run: Debian's real `ignition-validate` (Go) on the same rendered config,
//!   per config including its process start; it only validates (no translation), so it
//!   is a reference point for "what a config check costs with the upstream tool", not
//!   an equivalent workload. Butane and matchbox are not packaged in Debian.
//!
//! `cargo bench --bench ignition_render -- [--machines N] [--lookups N] [--peer-runs N]`
//! (defaults 2000 / 1,000,000 / 20; `--quick` = 200 / 100,000 / 5).

use std::time::{Duration, Instant};

use bootplane::ignition::{
    IgnitionSecret, MachineFacts, RenderCache, RenderKey, Renderer, Template,
};

fn template() -> String {
    let mut t = String::from(
        "variant: fcos\nversion: 1.4.0\nstorage:\n  files:\n    - path: /etc/hostname\n      mode: 0644\n      contents:\n        inline: \"{{ hostname }}\\n\"\n    - path: /etc/bootplane/machine.env\n      mode: 0600\n      contents:\n        inline: |\n          NAME={{ name }}\n          UUID={{ uuid }}\n          MAC={{ mac }}\n          IP={{ ip }}\n          CLAIM={{ claim.namespace }}/{{ claim.name }}\n",
    );
    for i in 0..16 {
        t.push_str(&format!(
            "    - path: /etc/app/conf.d/{i:02}-part.conf\n      mode: 0644\n      contents:\n        inline: |\n"
        ));
        for j in 0..(4 + i * 3) {
            t.push_str(&format!(
                "          key{j} = value-{j}-for-{{{{ name }}}}\n"
            ));
        }
    }
    t
}

const SECRET: &str = "variant: fcos\nversion: 1.4.0\npasswd:\n  users:\n    - name: core\n      ssh_authorized_keys: [ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForBenchOnly00000000000000000000000 ops]\nstorage:\n  files:\n    - path: /etc/motd\n      contents:\n        inline: welcome\n    - path: /etc/hostname\n      mode: 0644\n      contents:\n        inline: from-secret\n    - path: /etc/app/token\n      mode: 0600\n      contents:\n        inline: abcdef0123456789\n    - path: /etc/app/flags\n      contents:\n        inline: fast=true\nsystemd:\n  units:\n    - name: app.service\n      enabled: true\n      contents: |\n        [Service]\n        ExecStart=/usr/bin/sleep infinity\n        [Install]\n        WantedBy=multi-user.target\n";

fn facts(i: usize) -> MachineFacts {
    MachineFacts {
        name: format!("server-{i:05}"),
        uuid: Some(format!("00000000-0000-4000-8000-{i:012}")),
        hostname: Some(format!("node-{i:05}")),
        macs: vec![format!(
            "52:54:00:{:02x}:{:02x}:{:02x}",
            (i >> 16) & 0xff,
            (i >> 8) & 0xff,
            i & 0xff
        )],
        ips: vec![format!("10.199.{}.{}", (i >> 8) & 0xff, i & 0xff)],
        labels: [("rack".to_string(), format!("r{}", i % 40))].into(),
        claim_name: Some(format!("claim-{i}")),
        claim_namespace: Some("fleet".into()),
    }
}

/// CPU time of this thread: wall-clock latencies on a shared 2-core box include time
/// spent waiting for a core, so the bench reports both.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes into the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let machines = arg("--machines", if quick { 200 } else { 2000 });
    let lookups = arg("--lookups", if quick { 100_000 } else { 1_000_000 });
    let peer_runs = arg("--peer-runs", if quick { 5 } else { 20 });

    let mut r = Renderer::new();
    let t = Template::new("default.bu", template());
    let trev = t.revision.clone();
    r.add_template(t).expect("template compiles");
    let secret = IgnitionSecret {
        ignition: SECRET.to_string(),
        format: Some("fcos".into()),
    };
    let cache = RenderCache::new();

    // Warm-up (schema compilation, allocator), not measured.
    let sample = r
        .render(Some("default.bu"), &facts(0), Some(&secret))
        .expect("renders");
    let nfiles = sample.config["storage"]["files"]
        .as_array()
        .map_or(0, |a| a.len());
    println!(
        "config: {nfiles} files, {} bytes of JSON, ignition {}",
        sample.json.len(),
        sample.version
    );

    // Cold renders.
    let mut lat = Vec::with_capacity(machines);
    let mut cpu = Vec::with_capacity(machines);
    let t0 = Instant::now();
    for i in 0..machines {
        let f = facts(i);
        let key = RenderKey {
            server: f.name.clone(),
            secret_revision: "1".into(),
            template_revision: trev.clone(),
        };
        let s = Instant::now();
        let c0 = thread_cpu();
        let out = cache
            .get_or_render(&key, || r.render(Some("default.bu"), &f, Some(&secret)))
            .expect("renders");
        lat.push(s.elapsed());
        cpu.push(thread_cpu().saturating_sub(c0));
        std::hint::black_box(out);
    }
    let cold_total = t0.elapsed();
    lat.sort();
    cpu.sort();
    let cold_rate = machines as f64 / cold_total.as_secs_f64();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "cold render CPU time (this thread): median {:?}, p99 {:?}  (load average now: {})",
        pct(&cpu, 0.5),
        pct(&cpu, 0.99),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!(
        "cold render : {machines} machines, median {:?}, p99 {:?}, max {:?}, {:.0} renders/s  (goal p99 <= 1 ms: {})",
        pct(&lat, 0.5),
        pct(&lat, 0.99),
        lat[lat.len() - 1],
        cold_rate,
        if pct(&lat, 0.99) <= Duration::from_millis(1) { "met" } else { "NOT met" }
    );

    // Warm: cache hits.
    let names: Vec<String> = (0..machines).map(|i| format!("server-{i:05}")).collect();
    let t0 = Instant::now();
    let mut bytes = 0usize;
    for i in 0..lookups {
        let hit = cache.get(&names[i % machines], "1", &trev).expect("cached");
        bytes += hit.json.clone().len();
    }
    let warm = t0.elapsed();
    let warm_rate = lookups as f64 / warm.as_secs_f64();
    println!(
        "warm lookup : {lookups} cache hits returning the body, {:.0} req/s, {:.0} ns/req ({} MB served)  (goal >= 20,000 req/s: {})",
        warm_rate,
        warm.as_nanos() as f64 / lookups as f64,
        bytes / 1_000_000,
        if warm_rate >= 20_000.0 { "met" } else { "NOT met" }
    );
    let n2 = (lookups / 10).max(1000);
    let t0 = Instant::now();
    for i in 0..n2 {
        let hit = cache.get(&names[i % machines], "1", &trev).expect("cached");
        std::hint::black_box(serde_json::to_vec(&hit.config).expect("serializes"));
    }
    let ser = t0.elapsed();
    println!(
        "warm + serialize: {n2} hits re-serializing the config, {:.0} req/s",
        n2 as f64 / ser.as_secs_f64()
    );

    // Peer: Debian's ignition-validate on the same rendered config (3.3).
    let dir = std::env::temp_dir().join(format!("bootplane-bench-ign-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let p = dir.join("server.ign");
    std::fs::write(&p, &sample.json).expect("write config");
    let mut peer = Vec::new();
    for _ in 0..peer_runs {
        let s = Instant::now();
        match std::process::Command::new("ignition-validate")
            .arg(&p)
            .output()
        {
            Ok(o) if o.status.success() => peer.push(s.elapsed()),
            Ok(o) => {
                println!(
                    "peer: ignition-validate rejected the config: {}",
                    String::from_utf8_lossy(&o.stderr)
                );
                break;
            }
            Err(e) => {
                println!("peer: ignition-validate not runnable ({e}); install Debian's `ignition`");
                break;
            }
        }
    }
    // Our validation alone on the same config, for the side-by-side line.
    let mut ours = Vec::new();
    for _ in 0..peer_runs.max(200) {
        let s = Instant::now();
        std::hint::black_box(bootplane::ignition::validate(&sample.config).expect("valid"));
        ours.push(s.elapsed());
    }
    ours.sort();
    if !peer.is_empty() {
        peer.sort();
        println!(
            "peer        : ignition-validate (Go, incl. process start) median {:?} per config; bootplane validate median {:?}; full bootplane cold render median {:?}; ratio peer/our-render {:.1}x",
            pct(&peer, 0.5),
            pct(&ours, 0.5),
            pct(&lat, 0.5),
            pct(&peer, 0.5).as_secs_f64() / pct(&lat, 0.5).as_secs_f64()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
