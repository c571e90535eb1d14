//! Issue 21: the store on etcd, several appliances active-active. A real 3-member etcd
//! cluster (tests/support/etcd.rs) and real `bootplane serve` appliances sharing it.

use crate::support;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::api::*;
use support::bootplane::*;
use support::etcd::EtcdCluster;
use support::http::curl_get;

/// The test cluster itself: 3 members take writes with one down, refuse them with two
/// down (no quorum), and take them again once both are back on their data dirs.
#[test]
fn etcd_cluster_keeps_quorum_with_one_member_down_and_recovers() {
    let mut c = EtcdCluster::start(3);
    assert_eq!(c.endpoints().len(), 3);
    assert!(c.leader().is_some(), "a healthy cluster has a leader");
    c.put("/t/a", "1").unwrap();
    assert_eq!(c.get("/t/a").unwrap().as_deref(), Some("1"));

    c.kill(0);
    assert!(!c.is_running(0));
    // Member 0 may have been etcd's leader: the two left elect one first.
    c.wait_healthy(Duration::from_secs(10));
    c.put("/t/b", "2")
        .unwrap_or_else(|e| panic!("write with one member down: {e}\n{}", c.logs()));
    assert_eq!(c.get("/t/b").unwrap().as_deref(), Some("2"));

    c.kill(1);
    let err = c
        .put("/t/c", "3")
        .expect_err("a write without quorum must fail");
    assert!(
        !err.is_empty(),
        "etcdctl says why the write failed (no quorum)"
    );
    assert!(
        !c.healthy(),
        "the last member reports unhealthy without quorum"
    );

    c.restart(0);
    c.restart(1);
    c.wait_healthy(Duration::from_secs(30));
    c.put("/t/d", "4").unwrap();
    assert_eq!(c.get("/t/d").unwrap().as_deref(), Some("4"));
    // Nothing written before the outage was lost. (The refused write may or may not
    // have been applied: a leader can append it before stepping down and commit it
    // once a quorum is back, as with any timed-out etcd request.)
    assert_eq!(c.get("/t/a").unwrap().as_deref(), Some("1"));
    assert_eq!(c.get("/t/b").unwrap().as_deref(), Some("2"));
    assert!(matches!(
        c.get("/t/c").unwrap().as_deref(),
        None | Some("3")
    ));
}

// ---------------------------------------------------------------------------------------
// Appliances on one cluster
// ---------------------------------------------------------------------------------------

/// The election lease the test appliances run with: short, so a dead leader is
/// replaced within seconds.
const LEASE_TTL_SECS: u64 = 3;

/// A key prefix of its own for each test (`/bp-<tag>-<pid>-<n>/`).
fn unique_prefix(tag: &str) -> String {
    format!(
        "/bp-{tag}-{}-{}/",
        std::process::id(),
        PREFIXES.fetch_add(1, Ordering::SeqCst)
    )
}

static PREFIXES: AtomicU32 = AtomicU32::new(0);

/// The `--set` arguments that put appliance `name` on `etcd` under `prefix`.
fn etcd_args(etcd: &EtcdCluster, prefix: &str, name: &str) -> Vec<String> {
    [
        "store.backend=\"etcd\"".to_string(),
        format!("store.etcd.endpoints={:?}", etcd.endpoints()),
        format!("store.etcd.prefix={prefix:?}"),
        format!("store.etcd.name={name:?}"),
        format!("store.etcd.lease_ttl_secs={LEASE_TTL_SECS}"),
        "store.etcd.request_timeout_ms=2000".to_string(),
        "store.etcd.dial_timeout_ms=1000".to_string(),
        format!(
            "store.encryption_key_file={:?}",
            etcd.key_file().display().to_string()
        ),
    ]
    .into_iter()
    .flat_map(|kv| ["--set".to_string(), kv])
    .collect()
}

