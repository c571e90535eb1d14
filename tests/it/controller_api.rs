//! Issue 2 acceptance: the real `bootplane` binary, its REST API and CLI, the
//! store's crash safety and watch semantics, and the claim reconciler under races.

use crate::support;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use support::api::*;
use support::bootplane::*;
use support::data::fixtures;

fn phase_counts(b: &Bootplane, ns: &str) -> (usize, usize, usize) {
    let list = b.get(&claims(ns));
    let items = list["items"].as_array().unwrap();
    let bound = items
        .iter()
        .filter(|c| c["status"]["phase"] == "Bound")
        .count();
    let unbound = items
        .iter()
        .filter(|c| c["status"]["phase"] == "Unbound")
        .count();
    (items.len(), bound, unbound)
}

/// No server is bound twice, and every Bound claim's server points back at it.
fn assert_no_double_binding(b: &Bootplane, ns: &str) -> usize {
    let servers = b.get(SERVERS);
    let mut by_claim: HashMap<String, Vec<String>> = HashMap::new();
    for s in servers["items"].as_array().unwrap() {
        if let Some(r) = s["spec"]["serverClaimRef"].as_object() {
            if r["namespace"] == ns {
                by_claim
                    .entry(r["name"].as_str().unwrap().to_string())
                    .or_default()
                    .push(s["metadata"]["name"].as_str().unwrap().to_string());
            }
        }
    }
    for (c, s) in &by_claim {
        assert_eq!(s.len(), 1, "claim {c} holds servers {s:?}");
    }
    let list = b.get(&claims(ns));
    let mut seen = HashSet::new();
    for c in list["items"].as_array().unwrap() {
        if c["status"]["phase"] == "Bound" {
            let srv = c["spec"]["serverRef"]["name"].as_str().unwrap().to_string();
            assert!(
                seen.insert(srv.clone()),
                "server {srv} is the serverRef of two Bound claims"
            );
            let name = c["metadata"]["name"].as_str().unwrap();
            assert_eq!(
                by_claim.get(name),
                Some(&vec![srv.clone()]),
                "server {srv} does not point back at claim {name}"
            );
        }
    }
    seen.len()
}

