//! The boot listener wired to the store: a claimed server's boot configuration goes
//! Ready through the image catalog, the machine (by its registered address) follows
//! the iPXE chain to its kernel, initrd and Ignition, the fetches are recorded as
//! conditions on the ServerBootConfiguration, and another address is refused.

use crate::support;

use serde_json::{json, Value};
use support::api::*;
use support::bootplane::*;
use support::data::fixtures;
use support::http::{curl_get, script_ignition_url};

fn kernel_line(script: &str) -> String {
    script
        .lines()
        .find(|l| l.starts_with("kernel "))
        .unwrap_or_else(|| panic!("no kernel line in:\n{script}"))
        .to_string()
}

#[test]
fn claimed_machine_boots_from_the_store_and_progress_is_recorded() {
    let b = Bootplane::start(&[]);
    let mut srv = server_at("node-1", "52:54:00:42:00:01", "127.0.0.2");
    srv["spec"]["systemUUID"] = json!("4C4C4544-0042-0042-0042-000000000042");
    assert_eq!(b.call("POST", SERVERS, Some(&srv)).0, 201);
    let ign = r#"{"ignition":{"version":"3.4.0"},"storage":{"files":[{"path":"/etc/hostname","contents":{"source":"data:,node-1"}}]}}"#;
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "node-1-ign"}, "stringData": {"ignition": ign}});
    let sbc_path = b.claim_ready_with_ignition("node-1-claim", "node-1", &secret, 20);
    b.wait_for(20, "server powered on", || {
        (b.get(&format!("{SERVERS}/node-1"))["status"]["powerState"] == "On").then_some(())
    });

    let base = format!("http://127.0.0.1:{}", b.http_port);
    // Follow the chain as iPXE does: /boot.ipxe, substitute its variables, fetch on.
    let (code, chain) = curl_get("127.0.0.2", &format!("{base}/boot.ipxe"));
    assert_eq!(code, 200, "{chain}");
    assert!(chain.starts_with("#!ipxe"), "{chain}");
    let next = chain
        .lines()
        .filter(|l| l.trim_start().starts_with("chain "))
        .flat_map(|l| l.split_whitespace())
        .find(|w| w.starts_with("http"))
        .unwrap_or_else(|| panic!("no chain URL in {chain}"))
        .to_string();
    // iPXE's substitutions (`:uristring` percent-encodes; these values need none).
    let url = next
        .replace("${uuid}", "4C4C4544-0042-0042-0042-000000000042")
        .replace("${net0/mac:hexhyp}", "52-54-00-42-00-01")
        .replace("${buildarch:uristring}", "x86_64")
        .replace("${platform:uristring}", "pcbios")
        // No DHCP here: option 224 (the script token) is unset, iPXE expands it empty.
        .replace("${224:uristring}", "");
    assert!(!url.contains("${"), "unsubstituted variable in {url}");
    // The generic chain carries no token: a claimed machine's script (which holds its
    // Ignition token) is refused there, even from its own address (issue 32); the
    // machine gets a token in its DHCP reply (option 224).
    let (code, script) = curl_get("127.0.0.2", &url);
    assert_eq!(code, 403, "{script}");
    let (script, _) = b.signed_script("127.0.0.2", "node-1", 20);
    let kernel = kernel_line(&script);
    assert!(kernel.contains("/assets/images/os/kernel"), "{kernel}");
    assert!(
        kernel.contains("ignition.firstboot=1") && kernel.contains("ignition.platform.id=metal"),
        "{kernel}"
    );
    let ign_url = kernel
        .split_whitespace()
        .find_map(|w| w.strip_prefix("ignition.config.url="))
        .unwrap()
        .to_string();
    let kernel_url = kernel.split_whitespace().nth(1).unwrap().to_string();
    let (code, body) = curl_get("127.0.0.2", &kernel_url);
    assert_eq!((code, body.as_str()), (200, "test kernel\n"));
    let (code, body) = curl_get("127.0.0.2", &ign_url);
    assert_eq!(code, 200);
    assert_eq!(body, ign);

    // Another address gets neither the script nor (without the signed URL) the Ignition.
    let (code, _) = curl_get("127.0.0.3", &url);
    assert!(
        code == 403 || code == 404,
        "script from a foreign address: {code}"
    );
    let (code, _) = curl_get("127.0.0.3", &format!("{base}/ignition/node-1"));
    assert!(
        code == 403 || code == 404,
        "ignition from a foreign address: {code}"
    );

    // The fetches are on the boot configuration's status, and `get -o wide` shows them.
    let sbc = b.wait_for(20, "progress conditions", || {
        let s = b.get(&sbc_path);
        let conds = s["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let has = |t: &str| {
            conds
                .iter()
                .any(|c| c["type"] == t && c["status"] == "True")
        };
        (has("IPXEScriptFetched") && has("IgnitionDataFetched")).then_some(s)
    });
    let c = condition(&sbc, "IPXEScriptFetched");
    assert!(c["message"].as_str().unwrap().contains("127.0.0.2"), "{c}");
    let (code, out, _) = b.cli(&["get", "sbc", "-o", "wide"]);
    assert_eq!(code, 0);
    let row = out.lines().find(|l| l.starts_with("node-1-claim")).unwrap();
    assert!(
        row.matches("20").count() >= 2,
        "script and ignition times shown: {out}"
    );

    // /metrics on the API listener carries the boot listener's counters.
    let m = b
        .req("GET", "/metrics")
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    assert!(
        m.contains("bootplane_store_revision") && m.contains("http"),
        "{m}"
    );
}

