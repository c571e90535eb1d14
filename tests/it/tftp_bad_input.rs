//! Hostile and broken input against the real socket layer: WRQ, unknown opcodes,
//! every traversal form, missing files, bad option values, truncated packets, OACK
//! rejection, duplicate ACKs (no Sorcerer's Apprentice), the transfer limit. Each
//! gets the right ERROR code or a silent drop; the server keeps serving afterwards.

use crate::support;

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use bootplane::tftp::metrics::ErrorKind;
use bootplane::tftp::TftpConfig;
use support::data::*;
use support::tftp::*;

const SECRET: &[u8] = b"TOP-SECRET-OUTSIDE-ROOT";

struct Env {
    _d: tempfile::TempDir,
    srv: TestServer,
}

fn env(cfg: TftpConfig) -> Env {
    let d = tmpdir();
    let root = d.path().join("root");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::write(root.join("small"), b"hello tftp").unwrap();
    std::fs::write(root.join("sub/file"), pattern(5000, 3)).unwrap();
    std::fs::write(root.join("big"), pattern(200_000, 4)).unwrap();
    std::fs::write(d.path().join("secret"), SECRET).unwrap();
    std::os::unix::fs::symlink(d.path().join("secret"), root.join("escape")).unwrap();
    std::os::unix::fs::symlink("/etc", root.join("etc")).unwrap();
    let srv = start_server("127.0.0.1:0", &root, cfg, None);
    Env { _d: d, srv }
}

fn client() -> UdpSocket {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(Duration::from_millis(400)))
        .unwrap();
    s
}

fn expect_error(s: &UdpSocket, code: u16, what: &str) {
    let (p, _) = recv(s).unwrap_or_else(|| panic!("{what}: no reply"));
    assert_eq!(&p[..2], &[0, 5], "{what}: not an ERROR: {p:?}");
    assert_eq!(
        u16::from_be_bytes([p[2], p[3]]),
        code,
        "{what}: {:?}",
        String::from_utf8_lossy(&p[4..])
    );
}

fn still_serves(e: &Env) {
    let c = client();
    c.send_to(&req(1, "small", "octet", &[]), e.srv.addr)
        .unwrap();
    let (p, from) = recv(&c).expect("server stopped answering");
    assert_eq!(&p[..4], &[0, 3, 0, 1]);
    assert_eq!(&p[4..], b"hello tftp");
    c.send_to(&[0, 4, 0, 1], from).unwrap();
}

#[test]
fn wrq_unknown_opcode_and_mode_get_errors() {
    let e = env(TftpConfig::default());
    let c = client();
    c.send_to(&req(2, "upload", "octet", &[]), e.srv.addr)
        .unwrap();
    expect_error(&c, 2, "WRQ");
    c.send_to(&[0, 9, b'x', 0], e.srv.addr).unwrap();
    expect_error(&c, 4, "opcode 9");
    c.send_to(&[0xff, 0xff], e.srv.addr).unwrap();
    expect_error(&c, 4, "opcode 65535");
    c.send_to(&req(1, "small", "mail", &[]), e.srv.addr)
        .unwrap();
    expect_error(&c, 4, "mail mode");
    assert!(e.srv.metrics.error_count(ErrorKind::WriteRefused) >= 1);
    assert!(!e.srv.addr.ip().is_unspecified());
    still_serves(&e);
}

#[test]
fn traversal_in_all_forms_is_refused_and_nothing_leaks() {
    let e = env(TftpConfig::default());
    let names = [
        "../secret",
        "..\\secret",
        "sub/../../secret",
        "sub\\..\\..\\secret",
        "./../secret",
        "/etc/passwd",
        "\\etc\\passwd",
        "//etc/passwd",
        "C:\\Windows\\win.ini",
        "c:/secret",
        "escape",
        "etc/passwd",
        "52:54:00:12:34:56/../secret",
        "52:54:00:12:34:56/../../secret",
        "sub/..",
        "..",
        "",
    ];
    for n in names {
        let c = client();
        c.send_to(&req(1, n, "octet", &[]), e.srv.addr).unwrap();
        let (p, _) = recv(&c).unwrap_or_else(|| panic!("{n:?}: no reply"));
        assert!(
            !p.windows(SECRET.len()).any(|w| w == SECRET),
            "{n:?} leaked the secret"
        );
        assert!(
            !p.windows(5).any(|w| w == b"root:"),
            "{n:?} leaked /etc/passwd"
        );
        assert_eq!(
            &p[..4],
            &[0, 5, 0, 2],
            "{n:?}: expected access violation, got {:?}",
            String::from_utf8_lossy(&p)
        );
    }
    // A name that merely contains dots is an ordinary (missing) file.
    let c = client();
    c.send_to(&req(1, "%2e%2e/secret", "octet", &[]), e.srv.addr)
        .unwrap();
    expect_error(&c, 1, "%2e%2e");
    still_serves(&e);
}

