//! The management network end to end, with real programs and sockets: `bootplane serve`
//! in a network namespace serves the management DHCP scope (`[discovery.dhcp]`) on a
//! bridge; each simulated BMC is a namespace of its own on that bridge (a veth with a
//! chosen MAC), gets its address from busybox `udhcpc`, and runs the fake Redfish BMC
//! (`tests/support/fakebmc.rs`) on the leased address. Asserted: an Endpoint per
//! known-prefix lease with the leased IP, none for the unknown prefix (counted on
//! `/metrics`); a BMC + BMCSecret per Endpoint with the database's protocol, port and
//! default credentials, owned by the Endpoint; the BMC with the right default credentials
//! becomes `Enabled`/Authenticated; the one with wrong ones is Authenticated=False and
//! throttled, with at most `auth_attempts` logins reaching it, until the operator fixes
//! its BMCSecret; re-leasing and restarting
//! bootplane change nothing; deleting an Endpoint removes its BMC and BMCSecret. Also
//! (issue 32 item 4): new Endpoints are capped per interval, and a lease that moves to
//! another address leaves the Endpoint's address pinned, with a condition, until an
//! operator accepts the move; a BMC whose address is not in `approved_bmcs` is sent no
//! credentials at all (not one request reaches it) until its Endpoint is approved.

use crate::support;

use std::time::Duration;

use serde_json::Value;
use support::fakebmc::FakeBmc;
use support::mgmt::*;
use support::netns::{enter_thread, Netns};
use support::process::read;
use support::require::require;

const GOOD: &str = "52:54:00:b0:00:01";
const WRONG: &str = "52:54:00:b1:00:02";
const UNKNOWN: &str = "02:99:00:00:00:03";
const MAC_DB: &str = "macPrefixes:
- macPrefix: \"52:54:00:b0\"
  manufacturer: VendorA
  protocol: RedfishLocal
  port: 8000
  defaultCredentialsSecret: vendor-a-default
- macPrefix: 525400b1
  manufacturer: VendorB
  protocol: RedfishLocal
  port: 8000
  defaultCredentialsSecret: vendor-b-default
- macPrefix: \"52:54\"
  manufacturer: Generic
  protocol: Redfish
  port: 443
  defaultCredentialsSecret: generic-default
";
const SECRETS: &str = "apiVersion: metal.ironcore.dev/v1alpha1
kind: BMCSecret
metadata:
  name: vendor-a-default
stringData:
  username: admin
  password: vendor-a-pw
---
apiVersion: metal.ironcore.dev/v1alpha1
kind: BMCSecret
metadata:
  name: vendor-b-default
stringData:
  username: admin
  password: factory-default
";

/// A fake BMC (sessions on) listening on `0.0.0.0:8000` in `ns`, served by a runtime
/// that lives as long as the returned pair.
fn fake_bmc_in(ns: &Netns, password: &str) -> (tokio::runtime::Runtime, FakeBmc) {
    fake_bmc_with(ns, password, true)
}

/// [`fake_bmc_in`], with sessions on or off (off: Basic credentials on each request).
fn fake_bmc_with(ns: &Netns, password: &str, sessions: bool) -> (tokio::runtime::Runtime, FakeBmc) {
    let (name, password) = (ns.name.clone(), password.to_string());
    std::thread::spawn(move || {
        enter_thread(&name);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let bmc = rt.block_on(
            FakeBmc::builder()
                .credentials("admin", &password)
                .sessions(sessions)
                .bind("0.0.0.0:8000")
                .start(),
        );
        (rt, bmc)
    })
    .join()
    .unwrap()
}

fn rv(o: &Value) -> String {
    o["metadata"]["resourceVersion"].to_string()
}