#[test]
fn missing_image_or_secret_key_puts_the_configuration_in_error() {
    let b = Bootplane::start(&[]);
    assert_eq!(
        b.call("POST", SERVERS, Some(&server("e1", json!({}), "Recycle")))
            .0,
        201
    );
    assert_eq!(
        b.call("POST", SERVERS, Some(&server("e2", json!({}), "Recycle")))
            .0,
        201
    );
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "nokey"}, "stringData": {"other": "x"}});
    assert_eq!(
        b.call("POST", "/api/v1/namespaces/default/secrets", Some(&secret))
            .0,
        201
    );
    let mut c1 = claim("c-unknown-image", None, Some("e1"));
    c1["spec"]["image"] = json!("nosuch:1");
    assert_eq!(b.call("POST", &claims("default"), Some(&c1)).0, 201);
    let mut c2 = claim("c-no-key", None, Some("e2"));
    c2["spec"]["ignitionSecretRef"] = json!({"name": "nokey"});
    assert_eq!(b.call("POST", &claims("default"), Some(&c2)).0, 201);
    for (name, reason, words) in [
        ("c-unknown-image", "UnknownImage", "nosuch:1"),
        ("c-no-key", "IgnitionKeyMissing", "no data key \"ignition\""),
    ] {
        let s: Value = b.wait_for(20, "Error", || {
            let s = b
                .call("GET", &format!("{}/{name}", sbcs("default")), None)
                .1;
            (s["status"]["state"] == "Error").then_some(s)
        });
        let ready = condition(&s, "Ready");
        assert_eq!(ready["reason"], reason, "{s}");
        assert!(
            ready["message"].as_str().unwrap().contains(words),
            "{ready}"
        );
    }
    // The servers wait, powered off, and say why.
    let s = b.get(&format!("{SERVERS}/e1"));
    assert_eq!(s["status"]["powerState"], "Off");
    let cond = condition(&s, "BootConfigurationReady");
    assert!(
        cond["message"].as_str().unwrap().contains("Error"),
        "{cond}"
    );
}

