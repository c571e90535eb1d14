//! Discovery at scale against real Redfish services: six simulated BMCs lease their
//! addresses from bootplane's management DHCP scope (busybox udhcpc, each in a network
//! namespace of its own, MACs with a known prefix), and on each leased address a
//! sushy-emulator (fake driver, basic auth, 50 systems each: 300 in all) answers. The
//! Endpoints bootplane makes from the leases become BMCs (the database's protocol, port
//! and default credentials), and every system becomes exactly one Server (count,
//! unique systemUUIDs, the right `spec.bmcRef`). Restarting bootplane and leasing again
//! changes nothing: same Endpoints, BMCs and Servers, no new ones.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::Value;
use support::mgmt::*;
use support::netns::enter_thread;
use support::require::require;
use support::sushy::{fake_systems, Options, Sushy};

const EMULATORS: usize = 6;
const PER_EMULATOR: usize = 50;
const MAC_DB: &str = "macPrefixes:
- macPrefix: \"52:54:00:c0\"
  manufacturer: Sushy
  protocol: RedfishLocal
  port: 8000
  defaultCredentialsSecret: sushy-default
";
const SECRET: &str = "apiVersion: metal.ironcore.dev/v1alpha1
kind: BMCSecret
metadata:
  name: sushy-default
stringData:
  username: admin
  password: sushy-pw
";

fn mac(i: usize) -> String {
    format!("52:54:00:c0:00:{:02x}", i + 1)
}

/// Every Server: name → (uid, systemUUID lower case, bmcRef name).
fn servers(lab: &Lab) -> BTreeMap<String, (String, String, String)> {
    let out = lab.cli(&["get", "servers", "-o", "json"], None);
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|s| {
            let f = |p: &str| {
                s.pointer(p)
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string()
            };
            (
                f("/metadata/name"),
                (
                    f("/metadata/uid"),
                    f("/spec/systemUUID").to_lowercase(),
                    f("/spec/bmcRef/name"),
                ),
            )
        })
        .collect()
}

/// The expected owner BMC of each system UUID (lower case).
fn expected() -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    for e in 0..EMULATORS {
        for s in fake_systems(e as u32 + 1, PER_EMULATOR) {
            m.insert(s.uuid.to_lowercase(), endpoint_name(&mac(e)));
        }
    }
    m
}

fn check_servers(
    lab: &Lab,
    want: &BTreeMap<String, String>,
) -> BTreeMap<String, (String, String, String)> {
    let got = servers(lab);
    assert_eq!(got.len(), EMULATORS * PER_EMULATOR);
    let uuids: BTreeSet<&String> = got.values().map(|(_, u, _)| u).collect();
    assert_eq!(uuids.len(), got.len(), "a system UUID has two Servers");
    for (name, (_, uuid, bmc)) in &got {
        assert_eq!(
            want.get(uuid),
            Some(bmc),
            "server {name} ({uuid}) names the wrong BMC"
        );
    }
    got
}

