//! Cleanup through the real `bootplane serve` and the real agent (`bootplane probe wipe`)
//! on loop devices: a released Server goes `Reserved → Cleanup → Available` only after
//! the agent wiped its disk and posted a report that says every disk was read back; a
//! disk that refuses writes leaves it in `Error` with the reason; `Retain` and a Server's
//! own `none` skip the wipe, a claim may ask for more (`full`) but not less; and every
//! bad report (forged token, another policy, malformed, inconsistent, a Server not in
//! `Cleanup`) is refused, counted, and changes nothing.
//!
//! The machine is a registered Server whose address is loopback (the test power driver
//! stands in for its BMC); the agent runs on this host against a loop device, as it would
//! in the agent image against the machine's disks, in a mount namespace of its own whose
//! `/sys/class/dmi/id/product_uuid` is the Server's system UUID (this host has none).

use crate::probe_wipe::{
    explain, markers, probe_signatures, report, tenant_disk, Backing, Loop, DISK,
};
use crate::support;

use std::process::{Command, Output};

use serde_json::{json, Value};
use support::api::{claim, claims, condition, server_at, SERVERS};
use support::bootplane::Bootplane;

const RENDER: &str = "/apis/boot.bootplane.dev/v1alpha1/render/ipxe";

fn start(extra: &[&str]) -> Bootplane {
    // The test catalog's image stands in for the agent image (the script is what is
    // checked here; e2e_cleanup boots the real one).
    let mut args = vec![
        "--set",
        "cleanup.policy=\"metadata\"",
        "--set",
        "cleanup.image=\"os-image:latest\"",
    ];
    args.extend_from_slice(extra);
    Bootplane::start(&args)
}

/// Register `name` with `annotations`, claim it and wait until it is bound and Reserved;
/// its system UUID. Its address is `mac`'s last byte in 10.99.0.0/24 (so the agent on
/// loopback proves itself by its URL's token), or loopback for `...:ff`.
fn claimed(b: &Bootplane, name: &str, mac: &str, annotations: Value, claim_ann: Value) -> String {
    let ip = match mac.rsplit(':').next() {
        Some("ff") => "127.0.0.1".to_string(),
        Some(last) => format!("10.99.0.{}", u8::from_str_radix(last, 16).unwrap()),
        None => unreachable!(),
    };
    let mut s = server_at(name, mac, &ip);
    s["metadata"]["annotations"] = annotations;
    let (c, v) = b.call("POST", SERVERS, Some(&s));
    assert_eq!(c, 201, "{v}");
    let mut cl = claim(name, None, Some(name));
    cl["metadata"]["annotations"] = claim_ann;
    let (c, v) = b.call("POST", &claims("default"), Some(&cl));
    assert_eq!(c, 201, "{v}");
    b.wait_for(30, &format!("{name} Reserved"), || {
        (server(b, name)["status"]["state"] == "Reserved").then_some(())
    });
    s["spec"]["systemUUID"].as_str().unwrap().to_string()
}

/// The real agent, `bootplane probe wipe ARGS`, on a machine whose SMBIOS system UUID is
/// `uuid` ([`agent_as`]).
fn agent(uuid: &str, args: &[&str]) -> Output {
    agent_as(uuid, "wipe", args)
}

/// The real agent, `bootplane probe COMMAND ARGS`, on a machine whose SMBIOS system UUID
/// is `uuid`: a private mount namespace with a tmpfs over `/sys/class` holding
/// `dmi/id/product_uuid` and the real `/sys/class/block` bound back in (the agent reads
/// partitions there; its other block device checks read `/sys/block` and `/sys/dev`).
pub(crate) fn agent_as(uuid: &str, command: &str, args: &[&str]) -> Output {
    let script = "d=$(mktemp -d) && mount --bind /sys/class \"$d\" && \
                  mount -t tmpfs none /sys/class && mkdir -p /sys/class/dmi/id /sys/class/block && \
                  mount --bind \"$d/block\" /sys/class/block && \
                  echo \"$0\" > /sys/class/dmi/id/product_uuid && exec \"$1\" probe \"${@:2}\"";
    let mut c = Command::new("unshare");
    c.args([
        "--mount",
        "--propagation",
        "private",
        "bash",
        "-c",
        script,
        uuid,
    ])
    .arg(env!("CARGO_BIN_EXE_bootplane"))
    .arg(command)
    .args(args);
    support::process::run_cmd(&mut c, 600)
}

