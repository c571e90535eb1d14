//! Bad input on the boot listener: path traversal in every encoding (raw sockets and
//! curl --path-as-is), oversized headers (431), slow headers (closed), the connection
//! limit, malformed UUID/MAC, other methods. Nothing outside the roots is readable and
//! the server keeps serving.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use bootplane::http::server::Limits;
use support::http::*;

fn limits() -> Limits {
    Limits {
        max_connections: 64,
        max_connections_per_source: 64,
        max_header_bytes: 8192,
        header_read_timeout: Duration::from_millis(600),
        idle_timeout: Duration::from_millis(600),
        drain_timeout: Duration::from_secs(2),
        ..Limits::default()
    }
}

/// Send raw bytes, read the whole reply (the request says Connection: close).
fn raw(srv: &Srv, request: &[u8]) -> String {
    let mut s = TcpStream::connect(srv.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

fn status(reply: &str) -> u16 {
    reply
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {reply:?}"))
}

#[test]
fn traversal_in_every_encoding_reads_nothing_outside_the_roots() {
    let srv = start(limits(), |_| {});
    let root = srv.dir.path();
    std::os::unix::fs::symlink(root.join("secret.txt"), root.join("assets/link.txt")).unwrap();
    std::os::unix::fs::symlink(root, root.join("assets/up")).unwrap();
    let paths = [
        "/assets/../secret.txt",
        "/assets/sub/../../secret.txt",
        "/assets/..%2fsecret.txt",
        "/assets/..%2Fsecret.txt",
        "/assets/%2e%2e/secret.txt",
        "/assets/%2E%2E/secret.txt",
        "/assets/%2e%2e%2fsecret.txt",
        "/assets/.%2e/secret.txt",
        "/assets/%252e%252e/secret.txt",
        "/assets/%252e%252e%252fsecret.txt",
        "/assets/..%5csecret.txt",
        "/assets/..%5Csecret.txt",
        "/assets/..\\secret.txt",
        "/assets/sub\\..\\..\\secret.txt",
        "/assets//etc/passwd",
        "/assets/%2fetc%2fpasswd",
        "/assets/%2Fetc/passwd",
        "/assets/images/../../secret.txt",
        "/assets/images/%2e%2e/%2e%2e/secret.txt",
        "/assets/%c0%ae%c0%ae/secret.txt",
        "/assets/%c0%af../secret.txt",
        "/assets/link.txt",
        "/assets/up/secret.txt",
        "/assets/secret.txt%00.efi",
        "/assets/.",
        "/assets/",
        "/../secret.txt",
        "/assets/../../../../../../etc/passwd",
    ];
    for p in paths {
        let reply = raw(
            &srv,
            format!("GET {p} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        );
        let code = status(&reply);
        assert!(code == 400 || code == 404, "{p}: {code}");
        assert!(
            !reply.contains("TOP-SECRET") && !reply.contains("root:"),
            "{p} leaked: {reply}"
        );
        let c = curl(OTHER_IP, &format!("{}{p}", srv.base), &["--path-as-is"]);
        assert!(c.code == 400 || c.code == 404, "curl {p}: {}", c.code);
        assert!(
            !c.text().contains("TOP-SECRET") && !c.text().contains("root:"),
            "curl {p} leaked"
        );
    }
    // Absolute-form request target and absolute file paths.
    for target in [
        "http://x/assets/../secret.txt",
        "http://x/assets/%2e%2e/secret.txt",
        "/etc/passwd",
        "*",
    ] {
        let reply = raw(
            &srv,
            format!("GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        );
        let code = status(&reply);
        assert!((400..500).contains(&code), "{target}: {code}");
        assert!(
            !reply.contains("TOP-SECRET") && !reply.contains("root:"),
            "{target} leaked"
        );
    }
    // Legit files still work.
    assert_eq!(
        curl(OTHER_IP, &format!("{}/assets/tool.efi", srv.base), &[]).code,
        200
    );
}

#[test]
fn oversized_headers_get_431() {
    let srv = start(limits(), |_| {});
    let big = "a".repeat(20_000);
    let reply = raw(
        &srv,
        format!("GET /boot.ipxe HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    );
    assert_eq!(status(&reply), 431, "{reply}");
    let many: String = (0..200).map(|i| format!("X-H{i}: v\r\n")).collect();
    let reply = raw(
        &srv,
        format!("GET /boot.ipxe HTTP/1.1\r\nHost: x\r\n{many}Connection: close\r\n\r\n").as_bytes(),
    );
    assert_eq!(status(&reply), 431, "{reply}");
    let c = curl(
        OTHER_IP,
        &format!("{}/boot.ipxe", srv.base),
        &["-H", &format!("X-Big: {big}")],
    );
    assert_eq!(c.code, 431);
    assert_eq!(
        curl(OTHER_IP, &format!("{}/boot.ipxe", srv.base), &[]).code,
        200
    );
}

#[test]
fn slow_and_idle_headers_are_closed() {
    let srv = start(limits(), |_| {});
    // Slowloris: a byte every 150 ms never completes the head.
    let mut s = TcpStream::connect(srv.addr).unwrap();
    let start = Instant::now();
    s.write_all(b"GET /boot.ipxe HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let mut closed = false;
    for _ in 0..40 {
        std::thread::sleep(Duration::from_millis(150));
        if s.write_all(b"X").is_err() {
            closed = true;
            break;
        }
        s.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
        let mut b = [0u8; 64];
        if let Ok(0) = s.read(&mut b) {
            closed = true;
            break;
        }
    }
    assert!(
        closed,
        "slow header connection still open after {:?}",
        start.elapsed()
    );
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "closed only after {:?}",
        start.elapsed()
    );
    // Idle: connect and send nothing.
    let mut idle = TcpStream::connect(srv.addr).unwrap();
    let took = wait_closed(&mut idle, Duration::from_secs(5)).expect("idle connection closed");
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert_eq!(
        curl(OTHER_IP, &format!("{}/boot.ipxe", srv.base), &[]).code,
        200
    );
}

#[test]
fn connection_limit_evicts_idle_connections_and_closes_extra_ones_when_all_are_busy() {
    let l = Limits {
        max_connections: 3,
        max_connections_per_source: 3,
        header_read_timeout: Duration::from_secs(8),
        idle_timeout: Duration::from_secs(8),
        ..limits()
    };
    let srv = start(l, |_| {});
    // Idle connections make room: the oldest is closed for the newcomer.
    let mut idle: Vec<TcpStream> = (0..3)
        .map(|_| {
            let s = TcpStream::connect(srv.addr).unwrap();
            std::thread::sleep(Duration::from_millis(20));
            s
        })
        .collect();
    let c = curl(OTHER_IP, &format!("{}/boot.ipxe", srv.base), &[]);
    assert_eq!(c.code, 200);
    let took = wait_closed(&mut idle[0], Duration::from_secs(3)).expect("oldest idle closed");
    assert!(took < Duration::from_secs(2));
    assert!(srv
        .metrics
        .encode()
        .contains("bootplane_http_connections_evicted_total 1"));
    drop(idle);
    // Busy connections (downloads the client does not read) are never closed for it.
    let big = srv.dir.path().join("assets/big.bin");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(256 << 20)
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let held: Vec<TcpStream> = (0..3)
        .map(|_| {
            let mut s = TcpStream::connect(srv.addr).unwrap();
            s.write_all(b"GET /assets/big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
                .unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    // From another source (the held ones' source is at its share as well).
    let t = Instant::now();
    let c = curl(OTHER_IP, &format!("{}/boot.ipxe", srv.base), &[]);
    assert_eq!(c.code, 0, "served although every slot is busy");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert!(srv
        .metrics
        .encode()
        .contains("bootplane_http_connections_rejected_total 1"));
    drop(held);
    // Slots come back once the held connections go.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let c = curl(OTHER_IP, &format!("{}/boot.ipxe", srv.base), &[]);
        if c.code == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "slots never freed");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn malformed_identity_and_methods() {
    let srv = start(limits(), |_| {});
    srv.index.upsert(ready_machine(srv.dir.path(), &srv.base));
    for q in [
        "uuid=1234",
        "uuid=zzzzzzzz-0042-3510-8052-b4c04f4e4d32",
        "uuid=4c4c4544-0042-3510-8052-b4c04f4e4d3",
        "uuid=%ff%fe",
        "mac=52-54-00-ab-cd",
        "mac=52-54-00-ab-cd-eg",
        "mac=52:54-00:ab:cd:ef",
        "mac=%00%00",
        "server=Bad_Name",
    ] {
        let c = curl(MACHINE_IP, &format!("{}/ipxe/script?{q}", srv.base), &[]);
        assert_eq!(c.code, 400, "{q}: {}", c.text());
        assert!(c.text().starts_with("bad request"), "{q}");
    }
    let long = format!("{}/ipxe/script?uuid={}", srv.base, "a".repeat(9000));
    let c = curl(MACHINE_IP, &long, &[]);
    assert!((400..500).contains(&c.code), "{}", c.code);
    // Unknown machine (valid ids): default script, 200, nothing recorded.
    let c = curl(
        OTHER_IP,
        &format!(
            "{}/ipxe/script?uuid=11111111-2222-3333-4444-555555555555&mac=02-00-00-00-00-01",
            srv.base
        ),
        &[],
    );
    assert_eq!(c.code, 200);
    assert!(
        c.text()
            .contains("unknown machine (uuid 11111111-2222-3333-4444-555555555555)"),
        "{}",
        c.text()
    );
    assert_eq!(
        curl(OTHER_IP, &format!("{}/ignition/nobody", srv.base), &[]).code,
        404
    );
    assert_eq!(
        curl(OTHER_IP, &format!("{}/ignition/", srv.base), &[]).code,
        400
    );
    let post = curl(
        MACHINE_IP,
        &format!("{}/ipxe/script?uuid={UUID}", srv.base),
        &["-X", "POST", "-d", "x"],
    );
    assert_eq!(post.code, 405);
    assert_eq!(post.header("allow").as_deref(), Some("GET, HEAD"));
    assert!(srv.index.events().is_empty());
    assert_eq!(
        curl(MACHINE_IP, &srv.signed_script_url("server-a"), &[]).code,
        200
    );
}