/// sushy-emulator's fake driver gives system `i` of every emulator the same NIC MAC:
/// each MAC is recorded on one Server only, and every Server whose BMC reported a MAC
/// another holds says so in `MACAddressesUnique` False, naming it.
fn check_macs(lab: &Lab) {
    let out = lab.cli(&["get", "servers", "-o", "json"], None);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let items = v["items"].as_array().unwrap();
    let mut holders: BTreeMap<String, String> = BTreeMap::new();
    let mut left_out = 0;
    for s in items {
        let name = s["metadata"]["name"].as_str().unwrap();
        let nics = s["status"]["networkInterfaces"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for n in &nics {
            let m = n["macAddress"].as_str().unwrap().to_string();
            if let Some(other) = holders.insert(m.clone(), name.to_string()) {
                panic!("{m} recorded on {other} and {name}");
            }
        }
        let conds = s["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if let Some(c) = conds.iter().find(|c| c["type"] == "MACAddressesUnique") {
            assert_eq!(c["status"], "False", "{s}");
            assert_eq!(c["reason"], "MACAddressInUse", "{s}");
            assert!(c["message"].as_str().unwrap().contains("52:54:00"), "{s}");
            left_out += 1;
        } else {
            assert!(!nics.is_empty(), "{name} has no NICs and no condition: {s}");
        }
    }
    // Each fake system has one NIC, its MAC a function of its index.
    assert_eq!(holders.len(), PER_EMULATOR, "{holders:?}");
    assert_eq!(left_out, items.len() - PER_EMULATOR);
}

#[test]
fn three_hundred_systems_behind_six_discovered_bmcs_are_one_server_each() {
    require("busybox");
    let macs: Vec<String> = (0..EMULATORS).map(mac).collect();
    let refs: Vec<&str> = macs.iter().map(String::as_str).collect();
    let mut lab = Lab::new(&refs);
    lab.start(MAC_DB, "");
    let out = lab.cli(&["apply", "-f", "-"], Some(SECRET));
    assert!(out.status.success(), "{out:?}");
    let ips: Vec<String> = (0..EMULATORS).map(|i| lab.lease(i)).collect();
    let _emulators: Vec<Sushy> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..EMULATORS)
            .map(|i| {
                let opts = Options {
                    systems: fake_systems(i as u32 + 1, PER_EMULATOR),
                    auth: Some(("admin".into(), "sushy-pw".into())),
                    listen_ip: Some(ips[i].parse().unwrap()),
                    prefix: vec![
                        "ip".into(),
                        "netns".into(),
                        "exec".into(),
                        lab.bmcs[i].1.name.clone(),
                    ],
                    port: Some(8000),
                    ..Options::default()
                };
                // Started from a thread in the BMC's namespace: its readiness probe
                // connects to the leased address from there.
                let ns = lab.bmcs[i].1.name.clone();
                s.spawn(move || {
                    enter_thread(&ns);
                    Sushy::start(opts)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });

    let want = expected();
    lab.wait(240, "300 servers", || {
        (servers(&lab).len() >= EMULATORS * PER_EMULATOR).then_some(())
    });
    std::thread::sleep(Duration::from_secs(3));
    let before = check_servers(&lab, &want);
    check_macs(&lab);
    let eps = names(&lab.cli(&["get", "endpoints"], None));
    assert_eq!(eps.len(), EMULATORS, "{eps:?}");
    for (i, ip) in ips.iter().enumerate() {
        let name = endpoint_name(&macs[i]);
        let ep = lab.get("endpoint", &name).unwrap();
        assert_eq!(ep["spec"]["ip"], ip.as_str());
        let bmc = lab.wait(30, "bmc enabled", || {
            lab.get("bmc", &name)
                .filter(|b| b["status"]["state"] == "Enabled")
        });
        assert_eq!(condition(&bmc, "Authenticated")["status"], "True", "{bmc}");
    }
    let rvs = |lab: &Lab| -> Vec<String> {
        macs.iter()
            .map(|m| {
                let n = endpoint_name(m);
                let ep = lab.get("endpoint", &n).unwrap();
                let b = lab.get("bmc", &n).unwrap();
                format!(
                    "{} {} {}",
                    ep["metadata"]["resourceVersion"], b["metadata"]["uid"], b["spec"]
                )
            })
            .collect()
    };
    let objects = rvs(&lab);

    // Discovery again: bootplane restarted, every BMC leases again.
    lab.bp.as_mut().unwrap().kill9();
    lab.bp = None;
    lab.start(MAC_DB, "");
    for (i, ip) in ips.iter().enumerate() {
        assert_eq!(&lab.lease(i), ip);
    }
    // Several polls of every BMC (power.redfish.poll_interval_secs = 1) after the restart.
    std::thread::sleep(Duration::from_secs(8));
    let m = lab.metrics();
    assert_eq!(
        metric(&m, "bootplane_discovery_endpoints_created_total"),
        0.0
    );
    assert_eq!(metric(&m, "bootplane_discovery_bmcs_created_total"), 0.0);
    let after = check_servers(&lab, &want);
    assert_eq!(after, before, "servers changed after discovery ran again");
    assert_eq!(rvs(&lab), objects, "endpoints or bmcs rewritten");
}
