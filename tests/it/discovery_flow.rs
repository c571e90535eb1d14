//! Discovery through the real `bootplane serve` against the in-process fake BMC
//! (`tests/support/fakebmc.rs`, real loopback sockets): a BMC's systems become Servers
//! (one per system UUID, never twice), each boots once into the discovery image through
//! its BMC, a simulated agent posts the inventory to the boot listener with the signed
//! URL from the Server's discovery script, and the Server is filled, powered off and
//! `Available`. Also: a system the BMC stops listing is flagged, not deleted; a machine
//! that never reports is booted again with backoff and then left in `Discovery` with a
//! reason; every bad inventory (forged token, wrong source, malformed, oversized, out of
//! bounds, another machine's UUID, a Server not in Discovery) is refused, counted, and
//! writes nothing. A BMC listing more systems than `discovery.max_systems_per_bmc`
//! makes only that many Servers, and says so on the BMC (condition and Event).

use crate::support;

use serde_json::{json, Value};
use support::api::{add_bmc, claim, claims, BMCS, SERVERS};
use support::bootplane::Bootplane;
use support::fakebmc::{mac_for, uuid_for, FakeBmc};

const PASSWORD: &str = "Disc0very-pa55";
const RENDER: &str = "/apis/boot.bootplane.dev/v1alpha1/render/ipxe";

