//! TLS on the API listener (issue 22), against the real binary with real clients: curl
//! and `openssl s_client` trust only the state dir's CA; expired and revoked client
//! certificates are refused at the handshake and a valid one is accepted; testssl.sh
//! finds no protocol below TLS 1.2 and no weak cipher; a replaced certificate is
//! presented without a restart; a handshake that never finishes is closed by the header
//! read timeout; plain HTTP off loopback is refused by config validation. Issue 32: a
//! certificate-only request from another site is refused, non-JSON bodies are 415, and
//! HTTP/2 streams and watches per connection are capped.

use crate::support;

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use bootplane::tls::Ca;
use support::bootplane::*;
use support::require::require;

fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null()).output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// curl GET `url` with `args` (CA, client certificate): (exit code, body).
fn curl(url: &str, args: &[&str]) -> (i32, String) {
    require("curl");
    let o = run(Command::new("curl")
        .args(["-sS", "--max-time", "10"])
        .args(args)
        .arg(url)
        .env_remove("CURL_CA_BUNDLE")
        .env_remove("SSL_CERT_FILE"));
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
    )
}

/// `openssl s_client` to the API with `args`; its output (stdout + stderr) and exit.
fn s_client(port: u16, args: &[&str]) -> (i32, String) {
    require("openssl");
    let o = run(Command::new("timeout")
        .args(["10", "openssl", "s_client", "-connect"])
        .arg(format!("127.0.0.1:{port}"))
        .args(["-servername", "localhost"])
        .args(args));
    (
        o.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

/// The serial (lowercase hex) of the certificate the API presents.
fn presented_serial(port: u16) -> String {
    let (_, out) = s_client(port, &[]);
    let pem: String = {
        let start = out.find("-----BEGIN CERTIFICATE-----").expect(&out);
        let end = out.find("-----END CERTIFICATE-----").expect(&out) + 25;
        out[start..end].to_string()
    };
    let mut c = Command::new("openssl")
        .args(["x509", "-noout", "-serial"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(pem.as_bytes()).unwrap();
    let o = c.wait_with_output().unwrap();
    let s = String::from_utf8_lossy(&o.stdout);
    bootplane::tls::normalize_serial(s.trim().trim_start_matches("serial=")).unwrap()
}

fn cli(b: &Bootplane, args: &[&str]) -> Output {
    run(Command::new(bin())
        .env("BOOTPLANE_CLIENT_CONFIG", "/dev/null")
        .args(args)
        .arg("--state-dir")
        .arg(&b.dir))
}

/// A curl exit of a handshake the server ended: 35 (TLS error), 55/56 (the alert or the
/// close seen while sending or receiving, as TLS 1.3 client auth completes after the
/// client's side of the handshake).
fn refused(code: i32) -> bool {
    matches!(code, 35 | 55 | 56)
}

fn now() -> i64 {
    bootplane::sys::unix_now() as i64
}

#[test]
fn curl_and_openssl_trust_only_the_state_dirs_ca() {
    let b = Bootplane::start(&[]);
    let url = format!("{}/healthz", b.api);
    let ca = b.dir.join("tls/ca.crt");
    // No CA: the system's bundle does not know the appliance's CA.
    let (code, _) = curl(&url, &[]);
    assert_eq!(code, 60, "curl without the CA: certificate problem");
    // A wrong CA (another appliance's).
    let other = tempfile::tempdir().unwrap();
    Ca::load_or_create(other.path()).unwrap();
    let wrong = other.path().join("tls/ca.crt");
    let (code, _) = curl(&url, &["--cacert", wrong.to_str().unwrap()]);
    assert_eq!(code, 60, "curl with a wrong CA");
    // The state dir's CA: accepted, for every name the certificate is for.
    let (code, body) = curl(&url, &["--cacert", ca.to_str().unwrap()]);
    assert_eq!((code, body.as_str()), (0, "ok"));
    let by_name = format!("https://localhost:{}/healthz", b.api_port);
    let (code, _) = curl(
        &by_name,
        &[
            "--cacert",
            ca.to_str().unwrap(),
            "--resolve",
            &format!("localhost:{}:127.0.0.1", b.api_port),
        ],
    );
    assert_eq!(code, 0, "localhost is in the certificate");

    let (code, out) = s_client(
        b.api_port,
        &["-CAfile", wrong.to_str().unwrap(), "-verify_return_error"],
    );
    assert_ne!(code, 0, "s_client with a wrong CA: {out}");
    assert!(
        out.contains("unable to get local issuer certificate") || out.contains("verify error"),
        "{out}"
    );
    let (code, out) = s_client(
        b.api_port,
        &["-CAfile", ca.to_str().unwrap(), "-verify_return_error"],
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("Verify return code: 0 (ok)"), "{out}");
    // No protocol below TLS 1.2 is spoken at all.
    let (code, out) = s_client(b.api_port, &["-tls1_1"]);
    assert_ne!(code, 0, "TLS 1.1 handshake: {out}");
    // The generated files are private.
    for f in ["ca.crt", "ca.key", "server.crt", "server.key"] {
        let m = std::fs::metadata(b.dir.join("tls").join(f)).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777,
            0o600,
            "{f}"
        );
    }
}

#[test]
fn client_certificates_valid_accepted_expired_and_revoked_refused() {
    let b = Bootplane::start(&[]);
    let url = format!("{}/healthz", b.api);
    let ca = b.dir.join("tls/ca.crt");
    let ca = ca.to_str().unwrap();
    let out = tempfile::tempdir().unwrap();
    let outp = out.path().to_str().unwrap();
    let with = |name: &str| {
        let (c, k) = (
            out.path().join(format!("{name}.crt")),
            out.path().join(format!("{name}.key")),
        );
        curl(
            &url,
            &[
                "--cacert",
                ca,
                "--cert",
                c.to_str().unwrap(),
                "--key",
                k.to_str().unwrap(),
            ],
        )
    };

    // Issued by the CLI: a bundle, the key private.
    let o = cli(
        &b,
        &["cert", "issue", "alice", "--role", "viewer", "--out", outp],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("--cert-file"),
        "{}",
        text(&o)
    );
    let m = std::fs::metadata(out.path().join("alice.key")).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777,
        0o600
    );
    assert_eq!(
        std::fs::read(out.path().join("ca.crt")).unwrap(),
        std::fs::read(b.dir.join("tls/ca.crt")).unwrap()
    );
    assert_eq!(
        with("alice"),
        (0, "ok".into()),
        "a valid client certificate"
    );
    let (code, s) = s_client(
        b.api_port,
        &[
            "-CAfile",
            ca,
            "-cert",
            out.path().join("alice.crt").to_str().unwrap(),
            "-key",
            out.path().join("alice.key").to_str().unwrap(),
            "-verify_return_error",
        ],
    );
    assert_eq!(code, 0, "{s}");
    assert!(s.contains("Verify return code: 0 (ok)"), "{s}");
    // With the certificate and the token, the API answers as before (the client
    // certificate does not get in the way of bearer auth).
    let token = format!("Authorization: Bearer {}", b.token);
    let (code, body) = curl(
        &format!("{}/apis/metal.ironcore.dev/v1alpha1/servers", b.api),
        &[
            "--cacert",
            ca,
            "--cert",
            out.path().join("alice.crt").to_str().unwrap(),
            "--key",
            out.path().join("alice.key").to_str().unwrap(),
            "-H",
            &token,
        ],
    );
    assert_eq!(code, 0);
    assert!(body.contains("\"items\""), "{body}");

    // The certificate alone: user "alice" (CN) with the viewer role (O), no token. A
    // viewer lists servers and is refused a write, with the verb, resource and user named.
    let (alice_crt, alice_key) = (out.path().join("alice.crt"), out.path().join("alice.key"));
    let cert_args = [
        "--cacert",
        ca,
        "--cert",
        alice_crt.to_str().unwrap(),
        "--key",
        alice_key.to_str().unwrap(),
    ];
    let servers = format!("{}/apis/metal.ironcore.dev/v1alpha1/servers", b.api);
    let (code, body) = curl(&servers, &cert_args);
    assert_eq!(code, 0);
    assert!(
        body.contains("\"items\""),
        "a viewer certificate lists: {body}"
    );
    let mut post = cert_args.to_vec();
    post.extend([
        "-X",
        "POST",
        "-H",
        "Content-Type: application/json",
        "-d",
        r#"{"apiVersion":"metal.ironcore.dev/v1alpha1","kind":"Server","metadata":{"name":"by-cert"},"spec":{}}"#,
        "-w",
        " %{http_code}",
    ]);
    let (_, body) = curl(&servers, &post);
    assert!(
        body.ends_with(" 403"),
        "a viewer certificate writes: {body}"
    );
    assert!(
        body.contains(r#"User \"alice\" cannot create resource \"servers\""#),
        "{body}"
    );
    // The CLI with the certificate and no token (a client config context would do the same).
    let o = cli(
        &b,
        &[
            "get",
            "servers",
            "--server",
            &b.api,
            "--cert-file",
            out.path().join("alice.crt").to_str().unwrap(),
            "--key-file",
            out.path().join("alice.key").to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", text(&o));

    // Expired: issued by the same CA with a validity in the past.
    let old = Ca::load(&b.dir)
        .unwrap()
        .issue_client("old", "viewer", now() - 10 * 86_400, now() - 86_400)
        .unwrap();
    std::fs::write(out.path().join("old.crt"), &old.cert_pem).unwrap();
    std::fs::write(out.path().join("old.key"), &old.key_pem).unwrap();
    let (code, _) = with("old");
    assert!(
        refused(code),
        "an expired certificate is refused at the handshake (curl exit {code})"
    );

    // Signed by another CA: refused too.
    let other = tempfile::tempdir().unwrap();
    let foreign = Ca::load_or_create(other.path())
        .unwrap()
        .issue_client("mallory", "admin", now() - 60, now() + 86_400)
        .unwrap();
    std::fs::write(out.path().join("mallory.crt"), &foreign.cert_pem).unwrap();
    std::fs::write(out.path().join("mallory.key"), &foreign.key_pem).unwrap();
    let (code, _) = with("mallory");
    assert!(
        refused(code),
        "a certificate of another CA (curl exit {code})"
    );

    // Revoked by name: refused from the next handshakes on, without a restart.
    let o = cli(
        &b,
        &["cert", "issue", "bob", "--role", "operator", "--out", outp],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(with("bob"), (0, "ok".into()));
    let o = cli(&b, &["cert", "revoke", "bob"]);
    assert!(o.status.success(), "{}", text(&o));
    let t0 = Instant::now();
    loop {
        let (code, _) = with("bob");
        if refused(code) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "bob still accepted after revocation"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(with("alice"), (0, "ok".into()), "others still accepted");
    let o = cli(&b, &["cert", "list"]);
    let listing = String::from_utf8_lossy(&o.stdout).into_owned();
    let line = |n: &str| {
        listing
            .lines()
            .find(|l| l.starts_with(n))
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        line("bob").contains("revoked") && line("bob").contains("operator"),
        "{listing}"
    );
    assert!(line("alice").contains("valid"), "{listing}");
    // Revoked by serial: the serial as openssl prints it (colons, upper case).
    let serial = line("alice")
        .split_whitespace()
        .nth(2)
        .unwrap()
        .to_uppercase();
    let colons: Vec<String> = serial
        .as_bytes()
        .chunks(2)
        .map(|c| String::from_utf8_lossy(c).into())
        .collect();
    let o = cli(&b, &["cert", "revoke", &colons.join(":")]);
    assert!(o.status.success(), "{}", text(&o));
    let t0 = Instant::now();
    while with("alice").0 == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "alice still accepted after revocation"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    // Without any client certificate, the token still works.
    let (code, _) = curl(&url, &["--cacert", ca]);
    assert_eq!(code, 0);
}

#[test]
fn testssl_finds_no_protocol_below_tls12_and_no_weak_cipher() {
    require("testssl");
    let b = Bootplane::start(&[]);
    let out = tempfile::tempdir().unwrap();
    let json = out.path().join("testssl.json");
    let o = run(Command::new("timeout")
        .args([
            "300",
            "testssl",
            "--quiet",
            "--color",
            "0",
            "--warnings",
            "off",
        ])
        .args([
            "--nodns",
            "none",
            "--ip",
            "127.0.0.1",
            "--protocols",
            "--std",
        ])
        .arg("--jsonfile")
        .arg(&json)
        .arg(format!("https://127.0.0.1:{}", b.api_port)));
    let findings: Vec<serde_json::Value> = serde_json::from_slice(
        &std::fs::read(&json).unwrap_or_else(|e| panic!("no testssl json ({e}): {}", text(&o))),
    )
    .unwrap();
    let finding = |id: &str| {
        findings
            .iter()
            .find(|f| f["id"] == id)
            .map(|f| f["finding"].as_str().unwrap_or("").to_string())
            .unwrap_or_else(|| panic!("no {id} in testssl's findings: {findings:#?}"))
    };
    for id in ["SSLv2", "SSLv3", "TLS1", "TLS1_1"] {
        assert_eq!(finding(id), "not offered", "{id}");
    }
    assert_eq!(finding("TLS1_2"), "offered");
    assert!(
        finding("TLS1_3").starts_with("offered"),
        "{}",
        finding("TLS1_3")
    );
    for id in [
        "cipherlist_NULL",
        "cipherlist_aNULL",
        "cipherlist_EXPORT",
        "cipherlist_LOW",
        "cipherlist_3DES_IDEA",
        "cipherlist_AVERAGE",
    ] {
        assert_eq!(finding(id), "not offered", "{id}");
    }
    assert_eq!(finding("cipherlist_STRONG"), "offered");
    let bad: Vec<_> = findings
        .iter()
        .filter(|f| {
            matches!(
                f["severity"].as_str(),
                Some("LOW" | "MEDIUM" | "HIGH" | "CRITICAL")
            )
        })
        .collect();
    assert!(bad.is_empty(), "testssl found problems: {bad:#?}");
}

/// An operator's server certificate for 127.0.0.1, signed by the state dir's CA.
fn operator_pair(state: &Path, dir: &Path, cn: &str) -> String {
    let ca = Ca::load(state).unwrap();
    let issued = ca
        .issue_server_for(&["127.0.0.1", "localhost"], cn, 2)
        .unwrap();
    // The key first, as an operator replacing both would; the listener keeps the old
    // pair while they do not match.
    std::fs::write(dir.join("op.key"), &issued.key_pem).unwrap();
    std::fs::write(dir.join("op.crt"), &issued.cert_pem).unwrap();
    issued.serial_hex
}

#[test]
fn a_replaced_certificate_is_presented_without_a_restart() {
    let state = tempfile::tempdir().unwrap();
    let ops = tempfile::tempdir().unwrap();
    // The operator's certificate is signed by the appliance's CA (made before the first
    // start here), so the test client's trust stays the state dir's CA.
    Ca::load_or_create(state.path()).unwrap();
    let first = operator_pair(state.path(), ops.path(), "one");
    let (crt, key) = (ops.path().join("op.crt"), ops.path().join("op.key"));
    let b = Bootplane::start_in(
        state.path(),
        &[
            "--set",
            &format!("api.cert_file={:?}", crt.to_str().unwrap()),
            "--set",
            &format!("api.key_file={:?}", key.to_str().unwrap()),
        ],
    );
    let pid = b.child.as_ref().unwrap().id();
    assert_eq!(presented_serial(b.api_port), first);
    assert!(
        !state.path().join("tls/server.crt").exists(),
        "no generated certificate"
    );

    let second = operator_pair(state.path(), ops.path(), "two");
    assert_ne!(first, second);
    let t0 = Instant::now();
    while presented_serial(b.api_port) != second {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "the new certificate was not presented"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    // A broken file is logged and the current certificate kept.
    std::fs::write(&crt, "not a certificate\n").unwrap();
    b.wait_for(15, "the broken certificate to be noticed", || {
        b.log()
            .contains("new API server certificate not loaded")
            .then_some(())
    });
    assert_eq!(presented_serial(b.api_port), second);
    assert_eq!(b.req("GET", "/healthz").call().unwrap().status(), 200);
    assert_eq!(b.child.as_ref().unwrap().id(), pid, "no restart");
}

#[test]
fn a_handshake_that_never_finishes_is_closed_by_the_header_timeout() {
    let b = Bootplane::start(&["--set", "api.header_read_timeout_ms=500"]);
    let mut s = std::net::TcpStream::connect(("127.0.0.1", b.api_port)).unwrap();
    // The start of a ClientHello record, and nothing more.
    s.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01]).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let t0 = Instant::now();
    let mut buf = [0u8; 64];
    let r = s.read(&mut buf);
    let took = t0.elapsed();
    assert!(matches!(r, Ok(0) | Err(_)), "closed, not answered: {r:?}");
    assert!(
        took < Duration::from_secs(3),
        "closed after {took:?}, not by the 500 ms header timeout"
    );
    // The listener still serves others.
    assert_eq!(
        b.agent
            .get(&format!("{}/healthz", b.api))
            .call()
            .unwrap()
            .status(),
        200
    );
}

#[test]
fn plain_http_is_refused_off_loopback() {
    let check = |listen: &str| {
        run(Command::new(bin()).args([
            "check-config",
            "--api-listen",
            listen,
            "--set",
            "api.tls=false",
        ]))
    };
    let o = check("0.0.0.0:9090");
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("api.tls = false") && err.contains("api.listen") && err.contains("loopback"),
        "{err}"
    );
    let o = check("10.1.2.3:9090");
    assert!(!o.status.success());
    let o = check("127.0.0.1:9090");
    assert!(o.status.success(), "{}", text(&o));
    // Plain on loopback works, and the CLI speaks plain HTTP to it when told.
    let b = Bootplane::start(&["--set", "api.tls=false"]);
    assert!(b.api.starts_with("http://"));
    assert!(!b.dir.join("tls").exists(), "no TLS files made");
    let o = run(Command::new(bin())
        .args(["get", "servers", "--server", &b.api, "--state-dir"])
        .arg(&b.dir));
    assert!(o.status.success(), "{}", text(&o));
}

/// A system UUID of its own for the Server `name`.
fn uuid(name: &str) -> String {
    format!(
        "00000000-0000-0000-0000-{:012x}",
        support::api::fxhash(name) & 0xffff_ffff_ffff
    )
}

/// `(status, body)` of a request with the `agent`, its headers and body.
fn send(
    agent: &ureq::Agent,
    url: &str,
    method: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> (u16, String) {
    let mut r = agent.request(method, url).set("Connection", "close");
    for (k, v) in headers {
        r = r.set(k, v);
    }
    let res = match body {
        Some(b) => r.send_string(b),
        None => r.call(),
    };
    match res {
        Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
        Err(ureq::Error::Status(c, r)) => (c, r.into_string().unwrap_or_default()),
        Err(e) => panic!("{method} {url}: {e}"),
    }
}

/// Issue 32 item 5 (review M4): a browser holding an admin client certificate sends it to
/// any page's requests. A cross-site `text/plain` form body is refused (415, it is not
/// JSON whatever its text), a cross-site JSON write authenticated only by the
/// certificate is refused (403), and nothing is created; the same certificate from this
/// origin (the dashboard) or without browser headers (curl, the CLI), and a bearer token
/// from anywhere, still write.
#[test]
fn cross_site_requests_with_only_a_client_certificate_are_refused() {
    let b = Bootplane::start(&[]);
    let out = tempfile::tempdir().unwrap();
    let admin = Ca::load(&b.dir)
        .unwrap()
        .issue_client("ops", "admin", now() - 60, now() + 86_400)
        .unwrap();
    let (crt, key) = (out.path().join("ops.crt"), out.path().join("ops.key"));
    std::fs::write(&crt, &admin.cert_pem).unwrap();
    std::fs::write(&key, &admin.key_pem).unwrap();
    let cert = api_agent_builder_with(&b.dir, Some((&crt, &key))).build();
    let servers = format!("{}/apis/metal.ironcore.dev/v1alpha1/servers", b.api);
    let body = |n: &str| {
        format!(
            r#"{{"apiVersion":"metal.ironcore.dev/v1alpha1","kind":"Server","metadata":{{"name":"{n}"}},"spec":{{"systemUUID":"{}"}}}}"#,
            uuid(n)
        )
    };
    let evil = ("Origin", "https://evil.example");
    let own = format!("https://127.0.0.1:{}", b.api_port);
    let names = || -> Vec<String> {
        let v = b.get("/apis/metal.ironcore.dev/v1alpha1/servers");
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };

    // The form: text/plain from another site, with the certificate. On the old code:
    // 201, the text parsed as JSON and the Server created.
    let (c, t) = send(
        &cert,
        &servers,
        "POST",
        &[("Content-Type", "text/plain"), evil],
        Some(&body("by-form")),
    );
    assert_eq!(c, 415, "{t}");
    assert!(t.contains("UnsupportedMediaType"), "{t}");
    // Other form encodings too, and text/plain from anyone (a bearer token included).
    for ct in [
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    ] {
        let (c, t) = send(
            &cert,
            &servers,
            "POST",
            &[("Content-Type", ct), evil],
            Some(&body("by-form")),
        );
        assert_eq!(c, 415, "{ct}: {t}");
    }
    let bearer = format!("Bearer {}", b.token);
    let (c, t) = send(
        &b.agent,
        &servers,
        "POST",
        &[("Content-Type", "text/plain"), ("Authorization", &bearer)],
        Some(&body("by-form")),
    );
    assert_eq!(c, 415, "{t}");

    // JSON from another site with only the certificate: 403, by Origin or by
    // Sec-Fetch-Site; reads too (a watch from another site is refused as well).
    let json = ("Content-Type", "application/json");
    for h in [
        evil,
        ("Origin", "null"),
        ("Sec-Fetch-Site", "cross-site"),
        ("Sec-Fetch-Site", "same-site"),
    ] {
        let (c, t) = send(&cert, &servers, "POST", &[json, h], Some(&body("by-xsite")));
        assert_eq!(c, 403, "{h:?}: {t}");
        assert!(t.contains("cross-site request refused"), "{t}");
    }
    let (c, _) = send(
        &cert,
        &format!("{servers}?watch=true"),
        "GET",
        &[evil],
        None,
    );
    assert_eq!(c, 403);
    assert!(names().is_empty(), "{:?}", names());

    // The same certificate from this origin (the dashboard's fetches), and with no
    // browser headers at all (curl, the CLI): allowed.
    let (c, t) = send(
        &cert,
        &servers,
        "POST",
        &[json, ("Origin", &own), ("Sec-Fetch-Site", "same-origin")],
        Some(&body("from-dashboard")),
    );
    assert_eq!(c, 201, "{t}");
    let (c, t) = send(&cert, &servers, "POST", &[json], Some(&body("from-curl")));
    assert_eq!(c, 201, "{t}");
    // A bearer token is not ambient: another site cannot attach it, so its Origin does
    // not matter.
    let (c, t) = send(
        &b.agent,
        &servers,
        "POST",
        &[json, evil, ("Authorization", &bearer)],
        Some(&body("by-token")),
    );
    assert_eq!(c, 201, "{t}");
    // JSON patches and YAML keep working.
    let (c, t) = send(
        &cert,
        &format!("{servers}/from-curl"),
        "PATCH",
        &[("Content-Type", "application/merge-patch+json")],
        Some(r#"{"metadata":{"labels":{"a":"b"}}}"#),
    );
    assert_eq!(c, 200, "{t}");
    let (c, t) = send(
        &cert,
        &servers,
        "POST",
        &[("Content-Type", "application/yaml")],
        Some(&format!("apiVersion: metal.ironcore.dev/v1alpha1\nkind: Server\nmetadata: {{name: by-yaml}}\nspec: {{systemUUID: {}}}\n", uuid("by-yaml"))),
    );
    assert_eq!(c, 201, "{t}");
    let mut n = names();
    n.sort();
    assert_eq!(n, ["by-token", "by-yaml", "from-curl", "from-dashboard"]);
}

/// Issue 32 item 5 (review M7): one HTTP/2 connection cannot multiplex unbounded
/// watches. The listener advertises `http2_max_concurrent_streams`, so a client's
/// stream past it waits until one closes; a connection's watches past
/// `max_watches_per_connection` are 429 even when streams are free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_streams_and_watches_per_connection_are_capped() {
    use http_body_util::{BodyExt, Empty, StreamBody};
    use hyper::body::{Bytes, Frame};
    type Body = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;
    let b = Bootplane::start(&[
        "--set",
        "api.http2_max_concurrent_streams=4",
        "--set",
        "api.max_watches_per_connection=3",
    ]);
    let pem = std::fs::read(b.dir.join("tls/ca.crt")).unwrap();
    let mut cfg = bootplane::tls::client_config(&pem, None).unwrap();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", b.api_port))
        .await
        .unwrap();
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(cfg))
        .connect(
            rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap(),
            tcp,
        )
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut h2, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tls),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let servers = "/apis/metal.ironcore.dev/v1alpha1/servers";
    let request = |method: &str, path: &str, body: Body| {
        hyper::Request::builder()
            .method(method)
            .uri(format!("https://127.0.0.1:{}{path}", b.api_port))
            .header("authorization", format!("Bearer {}", b.token))
            .body(body)
            .unwrap()
    };
    let empty = || Empty::<Bytes>::new().boxed();
    let watch_path = format!("{servers}?watch=true");
    // Three watches on the connection: streaming.
    let mut watches = Vec::new();
    for i in 0..3 {
        h2.ready().await.unwrap();
        let r = h2
            .send_request(request("GET", &watch_path, empty()))
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "watch {i}");
        watches.push(r);
    }
    // A fourth: 429, the connection's share is taken.
    h2.ready().await.unwrap();
    let r = h2
        .send_request(request("GET", &watch_path, empty()))
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    let text = r.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&text);
    assert!(text.contains("max_watches_per_connection"), "{text}");
    // A fourth stream of another kind: a POST whose body has not ended yet.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::convert::Infallible>>(1);
    let body = StreamBody::new(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|f| (f, rx))
    }))
    .boxed();
    h2.ready().await.unwrap();
    let post = tokio::spawn(
        h2.send_request(
            hyper::Request::builder()
                .method("POST")
                .uri(format!("https://127.0.0.1:{}{servers}", b.api_port))
                .header("authorization", format!("Bearer {}", b.token))
                .header("content-type", "application/json")
                .body(body)
                .unwrap(),
        ),
    );
    // Four streams open: a fifth request waits for one to close.
    h2.ready().await.unwrap();
    let mut fifth = tokio::spawn(h2.send_request(request("GET", "/apis", empty())));
    let waited = tokio::time::timeout(Duration::from_millis(1500), &mut fifth).await;
    assert!(
        waited.is_err(),
        "a fifth stream was served while four were open: {waited:?}"
    );
    // Closing a watch frees a stream: the fifth is answered.
    drop(watches.pop());
    let r = tokio::time::timeout(Duration::from_secs(10), fifth)
        .await
        .expect("the fifth request after a stream closed")
        .unwrap()
        .unwrap();
    assert_eq!(r.status(), 200);
    // The POST finishes once its body does.
    let s = format!(
        r#"{{"apiVersion":"metal.ironcore.dev/v1alpha1","kind":"Server","metadata":{{"name":"h2"}},"spec":{{"systemUUID":"{}"}}}}"#,
        uuid("h2")
    );
    tx.send(Ok(Frame::data(Bytes::from(s)))).await.unwrap();
    drop(tx);
    let r = post.await.unwrap().unwrap();
    assert_eq!(r.status(), 201);
}
