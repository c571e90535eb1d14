//! The `redfish` power driver and the BMC reconciler, end to end through the real
//! `bootplane serve` and its API, against the in-process fake BMC
//! (`tests/support/fakebmc.rs`, real loopback sockets): a claim powers its Server On
//! through the BMC with the one-time boot the Server asks for (Pxe, UefiHttp with the
//! machine's signed URI, VirtualMedia with insert/eject), a deleted claim powers it Off
//! (graceful, then ForceOff after the timeout), the BMC's status, the fallback when the
//! BMC lacks a mode, reset, and the bad inputs: refused credentials (fixed later without a
//! restart), an unreachable BMC, 5xx, malformed JSON, a slow BMC, a power change behind
//! bootplane's back; the requests each costs are counted (no retry storm), and the
//! password appears in no log line and no API object but its BMCSecret.

use crate::support;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::api::{add_bmc, claim, claims, condition, sbcs, BMCS, BMCSECRETS, SERVERS};
use support::bootplane::Bootplane;
use support::fakebmc::{uuid_of, FakeBmc, Fault};

const PASSWORD: &str = "Sup3r-s3cret-BMC-pa55";

fn start() -> Bootplane {
    Bootplane::start(&[
        "--set",
        "power.redfish.poll_interval_secs=1",
        "--set",
        "power.redfish.shutdown_timeout_secs=2",
        "--set",
        "power.redfish.power_wait_secs=5",
        "--set",
        "power.redfish.retry_max_secs=2",
        "--set",
        "power.redfish.timeout_secs=1",
        "--set",
        "power.redfish.attempts=2",
        "--set",
        "power.redfish.backoff_base_ms=50",
        "--set",
        "power.redfish.backoff_max_ms=200",
    ])
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Register an Available, Off Server on system `i` of BMC `bmc`, with an optional
/// boot-mode annotation.
fn add_server(b: &Bootplane, name: &str, bmc: &str, i: usize, mode: Option<&str>) {
    let mut s = json!({
        "apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "Server",
        "metadata": {"name": name},
        "spec": {"systemUUID": uuid_of(i).to_lowercase(), "bmcRef": {"name": bmc}},
        "status": {"state": "Available", "powerState": "Off"},
    });
    if let Some(m) = mode {
        s["metadata"]["annotations"] = json!({"bootplane.dev/boot-mode": m});
    }
    let (c, v) = b.call("POST", SERVERS, Some(&s));
    assert_eq!(c, 201, "{v}");
}

fn server(b: &Bootplane, name: &str) -> Value {
    b.get(&format!("{SERVERS}/{name}"))
}

fn wait_power(b: &Bootplane, name: &str, want: &str, secs: u64) -> Value {
    b.wait_for(secs, &format!("{name} powerState {want}"), || {
        let s = server(b, name);
        (s["status"]["powerState"] == want).then_some(s)
    })
}

fn wait_condition(
    b: &Bootplane,
    path: &str,
    ty: &str,
    status: &str,
    reason: &str,
    secs: u64,
) -> Value {
    b.wait_for(secs, &format!("{path} {ty}={status} ({reason})"), || {
        let o = b.get(path);
        let c = o["status"]["conditions"]
            .as_array()
            .and_then(|l| l.iter().find(|c| c["type"] == ty).cloned())?;
        (c["status"] == status && c["reason"] == reason).then_some(c)
    })
}

fn claim_on(b: &Bootplane, claim_name: &str, server: &str) {
    let (c, v) = b.call(
        "POST",
        &claims("default"),
        Some(&claim(claim_name, None, Some(server))),
    );
    assert_eq!(c, 201, "{v}");
}

fn delete_claim(b: &Bootplane, claim_name: &str) {
    let (c, v) = b.call(
        "DELETE",
        &format!("{}/{claim_name}", claims("default")),
        None,
    );
    assert!(c == 200 || c == 202, "{c} {v}");
}

/// `/metrics` as text.
fn metrics_text(b: &Bootplane) -> String {
    b.req("GET", "/metrics")
        .call()
        .unwrap()
        .into_string()
        .unwrap()
}

/// Nothing but the BMCSecret shows the password: not the log, not any other object.
fn assert_password_nowhere(b: &Bootplane, password: &str) {
    assert!(
        !b.log().contains(password),
        "the log shows the BMC password"
    );
    for path in [SERVERS, BMCS, &claims("default"), &sbcs("default")] {
        let body = b.get(path).to_string();
        assert!(!body.contains(password), "{path} shows the BMC password");
    }
    let metrics = metrics_text(b);
    assert!(
        metrics.contains("bootplane_redfish_power_attempts_total"),
        "no redfish metrics: {metrics}"
    );
    assert!(
        !metrics.contains(password),
        "/metrics shows the BMC password"
    );
}

#[test]
fn claim_powers_on_with_one_time_boot_modes_and_delete_powers_off() {
    let rt = runtime();
    let fake = rt.block_on(
        FakeBmc::builder()
            .systems(4)
            .credentials("admin", PASSWORD)
            .ignore_graceful(true)
            .start(),
    );
    let b = start();
    add_bmc(&b, "bmc-a", &fake.base_url, PASSWORD);
    add_server(&b, "s-pxe", "bmc-a", 0, None);
    add_server(&b, "s-http", "bmc-a", 1, Some("UefiHttp"));
    add_server(&b, "s-media", "bmc-a", 2, Some("VirtualMedia"));
    add_server(&b, "s-none", "bmc-a", 3, Some("None"));

    // The BMC's status is read from the Redfish service.
    let bmc = b.wait_for(20, "BMC Enabled", || {
        let v = b.get(&format!("{BMCS}/bmc-a"));
        (v["status"]["state"] == "Enabled").then_some(v)
    });
    assert_eq!(bmc["status"]["manufacturer"], "Fake", "{bmc}");
    // The BMC's own model (its Manager's), not the server's.
    assert_eq!(bmc["status"]["model"], "FakeBMC", "{bmc}");
    assert_eq!(bmc["status"]["firmwareVersion"], "1.2.3", "{bmc}");
    assert_eq!(bmc["status"]["serialNumber"], "SN00001", "{bmc}");
    assert_eq!(bmc["status"]["powerState"], "Off", "{bmc}");
    assert_eq!(condition(&bmc, "Reachable")["status"], "True");
    assert_eq!(condition(&bmc, "Authenticated")["status"], "True");
    assert_eq!(condition(&bmc, "BootModes")["status"], "True", "{bmc}");

    for (c, s) in [
        ("c-pxe", "s-pxe"),
        ("c-http", "s-http"),
        ("c-media", "s-media"),
        ("c-none", "s-none"),
    ] {
        claim_on(&b, c, s);
    }
    for s in ["s-pxe", "s-http", "s-media", "s-none"] {
        let v = wait_power(&b, s, "On", 30);
        assert_eq!(condition(&v, "PowerReady")["status"], "True", "{v:#}");
    }
    // Pxe, once.
    let st = fake.state(0);
    assert_eq!(
        (
            st.power.as_str(),
            st.boot_target.as_str(),
            st.boot_enabled.as_str()
        ),
        ("On", "Pxe", "Once")
    );
    assert_eq!(
        condition(&server(&b, "s-pxe"), "BootOverride")["reason"],
        "Set"
    );
    // UefiHttp with the machine's own signed boot URI on the boot listener.
    let st = fake.state(1);
    assert_eq!(
        (st.boot_target.as_str(), st.boot_enabled.as_str()),
        ("UefiHttp", "Once")
    );
    let uri = st.http_boot_uri.clone().expect("HttpBootUri set");
    assert!(
        uri.starts_with(&format!(
            "http://127.0.0.1:{}/ipxe/boot.iso?server=s-http&token=",
            b.http_port
        )),
        "{uri}"
    );
    // The URI serves an ISO (its primary volume descriptor at 32 KiB) to anyone holding it.
    let iso = ureq::get(&uri).call().expect("boot ISO");
    let mut body = Vec::new();
    std::io::Read::read_to_end(&mut iso.into_reader(), &mut body).unwrap();
    assert_eq!(&body[32769..32774], b"CD001", "not an ISO 9660 image");
    // VirtualMedia: the machine's ISO inserted, Cd once.
    let st = fake.state(2);
    assert_eq!(
        (st.boot_target.as_str(), st.boot_enabled.as_str()),
        ("Cd", "Once")
    );
    assert!(st.media_inserted, "media not inserted: {st:?}");
    assert!(
        st.media_image
            .as_deref()
            .unwrap_or("")
            .contains("/ipxe/boot.iso?server=s-media&token="),
        "{st:?}"
    );
    // None: no override, just On.
    let st = fake.state(3);
    assert_eq!((st.power.as_str(), st.boot_target.as_str()), ("On", "None"));

    // Reset through the driver: ForceRestart with the one-time boot again.
    let (code, out, err) = b.cli(&["power", "reset", "s-pxe"]);
    assert_eq!(code, 0, "{out} {err}");
    b.wait_for(20, "ForceRestart sent", || {
        fake.state(0)
            .resets
            .iter()
            .any(|r| r == "ForceRestart")
            .then_some(())
    });
    b.wait_for(10, "reset annotation removed", || {
        server(&b, "s-pxe")["metadata"]["annotations"]
            .get("bootplane.dev/reset-requested")
            .is_none()
            .then_some(())
    });

    // Deleting the claims powers the servers off: graceful first; this BMC's OS ignores
    // it, so ForceOff follows after shutdown_timeout_secs (2 s); our media is ejected.
    for c in ["c-pxe", "c-http", "c-media", "c-none"] {
        delete_claim(&b, c);
    }
    for s in ["s-pxe", "s-http", "s-media", "s-none"] {
        b.wait_for(40, &format!("{s} Available and Off"), || {
            let v = server(&b, s);
            (v["status"]["state"] == "Available" && v["status"]["powerState"] == "Off")
                .then_some(())
        });
    }
    for i in 0..4 {
        let st = fake.state(i);
        assert_eq!(st.power, "Off");
        let n = st.resets.len();
        assert_eq!(
            &st.resets[n - 2..],
            ["GracefulShutdown", "ForceOff"],
            "system {i}: {:?}",
            st.resets
        );
    }
    assert!(
        !fake.state(2).media_inserted,
        "virtual media still inserted after power-off"
    );
    assert_password_nowhere(&b, PASSWORD);
}

#[test]
fn a_bmc_without_the_mode_falls_back_to_pxe_with_a_condition() {
    let rt = runtime();
    let fake = rt.block_on(
        FakeBmc::builder()
            .systems(1)
            .credentials("admin", PASSWORD)
            .boot_targets(&["None", "Pxe", "Hdd"])
            .start(),
    );
    let b = start();
    add_bmc(&b, "bmc-old", &fake.base_url, PASSWORD);
    add_server(&b, "s-old", "bmc-old", 0, Some("UefiHttp"));
    let bmc = wait_condition(
        &b,
        &format!("{BMCS}/bmc-old"),
        "BootModes",
        "False",
        "FeatureMissing",
        20,
    );
    assert!(
        bmc["message"].as_str().unwrap().contains("UefiHttp"),
        "{bmc}"
    );
    claim_on(&b, "c-old", "s-old");
    let v = wait_power(&b, "s-old", "On", 30);
    let c = condition(&v, "BootOverride");
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("False"), Some("ModeUnsupported")),
        "{c}"
    );
    assert!(
        c["message"].as_str().unwrap().contains("Pxe set instead"),
        "{c}"
    );
    let st = fake.state(0);
    assert_eq!(
        (st.boot_target.as_str(), st.boot_enabled.as_str()),
        ("Pxe", "Once")
    );
}

