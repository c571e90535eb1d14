//! Issue 22 (items 2, 3, 6, 7): who may do what on the API of the real `bootplane
//! serve`. Named tokens made, listed and revoked with the `bootplane token` CLI, the
//! built-in roles and a custom role from the config checked on REST calls and watches
//! (403 naming the verb and resource), revoked and expired tokens refused (401), the
//! audit log holding one line per write and per denial of a scripted session (no token
//! in it) and rotated by size, `/metrics` behind the `metrics` role or on its own
//! plain listener.

use crate::support;

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
audit_unauthenticated_interval_ms = 100
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

    // The audit log: exactly one line per write and per authenticated denial above, in
    // order; the unauthenticated ones (401) summed per source and interval (`count`).
    let anonymous = expect.iter().filter(|w| w.code == 401).count() as u64;
    expect.retain(|w| w.code != 401);
    let summed = |lines: &[Value]| -> u64 {
        lines
            .iter()
            .filter(|l| l["code"] == 401)
            .map(|l| l["count"].as_u64().unwrap())
            .sum()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while (audit_lines(&b).len() < expect.len() || summed(&audit_lines(&b)) < anonymous)
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    let lines = audit_lines(&b);
    assert_eq!(summed(&lines), anonymous, "{lines:#?}");
    for l in lines.iter().filter(|l| l["code"] == 401) {
        assert_eq!(
            (&l["user"], &l["verb"], &l["resource"]),
            (
                &json!("system:anonymous"),
                &json!("list"),
                &json!("servers")
            ),
            "{l}"
        );
    }
    let got: Vec<Want> = lines
        .iter()
        .filter(|l| l["code"] != 401)
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

/// A watch of SERVERS as `token`, kept open: the response (its head read) or the code.
fn open_watch(b: &Bootplane, token: &str) -> Result<ureq::Response, (u16, String)> {
    let r = b
        .agent
        .get(&format!("{}{SERVERS}?watch=true", b.api))
        .set("Authorization", &format!("Bearer {token}"))
        .set("Connection", "close")
        .call();
    match r {
        Ok(r) => Ok(r),
        Err(ureq::Error::Status(c, r)) => Err((c, r.into_string().unwrap_or_default())),
        Err(e) => panic!("watch: {e}"),
    }
}

/// Issue 32 item 5 (review M7): a viewer cannot open unbounded watches. Past
/// `api.max_watches_per_user` its next watch is 429 (other users unaffected) until one
/// of its watches closes. On the old code: every watch 200.
#[test]
fn watches_are_capped_per_identity() {
    let b = Bootplane::start(&["--set", "api.max_watches_per_user=3"]);
    let viewer = create_token(&b, "dash", "viewer", &[]);
    let mut open: Vec<ureq::Response> = (0..3)
        .map(|i| open_watch(&b, &viewer).unwrap_or_else(|e| panic!("watch {i}: {e:?}")))
        .collect();
    let (code, text) = open_watch(&b, &viewer).map(|_| ()).unwrap_err();
    assert_eq!(code, 429, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["reason"], "TooManyRequests");
    assert!(v["message"].as_str().unwrap().contains("\"dash\""), "{v}");
    // Another identity has its own count.
    let admin = open_watch(&b, &b.token).expect("the admin's watch");
    // One of the viewer's watches closes: the server notices and counts it out.
    drop(open.pop());
    let deadline = Instant::now() + Duration::from_secs(10);
    let again = loop {
        match open_watch(&b, &viewer) {
            Ok(r) => break r,
            Err((429, _)) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => panic!("after a watch closed: {e:?}"),
        }
    };
    // The open watches still stream.
    let (c, v) = b.call("POST", SERVERS, Some(&server("w1", json!({}), "Recycle")));
    assert_eq!(c, 201, "{v}");
    use std::io::BufRead;
    for (i, r) in open.into_iter().chain([again, admin]).enumerate() {
        let mut line = String::new();
        std::io::BufReader::new(r.into_reader())
            .read_line(&mut line)
            .unwrap();
        assert!(line.contains("\"w1\""), "watch {i}: {line}");
    }
}

/// Issue 32 item 7 (review L11): a rule with `namespaces` allows requests in those
/// namespaces only (not in another, not across all of them). On the old code the config
/// key was refused.
#[test]
fn a_namespaced_rule_allows_its_namespace_only() {
    let cfg_dir = tempfile::tempdir().unwrap();
    let cfg = config(
        cfg_dir.path(),
        r#"
[[api.roles]]
name = "team-a"
rules = [
  { verbs = ["*"], resources = ["serverclaims", "secrets"], namespaces = ["a"] },
  { verbs = ["get"], resources = ["servers"] },
]
"#,
    );
    let b = Bootplane::start(&["--config", &cfg]);
    let t = create_token(&b, "tenant-a", "team-a", &[]);
    let claim_in = |ns: &str| {
        let mut c = claim("c1", None, None);
        c["metadata"]["namespace"] = json!(ns);
        c
    };
    let (c, v) = call_as(&b, &t, "POST", &claims("a"), Some(&claim_in("a")));
    assert_eq!(c, 201, "{v}");
    assert_eq!(
        call_as(&b, &t, "GET", &format!("{}/c1", claims("a")), None).0,
        200
    );
    let (c, v) = call_as(&b, &t, "POST", &claims("b"), Some(&claim_in("b")));
    assert_eq!(c, 403, "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .ends_with("in the namespace \"b\""),
        "{v}"
    );
    // Namespace b's Secret: neither read nor referenced by a claim made there.
    let secret = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "ign", "namespace": "b"}, "stringData": {"k": "v"}});
    let (c, _) = call_as(
        &b,
        &b.token,
        "POST",
        "/api/v1/namespaces/b/secrets",
        Some(&secret),
    );
    assert_eq!(c, 201);
    assert_eq!(
        call_as(&b, &t, "GET", "/api/v1/namespaces/b/secrets/ign", None).0,
        403
    );
    assert_eq!(
        call_as(&b, &t, "GET", "/api/v1/namespaces/a/secrets", None).0,
        200
    );
    // Across namespaces: no namespace in the path, not allowed by the rule.
    let all = "/apis/metal.ironcore.dev/v1alpha1/serverclaims";
    assert_eq!(call_as(&b, &t, "GET", all, None).0, 403);
    assert_eq!(
        call_as(&b, &t, "GET", &format!("{all}?watch=true"), None).0,
        403
    );
    // The un-namespaced rule still covers the cluster scope.
    assert_eq!(call_as(&b, &t, "GET", &format!("{SERVERS}/x"), None).0, 404);
}

