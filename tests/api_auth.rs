//! Issue 22 (items 2, 3, 6, 7): who may do what on the API of the real `bootplane
//! serve`. Named tokens made, listed and revoked with the `bootplane token` CLI, the
//! built-in roles and a custom role from the config checked on REST calls and watches
//! (403 naming the verb and resource), revoked and expired tokens refused (401), the
//! audit log holding one line per write and per denial of a scripted session (no token
//! in it) and rotated by size, `/metrics` behind the `metrics` role or on its own
//! plain listener.

mod support;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::api::*;
use support::bootplane::*;

/// `(status, body)` of a request made with `token`.
fn call_as(
    b: &Bootplane,
    token: &str,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> (u16, Value) {
    // A connection of its own: the API may close a keep-alive connection after refusing
    // a request whose body it did not read, and ureq does not retry a POST on a pooled
    // connection that was closed meanwhile (what is tested here is the answer).
    let r = b
        .req(method, path)
        .set("Authorization", &format!("Bearer {token}"))
        .set("Connection", "close");
    let res = match body {
        Some(v) => r
            .set("Content-Type", "application/json")
            .send_string(&v.to_string()),
        None => r.call(),
    };
    match res {
        Ok(r) => {
            let code = r.status();
            // A watch streams on: read nothing more of it.
            if path.contains("watch=true") {
                return (code, Value::Null);
            }
            (
                code,
                serde_json::from_str(&r.into_string().unwrap()).unwrap_or(Value::Null),
            )
        }
        Err(ureq::Error::Status(c, r)) => (
            c,
            serde_json::from_str(&r.into_string().unwrap()).unwrap_or(Value::Null),
        ),
        Err(e) => panic!("{method} {path}: {e}"),
    }
}

/// `bootplane token create NAME --role ROLE [...]` through the CLI: the token printed.
fn create_token(b: &Bootplane, name: &str, role: &str, extra: &[&str]) -> String {
    let mut args = vec!["token", "create", name, "--role", role];
    args.extend_from_slice(extra);
    let (code, out, err) = b.cli(&args);
    assert_eq!(code, 0, "token create {name}: {err}");
    let t = out.trim().to_string();
    assert!(
        t.starts_with(&format!("bp1.{name}.")) && t.len() > 60,
        "{t:?}"
    );
    t
}

/// The audit log's lines (all rotated files, oldest first), parsed.
fn audit_lines(b: &Bootplane) -> Vec<Value> {
    let mut out = Vec::new();
    for n in (1..10).rev() {
        if let Ok(t) = std::fs::read_to_string(b.dir.join(format!("audit.log.{n}"))) {
            out.extend(t.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()));
        }
    }
    if let Ok(t) = std::fs::read_to_string(b.dir.join("audit.log")) {
        out.extend(t.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()));
    }
    out
}

/// What one audit line should say.
#[derive(Debug, PartialEq)]
struct Want {
    user: String,
    verb: String,
    resource: String,
    name: Option<String>,
    code: u16,
}

fn want(user: &str, verb: &str, resource: &str, name: Option<&str>, code: u16) -> Want {
    Want {
        user: user.into(),
        verb: verb.into(),
        resource: resource.into(),
        name: name.map(String::from),
        code,
    }
}

fn config(dir: &std::path::Path, body: &str) -> String {
    let p = dir.join("bootplane.toml");
    std::fs::write(&p, body).unwrap();
    p.display().to_string()
}

