//! Two appliances' authoritative DHCP on one segment, their leases shared through etcd
//! (issue 21, `crates/proto/src/dhcp/cluster.rs`), with real programs: a bridge in a namespace of its
//! own (which also runs a single-member etcd on the bridge's address), two `bootplane
//! serve` (`[store] backend = "etcd"`), each in its own namespace on the bridge with its
//! own address, the same subnet and the same range, and busybox udhcpc clients, each on
//! a veth of its own (its own MAC) in a clients' namespace.
//!
//! - 200 clients at once: every client is leased, no address twice, each address's
//!   record in etcd names its client's MAC, and both appliances' lease lists (their
//!   mirrors) show all 200;
//! - etcd frozen: a client renewing is ACKed for what its lease has left, a new client
//!   gets no lease; etcd back: the new client is leased.
//! - the management scope (`[discovery.dhcp]`) on both: every BMC lease, whichever
//!   appliance granted it, becomes one Endpoint, all made by the `metal` group's leader
//!   (its `bootplane_discovery_endpoints_created_total` counts them all, the other's 0);
//!   the leader killed, the other takes over and turns new leases into Endpoints.

use crate::support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::bootplane::serve_in;
use support::etcd_solo::Etcd;
use support::mgmt::metric;
use support::netns::{enter_thread, Netns};
use support::process::{must, read, wait_for, wait_output, Proc};
use support::require::require;

use bootplane::dhcp::members::owner;
use bootplane::model::ident::parse_mac;

/// The segment's first three octets.
const NET: &str = "10.196.9";
const PREFIX: &str = "/bp-cluster/";

struct Lab {
    sw: Netns,
    apps: Vec<Netns>,
    clients: Netns,
    etcd: Etcd,
    dir: tempfile::TempDir,
    bps: Vec<Proc>,
}

fn mac(i: usize) -> String {
    format!("02:c1:00:00:{:02x}:{:02x}", i >> 8, i & 0xff)
}

/// `ip -n NS -batch` of `lines`.
fn ip_batch(ns: &Netns, dir: &Path, name: &str, lines: &[String]) {
    let f = dir.join(name);
    std::fs::write(&f, lines.join("\n") + "\n").unwrap();
    must("ip", &["-n", &ns.name, "-batch", f.to_str().unwrap()]);
}