#[test]
fn management_leases_become_endpoints_bmcs_and_secrets_once() {
    require("busybox");
    let mut lab = Lab::new(&[GOOD, WRONG, UNKNOWN]);
    let (_rt_a, bmc_a) = fake_bmc_in(&lab.bmcs[0].1, "vendor-a-pw");
    let (_rt_b, bmc_b) = fake_bmc_in(&lab.bmcs[1].1, "changed-by-operator");
    lab.start(MAC_DB, "");
    let out = lab.cli(&["apply", "-f", "-"], Some(SECRETS));
    assert!(out.status.success(), "{out:?}");
    let ips: Vec<String> = (0..3).map(|i| lab.lease(i)).collect();
    for ip in &ips {
        assert!(ip.starts_with(&format!("{NET}.")), "{ips:?}");
    }

    // An Endpoint per known-prefix lease, with the leased address; none for the unknown.
    let (good, wrong) = (endpoint_name(GOOD), endpoint_name(WRONG));
    for (name, mac, ip) in [(&good, GOOD, &ips[0]), (&wrong, WRONG, &ips[1])] {
        let ep = lab.wait(20, &format!("endpoint {name}"), || {
            lab.get("endpoint", name)
        });
        assert_eq!(ep["spec"]["ip"], ip.as_str(), "{ep}");
        assert_eq!(ep["spec"]["macAddress"], mac, "{ep}");
    }
    let eps = names(&lab.cli(&["get", "endpoints"], None));
    assert_eq!(
        eps,
        vec![good.clone(), wrong.clone()],
        "only known prefixes"
    );
    let m = lab.metrics();
    assert_eq!(
        metric(&m, "bootplane_discovery_unknown_mac_total"),
        1.0,
        "{m}"
    );
    assert_eq!(
        metric(&m, "bootplane_discovery_endpoints_created_total"),
        2.0
    );
    assert!(metric(&m, "bootplane_dhcp_management_acks_total") >= 3.0);
    assert_eq!(
        metric(&m, "bootplane_dhcp_management_reports_dropped_total"),
        0.0
    );
    assert!(
        read(&lab.path("state/dhcp-management-leases.log")).contains(UNKNOWN),
        "the management scope keeps its own lease log"
    );
    assert!(!lab.path("state/dhcp-leases.log").exists());

    // BMC + BMCSecret per Endpoint, from the database, owned by the Endpoint.
    for (name, default) in [(&good, "vendor-a-default"), (&wrong, "vendor-b-default")] {
        let ep = lab.get("endpoint", name).unwrap();
        let bmc = lab.wait(20, &format!("bmc {name}"), || lab.get("bmc", name));
        assert_eq!(bmc["spec"]["endpointRef"]["name"], name.as_str(), "{bmc}");
        assert_eq!(bmc["spec"]["bmcSecretRef"]["name"], name.as_str(), "{bmc}");
        assert_eq!(bmc["spec"]["protocol"]["name"], "RedfishLocal", "{bmc}");
        assert_eq!(bmc["spec"]["protocol"]["port"], 8000, "{bmc}");
        assert!(bmc["spec"].get("access").is_none(), "{bmc}");
        let secret = lab.get("bmcsecret", name).expect("bmcsecret");
        let vendor = lab.get("bmcsecret", default).unwrap();
        assert_eq!(secret["data"], vendor["data"]);
        for o in [&bmc, &secret] {
            assert_eq!(
                o["metadata"]["ownerReferences"][0]["uid"],
                ep["metadata"]["uid"]
            );
            assert_eq!(o["metadata"]["ownerReferences"][0]["kind"], "Endpoint");
        }
    }

    // Right default credentials: Enabled and Authenticated through the Endpoint's IP.
    let b = lab.wait(30, "good bmc Enabled", || {
        let b = lab.get("bmc", &good)?;
        (b["status"]["state"] == "Enabled" && condition(&b, "Authenticated")["status"] == "True")
            .then_some(b)
    });
    assert_eq!(
        b["status"]["conditions"].as_array().map(|c| !c.is_empty()),
        Some(true)
    );
    // Its address is the Endpoint's (the BMC has no inline access).
    assert_eq!(b["status"]["ip"], ips[0].as_str(), "{b}");
    assert!(bmc_a.sessions_created() >= 1);

    // Wrong default credentials: refused, then throttled; at most 3 logins reach the BMC.
    let b = lab.wait(30, "wrong bmc throttled", || {
        let b = lab.get("bmc", &wrong)?;
        let c = condition(&b, "Authenticated");
        (c["status"] == "False" && c["message"].as_str()?.contains("throttled")).then_some(c)
    });
    assert_eq!(b["reason"], "CredentialsRefused", "{b}");
    assert!(!b.to_string().contains("factory-default"), "{b}");
    std::thread::sleep(Duration::from_secs(4));
    let logins = bmc_b.requests("/redfish/v1/SessionService/Sessions");
    assert_eq!(
        logins, 3,
        "auth attempts that reached the wrong-credentials BMC"
    );
    assert_eq!(bmc_b.sessions_created(), 0);

    // The operator puts the right password into the BMC's secret: a new budget, in at once.
    let fixed = format!(
        "apiVersion: metal.ironcore.dev/v1alpha1\nkind: BMCSecret\nmetadata:\n  name: {wrong}\nstringData:\n  username: admin\n  password: changed-by-operator\n"
    );
    let out = lab.cli(&["apply", "-f", "-"], Some(&fixed));
    assert!(out.status.success(), "{out:?}");
    lab.wait(20, "wrong bmc authenticated after the fix", || {
        let b = lab.get("bmc", &wrong)?;
        (condition(&b, "Authenticated")["status"] == "True").then_some(())
    });
    assert_eq!(
        bmc_b.sessions_created(),
        1,
        "one login with the new credentials"
    );

    // Re-leasing and restarting change nothing.
    let snapshot = |lab: &Lab| -> Vec<(String, String)> {
        let mut v = Vec::new();
        for n in [&good, &wrong] {
            for kind in ["endpoint", "bmcsecret"] {
                v.push((format!("{kind}/{n}"), rv(&lab.get(kind, n).unwrap())));
            }
            let b = lab.get("bmc", n).unwrap();
            v.push((
                format!("bmc/{n}"),
                format!("{} {}", b["metadata"]["uid"], b["spec"]),
            ));
        }
        v
    };
    let before = snapshot(&lab);
    assert_eq!(lab.lease(0), ips[0], "re-lease keeps the address");
    lab.bp.as_mut().unwrap().kill9();
    lab.bp = None;
    lab.start(MAC_DB, "");
    for (i, ip) in ips.iter().enumerate() {
        assert_eq!(&lab.lease(i), ip, "address after restart");
    }
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        snapshot(&lab),
        before,
        "re-leasing/restarting rewrote objects"
    );
    assert_eq!(names(&lab.cli(&["get", "endpoints"], None)).len(), 2);
    let m = lab.metrics();
    assert_eq!(
        metric(&m, "bootplane_discovery_endpoints_created_total"),
        0.0
    );
    assert_eq!(metric(&m, "bootplane_discovery_bmcs_created_total"), 0.0);
    assert_eq!(metric(&m, "bootplane_discovery_unknown_mac_total"), 1.0);

    // Deleting an Endpoint removes its BMC and BMCSecret.
    let out = lab.cli(&["delete", "endpoint", &wrong], None);
    assert!(out.status.success(), "{out:?}");
    lab.wait(10, "cascade", || {
        (lab.get("bmc", &wrong).is_none() && lab.get("bmcsecret", &wrong).is_none()).then_some(())
    });
    assert!(lab.get("bmc", &good).is_some());
}