#[test]
fn refused_credentials_back_off_and_a_fixed_secret_is_picked_up() {
    let rt = runtime();
    let fake = rt.block_on(
        FakeBmc::builder()
            .systems(1)
            .credentials("admin", PASSWORD)
            .start(),
    );
    let b = start();
    add_bmc(&b, "bmc-w", &fake.base_url, "wrong-password-xyz");
    add_server(&b, "s-w", "bmc-w", 0, None);
    let c = wait_condition(
        &b,
        &format!("{BMCS}/bmc-w"),
        "Authenticated",
        "False",
        "CredentialsRefused",
        20,
    );
    assert!(
        !c["message"]
            .as_str()
            .unwrap()
            .contains("wrong-password-xyz"),
        "{c}"
    );
    claim_on(&b, "c-w", "s-w");
    let c = wait_condition(
        &b,
        &format!("{SERVERS}/s-w"),
        "PowerReady",
        "False",
        "CredentialsRefused",
        20,
    );
    assert!(
        !c["message"]
            .as_str()
            .unwrap()
            .contains("wrong-password-xyz"),
        "{c}"
    );
    // No retry storm: over 8 s, the driver backs off (1, 2, 2, ... s) and the BMC poll
    // runs once a second; each look costs a handful of requests.
    let before = fake.total_requests();
    std::thread::sleep(Duration::from_secs(8));
    let spent = fake.total_requests() - before;
    assert!(
        spent <= 60,
        "{spent} requests in 8 s with refused credentials"
    );
    assert_eq!(fake.state(0).power, "Off");
    // The operator fixes the secret: picked up without a restart.
    let patch = json!({"stringData": {"password": PASSWORD}});
    let (code, v) = b.call("PATCH", &format!("{BMCSECRETS}/bmc-w"), Some(&patch));
    assert_eq!(code, 200, "{v}");
    wait_power(&b, "s-w", "On", 30);
    assert_eq!(fake.state(0).power, "On");
    wait_condition(
        &b,
        &format!("{BMCS}/bmc-w"),
        "Authenticated",
        "True",
        "CredentialsAccepted",
        20,
    );
    let m = metrics_text(&b);
    for series in [
        r#"bootplane_redfish_power_attempts_total{action="On",result="CredentialsRefused"}"#,
        r#"bootplane_redfish_power_attempts_total{action="On",result="ok"} 1"#,
    ] {
        assert!(m.contains(series), "{series} not in /metrics:\n{m}");
    }
    assert_password_nowhere(&b, "wrong-password-xyz");
    assert_password_nowhere(&b, PASSWORD);
}