#[test]
fn reference_samples_apply_unchanged_and_get_shows_them() {
    let b = Bootplane::start(&[]);
    let dir = fixtures().join("metal-operator");
    for f in [
        "metal_v1alpha1_server.yaml",
        "ignition_secret.yaml",
        "metal_v1alpha1_serverclaim.yaml",
        "metal_v1alpha1_serverbootconfiguration.yaml",
        "metal_v1alpha1_bmcsecret.yaml",
        "metal_v1alpha1_bmc.yaml",
        "metal_v1alpha1_endpoint.yaml",
    ] {
        let (code, out, err) = b.cli(&["apply", "-f", dir.join(f).to_str().unwrap()]);
        assert_eq!(code, 0, "{f}: {out} {err}");
        assert!(out.contains("created"), "{f}: {out}");
        // Applying again changes nothing.
        let (code, out, err) = b.cli(&["apply", "-f", dir.join(f).to_str().unwrap()]);
        assert_eq!(code, 0, "{f}: {err}");
        assert!(
            out.contains("unchanged") || out.contains("configured"),
            "{f}: {out}"
        );
    }
    let (code, out, _) = b.cli(&["get", "servers"]);
    assert_eq!(code, 0);
    assert!(out.lines().next().unwrap().starts_with("NAME"), "{out}");
    assert!(
        out.contains("endpoint-sample-system-0")
            && out.contains("00000000-0000-0000-0000-000000000001"),
        "{out}"
    );
    let (_, out, _) = b.cli(&["get", "serverclaims"]);
    assert!(
        out.contains("serverclaim-sample") && out.contains("os-image:latest"),
        "{out}"
    );
    let (_, out, _) = b.cli(&["get", "sbc", "-o", "wide"]);
    assert!(
        out.contains("serverbootconfiguration-sample") && out.contains("SCRIPT"),
        "{out}"
    );
    let (_, out, _) = b.cli(&["get", "secret", "ignition-sample", "-o", "yaml"]);
    assert!(out.contains("format: ZmNvcw=="), "{out}");
    let (_, out, _) = b.cli(&["get", "server", "endpoint-sample-system-0", "-o", "json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["spec"]["bmcRef"]["name"], "bmc-sample");
    // BMCSecret: stringData is stored as base64 data, like a Secret's.
    let (_, out, _) = b.cli(&["get", "bmcsecret", "bmcsecret-sample", "-o", "json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["data"]["password"], "YmFy", "{out}");
    assert!(v.get("stringData").is_none(), "{out}");
    let (code, out, _) = b.cli(&["get", "bmcs"]);
    assert_eq!(code, 0);
    assert!(out.contains("bmc-sample"), "{out}");
    let (code, out, _) = b.cli(&["get", "endpoints"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("endpoint-sample") && out.contains("23:11:8A:33:CF:EA"),
        "{out}"
    );
    // The sample server has no inventory, so it waits in Initial and the claim cannot bind.
    b.wait_for(20, "sample server Initial", || {
        (b.get(&format!("{SERVERS}/endpoint-sample-system-0"))["status"]["state"] == "Initial")
            .then_some(())
    });
    // ssh_secret.yaml is a truncated placeholder ("U2tINW..." is not base64); like
    // Kubernetes, bootplane refuses it and says why.
    let (code, _, err) = b.cli(&["apply", "-f", dir.join("ssh_secret.yaml").to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("illegal base64"), "{err}");
}

#[test]
fn apply_multi_document_stdin_and_directory() {
    let b = Bootplane::start(&[]);
    let docs = "---\napiVersion: metal.ironcore.dev/v1alpha1\nkind: Server\nmetadata:\n  name: s1\nspec:\n  systemUUID: 4c4c4544-0000-0000-0000-0000000000a1\n---\n\n---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: sec\nstringData:\n  ignition: '{}'\n";
    let (code, out, err) = b.cli_stdin(&["apply", "-f", "-"], Some(docs));
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 2, "{out}");
    let (code, out, err) = b.cli(&[
        "apply",
        "-f",
        fixtures().join("metal-operator").to_str().unwrap(),
    ]);
    assert_eq!(
        code, 1,
        "the ssh placeholder secret fails, the rest apply: {out} {err}"
    );
    // server, serverclaim, serverbootconfiguration, ignition secret, bmc, bmcsecret, endpoint.
    assert_eq!(out.matches("created").count(), 7, "{out}");
    let (_, out, _) = b.cli(&["get", "srv", "-l", "app.kubernetes.io/name=server"]);
    assert!(
        out.contains("endpoint-sample-system-0") && !out.contains("s1 "),
        "{out}"
    );
    let (code, out, _) = b.cli(&["delete", "server", "s1"]);
    assert_eq!(code, 0, "{out}");
    let (code, _, err) = b.cli(&["get", "server", "s1"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("NotFound") && err.contains("\"s1\" not found"),
        "{err}"
    );
}

#[test]
fn two_hundred_claims_race_for_fifty_servers_five_times() {
    let b = Bootplane::start(&[]);
    for round in 0..5 {
        let pool = format!("race{round}");
        let ns = format!("r{round}");
        // 50 servers in this round's pool.
        std::thread::scope(|s| {
            for t in 0..5 {
                let (b, pool) = (&b, &pool);
                s.spawn(move || {
                    for i in (t * 10)..(t * 10 + 10) {
                        let (c, v) = b.call(
                            "POST",
                            SERVERS,
                            Some(&server(
                                &format!("{pool}-s{i:02}"),
                                json!({"pool": pool}),
                                "Recycle",
                            )),
                        );
                        assert_eq!(c, 201, "{v}");
                    }
                });
            }
        });
        // 200 claims from 20 concurrent clients.
        std::thread::scope(|s| {
            for t in 0..20 {
                let (b, pool, ns) = (&b, &pool, &ns);
                s.spawn(move || {
                    for i in 0..10 {
                        let mut c = claim(
                            &format!("c{t:02}-{i}"),
                            Some(json!({"matchLabels": {"pool": pool}})),
                            None,
                        );
                        c["metadata"]["namespace"] = json!(ns);
                        let (code, v) = b.call("POST", &claims(ns), Some(&c));
                        assert_eq!(code, 201, "{v}");
                    }
                });
            }
        });
        let (total, bound, unbound) = b.wait_for(60, "claims to settle", || {
            let r = phase_counts(&b, &ns);
            (r.1 == 50 && r.2 == 150).then_some(r)
        });
        assert_eq!((total, bound, unbound), (200, 50, 150), "round {round}");
        // Let any in-flight reconciles land, then check again.
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(
            phase_counts(&b, &ns),
            (200, 50, 150),
            "round {round} after settling"
        );
        assert_eq!(assert_no_double_binding(&b, &ns), 50, "round {round}");
        // Every bound server is Reserved.
        let servers = b.get(&format!("{SERVERS}?labelSelector=pool%3D{pool}"));
        let reserved = b.wait_for(20, "servers reserved", || {
            let s = b.get(&format!("{SERVERS}?labelSelector=pool%3D{pool}"));
            let n = s["items"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|s| s["status"]["state"] == "Reserved")
                .count();
            (n == 50).then_some(n)
        });
        assert_eq!(reserved, 50);
        assert_eq!(servers["items"].as_array().unwrap().len(), 50);
    }
}

#[test]
fn claim_deletion_recycles_or_retains_the_server() {
    let b = Bootplane::start(&[]);
    for (name, policy, want) in [
        ("rec", "Recycle", "Available"),
        ("ret", "Retain", "Released"),
    ] {
        let (c, v) = b.call("POST", SERVERS, Some(&server(name, json!({}), policy)));
        assert_eq!(c, 201, "{v}");
        let (c, v) = b.call(
            "POST",
            &claims("default"),
            Some(&claim(&format!("claim-{name}"), None, Some(name))),
        );
        assert_eq!(c, 201, "{v}");
        let cpath = format!("{}/claim-{name}", claims("default"));
        b.wait_for(20, "bound", || {
            (b.get(&cpath)["status"]["phase"] == "Bound").then_some(())
        });
        let spath = format!("{SERVERS}/{name}");
        b.wait_for(20, "reserved", || {
            (b.get(&spath)["status"]["state"] == "Reserved").then_some(())
        });
        let sbc = b.get(&format!("{}/claim-{name}", sbcs("default")));
        assert_eq!(sbc["spec"]["serverRef"]["name"], name);
        assert_eq!(sbc["metadata"]["ownerReferences"][0]["kind"], "ServerClaim");
        // The binding was one write: the claim (finalizer, serverRef, Bound) and its boot
        // configuration, with its status, at one revision, and nothing written after.
        let bound = b.get(&cpath);
        assert_eq!(
            bound["metadata"]["resourceVersion"], sbc["metadata"]["resourceVersion"],
            "{bound}\n{sbc}"
        );
        assert!(sbc["status"]["state"].is_string(), "{sbc}");
        assert_eq!(bound["spec"]["serverRef"]["name"], name);
        let (c, v) = b.call("DELETE", &cpath, None);
        assert_eq!(c, 200, "{v}");
        b.wait_for(20, "claim gone", || {
            (b.call("GET", &cpath, None).0 == 404).then_some(())
        });
        let s = b.wait_for(20, want, || {
            let s = b.get(&spath);
            (s["status"]["state"] == want).then_some(s)
        });
        assert!(s["spec"].get("serverClaimRef").is_none(), "{s}");
        assert_eq!(s["status"]["powerState"], "Off");
        assert_eq!(
            b.call("GET", &format!("{}/claim-{name}", sbcs("default")), None)
                .0,
            404,
            "boot configuration removed"
        );
    }
}

#[test]
fn bad_input_gets_the_right_status_and_stores_nothing() {
    let b = Bootplane::start(&[]);
    let rev = |b: &Bootplane| {
        b.get(SERVERS)["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    let post_yaml = |path: &str, text: &str| -> (u16, Value) {
        match b
            .req("POST", path)
            .set("Content-Type", "application/yaml")
            .send_string(text)
        {
            Ok(r) => (
                r.status(),
                serde_json::from_str(&r.into_string().unwrap()).unwrap(),
            ),
            Err(ureq::Error::Status(c, r)) => {
                (c, serde_json::from_str(&r.into_string().unwrap()).unwrap())
            }
            Err(e) => panic!("{e}"),
        }
    };
    let r0 = rev(&b);
    // Malformed YAML.
    let (c, v) = post_yaml(SERVERS, "metadata: {name: [unclosed\n");
    assert_eq!(c, 400);
    assert_eq!(v["kind"], "Status");
    assert!(
        v["message"].as_str().unwrap().contains("malformed YAML"),
        "{v}"
    );
    // Unknown kind.
    let (c, v) = b.call(
        "POST",
        "/apis/metal.ironcore.dev/v1alpha1/widgets",
        Some(&json!({"metadata": {"name": "w"}})),
    );
    assert_eq!(c, 404);
    assert!(v["message"].as_str().unwrap().contains("widgets"), "{v}");
    let (code, _, err) = b.cli_stdin(
        &["apply", "-f", "-"],
        Some("apiVersion: metal.ironcore.dev/v1alpha1\nkind: Widget\nmetadata: {name: w}\n"),
    );
    assert_eq!(code, 1);
    assert!(err.contains("no matches for kind \"Widget\""), "{err}");
    // Missing required field.
    let (c, v) = b.call("POST", &claims("default"), Some(&json!({"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "ServerClaim", "metadata": {"name": "x"}, "spec": {"image": "i"}})));
    assert_eq!(c, 422);
    assert_eq!(v["reason"], "Invalid");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("spec.power: Required value"),
        "{v}"
    );
    assert_eq!(v["details"]["causes"][0]["field"], "spec.power");
    // Invalid enum.
    let mut s = server("bad-enum", json!({}), "Recycle");
    s["spec"]["reclaimPolicy"] = json!("Shred");
    let (c, v) = b.call("POST", SERVERS, Some(&s));
    assert_eq!(c, 422);
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("spec.reclaimPolicy: Unsupported value: \"Shred\""),
        "{v}"
    );
    // Unknown field.
    let mut s = server("bad-field", json!({}), "Recycle");
    s["spec"]["colour"] = json!("blue");
    let (c, v) = b.call("POST", SERVERS, Some(&s));
    assert_eq!(c, 422);
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("unknown field \"spec.colour\""),
        "{v}"
    );
    assert_eq!(rev(&b), r0, "nothing was stored");
    // Immutable field.
    let (c, v) = b.call(
        "POST",
        &claims("default"),
        Some(&claim("imm", None, Some("nowhere"))),
    );
    assert_eq!(c, 201, "{v}");
    // The claim controller may already have updated it (finalizer, status): start from
    // the current version so the answer is about immutability, not a stale version.
    let mut attempt = 0;
    let (c, e) = loop {
        let (c, mut changed) = b.call("GET", &format!("{}/imm", claims("default")), None);
        assert_eq!(c, 200, "{changed}");
        changed["spec"]["serverRef"]["name"] = json!("elsewhere");
        let (c, e) = b.call("PUT", &format!("{}/imm", claims("default")), Some(&changed));
        attempt += 1;
        if c != 409 || attempt == 10 {
            break (c, e);
        }
    };
    assert_eq!(c, 422, "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("serverRef is immutable"),
        "{e}"
    );
    // Stale resourceVersion (once the controller has settled the claim as Unbound).
    let cur = b.wait_for(20, "claim unbound", || {
        let c = b.get(&format!("{}/imm", claims("default")));
        (c["status"]["phase"] == "Unbound").then_some(c)
    });
    let mut upd = cur.clone();
    upd["spec"]["image"] = json!("other:1");
    let (c, _) = b.call("PUT", &format!("{}/imm", claims("default")), Some(&upd));
    assert_eq!(c, 200);
    let mut stale = cur.clone();
    stale["spec"]["image"] = json!("other:2");
    let (c, e) = b.call("PUT", &format!("{}/imm", claims("default")), Some(&stale));
    assert_eq!(c, 409);
    assert_eq!(e["reason"], "Conflict");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("the object has been modified"),
        "{e}"
    );
    assert_eq!(
        b.get(&format!("{}/imm", claims("default")))["spec"]["image"],
        "other:1"
    );
    // Missing and wrong token.
    let r = b.agent.get(&format!("{}{}", b.api, SERVERS)).call();
    match r {
        Err(ureq::Error::Status(401, r)) => {
            assert!(r.into_string().unwrap().contains("bearer token"))
        }
        other => panic!("expected 401, got {other:?}"),
    }
    let r = b
        .agent
        .get(&format!("{}{}", b.api, SERVERS))
        .set("Authorization", "Bearer nope")
        .call();
    assert!(matches!(r, Err(ureq::Error::Status(401, _))));
    let r = b
        .agent
        .post(&format!("{}{}", b.api, SERVERS))
        .set("Authorization", "Bearer nope")
        .send_string(&server("sneaky", json!({}), "Recycle").to_string());
    assert!(matches!(r, Err(ureq::Error::Status(401, _))));
    assert_eq!(b.call("GET", &format!("{SERVERS}/sneaky"), None).0, 404);
    // Token file is private.
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(b.dir.join("api-token"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
}

#[test]
fn watch_from_revision_sees_every_change_once_in_order() {
    let b = Bootplane::start(&[]);
    for i in 0..5 {
        let (c, _) = b.call("POST", "/api/v1/namespaces/default/secrets", Some(&json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": format!("pre{i}")}, "stringData": {"k": "v"}})));
        assert_eq!(c, 201);
    }
    let r = b.get("/api/v1/namespaces/default/secrets")["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    // Changes after R, written by a second client while the watch is open.
    let url = format!(
        "{}/api/v1/namespaces/default/secrets?watch=true&resourceVersion={r}",
        b.api
    );
    let resp = b
        .agent
        .get(&url)
        .set("Authorization", &format!("Bearer {}", b.token))
        .call()
        .unwrap();
    let seen = Arc::new(Mutex::new(Vec::<(String, String, u64)>::new()));
    let reader = {
        let seen = seen.clone();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(resp.into_reader()).lines() {
                let ev: Value = serde_json::from_str(&line.unwrap()).unwrap();
                let rv = ev["object"]["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                let mut s = seen.lock().unwrap();
                s.push((
                    ev["type"].as_str().unwrap().into(),
                    ev["object"]["metadata"]["name"].as_str().unwrap().into(),
                    rv,
                ));
                if s.len() == 150 {
                    return;
                }
            }
        })
    };
    let mut expected = Vec::new();
    for i in 0..50 {
        let name = format!("w{i}");
        let (c, _) = b.call("POST", "/api/v1/namespaces/default/secrets", Some(&json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": {"k": "1"}})));
        assert_eq!(c, 201);
        expected.push(("ADDED".to_string(), name.clone()));
        let (c, _) = b.call(
            "PATCH",
            &format!("/api/v1/namespaces/default/secrets/{name}"),
            Some(&json!({"stringData": null, "data": {"k": "Mg=="}})),
        );
        assert_eq!(c, 200);
        expected.push(("MODIFIED".to_string(), name.clone()));
        let (c, _) = b.call(
            "DELETE",
            &format!("/api/v1/namespaces/default/secrets/{name}"),
            None,
        );
        assert_eq!(c, 200);
        expected.push(("DELETED".to_string(), name));
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !reader.is_finished() {
        assert!(
            std::time::Instant::now() < deadline,
            "watch saw only {} events",
            seen.lock().unwrap().len()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let seen = seen.lock().unwrap();
    let got: Vec<(String, String)> = seen
        .iter()
        .map(|(t, n, _)| (t.clone(), n.clone()))
        .collect();
    assert_eq!(got, expected);
    let revs: Vec<u64> = seen.iter().map(|x| x.2).collect();
    assert!(
        revs.windows(2).all(|w| w[0] < w[1]),
        "revisions strictly increase: {revs:?}"
    );
    assert!(revs[0] > r.parse().unwrap());
    // A revision older than the retained history gets 410 after a restart.
}

#[test]
fn kill9_mid_burst_loses_no_acknowledged_write_and_never_double_binds() {
    let mut b = Bootplane::start(&[]);
    for i in 0..40 {
        let (c, _) = b.call(
            "POST",
            SERVERS,
            Some(&server(
                &format!("k-s{i:02}"),
                json!({"pool": "k"}),
                "Recycle",
            )),
        );
        assert_eq!(c, 201);
    }
    let acked = Arc::new(Mutex::new(Vec::<(String, u64)>::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for t in 0..8 {
        let (acked, stop, api, token, agent) = (
            acked.clone(),
            stop.clone(),
            b.api.clone(),
            b.token.clone(),
            b.agent.clone(),
        );
        writers.push(std::thread::spawn(move || {
            for i in 0.. {
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                let name = format!("k-c{t}-{i}");
                let body = claim(&name, Some(json!({"matchLabels": {"pool": "k"}})), None);
                let r = agent
                    .post(&format!("{api}{}", claims("default")))
                    .set("Authorization", &format!("Bearer {token}"))
                    .timeout(Duration::from_secs(5))
                    .send_string(&body.to_string());
                match r {
                    Ok(r) if r.status() == 201 => {
                        let v: Value = serde_json::from_str(&r.into_string().unwrap()).unwrap();
                        let rv = v["metadata"]["resourceVersion"]
                            .as_str()
                            .unwrap()
                            .parse()
                            .unwrap();
                        acked.lock().unwrap().push((name, rv));
                    }
                    _ => return, // server gone
                }
            }
        }));
    }
    b.wait_for(30, "a burst of acknowledged writes", || {
        (acked.lock().unwrap().len() >= 150).then_some(())
    });
    b.kill9();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for w in writers {
        w.join().unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    let max_rv = acked.iter().map(|a| a.1).max().unwrap();
    b.spawn();
    let list = b.get(&claims("default"));
    let names: HashSet<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["metadata"]["name"].as_str().unwrap())
        .collect();
    for (n, _) in &acked {
        assert!(
            names.contains(n.as_str()),
            "acknowledged claim {n} lost after kill -9"
        );
    }
    let list_rv: u64 = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(list_rv >= max_rv);
    let (c, v) = b.call(
        "POST",
        SERVERS,
        Some(&server("after-restart", json!({}), "Recycle")),
    );
    assert_eq!(c, 201);
    assert!(
        v["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > max_rv,
        "revisions only grow"
    );
    let total = names.len();
    b.wait_for(60, "reconciliation to complete", || {
        let (n, bound, unbound) = phase_counts(&b, "default");
        eprintln!("total {total} listed {n} bound {bound} unbound {unbound}");
        (n == total && bound == 40 && bound + unbound == total).then_some(())
    });
    assert_eq!(assert_no_double_binding(&b, "default"), 40);
    // Graceful stop closes the store cleanly; a restart sees the same state.
    let st = b.stop();
    assert!(st.success(), "exit status {st}");
    b.spawn();
    assert_eq!(phase_counts(&b, "default").1, 40);
}

#[test]
fn check_config_validates_and_names_the_problem() {
    let ok = std::process::Command::new(bin())
        .args([
            "check-config",
            concat!(env!("CARGO_MANIFEST_DIR"), "/examples/bootplane.toml"),
        ])
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains("state_dir"));
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[api]\nlisten = \"127.0.0.1:9090\"\nport = 3\n").unwrap();
    let out = std::process::Command::new(bin())
        .arg("check-config")
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown field `port`"), "{err}");
    // Flags and env override the file.
    let out = std::process::Command::new(bin())
        .args([
            "check-config",
            concat!(env!("CARGO_MANIFEST_DIR"), "/examples/bootplane.toml"),
            "--api-listen",
            "127.0.0.1:7777",
        ])
        .env("BOOTPLANE_STATE_DIR", "/tmp/elsewhere")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("127.0.0.1:7777") && text.contains("/tmp/elsewhere"),
        "{text}"
    );
}

#[test]
fn manual_power_driver_waits_for_an_operator() {
    let b = Bootplane::start(&["--power-driver", "manual"]);
    let (c, _) = b.call("POST", SERVERS, Some(&server("m1", json!({}), "Recycle")));
    assert_eq!(c, 201);
    let (c, _) = b.call(
        "POST",
        &claims("default"),
        Some(&claim("mc", None, Some("m1"))),
    );
    assert_eq!(c, 201);
    let cond = |s: &Value, ty: &str| -> Option<Value> {
        s["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == ty)
            .cloned()
    };
    let spath = format!("{SERVERS}/m1");
    let pending = b.wait_for(20, "power pending", || {
        let s = b.get(&spath);
        cond(&s, "PowerReady").filter(|c| c["reason"] == "Pending")
    });
    assert!(
        pending["message"].as_str().unwrap().contains("operator"),
        "{pending}"
    );
    assert_eq!(b.get(&spath)["status"]["powerState"], "Off");
    let (code, out, err) = b.cli(&["power", "confirm", "m1", "On"]);
    assert_eq!(code, 0, "{out}{err}");
    b.wait_for(20, "power confirmed", || {
        let s = b.get(&spath);
        (s["status"]["powerState"] == "On"
            && cond(&s, "PowerReady").is_some_and(|c| c["status"] == "True"))
        .then_some(())
    });
    // Release: wants Off, waits for the operator again, then Available.
    let (c, _) = b.call("DELETE", &format!("{}/mc", claims("default")), None);
    assert_eq!(c, 200);
    b.wait_for(20, "power-off pending", || {
        let s = b.get(&spath);
        cond(&s, "PowerReady")
            .filter(|c| c["reason"] == "Pending" && c["message"].as_str().unwrap().contains("Off"))
    });
    assert_eq!(
        b.get(&spath)["status"]["state"],
        "Reserved",
        "not released before it is off"
    );
    let (code, _, _) = b.cli(&["power", "confirm", "m1", "Off"]);
    assert_eq!(code, 0);
    b.wait_for(20, "available", || {
        (b.get(&spath)["status"]["state"] == "Available").then_some(())
    });
}

#[test]
fn sigterm_ends_open_watches_and_exits_cleanly() {
    let mut b = Bootplane::start(&[]);
    let r = b
        .agent
        .get(&format!("{}{}?watch=true", b.api, SERVERS))
        .set("Authorization", &format!("Bearer {}", b.token))
        .call()
        .unwrap();
    let reader = std::thread::spawn(move || {
        use std::io::Read;
        let mut s = String::new();
        let _ = r.into_reader().read_to_string(&mut s);
    });
    let t = std::time::Instant::now();
    let st = b.stop();
    assert!(st.success(), "{st}");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "shutdown took {:?}",
        t.elapsed()
    );
    reader.join().unwrap();
    assert!(b.log().contains("bootplane stopped"));
}