/// Issue 32 item 7 (review L15): a token made without `--ttl` expires (90 days), `--ttl
/// never` makes one that does not, and a token's use is recorded (`token list`'s LAST
/// USED) with at most one store write per minute, not one per request. On the old
/// code: no expiry by default, no last use.
#[test]
fn tokens_expire_by_default_and_record_their_last_use() {
    let b = Bootplane::start(&[]);
    let t = create_token(&b, "ci", "viewer", &[]);
    create_token(&b, "forever", "viewer", &["--ttl", "never"]);
    let tok = |n: &str| b.get(&format!("/apis/auth.bootplane.dev/v1alpha1/apitokens/{n}"));
    let exp = tok("ci")["spec"]["expiresAt"]
        .as_str()
        .map(|e| chrono::DateTime::parse_from_rfc3339(e).unwrap())
        .expect("a default expiry");
    let days = (exp.with_timezone(&chrono::Utc) - chrono::Utc::now()).num_hours() as f64 / 24.0;
    assert!((89.9..=90.1).contains(&days), "expires in {days} days");
    assert!(tok("forever")["spec"].get("expiresAt").is_none());
    let (code, out, err) = b.cli(&[
        "token", "create", "bad", "--role", "viewer", "--ttl", "soon",
    ]);
    assert_ne!(code, 0, "{out}");
    assert!(err.contains("invalid ttl"), "{err}");

    // Not used yet.
    let (_, out, _) = b.cli(&["token", "list"]);
    assert!(out.contains("LAST USED"), "{out}");
    let row = |out: &str, n: &str| {
        out.lines()
            .find(|l| l.starts_with(&format!("{n} ")))
            .unwrap_or_else(|| panic!("{out}"))
            .to_string()
    };
    assert!(row(&out, "ci").ends_with("never"), "{out}");
    let rv0 = tok("ci")["metadata"]["resourceVersion"].clone();
    // 50 requests: one write of the last use.
    for _ in 0..50 {
        assert_eq!(call_as(&b, &t, "GET", SERVERS, None).0, 200);
    }
    let used = b.wait_for(10, "the token's last use", || {
        tok("ci")["metadata"]["annotations"]["auth.bootplane.dev/last-used"]
            .as_str()
            .map(String::from)
    });
    let at = chrono::DateTime::parse_from_rfc3339(&used).unwrap();
    assert!(
        (chrono::Utc::now() - at.with_timezone(&chrono::Utc))
            .num_seconds()
            .abs()
            < 60
    );
    let rv1 = tok("ci")["metadata"]["resourceVersion"].clone();
    assert_ne!(rv0, rv1);
    for _ in 0..50 {
        assert_eq!(call_as(&b, &t, "GET", SERVERS, None).0, 200);
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        tok("ci")["metadata"]["resourceVersion"],
        rv1,
        "a second write within the minute"
    );
    let (_, out, _) = b.cli(&["token", "list"]);
    assert!(row(&out, "ci").ends_with(&used), "{out}");
    assert!(row(&out, "forever").contains("never"), "{out}");
}