/// `k` appliances (`a`, `b`, `c`, ...) on `etcd` under `prefix`, started together:
/// each has its own state dir (and API token), API port and boot HTTP port, the `test`
/// power driver (claims power on at once), DHCP and TFTP off (their defaults).
fn start_appliances(etcd: &EtcdCluster, k: usize, prefix: &str) -> Vec<Bootplane> {
    std::thread::scope(|s| {
        let started: Vec<_> = (0..k)
            .map(|i| {
                let name = ((b'a' + i as u8) as char).to_string();
                let args = etcd_args(etcd, prefix, &name);
                s.spawn(move || {
                    let args: Vec<&str> = args.iter().map(String::as_str).collect();
                    Bootplane::start(&args)
                })
            })
            .collect();
        started.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// `b`'s `bootplane_store_leader{group="GROUP"}`: Some(true) when it leads the group,
/// None when `/metrics` does not answer or has no such sample.
fn leads(b: &Bootplane, group: &str) -> Option<bool> {
    let text = b
        .req("GET", "/metrics")
        .timeout(Duration::from_secs(2))
        .call()
        .ok()?
        .into_string()
        .ok()?;
    leader_sample(&text, group)
}

/// The value of `bootplane_store_leader{group="GROUP"}` in a metrics text.
fn leader_sample(text: &str, group: &str) -> Option<bool> {
    let label = format!("group=\"{group}\"");
    text.lines()
        .filter(|l| l.starts_with("bootplane_store_leader{") && l.contains(&label))
        .find_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v == 1.0)
}

/// The indexes of the running appliances that lead `group` now, and whether every
/// running appliance exported the gauge.
fn leaders(fleet: &[Bootplane], group: &str) -> (Vec<usize>, bool) {
    let mut all = true;
    let mut out = Vec::new();
    for (i, b) in fleet.iter().enumerate() {
        if b.child.is_none() {
            continue;
        }
        match leads(b, group) {
            Some(true) => out.push(i),
            Some(false) => {}
            None => all = false,
        }
    }
    (out, all)
}

/// Every appliance's log lines about leadership and elections (for failure messages).
fn election_log(fleet: &[Bootplane]) -> String {
    fleet
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let log = b.log();
            let lines: Vec<&str> = log
                .lines()
                .filter(|l| {
                    [
                        "became leader",
                        "lost leadership",
                        "stepped down",
                        "election",
                        "resign",
                    ]
                    .iter()
                    .any(|w| l.contains(w))
                })
                .collect();
            format!("--- appliance {i} ({}) ---\n{}", b.api, lines.join("\n"))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The candidate keys of `group`'s election under `prefix` as etcd has them (key,
/// create revision, lease, value), for failure messages.
fn election_keys(etcd: &EtcdCluster, prefix: &str, group: &str) -> String {
    let out = etcd.etcdctl(&[
        "get",
        "--prefix",
        &format!("{prefix}election/{group}/"),
        "-w",
        "fields",
    ]);
    if !out.status.success() {
        return format!("(etcdctl failed: {})", support::process::text(&out));
    }
    let fields: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| {
            ["\"Key\"", "\"CreateRevision\"", "\"Lease\"", "\"Value\""]
                .iter()
                .any(|f| l.starts_with(f))
        })
        .map(str::to_string)
        .collect();
    if fields.is_empty() {
        return "(none: no candidate key exists)".into();
    }
    fields.join("\n")
}

/// Wait (up to `secs`) until exactly one running appliance leads `group` and every
/// running one exports the gauge; that appliance's index.
fn wait_one_leader(fleet: &[Bootplane], group: &str, secs: u64) -> usize {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let (l, all) = leaders(fleet, group);
        if all && l.len() == 1 {
            return l[0];
        }
        if Instant::now() > deadline {
            panic!(
                "no single leader of {group} within {secs} s (leaders {l:?}, every \
                 appliance exports bootplane_store_leader: {all}); logs:\n{}",
                election_log(fleet)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `method path` with an optional JSON body and a time limit: (status, body), status 0
/// when no answer came (refused, reset, timed out).
fn try_call(
    b: &Bootplane,
    method: &str,
    path: &str,
    body: Option<&Value>,
    limit: Duration,
) -> (u16, Value) {
    let r = b.req(method, path).timeout(limit);
    let res = match body {
        Some(v) => r
            .set("Content-Type", "application/json")
            .send_string(&v.to_string()),
        None => r.call(),
    };
    let parse = |r: ureq::Response| serde_json::from_str(&r.into_string().unwrap_or_default());
    match res {
        Ok(r) => (r.status(), parse(r).unwrap_or(Value::Null)),
        Err(ureq::Error::Status(c, r)) => (c, parse(r).unwrap_or(Value::Null)),
        Err(_) => (0, Value::Null),
    }
}

/// Servers `NAME-s000`.. labelled `pool: POOL`, created through the appliances in turn
/// from `threads` clients.
fn create_servers(fleet: &[Bootplane], name: &str, pool: &str, n: usize, threads: usize) {
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                for i in (t..n).step_by(threads) {
                    let b = &fleet[i % fleet.len()];
                    let srv = server(&format!("{name}-s{i:03}"), json!({"pool": pool}), "Recycle");
                    let (c, v) = b.call("POST", SERVERS, Some(&srv));
                    assert_eq!(c, 201, "server {i} through {}: {v}", b.api);
                }
            });
        }
    });
}

