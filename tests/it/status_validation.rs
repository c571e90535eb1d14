//! Issue 20 item 4: status validation over HTTP against the real `bootplane` binary.
//! A typo in a Server's `status.state`, a malformed `spec.systemUUID` or MAC is
//! refused with 422 naming the field (`details.causes[].field`), through the
//! `/status` subresource (PUT and merge PATCH), the main resource and
//! `bootplane apply -f`, and nothing is written.

use crate::support;

use std::time::Duration;

use serde_json::{json, Value};
use support::api::*;
use support::bootplane::*;

fn path(name: &str) -> String {
    format!("{SERVERS}/{name}")
}

fn rv(v: &Value) -> String {
    v["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_else(|| panic!("no resourceVersion in {v}"))
        .to_string()
}

/// The Server `name` once no controller has changed it for half a second.
fn settled(b: &Bootplane, name: &str) -> Value {
    let mut last = b.get(&path(name));
    for _ in 0..40 {
        std::thread::sleep(Duration::from_millis(500));
        let now = b.get(&path(name));
        if rv(&now) == rv(&last) {
            return now;
        }
        last = now;
    }
    panic!("server {name} never settled: {last}");
}

/// `(status, body)` of a merge patch.
fn merge_patch(b: &Bootplane, path: &str, body: &Value) -> (u16, Value) {
    let res = b
        .req("PATCH", path)
        .set("Content-Type", "application/merge-patch+json")
        .send_string(&body.to_string());
    let (code, r) = match res {
        Ok(r) => (r.status(), r),
        Err(ureq::Error::Status(c, r)) => (c, r),
        Err(e) => panic!("PATCH {path}: {e}"),
    };
    (
        code,
        serde_json::from_str(&r.into_string().unwrap()).unwrap(),
    )
}

/// A 422 Status whose causes name exactly `fields`, with a message containing `says`.
fn assert_invalid(code: u16, v: &Value, fields: &[&str], says: &str) {
    assert_eq!(code, 422, "{v}");
    assert_eq!(
        (&v["kind"], &v["reason"]),
        (&json!("Status"), &json!("Invalid")),
        "{v}"
    );
    let got: Vec<&str> = v["details"]["causes"]
        .as_array()
        .unwrap_or_else(|| panic!("no causes in {v}"))
        .iter()
        .map(|c| c["field"].as_str().unwrap())
        .collect();
    assert_eq!(got, fields, "{v}");
    assert!(v["message"].as_str().unwrap().contains(says), "{v}");
}

#[test]
fn status_typos_get_422_naming_the_field_and_write_nothing() {
    let b = Bootplane::start(&[]);
    let (c, v) = b.call("POST", SERVERS, Some(&server("s1", json!({}), "Recycle")));
    assert_eq!(c, 201, "{v}");
    let before = settled(&b, "s1");
    let status_path = format!("{}/status", path("s1"));

    // PUT of the status subresource with a typo'd state.
    let mut typo = before.clone();
    typo["status"]["state"] = json!("Availble");
    let (c, v) = b.call("PUT", &status_path, Some(&typo));
    assert_invalid(
        c,
        &v,
        &["status.state"],
        "status.state: Unsupported value: \"Availble\": supported values: \"Initial\", \"Discovery\", \"Available\"",
    );
    assert_eq!(
        v["details"]["causes"][0]["reason"], "FieldValueNotSupported",
        "{v}"
    );
    // The same as a merge patch, and a powerState typo.
    let (c, v) = merge_patch(&b, &status_path, &json!({"status": {"state": "Availble"}}));
    assert_invalid(c, &v, &["status.state"], "\"Availble\"");
    let (c, v) = merge_patch(&b, &status_path, &json!({"status": {"powerState": "of"}}));
    assert_invalid(
        c,
        &v,
        &["status.powerState"],
        "supported values: \"On\", \"Off\", \"Paused\"",
    );
    // A malformed MAC in the second interface is named by its index.
    let nics = json!([{"name": "eth0", "macAddress": "52:54:00:00:20:01", "ips": ["10.0.0.1"]},
                      {"name": "eth1", "macAddress": "52:54:00:00:20", "ips": ["10.0.0.2", "10.0.0.256"]}]);
    let (c, v) = merge_patch(
        &b,
        &status_path,
        &json!({"status": {"networkInterfaces": nics}}),
    );
    assert_invalid(
        c,
        &v,
        &[
            "status.networkInterfaces[1].macAddress",
            "status.networkInterfaces[1].ips[1]",
        ],
        "must be a MAC address",
    );
    // A malformed systemUUID, through PUT and PATCH of the main resource.
    let mut bad = before.clone();
    bad["spec"]["systemUUID"] = json!("not-a-uuid");
    let (c, v) = b.call("PUT", &path("s1"), Some(&bad));
    assert_invalid(
        c,
        &v,
        &["spec.systemUUID"],
        "Invalid value: \"not-a-uuid\": must be a UUID",
    );
    let (c, v) = merge_patch(
        &b,
        &path("s1"),
        &json!({"spec": {"systemUUID": "4c4c4544-0000"}}),
    );
    assert_invalid(c, &v, &["spec.systemUUID"], "must be a UUID");

    let after = b.get(&path("s1"));
    assert_eq!(rv(&after), rv(&before), "nothing was written: {after}");
    assert_eq!(after["status"], before["status"]);
    assert_eq!(after["spec"], before["spec"]);

    // Known values go through: the rule is not in the way of real writes.
    let (c, v) = merge_patch(
        &b,
        &status_path,
        &json!({"status": {"state": "Maintenance", "powerState": "PoweringOn"}}),
    );
    assert_eq!(c, 200, "{v}");
    assert_eq!(v["status"]["state"], "Maintenance");

    // A new Server with a typo'd status, created by `bootplane apply -f`.
    let doc = "apiVersion: metal.ironcore.dev/v1alpha1\nkind: Server\nmetadata: {name: s2}\n\
               spec: {systemUUID: 4c4c4544-0000-0000-0000-000000002002}\n\
               status: {state: Availble, powerState: \"Off\"}\n";
    let (code, out, err) = b.cli_stdin(&["apply", "-f", "-"], Some(doc));
    assert_eq!(code, 1, "{out} {err}");
    assert!(
        err.contains("Error from server (Invalid)")
            && err.contains(
                "Server \"s2\" is invalid: status.state: Unsupported value: \"Availble\""
            ),
        "{err}"
    );
    let (c, v) = b.call("GET", &path("s2"), None);
    assert_eq!(c, 404, "nothing was created: {v}");
    // The same document, corrected, applies.
    let (code, out, err) = b.cli_stdin(
        &["apply", "-f", "-"],
        Some(&doc.replace("Availble", "Available")),
    );
    assert_eq!(code, 0, "{out} {err}");
    assert!(
        out.contains("server.metal.ironcore.dev/s2 created"),
        "{out}"
    );
}