#[test]
fn unreachable_slow_failing_and_malformed_bmcs_give_reasons_and_recover() {
    let rt = runtime();
    let fake = rt.block_on(
        FakeBmc::builder()
            .systems(2)
            .credentials("admin", PASSWORD)
            .start(),
    );
    let b = start();
    // A BMC nobody answers for.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    add_bmc(&b, "bmc-dead", &dead, PASSWORD);
    wait_condition(
        &b,
        &format!("{BMCS}/bmc-dead"),
        "Reachable",
        "False",
        "Unreachable",
        20,
    );

    add_bmc(&b, "bmc-f", &fake.base_url, PASSWORD);
    add_server(&b, "s-f", "bmc-f", 0, None);
    wait_condition(
        &b,
        &format!("{BMCS}/bmc-f"),
        "Reachable",
        "True",
        "Answered",
        20,
    );
    // Slow: every answer takes longer than timeout_secs (1 s).
    fake.set_delay(Duration::from_millis(1500));
    wait_condition(
        &b,
        &format!("{BMCS}/bmc-f"),
        "Reachable",
        "False",
        "Timeout",
        20,
    );
    fake.set_delay(Duration::ZERO);
    // Malformed JSON for a while.
    fake.push_fault(None, Fault::Malformed, 10_000);
    wait_condition(
        &b,
        &format!("{BMCS}/bmc-f"),
        "Reachable",
        "False",
        "MalformedResponse",
        20,
    );
    claim_on(&b, "c-f", "s-f");
    wait_condition(
        &b,
        &format!("{SERVERS}/s-f"),
        "PowerReady",
        "False",
        "MalformedResponse",
        20,
    );
    // Then 5xx.
    fake.clear_faults();
    fake.push_fault(None, Fault::Status(503), 10_000);
    wait_condition(
        &b,
        &format!("{SERVERS}/s-f"),
        "PowerReady",
        "False",
        "BMCError",
        20,
    );
    let before = fake.total_requests();
    std::thread::sleep(Duration::from_secs(6));
    let spent = fake.total_requests() - before;
    assert!(spent <= 80, "{spent} requests in 6 s against a failing BMC");
    // The BMC recovers: the claim's server comes On.
    fake.clear_faults();
    wait_power(&b, "s-f", "On", 30);
    wait_condition(
        &b,
        &format!("{BMCS}/bmc-f"),
        "Reachable",
        "True",
        "Answered",
        20,
    );

    // Power changed behind bootplane's back: observed, recorded with a reason, and the
    // claimed server is powered On again.
    let resets = fake.state(0).resets.len();
    fake.set_power(0, "Off");
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = false;
    while Instant::now() < deadline && !seen {
        let v = server(&b, "s-f");
        seen = v["status"]["conditions"]
            .as_array()
            .is_some_and(|l| l.iter().any(|c| c["reason"] == "ChangedOutsideBootplane"))
            || fake.state(0).resets.len() > resets;
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        seen,
        "the power change was not observed: {:#}",
        server(&b, "s-f")
    );
    b.wait_for(30, "powered On again", || {
        (fake.state(0).power == "On").then_some(())
    });
    wait_power(&b, "s-f", "On", 30);
    assert!(fake.state(0).resets.len() > resets);
    assert_password_nowhere(&b, PASSWORD);
}