#[test]
fn missing_files_get_not_found() {
    let e = env(TftpConfig::default());
    for n in [
        "nothere",
        "sub/nothere",
        "small/x",
        "sub",
        "52:54:00:12:34:56/nothere",
    ] {
        let c = client();
        c.send_to(&req(1, n, "octet", &[]), e.srv.addr).unwrap();
        expect_error(&c, 1, n);
    }
    assert!(e.srv.metrics.error_count(ErrorKind::NotFound) >= 5);
}

#[test]
fn bad_option_values_get_error_8() {
    let e = env(TftpConfig::default());
    for (k, v) in [
        ("blksize", "7"),
        ("blksize", "0"),
        ("blksize", "abc"),
        ("blksize", ""),
        ("timeout", "0"),
        ("timeout", "999"),
        ("windowsize", "0"),
        ("windowsize", "70000"),
        ("tsize", "-5"),
    ] {
        let c = client();
        c.send_to(&req(1, "small", "octet", &[(k, v)]), e.srv.addr)
            .unwrap();
        expect_error(&c, 8, &format!("{k}={v}"));
    }
    // unknown options are ignored: no OACK, DATA 1 directly
    let c = client();
    c.send_to(
        &req(1, "small", "octet", &[("frobnicate", "1")]),
        e.srv.addr,
    )
    .unwrap();
    let (p, from) = recv(&c).unwrap();
    assert_eq!(&p[..4], &[0, 3, 0, 1]);
    c.send_to(&[0, 4, 0, 1], from).unwrap();
    // an oversized blksize is capped, not refused
    let c = client();
    c.send_to(
        &req(1, "small", "octet", &[("blksize", "100000")]),
        e.srv.addr,
    )
    .unwrap();
    let (p, from) = recv(&c).unwrap();
    assert_eq!(p, b"\0\x06blksize\x0065464\0");
    c.send_to(&[0, 5, 0, 8, b'n', b'o', 0], from).unwrap();
}

#[test]
fn truncated_and_garbage_packets_are_dropped_silently() {
    let e = env(TftpConfig::default());
    let c = client();
    for p in [
        &[][..],
        &[0],
        &[0, 1],
        &[0, 1, b'a'],
        &[0, 1, b'a', 0],
        &[0, 1, b'a', 0, b'o', b'c'],
        &[0, 4, 0],
        &[0, 3],
        &[0, 1, 0xc3, 0x28, 0, b'o', 0],
    ] {
        c.send_to(p, e.srv.addr).unwrap();
    }
    // stray ACK/DATA/ERROR/OACK on the listening port: dropped too
    for p in [
        &[0, 4, 0, 1][..],
        &[0, 3, 0, 1, 1, 2],
        &[0, 5, 0, 0, 0],
        &[0, 6],
    ] {
        c.send_to(p, e.srv.addr).unwrap();
    }
    assert!(recv(&c).is_none(), "expected silence");
    assert!(e.srv.metrics.error_count(ErrorKind::Malformed) >= 5);
    still_serves(&e);
}

#[test]
fn oack_rejected_with_error_8_ends_transfer() {
    let e = env(TftpConfig::default());
    let c = client();
    c.send_to(
        &req(1, "big", "octet", &[("blksize", "1024"), ("tsize", "0")]),
        e.srv.addr,
    )
    .unwrap();
    let (p, from) = recv(&c).unwrap();
    assert_eq!(&p[..2], &[0, 6]);
    assert!(p.windows(6).any(|w| w == b"200000"), "tsize in OACK: {p:?}");
    assert_ne!(from, e.srv.addr, "transfer must use its own port");
    c.send_to(&[0, 5, 0, 8, b'n', b'o', 0], from).unwrap();
    // nothing more arrives (no DATA, no OACK retransmission)
    let c2 = c.try_clone().unwrap();
    c2.set_read_timeout(Some(Duration::from_millis(700)))
        .unwrap();
    assert!(recv(&c2).is_none(), "server kept sending after error 8");
    assert!(e.srv.metrics.error_count(ErrorKind::PeerError) >= 1);
}

#[test]
fn duplicate_acks_do_not_duplicate_data() {
    // A long retransmission timeout so any DATA we see is caused by ACKs.
    let cfg = TftpConfig {
        retransmit_initial_ms: 2000,
        retransmit_min_ms: 2000,
        ..TftpConfig::default()
    };
    let e = env(cfg);
    let c = client();
    c.send_to(&req(1, "big", "octet", &[]), e.srv.addr).unwrap();
    let (p, from) = recv(&c).unwrap();
    assert_eq!(&p[..4], &[0, 3, 0, 1]);
    for _ in 0..5 {
        c.send_to(&[0, 4, 0, 1], from).unwrap();
    }
    let (p, _) = recv(&c).unwrap();
    assert_eq!(&p[..4], &[0, 3, 0, 2]);
    c.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    assert!(
        recv(&c).is_none(),
        "duplicate ACK 1 caused a duplicate DATA 2"
    );
    // an ACK from a stranger on the transfer port does not disturb it
    let other = client();
    other.send_to(&[0, 4, 0, 2], from).unwrap();
    assert!(recv(&c).is_none());
    assert_eq!(e.srv.metrics.retransmits.get(), 0);
}