fn server(b: &Bootplane, name: &str) -> Value {
    b.get(&format!("{SERVERS}/{name}"))
}

fn release(b: &Bootplane, name: &str) {
    let (c, v) = b.call("DELETE", &format!("{}/{name}", claims("default")), None);
    assert!(c == 200 || c == 202, "{v}");
}

fn wait_state(b: &Bootplane, name: &str, state: &str) -> Value {
    b.wait_for(30, &format!("{name} in {state}"), || {
        let s = server(b, name);
        (s["status"]["state"] == state).then_some(s)
    })
}

/// The cleanup script of `name` (what the machine is served) once it names a wipe URL.
fn cleanup_script(b: &Bootplane, name: &str) -> String {
    b.wait_for(30, &format!("the cleanup script of {name}"), || {
        let s = b
            .req("GET", &format!("{RENDER}/{name}"))
            .call()
            .ok()?
            .into_string()
            .ok()?;
        s.contains("bootplane.wipe=").then_some(s)
    })
}

fn arg<'a>(script: &'a str, key: &str) -> &'a str {
    script
        .split_whitespace()
        .find_map(|w| w.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key} in\n{script}"))
}

fn post(url: &str, body: &str) -> (u16, String) {
    match ureq::post(url)
        .set("Content-Type", "application/json")
        .send_string(body)
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

#[test]
fn a_released_server_is_available_only_after_the_agent_wiped_and_read_back_its_disk() {
    let b = start(&[]);
    let uuid = claimed(&b, "wipe-a", "52:54:00:c1:00:01", json!({}), json!({}));
    let (disk, lp, parts) = tenant_disk("cleanup-a");
    release(&b, "wipe-a");
    let s = wait_state(&b, "wipe-a", "Cleanup");
    assert_eq!(
        s["metadata"]["annotations"]["bootplane.dev/wipe-policy"], "metadata",
        "{s}"
    );
    let script = cleanup_script(&b, "wipe-a");
    assert_eq!(
        arg(&script, "bootplane.wipe_policy="),
        "metadata",
        "{script}"
    );
    let url = arg(&script, "bootplane.wipe=").to_string();
    assert!(url.contains("/discovery/wipe/wipe-a/"), "{url}");
    // Not Available while the agent has not reported.
    std::thread::sleep(std::time::Duration::from_secs(1));
    assert_eq!(server(&b, "wipe-a")["status"]["state"], "Cleanup");

    // The real agent wipes the machine's disk and posts its report.
    let o = agent(
        &uuid,
        &[
            "--device",
            &lp.dev,
            "--policy",
            "metadata",
            "--report",
            &url,
            "--deadline",
            "120",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", explain(&o));
    assert!(report(&o).ok);
    let s = wait_state(&b, "wipe-a", "Available");
    let c = condition(&s, "Cleaned");
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("True"), Some("Verified")),
        "{s}"
    );
    assert_eq!(s["status"]["powerState"], "Off", "{s}");
    let ev = crate::install_flow::event(&b, ("Server", "wipe-a"), "Verified");
    assert_eq!(ev, "Normal");
    let last: Value = serde_json::from_str(
        s["metadata"]["annotations"]["bootplane.dev/last-wipe"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(last["disks"][0]["device"], lp.dev.as_str());
    assert_eq!(last["disks"][0]["verified"], true);
    assert!(
        s["metadata"]["annotations"]["bootplane.dev/cleanup-attempt"].is_null(),
        "{s}"
    );
    // What the next tenant would find: no signature, no marker at the start or end.
    let found = probe_signatures(&lp.dev, &parts);
    assert!(found.is_empty(), "{found:?}");
    let m = markers(&disk.0, DISK);
    assert!(!m[0] && !m[2], "{m:?}");
    assert_eq!(
        metric(
            &b,
            "bootplane_http_discovery_wipe_total{result=\"accepted\"}"
        ),
        1.0
    );
    let out = String::from_utf8_lossy(&o.stdout);
    let (c, body) = post(&url, out.lines().last().unwrap());
    // The same report again: its token died with the cleanup boot.
    assert_eq!(c, 403, "{body}");
    // Claimable again.
    let (c, v) = b.call(
        "POST",
        &claims("default"),
        Some(&claim("again", None, Some("wipe-a"))),
    );
    assert_eq!(c, 201, "{v}");
    wait_state(&b, "wipe-a", "Reserved");
}

#[test]
fn a_disk_that_refuses_writes_leaves_the_server_in_error_with_the_reason() {
    let b = start(&[]);
    let uuid = claimed(&b, "wipe-ro", "52:54:00:c1:00:02", json!({}), json!({}));
    let disk = Backing::new("cleanup-ro", 64 << 20);
    let lp = Loop::new(&disk, true);
    release(&b, "wipe-ro");
    wait_state(&b, "wipe-ro", "Cleanup");
    let url = arg(&cleanup_script(&b, "wipe-ro"), "bootplane.wipe=").to_string();
    let o = agent(
        &uuid,
        &[
            "--device",
            &lp.dev,
            "--policy",
            "metadata",
            "--report",
            &url,
            "--deadline",
            "60",
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", explain(&o));
    let s = wait_state(&b, "wipe-ro", "Error");
    let c = condition(&s, "Cleaned");
    assert_eq!(c["reason"], "WipeFailed", "{s}");
    let msg = c["message"].as_str().unwrap();
    assert!(
        msg.contains(&lp.dev) && msg.contains("device is read-only"),
        "{msg}"
    );
    let ev = crate::install_flow::event(&b, ("Server", "wipe-ro"), "WipeFailed");
    assert_eq!(ev, "Warning");
    b.wait_for(10, "powered off", || {
        (server(&b, "wipe-ro")["status"]["powerState"] == "Off").then_some(())
    });
    // Still Error a moment later: never Available without a verified wipe.
    std::thread::sleep(std::time::Duration::from_secs(1));
    assert_eq!(server(&b, "wipe-ro")["status"]["state"], "Error");
}

#[test]
fn retain_and_a_servers_none_skip_the_wipe_and_a_claim_may_only_ask_for_more() {
    let b = start(&[]);
    // Retain: the data stays for its owner.
    claimed(&b, "keep", "52:54:00:c1:00:03", json!({}), json!({}));
    let (c, v) = b.call(
        "PATCH",
        &format!("{SERVERS}/keep"),
        Some(&json!({"spec": {"reclaimPolicy": "Retain"}})),
    );
    assert_eq!(c, 200, "{v}");
    release(&b, "keep");
    wait_state(&b, "keep", "Released");
    // The Server's own policy none: straight back to Available, and a claim asking for
    // none does not lower a Server's metadata.
    claimed(
        &b,
        "plain",
        "52:54:00:c1:00:04",
        json!({"bootplane.dev/cleanup-policy": "none"}),
        json!({}),
    );
    release(&b, "plain");
    let s = wait_state(&b, "plain", "Available");
    assert!(
        s["metadata"]["annotations"]["bootplane.dev/wipe-policy"].is_null(),
        "{s}"
    );
    claimed(
        &b,
        "lower",
        "52:54:00:c1:00:05",
        json!({}),
        json!({"bootplane.dev/cleanup-policy": "none"}),
    );
    release(&b, "lower");
    wait_state(&b, "lower", "Cleanup");
    assert_eq!(
        arg(&cleanup_script(&b, "lower"), "bootplane.wipe_policy="),
        "metadata"
    );
    // A tenant asking for full gets full.
    claimed(
        &b,
        "more",
        "52:54:00:c1:00:06",
        json!({}),
        json!({"bootplane.dev/cleanup-policy": "full"}),
    );
    release(&b, "more");
    let s = wait_state(&b, "more", "Cleanup");
    assert_eq!(
        s["metadata"]["annotations"]["bootplane.dev/wipe-policy"], "full",
        "{s}"
    );
    assert!(
        s["metadata"]["annotations"]["bootplane.dev/claim-cleanup-policy"].is_null(),
        "{s}"
    );
    assert_eq!(
        arg(&cleanup_script(&b, "more"), "bootplane.wipe_policy="),
        "full"
    );
}

#[test]
fn bad_wipe_reports_are_refused_counted_and_change_nothing() {
    let b = start(&[]);
    let uuid = claimed(&b, "bad", "52:54:00:c1:00:07", json!({}), json!({}));
    release(&b, "bad");
    wait_state(&b, "bad", "Cleanup");
    let url = arg(&cleanup_script(&b, "bad"), "bootplane.wipe=").to_string();
    let good = json!({"action": "wipe", "policy": "metadata", "ok": true, "systemUUID": uuid,
        "disks": [{"device": "/dev/vda", "sizeBytes": 1073741824, "serial": null, "method": "zero-ranges",
                   "rangesZeroed": 2, "bytesWritten": 2097152, "bytesVerified": 2097152, "verified": true,
                   "seconds": 0.1, "error": null}]});
    let base = url.rsplit_once('/').unwrap().0.to_string();
    let forged = format!("{base}/AAAAforged");
    let http = url.split("/discovery/").next().unwrap().to_string();
    let mut other_policy = good.clone();
    other_policy["policy"] = json!("full");
    let mut unverified = good.clone();
    unverified["disks"][0]["verified"] = json!(false);
    let mut huge = good.clone();
    huge["disks"] = json!(vec![good["disks"][0].clone(); 300]);
    let mut stranger = good.clone();
    stranger["systemUUID"] = json!("5a2c0000-0000-4000-8000-0000000000ff");
    let cases: [(&str, String, u16, &str); 7] = [
        (&forged, good.to_string(), 403, "forbidden"),
        (&url, other_policy.to_string(), 409, "conflict"),
        (&url, "{not json".into(), 400, "malformed"),
        (&url, unverified.to_string(), 422, "invalid"),
        (&url, huge.to_string(), 422, "invalid"),
        (&url, stranger.to_string(), 409, "conflict"),
        (
            &format!("{http}/discovery/wipe/nosuch/x"),
            good.to_string(),
            404,
            "unknown",
        ),
    ];
    for (u, body, want, _) in &cases {
        let (c, text) = post(u, body);
        assert_eq!(c, *want, "{u}: {text}");
    }
    for result in ["forbidden", "conflict", "malformed", "invalid", "unknown"] {
        let want = cases.iter().filter(|c| c.3 == result).count() as f64;
        let line = format!("bootplane_http_discovery_wipe_total{{result=\"{result}\"}}");
        assert_eq!(metric(&b, &line), want, "{line}");
    }
    // Nothing was written: still in Cleanup, Cleaned not True, no last-wipe.
    let s = server(&b, "bad");
    assert_eq!(s["status"]["state"], "Cleanup", "{s}");
    assert_ne!(condition(&s, "Cleaned")["status"], "True");
    assert!(
        s["metadata"]["annotations"]["bootplane.dev/last-wipe"].is_null(),
        "{s}"
    );
    // A Server not in Cleanup cannot be reported for, even from its own address.
    claimed(&b, "busy", "52:54:00:c1:00:ff", json!({}), json!({}));
    let (c, text) = post(&format!("{http}/discovery/wipe/busy"), &good.to_string());
    assert_eq!(c, 409, "{text}");
    assert_eq!(server(&b, "busy")["status"]["state"], "Reserved");
}