fn start(extra: &[&str]) -> Bootplane {
    let mut args = vec![
        "--set",
        "discovery.enabled=true",
        "--set",
        "discovery.image=os-image:latest",
        "--set",
        "power.redfish.poll_interval_secs=1",
        "--set",
        "power.redfish.shutdown_timeout_secs=1",
        "--set",
        "power.redfish.power_wait_secs=5",
        "--set",
        "power.redfish.timeout_secs=2",
        // The fake BMCs listen on loopback: their Servers need no approval.
        "--set",
        "discovery.approved_bmcs=[\"127.0.0.1\"]",
    ];
    args.extend_from_slice(extra);
    Bootplane::start(&args)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Condition `ty` of `o` (`null` when absent).
fn condition(o: &Value, ty: &str) -> Value {
    o["status"]["conditions"]
        .as_array()
        .and_then(|l| l.iter().find(|c| c["type"] == ty).cloned())
        .unwrap_or(Value::Null)
}

fn servers(b: &Bootplane) -> Vec<Value> {
    b.get(SERVERS)["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// The Server (`null` while it does not exist).
fn server(b: &Bootplane, name: &str) -> Value {
    let (c, v) = b.call("GET", &format!("{SERVERS}/{name}"), None);
    if c == 200 {
        v
    } else {
        Value::Null
    }
}

/// The inventory URL in `name`'s discovery script (what the agent gets on its kernel
/// command line), read through the operator's preview of the script.
fn inventory_url(b: &Bootplane, name: &str) -> String {
    let script = b
        .req("GET", &format!("{RENDER}/{name}"))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    script
        .split_whitespace()
        .find_map(|w| w.strip_prefix("bootplane.inventory="))
        .unwrap_or_else(|| panic!("no inventory url in the script of {name}:\n{script}"))
        .to_string()
}

/// The inventory URL of `name`'s current discovery boot, once the listener accepts its
/// token. The listener learns a new boot (its boot generation, written before the BMC is
/// asked to start the machine) through the store's watch, a moment after the store has
/// it; a real machine fetches its script seconds after power-on, a test at once. A body
/// with an unknown field is then refused as malformed (400), not forbidden (403), and
/// writes nothing.
fn current_inventory_url(b: &Bootplane, name: &str, seed: u16, i: usize) -> String {
    b.wait_for(
        30,
        &format!("an inventory URL of the current boot of {name}"),
        || {
            let u = inventory_url(b, name);
            let mut probe = inventory(seed, i);
            probe["extra"] = json!(1);
            (post(&u, probe.to_string().as_bytes()).0 == 400).then_some(u)
        },
    )
}

/// A thread following Server `name` through a watch, returning the states its status
/// showed, in order, once it is `Available`.
fn watch_states(b: &Bootplane, name: &str) -> std::thread::JoinHandle<Vec<String>> {
    use std::io::BufRead;
    let rv = b.get(&format!("{SERVERS}?limit=1"))["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let r = b
        .req("GET", &format!("{SERVERS}?watch=true&resourceVersion={rv}"))
        .call()
        .unwrap();
    let name = name.to_string();
    std::thread::spawn(move || {
        let mut seen: Vec<String> = Vec::new();
        for line in std::io::BufReader::new(r.into_reader()).lines() {
            let Ok(line) = line else { break };
            let ev: Value = serde_json::from_str(&line).unwrap();
            if ev["object"]["metadata"]["name"] != name.as_str() {
                continue;
            }
            if let Some(st) = ev["object"]["status"]["state"].as_str() {
                if seen.last().map(String::as_str) != Some(st) {
                    seen.push(st.to_string());
                }
                if st == "Available" {
                    break;
                }
            }
        }
        seen
    })
}

/// What the agent on system `i` of the fake BMC seeded `seed` would report.
fn inventory(seed: u16, i: usize) -> Value {
    json!({
        "systemUUID": uuid_for(seed, i).to_lowercase(),
        "system": {"manufacturer": "Fake", "product": "Fake-1", "serialNumber": format!("SN{:05}", i + 1)},
        "nics": [
            {"name": "eth0", "macAddress": mac_for(seed, i, 0), "carrier": true, "ips": ["10.0.0.9"],
             "neighbors": [{"macAddress": "02:aa:bb:cc:dd:ee", "portId": "Ethernet1/1", "systemName": "tor-1"}]},
            {"name": "eth1", "macAddress": mac_for(seed, i, 1), "carrier": false},
        ],
        "disks": [
            {"name": "sda", "sizeBytes": 2u64 << 30, "model": "QEMU HARDDISK", "vendor": "QEMU", "serial": format!("D{i}A"), "transport": "scsi"},
            {"name": "sdb", "sizeBytes": 1u64 << 30, "model": "QEMU HARDDISK", "vendor": "QEMU", "serial": format!("D{i}B"), "rotational": true, "transport": "scsi"},
        ],
        "cpus": [
            {"id": "CPU 0", "manufacturer": "QEMU", "model": "pc-q35", "architecture": "x86_64", "cores": 1, "threads": 1, "maxSpeedMhz": 2000},
            {"id": "CPU 1", "manufacturer": "QEMU", "model": "pc-q35", "architecture": "x86_64", "cores": 1, "threads": 1, "maxSpeedMhz": 2000},
        ],
        "memoryBytes": 1u64 << 30,
    })
}

/// POST `body` to `url`: (status, response text).
fn post(url: &str, body: &[u8]) -> (u16, String) {
    match ureq::post(url)
        .set("Content-Type", "application/json")
        .send_bytes(body)
    {
        Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
        Err(ureq::Error::Status(c, r)) => (c, r.into_string().unwrap_or_default()),
        Err(e) => panic!("POST {url}: {e}"),
    }
}

fn metric(b: &Bootplane, line_start: &str) -> f64 {
    let text = b
        .req("GET", "/metrics")
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    text.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

fn wait_state(b: &Bootplane, name: &str, state: &str, secs: u64) -> Value {
    b.wait_for(secs, &format!("{name} in {state}"), || {
        let s = server(b, name);
        (s["status"]["state"] == state).then_some(s)
    })
}

#[test]
fn systems_become_servers_boot_once_report_and_become_available() {
    let rt = runtime();
    let fake = rt.block_on(
        FakeBmc::builder()
            .systems(3)
            .seed(7)
            .credentials("admin", PASSWORD)
            .ignore_graceful(true)
            .start(),
    );
    let b = start(&[]);
    // The states bmc-a-1 goes through, from a watch started before anything exists.
    let states = watch_states(&b, "bmc-a-1");
    add_bmc(&b, "bmc-a", &fake.base_url, PASSWORD);
    // Every system becomes exactly one Server, in Discovery, booted once (Pxe, On).
    let list = b.wait_for(30, "3 Servers in Discovery", || {
        let l = servers(&b);
        (l.len() == 3 && l.iter().all(|s| s["status"]["state"] == "Discovery")).then_some(l)
    });
    let mut names: Vec<String> = list
        .iter()
        .map(|s| s["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    assert_eq!(names, ["bmc-a-1", "bmc-a-2", "bmc-a-3"]);
    for (i, n) in names.iter().enumerate() {
        let s = server(&b, n);
        assert_eq!(
            s["spec"]["systemUUID"],
            uuid_for(7, i).to_lowercase(),
            "{s}"
        );
        assert_eq!(s["spec"]["bmcRef"]["name"], "bmc-a");
        assert_eq!(
            s["spec"]["systemURI"],
            format!("/redfish/v1/Systems/{}", i + 1)
        );
        assert_eq!(
            s["metadata"]["labels"]["bootplane.dev/manufacturer"],
            "Fake"
        );
        assert_eq!(
            s["metadata"]["labels"]["bootplane.dev/serial"],
            format!("SN{:05}", i + 1)
        );
        assert_eq!(
            s["status"]["networkInterfaces"][0]["macAddress"],
            mac_for(7, i, 0),
            "{s}\n{}",
            b.log()
        );
        assert_eq!(s["status"]["networkInterfaces"][1]["carrierStatus"], "Down");
    }
    b.wait_for(
        30,
        "every system powered on once with a one-time Pxe boot",
        || {
            (0..3)
                .all(|i| {
                    let st = fake.state(i);
                    st.power == "On" && st.boot_target == "Pxe" && st.boot_enabled == "Once"
                })
                .then_some(())
        },
    );

    // The simulated agent of each machine posts its inventory to its signed URL.
    for (i, n) in names.iter().enumerate() {
        let url = current_inventory_url(&b, n, 7, i);
        assert!(url.contains(&format!("/discovery/inventory/{n}/")), "{url}");
        let (c, body) = post(&url, inventory(7, i).to_string().as_bytes());
        assert_eq!(c, 202, "{body}");
    }
    for (i, n) in names.iter().enumerate() {
        let s = wait_state(&b, n, "Available", 30);
        let st = &s["status"];
        assert_eq!(st["powerState"], "Off", "{s}");
        assert_eq!(fake.state(i).power, "Off");
        assert_eq!(st["totalSystemMemory"], "1Gi");
        assert_eq!(st["processors"].as_array().unwrap().len(), 2);
        assert_eq!(st["processors"][0]["maxSpeedMHz"], 2000);
        assert_eq!(st["storages"][0]["name"], "scsi");
        assert_eq!(st["storages"][0]["drives"][0]["capacity"], "2Gi");
        assert_eq!(st["storages"][0]["drives"][1]["mediaType"], "HDD");
        assert_eq!(st["networkInterfaces"][0]["ip"], "10.0.0.9");
        assert_eq!(
            st["networkInterfaces"][0]["neighbors"][0]["systemName"],
            "tor-1"
        );
        assert_eq!(
            s["metadata"]["annotations"]["bootplane.dev/drive-serials"],
            format!("{{\"sda\":\"D{i}A\",\"sdb\":\"D{i}B\"}}")
        );
        b.wait_for(10, "the attempt annotation removed", || {
            server(&b, n)["metadata"]["annotations"]["bootplane.dev/discovery-attempt"]
                .is_null()
                .then_some(())
        });
        assert_eq!(condition(&s, "Discovered")["reason"], "InventoryReported");
        assert_eq!(
            fake.state(i).resets.iter().filter(|r| *r == "On").count(),
            1
        );
    }
    assert_eq!(
        metric(
            &b,
            "bootplane_http_discovery_inventory_total{result=\"accepted\"}"
        ),
        3.0
    );
    let seen = states.join().unwrap();
    assert_eq!(
        seen,
        ["Initial", "Discovery", "Available"],
        "states of bmc-a-1"
    );

    // Discovery again (the BMC is polled every second; then a restart): nothing changes.
    // The last power-off confirmations may still land just after Available: the snapshot
    // is taken once two looks 3 s apart agree.
    let snapshot = |b: &Bootplane| -> Vec<(String, String)> {
        servers(b)
            .iter()
            .map(|s| {
                (
                    s["metadata"]["uid"].as_str().unwrap().to_string(),
                    s["metadata"]["resourceVersion"]
                        .as_str()
                        .unwrap()
                        .to_string(),
                )
            })
            .collect()
    };
    let mut before = snapshot(&b);
    for _ in 0..10 {
        std::thread::sleep(std::time::Duration::from_secs(3));
        let now = snapshot(&b);
        if now == before {
            break;
        }
        before = now;
    }
    let mut b = b;
    b.stop();
    b.spawn();
    std::thread::sleep(std::time::Duration::from_secs(4));
    let after = snapshot(&b);
    assert_eq!(before, after, "re-discovery changed the Servers");

    // A system the BMC stops listing is flagged, not deleted; back, it is present again.
    fake.set_present(1, false);
    let s = b.wait_for(20, "bmc-a-2 flagged SystemGone", || {
        let s = server(&b, "bmc-a-2");
        (condition(&s, "SystemPresent")["reason"] == "SystemGone").then_some(s)
    });
    assert_eq!(s["status"]["state"], "Available", "{s}");
    assert_eq!(servers(&b).len(), 3);
    fake.set_present(1, true);
    b.wait_for(20, "bmc-a-2 present again", || {
        let s = server(&b, "bmc-a-2");
        (condition(&s, "SystemPresent")["status"] == "True").then_some(())
    });
    assert!(
        !b.log().contains(PASSWORD),
        "the log shows the BMC password"
    );
}

#[test]
fn a_machine_that_never_reports_is_retried_then_left_in_discovery() {
    let rt = runtime();
    let fake = rt.block_on(
        FakeBmc::builder()
            .systems(1)
            .seed(8)
            .credentials("admin", PASSWORD)
            .start(),
    );
    let b = start(&[
        "--set",
        "discovery.report_timeout_secs=3",
        "--set",
        "discovery.attempts=2",
        "--set",
        "discovery.retry_backoff_secs=1",
    ]);
    add_bmc(&b, "bmc-t", &fake.base_url, PASSWORD);
    let s = b.wait_for(60, "InventoryTimeout", || {
        let s = server(&b, "bmc-t-1");
        (condition(&s, "Discovered")["reason"] == "InventoryTimeout").then_some(s)
    });
    assert_eq!(s["status"]["state"], "Discovery", "{s}");
    let msg = condition(&s, "Discovered")["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        msg.contains("no inventory after 2 discovery boot(s)"),
        "{msg}"
    );
    let st = b.wait_for(20, "powered off", || {
        let st = fake.state(0);
        (st.power == "Off").then_some(st)
    });
    // Two boots (the second from off: On again), each a one-time network boot.
    let boots = st
        .resets
        .iter()
        .filter(|r| *r == "On" || r.contains("Restart"))
        .count();
    assert_eq!(boots, 2, "{:?}", st.resets);
    // Nothing more happens on its own.
    std::thread::sleep(std::time::Duration::from_secs(5));
    assert_eq!(fake.state(0).resets, st.resets);
}

#[test]
fn bad_inventories_are_refused_counted_and_write_nothing() {
    let rt = runtime();
    let fake = rt.block_on(
        FakeBmc::builder()
            .systems(2)
            .seed(9)
            .credentials("admin", PASSWORD)
            .start(),
    );
    let b = start(&[]);
    add_bmc(&b, "bmc-x", &fake.base_url, PASSWORD);
    b.wait_for(30, "2 Servers in Discovery", || {
        let l = servers(&b);
        (l.len() == 2 && l.iter().all(|s| s["status"]["state"] == "Discovery")).then_some(())
    });
    // Tokens are bound to the discovery boot (its boot generation moves on when the
    // boot starts and when the Server is seen off): a token taken before the boot has
    // started stops working when it does, so take it once the machine is on.
    b.wait_for(30, "bmc-x-1 powered on with a one-time Pxe boot", || {
        let st = fake.state(0);
        (st.power == "On" && st.boot_target == "Pxe" && st.boot_enabled == "Once").then_some(())
    });
    let url = current_inventory_url(&b, "bmc-x-1", 9, 0);
    let other = inventory_url(&b, "bmc-x-2");
    let base = url.split("/discovery/").next().unwrap().to_string();
    let token = url.rsplit('/').next().unwrap().to_string();
    // What an accepted inventory writes (the Server's other status fields and its
    // resourceVersion move on their own: power polls, BMC status).
    let written = |s: &Value| {
        let cond = s
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .and_then(|c| c.iter().find(|c| c["type"] == "Discovered"))
            .is_some_and(|c| c["status"] == "True");
        json!({
            "networkInterfaces": s["status"]["networkInterfaces"],
            "storages": s["status"]["storages"],
            "processors": s["status"]["processors"],
            "totalSystemMemory": s["status"]["totalSystemMemory"],
            "driveSerials": s["metadata"]["annotations"]["bootplane.dev/drive-serials"],
            "discovered": cond,
        })
    };
    let before = written(&server(&b, "bmc-x-1"));
    assert!(before["storages"].is_null(), "no inventory yet: {before}");
    let good = inventory(9, 0).to_string();
    let mut bad_mac = inventory(9, 0);
    bad_mac["nics"][0]["macAddress"] = json!("52:54:zz");
    let mut many = inventory(9, 0);
    many["cpus"] = json!(vec![many["cpus"][0].clone(); 1025]);
    let mut unknown_field = inventory(9, 0);
    unknown_field["extra"] = json!(1);
    let forged = format!("{}x", &token[..token.len() - 1]);
    let cases: Vec<(String, Vec<u8>, u16, &str)> = vec![
        // No token, and 127.0.0.1 is not the machine's address.
        (
            format!("{base}/discovery/inventory/bmc-x-1"),
            good.clone().into(),
            403,
            "forbidden",
        ),
        (
            format!("{base}/discovery/inventory/bmc-x-1/{forged}"),
            good.clone().into(),
            403,
            "forbidden",
        ),
        // Another machine's token.
        (
            format!(
                "{base}/discovery/inventory/bmc-x-1/{}",
                other.rsplit('/').next().unwrap()
            ),
            good.clone().into(),
            403,
            "forbidden",
        ),
        (url.clone(), b"{not json".to_vec(), 400, "malformed"),
        (
            url.clone(),
            unknown_field.to_string().into(),
            400,
            "malformed",
        ),
        (url.clone(), bad_mac.to_string().into(), 422, "invalid"),
        (url.clone(), many.to_string().into(), 422, "invalid"),
        // Another system's UUID.
        (
            url.clone(),
            inventory(9, 1).to_string().into(),
            409,
            "conflict",
        ),
        (
            format!("{base}/discovery/inventory/nope/{token}"),
            good.clone().into(),
            404,
            "unknown",
        ),
    ];
    for (u, body, want, result) in &cases {
        let (c, text) = post(u, body);
        assert_eq!(c, *want, "{u}: {text}");
        assert!(
            metric(
                &b,
                &format!("bootplane_http_discovery_inventory_total{{result=\"{result}\"}}")
            ) >= 1.0,
            "{result} not counted"
        );
    }
    // Oversized: refused before the body is read.
    let (c, _) = post(&url, &vec![b' '; 300 << 10]);
    assert_eq!(c, 413);
    assert_eq!(
        metric(
            &b,
            "bootplane_http_discovery_inventory_total{result=\"too_large\"}"
        ),
        1.0
    );
    // A chunked body: no.
    let resp = ureq::post(&url)
        .set("Transfer-Encoding", "chunked")
        .send(std::io::Cursor::new(good.clone().into_bytes()));
    assert!(matches!(resp, Err(ureq::Error::Status(411, _))), "{resp:?}");
    // GET on the route: 405.
    assert!(matches!(
        ureq::get(&url).call(),
        Err(ureq::Error::Status(405, _))
    ));
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert_eq!(
        written(&server(&b, "bmc-x-1")),
        before,
        "a refused inventory wrote something"
    );
    // The good one is taken; once the Server is Available, a second report conflicts.
    let (c, text) = post(&url, good.as_bytes());
    assert_eq!(c, 202, "{text}");
    wait_state(&b, "bmc-x-1", "Available", 30);
    let (c, _) = post(&url, good.as_bytes());
    assert!(c == 409 || c == 403, "{c}");
}

/// Issue 32 item 4: a Server discovered from a BMC outside `discovery.approved_bmcs`
/// carries `bootplane.dev/approval: pending`: no first boot and no claim (even when
/// something sets it `Available`) until an operator changes the label; then it goes on.
#[test]
fn servers_from_an_unapproved_bmc_wait_for_an_operators_approval() {
    let rt = runtime();
    let fake = rt.block_on(
        FakeBmc::builder()
            .systems(2)
            .seed(9)
            .credentials("admin", PASSWORD)
            .start(),
    );
    let b = start(&["--set", "discovery.approved_bmcs=[\"10.0.0.0/8\"]"]);
    add_bmc(&b, "bmc-u", &fake.base_url, PASSWORD);
    for n in ["bmc-u-1", "bmc-u-2"] {
        let s = b.wait_for(30, &format!("{n} awaiting approval"), || {
            let s = server(&b, n);
            (condition(&s, "Approved")["reason"] == "AwaitingApproval").then_some(s)
        });
        assert_eq!(s["metadata"]["labels"]["bootplane.dev/approval"], "pending");
        assert_eq!(s["status"]["state"], "Initial", "{s}");
        assert_eq!(condition(&s, "Approved")["status"], "False");
    }
    // Something (an agent's status write) makes bmc-u-1 Available: still not claimable.
    let avail = json!({"status": {"state": "Available", "powerState": "Off"}});
    let (c, v) = b.call("PATCH", &format!("{SERVERS}/bmc-u-1/status"), Some(&avail));
    assert_eq!(c, 200, "{v}");
    let (c, v) = b.call(
        "POST",
        &claims("default"),
        Some(&claim("c-u", None, Some("bmc-u-1"))),
    );
    assert_eq!(c, 201, "{v}");
    let path = format!("{}/c-u", claims("default"));
    let bound = b.wait_for(30, "the claim explained", || {
        let c = condition(&b.get(&path), "Bound");
        c["message"]
            .as_str()?
            .contains("awaiting approval")
            .then_some(c)
    });
    assert_eq!(bound["status"], "False", "{bound}");
    // Neither was booted.
    assert!(fake.state(0).resets.is_empty() && fake.state(1).resets.is_empty());
    assert_eq!(server(&b, "bmc-u-2")["status"]["state"], "Initial");

    // Approved: bmc-u-2 goes on to its first boot, bmc-u-1 is claimed.
    let ok = json!({"metadata": {"labels": {"bootplane.dev/approval": "approved"}}});
    for n in ["bmc-u-1", "bmc-u-2"] {
        let (c, v) = b.call("PATCH", &format!("{SERVERS}/{n}"), Some(&ok));
        assert_eq!(c, 200, "{v}");
    }
    let s = wait_state(&b, "bmc-u-2", "Discovery", 30);
    assert_eq!(condition(&s, "Approved")["status"], "True", "{s}");
    b.wait_for(30, "bmc-u-2 booted", || {
        (!fake.state(1).resets.is_empty()).then_some(())
    });
    b.wait_for(30, "bmc-u-1 claimed", || {
        (server(&b, "bmc-u-1")["spec"]["serverClaimRef"]["name"] == "c-u").then_some(())
    });
}

/// Issue 32 item 4: a rogue BMC listing many systems makes at most
/// `discovery.max_systems_per_bmc` Servers; the rest is the BMC's condition
/// `SystemsDiscovered` (False, `TooManySystems`) and a Warning Event, not silence.
#[test]
fn a_bmc_listing_too_many_systems_makes_at_most_the_cap_of_servers() {
    let rt = runtime();
    let fake = rt.block_on(
        FakeBmc::builder()
            .systems(7)
            .seed(13)
            .credentials("admin", PASSWORD)
            .start(),
    );
    let b = start(&[
        "--set",
        "discovery.max_systems_per_bmc=3",
        "--set",
        "discovery.first_boot=false",
    ]);
    add_bmc(&b, "bmc-many", &fake.base_url, PASSWORD);
    let path = format!("{BMCS}/bmc-many");
    let c = b.wait_for(30, "the bmc over its cap", || {
        let c = condition(&b.get(&path), "SystemsDiscovered");
        (c["reason"] == "TooManySystems").then_some(c)
    });
    assert_eq!(c["status"], "False", "{c}");
    let msg = c["message"].as_str().unwrap();
    assert!(
        msg.contains("7 system(s)")
            && msg.contains("4 not registered")
            && msg.contains("3 system(s) registered"),
        "{msg}"
    );
    let mine = |b: &Bootplane| {
        servers(b)
            .into_iter()
            .filter(|s| s["spec"]["bmcRef"]["name"] == "bmc-many")
            .count()
    };
    assert_eq!(mine(&b), 3);
    // Later polls (the BMC is read again) make no more.
    let seen = fake.total_requests();
    b.wait_for(30, "two more polls", || {
        (fake.total_requests() > seen + 10).then_some(())
    });
    assert_eq!(mine(&b), 3);
    // Events are written by a recorder task of their own: poll until it has.
    b.wait_for(30, "the TooManySystems Event", || {
        let (code, out, err) = b.cli(&["get", "events", "--for", "bmc/bmc-many"]);
        assert_eq!(code, 0, "{err}");
        out.contains("TooManySystems").then_some(())
    });
}
