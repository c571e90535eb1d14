//! Issue 17 (defects 3, 4, 11): request bodies and objects an attacker or a careless
//! client sends to the REST API of the real `bootplane` binary, on loopback only.
//! Deep YAML, alias bombs, bodies without a Content-Type, oversized objects and
//! annotations, bad label syntax, and a watch from a future resourceVersion are each
//! refused quickly with a kube `Status`, store nothing, and leave `/healthz` answering
//! and the server's memory where it was.

use crate::support;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::api::*;
use support::bootplane::*;

/// A resident-set figure of the server process (`VmRSS`, `VmHWM`), in KiB.
fn status_kib(b: &Bootplane, field: &str) -> u64 {
    let pid = b.child.as_ref().unwrap().id();
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// Send `body` with `content_type` (none when `None`) to the API at `api` (of state dir
/// `dir`); (status, Status/object JSON, how long the answer took). Panics when no answer
/// comes within `timeout`.
#[allow(clippy::too_many_arguments)]
fn send_to(
    dir: &std::path::Path,
    api: &str,
    token: &str,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: &[u8],
    timeout: Duration,
) -> (u16, Value, Duration) {
    let agent = api_agent_builder(dir).timeout(timeout).build();
    let mut r = agent
        .request(method, &format!("{api}{path}"))
        .set("Authorization", &format!("Bearer {token}"));
    if let Some(ct) = content_type {
        r = r.set("Content-Type", ct);
    }
    let t0 = Instant::now();
    let res = r.send_bytes(body);
    let took = t0.elapsed();
    let parse = |r: ureq::Response| {
        let t = r.into_string().unwrap_or_default();
        serde_json::from_str(&t).unwrap_or(Value::String(t))
    };
    match res {
        Ok(r) => (r.status(), parse(r), took),
        Err(ureq::Error::Status(c, r)) => (c, parse(r), took),
        Err(e) => panic!("{method} {path}: no answer after {took:?}: {e}"),
    }
}

/// POST `body` to the Servers with `content_type`, answered within 10 s.
fn post_server(b: &Bootplane, content_type: Option<&str>, body: &[u8]) -> (u16, Value) {
    let (c, v, _) = send_to(
        &b.dir,
        &b.api,
        &b.token,
        "POST",
        SERVERS,
        content_type,
        body,
        Duration::from_secs(10),
    );
    (c, v)
}

/// The names of the stored Servers.
fn server_names(b: &Bootplane) -> Vec<String> {
    let mut v: Vec<String> = b.get(SERVERS)["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    v.sort();
    v
}

/// At most 300 characters of `s`, for messages.
fn short(s: &str) -> String {
    s.chars().take(300).collect()
}

fn rev(b: &Bootplane) -> u64 {
    b.get(SERVERS)["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// `/healthz` answers (each within `limit`) while `busy` runs on another thread;
/// returns `busy`'s result and the slowest `/healthz`.
fn healthz_during<T: Send + 'static>(
    b: &Bootplane,
    limit: Duration,
    busy: impl FnOnce() -> T + Send + 'static,
) -> (T, Duration) {
    let h = std::thread::spawn(busy);
    let agent = api_agent_builder(&b.dir).timeout(limit).build();
    let mut slowest = Duration::ZERO;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !h.is_finished() && Instant::now() < deadline {
        let t0 = Instant::now();
        let r = agent.get(&format!("{}/healthz", b.api)).call();
        let took = t0.elapsed();
        assert!(
            r.is_ok(),
            "/healthz did not answer within {limit:?} while a body was parsed: {r:?}"
        );
        slowest = slowest.max(took);
        std::thread::sleep(Duration::from_millis(20));
    }
    (h.join().expect("request thread"), slowest)
}

/// `method path` with `body` on a raw connection: the head (with `Content-Length`)
/// first, and the body only if no answer came within a second: a server that refuses
/// the declared length answers without reading any of it. (A client still writing
/// the body when the server answers and closes gets a broken pipe instead.)
fn send_declared(b: &Bootplane, method: &str, path: &str, body: &[u8]) -> (u16, Value, bool) {
    use std::io::{Read, Write};
    let mut c = api_tls_stream(&b.dir, b.api_port);
    write!(
        c,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        b.token,
        body.len()
    )
    .unwrap();
    c.sock
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    let mut first = [0u8; 1];
    let sent_body = match c.read(&mut first) {
        Ok(1) => false,
        _ => {
            c.write_all(body).unwrap();
            true
        }
    };
    c.sock
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut rest = Vec::new();
    let _ = c.read_to_end(&mut rest);
    let mut all = if sent_body {
        Vec::new()
    } else {
        first.to_vec()
    };
    all.extend_from_slice(&rest);
    let text = String::from_utf8_lossy(&all).into_owned();
    let code = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {}", short(&text)));
    // The body (Connection: close, so the rest of the stream; possibly chunked).
    let payload = text.split_once("\r\n\r\n").map_or("", |x| x.1);
    let json_start = payload.find('{').unwrap_or(0);
    let json_end = payload.rfind('}').map_or(payload.len(), |e| e + 1);
    let v =
        serde_json::from_str(&payload[json_start..json_end.max(json_start)]).unwrap_or(Value::Null);
    (code, v, sent_body)
}

fn deep_flow(levels: usize) -> Vec<u8> {
    let mut v = vec![b'['; levels];
    v.resize(levels * 2, b']');
    v
}

#[test]
fn deep_yaml_is_refused_in_milliseconds_and_healthz_keeps_answering() {
    // The old 8 MiB body limit, so the 2M-level body reaches the decoder.
    let b = Bootplane::start(&["--set", "api.max_body_bytes=8388608"]);
    // (levels, body, Content-Type): on the old code `a: [[[...` 100k deep took 57 s
    // to refuse, `{a: {a: ...` over a minute, `[[[...]]]` 0.85 s.
    let cases: Vec<(usize, Vec<u8>, Option<&str>)> = vec![
        (
            100_000,
            [&b"a: "[..], &deep_flow(100_000)[..100_000]].concat(),
            Some("application/yaml"),
        ),
        (100_000, deep_flow(100_000), Some("application/yaml")),
        (
            2_000_000,
            b"{a: ".repeat(2_000_000),
            Some("application/yaml"),
        ),
        (2_000_000, deep_flow(2_000_000), Some("application/yaml")),
        (2_000_000, deep_flow(2_000_000), Some("application/json")),
        (2_000_000, deep_flow(2_000_000), None),
    ];
    for (levels, body, ct) in cases {
        let (dir, api, token) = (b.dir.clone(), b.api.clone(), b.token.clone());
        let ((code, v, took), slowest) = healthz_during(&b, Duration::from_secs(1), move || {
            let timeout = Duration::from_secs(10);
            send_to(&dir, &api, &token, "POST", SERVERS, ct, &body, timeout)
        });
        assert_eq!(
            code,
            400,
            "{levels} levels ({ct:?}): answered {code} after {took:?}: {}",
            short(&v.to_string())
        );
        assert!(
            took < Duration::from_millis(1500),
            "{levels} levels ({ct:?}) took {took:?} to refuse"
        );
        assert!(
            v["message"]
                .as_str()
                .unwrap_or("")
                .contains("nesting deeper than 64 levels"),
            "the Status names the depth limit: {}",
            short(&v.to_string())
        );
        eprintln!("{levels} levels ({ct:?}): 400 after {took:?}, slowest /healthz {slowest:?}");
    }
    // A document nested within the limit is still fine.
    let mut s = server("shallow", json!({"a": "b"}), "Recycle");
    s["metadata"]["annotations"] = json!({"x": "[[[[[[[[[[[[[[[["});
    let yaml = format!(
        "{{\"metadata\": {}, \"spec\": {}}}",
        s["metadata"], s["spec"]
    );
    let (c, v) = post_server(&b, Some("application/yaml"), yaml.as_bytes());
    assert_eq!(c, 201, "{v}");
    assert_eq!(
        server_names(&b),
        ["shallow"],
        "only the valid object was stored"
    );
}

#[test]
fn yaml_alias_bomb_is_refused_without_growing_memory() {
    let b = Bootplane::start(&["--set", "api.max_body_bytes=8388608"]);
    // 1 MB string, ~400 KB of aliases to it.
    let mut body = String::from("metadata: {name: bomb}\nspec: {systemUUID: &a \"");
    body.push_str(&"x".repeat(1 << 20));
    body.push_str("\"}\nstatus:\n  conditions: [");
    for i in 0..100_000 {
        body.push_str(if i == 0 { "*a" } else { ",*a" });
    }
    body.push_str("]\n");
    let rss0 = status_kib(&b, "VmRSS");
    let hwm0 = status_kib(&b, "VmHWM");
    for _ in 0..3 {
        let (c, v, took) = send_to(
            &b.dir,
            &b.api,
            &b.token,
            "POST",
            SERVERS,
            Some("application/yaml"),
            body.as_bytes(),
            Duration::from_secs(20),
        );
        assert_eq!(c, 413, "alias bomb answered {c} after {took:?}: {v}");
        assert_eq!(v["reason"], "RequestEntityTooLarge", "{v}");
        assert!(
            v["message"].as_str().unwrap_or("").contains("alias"),
            "the Status says why: {v}"
        );
        assert!(took < Duration::from_millis(1500), "refusing took {took:?}");
    }
    let (rss1, hwm1) = (status_kib(&b, "VmRSS"), status_kib(&b, "VmHWM"));
    eprintln!("VmRSS {rss0} -> {rss1} KiB, VmHWM {hwm0} -> {hwm1} KiB");
    assert!(
        rss1 < rss0 + 50 * 1024,
        "RSS grew from {rss0} KiB to {rss1} KiB"
    );
    assert!(
        hwm1 < hwm0 + 50 * 1024,
        "peak RSS grew from {hwm0} KiB to {hwm1} KiB"
    );
    // A few aliases to a small node are fine.
    let ok = "metadata:\n  name: aliased\n  labels: &l {rack: r1}\n  annotations: *l\nspec: {systemUUID: 4c4c4544-0000-0000-0000-00000000a11a}\n";
    let (c, v) = post_server(&b, Some("application/yaml"), ok.as_bytes());
    assert_eq!(c, 201, "{v}");
    assert_eq!(v["metadata"]["annotations"]["rack"], "r1");
    assert_eq!(server_names(&b), ["aliased"]);
}

#[test]
fn a_body_without_content_type_is_json() {
    let b = Bootplane::start(&[]);
    let s = server("no-ct", json!({}), "Recycle");
    let (c, v) = post_server(&b, None, s.to_string().as_bytes());
    assert_eq!(c, 201, "{v}");
    // YAML without a Content-Type is not guessed at: it is malformed JSON.
    let yaml = "apiVersion: metal.ironcore.dev/v1alpha1\nkind: Server\nmetadata: {name: no-ct-yaml}\nspec: {systemUUID: 4c4c4544-0000-0000-0000-00000000c0de}\n";
    let (c, v) = post_server(&b, None, yaml.as_bytes());
    assert_eq!(c, 400, "{v}");
    let m = v["message"].as_str().unwrap_or("");
    assert!(
        m.contains("malformed JSON") && m.contains("application/yaml"),
        "{v}"
    );
    // With it, the same text is YAML.
    let (c, v) = post_server(&b, Some("application/yaml"), yaml.as_bytes());
    assert_eq!(c, 201, "{v}");
    assert_eq!(server_names(&b), ["no-ct", "no-ct-yaml"]);
}

#[test]
fn oversized_objects_and_annotations_are_refused_and_memory_is_kept() {
    let b = Bootplane::start(&[]);
    let (c, _) = b.call("POST", SERVERS, Some(&server("big", json!({}), "Recycle")));
    assert_eq!(c, 201);
    let rss0 = status_kib(&b, "VmRSS");
    // An 7.5 MiB annotation (under the old 8 MiB body limit), 20 times: refused (by
    // the body limit) before it is read.
    let mut obj = b.get(&format!("{SERVERS}/big"));
    obj["metadata"]["annotations"] = json!({"note": "x".repeat(15 << 19)});
    obj["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    let text = obj.to_string();
    for _ in 0..20 {
        let (c, v, sent_body) =
            send_declared(&b, "PUT", &format!("{SERVERS}/big"), text.as_bytes());
        assert_eq!(
            c,
            413,
            "7.5 MiB annotation answered {c}: {}",
            short(&v.to_string())
        );
        assert!(!sent_body, "answered only once the body was sent");
        assert_eq!(v["reason"], "RequestEntityTooLarge", "{v}");
        assert!(
            v["message"].as_str().unwrap().contains("3145728"),
            "the Status names the limit: {v}"
        );
    }
    // Without a declared length (chunked), reading stops at the limit: 413 too.
    {
        use std::io::{Read, Write};
        let mut c = api_tls_stream(&b.dir, b.api_port);
        write!(
            c,
            "PUT {SERVERS}/big HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {}\r\n\
             Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
            b.token
        )
        .unwrap();
        let chunk = [b'x'; 64 << 10];
        for _ in 0..49 {
            write!(c, "{:x}\r\n", chunk.len()).unwrap();
            c.write_all(&chunk).unwrap();
            c.write_all(b"\r\n").unwrap();
        }
        c.sock
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut head = [0u8; 512];
        let n = c.read(&mut head).unwrap();
        let head = String::from_utf8_lossy(&head[..n]);
        assert!(head.starts_with("HTTP/1.1 413"), "{}", short(&head));
        assert!(head.contains("3145728"), "{}", short(&head));
    }
    let rss1 = status_kib(&b, "VmRSS");
    eprintln!("VmRSS {rss0} -> {rss1} KiB after 20 refused 7.5 MiB PUTs");
    assert!(
        rss1 < rss0 + 50 * 1024,
        "RSS grew from {rss0} KiB to {rss1} KiB"
    );
    // Within the body limit, 300 KiB of annotations is over kube's 256 KiB: 422,
    // by PUT and by PATCH.
    obj["metadata"]["annotations"] = json!({"note": "x".repeat(300 << 10)});
    let (c, v) = b.call("PUT", &format!("{SERVERS}/big"), Some(&obj));
    assert_eq!(c, 422, "{v}");
    assert_eq!(
        v["details"]["causes"][0]["field"], "metadata.annotations",
        "{v}"
    );
    assert!(v["message"].as_str().unwrap().contains("262144"), "{v}");
    let (c, v) = b.call(
        "PATCH",
        &format!("{SERVERS}/big"),
        Some(&json!({"metadata": {"annotations": {"note": "x".repeat(300 << 10)}}})),
    );
    assert_eq!(c, 422, "{v}");
    // An object over 1.5 MiB (a Secret's data): 413.
    let (c, v) = b.call(
        "POST",
        "/api/v1/namespaces/default/secrets",
        Some(
            &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "huge"},
                     "stringData": {"k": "x".repeat(1600 << 10)}}),
        ),
    );
    assert_eq!(c, 413, "{v}");
    assert_eq!(v["reason"], "RequestEntityTooLarge", "{v}");
    assert!(v["message"].as_str().unwrap().contains("1572864"), "{v}");
    let stored = b.get(&format!("{SERVERS}/big"));
    assert!(
        stored["metadata"].get("annotations").is_none(),
        "nothing was stored: {}",
        short(&stored.to_string())
    );
    assert_eq!(
        b.call("GET", "/api/v1/namespaces/default/secrets/huge", None)
            .0,
        404
    );
}

#[test]
fn bad_label_keys_and_values_are_refused_with_422() {
    let b = Bootplane::start(&[]);
    let long = "v".repeat(100 << 10);
    let cases: Vec<(Value, &str)> = vec![
        (json!({"../../x y": "v"}), "metadata.labels"),
        (json!({"": "v"}), "metadata.labels"),
        (json!({"k": "a\nb"}), "metadata.labels.k"),
        (json!({"k": long}), "metadata.labels.k"),
        (json!({"k\n": "v"}), "metadata.labels"),
        (json!({"-k": "v"}), "metadata.labels"),
        (json!({"a/b/c": "v"}), "metadata.labels"),
        (json!({"Example.COM/x": "v"}), "metadata.labels"),
        (json!({"k": "-v"}), "metadata.labels.k"),
    ];
    for (i, (labels, field)) in cases.iter().enumerate() {
        let s = server(&format!("bad-label-{i}"), labels.clone(), "Recycle");
        let (c, v) = b.call("POST", SERVERS, Some(&s));
        assert_eq!(c, 422, "labels {labels}: {v}");
        assert_eq!(v["reason"], "Invalid", "{v}");
        let f = v["details"]["causes"][0]["field"].as_str().unwrap_or("");
        assert!(
            f.starts_with(field),
            "labels {labels}: cause field {f:?}: {v}"
        );
    }
    // Annotation keys follow the same syntax.
    let mut s = server("bad-annotation", json!({}), "Recycle");
    s["metadata"]["annotations"] = json!({"../../x y": "anything goes here\n"});
    let (c, v) = b.call("POST", SERVERS, Some(&s));
    assert_eq!(c, 422, "{v}");
    assert!(
        v["details"]["causes"][0]["field"]
            .as_str()
            .unwrap()
            .starts_with("metadata.annotations"),
        "{v}"
    );
    assert!(server_names(&b).is_empty(), "nothing was stored");
    // Valid ones still are.
    let s = server(
        "good-labels",
        json!({"bootplane.dev/rack": "r-1_a.b", "k": "", "A-b_c.D": "x".repeat(63)}),
        "Recycle",
    );
    let (c, v) = b.call("POST", SERVERS, Some(&s));
    assert_eq!(c, 201, "{v}");
}

#[test]
fn a_watch_from_a_future_resource_version_is_an_error() {
    let b = Bootplane::start(&[]);
    let now = rev(&b);
    let future = now + 1000;
    let agent = api_agent_builder(&b.dir)
        .timeout(Duration::from_secs(5))
        .build();
    let t0 = Instant::now();
    let r = agent
        .get(&format!(
            "{}{SERVERS}?watch=true&resourceVersion={future}",
            b.api
        ))
        .set("Authorization", &format!("Bearer {}", b.token))
        .call();
    let took = t0.elapsed();
    let (code, v) = match r {
        Ok(r) => (r.status(), Value::Null),
        Err(ureq::Error::Status(c, r)) => {
            (c, serde_json::from_str(&r.into_string().unwrap()).unwrap())
        }
        Err(e) => panic!("no answer after {took:?}: {e}"),
    };
    assert_eq!(
        code, 504,
        "a watch from {future} (current {now}) answered {code}"
    );
    assert_eq!(v["reason"], "Timeout", "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("Too large resource version"),
        "{v}"
    );
    assert_eq!(
        v["details"]["causes"][0]["reason"], "ResourceVersionTooLarge",
        "{v}"
    );
    assert!(took < Duration::from_secs(2), "took {took:?}");
    // The current revision itself is fine (the watch starts after it).
    let r = agent
        .get(&format!(
            "{}{SERVERS}?watch=true&resourceVersion={now}",
            b.api
        ))
        .set("Authorization", &format!("Bearer {}", b.token))
        .call()
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[test]
fn apply_refuses_deep_yaml_manifests_quickly() {
    let b = Bootplane::start(&[]);
    let mut doc = String::from(
        "apiVersion: metal.ironcore.dev/v1alpha1\nkind: Server\nmetadata: {name: deep}\nspec: ",
    );
    doc.push_str(&"[".repeat(30_000));
    let t0 = Instant::now();
    let (code, out, err) = b.cli_stdin(&["apply", "-f", "-"], Some(&doc));
    let took = t0.elapsed();
    assert_eq!(code, 1, "{out} {}", short(&err));
    assert!(
        err.contains("nesting deeper than 64 levels"),
        "{}",
        short(&err)
    );
    assert!(took < Duration::from_secs(3), "apply took {took:?}");
    assert!(server_names(&b).is_empty());
}
