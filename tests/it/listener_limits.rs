//! Connection admission on both HTTP listeners (issue 17, defect 2): one client
//! holding many idle or slow connections must not lock anyone else out. Clients bind
//! their sockets to 127.0.0.x source addresses, so each test plays several sources
//! on loopback.

use crate::support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use bootplane::http::server::Limits;
use support::api;
use support::bootplane::Bootplane;
use support::http;
use support::http::wait_closed;

/// Raise the soft open-file limit to at least `want` (up to the hard limit).
fn raise_nofile(want: u64) {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut r), 0);
        if r.rlim_cur < want as libc::rlim_t {
            r.rlim_cur = (want as libc::rlim_t).min(r.rlim_max);
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &r), 0);
        }
    }
    assert!(
        r.rlim_cur >= want as libc::rlim_t,
        "open-file limit {} below the {want} this test needs",
        r.rlim_cur
    );
}

/// These tests write HTTP by hand from chosen loopback sources to test connection
/// admission, which sits beneath TLS: the API is plain HTTP here (`api.tls = false`,
/// allowed on loopback). The TLS handshake under the same watchdog is tested in
/// `tests/api_tls.rs`.
const PLAIN: &[&str] = &["--set", "api.tls=false"];

/// A TCP connection to `addr` from the loopback source address `src`.
fn connect_from(src: &str, addr: SocketAddr) -> TcpStream {
    use nix::sys::socket::{bind, connect, socket, AddressFamily, SockFlag, SockType, SockaddrIn};
    let fd: OwnedFd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .expect("socket");
    let src: std::net::SocketAddrV4 = format!("{src}:0").parse().unwrap();
    bind(fd.as_raw_fd(), &SockaddrIn::from(src)).expect("bind client source");
    let SocketAddr::V4(dst) = addr else {
        panic!("ipv4 only")
    };
    connect(fd.as_raw_fd(), &SockaddrIn::from(dst)).expect("connect");
    // SAFETY: `fd` is an open, connected socket whose ownership moves to the stream.
    unsafe { TcpStream::from_raw_fd(std::os::fd::IntoRawFd::into_raw_fd(fd)) }
}

/// One GET from `src` (Connection: close): Ok((status, body)) or why not, within `limit`.
fn get_from(
    src: &str,
    addr: SocketAddr,
    path: &str,
    token: Option<&str>,
    limit: Duration,
) -> Result<(u16, String), String> {
    let mut s = connect_from(src, addr);
    s.set_read_timeout(Some(limit)).unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n").as_bytes(),
    )
    .map_err(|e| format!("write: {e}"))?;
    let mut out = Vec::new();
    let start = Instant::now();
    let mut buf = [0u8; 8192];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) => return Err(format!("read after {:?}: {e}", start.elapsed())),
        }
        if start.elapsed() > limit {
            return Err(format!("no complete reply within {limit:?}"));
        }
    }
    let text = String::from_utf8_lossy(&out).into_owned();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status in {text:?}"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|x| x.1)
        .unwrap_or("")
        .to_string();
    Ok((code, body))
}

/// Whether the server has already closed `s` (without waiting).
fn is_closed(s: &TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut b = [0u8; 1];
    let r = match s.peek(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    };
    s.set_nonblocking(false).unwrap();
    r
}

fn api_addr(b: &Bootplane) -> SocketAddr {
    format!("127.0.0.1:{}", b.api_port).parse().unwrap()
}

/// The API's `/metrics` text, fetched from a source no test floods.
fn api_metrics(b: &Bootplane) -> String {
    get_from(
        "127.0.0.3",
        api_addr(b),
        "/metrics",
        Some(&b.token),
        Duration::from_secs(3),
    )
    .expect("/metrics")
    .1
}

/// Read the watch stream `w` until an event naming `name` arrives.
fn read_event(w: &mut TcpStream, name: &str, what: &str) {
    let needle = format!("\"{name}\"");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains(&needle) {
        let n = w.read(&mut buf).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(n > 0, "{what} closed");
        got.extend_from_slice(&buf[..n]);
    }
}