/// A claim `name` in `ns` for any server of `pool`.
fn pool_claim(name: &str, ns: &str, pool: &str) -> Value {
    let mut c = claim(name, Some(json!({"matchLabels": {"pool": pool}})), None);
    c["metadata"]["namespace"] = json!(ns);
    c
}

/// (claims, Bound, Unbound) in `ns` as appliance `b` lists them.
fn phase_counts(b: &Bootplane, ns: &str) -> (usize, usize, usize) {
    let list = b.get(&claims(ns));
    let items = list["items"].as_array().unwrap();
    let count = |p: &str| items.iter().filter(|c| c["status"]["phase"] == p).count();
    (items.len(), count("Bound"), count("Unbound"))
}

/// No Server is bound twice and no claim holds two Servers, as `b` lists them: each
/// Server names at most one claim of `ns` and each claim is named by at most one
/// Server; every Bound claim's `spec.serverRef` is a Server no other Bound claim names,
/// and that Server's `spec.serverClaimRef` points back at it. The number of Bound
/// claims.
fn assert_no_double_binding(b: &Bootplane, ns: &str) -> usize {
    let servers = b.get(SERVERS);
    let mut by_claim: HashMap<String, Vec<String>> = HashMap::new();
    for s in servers["items"].as_array().unwrap() {
        if let Some(r) = s["spec"]["serverClaimRef"].as_object() {
            if r["namespace"] == ns {
                by_claim
                    .entry(r["name"].as_str().unwrap().to_string())
                    .or_default()
                    .push(s["metadata"]["name"].as_str().unwrap().to_string());
            }
        }
    }
    for (c, s) in &by_claim {
        assert_eq!(
            s.len(),
            1,
            "claim {ns}/{c} holds servers {s:?} (via {})",
            b.api
        );
    }
    let list = b.get(&claims(ns));
    let mut seen = HashSet::new();
    for c in list["items"].as_array().unwrap() {
        let name = c["metadata"]["name"].as_str().unwrap();
        let Some(srv) = c["spec"]["serverRef"]["name"].as_str() else {
            continue;
        };
        if c["status"]["phase"] == "Bound" {
            assert!(
                seen.insert(srv.to_string()),
                "server {srv} is the serverRef of two Bound claims (via {})",
                b.api
            );
        }
        // A selector claim gets its serverRef only once it holds the server.
        assert_eq!(
            by_claim.get(name),
            Some(&vec![srv.to_string()]),
            "server {srv} does not point back at claim {ns}/{name} (via {})",
            b.api
        );
    }
    seen.len()
}