#[test]
fn reference_butane_secret_is_served_as_validated_ignition() {
    let b = Bootplane::start(&[]);
    let srv = server_at("fc-1", "52:54:00:42:00:09", "127.0.0.4");
    assert_eq!(b.call("POST", SERVERS, Some(&srv)).0, 201);
    let (code, out, err) = b.cli(&[
        "apply",
        "-f",
        fixtures()
            .join("metal-operator/ignition_secret.yaml")
            .to_str()
            .unwrap(),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let mut c = claim("fc-claim", None, Some("fc-1"));
    c["spec"]["ignitionSecretRef"] = json!({"name": "ignition-sample"});
    assert_eq!(b.call("POST", &claims("default"), Some(&c)).0, 201);
    let path = format!("{}/fc-claim", sbcs("default"));
    b.wait_for(20, "Ready", || {
        (b.call("GET", &path, None).1["status"]["state"] == "Ready").then_some(())
    });
    let (_, url) = b.signed_script("127.0.0.4", "fc-1", 20);
    let (code, body) = curl_get("127.0.0.4", &url);
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        v["ignition"]["version"], "3.2.0",
        "fcos 1.3.0 translates to Ignition 3.2.0"
    );
    assert_eq!(v["passwd"]["users"][0]["name"], "metal");
    assert!(v["systemd"]["units"]
        .as_array()
        .unwrap()
        .iter()
        .any(|u| u["name"] == "docker-install.service"));
    // A secret whose Butane is invalid turns the configuration to Error, naming the problem.
    let bad = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "bad-bu"},
        "stringData": {"format": "fcos", "ignition": "variant: fcos\nversion: 1.5.0\nstorage:\n  files:\n    - path: relative/path\n"}});
    assert_eq!(
        b.call("POST", "/api/v1/namespaces/default/secrets", Some(&bad))
            .0,
        201
    );
    assert_eq!(
        b.call("POST", SERVERS, Some(&server("fc-2", json!({}), "Recycle")))
            .0,
        201
    );
    let mut c = claim("fc-bad", None, Some("fc-2"));
    c["spec"]["ignitionSecretRef"] = json!({"name": "bad-bu"});
    assert_eq!(b.call("POST", &claims("default"), Some(&c)).0, 201);
    let s = b.wait_for(20, "Error", || {
        let s = b
            .call("GET", &format!("{}/fc-bad", sbcs("default")), None)
            .1;
        (s["status"]["state"] == "Error").then_some(s)
    });
    let msg = s["status"]["conditions"][0]["message"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(msg.contains("relative/path"), "{s}");
}

/// A signed Ignition URL dies with the claim it was minted for: after the claim is
/// deleted and the server claimed again with another Ignition secret, the old token
/// (from an address the machine does not own) no longer opens the new tenant's
/// Ignition; the token minted into the new script does.
#[test]
fn boot_token_dies_with_its_claim() {
    let b = Bootplane::start(&[]);
    let srv = server_at("tok-1", "52:54:00:42:00:21", "127.0.0.5");
    assert_eq!(b.call("POST", SERVERS, Some(&srv)).0, 201);
    let base = format!("http://127.0.0.1:{}", b.http_port);
    // The machine's script (with the token of its DHCP reply), and the token in its
    // Ignition URL.
    let ignition_url = |what: &str| -> String {
        let (script, url) = b.signed_script("127.0.0.5", "tok-1", 20);
        assert!(kernel_line(&script).contains(&url), "{what}: {script}");
        assert!(url.starts_with(&format!("{base}/ignition/tok-1/")), "{url}");
        url
    };
    let ign_a = r#"{"ignition":{"version":"3.4.0"},"storage":{"files":[{"path":"/etc/tenant","contents":{"source":"data:,tenant-a"}}]}}"#;
    let secret_a = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "tenant-a"}, "stringData": {"ignition": ign_a}});
    b.claim_ready_with_ignition("tenant-a", "tok-1", &secret_a, 20);
    let old = ignition_url("first claim");
    // The token works from an address the machine does not own.
    let (code, body) = curl_get("127.0.0.6", &old);
    assert_eq!((code, body.as_str()), (200, ign_a));

    // Release the server and claim it again for another tenant.
    let (code, v) = b.call("DELETE", &format!("{}/tenant-a", claims("default")), None);
    assert!(code == 200 || code == 202, "{v}");
    b.wait_for(30, "server available again", || {
        let s = b.get(&format!("{SERVERS}/tok-1"));
        (s["status"]["state"] == "Available" && s["spec"]["serverClaimRef"].is_null()).then_some(())
    });
    let ign_b = r#"{"ignition":{"version":"3.4.0"},"storage":{"files":[{"path":"/etc/tenant","contents":{"source":"data:,tenant-b"}}]}}"#;
    let secret_b = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "tenant-b"}, "stringData": {"ignition": ign_b}});
    b.claim_ready_with_ignition("tenant-b", "tok-1", &secret_b, 20);
    // The boot index follows the store by watch: wait until it serves the new tenant.
    b.wait_for(20, "new tenant served", || {
        let url = script_ignition_url("127.0.0.5", &b.signed_script_url("tok-1"))?;
        let (code, body) = curl_get("127.0.0.5", &url);
        (code == 200 && body == ign_b).then_some(())
    });

    let (code, body) = curl_get("127.0.0.6", &old);
    assert!(
        code == 403 || code == 404,
        "the first claim's token still opens the server's Ignition: {code} {body}"
    );
    assert!(!body.contains("tenant-b"), "{body}");
    let new = ignition_url("second claim");
    assert_ne!(new, old);
    let (code, body) = curl_get("127.0.0.6", &new);
    assert_eq!((code, body.as_str()), (200, ign_b));
}