/// `GET /boot.ipxe` on the boot listener at `addr` from `src`.
fn boot_ipxe_from(src: &str, addr: SocketAddr) -> Result<(u16, String), String> {
    get_from(src, addr, "/boot.ipxe", None, Duration::from_secs(3))
}

/// The attack: ~1,100 idle connections from one address (more than the API's
/// connection limit) locked `/healthz` out for as long as they were held.
#[test]
fn api_idle_flood_from_one_source_does_not_lock_out_healthz() {
    raise_nofile(4096);
    let b = Bootplane::start(PLAIN);
    let addr = api_addr(&b);
    let flood: Vec<TcpStream> = (0..1100).map(|_| connect_from("127.0.0.2", addr)).collect();
    let t = Instant::now();
    let r = get_from("127.0.0.3", addr, "/healthz", None, Duration::from_secs(3));
    assert_eq!(
        r.as_ref().map(|x| x.0),
        Ok(200),
        "/healthz from another source while one source holds 1,100 idle connections: {r:?}"
    );
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    // The flooding source itself gets in too: its own oldest idle connections make room.
    let r = get_from("127.0.0.2", addr, "/healthz", None, Duration::from_secs(3));
    assert_eq!(r.as_ref().map(|x| x.0), Ok(200), "same source: {r:?}");
    // The server keeps at most its per-source share of them open.
    std::thread::sleep(Duration::from_millis(300));
    let open = flood.iter().filter(|s| !is_closed(s)).count();
    assert!(open <= 128, "{open} of the flood's connections still open");
    let metrics = api_metrics(&b);
    assert!(
        metrics.contains("bootplane_api_connections_evicted_total"),
        "{metrics}"
    );
    drop(flood);
}

/// Open a watch from `src`; returns the stream once the response head has arrived.
fn open_watch(src: &str, b: &Bootplane) -> Result<TcpStream, String> {
    let mut s = connect_from(src, api_addr(b));
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    s.write_all(
        format!(
            "GET {}?watch=true HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\r\n",
            api::SERVERS,
            b.token
        )
        .as_bytes(),
    )
    .map_err(|e| e.to_string())?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut buf) {
            Ok(0) => return Err("closed before a response".into()),
            Ok(_) => head.push(buf[0]),
            Err(e) => return Err(e.to_string()),
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    if !head.starts_with("HTTP/1.1 200") {
        return Err(head);
    }
    Ok(s)
}

/// Long-lived watches are responses in progress: never evicted as idle, but counted
/// against their source's share; the share's next connection is refused at once
/// while other sources are still served.
#[test]
fn api_watches_count_against_the_per_source_share() {
    raise_nofile(4096);
    let b = Bootplane::start(PLAIN);
    let addr = api_addr(&b);
    // The default share: 128 of the 512 connections.
    let mut watches = Vec::new();
    for i in 0..128 {
        watches.push(open_watch("127.0.0.4", &b).unwrap_or_else(|e| panic!("watch {i}: {e}")));
    }
    // The next one from that source has no idle connection to make room with.
    let mut extra = connect_from("127.0.0.4", addr);
    let _ = extra.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    let took = wait_closed(&mut extra, Duration::from_secs(3));
    assert!(
        took.is_some_and(|t| t < Duration::from_secs(2)),
        "connection over the source's share not refused promptly ({took:?})"
    );
    let r = get_from("127.0.0.3", addr, "/healthz", None, Duration::from_secs(3));
    assert_eq!(r.map(|x| x.0), Ok(200));
    // Every watch still streams.
    let (code, v) = b.call(
        "POST",
        api::SERVERS,
        Some(&api::server("w-1", serde_json::json!({}), "Recycle")),
    );
    assert_eq!(code, 201, "{v}");
    for (i, w) in watches.iter_mut().enumerate() {
        read_event(w, "w-1", &format!("watch {i}"));
    }
}

