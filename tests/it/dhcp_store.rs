//! The DHCP server inside the whole appliance (`bootplane serve`): static reservations
//! come from the Servers registered in the store, and DHCP and TFTP metrics are on the
//! API listener's `/metrics`. Real dhclient and tftp-hpa, in namespaces the test makes.

use crate::support;

use std::process::Output;
use std::time::Duration;

use support::dhcp::*;
use support::netns::*;
use support::process::*;
use support::require::*;

/// One dhclient run (`-1`: one attempt) with its own lease file; `release` runs `-r`.
fn dhclient(lab: &Lab, tag: &str, release: bool) -> Output {
    let script = lab.client_script();
    let mut c = lab.client.cmd("dhclient");
    c.arg("-4");
    if release {
        c.arg("-r");
    } else {
        c.arg("-1");
    }
    c.args([
        "-lf",
        lab.path(&format!("dhclient-{tag}.leases"))
            .to_str()
            .unwrap(),
        "-pf",
        lab.path(&format!("dhclient-{tag}.pid")).to_str().unwrap(),
    ])
    .args(["-sf", script.to_str().unwrap(), "vc"]);
    run_bounded(c, 30)
}

fn bound_ips(lab: &Lab) -> Vec<String> {
    lab.script_log()
        .lines()
        .filter_map(|l| l.strip_prefix("BOUND "))
        .map(|s| s.trim().to_string())
        .collect()
}

#[test]
fn registered_server_reservation_is_handed_out_and_freed_on_delete() {
    require("dhclient");
    let lab = Lab::new(45);
    let range = format!("{}-{}", lab.addr(100), lab.addr(110));
    let log = "bootplane.log";
    let _server = lab.start_bootplane(
        "[dhcp]\nlease_time_secs = 60\n",
        &[
            "--dhcp-interface",
            "vs",
            "--dhcp-mode",
            "authoritative",
            "--dhcp-range",
            &range,
        ],
        log,
    );
    let mac = mac_of(&lab.client, "vc");
    // Reserved address: outside the dynamic range, so only the reservation can give it.
    let reserved = lab.addr(50);
    let yaml = format!(
        "apiVersion: metal.ironcore.dev/v1alpha1\nkind: Server\nmetadata: {{name: rack1-node7}}\n\
         spec: {{systemUUID: 4c4c4544-0045-0045-0045-000000000045}}\n\
         status: {{state: Available, powerState: \"Off\", networkInterfaces: [{{name: eth0, macAddress: \"{mac}\", ips: [\"fe80::1\", \"{reserved}\"]}}]}}\n"
    );
    let out = lab.cli(&["apply", "-f", "-"], Some(&yaml));
    assert!(out.status.success(), "{}", text(&out));
    wait_for(
        Duration::from_secs(10),
        || read(&lab.path(log)).contains("dhcp reservations applied count=1"),
        || format!("reservation not applied: {}", read(&lab.path(log))),
    );

    // dhclient with that MAC gets exactly the reserved address.
    let out = dhclient(&lab, "a", false);
    assert!(out.status.success(), "dhclient: {}", text(&out));
    assert_eq!(
        bound_ips(&lab),
        vec![reserved.clone()],
        "{}",
        lab.script_log()
    );
    assert!(lab.lease_log().contains(&reserved), "{}", lab.lease_log());
    let out = dhclient(&lab, "a", true);
    assert!(out.status.success(), "dhclient -r: {}", text(&out));

    // Removing the Server frees the reservation: the same MAC now gets a pool address.
    let out = lab.cli(&["delete", "server", "rack1-node7"], None);
    assert!(out.status.success(), "{}", text(&out));
    wait_for(
        Duration::from_secs(10),
        || read(&lab.path(log)).contains("dhcp reservations applied count=0"),
        || format!("reservation not removed: {}", read(&lab.path(log))),
    );
    lab.client.ip(&["addr", "flush", "dev", "vc"]);
    let out = dhclient(&lab, "b", false);
    assert!(out.status.success(), "dhclient: {}", text(&out));
    let ips = bound_ips(&lab);
    assert_eq!(ips.len(), 2, "{}", lab.script_log());
    assert_eq!(ips[1], lab.addr(100), "{}", lab.script_log());
}