impl Lab {
    /// The bridge and etcd, appliances `a` (NET.2) and `b` (NET.3), `n` client veths.
    fn new(n: usize) -> Lab {
        let dir = tempfile::tempdir().unwrap();
        let sw = Netns::new("csw");
        let clients = Netns::new("ccl");
        for ns in [&sw, &clients] {
            // no IPv6 chatter from hundreds of interfaces
            ns.exec(&["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"]);
            ns.exec(&["sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1"]);
        }
        sw.bridge("br0", &format!("{NET}.1/24"));
        let etcd = Etcd::start_in(&sw, &format!("{NET}.1"));
        let mut apps = Vec::new();
        for (i, name) in ["a", "b"].iter().enumerate() {
            let ns = Netns::new(&format!("c{name}"));
            let port = format!("p{name}");
            must(
                "ip",
                &[
                    "link", "add", &port, "netns", &sw.name, "type", "veth", "peer", "name",
                    "eth0", "netns", &ns.name,
                ],
            );
            sw.ip(&["link", "set", &port, "master", "br0"]);
            sw.ip(&["link", "set", &port, "up"]);
            ns.ip(&["addr", "add", &format!("{NET}.{}/24", 2 + i), "dev", "eth0"]);
            ns.ip(&["link", "set", "eth0", "up"]);
            apps.push(ns);
        }
        let mut add = Vec::new();
        let mut up = Vec::new();
        for i in 0..n {
            add.push(format!(
                "link add q{i} type veth peer name c{i} address {} netns {}",
                mac(i),
                clients.name
            ));
            add.push(format!("link set q{i} master br0"));
            add.push(format!("link set q{i} up"));
            up.push(format!("link set c{i} up"));
        }
        ip_batch(&sw, dir.path(), "sw.batch", &add);
        ip_batch(&clients, dir.path(), "clients.batch", &up);
        Lab {
            sw,
            apps,
            clients,
            etcd,
            dir,
            bps: Vec::new(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Both appliances: the same range and lease time, leases in etcd.
    fn start(&mut self, lease_time: u32, request_timeout_ms: u64) {
        self.start_scope(lease_time, request_timeout_ms, None);
    }

    /// [`Lab::start`] with the scope `[dhcp]`, or with `mac_db` (a MAC-prefix database)
    /// the management scope `[discovery.dhcp]` (no BMC approved: Endpoints only, nothing
    /// is sent to a device).
    fn start_scope(&mut self, lease_time: u32, request_timeout_ms: u64, mac_db: Option<&str>) {
        let scope = match mac_db {
            None => "[dhcp]".to_string(),
            Some(db) => {
                let macs = self.path("macs.yaml");
                std::fs::write(&macs, db).unwrap();
                format!(
                    "[controller]\npower_driver = \"test\"\n[discovery]\nenabled = true\n\
                     first_boot = false\nmac_db = {:?}\napproved_bmcs = []\n[discovery.dhcp]",
                    macs.display().to_string()
                )
            }
        };
        for (i, name) in ["a", "b"].iter().enumerate() {
            let cfg = format!(
                r#"state_dir = "{state}"
[store]
backend = "etcd"
[store.etcd]
endpoints = ["http://{NET}.1:2379"]
allow_plaintext = true                 # the namespaces' bridge, not loopback
prefix = "{PREFIX}"
name = "{name}"
request_timeout_ms = {request_timeout_ms}
dial_timeout_ms = 1000
lease_ttl_secs = 3
{scope}
enabled = true
interface = "eth0"
mode = "authoritative"
range = "{NET}.20-{NET}.250"
lease_time_secs = {lease_time}
"#,
                state = self.path(&format!("state-{name}")).display(),
            );
            let path = self.path(&format!("{name}.toml"));
            std::fs::write(&path, cfg).unwrap();
            let log = self.path(&format!("bootplane-{name}.log"));
            self.bps.push(serve_in(&self.apps[i], &path, &log));
        }
    }

    /// Kill appliance `i` (SIGKILL) and start it again on the same config.
    fn restart(&mut self, i: usize) {
        let name = ["a", "b"][i];
        self.bps[i].kill9();
        let path = self.path(&format!("{name}.toml"));
        let log = self.path(&format!("bootplane-{name}-2.log"));
        self.bps[i] = serve_in(&self.apps[i], &path, &log);
    }

    /// A udhcpc hook script: `bound|renew <interface> <ip> <lease secs>` to `log`, the
    /// address configured (renewals are unicast from it).
    fn script(&self) -> PathBuf {
        let p = self.path("udhcpc.sh");
        let text = format!(
            "#!/bin/sh\ncase \"$1\" in\n  bound|renew) ip addr replace \"$ip/24\" dev \"$interface\"; \
             echo \"$1 $interface $ip $lease\" >> {} ;;\nesac\nexit 0\n",
            self.path("leases.log").display()
        );
        std::fs::write(&p, text).unwrap();
        must("chmod", &["+x", p.to_str().unwrap()]);
        p
    }

    /// udhcpc on client `i`'s veth: `once` = lease and exit (`-q -n`, `tries` DISCOVERs
    /// a second apart), else stay and renew.
    fn udhcpc(&self, i: usize, once: bool, tries: u32) -> Command {
        let script = self.script();
        let mut c = Command::new("busybox");
        c.args(["udhcpc", "-i", &format!("c{i}"), "-f", "-T", "1"])
            .args(["-t", &tries.to_string()])
            .args(["-s", script.to_str().unwrap()]);
        if once {
            c.args(["-q", "-n"]);
        }
        c.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    /// Start `cmds` from a thread inside the clients' namespace (the children are in it).
    fn spawn_in_clients(&self, cmds: Vec<Command>) -> Vec<Child> {
        let name = self.clients.name.clone();
        std::thread::spawn(move || {
            enter_thread(&name);
            cmds.into_iter()
                .map(|mut c| c.spawn().expect("spawning udhcpc"))
                .collect()
        })
        .join()
        .unwrap()
    }

    /// The last `bound|renew` line per interface: (kind, ip, lease secs).
    fn leases(&self) -> HashMap<String, (String, String, u64)> {
        let mut m = HashMap::new();
        for l in read(&self.path("leases.log")).lines() {
            let f: Vec<&str> = l.split_whitespace().collect();
            if let [kind, iface, ip, secs] = f[..] {
                m.insert(
                    iface.to_string(),
                    (kind.to_string(), ip.to_string(), secs.parse().unwrap_or(0)),
                );
            }
        }
        m
    }

    /// GET `path` on appliance `i`'s API (from inside its namespace), the body.
    fn api_get(&self, i: usize, path: &str) -> String {
        let state = self.path(&format!("state-{}", ["a", "b"][i]));
        let token = read(&state.join("api-token")).trim().to_string();
        let agent = support::api_agent(&state);
        let url = format!("https://127.0.0.1:9090{path}");
        self.apps[i].run(move || {
            agent
                .get(&url)
                .set("Authorization", &format!("Bearer {token}"))
                .call()
                .unwrap()
                .into_string()
                .unwrap()
        })
    }

    /// `/metrics` of appliance `i`.
    fn metrics(&self, i: usize) -> String {
        self.api_get(i, "/metrics")
    }

    /// The items of the list at `path` on appliance `i`.
    fn items(&self, i: usize, path: &str) -> Vec<serde_json::Value> {
        let v: serde_json::Value = serde_json::from_str(&self.api_get(i, path)).unwrap();
        v["items"].as_array().cloned().unwrap_or_default()
    }

    /// The bound leases appliance `i` lists (its index: its own and its mirror's).
    fn listed(&self, i: usize) -> Vec<serde_json::Value> {
        self.items(i, "/apis/dhcp.bootplane.dev/v1alpha1/leases")
    }

    fn logs(&self) -> String {
        ["a", "b"]
            .iter()
            .map(|n| {
                let l = read(&self.path(&format!("bootplane-{n}.log")));
                let lines: Vec<&str> = l.lines().collect();
                format!(
                    "--- {n}:\n{}",
                    lines[lines.len().saturating_sub(30)..].join("\n")
                )
            })
            .collect()
    }
}

#[test]
fn two_appliances_lease_200_clients_with_no_address_twice() {
    require("busybox");
    const N: usize = 200;
    let mut lab = Lab::new(N);
    lab.start(600, 2000);

    let t0 = Instant::now();
    let cmds = (0..N).map(|i| lab.udhcpc(i, true, 30)).collect();
    let children = lab.spawn_in_clients(cmds);
    let mut failed = Vec::new();
    for (i, c) in children.into_iter().enumerate() {
        let out = wait_output(c, Duration::from_secs(90), &format!("udhcpc c{i}"));
        if !out.status.success() {
            failed.push(format!("c{i}: {}", String::from_utf8_lossy(&out.stderr)));
        }
    }
    let took = t0.elapsed();
    assert!(
        failed.is_empty(),
        "{} clients failed: {:?}\n{}",
        failed.len(),
        &failed[..failed.len().min(5)],
        lab.logs()
    );

    // every client leased, no address twice
    let leases = lab.leases();
    assert_eq!(leases.len(), N, "{leases:?}");
    let mut by_ip: HashMap<&str, Vec<&str>> = HashMap::new();
    for (iface, (_, ip, _)) in &leases {
        by_ip.entry(ip.as_str()).or_default().push(iface.as_str());
    }
    let dups: Vec<_> = by_ip.iter().filter(|(_, v)| v.len() > 1).collect();
    assert!(dups.is_empty(), "addresses given twice: {dups:?}");

    // each address's record in etcd is its client's
    let records = lab
        .etcd
        .get_prefix(Some(&lab.sw), &format!("{PREFIX}dhcp/boot/"));
    let mut by = HashMap::new();
    for (iface, (_, ip, _)) in &leases {
        let i: usize = iface[1..].parse().unwrap();
        let key = format!("{PREFIX}dhcp/boot/{ip}");
        let (_, value) = records
            .iter()
            .find(|(k, _)| *k == key)
            .unwrap_or_else(|| panic!("no record for {ip}"));
        let rec: serde_json::Value = serde_json::from_str(value).unwrap();
        assert_eq!(rec["mac"], mac(i), "{key}: {value}");
        assert_eq!(rec["state"], "bound", "{key}: {value}");
        // granted by the client's owner: one appliance answers each DISCOVER
        let owner = owner(["a", "b"], &parse_mac(&mac(i)).unwrap());
        assert_eq!(rec["appliance"].as_str(), owner, "{key}: {value}");
        *by.entry(rec["appliance"].as_str().unwrap().to_string())
            .or_insert(0) += 1;
    }
    assert_eq!(records.len(), N, "one record per client");

    // both appliances list all 200 (their own and the other's, mirrored)
    for i in 0..2 {
        wait_for(
            Duration::from_secs(10),
            || lab.listed(i).len() == N,
            || format!("appliance {i} lists {} leases", lab.listed(i).len()),
        );
    }
    let (ma, mb) = (lab.metrics(0), lab.metrics(1));
    let m = |name: &str| (metric(&ma, name) as u64, metric(&mb, name) as u64);
    let acks = m("bootplane_dhcp_acks_total");
    let naks = m("bootplane_dhcp_naks_total");
    let conflicts = m("bootplane_dhcp_cluster_conflicts_total");
    let failures = m("bootplane_dhcp_cluster_commit_failures_total");
    eprintln!(
        "{N} clients leased in {took:.1?}: granted by appliance {by:?}; ACKs {acks:?}, NAKs {naks:?}, \
         CAS conflicts {conflicts:?}, etcd commit failures {failures:?}"
    );
    assert_eq!(failures, (0, 0));
    // (a REQUEST retransmitted while its ACK waited is ACKed again: more ACKs than clients)
    assert!(acks.0 + acks.1 >= N as u64);

    // a restarted appliance lists the segment's leases from etcd before it answers
    lab.restart(0);
    assert_eq!(lab.listed(0).len(), N);
    let log = read(&lab.path("bootplane-a-2.log"));
    assert!(log.contains(&format!("leases={N}")), "{log}");
}

#[test]
fn while_etcd_is_frozen_renewals_get_what_is_left_and_new_clients_wait() {
    require("busybox");
    let mut lab = Lab::new(2);
    lab.start(60, 1000);

    // c0 holds a lease and stays to renew
    let mut c0 = lab.spawn_in_clients(vec![lab.udhcpc(0, false, 10)]);
    let c0 = Proc {
        child: c0.remove(0),
    };
    wait_for(
        Duration::from_secs(20),
        || lab.leases().contains_key("c0"),
        || format!("c0 not leased\n{}", lab.logs()),
    );
    let ip0 = lab.leases()["c0"].1.clone();

    // etcd freezes: the appliances see their watch break (keepalive: 2 s + 2 s)
    lab.etcd.pause();
    std::thread::sleep(Duration::from_secs(6));

    // c0 renews: ACKed, for less than a full lease (what the lease had left)
    let renewed_before = read(&lab.path("leases.log")).lines().count();
    must("kill", &["-USR1", &c0.pid().to_string()]);
    wait_for(
        Duration::from_secs(20),
        || read(&lab.path("leases.log")).lines().count() > renewed_before,
        || format!("c0 was not renewed\n{}", lab.logs()),
    );
    let (kind, ip, secs) = lab.leases()["c0"].clone();
    assert_eq!((kind.as_str(), ip.as_str()), ("renew", ip0.as_str()));
    assert!((10..60).contains(&secs), "renewed for {secs} s");

    // a new client gets no lease
    let out = wait_output(
        lab.spawn_in_clients(vec![lab.udhcpc(1, true, 4)]).remove(0),
        Duration::from_secs(30),
        "udhcpc c1",
    );
    assert!(!out.status.success(), "c1 was leased while etcd was frozen");
    assert!(!lab.leases().contains_key("c1"));
    let (ma, mb) = (lab.metrics(0), lab.metrics(1));
    let degraded = metric(&ma, "bootplane_dhcp_cluster_degraded_acks_total")
        + metric(&mb, "bootplane_dhcp_cluster_degraded_acks_total");
    // (udhcpc repeats a renewal unanswered for a second: each repeat is ACKed so)
    assert!(degraded >= 1.0, "{degraded}");
    let unavailable = |t: &str| {
        metric(
            t,
            "bootplane_dhcp_drops_total{reason=\"LedgerUnavailable\"}",
        )
    };
    assert!(
        unavailable(&ma) + unavailable(&mb) > 0.0,
        "no OFFER held back"
    );

    // etcd is back: the new client is leased
    lab.etcd.resume();
    let t0 = Instant::now();
    let out = wait_output(
        lab.spawn_in_clients(vec![lab.udhcpc(1, true, 20)])
            .remove(0),
        Duration::from_secs(40),
        "udhcpc c1",
    );
    assert!(
        out.status.success(),
        "c1 not leased after etcd came back: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        lab.logs()
    );
    eprintln!("leased {:.1?} after etcd came back", t0.elapsed());
    assert_ne!(lab.leases()["c1"].1, ip0);
    drop(c0);
}

/// The client indexes `0..` whose MAC appliance `name` owns while both are live.
fn owned_by(name: &str) -> impl Iterator<Item = usize> + '_ {
    (0..).filter(move |&i| owner(["a", "b"], &parse_mac(&mac(i)).unwrap()) == Some(name))
}

#[test]
fn a_killed_appliances_clients_are_answered_by_the_other_before_they_give_up() {
    require("busybox");
    require("nft");
    let mine: Vec<usize> = owned_by("a").take(2).collect();
    let (c1, c2) = (mine[0], mine[1]);
    let mut lab = Lab::new(c2 + 1);
    lab.start(600, 2000);
    wait_for(
        Duration::from_secs(10),
        || (0..2).all(|i| metric(&lab.metrics(i), "bootplane_dhcp_cluster_members") == 2.0),
        || format!("the appliances do not see each other\n{}", lab.logs()),
    );

    // a OFFERs to c1 (b leaves a's client to it), but never hears c1's REQUEST
    // (option 53 = 3 where udhcpc puts it, first: UDP header 8 + BOOTP 236 + cookie 4 bytes)
    let drop_requests = "table inet t {\n chain input {\n  type filter hook input priority 0;\n  \
                         udp dport 67 @th,1984,24 0x350103 counter drop\n }\n}\n";
    let rules = lab.path("drop-requests.nft");
    std::fs::write(&rules, drop_requests).unwrap();
    lab.apps[0].exec(&["nft", "-f", rules.to_str().unwrap()]);
    // udhcpc: 3 REQUESTs 3 s apart, then it would start over with a DISCOVER
    let mut cmd = lab.udhcpc(c1, true, 3);
    cmd.args(["-T", "3"]);
    let child = lab.spawn_in_clients(vec![cmd]).remove(0);
    wait_for(
        Duration::from_secs(10),
        || {
            let rules = must(
                "ip",
                &["netns", "exec", &lab.apps[0].name, "nft", "list", "ruleset"],
            );
            !rules.contains("counter packets 0 ")
        },
        || format!("c1's REQUEST never reached a\n{}", lab.logs()),
    );

    // a dies; c1's next REQUEST, naming a, is ACKed by b as a
    lab.bps[0].kill9();
    let killed = Instant::now();
    // and c2, a's client too, DISCOVERs now: b answers once a's membership lapsed
    let mut cmd = lab.udhcpc(c2, true, 6);
    cmd.args(["-T", "2"]);
    let child2 = lab.spawn_in_clients(vec![cmd]).remove(0);
    for (c, child) in [(c1, child), (c2, child2)] {
        let out = wait_output(child, Duration::from_secs(30), &format!("udhcpc c{c}"));
        assert!(
            out.status.success(),
            "c{c} not leased: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            lab.logs()
        );
        let said = String::from_utf8_lossy(&out.stderr).to_string();
        eprintln!("c{c} leased {:.1?} after a was killed", killed.elapsed());
        if c == c1 {
            // the lease came as from a, the server c1 had chosen (udhcpc prints the
            // ACK's server identifier), not from a new DISCOVER
            assert!(said.contains(&format!("obtained from {NET}.2,")), "{said}");
        }
    }
    let mb = lab.metrics(1);
    assert_eq!(metric(&mb, "bootplane_dhcp_cluster_members"), 1.0);
    assert!(
        metric(&mb, "bootplane_dhcp_cluster_stand_ins_total") >= 1.0,
        "c1 was not answered on a's behalf (it started over with a DISCOVER?)"
    );
    let leases = lab.leases();
    let records = lab
        .etcd
        .get_prefix(Some(&lab.sw), &format!("{PREFIX}dhcp/boot/"));
    for c in [c1, c2] {
        let ip = &leases[&format!("c{c}")].1;
        let key = format!("{PREFIX}dhcp/boot/{ip}");
        let (_, value) = records.iter().find(|(k, _)| *k == key).unwrap();
        let rec: serde_json::Value = serde_json::from_str(value).unwrap();
        assert_eq!(
            (rec["mac"].as_str(), rec["appliance"].as_str()),
            (Some(mac(c).as_str()), Some("b"))
        );
    }
}

/// The Endpoints appliance `i` lists.
fn endpoints(lab: &Lab, i: usize) -> Vec<serde_json::Value> {
    lab.items(i, "/apis/metal.ironcore.dev/v1alpha1/endpoints")
}

#[test]
fn management_leases_become_endpoints_once_on_the_metal_leader() {
    require("busybox");
    const N: usize = 12;
    let mut lab = Lab::new(N + 4);
    let db = "macPrefixes:\n- {macPrefix: \"02:c1:00\", manufacturer: T, protocol: Redfish, port: 443, defaultCredentialsSecret: none}\n";
    lab.start_scope(600, 2000, Some(db));
    let lease_all = |lab: &Lab, range: std::ops::Range<usize>| {
        let cmds = range.clone().map(|i| lab.udhcpc(i, true, 30)).collect();
        for (c, i) in lab.spawn_in_clients(cmds).into_iter().zip(range) {
            let out = wait_output(c, Duration::from_secs(90), &format!("udhcpc c{i}"));
            assert!(out.status.success(), "c{i}: {out:?}\n{}", lab.logs());
        }
    };
    lease_all(&lab, 0..N);
    let leases = lab.leases();
    // Whichever appliance granted a lease (each answers DISCOVERs), one made every Endpoint.
    for i in 0..2 {
        wait_for(
            Duration::from_secs(20),
            || endpoints(&lab, i).len() == N,
            || {
                format!(
                    "appliance {i} lists {} endpoints\n{}",
                    endpoints(&lab, i).len(),
                    lab.logs()
                )
            },
        );
    }
    for e in endpoints(&lab, 0) {
        let theirs = e["spec"]["macAddress"].as_str().unwrap();
        let i = (0..N).find(|i| mac(*i) == theirs).expect("a client's MAC");
        assert_eq!(
            e["spec"]["ip"].as_str(),
            Some(leases[&format!("c{i}")].1.as_str()),
            "{e}"
        );
        assert_eq!(
            e["metadata"]["labels"]["bootplane.dev/approval"], "pending",
            "{e}"
        );
    }
    let created = |m: &str| metric(m, "bootplane_discovery_endpoints_created_total") as usize;
    let leader_of = |m: &str| {
        m.lines()
            .any(|l| l.starts_with("bootplane_store_leader{group=\"metal\"} 1"))
    };
    // The counter goes up just after the create it counts, which a list may show first.
    wait_for(
        Duration::from_secs(10),
        || created(&lab.metrics(0)) + created(&lab.metrics(1)) >= N,
        || "the creates are not all counted".into(),
    );
    let (ma, mb) = (lab.metrics(0), lab.metrics(1));
    let leader = match (leader_of(&ma), leader_of(&mb)) {
        (true, false) => 0,
        (false, true) => 1,
        other => panic!("one metal leader, not {other:?}"),
    };
    assert_eq!(
        (created(&ma), created(&mb)),
        if leader == 0 { (N, 0) } else { (0, N) }
    );
    let mut granted: HashMap<String, usize> = HashMap::new();
    for (_, v) in lab
        .etcd
        .get_prefix(Some(&lab.sw), &format!("{PREFIX}dhcp/management/"))
    {
        let rec: serde_json::Value = serde_json::from_str(&v).unwrap();
        *granted
            .entry(rec["appliance"].as_str().unwrap_or("?").to_string())
            .or_default() += 1;
    }
    eprintln!("{N} management leases, granted by appliance {granted:?}, made {N} Endpoints on the metal leader ({})", ["a", "b"][leader]);

    // The leader killed: the other leads once its lease ends and takes new leases.
    lab.bps[leader].kill9();
    let other = 1 - leader;
    wait_for(
        Duration::from_secs(30),
        || leader_of(&lab.metrics(other)),
        || format!("appliance {other} did not take over\n{}", lab.logs()),
    );
    lease_all(&lab, N..N + 4);
    wait_for(
        Duration::from_secs(20),
        || endpoints(&lab, other).len() == N + 4,
        || {
            format!(
                "{} endpoints after the failover\n{}",
                endpoints(&lab, other).len(),
                lab.logs()
            )
        },
    );
    wait_for(
        Duration::from_secs(10),
        || created(&lab.metrics(other)) >= 4,
        || "the new leader's creates are not all counted".into(),
    );
    assert_eq!(
        created(&lab.metrics(other)),
        4,
        "the new leader made only the new ones"
    );
}