/// A slowloris head (a header line now and then, never the end) is closed after the
/// header read timeout (default 5 s) although bytes keep coming.
#[test]
fn api_slow_head_is_closed_after_the_header_timeout() {
    let b = Bootplane::start(PLAIN);
    let mut s = connect_from("127.0.0.5", api_addr(&b));
    s.set_read_timeout(Some(Duration::from_millis(700)))
        .unwrap();
    let start = Instant::now();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let mut closed = None;
    let mut buf = [0u8; 256];
    while start.elapsed() < Duration::from_secs(9) {
        match s.read(&mut buf) {
            Ok(0) => {
                closed = Some(start.elapsed());
                break;
            }
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => {
                closed = Some(start.elapsed());
                break;
            }
        }
        if s.write_all(b"X-Slow: 1\r\n").is_err() {
            closed = Some(start.elapsed());
            break;
        }
    }
    let took = closed.expect("slow head still open after 9 s");
    assert!(
        took >= Duration::from_secs(4) && took < Duration::from_secs(8),
        "closed after {took:?}"
    );
}

/// The boot listener: one source holding every slot idle no longer locks out others
/// (or itself): the oldest idle connection of the busiest source makes room.
#[test]
fn boot_listener_one_source_cannot_hold_every_slot() {
    raise_nofile(4096);
    let srv = http::start(
        Limits {
            max_connections: 64,
            header_read_timeout: Duration::from_secs(8),
            idle_timeout: Duration::from_secs(8),
            ..Limits::default()
        },
        |_| {},
    );
    let held: Vec<TcpStream> = (0..100)
        .map(|_| connect_from(http::MACHINE_IP, srv.addr))
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let r = boot_ipxe_from(http::OTHER_IP, srv.addr);
    assert_eq!(
        r.as_ref().map(|x| x.0),
        Ok(200),
        "boot.ipxe from another source while one holds every slot: {r:?}"
    );
    let r = boot_ipxe_from(http::MACHINE_IP, srv.addr);
    assert_eq!(r.as_ref().map(|x| x.0), Ok(200), "same source: {r:?}");
    drop(held);
}

