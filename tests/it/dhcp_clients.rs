//! Real DHCP clients against `bootplane serve --dhcp-mode authoritative` across a
//! veth between two network namespaces the test creates: ISC dhclient and busybox
//! udhcpc do DORA, renew and release; after `kill -9` and a restart the server
//! still knows whose address is whose.

use crate::support;

use std::time::Duration;

use support::dhcp::*;
use support::netns::*;
use support::process::*;
use support::require::*;

const CONFIG: &str = "[dhcp]\nlease_time_secs = 10\n";

fn bootplane(lab: &Lab, log: &str) -> Proc {
    let range = format!("{}-{}", lab.addr(100), lab.addr(150));
    lab.start_bootplane(
        CONFIG,
        &[
            "--dhcp-interface",
            "vs",
            "--dhcp-mode",
            "authoritative",
            "--dhcp-range",
            &range,
        ],
        log,
    )
}

fn dhclient(lab: &Lab, extra: &[&str], lease_file: &str) -> std::process::Output {
    let script = lab.client_script();
    let mut c = lab.client.cmd("dhclient");
    c.args([
        "-4",
        "-v",
        "-lf",
        lab.path(lease_file).to_str().unwrap(),
        "-pf",
        lab.path("dhclient.pid").to_str().unwrap(),
        "-sf",
        script.to_str().unwrap(),
    ]);
    c.args(extra).arg("vc");
    run_bounded(c, 30)
}

fn bound_ip(log: &str, reason: &str) -> Option<String> {
    log.lines()
        .rev()
        .find_map(|l| l.strip_prefix(&format!("{reason} ")))
        .map(str::to_string)
}

#[test]
fn dhclient_dora_renew_release_and_lease_survives_kill9() {
    require("dhclient");
    require("busybox");
    let lab = Lab::new(41);
    let mut server = bootplane(&lab, "bootplane-1.log");
    let mac = mac_of(&lab.client, "vc");

    // DORA
    let out = dhclient(&lab, &["-1"], "dhclient.leases");
    assert!(
        out.status.success(),
        "dhclient failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ip = bound_ip(&lab.script_log(), "BOUND").expect("dhclient bound");
    assert_eq!(ip, lab.addr(100));
    assert!(
        lab.lease_log().contains(&format!("P {ip} {mac} ")),
        "lease persisted: {}",
        lab.lease_log()
    );

    // renew at T1 (5 s), unicast to the server
    wait_for(
        Duration::from_secs(15),
        || lab.script_log().contains(&format!("RENEW {ip}")),
        || lab.script_log(),
    );
    let renewals = lab
        .lease_log()
        .lines()
        .filter(|l| l.starts_with(&format!("P {ip} {mac} ")) && l.contains(" B "))
        .count();
    assert!(renewals >= 2, "renewal persisted: {}", lab.lease_log());

    // kill -9 and restart: the lease must still be this client's
    server.kill9();
    let _dhclient_stop = dhclient(&lab, &["-x"], "dhclient.leases"); // stop without releasing
    let _server = bootplane(&lab, "bootplane-2.log");
    assert!(
        read(&lab.path("bootplane-2.log")).contains("leases=1"),
        "{}",
        read(&lab.path("bootplane-2.log"))
    );

    // another client (other MAC on the same link) must not get that address
    lab.client.ip(&["link", "set", "vc", "down"]);
    lab.client
        .ip(&["link", "set", "vc", "address", "02:00:00:00:41:02"]);
    lab.client.ip(&["link", "set", "vc", "up"]);
    let script = lab.client_script();
    let mut c = lab.client.cmd("busybox");
    c.args([
        "udhcpc",
        "-i",
        "vc",
        "-f",
        "-q",
        "-n",
        "-t",
        "5",
        "-T",
        "1",
        "-s",
        script.to_str().unwrap(),
    ]);
    let out = run_bounded(c, 20);
    assert!(
        out.status.success(),
        "udhcpc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let other = bound_ip(&lab.script_log(), "bound").expect("other client bound");
    assert_ne!(
        other, ip,
        "the restarted server gave away a persisted lease"
    );

    // the original client, with a fresh lease file (no hint), gets its address back
    lab.client.ip(&["link", "set", "vc", "down"]);
    lab.client.ip(&["link", "set", "vc", "address", &mac]);
    lab.client.ip(&["link", "set", "vc", "up"]);
    let out = dhclient(&lab, &["-1"], "dhclient-fresh.leases");
    assert!(
        out.status.success(),
        "dhclient failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        bound_ip(&lab.script_log(), "BOUND").as_deref(),
        Some(ip.as_str()),
        "{}",
        lab.script_log()
    );

    // release
    let out = dhclient(&lab, &["-r"], "dhclient-fresh.leases");
    assert!(out.status.success());
    wait_for(
        Duration::from_secs(5),
        || {
            lab.lease_log()
                .lines()
                .any(|l| l.starts_with(&format!("P {ip} {mac} ")) && l.contains(" R "))
        },
        || lab.lease_log(),
    );
}

#[test]
fn udhcpc_dora_renew_release() {
    require("busybox");
    let lab = Lab::new(42);
    let _server = bootplane(&lab, "bootplane.log");
    let mac = mac_of(&lab.client, "vc");
    let script = lab.client_script();
    let mut c = lab.client.cmd("busybox");
    c.args([
        "udhcpc",
        "-i",
        "vc",
        "-f",
        "-t",
        "5",
        "-T",
        "1",
        "-s",
        script.to_str().unwrap(),
    ]);
    c.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut client = Proc::spawn(c);

    wait_for(
        Duration::from_secs(15),
        || bound_ip(&lab.script_log(), "bound").is_some(),
        || lab.script_log(),
    );
    let ip = bound_ip(&lab.script_log(), "bound").unwrap();
    assert_eq!(ip, lab.addr(100));
    assert!(
        lab.lease_log().contains(&format!("P {ip} {mac} ")),
        "{}",
        lab.lease_log()
    );

    // SIGUSR1: renew now
    let before = lab.lease_log().lines().count();
    must("kill", &["-USR1", &client.pid().to_string()]);
    wait_for(
        Duration::from_secs(10),
        || lab.script_log().contains(&format!("renew {ip}")),
        || lab.script_log(),
    );
    assert!(
        lab.lease_log().lines().count() > before,
        "renewal persisted: {}",
        lab.lease_log()
    );

    // SIGUSR2: release
    must("kill", &["-USR2", &client.pid().to_string()]);
    wait_for(
        Duration::from_secs(10),
        || {
            lab.lease_log()
                .lines()
                .any(|l| l.starts_with(&format!("P {ip} {mac} ")) && l.contains(" R "))
        },
        || lab.lease_log(),
    );
    client.kill9();
}