/// Issue 32 item 5 (review M7): 200,000 unauthenticated requests (4 keep-alive
/// connections, pipelined) neither drop nor rotate away the audit lines of writes made
/// before, during and after them: the 401s become a few summary lines whose counts add
/// up to 200,000, and nothing is dropped. On the old code: one line per 401, so a 1 MiB
/// log rotated twice over and the first write's line was gone (and the queue dropped
/// lines).
#[test]
fn a_flood_of_unauthenticated_requests_keeps_every_write_in_the_audit_log() {
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    const CONNS: u64 = 4;
    const PER_CONN: u64 = 50_000;
    let b = Bootplane::start(&[
        "--set",
        "api.tls=false",
        "--set",
        "api.audit_max_bytes=1048576",
        "--set",
        "api.audit_keep=2",
    ]);
    let (c, v) = b.call(
        "POST",
        SERVERS,
        Some(&server("before", json!({}), "Recycle")),
    );
    assert_eq!(c, 201, "{v}");
    let answered = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let flood: Vec<_> = (0..CONNS)
        .map(|_| {
            let answered = answered.clone();
            let sock = std::net::TcpStream::connect(("127.0.0.1", b.api_port)).unwrap();
            std::thread::spawn(move || {
                let mut w = sock.try_clone().unwrap();
                let writer = std::thread::spawn(move || {
                    let req = format!("GET {SERVERS} HTTP/1.1\r\nHost: x\r\n\r\n");
                    let batch = req.repeat(500);
                    for _ in 0..PER_CONN / 500 {
                        w.write_all(batch.as_bytes()).unwrap();
                    }
                });
                let mut r = sock;
                r.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                let (mut all, mut denied) = (0u64, 0u64);
                let mut tail: Vec<u8> = Vec::new();
                let mut buf = vec![0u8; 64 << 10];
                while all < PER_CONN {
                    let n = r.read(&mut buf).expect("reading answers");
                    assert!(n > 0, "closed after {all} answers");
                    tail.extend_from_slice(&buf[..n]);
                    let count = |hay: &[u8], pat: &[u8]| {
                        hay.windows(pat.len()).filter(|w| *w == pat).count() as u64
                    };
                    let (a, d) = (count(&tail, b"HTTP/1.1 "), count(&tail, b"HTTP/1.1 401"));
                    all += a;
                    denied += d;
                    answered.fetch_add(a, Ordering::Relaxed);
                    // Keep fewer bytes than a status line: nothing is counted twice.
                    let keep = tail.len().saturating_sub(11);
                    tail.drain(..keep);
                }
                writer.join().unwrap();
                assert_eq!(denied, PER_CONN);
            })
        })
        .collect();
    // A write in the middle of the flood.
    let deadline = Instant::now() + Duration::from_secs(300);
    while answered.load(Ordering::Relaxed) < CONNS * PER_CONN / 2 {
        assert!(Instant::now() < deadline, "the flood stalled");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (c, v) = b.call(
        "POST",
        SERVERS,
        Some(&server("during", json!({}), "Recycle")),
    );
    assert_eq!(c, 201, "{v}");
    for t in flood {
        t.join().unwrap();
    }
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(300), "{took:?}");
    let (c, v) = b.call(
        "POST",
        SERVERS,
        Some(&server("after", json!({}), "Recycle")),
    );
    assert_eq!(c, 201, "{v}");

    let total = CONNS * PER_CONN;
    let summed = |lines: &[Value]| -> u64 {
        lines
            .iter()
            .filter(|l| l["code"] == 401)
            .map(|l| l["count"].as_u64().unwrap_or(1))
            .sum()
    };
    let writes = |lines: &[Value]| -> Vec<String> {
        lines
            .iter()
            .filter(|l| l["verb"] == "create" && l["code"] == 201)
            .map(|l| l["user"].as_str().unwrap().to_string())
            .collect()
    };
    // The summaries are written every api.audit_unauthenticated_interval_ms (10 s).
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut lines = audit_lines(&b);
    while (summed(&lines) < total || writes(&lines).len() < 3) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        lines = audit_lines(&b);
    }
    assert_eq!(
        writes(&lines),
        ["admin", "admin", "admin"],
        "writes in the audit log"
    );
    assert_eq!(summed(&lines), total);
    let summaries = lines.iter().filter(|l| l["code"] == 401).count();
    assert!(
        summaries as u128 <= 2 * (took.as_millis() / 10_000 + 5),
        "{summaries} lines for 401s in {took:?}"
    );
    assert!(
        !b.dir.join("audit.log.1").exists(),
        "the 401s rotated the audit log"
    );
    let m = b
        .req("GET", "/metrics")
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    assert!(
        m.contains("bootplane_api_audit_dropped_lines_total 0"),
        "{m}"
    );
    assert!(
        m.contains(&format!(
            "bootplane_api_audit_unauthenticated_requests_total {total}"
        )),
        "{m}"
    );
}
