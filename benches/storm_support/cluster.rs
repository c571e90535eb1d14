//! `boot_storm --cluster` (issue 21): the storm against appliances sharing etcd.
//!
//! Three scenarios, each run `--rounds` times (default 3, 1 with `--quick`), interleaved
//! round by round (1 2 3 1 2 3 ...), each round on fresh namespaces, state and etcd:
//!
//! 1. **1 embedded**: one appliance on its embedded store;
//! 2. **2 on etcd**: two appliances on a 3-member etcd, both answering the machines'
//!    segment (authoritative DHCP over the same pool, TFTP, boot HTTP), each with its
//!    own address; leases are compare-and-swaps in etcd (`crates/proto/src/dhcp/cluster.rs`);
//! 3. **2 on etcd, 1 killed**: as 2, and the appliance leading `metal` is SIGKILLed
//!    when half of the machines have powered on (machine N/2's power-on does it).
//!
//! Network, per round: a switch namespace with two bridges, `br0` (the machines'
//! segment, 10.199.64.0/18, no address) and `br1` (a backplane, 10.197.0.1/24, where the
//! 3 etcd members listen on 10.197.0.1); the client namespace's `vc` (all the pool's
//! addresses, as in the two-sided storm) on `br0`; appliance i in a namespace of its
//! own with `eth0` on `br0` (10.199.64.(1+i)/18, permanent neighbour entries for the
//! pool) and `bk0` on `br1` (10.197.0.(10+i)/24). Scenario 1 runs on the same topology
//! with one appliance, so the ratio compares the store and the second appliance, not
//! the wiring.
//!
//! The machines are the storm's (DHCP with the PXE retransmission timers, TFTP,
//! `/boot.ipxe`, script, Ignition); here each one fetches TFTP from the appliance that
//! ACKed its firmware's DHCP (next-server) and HTTP from the script URL of the one that
//! ACKed iPXE's, as iPXE chains it, and takes an ACK or NAK only from the server it
//! chose (option 54), as iPXE does (udhcpc for NAKs). One appliance answers each DISCOVER
//! (the MAC's owner, `crates/proto/src/dhcp/members.rs`); a REQUEST naming a killed
//! appliance is answered by the owner among the live on its behalf. A machine whose
//! boot fails at a stage (its retries of that stage spent) fails, unless
//! `--boot-retries N` lets it power through its boot sequence again (default 0); a
//! failed attempt absorbed so is reported apart from the machines that did not boot.
//! With the kill, the killed appliance's machines (the MACs it owned) still booting at
//! the kill are followed: the goal is that none fails and the last of them is done 10 s
//! after it. A TFTP transfer in flight from the killed appliance cannot move (its server
//! is gone; the client is told `port unreachable` or times out): each is a failure with
//! `--boot-retries 0`, as with firmware that does not retry its boot.
//!
//! Servers are written through appliance c % k and claims through (c + 1) % k (client
//! thread c), so a machine's Server and claim come through different appliances; the
//! storm starts once every appliance's watch has seen every boot configuration Ready.

use super::support::etcd::EtcdCluster;
use super::*;
use bootplane::dhcp::members::owner;

/// The backplane's network (etcd on .1, appliance i on .(10+i)).
const BACKPLANE: &str = "10.197.0";
/// Appliance names, in index order.
const NAMES: [&str; 2] = ["a", "b"];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Scenario {
    Embedded,
    Etcd,
    EtcdKill,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Embedded => "1 embedded",
            Scenario::Etcd => "2 on etcd",
            Scenario::EtcdKill => "2, 1 killed",
        }
    }
    fn appliances(self) -> usize {
        match self {
            Scenario::Embedded => 1,
            Scenario::Etcd | Scenario::EtcdKill => 2,
        }
    }
}

/// The address of appliance `i` on the machines' segment.
fn app_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 199, 64, 1 + i as u8)
}

/// The switch, the client and `k` appliance namespaces (see the module doc).
struct ClusterLab {
    apps: Vec<Netns>,
    client: Netns,
    sw: Netns,
    pool: Vec<Ipv4Addr>,
}