/// GET with the API token from the server namespace.
fn scrape(lab: &Lab) -> String {
    let token = read(&lab.path("state/api-token"));
    let mut c = lab.server.cmd("curl");
    c.args([
        "-sS",
        "--max-time",
        "10",
        "-H",
        &format!("Authorization: Bearer {}", token.trim()),
        "--cacert",
        lab.path("state/tls/ca.crt").to_str().unwrap(),
        "https://127.0.0.1:9090/metrics",
    ]);
    let out = run_bounded(c, 20);
    assert!(out.status.success(), "curl: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The value of a sample line `name{labels} value` (labels part of `name`).
fn sample(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l[name.len()..].trim().parse().ok())
}

#[test]
fn metrics_page_has_dhcp_and_tftp_after_a_dora_and_a_fetch() {
    require("dhclient");
    require("tftp");
    require("curl");
    let lab = Lab::new(46);
    let root = lab.path("tftproot");
    std::fs::create_dir_all(&root).unwrap();
    let body: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(root.join("undionly.kpxe"), &body).unwrap();
    let range = format!("{}-{}", lab.addr(100), lab.addr(103));
    let log = "bootplane.log";
    let _server = lab.start_bootplane(
        &format!(
            "[dhcp]\nlease_time_secs = 60\n[tftp]\nenabled = true\nlisten = \"{}:69\"\nroot = \"{}\"\n",
            lab.addr(1),
            root.display()
        ),
        &[
            "--dhcp-interface",
            "vs",
            "--dhcp-mode",
            "authoritative",
            "--dhcp-range",
            &range,
        ],
        log,
    );

    let out = dhclient(&lab, "m", false);
    assert!(out.status.success(), "dhclient: {}", text(&out));
    assert_eq!(bound_ips(&lab), vec![lab.addr(100)], "{}", lab.script_log());

    // A packet that is not DHCP: dropped and counted by reason.
    let mut c = lab.client.cmd("bash");
    c.args([
        "-c",
        &format!("printf 'not dhcp' > /dev/udp/{}/67", lab.addr(1)),
    ]);
    assert!(run_bounded(c, 10).status.success());

    // A TFTP fetch from the client namespace (tftp-hpa, default options).
    let dest = lab.path("fetched");
    let mut c = lab.client.cmd("tftp");
    c.args([
        &lab.addr(1),
        "-m",
        "binary",
        "-c",
        "get",
        "undionly.kpxe",
        dest.to_str().unwrap(),
    ]);
    let out = run_bounded(c, 30);
    assert!(out.status.success(), "tftp: {}", text(&out));
    assert_eq!(std::fs::read(&dest).unwrap(), body);
    // And one for a file that is not there (an error by kind).
    let mut c = lab.client.cmd("tftp");
    c.args([&lab.addr(1), "-c", "get", "missing.efi", "/dev/null"]);
    let _ = run_bounded(c, 30);

    let last = std::cell::RefCell::new(String::new());
    wait_for(
        Duration::from_secs(10),
        || {
            let p = scrape(&lab);
            let ok = sample(&p, "bootplane_tftp_transfers_completed_total") == Some(1.0)
                && sample(&p, "bootplane_dhcp_pool_used{subnet=\"10.199.46.0\"}") == Some(1.0);
            *last.borrow_mut() = p;
            ok
        },
        || {
            format!(
                "metrics never showed the DORA and the fetch:\n{}",
                last.borrow()
            )
        },
    );
    let page = last.into_inner();
    // DHCP: one DORA = 1 offer, 1 ack; pool utilisation; drops family present.
    assert_eq!(
        sample(&page, "bootplane_dhcp_offers_total"),
        Some(1.0),
        "{page}"
    );
    assert_eq!(
        sample(&page, "bootplane_dhcp_acks_total"),
        Some(1.0),
        "{page}"
    );
    assert_eq!(
        sample(&page, "bootplane_dhcp_naks_total"),
        Some(0.0),
        "{page}"
    );
    assert_eq!(
        sample(&page, "bootplane_dhcp_pool_size{subnet=\"10.199.46.0\"}"),
        Some(4.0),
        "{page}"
    );
    assert_eq!(
        sample(&page, "bootplane_dhcp_drops_total{reason=\"Malformed\"}"),
        Some(1.0),
        "{page}"
    );
    assert_eq!(
        sample(
            &page,
            "bootplane_dhcp_drops_total{reason=\"PoolExhausted\"}"
        ),
        Some(0.0),
        "{page}"
    );
    // TFTP: transfers, bytes, errors by kind, durations.
    assert_eq!(
        sample(&page, "bootplane_tftp_bytes_sent_total"),
        Some(body.len() as f64),
        "{page}"
    );
    assert_eq!(
        sample(&page, "bootplane_tftp_errors_total{kind=\"NotFound\"}"),
        Some(1.0),
        "{page}"
    );
    assert_eq!(
        sample(&page, "bootplane_tftp_transfer_duration_seconds_count"),
        Some(1.0),
        "{page}"
    );
    assert!(page.contains("bootplane_tftp_retransmits_total"), "{page}");
    // Next to the HTTP ones, one page, one EOF at its end.
    assert!(page.contains("bootplane_store_revision"), "{page}");
    assert!(page.contains("# TYPE bootplane_http"), "{page}");
    assert_eq!(page.matches("# EOF").count(), 1, "{page}");
    assert!(page.trim_end().ends_with("# EOF"), "{page}");
}
