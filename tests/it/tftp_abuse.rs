//! What an attacker or a careless client does to the TFTP server (issue 17): a burst of
//! netascii requests for one file (memory), a flood of stalled transfers that ask for
//! `timeout=255` from one address (slots), a transfer trickled one tiny block at a time
//! (a slot held for hours), and a FIFO in the root (a blocked runtime).
//! Each test checks that the server stays bounded and keeps serving the others.
//!
//! These run in their own test binary because one of them measures the process's RSS
//! (the server runs in-process), which the other TFTP tests' files would disturb.

use crate::support;

use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bootplane::tftp::TftpConfig;
use support::data::*;
use support::tftp::*;

fn client_on(ip: &str, wait: Duration) -> UdpSocket {
    let s = UdpSocket::bind((ip, 0)).unwrap();
    s.set_read_timeout(Some(wait)).unwrap();
    s
}

/// RFC 764 netascii of `b` (the reference the server's output is checked against).
fn netascii(b: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    for &c in b {
        match c {
            b'\n' => v.extend_from_slice(b"\r\n"),
            b'\r' => v.extend_from_slice(b"\r\0"),
            c => v.push(c),
        }
    }
    v
}

/// Fetch `name` in lockstep from a raw client, with the given options; the file's bytes.
fn fetch(addr: SocketAddr, ip: &str, name: &str, mode: &str, opts: &[(&str, &str)]) -> Vec<u8> {
    let blksize: usize = opts
        .iter()
        .find(|(k, _)| *k == "blksize")
        .map_or(512, |(_, v)| v.parse().unwrap());
    let c = client_on(ip, Duration::from_secs(2));
    let mut got = Vec::new();
    let t0 = Instant::now();
    c.send_to(&req(1, name, mode, opts), addr).unwrap();
    let mut expect: u16 = 1;
    loop {
        assert!(t0.elapsed() < Duration::from_secs(20), "{name}: too slow");
        let (p, from) = recv(&c).unwrap_or_else(|| panic!("{name}: no reply"));
        match p[1] {
            6 => c.send_to(&[0, 4, 0, 0], from).map(drop).unwrap(),
            3 => {
                let b = u16::from_be_bytes([p[2], p[3]]);
                if b == expect {
                    got.extend_from_slice(&p[4..]);
                    expect = expect.wrapping_add(1);
                }
                c.send_to(&[0, 4, p[2], p[3]], from).unwrap();
                if b == expect.wrapping_sub(1) && p.len() - 4 < blksize {
                    return got;
                }
            }
            _ => panic!("{name}: unexpected {:?}", String::from_utf8_lossy(&p)),
        }
    }
}