impl ClusterLab {
    fn new(k: usize, pool_size: usize, dir: &Path) -> ClusterLab {
        let sw = Netns::new("ssw");
        let client = Netns::new("scl");
        let apps: Vec<Netns> = (0..k)
            .map(|i| Netns::new(&format!("s{}", NAMES[i])))
            .collect();
        for ns in apps.iter().chain([&sw, &client]) {
            ns.exec(&["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"]);
            ns.exec(&["sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1"]);
        }
        sw.ip(&["link", "add", "br0", "type", "bridge"]);
        sw.ip(&["link", "set", "br0", "up"]);
        sw.bridge("br1", &format!("{BACKPLANE}.1/24"));
        let veth = |a: &str, a_ns: &Netns, b: &str, b_ns: &Netns| {
            support::process::must(
                "ip",
                &[
                    "link", "add", a, "netns", &a_ns.name, "type", "veth", "peer", "name", b,
                    "netns", &b_ns.name,
                ],
            );
        };
        veth("vc", &client, "pc", &sw);
        sw.ip(&["link", "set", "pc", "master", "br0"]);
        sw.ip(&["link", "set", "pc", "up"]);
        client.ip(&["link", "set", "vc", "up"]);
        client.ip(&[
            "route",
            "add",
            &format!("10.199.64.0/{PREFIX}"),
            "dev",
            "vc",
        ]);
        let vc_mac = support::netns::mac_of(&client, "vc");
        let pool: Vec<Ipv4Addr> = (0..pool_size as u32)
            .map(|k| Ipv4Addr::from(POOL_START + k))
            .collect();
        let mut addrs = String::new();
        let mut neigh = String::new();
        for a in &pool {
            addrs.push_str(&format!("addr add {a}/32 dev vc\n"));
            neigh.push_str(&format!(
                "neigh replace {a} lladdr {vc_mac} dev eth0 nud permanent\n"
            ));
        }
        client.ip_batch(&addrs, dir);
        for (i, ns) in apps.iter().enumerate() {
            let (pa, ka) = (format!("pa{i}"), format!("ka{i}"));
            veth("eth0", ns, &pa, &sw);
            veth("bk0", ns, &ka, &sw);
            for (port, br) in [(&pa, "br0"), (&ka, "br1")] {
                sw.ip(&["link", "set", port, "master", br]);
                sw.ip(&["link", "set", port, "up"]);
            }
            ns.ip(&[
                "addr",
                "add",
                &format!("{}/{PREFIX}", app_ip(i)),
                "dev",
                "eth0",
            ]);
            ns.ip(&[
                "addr",
                "add",
                &format!("{BACKPLANE}.{}/24", 10 + i),
                "dev",
                "bk0",
            ]);
            ns.ip(&["link", "set", "eth0", "up"]);
            ns.ip(&["link", "set", "bk0", "up"]);
            ns.ip_batch(&neigh, dir);
        }
        ClusterLab {
            apps,
            client,
            sw,
            pool,
        }
    }

    fn range(&self) -> (Ipv4Addr, Ipv4Addr) {
        (self.pool[0], *self.pool.last().unwrap())
    }
}

/// A running appliance of a round.
struct App {
    name: &'static str,
    netns: String,
    token: String,
    /// Its state dir (the API's CA).
    state: PathBuf,
    log: PathBuf,
    proc: Proc,
}

impl App {
    fn pid(&self) -> u32 {
        self.proc.child.id()
    }

    /// Its `/metrics` (read inside its namespace); "" when it does not answer.
    fn metrics(&self) -> String {
        let (netns, token) = (self.netns.clone(), self.token.clone());
        let agent = super::support::api_agent(&self.state);
        std::thread::spawn(move || {
            enter_thread(&netns);
            agent
                .get("https://127.0.0.1:9090/metrics")
                .set("Authorization", &format!("Bearer {token}"))
                .timeout(Duration::from_secs(5))
                .call()
                .ok()
                .and_then(|r| r.into_string().ok())
                .unwrap_or_default()
        })
        .join()
        .unwrap_or_default()
    }
}