#[test]
fn retransmits_with_backoff_then_gives_up() {
    let cfg = TftpConfig {
        retransmit_initial_ms: 100,
        retransmit_min_ms: 100,
        retransmit_max_ms: 400,
        max_retries: 3,
        ..TftpConfig::default()
    };
    let e = env(cfg);
    let c = client();
    c.set_read_timeout(Some(Duration::from_millis(1500)))
        .unwrap();
    c.send_to(&req(1, "small", "octet", &[]), e.srv.addr)
        .unwrap();
    let t0 = Instant::now();
    let mut times = Vec::new();
    while let Some((p, _)) = recv(&c) {
        assert_eq!(&p[..4], &[0, 3, 0, 1]);
        times.push(t0.elapsed());
    }
    // original + 3 retransmissions at ~100, 300, 700 ms
    assert_eq!(times.len(), 4, "{times:?}");
    let gaps: Vec<_> = times.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        gaps[1] > gaps[0] && gaps[2] > gaps[1],
        "no backoff: {gaps:?}"
    );
    assert!(e.srv.metrics.error_count(ErrorKind::Timeout) >= 1);
    assert_eq!(e.srv.metrics.retransmits.get(), 3);
}

#[test]
fn max_transfers_limit_drops_extra_requests() {
    let cfg = TftpConfig {
        max_transfers: 1,
        retransmit_initial_ms: 2000,
        retransmit_min_ms: 2000,
        ..TftpConfig::default()
    };
    let e = env(cfg);
    let a = client();
    a.send_to(&req(1, "big", "octet", &[]), e.srv.addr).unwrap();
    let (_, from) = recv(&a).unwrap();
    let b = client();
    b.send_to(&req(1, "small", "octet", &[]), e.srv.addr)
        .unwrap();
    assert!(
        recv(&b).is_none(),
        "second transfer should be dropped while one runs"
    );
    assert!(e.srv.metrics.error_count(ErrorKind::Busy) >= 1);
    // finish a's transfer by aborting; then b is served
    a.send_to(&[0, 5, 0, 0, b'x', 0], from).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    b.send_to(&req(1, "small", "octet", &[]), e.srv.addr)
        .unwrap();
    let (p, _) = recv(&b).expect("served after the slot freed");
    assert_eq!(&p[..4], &[0, 3, 0, 1]);
}

#[test]
fn netascii_converts_line_ends() {
    let e = env(TftpConfig::default());
    let root = e._d.path().join("root");
    std::fs::write(root.join("t.txt"), b"a\nb\r").unwrap();
    let c = client();
    c.send_to(&req(1, "t.txt", "NetASCII", &[("tsize", "0")]), e.srv.addr)
        .unwrap();
    let (p, from) = recv(&c).unwrap();
    assert_eq!(p, b"\0\x06tsize\x006\0", "tsize is the converted size");
    c.send_to(&[0, 4, 0, 0], from).unwrap();
    let (p, _) = recv(&c).unwrap();
    assert_eq!(&p[4..], b"a\r\nb\r\0");
}

/// Shutdown with transfers in flight, in both socket modes: each client gets an ERROR
/// from its transfer's port, the transfers are counted as failed, the engine threads
/// end (the drop returns in bounded time), and nothing answers afterwards.
#[test]
fn shutdown_ends_transfers_in_flight_with_an_error() {
    for single_port in [false, true] {
        let e = env(TftpConfig {
            single_port,
            workers: 2,
            ..TftpConfig::default()
        });
        let addr = e.srv.addr;
        // Three clients, each holding DATA 1 of `big` without acknowledging it.
        let clients: Vec<(UdpSocket, SocketAddr)> = (0..3)
            .map(|_| {
                let c = client();
                c.send_to(&req(1, "big", "octet", &[]), addr).unwrap();
                let (p, from) = recv(&c).expect("DATA 1");
                assert_eq!(&p[..4], &[0, 3, 0, 1], "single_port={single_port}");
                (c, from)
            })
            .collect();
        assert_eq!(e.srv.metrics.transfers_active.get(), 3);
        let metrics = e.srv.metrics.clone();
        let t0 = Instant::now();
        drop(e);
        assert!(
            t0.elapsed() < Duration::from_secs(6),
            "shutdown took {:?}",
            t0.elapsed()
        );
        for (c, from) in &clients {
            // The transfer may have retransmitted DATA 1 before the ERROR came.
            let err = loop {
                let (p, f) = recv(c).expect("an ERROR on shutdown");
                assert_eq!(f, *from, "single_port={single_port}");
                if p[1] == 5 {
                    break p;
                }
                assert_eq!(&p[..4], &[0, 3, 0, 1]);
            };
            let msg = String::from_utf8_lossy(&err[4..]);
            assert!(msg.contains("shutting down"), "{msg}");
        }
        assert_eq!(metrics.transfers_active.get(), 0);
        assert_eq!(metrics.transfers_failed.get(), 3);
        let c = client();
        c.send_to(&req(1, "small", "octet", &[]), addr).unwrap();
        assert!(recv(&c).is_none(), "answered after shutdown");
    }
}