/// `method path` on the API as the bearer of `token`: the HTTP status.
fn status_as(b: &Bootplane, token: &str, method: &str, path: &str, body: &Value) -> u16 {
    let r = b
        .req(method, path)
        .set("Authorization", &format!("Bearer {token}"))
        .set("Content-Type", "application/merge-patch+json")
        .send_string(&body.to_string());
    match r {
        Ok(r) => r.status(),
        Err(ureq::Error::Status(c, _)) => c,
        Err(e) => panic!("{method} {path}: {e}"),
    }
}

/// Issue 32: the identity the boot listener trusts is not the agent's to write, a
/// registered address is not enough for Ignition with signed URLs, and a MAC or UUID
/// belongs to one Server.
#[test]
fn identity_is_not_the_agents_and_ignition_needs_the_token() {
    let b = Bootplane::start(&[]);
    let mut srv = server_at("id-1", "52:54:00:32:00:01", "127.0.0.7");
    srv["spec"]["systemUUID"] = json!("4c4c4544-0032-0032-0032-000000000032");
    assert_eq!(b.call("POST", SERVERS, Some(&srv)).0, 201);
    let ign = r#"{"ignition":{"version":"3.4.0"},"storage":{"files":[{"path":"/etc/tenant","contents":{"source":"data:,secret-32"}}]}}"#;
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "id-1-ign"}, "stringData": {"ignition": ign}});
    b.claim_ready_with_ignition("id-1-claim", "id-1", &secret, 20);
    let base = format!("http://127.0.0.1:{}", b.http_port);

    // The agent cannot add an address of its own to the claimed server.
    let (code, agent, err) = b.cli(&["token", "create", "ag", "--role", "agent"]);
    assert_eq!(code, 0, "{err}");
    let patch = json!({"status": {"networkInterfaces": [
        {"name": "eth0", "macAddress": "52:54:00:32:00:01", "ips": ["127.0.0.7", "127.0.0.9"]}]}});
    let path = format!("{SERVERS}/id-1/status");
    assert_eq!(status_as(&b, agent.trim(), "PATCH", &path, &patch), 403);
    let s = b.get(&format!("{SERVERS}/id-1"));
    assert!(!s["status"].to_string().contains("127.0.0.9"), "{s}");
    let plain = format!("{base}/ignition/id-1");
    let (code, body) = curl_get("127.0.0.9", &plain);
    assert_eq!(code, 403, "{body}");
    // Not from the registered address either, without the token.
    let (code, body) = curl_get("127.0.0.7", &plain);
    assert_eq!(code, 403, "{body}");
    assert!(!body.contains("secret-32"), "{body}");
    // Nor the script, which carries the Ignition token (issue 32: the registered
    // address is anyone's who takes it).
    for from in ["127.0.0.7", "127.0.0.9"] {
        let (code, body) = curl_get(
            from,
            &format!("{base}/ipxe/script?uuid=4c4c4544-0032-0032-0032-000000000032"),
        );
        assert_eq!(code, 403, "{from}: {body}");
    }
    // The machine's DHCP reply carries a script token, the script the Ignition token;
    // with it the Ignition is served.
    let (_, url) = b.signed_script("127.0.0.7", "id-1", 20);
    let (code, body) = curl_get("127.0.0.7", &url);
    assert_eq!((code, body.as_str()), (200, ign));
    // A wrong token is refused even from the registered address.
    let (code, _) = curl_get("127.0.0.7", &format!("{plain}/1.AAAA"));
    assert_eq!(code, 403);

    // A second Server with the taken MAC, or the taken UUID: 409.
    let dup = server_at("id-2", "52-54-00-32-00-01", "127.0.0.10");
    let (code, v) = b.call("POST", SERVERS, Some(&dup));
    assert_eq!(code, 409, "{v}");
    assert!(v["message"].as_str().unwrap_or("").contains("id-1"), "{v}");
    let mut dup = server_at("id-2", "52:54:00:32:00:02", "127.0.0.10");
    dup["spec"]["systemUUID"] = json!("4C4C4544-0032-0032-0032-000000000032");
    assert_eq!(b.call("POST", SERVERS, Some(&dup)).0, 409);
    // Nor can a later write give an existing Server the MAC.
    let ok = server_at("id-3", "52:54:00:32:00:03", "127.0.0.11");
    assert_eq!(b.call("POST", SERVERS, Some(&ok)).0, 201);
    let (code, v) = b.call(
        "PATCH",
        &format!("{SERVERS}/id-3/status"),
        Some(&json!({"status": {"networkInterfaces": [
            {"name": "eth0", "macAddress": "52:54:00:32:00:03"},
            {"name": "eth1", "macAddress": "52:54:00:32:00:01"}]}})),
    );
    assert_eq!(code, 409, "{v}");
    // The machine still boots by its MAC once the other Server is gone.
    assert!(matches!(
        b.call("DELETE", &format!("{SERVERS}/id-3"), None).0,
        200 | 202
    ));
    // Its MAC still names it: without a token, refused (an unknown MAC would get the
    // default script); with one, served.
    let (code, body) = curl_get(
        "127.0.0.7",
        &format!("{base}/ipxe/script?mac=52-54-00-32-00-01"),
    );
    assert_eq!(code, 403, "machine script by MAC without a token: {body}");
    b.signed_script("127.0.0.7", "id-1", 20);
}

