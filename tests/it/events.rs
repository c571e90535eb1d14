//! Events and reasons (issue 23, item 1), through the real binary and its CLI: a claim
//! that cannot bind says why (condition + `describe`), and says it again when the reason
//! changes; once a server fits, `get events --for serverclaim/NAME` lists the binding;
//! the API's `fieldSelector` filters lists; a bad selector or `--for` is a clear error.
//! (Aggregation and the store's bounds: `store::events` unit tests.)

use crate::support;

use serde_json::{json, Value};
use support::bootplane::Bootplane;

fn apply(b: &Bootplane, yaml: &str) {
    let (code, out, err) = b.cli_stdin(&["apply", "-f", "-"], Some(yaml));
    assert_eq!(code, 0, "apply failed: {out}{err}");
}

fn server(name: &str, uuid_tail: u32, rack: &str) -> String {
    format!(
        "apiVersion: metal.ironcore.dev/v1alpha1\nkind: Server\nmetadata: {{name: {name}, labels: {{rack: {rack}}}}}\n\
         spec: {{systemUUID: 8a3c1d2e-0000-4000-8000-{uuid_tail:012}, power: Off}}\n"
    )
}

fn set_state(b: &Bootplane, name: &str, state: &str) {
    let (code, body) = b.call(
        "PATCH",
        &format!("/apis/metal.ironcore.dev/v1alpha1/servers/{name}/status"),
        Some(&json!({"status": {"state": state, "powerState": "Off"}})),
    );
    assert_eq!(code, 200, "{body}");
}

fn claim_condition(b: &Bootplane, name: &str) -> Option<(String, String, String)> {
    let c = b.get(&format!(
        "/apis/metal.ironcore.dev/v1alpha1/namespaces/default/serverclaims/{name}"
    ));
    let cond = c
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Bound")?
        .clone();
    Some((
        cond["status"].as_str()?.to_string(),
        cond["reason"].as_str()?.to_string(),
        cond["message"].as_str()?.to_string(),
    ))
}

#[test]
fn a_waiting_claim_says_why_and_its_binding_is_an_event() {
    let b = Bootplane::start(&[]);
    // One server in rack r1, taken by nothing but still Initial; none in rack r9.
    apply(&b, &server("ev-s1", 1, "r1"));
    apply(
        &b,
        "apiVersion: metal.ironcore.dev/v1alpha1\nkind: ServerClaim\nmetadata: {name: web-1}\n\
         spec: {power: Off, image: demo, serverSelector: {matchLabels: {rack: r9}}}\n",
    );
    let (_, reason, message) = b.wait_for(30, "claim web-1 to say why it waits", || {
        claim_condition(&b, "web-1").filter(|(s, r, _)| s == "False" && r == "NoMatchingServer")
    });
    assert_eq!(reason, "NoMatchingServer");
    assert!(
        message.contains("rack") && message.contains("r9"),
        "{message}"
    );

    // describe names the reason and shows the events so far.
    let (code, out, err) = b.cli(&["describe", "serverclaim", "web-1"]);
    assert_eq!(code, 0, "{err}");
    for want in [
        "Name:         web-1",
        "Unbound",
        "NoMatchingServer",
        "Events:",
    ] {
        assert!(out.contains(want), "describe lacks {want:?}:\n{out}");
    }

    // A claim for rack r1: the server matches but is not Available yet.
    apply(
        &b,
        "apiVersion: metal.ironcore.dev/v1alpha1\nkind: ServerClaim\nmetadata: {name: web-2}\n\
         spec: {power: Off, image: demo, serverSelector: {matchLabels: {rack: r1}}}\n",
    );
    let (_, _, message) = b.wait_for(30, "claim web-2 to say the match is taken", || {
        claim_condition(&b, "web-2").filter(|(_, r, _)| r == "AllMatchingServersTaken")
    });
    assert!(message.contains("ev-s1 (state Initial)"), "{message}");
    let (_, out, _) = b.cli(&["describe", "scl", "web-2"]);
    assert!(out.contains("ev-s1 (state Initial)"), "{out}");

    // The server becomes Available: web-2 binds, and the binding is an event.
    set_state(&b, "ev-s1", "Available");
    let (st, reason, message) = b.wait_for(30, "claim web-2 to bind", || {
        claim_condition(&b, "web-2").filter(|(s, _, _)| s == "True")
    });
    assert_eq!((st.as_str(), reason.as_str()), ("True", "Bound"));
    assert!(message.contains("ev-s1"), "{message}");
    let out = b.wait_for(30, "the Bound event of web-2", || {
        let (code, out, _) = b.cli(&["get", "events", "--for", "serverclaim/web-2"]);
        (code == 0 && out.contains("Bound") && out.contains("bound to server ev-s1")).then_some(out)
    });
    assert!(
        !out.contains("web-1"),
        "--for lists only web-2's events:\n{out}"
    );
    // The server's own events: its state moving to Reserved.
    let out = b.wait_for(30, "the Server's state event", || {
        let (_, out, _) = b.cli(&["get", "events", "--for", "server/ev-s1", "-o", "json"]);
        out.contains("Available -> Reserved").then_some(out)
    });
    let list: Value = serde_json::from_str(&out).unwrap();
    for e in list["items"].as_array().unwrap() {
        assert_eq!(e["involvedObject"]["name"], "ev-s1", "{e}");
        assert_eq!(e["source"]["component"], "bootplane-controller");
    }

    // fieldSelector on the API: equality and inequality; a bad one is a 400 naming it.
    let all = b.get("/api/v1/namespaces/default/events");
    let n_all = all["items"].as_array().unwrap().len();
    let not_claims = b.get(
        "/api/v1/namespaces/default/events?fieldSelector=involvedObject.kind%21%3DServerClaim",
    );
    let n_not = not_claims["items"].as_array().unwrap().len();
    assert!(n_not > 0 && n_not < n_all, "{n_not} of {n_all}");
    let (code, body) = b.call(
        "GET",
        "/api/v1/namespaces/default/events?fieldSelector=involvedObject..kind%3Dx",
        None,
    );
    assert_eq!(code, 400, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("field"),
        "{body}"
    );

    // --for is checked before anything is sent.
    let (code, _, err) = b.cli(&["get", "servers", "--for", "serverclaim/web-2"]);
    assert_ne!(code, 0);
    assert!(err.contains("--for works with `get events` only"), "{err}");
    let (code, _, err) = b.cli(&["get", "events", "--for", "web-2"]);
    assert_ne!(code, 0);
    assert!(err.contains("KIND/NAME"), "{err}");

    // An Event written by hand is validated like any object.
    let (code, body) = b.call(
        "POST",
        "/api/v1/namespaces/default/events",
        Some(
            &json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "bad"},
            "involvedObject": {"kind": "Server"}, "type": "Fatal", "count": 0}),
        ),
    );
    assert_eq!(code, 422, "{body}");
    let msg = body["message"].as_str().unwrap();
    for f in ["involvedObject.name", "type", "count"] {
        assert!(msg.contains(f), "{f} not named: {msg}");
    }
}