#[test]
fn roles_tokens_and_the_audit_log_of_a_session() {
    let cfg_dir = tempfile::tempdir().unwrap();
    let cfg = config(
        cfg_dir.path(),
        r#"
[api]
[[api.roles]]
name = "claimer"
rules = [
  { verbs = ["get", "list", "create", "delete"], resources = ["serverclaims"] },
  { verbs = ["get"], resources = ["servers"] },
]
"#,
    );
    let b = Bootplane::start(&["--config", &cfg]);
    let admin = b.token.clone();
    let mut expect: Vec<Want> = Vec::new();
    let mut secrets: Vec<String> = vec![admin.clone()];

    // Tokens are made through the CLI (POSTs through the API, audited).
    let viewer = create_token(&b, "ci-viewer", "viewer", &[]);
    let agent = create_token(&b, "job-agent", "agent", &["--ttl", "24h"]);
    let claimer = create_token(&b, "claims-bot", "claimer", &[]);
    let short = create_token(&b, "short", "viewer", &["--ttl", "1s"]);
    for _ in 0..4 {
        expect.push(want("admin", "create", "apitokens", None, 201));
    }
    secrets.extend([
        viewer.clone(),
        agent.clone(),
        claimer.clone(),
        short.clone(),
    ]);
    // An unknown role is refused (400, still a write attempt in the log).
    let (code, _, err) = b.cli(&["token", "create", "x", "--role", "superuser"]);
    assert_ne!(code, 0);
    assert!(err.contains("unknown role"), "{err}");
    expect.push(want("admin", "create", "apitokens", None, 400));

    let (code, out, err) = b.cli(&["token", "list"]);
    assert_eq!(code, 0, "{err}");
    for n in ["ci-viewer", "job-agent", "claims-bot", "short"] {
        assert!(out.contains(n), "{out}");
    }
    assert!(
        out.contains("viewer") && out.contains("claimer") && out.contains("never"),
        "{out}"
    );
    for s in &secrets[1..] {
        let secret = s.rsplit('.').next().unwrap();
        assert!(!out.contains(secret), "token list shows a token: {out}");
    }

    let s1 = server("s1", json!({}), "Recycle");
    let (c, v) = call_as(&b, &admin, "POST", SERVERS, Some(&s1));
    assert_eq!(c, 201, "{v}");
    expect.push(want("admin", "create", "servers", None, 201));

    // A viewer reads, lists and watches servers, and writes nothing.
    let (c, v) = call_as(&b, &viewer, "GET", SERVERS, None);
    assert_eq!(c, 200, "{v}");
    assert_eq!(v["items"].as_array().unwrap().len(), 1);
    assert_eq!(
        call_as(&b, &viewer, "GET", &format!("{SERVERS}/s1"), None).0,
        200
    );
    assert_eq!(
        call_as(&b, &viewer, "GET", &format!("{SERVERS}?watch=true"), None).0,
        200
    );
    let (c, v) = call_as(
        &b,
        &viewer,
        "POST",
        SERVERS,
        Some(&server("s2", json!({}), "Recycle")),
    );
    assert_eq!(c, 403, "{v}");
    assert_eq!(v["kind"], "Status");
    assert_eq!(v["reason"], "Forbidden");
    assert_eq!(
        v["message"],
        "servers.metal.ironcore.dev is forbidden: User \"ci-viewer\" cannot create resource \"servers\" in API group \"metal.ironcore.dev\" at the cluster scope"
    );
    expect.push(want("ci-viewer", "create", "servers", None, 403));
    let (c, v) = call_as(
        &b,
        &viewer,
        "PATCH",
        &format!("{SERVERS}/s1"),
        Some(&json!({"metadata": {"labels": {"a": "b"}}})),
    );
    assert_eq!(c, 403, "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("cannot patch resource \"servers\""),
        "{v}"
    );
    expect.push(want("ci-viewer", "patch", "servers", Some("s1"), 403));
    let (c, v) = call_as(&b, &viewer, "DELETE", &format!("{SERVERS}/s1"), None);
    assert_eq!(c, 403, "{v}");
    expect.push(want("ci-viewer", "delete", "servers", Some("s1"), 403));
    assert_eq!(b.get(&format!("{SERVERS}/s1"))["metadata"]["name"], "s1");

    // Secrets: only roles that may read them see them (data included).
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "ign", "namespace": "default"},
                        "stringData": {"token": "marker-4711"}});
    let sp = "/api/v1/namespaces/default/secrets";
    let (c, v) = call_as(&b, &admin, "POST", sp, Some(&secret));
    assert_eq!(c, 201, "{v}");
    expect.push(want("admin", "create", "secrets", None, 201));
    let (c, v) = call_as(&b, &agent, "GET", &format!("{sp}/ign"), None);
    assert_eq!(c, 403, "{v}");
    assert_eq!(
        v["message"],
        "secrets \"ign\" is forbidden: User \"job-agent\" cannot get resource \"secrets\" in API group \"\" in the namespace \"default\""
    );
    expect.push(want("job-agent", "get", "secrets", Some("ign"), 403));
    let (c, _) = call_as(&b, &viewer, "GET", &format!("{sp}?watch=true"), None);
    assert_eq!(c, 403);
    expect.push(want("ci-viewer", "watch", "secrets", None, 403));
    let (c, _) = call_as(&b, &agent, "GET", &format!("{BMCSECRETS}/x"), None);
    assert_eq!(c, 403);
    expect.push(want("job-agent", "get", "bmcsecrets", Some("x"), 403));
    // `get secret -o yaml` through the CLI: the viewer is refused, the admin sees data.
    let (code, out, err) = b.cli(&["get", "secret", "ign", "-o", "yaml", "--token", &viewer]);
    assert_ne!(code, 0, "{out}");
    assert!(err.contains("Forbidden") && !out.contains("data"), "{err}");
    expect.push(want("ci-viewer", "get", "secrets", Some("ign"), 403));
    let (code, out, err) = b.cli(&["get", "secret", "ign", "-o", "yaml"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("token:"), "{out}");
    // The agent reads servers, and writes neither their spec nor their status (the
    // status' NICs are the identity the boot listener trusts).
    assert_eq!(call_as(&b, &agent, "GET", SERVERS, None).0, 200);
    let (c, v) = call_as(
        &b,
        &agent,
        "PATCH",
        &format!("{SERVERS}/s1/status"),
        Some(&json!({"status": {"powerState": "Off"}})),
    );
    assert_eq!(c, 403, "{v}");
    expect.push(want(
        "job-agent",
        "patch",
        "servers/status",
        Some("s1"),
        403,
    ));
    let (c, _) = call_as(
        &b,
        &agent,
        "PATCH",
        &format!("{SERVERS}/s1"),
        Some(&json!({"metadata": {"labels": {"a": "b"}}})),
    );
    assert_eq!(c, 403);
    expect.push(want("job-agent", "patch", "servers", Some("s1"), 403));
    // Tokens are admin's: the agent may not list them.
    let (c, _) = call_as(
        &b,
        &agent,
        "GET",
        "/apis/auth.bootplane.dev/v1alpha1/apitokens",
        None,
    );
    assert_eq!(c, 403);
    expect.push(want("job-agent", "list", "apitokens", None, 403));

    // The custom role works as declared: claims yes (not patch), servers get only.
    let c1 = claim("c1", None, Some("s1"));
    let (c, v) = call_as(&b, &claimer, "POST", &claims("default"), Some(&c1));
    assert_eq!(c, 201, "{v}");
    expect.push(want("claims-bot", "create", "serverclaims", None, 201));
    assert_eq!(
        call_as(
            &b,
            &claimer,
            "GET",
            &format!("{}/c1", claims("default")),
            None
        )
        .0,
        200
    );
    assert_eq!(
        call_as(&b, &claimer, "GET", &format!("{SERVERS}/s1"), None).0,
        200
    );
    let (c, v) = call_as(&b, &claimer, "GET", SERVERS, None);
    assert_eq!(c, 403, "{v}");
    expect.push(want("claims-bot", "list", "servers", None, 403));
    let (c, _) = call_as(
        &b,
        &claimer,
        "GET",
        &format!("{}?watch=true", claims("default")),
        None,
    );
    assert_eq!(c, 403);
    expect.push(want("claims-bot", "watch", "serverclaims", None, 403));
    let (c, _) = call_as(
        &b,
        &claimer,
        "PATCH",
        &format!("{}/c1", claims("default")),
        Some(&json!({"metadata": {"labels": {"x": "y"}}})),
    );
    assert_eq!(c, 403);
    expect.push(want("claims-bot", "patch", "serverclaims", Some("c1"), 403));
    let (c, v) = call_as(
        &b,
        &claimer,
        "DELETE",
        &format!("{}/c1", claims("default")),
        None,
    );
    assert_eq!(c, 200, "{v}");
    expect.push(want(
        "claims-bot",
        "delete",
        "serverclaims",
        Some("c1"),
        200,
    ));

    // Revoked and expired tokens: 401.
    let (code, out, err) = b.cli(&["token", "revoke", "ci-viewer"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("revoked"));
    expect.push(want("admin", "delete", "apitokens", Some("ci-viewer"), 200));
    let (c, v) = call_as(&b, &viewer, "GET", SERVERS, None);
    assert_eq!(c, 401, "{v}");
    assert_eq!(v["reason"], "Unauthorized");
    expect.push(want("system:anonymous", "list", "servers", None, 401));
    std::thread::sleep(Duration::from_millis(2100));
    let (c, v) = call_as(&b, &short, "GET", SERVERS, None);
    assert_eq!(c, 401, "{v}");
    assert!(v["message"].as_str().unwrap().contains("expired"), "{v}");
    expect.push(want("system:anonymous", "list", "servers", None, 401));
    // A token for a name that exists, with another secret: 401.
    let forged = format!("bp1.job-agent.{}", "0".repeat(64));
    assert_eq!(call_as(&b, &forged, "GET", SERVERS, None).0, 401);
    expect.push(want("system:anonymous", "list", "servers", None, 401));

    let (c, v) = call_as(&b, &admin, "DELETE", &format!("{SERVERS}/s1"), None);
    assert_eq!(c, 200, "{v}");
    expect.push(want("admin", "delete", "servers", Some("s1"), 200));

    // The audit log: exactly one line per write and per denial above, in order.
    let deadline = Instant::now() + Duration::from_secs(10);
    while audit_lines(&b).len() < expect.len() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    let lines = audit_lines(&b);
    let got: Vec<Want> = lines
        .iter()
        .map(|l| Want {
            user: l["user"].as_str().unwrap().into(),
            verb: l["verb"].as_str().unwrap().into(),
            resource: l["resource"].as_str().unwrap().into(),
            name: l["name"].as_str().map(String::from),
            code: l["code"].as_u64().unwrap() as u16,
        })
        .collect();
    assert_eq!(got, expect, "audit log:\n{lines:#?}");
    for l in &lines {
        let code = l["code"].as_u64().unwrap();
        let result = match code {
            401 | 403 => "denied",
            c if c < 400 => "allowed",
            _ => "error",
        };
        assert_eq!(l["result"], result, "{l}");
        assert!(
            chrono::DateTime::parse_from_rfc3339(l["time"].as_str().unwrap()).is_ok(),
            "{l}"
        );
        assert!(
            l["source"].as_str().unwrap().starts_with("127.0.0.1:"),
            "{l}"
        );
        if l["user"] == "admin" {
            assert_eq!(l["groups"], json!(["admin"]));
        }
    }
    let text = std::fs::read_to_string(b.dir.join("audit.log")).unwrap();
    for s in &secrets {
        let secret = s.rsplit('.').next().unwrap();
        assert!(!text.contains(secret), "a token is in the audit log");
    }
    assert!(!text.contains("marker-4711"), "a body is in the audit log");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(b.dir.join("audit.log"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn metrics_role_listener_rotation_and_every_route_authenticated() {
    let (mport, _) = two_free_ports();
    let cfg_dir = tempfile::tempdir().unwrap();
    let cfg = config(
        cfg_dir.path(),
        &format!(
            "[api]\naudit_max_bytes = 4096\naudit_keep = 2\nmetrics_listen = \"127.0.0.1:{mport}\"\n"
        ),
    );
    let b = Bootplane::start(&["--config", &cfg]);
    let viewer = create_token(&b, "dash", "viewer", &[]);
    let prom = create_token(&b, "prom", "metrics", &[]);

    // /metrics on the API listener: the metrics role (and admin), not a viewer.
    let (c, v) = call_as(&b, &viewer, "GET", "/metrics", None);
    assert_eq!(c, 403, "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("cannot get resource \"metrics\""),
        "{v}"
    );
    let r = b
        .req("GET", "/metrics")
        .set("Authorization", &format!("Bearer {prom}"))
        .call()
        .unwrap();
    assert_eq!(r.status(), 200);
    let text = r.into_string().unwrap();
    assert!(text.contains("bootplane_store_revision"), "{text}");
    assert!(
        text.contains("bootplane_api_audit_dropped_lines_total 0"),
        "{text}"
    );
    assert_eq!(call_as(&b, &prom, "GET", SERVERS, None).0, 403);
    assert_eq!(b.req("GET", "/metrics").call().unwrap().status(), 200);
    // ... and on the plain metrics listener without any token; nothing else there.
    let r = ureq::get(&format!("http://127.0.0.1:{mport}/metrics"))
        .call()
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r
        .into_string()
        .unwrap()
        .contains("bootplane_store_revision"));
    match ureq::get(&format!("http://127.0.0.1:{mport}{SERVERS}")).call() {
        Err(ureq::Error::Status(404, _)) => {}
        other => panic!("servers on the metrics listener: {other:?}"),
    }

    // Every route of the API listener needs authentication; only health checks do not.
    let routes = [
        ("GET", "/apis".to_string()),
        ("GET", "/api/v1/namespaces/default/secrets".into()),
        ("GET", SERVERS.into()),
        ("GET", format!("{SERVERS}?watch=true")),
        ("POST", SERVERS.into()),
        ("GET", "/apis/dhcp.bootplane.dev/v1alpha1/leases".into()),
        ("POST", "/apis/bootplane.dev/v1alpha1/jobs".into()),
        ("GET", "/apis/bootplane.dev/v1alpha1/jobs/x".into()),
        (
            "GET",
            "/apis/boot.bootplane.dev/v1alpha1/render/ignition/x".into(),
        ),
        ("GET", "/apis/auth.bootplane.dev/v1alpha1/apitokens".into()),
        ("GET", "/metrics".into()),
        ("GET", "/nonexistent".into()),
    ];
    for (m, p) in &routes {
        let (c, v) = call_as(
            &b,
            "not-a-token",
            m,
            p,
            Some(&json!({})).filter(|_| *m == "POST"),
        );
        assert_eq!(c, 401, "{m} {p}: {v}");
        let (c, _) = call_as(&b, &prom, m, p, Some(&json!({})).filter(|_| *m == "POST"));
        assert_eq!(
            c == 403,
            *p != "/metrics",
            "{m} {p} with the metrics role: {c}"
        );
    }
    // Health checks answer whatever the credential (an invalid one here).
    for p in ["/healthz", "/readyz"] {
        let r = b.req("GET", p).set("Authorization", "Bearer nope").call();
        assert_eq!(r.map(|r| r.status()).ok(), Some(200), "{p}");
    }

    // Rotation by size: audit.log, .1 and .2, none past 4096 bytes, every line JSON.
    for i in 0..60 {
        let (c, _) = call_as(&b, &viewer, "DELETE", &format!("{SERVERS}/s{i}"), None);
        assert_eq!(c, 403);
    }
    let log = |n: &str| b.dir.join(format!("audit.log{n}"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !log(".2").exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(!log(".3").exists());
    let mut last = Value::Null;
    for n in [".2", ".1", ""] {
        let meta = std::fs::metadata(log(n)).unwrap_or_else(|e| panic!("audit.log{n}: {e}"));
        assert!(
            meta.len() <= 4096 && meta.len() > 0,
            "audit.log{n}: {} bytes",
            meta.len()
        );
        for l in std::fs::read_to_string(log(n)).unwrap().lines() {
            last = serde_json::from_str(l).unwrap();
        }
    }
    assert_eq!(last["name"], "s59");
    assert_eq!(last["user"], "dash");
}