/// The sum of the samples of `name` (any labels containing `label`) in a metrics text.
fn metric_sum(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with(' ') || r.starts_with('{'))
                && l.contains(label)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// One round of one scenario.
struct Run {
    scenario: Scenario,
    summary: Summary,
    /// Which appliance led `metal` when the storm began.
    leader: String,
    /// DHCP ACKs per appliance during the round ("killed" for the one killed).
    acks: Vec<String>,
    /// CPU seconds the etcd members used during the storm.
    etcd_cpu: f64,
    /// With a kill: the killed appliance's machines (those whose MAC it owned) still
    /// booting at the kill.
    after_kill: Option<AfterKill>,
}

/// The killed appliance's machines that were still booting at the kill.
#[derive(Clone, Copy)]
struct AfterKill {
    booting: usize,
    /// Of those, how many failed, and when the last that booted was done (s after it).
    failed: usize,
    last_booted: f64,
}

fn run_scenario(a: &Args, sc: Scenario, round: usize, dir: &Path) -> Run {
    let n = a.machines;
    let k = sc.appliances();
    let pool = n + (n / 10).max(64);
    let lab = ClusterLab::new(k, pool, dir);
    let range = lab.range();
    let etcd = (sc != Scenario::Embedded)
        .then(|| EtcdCluster::start_in(3, &lab.sw, &format!("{BACKPLANE}.1")));
    let images = storm_images(dir);
    let tftp_root = boot_file(dir);
    let mut apps: Vec<App> = Vec::new();
    for (i, netns) in lab.apps.iter().enumerate() {
        let name = NAMES[i];
        let state = dir.join(format!("state-{name}"));
        let mut cfg = bootplane_config(&state, "eth0", app_ip(i), range, &tftp_root, &images);
        if let Some(etcd) = &etcd {
            cfg.push_str(&format!(
                "[store]\nbackend = \"etcd\"\nencryption_key_file = {:?}\n\
                 [store.etcd]\nendpoints = {:?}\nallow_plaintext = true\nprefix = \"/storm-{}-{round}/\"\nname = \"{name}\"\nlease_ttl_secs = 3\n",
                etcd.key_file().display().to_string(),
                etcd.endpoints(),
                std::process::id(),
            ));
        }
        let cfg_path = dir.join(format!("bootplane-{name}.toml"));
        std::fs::write(&cfg_path, cfg).unwrap();
        let log_path = dir.join(format!("bootplane-{name}.log"));
        let log = std::fs::File::create(&log_path).unwrap();
        let mut c = netns.cmd(env!("CARGO_BIN_EXE_bootplane"));
        c.args(["serve", "--config", cfg_path.to_str().unwrap()])
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        let proc = Proc {
            child: c.spawn().expect("starting bootplane"),
        };
        let read_log = || std::fs::read_to_string(&log_path).unwrap_or_default();
        wait_until(Duration::from_secs(60), "bootplane to listen", || {
            let l = read_log();
            l.contains("dhcp server listening") && l.contains("tftp server listening")
        });
        let token_path = state.join("api-token");
        wait_until(Duration::from_secs(30), "the api token", || {
            token_path.exists()
        });
        apps.push(App {
            name,
            netns: netns.name.clone(),
            token: std::fs::read_to_string(&token_path)
                .unwrap()
                .trim()
                .to_string(),
            state: state.clone(),
            log: log_path,
            proc,
        });
    }

    let t = Instant::now();
    let targets: Vec<(String, String, PathBuf)> = apps
        .iter()
        .map(|p| (p.netns.clone(), p.token.clone(), p.state.clone()))
        .collect();
    let ready = register(n, &targets);
    println!(
        "{} (round {}): {n} servers and claims written through {k} appliance(s), {ready} boot configurations Ready on every appliance in {:.1}s",
        sc.name(),
        round + 1,
        t.elapsed().as_secs_f64()
    );
    assert_eq!(ready, n, "not every boot configuration became Ready");
    std::thread::sleep(Duration::from_secs(1));

    // Who leads metal now (the one killed in scenario 3).
    let mut leader = None;
    let deadline = Instant::now() + Duration::from_secs(30);
    while leader.is_none() && Instant::now() < deadline {
        leader = apps.iter().position(|p| {
            metric_sum(&p.metrics(), "bootplane_store_leader", "group=\"metal\"") == 1.0
        });
        if leader.is_none() && k == 1 {
            // the embedded store runs its controllers without an election
            leader = Some(0);
        }
        if leader.is_none() {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    let leader = leader.expect("an appliance leads metal");
    let acks_before: Vec<f64> = apps
        .iter()
        .map(|p| metric_sum(&p.metrics(), "bootplane_dhcp_acks_total", ""))
        .collect();

    let victim = (sc == Scenario::EtcdKill).then_some(leader);
    let survivors: Vec<u32> = apps
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != victim)
        .map(|(_, p)| p.pid())
        .collect();
    let etcd_pids = etcd.as_ref().map(|e| e.pids()).unwrap_or_default();
    let etcd_before = usage_of(&etcd_pids);
    let before = usage_of(&survivors);
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample_rss(survivors.clone(), stop.clone());
    let killed_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let at_half: Option<AtHalf> = victim.map(|v| {
        let pid = apps[v].pid() as i32;
        let name = apps[v].name;
        let killed_at = killed_at.clone();
        Box::new(move || {
            // SAFETY: kill(2) on our own child (reaped only when its Proc drops).
            unsafe { libc::kill(pid, libc::SIGKILL) };
            *killed_at.lock().unwrap() = Some(Instant::now());
            println!("  (appliance {name}, the metal leader, SIGKILLed at half-time)");
        }) as AtHalf
    });
    let sa = StormArgs {
        machines: n,
        ramp: a.ramp,
        concurrency: a.concurrency,
        http_base: HttpBase::FromLease,
        timeout: a.timeout,
        client_threads: a.client_threads,
        tftp_threads: a.tftp_threads,
        boot_retries: a.boot_retries.unwrap_or(0),
        tftp_window: a.tftp_window,
    };
    let storm_res = lab.client.run(move || storm(&sa, at_half));
    let after_kill = victim.zip(*killed_at.lock().unwrap()).map(|(v, at)| {
        let names = &NAMES[..k];
        let theirs: Vec<&Result1> = storm_res
            .results
            .iter()
            .enumerate()
            .filter(|(i, r)| {
                r.ended > at
                    && owner(names.iter().copied(), &Machine::new(*i).mac) == Some(NAMES[v])
            })
            .map(|(_, r)| r)
            .collect();
        let ak = AfterKill {
            booting: theirs.len(),
            failed: theirs.iter().filter(|r| !r.ok).count(),
            last_booted: theirs
                .iter()
                .filter(|r| r.ok)
                .map(|r| r.ended.duration_since(at).as_secs_f64())
                .fold(0.0, f64::max),
        };
        println!(
            "  ({} of {}'s machines were booting at the kill: {} failed, the last of the others booted {:.1}s after it)",
            ak.booting, NAMES[v], ak.failed, ak.last_booted
        );
        ak
    });
    stop.store(true, Ordering::SeqCst);
    let storm_rss_kib = sampler.join().unwrap_or(0);
    let after = usage_of(&survivors);
    let etcd_after = usage_of(&etcd_pids);
    let acks: Vec<String> = apps
        .iter()
        .enumerate()
        .map(|(i, p)| {
            if Some(i) == victim {
                format!("{} killed", p.name)
            } else {
                let now = metric_sum(&p.metrics(), "bootplane_dhcp_acks_total", "");
                format!("{} {:.0}", p.name, now - acks_before[i])
            }
        })
        .collect();
    let alive = survivors.iter().all(|p| proc_usage(*p).is_some());
    let mut note = format!(
        "metal leader {}; DHCP ACKs {}",
        apps[leader].name,
        acks.join(", ")
    );
    if !alive {
        note.push_str("; an appliance exited during the storm");
    }
    if victim.is_some() {
        note.push_str("; CPU and RSS are the survivor's");
    }
    for p in &apps {
        let _ = std::fs::copy(
            &p.log,
            std::env::temp_dir().join(format!("boot-storm-cluster-{}.log", p.name)),
        );
    }
    let side = Side {
        name: sc.name(),
        storm_rss_kib,
        storm: storm_res,
        usage_before: before,
        usage_after: after,
        note,
    };
    let summary = summarize(&side);
    let etcd_cpu = etcd_after.cpu_ticks.saturating_sub(etcd_before.cpu_ticks) as f64 / clk_tck();
    if etcd.is_some() {
        println!("{:<14} etcd (3 members) used {etcd_cpu:.2}s CPU", "");
    }
    let leader_name = apps[leader].name.to_string();
    drop(apps);
    drop(etcd);
    drop(lab);
    Run {
        scenario: sc,
        summary,
        leader: leader_name,
        acks,
        etcd_cpu,
        after_kill,
    }
}

/// Median and (min, max) of `v`.
fn stats(v: &[f64]) -> (f64, f64, f64) {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let m = if s.len() % 2 == 1 {
        s[s.len() / 2]
    } else {
        (s[s.len() / 2 - 1] + s[s.len() / 2]) / 2.0
    };
    (m, s[0], s[s.len() - 1])
}

fn fmt_stats(v: &[f64], unit: &str) -> String {
    let (m, lo, hi) = stats(v);
    format!("{m:.2}{unit} [{lo:.2}-{hi:.2}]")
}

pub(super) fn main_cluster(a: &Args) {
    require_cluster_tools();
    let order = [Scenario::Embedded, Scenario::Etcd, Scenario::EtcdKill];
    println!(
        "cluster storm: {} round(s) of {}, interleaved; boot retries per machine {}; \
         CPU and peak RSS are summed over a scenario's appliances (etcd apart)",
        a.rounds,
        order.map(|s| s.name()).join(" / "),
        a.boot_retries.unwrap_or(0)
    );
    let mut runs: Vec<Run> = Vec::new();
    for round in 0..a.rounds {
        for sc in order {
            let dir = tempfile::tempdir().unwrap();
            println!(
                "-- round {} {} (load average {})",
                round + 1,
                sc.name(),
                loadavg()
            );
            runs.push(run_scenario(a, sc, round, dir.path()));
        }
    }
    println!();
    println!(
        "summary over {} rounds (median [min-max]), load average now {}:",
        a.rounds,
        loadavg()
    );
    let of = |sc: Scenario| -> Vec<&Run> { runs.iter().filter(|r| r.scenario == sc).collect() };
    for sc in order {
        let rs = of(sc);
        let col = |f: &dyn Fn(&Summary) -> f64| -> Vec<f64> {
            rs.iter().map(|r| f(&r.summary)).collect()
        };
        println!(
            "{:<12} completion {} | boot p50 {} p99 {} | CPU {} | peak RSS {} | booted {} of {} per round{}",
            sc.name(),
            fmt_stats(&col(&|s| s.completion), "s"),
            fmt_stats(&col(&|s| s.p50), "s"),
            fmt_stats(&col(&|s| s.p99), "s"),
            fmt_stats(&col(&|s| s.cpu_s), "s"),
            fmt_stats(&col(&|s| s.rss_mib), " MiB"),
            rs.iter()
                .map(|r| r.summary.ok.to_string())
                .collect::<Vec<_>>()
                .join("/"),
            a.machines,
            if sc == Scenario::Embedded {
                String::new()
            } else {
                format!(
                    " | etcd CPU {}",
                    fmt_stats(&rs.iter().map(|r| r.etcd_cpu).collect::<Vec<_>>(), "s")
                )
            }
        );
        for (i, r) in rs.iter().enumerate() {
            println!(
                "{:<12}   round {}: failures {}; attempts retried {}; metal leader {}; DHCP ACKs {}",
                "",
                i + 1,
                r.summary.failures,
                r.summary.absorbed,
                r.leader,
                r.acks.join(", ")
            );
        }
    }
    let (one, two) = (of(Scenario::Embedded), of(Scenario::Etcd));
    let ratio = |f: &dyn Fn(&Summary) -> f64| -> Vec<f64> {
        one.iter()
            .zip(&two)
            .map(|(x, y)| f(&y.summary) / f(&x.summary))
            .collect()
    };
    println!(
        "ratio 2 on etcd / 1 embedded (per round): completion {}, p50 {}, p99 {}, appliances' CPU {}",
        fmt_stats(&ratio(&|s| s.completion), "x"),
        fmt_stats(&ratio(&|s| s.p50), "x"),
        fmt_stats(&ratio(&|s| s.p99), "x"),
        fmt_stats(&ratio(&|s| s.cpu_s), "x"),
    );
    let kill = of(Scenario::EtcdKill);
    println!(
        "one appliance killed at half-time: time to complete {}",
        fmt_stats(
            &kill
                .iter()
                .map(|r| r.summary.completion)
                .collect::<Vec<_>>(),
            "s"
        )
    );
    let ks: Vec<AfterKill> = kill.iter().filter_map(|r| r.after_kill).collect();
    println!();
    if !kill.is_empty() {
        let last: Vec<f64> = ks.iter().map(|k| k.last_booted).collect();
        let worst = last.iter().copied().fold(0.0, f64::max);
        let failed: usize = ks.iter().map(|k| k.failed).sum();
        let per = |f: &dyn Fn(&AfterKill) -> usize| {
            ks.iter()
                .map(|k| f(k).to_string())
                .collect::<Vec<_>>()
                .join("/")
        };
        println!(
            "goal the killed appliance's machines done <= 10 s after the kill: {} (booting at the kill, per round: {}; of them failed: {}; the last of the others booted {} after it)",
            if ks.len() == kill.len() && worst <= 10.0 && failed == 0 { "met" } else { "NOT met" },
            per(&|k| k.booting),
            per(&|k| k.failed),
            fmt_stats(&last, "s"),
        );
    }
    for sc in order {
        let rs = of(sc);
        let failed: usize = rs.iter().map(|r| a.machines - r.summary.ok).sum();
        let what = format!(
            "0 failures with --boot-retries {}",
            a.boot_retries.unwrap_or(0)
        );
        let retried: usize = rs.iter().map(|r| r.summary.absorbed_n).sum();
        println!(
            "goal {what}, {}, {} machines x {} rounds: {}",
            sc.name(),
            a.machines,
            rs.len(),
            if failed == 0 && retried > 0 {
                format!(
                    "met, after {retried} failed attempts that the machines' boot retry \
                     absorbed (failed at: {}; with --boot-retries 0 each would be a \
                     failure)",
                    rs.iter()
                        .map(|r| r.summary.absorbed.clone())
                        .collect::<Vec<_>>()
                        .join(" / ")
                )
            } else if failed == 0 {
                "met".to_string()
            } else {
                format!(
                    "NOT met ({failed} machines did not boot: {})",
                    rs.iter()
                        .map(|r| r.summary.failures.clone())
                        .collect::<Vec<_>>()
                        .join(" / ")
                )
            }
        );
        let shared: usize = rs.iter().map(|r| r.summary.shared_ips).sum();
        println!(
            "goal no address leased to two booted machines, {}: {}",
            sc.name(),
            if shared == 0 {
                "met".to_string()
            } else {
                format!("NOT met ({shared} machines)")
            }
        );
    }
}

fn require_cluster_tools() {
    for (tool, package) in [("etcd", "etcd-server"), ("ip", "iproute2")] {
        let found = std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()));
        assert!(found, "{tool} not found (apt-get install {package})");
    }
}