/// Wait until every running appliance lists `want` = (claims, Bound, Unbound) in `ns`
/// and agrees there is no double binding.
fn wait_settled(fleet: &[Bootplane], ns: &str, want: (usize, usize, usize), secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    for b in fleet.iter().filter(|b| b.child.is_some()) {
        let mut last = (0, 0, 0);
        while Instant::now() < deadline {
            last = phase_counts(b, ns);
            if last == want {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(
            last,
            want,
            "{ns} through {} (claims, Bound, Unbound) after {secs} s; log tail:\n{}",
            b.api,
            tail(&b.log(), 30)
        );
        assert_eq!(assert_no_double_binding(b, ns), want.1, "via {}", b.api);
    }
}

// ---------------------------------------------------------------------------------------
// The issue's tests
// ---------------------------------------------------------------------------------------

/// 400 claims race for 100 Servers through 3 appliances' APIs at once, 5 rounds (fresh
/// Servers, pool and namespace each round; in round 2 the metal leader is stopped with
/// SIGTERM while the claims bind, and started again): exactly 100 end Bound, no Server
/// is bound twice, and every appliance's own copy agrees.
#[test]
fn four_hundred_claims_race_for_a_hundred_servers_through_three_appliances() {
    let etcd = EtcdCluster::start(3);
    let prefix = unique_prefix("race");
    let mut fleet = start_appliances(&etcd, 3, &prefix);
    let leader = wait_one_leader(&fleet, "metal", 30);
    eprintln!("metal leader: appliance {leader}");
    let started = Instant::now();
    for round in 0..5 {
        let t = Instant::now();
        let (pool, ns) = (format!("race{round}"), format!("r{round}"));
        create_servers(&fleet, &pool, &pool, 100, 12);
        // 400 claims from 24 concurrent clients, round-robin over the 3 APIs.
        std::thread::scope(|s| {
            for t in 0..24 {
                let (fleet, pool, ns) = (&fleet, &pool, &ns);
                s.spawn(move || {
                    for i in (t..400).step_by(24) {
                        let b = &fleet[i % 3];
                        let c = pool_claim(&format!("c{i:03}"), ns, pool);
                        let (code, v) = b.call("POST", &claims(ns), Some(&c));
                        assert_eq!(code, 201, "claim {i} through {}: {v}", b.api);
                    }
                });
            }
        });
        if round == 2 {
            // A graceful handover while the claims bind: SIGTERM the metal leader (it
            // resigns; another takes over without waiting for the lease), then start
            // it again on its state dir.
            let l = wait_one_leader(&fleet, "metal", 10);
            let t = Instant::now();
            let st = fleet[l].stop();
            assert!(st.success(), "appliance {l} exited {st} on SIGTERM");
            let next = wait_one_leader(&fleet, "metal", LEASE_TTL_SECS);
            eprintln!(
                "round {round}: metal leader {l} stopped, {next} leads {:?} after the SIGTERM",
                t.elapsed()
            );
            fleet[l].spawn();
        }
        wait_settled(&fleet, &ns, (400, 100, 300), 60);
        // Let in-flight reconciles land, then look again.
        std::thread::sleep(Duration::from_millis(300));
        wait_settled(&fleet, &ns, (400, 100, 300), 5);
        eprintln!("round {round}: settled in {:?}", t.elapsed());
    }
    eprintln!("5 rounds in {:?}", started.elapsed());
    // Still exactly one leader of each group.
    wait_one_leader(&fleet, "metal", 5);
    wait_one_leader(&fleet, "provisioning", 5);
    // The key layout docs/cluster.md gives: objects and elections under the prefix,
    // nothing outside it.
    let out = etcd.etcdctl(&["get", "", "--from-key", "--keys-only"]);
    assert!(out.status.success(), "{}", support::process::text(&out));
    let keys: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    let outside: Vec<&String> = keys
        .iter()
        .filter(|k| {
            !k.starts_with(&format!("{prefix}objects/"))
                && !k.starts_with(&format!("{prefix}election/"))
        })
        .collect();
    assert!(
        outside.is_empty(),
        "keys outside {prefix}objects/ and {prefix}election/: {outside:?}"
    );
    for k in [
        format!("{prefix}objects/metal.ironcore.dev/servers/race0-s000"),
        format!("{prefix}objects/metal.ironcore.dev/serverclaims/r0/c000"),
    ] {
        assert!(keys.contains(&k), "no key {k}");
    }
    for group in ["metal", "provisioning"] {
        let n = keys
            .iter()
            .filter(|k| k.starts_with(&format!("{prefix}election/{group}/")))
            .count();
        assert_eq!(
            n, 3,
            "one candidate key per appliance in the {group} election"
        );
    }
}

/// SIGKILL the appliance leading `metal` in the middle of a claim burst (150 Servers,
/// killed once 80 claims were acknowledged, so at least 70 bindings are left to its
/// successor): another one takes over within the lease TTL + 5 s, every create that was
/// answered 2xx (through any appliance, the killed one included) is there afterwards,
/// and every claim that can be bound ends bound, none twice.
#[test]
fn killing_the_metal_leader_mid_burst_fails_over_and_loses_nothing() {
    let etcd = EtcdCluster::start(3);
    let prefix = unique_prefix("failover");
    let mut fleet = start_appliances(&etcd, 3, &prefix);
    let leader = wait_one_leader(&fleet, "metal", 30);
    let servers = 150;
    create_servers(&fleet, "kb", "kb", servers, 6);
    let acked = Mutex::new(Vec::<String>::new());
    let (clients, per_client) = (6, 50);
    let kill_at = 80;
    let took = std::thread::scope(|s| {
        for t in 0..clients {
            let acked = &acked;
            // Each client keeps its own URLs: the main thread kills one appliance meanwhile.
            let targets: Vec<(String, String, ureq::Agent)> = fleet
                .iter()
                .map(|b| (b.api.clone(), b.token.clone(), b.agent.clone()))
                .collect();
            s.spawn(move || {
                for i in 0..per_client {
                    let name = format!("k{t}-{i:02}");
                    let (api, token, agent) = &targets[(t + i) % targets.len()];
                    let r = agent
                        .post(&format!("{api}{}", claims("default")))
                        .set("Authorization", &format!("Bearer {token}"))
                        .set("Content-Type", "application/json")
                        .timeout(Duration::from_secs(10))
                        .send_string(&pool_claim(&name, "default", "kb").to_string());
                    if matches!(&r, Ok(r) if (200..300).contains(&r.status())) {
                        acked.lock().unwrap().push(name);
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            });
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while acked.lock().unwrap().len() < kill_at {
            assert!(Instant::now() < deadline, "the burst did not get going");
            std::thread::sleep(Duration::from_millis(10));
        }
        fleet[leader].kill9();
        let killed = Instant::now();
        let survivor = fleet.iter().find(|b| b.child.is_some()).unwrap();
        let (n, bound, _) = phase_counts(survivor, "default");
        eprintln!("at the kill: {n} claims, {bound} Bound");
        let limit = Duration::from_secs(LEASE_TTL_SECS + 5);
        loop {
            let (l, _) = leaders(&fleet, "metal");
            if l.len() == 1 {
                break killed.elapsed();
            }
            assert!(
                killed.elapsed() < limit,
                "no single appliance took over metal within {limit:?} of the leader's kill \
                 (appliance {leader}; now leading: {l:?}); logs:\n{}\ncandidate keys:\n{}",
                election_log(&fleet),
                election_keys(&etcd, &prefix, "metal")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    eprintln!("metal leader (appliance {leader}) killed: another appliance led it {took:?} later");
    let acked = acked.into_inner().unwrap();
    let survivor = fleet.iter().find(|b| b.child.is_some()).unwrap();
    let names = |b: &Bootplane| -> HashSet<String> {
        b.get(&claims("default"))["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    // The survivor's copy follows etcd by watch: give it a moment to catch up.
    let deadline = Instant::now() + Duration::from_secs(10);
    let missing = loop {
        let have = names(survivor);
        let missing: Vec<&String> = acked.iter().filter(|n| !have.contains(*n)).collect();
        if missing.is_empty() || Instant::now() > deadline {
            break missing;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        missing.is_empty(),
        "acknowledged claims are gone: {missing:?}"
    );
    std::thread::sleep(Duration::from_millis(500));
    let names = names(survivor);
    // Claims whose POST went unanswered (to the killed appliance) may exist or not;
    // every one that exists is settled: one per Server Bound, the rest Unbound.
    let total = names.len();
    assert!(total >= acked.len());
    eprintln!("{} claims acknowledged, {total} exist", acked.len());
    let bound = total.min(servers);
    wait_settled(&fleet, "default", (total, bound, total - bound), 60);
    wait_one_leader(&fleet, "metal", 5);
    let listed = survivor.get(&format!("{SERVERS}?labelSelector=pool%3Dkb"));
    assert_eq!(listed["items"].as_array().unwrap().len(), servers);
}

/// The `metal` leader paused (SIGSTOP, as a VM freeze or a long stall) past its lease
/// while claims arrive: another appliance leads; resumed, the old leader finds its
/// leadership gone (its writes are fenced on a key that went with its lease), stops
/// leading, and no Server is ever bound twice; every claim settles.
#[test]
fn a_paused_leader_resumes_fenced_and_never_binds_twice() {
    let etcd = EtcdCluster::start(3);
    let prefix = unique_prefix("pause");
    let fleet = start_appliances(&etcd, 2, &prefix);
    let leader = wait_one_leader(&fleet, "metal", 30);
    let other = 1 - leader;
    let servers = 40;
    create_servers(&fleet, "ps", "ps", servers, 4);
    let post = |from: std::ops::Range<usize>| {
        for i in from {
            let (c, v) = fleet[other].call(
                "POST",
                &claims("default"),
                Some(&pool_claim(&format!("p-{i:03}"), "default", "ps")),
            );
            assert_eq!(c, 201, "claim {i}: {v}");
        }
    };
    post(0..20);
    let pid = nix::unistd::Pid::from_raw(fleet[leader].child.as_ref().unwrap().id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let paused = Instant::now();
    post(20..60);
    let limit = Duration::from_secs(LEASE_TTL_SECS + 5);
    while leads(&fleet[other], "metal") != Some(true) {
        assert!(
            paused.elapsed() < limit,
            "no takeover within {limit:?} of the pause; logs:\n{}",
            election_log(&fleet)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!(
        "metal leader paused: the other appliance led {:?} later",
        paused.elapsed()
    );
    // Hold the pause a little longer: the new leader binds meanwhile.
    std::thread::sleep(Duration::from_secs(1));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    let resumed = Instant::now();
    fleet[leader].wait_for(15, "the resumed leader to step down", || {
        (leads(&fleet[leader], "metal") == Some(false)
            && fleet[leader].log().contains("lost leadership"))
        .then_some(())
    });
    eprintln!(
        "resumed old leader stepped down {:?} after SIGCONT",
        resumed.elapsed()
    );
    wait_settled(&fleet, "default", (60, servers, 60 - servers), 60);
    assert_eq!(assert_no_double_binding(&fleet[other], "default"), servers);
    assert_eq!(assert_no_double_binding(&fleet[leader], "default"), servers);
    let (l, _) = leaders(&fleet, "metal");
    assert_eq!(l, vec![other], "one leader, the one that took over");
}

/// etcd members die under two appliances: with one down, writes and claims go on; with
/// two down (no quorum) reads still answer, writes get 503 ServiceUnavailable (and are
/// then never stored) or 504 Timeout (etcd's leader held them: they may apply), and a
/// machine whose boot configuration was Ready still gets its iPXE script and Ignition
/// from both boot listeners; once the members are back, writes succeed again without
/// restarting bootplane.
#[test]
fn etcd_members_down_then_back_reads_and_boots_go_on_writes_recover() {
    let mut etcd = EtcdCluster::start(3);
    let fleet = start_appliances(&etcd, 2, &unique_prefix("quorum"));
    wait_one_leader(&fleet, "metal", 30);
    let (a, b) = (&fleet[0], &fleet[1]);
    // A machine at 127.0.0.21 with a Ready boot configuration.
    let machine = "127.0.0.21";
    assert_eq!(
        a.call(
            "POST",
            SERVERS,
            Some(&server_at("q-boot", "52:54:00:21:00:01", machine))
        )
        .0,
        201
    );
    let ign = r#"{"ignition":{"version":"3.4.0"},"storage":{"files":[{"path":"/etc/hostname","contents":{"source":"data:,q-boot"}}]}}"#;
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "q-boot-ign"}, "stringData": {"ignition": ign}});
    a.claim_ready_with_ignition("q-boot", "q-boot", &secret, 30);
    let boots = |what: &str| {
        for x in &fleet {
            let base = format!("http://127.0.0.1:{}", x.http_port);
            // With a script token (each appliance's own key).
            let (code, script) = curl_get(machine, &x.signed_script_url("q-boot"));
            assert_eq!(code, 200, "{what}: script from {base}: {script}");
            assert!(
                script.contains("/assets/images/os/kernel"),
                "{what}: {base} served no kernel line:\n{script}"
            );
            let url = script
                .split_whitespace()
                .find_map(|w| w.strip_prefix("ignition.config.url="))
                .unwrap_or_else(|| panic!("{what}: {base} served no ignition URL:\n{script}"));
            let (code, body) = curl_get(machine, url);
            assert_eq!(
                (code, body.as_str()),
                (200, ign),
                "{what}: Ignition from {base}"
            );
        }
    };
    // Both boot listeners serve it (b from its own watch).
    b.wait_for(20, "the second appliance serves the machine", || {
        (curl_get(machine, &b.signed_script_url("q-boot")).0 == 200).then_some(())
    });
    boots("all members up");

    // One member down: writes and claims go on at once, through both appliances. The
    // member killed is a follower (killing etcd's leader stalls writes for an election,
    // ~1 s here: they would get 503 meanwhile), the first in the endpoint list if it can.
    let etcd_leader = b.wait_for(10, "etcd's leader", || etcd.leader());
    let follower = (0..3).find(|&i| i != etcd_leader).unwrap();
    eprintln!("killing etcd member {follower} (etcd's leader: {etcd_leader})");
    etcd.kill(follower);
    let mut refused = Vec::new();
    for (i, x) in fleet.iter().enumerate() {
        for j in 0..10 {
            let srv = server(&format!("q1-{i}-{j}"), json!({"pool": "q1"}), "Recycle");
            let (code, v) = try_call(x, "POST", SERVERS, Some(&srv), Duration::from_secs(10));
            if code != 201 {
                refused.push(format!("server q1-{i}-{j} through {}: {code} {v}", x.api));
            }
        }
        for j in 0..2 {
            let c = pool_claim(&format!("q1-{i}-{j}"), "default", "q1");
            let (code, v) = try_call(
                x,
                "POST",
                &claims("default"),
                Some(&c),
                Duration::from_secs(10),
            );
            if code != 201 {
                refused.push(format!("claim q1-{i}-{j} through {}: {code} {v}", x.api));
            }
        }
    }
    assert!(
        refused.is_empty(),
        "{} of 24 writes refused with one etcd member (a follower) down:\n{}",
        refused.len(),
        refused.join("\n")
    );
    b.wait_for(30, "claims bound with one member down", || {
        let list = b.get(&claims("default"));
        let bound = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["metadata"]["name"].as_str().unwrap().starts_with("q1-"))
            .filter(|c| c["status"]["phase"] == "Bound")
            .count();
        (bound == 4).then_some(())
    });

    // Two down: no quorum.
    let second = (0..3).find(|&i| etcd.is_running(i)).unwrap();
    etcd.kill(second);
    let lost = Instant::now();
    for x in &fleet {
        let t = Instant::now();
        let (code, v) = try_call(x, "GET", SERVERS, None, Duration::from_secs(5));
        assert_eq!(code, 200, "GET without quorum through {}: {v}", x.api);
        assert!(
            v["items"].as_array().unwrap().len() >= 21,
            "the local copy lists the servers: {v}"
        );
        eprintln!(
            "GET without quorum through {} answered in {:?}",
            x.api,
            t.elapsed()
        );
        let (code, v) = try_call(
            x,
            "GET",
            &format!("{SERVERS}/q-boot"),
            None,
            Duration::from_secs(5),
        );
        assert_eq!(
            code, 200,
            "GET one server without quorum through {}: {v}",
            x.api
        );
    }
    // A write is refused before any member takes it (503 ServiceUnavailable: nothing
    // was written), or etcd's leader took it and held it past the request timeout (504
    // Timeout, as kube's: it may apply once the quorum is back; read it again).
    let mut refused = Vec::new();
    for (i, x) in fleet.iter().enumerate() {
        let t = Instant::now();
        let name = format!("q-noquorum-{i}");
        let srv = server(&name, json!({}), "Recycle");
        let (code, v) = try_call(x, "POST", SERVERS, Some(&srv), Duration::from_secs(20));
        eprintln!(
            "write without quorum through {} answered {code} in {:?}",
            x.api,
            t.elapsed()
        );
        assert_eq!(v["kind"], "Status", "{v}");
        let message = v["message"].as_str().unwrap_or("");
        match code {
            503 => {
                assert_eq!(v["reason"], "ServiceUnavailable", "{v}");
                assert!(message.starts_with("store unavailable"), "{v}");
                refused.push(name);
            }
            504 => {
                assert_eq!(v["reason"], "Timeout", "{v}");
                assert!(message.contains("read it again before retrying"), "{v}");
            }
            _ => panic!("write without quorum through {}: {code} {v}", x.api),
        }
    }
    boots("without quorum");
    eprintln!("quorum lost for {:?} so far", lost.elapsed());

    // Members back: writes succeed again, bootplane untouched.
    etcd.restart(follower);
    etcd.restart(second);
    let back = Instant::now();
    let limit = Duration::from_secs(30);
    let mut n = 0;
    let took = loop {
        n += 1;
        let srv = server(&format!("q-back-{n}"), json!({"pool": "qb"}), "Recycle");
        let (code, v) = try_call(a, "POST", SERVERS, Some(&srv), Duration::from_secs(10));
        if code == 201 {
            break back.elapsed();
        }
        assert!(
            back.elapsed() < limit,
            "writes still fail {limit:?} after the members came back: {code} {v}; log tail:\n{}",
            tail(&a.log(), 30)
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!("writes accepted again {took:?} after the members restarted");
    for x in &fleet {
        assert!(x.child.is_some());
    }
    etcd.wait_healthy(Duration::from_secs(30));
    // What was answered 503 was not written, then or later.
    for name in &refused {
        let (code, v) = try_call(
            a,
            "GET",
            &format!("{SERVERS}/{name}"),
            None,
            Duration::from_secs(5),
        );
        assert_eq!(code, 404, "{name} was refused with 503 but is stored: {v}");
    }
    // The other appliance's mirror follows etcd again before it is written through: its
    // etcd watch was cut by the outage and resumes on its own schedule, and a write's
    // read-your-writes wait is bounded by request_timeout_ms (2 s here), so a write made
    // before the mirror resumed can answer 201 and not be readable there yet (a run on
    // a loaded machine got 404 for the claim just created).
    let last = format!("{SERVERS}/q-back-{n}");
    b.wait_for(
        30,
        "the other appliance's mirror to follow etcd again",
        || (try_call(b, "GET", &last, None, Duration::from_secs(5)).0 == 200).then_some(()),
    );
    // Writes through the other appliance, and the controllers run again: a claim binds.
    let (code, v) = try_call(
        b,
        "POST",
        &claims("default"),
        Some(&pool_claim("q-after", "default", "qb")),
        Duration::from_secs(10),
    );
    assert_eq!(code, 201, "{v}");
    let path = format!("{}/q-after", claims("default"));
    b.wait_for(30, "a claim bound after the outage", || {
        (b.get(&path)["status"]["phase"] == "Bound").then_some(())
    });
    wait_one_leader(&fleet, "metal", 10);
    boots("after the outage");
}