#[test]
fn new_endpoints_are_capped_and_a_moved_lease_leaves_the_address_pinned() {
    require("busybox");
    let mut lab = Lab::new(&[GOOD, WRONG]);
    lab.start_with(MAC_DB, "max_new_endpoints = 1", "");
    let out = lab.cli(&["apply", "-f", "-"], Some(SECRETS));
    assert!(out.status.success(), "{out:?}");
    let ips: Vec<String> = (0..2).map(|i| lab.lease(i)).collect();
    // One Endpoint; the second known-prefix lease is over the cap: counted, not made.
    let m = lab.wait(20, "the second lease capped", || {
        let m = lab.metrics();
        (metric(&m, "bootplane_discovery_capped_total") >= 1.0).then_some(m)
    });
    assert_eq!(
        metric(&m, "bootplane_discovery_endpoints_created_total"),
        1.0
    );
    let good = endpoint_name(GOOD);
    assert_eq!(
        names(&lab.cli(&["get", "endpoints"], None)),
        vec![good.clone()]
    );
    assert!(read(&lab.path("bootplane.log")).contains("discovery.max_new_endpoints reached"));

    // The MAC's next lease is at another address (a reservation, after a restart): the
    // Endpoint keeps its address, says so in a condition, and the BMC is reached there.
    let moved_to = (140..150)
        .map(|i| format!("{NET}.{i}"))
        .find(|ip| !ips.contains(ip))
        .unwrap();
    lab.bp.as_mut().unwrap().kill9();
    lab.bp = None;
    let reservation =
        format!("[[discovery.dhcp.reservations]]\nmac = \"{GOOD}\"\nip = \"{moved_to}\"\n");
    lab.start_with(MAC_DB, "max_new_endpoints = 1", &reservation);
    assert_eq!(lab.lease(0), moved_to, "the reservation moves the lease");
    let ep = lab.wait(20, "the move noted", || {
        let e = lab.get("endpoint", &good)?;
        (e["status"]["leaseIP"] == moved_to.as_str()).then_some(e)
    });
    assert_eq!(ep["spec"]["ip"], ips[0].as_str(), "the address moved: {ep}");
    let c = condition(&ep, "AddressPinned");
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("False"), Some("LeaseMoved")),
        "{c}"
    );
    assert!(c["message"].as_str().unwrap().contains(&moved_to), "{c}");
    let m = lab.metrics();
    assert_eq!(metric(&m, "bootplane_discovery_endpoints_moved_total"), 1.0);

    // The operator accepts the move by setting spec.ip.
    let accept = format!(
        "apiVersion: metal.ironcore.dev/v1alpha1\nkind: Endpoint\nmetadata:\n  name: {good}\nspec:\n  macAddress: \"{GOOD}\"\n  ip: \"{moved_to}\"\n"
    );
    let out = lab.cli(&["apply", "-f", "-"], Some(&accept));
    assert!(out.status.success(), "{out:?}");
    lab.wait(20, "the move accepted", || {
        let e = lab.get("endpoint", &good)?;
        let c = condition(&e, "AddressPinned");
        (c["status"] == "True" && c["reason"] == "Accepted").then_some(())
    });
}