/// With small timeouts set through `[api]`: an idle connection (new, or between
/// keep-alive requests) and a slow head are closed, while a watch that outlives both
/// keeps streaming.
#[test]
fn api_idle_timeout_closes_idle_connections_but_not_watches() {
    let b = Bootplane::start(&[
        PLAIN[0],
        PLAIN[1],
        "--set",
        "api.idle_timeout_ms=1500",
        "--set",
        "api.header_read_timeout_ms=300",
    ]);
    let addr = api_addr(&b);
    let mut watch = open_watch("127.0.0.6", &b).unwrap();
    let mut idle = connect_from("127.0.0.6", addr);
    let took = wait_closed(&mut idle, Duration::from_secs(5)).expect("idle connection closed");
    assert!(took >= Duration::from_millis(1400), "{took:?}");
    // Keep-alive: one request, then idle.
    let mut ka = connect_from("127.0.0.6", addr);
    ka.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    ka.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut buf = [0u8; 512];
    let n = ka.read(&mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    let took = wait_closed(&mut ka, Duration::from_secs(5)).expect("keep-alive connection closed");
    assert!(took >= Duration::from_millis(1300), "{took:?}");
    // A head that never completes: the header timeout, well before the idle one.
    let mut slow = connect_from("127.0.0.6", addr);
    slow.write_all(b"GET /healthz HTTP/1.1\r\n").unwrap();
    let took = wait_closed(&mut slow, Duration::from_secs(4)).expect("slow head closed");
    assert!(took < Duration::from_millis(1200), "{took:?}");
    // The watch outlived all of that and still streams.
    let (code, v) = b.call(
        "POST",
        api::SERVERS,
        Some(&api::server("w-2", serde_json::json!({}), "Recycle")),
    );
    assert_eq!(code, 201, "{v}");
    read_event(&mut watch, "w-2", "watch");
    let metrics = api_metrics(&b);
    assert!(
        metrics.contains("bootplane_api_connections_timed_out_total 3"),
        "{metrics}"
    );
}

/// The boot listener's per-source share: busy connections (downloads the client does
/// not read) count against it, the next one from that source is refused at once,
/// and another source is still served.
#[test]
fn boot_listener_refuses_a_source_over_its_share() {
    let srv = http::start(
        Limits {
            max_connections: 64,
            max_connections_per_source: 8,
            header_read_timeout: Duration::from_secs(8),
            idle_timeout: Duration::from_secs(8),
            ..Limits::default()
        },
        |_| {},
    );
    std::fs::File::create(srv.dir.path().join("assets/big.bin"))
        .unwrap()
        .set_len(256 << 20)
        .unwrap();
    let held: Vec<TcpStream> = (0..8)
        .map(|_| {
            let mut s = connect_from(http::MACHINE_IP, srv.addr);
            s.write_all(b"GET /assets/big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
                .unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut extra = connect_from(http::MACHINE_IP, srv.addr);
    let _ = extra.write_all(b"GET /boot.ipxe HTTP/1.1\r\nHost: x\r\n\r\n");
    let took = wait_closed(&mut extra, Duration::from_secs(3));
    assert!(
        took.is_some_and(|t| t < Duration::from_secs(2)),
        "a ninth connection from the source was not refused ({took:?})"
    );
    assert!(srv
        .metrics
        .encode()
        .contains("bootplane_http_connections_refused_per_source_total 1"));
    let r = boot_ipxe_from(http::OTHER_IP, srv.addr);
    assert_eq!(r.map(|x| x.0), Ok(200));
    drop(held);
}

/// A body trickled after its head (the head complete, so the connection is busy and
/// no head or idle timeout applies) is answered 408 once `api.body_read_timeout_ms`
/// passes, and the connection is released.
#[test]
fn api_slow_body_gets_408_after_the_body_timeout() {
    let b = Bootplane::start(&[PLAIN[0], PLAIN[1], "--set", "api.body_read_timeout_ms=1000"]);
    let mut s = connect_from("127.0.0.7", api_addr(&b));
    let head = format!(
        "POST /api/v1/namespaces/default/secrets HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{{",
        b.token
    );
    s.write_all(head.as_bytes()).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let start = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while start.elapsed() < Duration::from_secs(8) {
        let _ = s.write_all(b" ");
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                got.extend_from_slice(&buf[..n]);
                if got.windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
            Err(_) => {}
        }
    }
    let took = start.elapsed();
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 408"), "after {took:?}: {text:?}");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "{took:?}"
    );
}

/// A TCP connection from `src` to `addr` with a 1 KiB receive buffer (set before the
/// connect, so the window it offers stays that small): a client that never reads holds
/// a download open with almost nothing sent.
fn connect_tiny_window(src: &str, addr: SocketAddr) -> TcpStream {
    use nix::sys::socket::{
        bind, connect, setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType, SockaddrIn,
    };
    let fd: OwnedFd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .expect("socket");
    setsockopt(&fd, sockopt::RcvBuf, &1024).expect("SO_RCVBUF");
    let src: std::net::SocketAddrV4 = format!("{src}:0").parse().unwrap();
    bind(fd.as_raw_fd(), &SockaddrIn::from(src)).expect("bind client source");
    let SocketAddr::V4(dst) = addr else {
        panic!("ipv4 only")
    };
    connect(fd.as_raw_fd(), &SockaddrIn::from(dst)).expect("connect");
    // SAFETY: `fd` is an open, connected socket whose ownership moves to the stream.
    unsafe { TcpStream::from_raw_fd(std::os::fd::IntoRawFd::into_raw_fd(fd)) }
}

/// The value of the boot listener's metric line starting with `name` and containing
/// every one of `labels` (0 when absent).
fn boot_metric(srv: &http::Srv, name: &str, labels: &[&str]) -> u64 {
    srv.metrics
        .encode()
        .lines()
        .filter(|l| l.starts_with(name) && labels.iter().all(|x| l.contains(x)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// Issue 32 (review M6), the issue's own figures: 8 loopback sources x 512
/// connections, each a GET of a 64 MiB asset with a 1 KiB receive buffer and never
/// read, held all 4,096 slots of the boot listener, and a ninth client's `GET
/// /boot.ipxe` was refused ("connection limit reached and no connection is idle")
/// until the write stall timeout (60 s). Now a response below
/// `slow_send_rate_bytes_per_sec` after the grace (1 s here, the minimum rate off so
/// that only eviction can make room) is evicted for the newcomer, which boots.
#[test]
fn boot_listener_slow_readers_from_8_sources_cannot_lock_a_machine_out() {
    let (sources, per_source) = (8usize, 512usize);
    raise_nofile(2 * (sources * per_source) as u64 + 512);
    let grace = Duration::from_secs(1);
    let srv = http::start(
        Limits {
            send_rate_grace: grace,
            min_send_rate: 0,
            ..Limits::default()
        },
        |_| {},
    );
    assert_eq!(
        (
            Limits::default().max_connections,
            Limits::default().max_connections_per_source
        ),
        (sources * per_source, per_source),
        "the defaults this test fills"
    );
    std::fs::File::create(srv.dir.path().join("assets/big.bin"))
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let mut held = Vec::with_capacity(sources * per_source);
    for i in 0..sources {
        let src = format!("127.0.0.{}", 10 + i);
        for _ in 0..per_source {
            let mut s = connect_tiny_window(&src, srv.addr);
            s.write_all(b"GET /assets/big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
                .unwrap();
            held.push(s);
        }
    }
    // Every slot holds a download in progress (its head answered, its body stalled).
    let t = Instant::now();
    let busy = |srv: &http::Srv| {
        boot_metric(
            srv,
            "bootplane_http_requests_total",
            &["route=\"assets\"", "code=\"200\""],
        )
    };
    while busy(&srv) < (sources * per_source) as u64 {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "only {} downloads started",
            busy(&srv)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let all_busy = Instant::now();
    assert_eq!(
        boot_metric(&srv, "bootplane_http_connections_open", &[]),
        (sources * per_source) as u64
    );
    // A machine boots: refused at most until the first stalled downloads are past
    // their grace, then let in.
    let mut tries = Vec::new();
    let ok = loop {
        let r = boot_ipxe_from("127.0.0.30", srv.addr);
        if r.as_ref().is_ok_and(|x| x.0 == 200) {
            break all_busy.elapsed();
        }
        tries.push(r);
        assert!(
            all_busy.elapsed() < grace + Duration::from_secs(8),
            "GET /boot.ipxe still refused {:?} after every slot was busy: {:?}",
            all_busy.elapsed(),
            tries.last()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(boot_metric(&srv, "bootplane_http_connections_evicted", &[]) >= 1);
    eprintln!(
        "{} slow readers from {sources} sources; /boot.ipxe served {ok:?} after all were busy ({} refused tries)",
        held.len(),
        tries.len()
    );
    drop(held);
}

/// A response the client reads slower than `min_send_rate_bytes_per_sec` (here it
/// never reads) is ended after the grace plus the time its first bytes paid for,
/// whether or not the listener is full.
#[test]
fn boot_listener_ends_a_download_below_the_minimum_rate() {
    let srv = http::start(
        Limits {
            send_rate_grace: Duration::from_secs(1),
            min_send_rate: 1 << 20,
            ..Limits::default()
        },
        |_| {},
    );
    std::fs::File::create(srv.dir.path().join("assets/big.bin"))
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let mut s = connect_tiny_window(http::MACHINE_IP, srv.addr);
    s.write_all(b"GET /assets/big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let t = Instant::now();
    while boot_metric(&srv, "bootplane_http_connection_errors", &[]) == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "a never-read download still open after {:?}",
            t.elapsed()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        t.elapsed() >= Duration::from_millis(900),
        "{:?}",
        t.elapsed()
    );
    // The client sees the response end short: the connection closes.
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut got = 0usize;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    assert!(got < 64 << 20, "the whole file arrived");
    assert_eq!(
        boot_ipxe_from(http::OTHER_IP, srv.addr).map(|x| x.0),
        Ok(200)
    );
}