fn status_kib(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = s
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("{field} not in /proc/self/status"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Issue 17 defect 5: every netascii transfer converted a private copy of the file, so
/// 2,048 requests for one file took the server from 29 MB to 1.74 GB. Now the
/// converted file is made once and shared by every transfer of it, like an octet one.
#[test]
fn netascii_requests_for_one_file_share_one_converted_copy() {
    const FLOOD: usize = 300;
    let d = tmpdir();
    // 1 MiB of text lines (each LF becomes CR LF, each CR becomes CR NUL)
    let line = b"0123456789abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWX\r\n";
    let text: Vec<u8> = line.iter().copied().cycle().take(1 << 20).collect();
    std::fs::write(d.path().join("notes.txt"), &text).unwrap();
    let srv = start_server("127.0.0.1:0", d.path(), TftpConfig::default(), None);

    // the content is right (and the converted copy is made)
    let got = fetch(
        srv.addr,
        "127.0.0.1",
        "notes.txt",
        "netascii",
        &[("blksize", "1428")],
    );
    assert!(
        got == netascii(&text),
        "netascii content differs ({} bytes, {} expected)",
        got.len(),
        netascii(&text).len()
    );

    let before = status_kib("VmRSS:");
    // Many transfers of the file held open at once: each gets its OACK and is then
    // left unacknowledged, so the server keeps whatever each one holds.
    let clients: Vec<UdpSocket> = (0..FLOOD)
        .map(|_| {
            let c = client_on("127.0.0.1", Duration::from_secs(5));
            c.send_to(
                &req(1, "notes.txt", "netascii", &[("blksize", "1428")]),
                srv.addr,
            )
            .unwrap();
            c
        })
        .collect();
    for (i, c) in clients.iter().enumerate() {
        let (p, _) = recv(c).unwrap_or_else(|| panic!("request {i}: no OACK"));
        assert_eq!(&p[..2], &[0, 6], "request {i}: {p:?}");
    }
    let grown_mib = status_kib("VmRSS:").saturating_sub(before) / 1024;
    eprintln!("{FLOOD} netascii transfers held: RSS grew {grown_mib} MiB");
    assert!(
        grown_mib < 48,
        "{FLOOD} netascii transfers of one 1 MiB file grew the server by {grown_mib} MiB (one converted copy each?)"
    );
    assert_eq!(srv.metrics.transfers_active.get(), FLOOD as i64);
}

/// Issue 17 defect 6: `timeout=255` was honoured, so a flood of stalled transfers from
/// one address held every slot for minutes and locked out clients that behave. The
/// option is now declined above `max_timeout_secs` (RFC 2349: the OACK must carry the
/// client's value or leave it out) and one address gets only a share of the slots.
#[test]
fn a_stalled_timeout_255_flood_from_one_address_leaves_room_for_others() {
    const SLOTS: usize = 64;
    let d = tmpdir();
    std::fs::write(d.path().join("big"), pattern(200_000, 4)).unwrap();
    std::fs::write(d.path().join("small"), b"hello tftp").unwrap();
    let srv = start_server(
        "127.0.0.1:0",
        d.path(),
        TftpConfig {
            max_transfers: SLOTS,
            workers: 1,
            ..TftpConfig::default()
        },
        None,
    );
    // The flood: as many requests as there are slots, from one address, never acknowledged.
    let flood: Vec<UdpSocket> = (0..SLOTS)
        .map(|_| {
            let c = client_on("127.0.0.1", Duration::from_millis(100));
            c.send_to(&req(1, "big", "octet", &[("timeout", "255")]), srv.addr)
                .unwrap();
            c
        })
        .collect();
    // what the flood got (the dropped requests get nothing: wait once, then look)
    std::thread::sleep(Duration::from_millis(500));
    let replies: Vec<Vec<u8>> = flood
        .iter()
        .filter_map(|c| {
            c.set_nonblocking(true).unwrap();
            recv(c).map(|r| r.0)
        })
        .collect();
    let answered = replies.len();
    assert!(answered > 0, "the flood got no transfer at all");
    // A client that behaves, from another address, is served at once (it retries its
    // RRQ like a real one).
    let t0 = Instant::now();
    let c = client_on("127.0.0.2", Duration::from_millis(500));
    let mut served = None;
    for _ in 0..3 {
        c.send_to(&req(1, "small", "octet", &[]), srv.addr).unwrap();
        if let Some(r) = recv(&c) {
            served = Some(r);
            break;
        }
    }
    let (p, from) = served.unwrap_or_else(|| {
        panic!(
            "a well-behaved client from 127.0.0.2 was locked out by {answered} stalled transfers from 127.0.0.1"
        )
    });
    assert_eq!(&p[..], b"\0\x03\0\x01hello tftp");
    c.send_to(&[0, 4, 0, 1], from).unwrap();
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    assert!(
        answered <= SLOTS / 2,
        "one address got {answered} of {SLOTS} slots"
    );
    for p in &replies {
        assert!(
            p[1] != 6 || !String::from_utf8_lossy(p).contains("timeout"),
            "timeout=255 was acknowledged: {:?}",
            String::from_utf8_lossy(p)
        );
    }
}

/// The declined timeout also keeps the server's own retransmission schedule: a client
/// asking for 255 s that stops acknowledging gets its block again within a second or
/// two, not after 255 s; a modest timeout is still acknowledged as asked.
#[test]
fn timeout_above_the_maximum_is_declined_and_a_modest_one_kept() {
    let d = tmpdir();
    std::fs::write(d.path().join("big"), pattern(200_000, 4)).unwrap();
    let srv = start_server("127.0.0.1:0", d.path(), TftpConfig::default(), None);
    let c = client_on("127.0.0.1", Duration::from_secs(3));
    c.send_to(
        &req(
            1,
            "big",
            "octet",
            &[("blksize", "1024"), ("timeout", "255")],
        ),
        srv.addr,
    )
    .unwrap();
    let (p, from) = recv(&c).expect("OACK");
    assert_eq!(
        &p[..],
        b"\0\x06blksize\x001024\0",
        "OACK {:?}",
        String::from_utf8_lossy(&p)
    );
    c.send_to(&[0, 4, 0, 0], from).unwrap();
    let (p, _) = recv(&c).expect("DATA 1");
    assert_eq!(&p[..4], &[0, 3, 0, 1]);
    let t0 = Instant::now();
    let (p, _) = recv(&c).expect("DATA 1 retransmitted within 3 s");
    assert_eq!(&p[..4], &[0, 3, 0, 1]);
    assert!(t0.elapsed() < Duration::from_secs(3));

    let c = client_on("127.0.0.1", Duration::from_secs(3));
    c.send_to(&req(1, "big", "octet", &[("timeout", "2")]), srv.addr)
        .unwrap();
    let (p, _) = recv(&c).expect("OACK");
    assert_eq!(&p[..], b"\0\x06timeout\x002\0");
}

/// A client that acknowledges every block of `blksize=8`, just slowly enough never to
/// exhaust the retries (one ACK a second), used to hold its slot for as long as the
/// file lasted (a 200 kB file: 7 hours). Below `min_rate_bytes_per_sec` (512 by
/// default) after the 10 s grace the transfer is ended with an ERROR and its slot freed.
#[test]
fn a_trickling_transfer_is_ended_after_the_grace() {
    use bootplane::tftp::metrics::{ErrorKind, ErrorLabels};
    let d = tmpdir();
    std::fs::write(d.path().join("big"), pattern(200_000, 4)).unwrap();
    let srv = start_server("127.0.0.1:0", d.path(), TftpConfig::default(), None);
    let c = client_on("127.0.0.1", Duration::from_secs(3));
    c.send_to(&req(1, "big", "octet", &[("blksize", "8")]), srv.addr)
        .unwrap();
    let (p, from) = recv(&c).expect("OACK");
    assert_eq!(p[1], 6, "{p:?}");
    let t0 = Instant::now();
    let mut acked = 0u16;
    let (took, err) = 'transfer: loop {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "still served after 30 s"
        );
        std::thread::sleep(Duration::from_secs(1));
        let ack = acked.to_be_bytes();
        c.send_to(&[0, 4, ack[0], ack[1]], from).unwrap();
        // the next block (skipping retransmissions), or the server's ERROR
        loop {
            let (p, _) = recv(&c).expect("no packet for 3 s");
            if p[1] == 5 {
                break 'transfer (t0.elapsed(), p);
            }
            if p[1] == 3 && u16::from_be_bytes([p[2], p[3]]) == acked + 1 {
                break;
            }
        }
        acked += 1;
    };
    assert!(
        took > Duration::from_millis(9500) && took < Duration::from_secs(14),
        "ended after {took:?}"
    );
    assert!(
        String::from_utf8_lossy(&err).contains("too slow"),
        "{:?}",
        String::from_utf8_lossy(&err)
    );
    let t = Instant::now();
    while srv.metrics.transfers_active.get() != 0 {
        assert!(t.elapsed() < Duration::from_secs(2), "slot not freed");
        std::thread::sleep(Duration::from_millis(20));
    }
    let too_slow = ErrorLabels {
        kind: ErrorKind::TooSlow,
    };
    assert_eq!(srv.metrics.errors.get_or_create(&too_slow).get(), 1);
}