fn json_of(r: ureq::Response) -> Value {
    serde_json::from_str(&r.into_string().unwrap()).unwrap_or(Value::Null)
}

/// `(status, body)` of a request made with bearer `token`, on a connection of its own.
fn call_as(b: &Bootplane, token: &str, method: &str, path: &str, body: &Value) -> (u16, Value) {
    let r = b
        .req(method, path)
        .set("Authorization", &format!("Bearer {token}"))
        .set("Connection", "close");
    let ct = if method == "PATCH" {
        "application/merge-patch+json"
    } else {
        "application/json"
    };
    match r.set("Content-Type", ct).send_string(&body.to_string()) {
        Ok(r) => (r.status(), json_of(r)),
        Err(ureq::Error::Status(c, r)) => (c, json_of(r)),
        Err(e) => panic!("{method} {path}: {e}"),
    }
}

/// Issue 32 item 4 (review M5): a caller who may write Servers (or BMCs, Endpoints) but
/// not read BMCSecrets cannot point another BMC's secret at a host of its own; plain http
/// and the insecure annotation are an admin's; a reference left as it was is not checked
/// again. The "BMC" the attacker points at (a fake one) receives nothing until an admin
/// points a BMC there.
#[test]
fn a_secret_reference_needs_get_on_the_secret_and_plain_http_an_admin() {
    let rt = runtime();
    let rogue = rt.block_on(FakeBmc::builder().credentials("admin", PASSWORD).start());
    let port: u16 = rogue.base_url.rsplit(':').next().unwrap().parse().unwrap();
    let cfg = tempfile::tempdir().unwrap();
    let cfg_path = cfg.path().join("bootplane.toml");
    std::fs::write(
        &cfg_path,
        r#"
[[api.roles]]
name = "fleet-writer"
rules = [
  { verbs = ["*"], resources = ["servers", "servers/*", "serverclaims", "bmcs", "endpoints"] },
]
"#,
    )
    .unwrap();
    let b = Bootplane::start(&[
        "--config",
        cfg_path.to_str().unwrap(),
        "--set",
        "power.redfish.poll_interval_secs=1",
    ]);
    let token = |name: &str, role: &str| {
        let (code, out, err) = b.cli(&["token", "create", name, "--role", role]);
        assert_eq!(code, 0, "{err}");
        out.trim().to_string()
    };
    let writer = token("writer", "fleet-writer");
    let operator = token("ops", "operator");
    // Another BMC's secret, which the writer may not read.
    let (secret, _) = support::api::bmc_objects("victim", &rogue.base_url, PASSWORD);
    let (c, v) = b.call("POST", BMCSECRETS, Some(&secret));
    assert_eq!(c, 201, "{v}");
    let inline = |name: &str, scheme: &str| {
        json!({"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "Server",
               "metadata": {"name": name},
               "spec": {"systemUUID": uuid_of(0).to_lowercase(), "power": "On",
                        "bmc": {"address": "127.0.0.1", "bmcSecretRef": {"name": "victim"},
                                "protocol": {"name": "Redfish", "scheme": scheme, "port": port}}}})
    };

    // The writer: refused, over http and https alike, by create and by patch.
    for scheme in ["http", "https"] {
        let (c, v) = call_as(&b, &writer, "POST", SERVERS, &inline("evil", scheme));
        assert_eq!(c, 403, "{v}");
        let msg = v["message"].as_str().unwrap();
        assert!(
            msg.contains("BMCSecret \"victim\"") && msg.contains("\"writer\""),
            "{msg}"
        );
        assert!(!msg.contains(PASSWORD));
    }
    let plain = json!({"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "Server",
                       "metadata": {"name": "plain"}, "spec": {"systemUUID": uuid_of(1).to_lowercase()}});
    let (c, v) = call_as(&b, &writer, "POST", SERVERS, &plain);
    assert_eq!(c, 201, "{v}");
    let patch = json!({"spec": {"bmc": inline("plain", "http")["spec"]["bmc"].clone()}});
    let (c, v) = call_as(&b, &writer, "PATCH", &format!("{SERVERS}/plain"), &patch);
    assert_eq!(c, 403, "{v}");
    // A BMC naming the secret, and moving an Endpoint a BMC with that secret names.
    let (_, mut bmc) = support::api::bmc_objects("evil-bmc", &rogue.base_url, PASSWORD);
    bmc["spec"]["bmcSecretRef"]["name"] = json!("victim");
    bmc["spec"]["protocol"] = json!({"name": "Redfish", "port": port});
    let (c, v) = call_as(&b, &writer, "POST", BMCS, &bmc);
    assert_eq!(c, 403, "{v}");
    let ep = json!({"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "Endpoint",
                    "metadata": {"name": "ep1"}, "spec": {"macAddress": "52:54:00:00:00:01", "ip": "192.0.2.1"}});
    let eps = "/apis/metal.ironcore.dev/v1alpha1/endpoints";
    let (c, v) = b.call("POST", eps, Some(&ep));
    assert_eq!(c, 201, "{v}");
    let ep_bmc = json!({"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "BMC",
                        "metadata": {"name": "via-ep"},
                        "spec": {"endpointRef": {"name": "ep1"}, "bmcSecretRef": {"name": "victim"},
                                 "protocol": {"name": "Redfish", "port": port}}});
    let (c, v) = b.call("POST", BMCS, Some(&ep_bmc));
    assert_eq!(c, 201, "{v}");
    let moved = json!({"spec": {"ip": "127.0.0.1"}});
    let (c, v) = call_as(&b, &writer, "PATCH", &format!("{eps}/ep1"), &moved);
    assert_eq!(c, 403, "{v}");
    assert!(v["message"].as_str().unwrap().contains("\"victim\""), "{v}");

    // The operator may read the secret: https is fine, plain http and insecure are not.
    let (c, v) = call_as(&b, &operator, "POST", SERVERS, &inline("ops-http", "http"));
    assert_eq!(c, 403, "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("only an admin"),
        "{v}"
    );
    let mut local = bmc.clone();
    local["metadata"]["name"] = json!("ops-local");
    local["spec"]["protocol"] = json!({"name": "RedfishLocal", "port": port});
    let (c, v) = call_as(&b, &operator, "POST", BMCS, &local);
    assert_eq!(c, 403, "{v}");
    // (At a closed port: nothing of this test listens there.)
    let mut ops_https = inline("ops-https", "https");
    ops_https["spec"]["power"] = json!("Off");
    ops_https["spec"]["bmc"]["protocol"]["port"] = json!(1);
    // A machine of its own: a system UUID belongs to one Server (admin-http below is
    // the fake BMC's system).
    ops_https["spec"]["systemUUID"] = json!(uuid_of(2).to_lowercase());
    let (c, v) = call_as(&b, &operator, "POST", SERVERS, &ops_https);
    assert_eq!(c, 201, "{v}");
    let insecure =
        json!({"metadata": {"annotations": {"bootplane.dev/bmc-insecure-skip-verify": "true"}}});
    let (c, v) = call_as(
        &b,
        &operator,
        "PATCH",
        &format!("{SERVERS}/ops-https"),
        &insecure,
    );
    assert_eq!(c, 403, "{v}");

    // Nothing the refused writes named ever reached the rogue listener.
    assert_eq!(rogue.total_requests(), 0);
    assert_eq!(rogue.last_auth(), None);

    // An admin may use plain http; others then change other fields of that Server
    // freely (an unchanged reference is not checked again).
    let (c, v) = b.call("POST", SERVERS, Some(&inline("admin-http", "http")));
    assert_eq!(c, 201, "{v}");
    let labels = json!({"metadata": {"labels": {"rack": "r1"}}});
    let (c, v) = call_as(
        &b,
        &writer,
        "PATCH",
        &format!("{SERVERS}/admin-http"),
        &labels,
    );
    assert_eq!(c, 200, "{v}");
    let (c, v) = call_as(
        &b,
        &operator,
        "PATCH",
        &format!("{SERVERS}/admin-http"),
        &json!({"spec": {"power": "Off"}}),
    );
    assert_eq!(c, 200, "{v}");
    let (c, v) = b.call("POST", BMCS, Some(&local));
    assert_eq!(c, 201, "{v}");
    // The admin's BMC is polled with the secret: what the refusals kept from the listener.
    b.wait_for(20, "the admin's BMC reaches the listener", || {
        (rogue.total_requests() > 0 && rogue.last_auth().is_some()).then_some(())
    });
}