/// `http.ignition_once`: a second fetch in the same boot is refused, a power cycle by
/// the driver opens it again, to the new boot's token only: the tokens minted before
/// the power cycle (script and Ignition) are refused after it.
#[test]
fn one_shot_ignition_is_served_once_per_boot() {
    let b = Bootplane::start(&["--set", "http.ignition_once=true"]);
    let srv = server_at("once-1", "52:54:00:32:01:01", "127.0.0.12");
    assert_eq!(b.call("POST", SERVERS, Some(&srv)).0, 201);
    let ign = r#"{"ignition":{"version":"3.4.0"}}"#;
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "once-ign"}, "stringData": {"ignition": ign}});
    b.claim_ready_with_ignition("once-claim", "once-1", &secret, 20);
    // Powered on by the driver first: a version saying Off starts a new boot.
    b.wait_for(20, "server powered on", || {
        (b.get(&format!("{SERVERS}/once-1"))["status"]["powerState"] == "On").then_some(())
    });
    let script_url = b.signed_script_url("once-1");
    let (_, url) = b.signed_script("127.0.0.12", "once-1", 20);
    let (code, body) = curl_get("127.0.0.12", &url);
    assert_eq!((code, body.as_str()), (200, ign));
    let (code, body) = curl_get("127.0.0.12", &url);
    assert_eq!(code, 403, "second fetch in the same boot: {body}");
    let generation = |b: &Bootplane| {
        b.get(&format!("{SERVERS}/once-1"))["metadata"]["annotations"]
            ["bootplane.dev/boot-generation"]
            .clone()
    };
    let before = generation(&b);
    let (code, _, err) = b.cli(&["power", "reset", "once-1"]);
    assert_eq!(code, 0, "{err}");
    b.wait_for(20, "a new boot generation", || {
        (generation(&b) != before).then_some(())
    });
    // The new boot's script and Ignition, once the listener has the new generation.
    let (_, url2) = b.signed_script("127.0.0.12", "once-1", 20);
    assert_ne!(url2, url);
    b.wait_for(20, "ignition served again after the reset", || {
        (curl_get("127.0.0.12", &url2).0 == 200).then_some(())
    });
    assert_eq!(curl_get("127.0.0.12", &url2).0, 403);
    // The tokens of the boot before the reset: refused.
    let (code, body) = curl_get("127.0.0.12", &url);
    assert_eq!(code, 403, "ignition token from before the reset: {body}");
    let (code, body) = curl_get("127.0.0.12", &script_url);
    assert_eq!(code, 403, "script token from before the reset: {body}");
}