/// Opens a FIFO for writing while the test unwinds: the old server blocked in
/// `open(2)` of the FIFO, and only a writer lets it (and the test's teardown) go on.
struct UnblockFifo(PathBuf);

impl Drop for UnblockFifo {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        use std::os::unix::fs::OpenOptionsExt;
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(3) {
            let _ = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&self.0);
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Issue 17 defect 7: an RRQ for a FIFO in the root blocked the server's runtime in
/// `open(2)` (4 requests stopped both tokio workers). Now only regular files are served:
/// each FIFO request gets an ERROR and the server keeps serving.
#[test]
fn a_fifo_in_the_root_is_refused_and_the_server_keeps_serving() {
    let d = tmpdir();
    std::fs::write(d.path().join("small"), b"hello tftp").unwrap();
    let fifo = d.path().join("pipe");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let srv = start_server(
        "127.0.0.1:0",
        d.path(),
        TftpConfig {
            workers: 1,
            ..TftpConfig::default()
        },
        None,
    );
    let _unblock = UnblockFifo(fifo.clone());
    let clients: Vec<UdpSocket> = (0..4)
        .map(|_| {
            let c = client_on("127.0.0.1", Duration::from_secs(2));
            c.send_to(&req(1, "pipe", "octet", &[]), srv.addr).unwrap();
            c
        })
        .collect();
    for (i, c) in clients.iter().enumerate() {
        let (p, _) = recv(c).unwrap_or_else(|| panic!("FIFO request {i}: no answer in 2 s"));
        assert_eq!(&p[..2], &[0, 5], "FIFO request {i}: {p:?}");
        let code = u16::from_be_bytes([p[2], p[3]]);
        assert!(code == 1 || code == 2, "FIFO request {i}: code {code}");
    }
    let t0 = Instant::now();
    assert_eq!(
        fetch(srv.addr, "127.0.0.1", "small", "octet", &[]),
        b"hello tftp"
    );
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
}

/// Issue 32 (L13): files above `small_file_max_bytes` were memory-mapped, and a mapped
/// file truncated in place under a transfer can raise SIGBUS, which kills the whole
/// process (the engine only let the kernel read the map, whose copy failed with EFAULT
/// and ended the transfer without a word to the client; the netascii conversion read
/// it in user space). Now they are read with `pread`: a 64 MiB file truncated during an
/// octet transfer ends that transfer with an ERROR, and the server keeps serving.
#[test]
fn a_large_file_truncated_during_a_transfer_ends_it_with_an_error() {
    let d = tmpdir();
    let big = d.path().join("big");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    std::fs::write(d.path().join("small"), b"hello tftp").unwrap();
    let srv = start_server("127.0.0.1:0", d.path(), TftpConfig::default(), None);
    let c = client_on("127.0.0.1", Duration::from_secs(3));
    c.send_to(&req(1, "big", "octet", &[("blksize", "8192")]), srv.addr)
        .unwrap();
    let (p, from) = recv(&c).expect("OACK");
    assert_eq!(p[1], 6, "{p:?}");
    // A few blocks in lockstep, then the file is truncated in place.
    for ack in 0u16..4 {
        let a = ack.to_be_bytes();
        c.send_to(&[0, 4, a[0], a[1]], from).unwrap();
        let (p, _) = recv(&c).expect("DATA");
        assert_eq!((p[1], u16::from_be_bytes([p[2], p[3]])), (3, ack + 1));
        assert_eq!(p.len(), 4 + 8192);
    }
    std::fs::OpenOptions::new()
        .write(true)
        .open(&big)
        .unwrap()
        .set_len(0)
        .unwrap();
    c.send_to(&[0, 4, 0, 4], from).unwrap();
    let err = loop {
        let (p, _) = recv(&c).expect("neither DATA nor ERROR after the truncation");
        if p[1] == 5 {
            break p;
        }
        assert_eq!(p[1], 3, "{p:?}");
    };
    assert!(
        String::from_utf8_lossy(&err).contains("file changed"),
        "{:?}",
        String::from_utf8_lossy(&err)
    );
    let t = Instant::now();
    while srv.metrics.transfers_active.get() != 0 {
        assert!(t.elapsed() < Duration::from_secs(2), "slot not freed");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(srv.metrics.transfers_failed.get(), 1);
    // The process lives and serves the next request.
    assert_eq!(
        fetch(srv.addr, "127.0.0.1", "small", "octet", &[]),
        b"hello tftp"
    );
}