/// Issue 32 item 4: the vendor's default credentials go only to approved BMCs. A BMC
/// leased an address outside `approved_bmcs` (none here) gets an Endpoint labelled
/// `bootplane.dev/approval: pending` and nothing else: no BMCSecret, no BMC, and the
/// fake BMC (Basic auth, recording each Authorization header) receives no request at
/// all. Once an operator labels the Endpoint approved, the BMC is made and logs in
/// with the vendor default.
#[test]
fn an_unapproved_bmc_is_sent_no_credentials_until_its_endpoint_is_approved() {
    use base64::Engine as _;
    require("busybox");
    let mut lab = Lab::new(&[GOOD]);
    let (_rt, fake) = fake_bmc_with(&lab.bmcs[0].1, "vendor-a-pw", false);
    lab.start_with(MAC_DB, "approved_bmcs = []", "");
    let out = lab.cli(&["apply", "-f", "-"], Some(SECRETS));
    assert!(out.status.success(), "{out:?}");
    let ip = lab.lease(0);
    let good = endpoint_name(GOOD);
    let ep = lab.wait(20, "the endpoint held for approval", || {
        let e = lab.get("endpoint", &good)?;
        (condition(&e, "Approved")["reason"] == "AwaitingApproval").then_some(e)
    });
    assert_eq!(
        ep["metadata"]["labels"]["bootplane.dev/approval"], "pending",
        "{ep}"
    );
    assert_eq!(condition(&ep, "Approved")["status"], "False", "{ep}");
    // The reconciler that decided this is the one that would have made them.
    assert!(lab.get("bmc", &good).is_none());
    assert!(lab.get("bmcsecret", &good).is_none());
    assert_eq!(
        fake.total_requests(),
        0,
        "a request reached the unapproved BMC"
    );
    assert_eq!(
        fake.last_auth(),
        None,
        "credentials reached the unapproved BMC"
    );

    // The operator approves the Endpoint: BMC + BMCSecret, and the default login.
    let approve = format!(
        "apiVersion: metal.ironcore.dev/v1alpha1\nkind: Endpoint\nmetadata:\n  name: {good}\n  labels:\n    bootplane.dev/approval: approved\nspec:\n  macAddress: \"{GOOD}\"\n  ip: \"{ip}\"\n"
    );
    let out = lab.cli(&["apply", "-f", "-"], Some(&approve));
    assert!(out.status.success(), "{out:?}");
    lab.wait(30, "the approved bmc authenticated", || {
        let b = lab.get("bmc", &good)?;
        (condition(&b, "Authenticated")["status"] == "True").then_some(())
    });
    let auth = fake
        .last_auth()
        .expect("an Authorization header after approval");
    let basic = auth.strip_prefix("Basic ").expect("basic auth");
    let pair = base64::engine::general_purpose::STANDARD
        .decode(basic)
        .unwrap();
    assert_eq!(pair, b"admin:vendor-a-pw");
    let ep = lab.get("endpoint", &good).unwrap();
    assert_eq!(condition(&ep, "Approved")["status"], "True", "{ep}");
}
