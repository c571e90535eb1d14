//! TFTP throughput and boot-storm benchmark: bootplane vs tftpd-hpa (`in.tftpd -L`)
//! and dnsmasq (`--enable-tftp --port=0`), side by side in one run, on loopback.
//!
//! (a) one large transfer (64 MiB by default) with the best options each server
//!     supports (bootplane: blksize 65464 + windowsize; the peers ignore windowsize);
//!     Each round of (a) also times the loopback ceiling: the same bytes sent as
//!     back-to-back datagrams of DATA's size with no protocol at all (no ACKs), received
//!     the same way, so the output shows how far any server could go here;
//! (a2) the same at blksize 1468 (what a 1500-byte Ethernet path allows);
//! (a3) (a) over a path with a LAN's round-trip time (`--rtt-us`, 100 by default: a
//!     host and its neighbour behind one switch). Loopback has next to no round trip,
//!     so (a) measures only the kernel's copies, where windowsize helps least; this is
//!     the case windowsize exists for (one round trip per window instead of per block).
//!     The kernel here has no `sch_netem`, so the client holds each packet it sends
//!     for one round trip (see `send_after`);
//! (b) a storm of N concurrent clients (1,000 by default) each fetching a 1 MiB file
//!     with firmware-like options (blksize 1468, windowsize 8 offered to everyone).
//! The single-transfer client is written here (tokio); the storm's clients are the
//! boot-storm bench's epoll client engine (`storm_support/tftp_client.rs`). Like a real client it receives DATA straight
//! into its destination (one copy per byte); every byte is checked against the file
//! after the last block, outside the timed span.
//! Prints medians, ratios, failures and server RSS.
//!
//! `cargo bench --bench tftp_bench` (full) or `cargo bench --bench tftp_bench -- --quick`
//! (16 MiB, 200 clients, 3 runs); `-- --storm-only --storm-window 1` runs only (b), with
//! clients in lockstep as PXE ROMs are (the boot-storm bench's TFTP stage). Needs root (in.tftpd and dnsmasq; dnsmasq serves
//! TFTP on 127.0.0.1:69 only).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bootplane::net::raise_rcvbuf;
use tokio::net::UdpSocket;

// Deterministic test files, as the TFTP tests make them.
#[path = "../tests/support/data.rs"]
#[allow(dead_code)] // only `pattern` is used here
mod data;
use data::pattern;

#[path = "support/procfs.rs"]
mod procfs;
#[path = "storm_support/tftp_client.rs"]
mod tftp_client;

struct Opts {
    window: u16,
    big_mib: usize,
    clients: usize,
    storm_kib: usize,
    /// windowsize the storm clients offer (8 by default; 1 = firmware-like lockstep)
    storm_window: u16,
    /// skip (a) and (a2)
    storm_only: bool,
    runs: usize,
    /// the round trip of (a3), in microseconds
    rtt_us: u64,
}

fn parse_opts() -> Opts {
    let args: Vec<String> = std::env::args().collect();
    let mut o = Opts {
        window: 64,
        big_mib: 64,
        clients: 1000,
        storm_kib: 1024,
        runs: 7,
        storm_window: 8,
        storm_only: false,
        rtt_us: 100,
    };
    let val = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
    };
    if args.iter().any(|a| a == "--quick") {
        o = Opts {
            window: 64,
            big_mib: 16,
            clients: 200,
            storm_kib: 1024,
            runs: 3,
            storm_window: 8,
            storm_only: false,
            rtt_us: 100,
        };
    }
    if let Some(v) = val("--big-mib") {
        o.big_mib = v;
    }
    if let Some(v) = val("--window") {
        o.window = v as u16;
    }
    if let Some(v) = val("--clients") {
        o.clients = v;
    }
    if let Some(v) = val("--runs") {
        o.runs = v;
    }
    if let Some(v) = val("--storm-window") {
        o.storm_window = v as u16;
    }
    o.storm_only = args.iter().any(|a| a == "--storm-only");
    if let Some(v) = val("--rtt-us") {
        o.rtt_us = v as u64;
    }
    o
}

// ---------------------------------------------------------------- client

#[derive(Clone, Copy)]
struct ReqOpts {
    max_timeouts: u32,
    blksize: u16,
    windowsize: u16,
    rcvbuf: usize,
    /// Round trip emulated by holding each packet the client sends this long (see (a3)).
    rtt: Duration,
}

/// Negotiated (blksize, windowsize) from an OACK.
fn parse_oack(p: &[u8]) -> (u16, u16) {
    let (mut blk, mut win) = (512u16, 1u16);
    for (k, v) in tftp_client::oack_options(p) {
        match k.as_str() {
            "blksize" => blk = v as u16,
            "windowsize" => win = (v as u16).max(1),
            _ => {}
        }
    }
    (blk, win)
}

/// One datagram scattered into `hdr` (its first 4 bytes) and `body` (the rest), the
/// way a client that writes DATA straight to its destination reads it: one copy per
/// byte, none through a bounce buffer. Returns (datagram length, sender).
async fn recv_scatter(
    sock: &UdpSocket,
    hdr: &mut [u8; 4],
    body: &mut [u8],
) -> std::io::Result<(usize, SocketAddr)> {
    use tokio::io::Interest;
    sock.async_io(Interest::READABLE, || {
        let mut iov = [
            libc::iovec {
                iov_base: hdr.as_mut_ptr().cast(),
                iov_len: 4,
            },
            libc::iovec {
                iov_base: body.as_mut_ptr().cast(),
                iov_len: body.len(),
            },
        ];
        // SAFETY: zeroed sockaddr_storage and msghdr are valid; the iovecs point into
        // live, exclusively borrowed buffers for the duration of the call.
        let mut addr: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_name = (&mut addr as *mut libc::sockaddr_storage).cast();
        msg.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as u32;
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = 2;
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_DONTWAIT) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // the bench only talks IPv4 on loopback
        let sin = unsafe { &*(&addr as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
        let ip = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
        Ok((
            n as usize,
            SocketAddr::from((ip, u16::from_be(sin.sin_port))),
        ))
    })
    .await
}

/// Send `pkt` to `to` once `rtt` has passed: the packet the server gets is then one
/// round trip behind the data that caused it, as on a path with that round-trip time.
/// This kernel has no `sch_netem` (nor fq, whose departure times a BPF program could
/// set), so the round trip cannot be added inside the network; holding the client's
/// packets is what a sender sees of it. The wait spins: sleeping has a resolution of
/// tens of microseconds at best, and this client has a core to itself.
async fn send_after(
    sock: &UdpSocket,
    pkt: &[u8],
    to: SocketAddr,
    rtt: Duration,
) -> std::io::Result<usize> {
    if !rtt.is_zero() {
        let until = Instant::now() + rtt;
        while Instant::now() < until {
            std::hint::spin_loop();
        }
    }
    sock.send_to(pkt, to).await
}

/// The loopback ceiling for (a): `expect` sent as back-to-back UDP datagrams of DATA's
/// size (a 4-byte header + `blksize` bytes, from memory, by a plain thread) with no
/// protocol at all (no ACKs, no windows), received the way [`fetch`] receives DATA.
/// Returns the seconds until the last byte arrived, or None if datagrams were lost.
fn blast(
    rt: &tokio::runtime::Runtime,
    expect: &Arc<Vec<u8>>,
    blksize: usize,
    dest: &mut Vec<u8>,
) -> Option<f64> {
    rt.block_on(async {
        let rx = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        // room for the whole file, so nothing is dropped however far the sender gets ahead
        let _ = raise_rcvbuf(&rx, 2 * expect.len());
        let to = rx.local_addr().unwrap();
        dest.resize(expect.len() + 65536, 0);
        let src = expect.clone();
        let t0 = Instant::now();
        let sender = std::thread::spawn(move || {
            let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            tx.connect(to).unwrap();
            for (i, chunk) in src.chunks(blksize).enumerate() {
                let hdr = [0u8, 3, (i >> 8) as u8, i as u8];
                let iov = [
                    libc::iovec {
                        iov_base: hdr.as_ptr() as *mut _,
                        iov_len: 4,
                    },
                    libc::iovec {
                        iov_base: chunk.as_ptr() as *mut _,
                        iov_len: chunk.len(),
                    },
                ];
                // SAFETY: a zeroed msghdr with two iovecs over live buffers.
                let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
                m.msg_iov = iov.as_ptr() as *mut _;
                m.msg_iovlen = 2;
                let n = unsafe { libc::sendmsg(tx.as_raw_fd(), &m, 0) };
                assert!(n > 0, "blast send: {}", std::io::Error::last_os_error());
            }
        });
        let mut hdr = [0u8; 4];
        let mut off = 0;
        while off < expect.len() {
            let r = tokio::time::timeout(
                Duration::from_secs(1),
                recv_scatter(&rx, &mut hdr, &mut dest[off..]),
            )
            .await;
            match r {
                Ok(Ok((n, _))) => off += n - 4,
                _ => break,
            }
        }
        let secs = t0.elapsed().as_secs_f64();
        sender.join().unwrap();
        (off == expect.len() && dest[..off] == expect[..]).then_some(secs)
    })
}

/// A finished fetch: negotiated blksize and windowsize, and when the last block came.
struct Fetched {
    blksize: usize,
    window: u16,
    done: Instant,
}

/// Fetch `name` into a buffer and check it against `expect` (after the last block,
/// so [`Fetched::done`] times the transfer alone). DATA is received straight into
/// the buffer at its offset; a block that is not the next one is simply overwritten
/// when the right one comes. Gives up after `max_timeouts` consecutive 1 s timeouts
/// (retransmitting the RRQ or the last ACK each time, as firmware does).
async fn fetch(
    server: SocketAddr,
    name: &str,
    o: ReqOpts,
    expect: Arc<Vec<u8>>,
    dest: &mut Vec<u8>,
) -> Result<Fetched, String> {
    let sock = UdpSocket::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    // forced past rmem_max (the bench runs as root), so a whole window fits
    let _ = raise_rcvbuf(&sock, o.rcvbuf);
    let req = tftp_client::rrq(name, o.blksize.into(), o.windowsize);
    send_after(&sock, &req, server, o.rtt)
        .await
        .map_err(|e| e.to_string())?;
    // room for the whole file plus one maximal datagram past its end
    dest.resize(expect.len() + 65536, 0);
    let mut hdr = [0u8; 4];
    let mut peer: Option<SocketAddr> = None;
    let (mut blksize, mut window) = (512usize, 1u16);
    let mut expected: u64 = 1; // next absolute block wanted
    let mut offset = 0usize;
    let mut in_window = 0u16;
    let mut started = false;
    let mut resync_sent_for = 0u64;
    let mut timeouts = 0;
    let tmo = Duration::from_millis(1000);
    loop {
        let r = tokio::time::timeout(tmo, recv_scatter(&sock, &mut hdr, &mut dest[offset..])).await;
        let (n, from) = match r {
            Err(_) => {
                timeouts += 1;
                if timeouts > o.max_timeouts {
                    return Err(format!("timed out at block {expected}"));
                }
                match peer {
                    None => {
                        send_after(&sock, &req, server, o.rtt)
                            .await
                            .map_err(|e| e.to_string())?;
                    }
                    Some(p) => {
                        let ack = ((expected - 1) as u16).to_be_bytes();
                        send_after(&sock, &[0, 4, ack[0], ack[1]], p, o.rtt)
                            .await
                            .map_err(|e| e.to_string())?;
                    }
                }
                continue;
            }
            Ok(Err(e)) => return Err(e.to_string()),
            Ok(Ok(x)) => x,
        };
        if n < 4 {
            continue;
        }
        match peer {
            None => peer = Some(from),
            Some(p) if p != from => continue,
            _ => {}
        }
        let body_len = n - 4;
        let op = u16::from_be_bytes([hdr[0], hdr[1]]);
        match op {
            6 if !started => {
                let mut p = hdr.to_vec();
                p.extend_from_slice(&dest[offset..offset + body_len]);
                let (b, w) = parse_oack(&p);
                blksize = b as usize;
                window = w;
                started = true;
                send_after(&sock, &[0, 4, 0, 0], from, o.rtt)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            3 => {
                started = true;
                let blk = u16::from_be_bytes([hdr[2], hdr[3]]);
                if blk == expected as u16 {
                    timeouts = 0;
                    offset += body_len;
                    expected += 1;
                    in_window += 1;
                    let last = body_len < blksize;
                    if last || in_window >= window {
                        in_window = 0;
                        let ack = ((expected - 1) as u16).to_be_bytes();
                        send_after(&sock, &[0, 4, ack[0], ack[1]], from, o.rtt)
                            .await
                            .map_err(|e| e.to_string())?;
                    }
                    if last {
                        let done = Instant::now();
                        if offset != expect.len() {
                            return Err(format!("short file: {offset} of {}", expect.len()));
                        }
                        if dest[..offset] != expect[..] {
                            let at = dest.iter().zip(expect.iter()).position(|(a, b)| a != b);
                            return Err(format!("wrong content at byte {at:?}"));
                        }
                        return Ok(Fetched {
                            blksize,
                            window,
                            done,
                        });
                    }
                } else if resync_sent_for != expected {
                    // gap or duplicate: ACK what we have once, so the sender resumes there
                    resync_sent_for = expected;
                    in_window = 0;
                    let ack = ((expected - 1) as u16).to_be_bytes();
                    send_after(&sock, &[0, 4, ack[0], ack[1]], from, o.rtt)
                        .await
                        .map_err(|e| e.to_string())?;
                }
            }
            5 => {
                return Err(format!(
                    "server error: {}",
                    String::from_utf8_lossy(&dest[offset..offset + body_len.saturating_sub(1)])
                ))
            }
            _ => {}
        }
    }
}

// ---------------------------------------------------------------- servers

struct Srv {
    name: &'static str,
    addr: SocketAddr,
    child: Child,
}

impl Drop for Srv {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Srv {
    /// Peak and current RSS of the server process (KiB).
    fn rss_kib(&self) -> (u64, u64) {
        let get = |k: &str| procfs::status_kib(self.child.id(), k).unwrap_or(0);
        (get("VmHWM:"), get("VmRSS:"))
    }

    /// Current anonymous and file-backed RSS (KiB).
    fn rss_parts_kib(&self) -> (u64, u64) {
        let get = |k: &str| procfs::status_kib(self.child.id(), k).unwrap_or(0);
        (get("RssAnon:"), get("RssFile:"))
    }

    /// User+system CPU seconds of the server process so far.
    fn cpu_secs(&self) -> f64 {
        procfs::proc_cpu(self.child.id())
    }
}

fn free_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_udp_bound(port: u16) {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(10) {
        if std::net::UdpSocket::bind(("127.0.0.1", port)).is_err() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("server did not bind port {port}");
}

fn start_bootplane(root: &Path) -> Srv {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .arg("__tftp_server")
        .arg(root)
        .stdout(Stdio::piped())
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr: SocketAddr = line.trim().parse().expect("bootplane server address");
    Srv {
        name: "bootplane",
        addr,
        child,
    }
}

fn require(tool: &str) {
    assert!(
        Path::new(tool).exists(),
        "{tool} is missing: install the Debian packages in scripts/test-packages.txt"
    );
}

fn start_tftpd_hpa(root: &Path) -> Srv {
    require("/usr/sbin/in.tftpd");
    let port = free_port();
    let child = Command::new("/usr/sbin/in.tftpd")
        .args([
            "-L",
            "-u",
            "root",
            "-p",
            "-a",
            &format!("127.0.0.1:{port}"),
            "-s",
        ])
        .arg(root)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_udp_bound(port);
    Srv {
        name: "tftpd-hpa",
        addr: format!("127.0.0.1:{port}").parse().unwrap(),
        child,
    }
}

fn start_dnsmasq(root: &Path, max: usize) -> Srv {
    require("/usr/sbin/dnsmasq");
    assert!(
        std::net::UdpSocket::bind("127.0.0.1:69").is_ok(),
        "127.0.0.1:69 is busy; dnsmasq can only serve TFTP on port 69"
    );
    let child = Command::new("/usr/sbin/dnsmasq")
        .args([
            "--keep-in-foreground",
            "--conf-file=/dev/null",
            "--port=0",
            "--enable-tftp",
            "--listen-address=127.0.0.1",
            "--bind-interfaces",
            "--user=root",
            "--pid-file",
            &format!("--tftp-max={max}"),
            "--log-facility=/dev/null",
        ])
        .arg(format!("--tftp-root={}", root.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_udp_bound(69);
    Srv {
        name: "dnsmasq",
        addr: "127.0.0.1:69".parse().unwrap(),
        child,
    }
}

/// Child mode: run the bootplane TFTP server on 127.0.0.1:0 and print its address.
fn serve_child(root: PathBuf) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let cfg = bootplane::tftp::TftpConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            root,
            max_transfers: 4096,
            ..Default::default()
        };
        let server =
            bootplane::tftp::Server::bind(&cfg, Arc::new(bootplane::tftp::Metrics::default()))
                .await
                .unwrap();
        println!("{}", server.local_addr().unwrap());
        let coord = bootplane::shutdown::Coordinator::new();
        let h = coord.handle();
        tokio::spawn(server.run(h));
        // run until the parent closes our stdin
        let mut sink = String::new();
        let _ = tokio::task::spawn_blocking(move || std::io::stdin().read_line(&mut sink)).await;
        coord.drain(Duration::from_secs(2)).await;
    });
}

// ---------------------------------------------------------------- benches

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Interleaved runs (server A, B, C, A, B, C, ...) so load changes on a shared
/// machine hit every server alike. Returns the median seconds per case.
fn singles(
    rt: &tokio::runtime::Runtime,
    cases: &[(&Srv, ReqOpts)],
    expect: &Arc<Vec<u8>>,
    runs: usize,
    mut ceiling: Option<&mut Vec<f64>>,
) -> Vec<(f64, String)> {
    let mut secs: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    let mut neg = vec![String::from("failed"); cases.len()];
    // One destination for every run, its pages faulted in before any clock starts (a
    // fresh 64 MiB buffer per run would time the kernel zero-filling it).
    let mut dest = vec![1u8; expect.len() + 65536];
    for _ in 0..runs {
        for (i, (srv, o)) in cases.iter().enumerate() {
            let t0 = Instant::now();
            let r = rt.block_on(fetch(srv.addr, "big.bin", *o, expect.clone(), &mut dest));
            match r {
                Ok(f) => {
                    secs[i].push((f.done - t0).as_secs_f64());
                    neg[i] = format!("got blksize {} windowsize {}", f.blksize, f.window);
                }
                Err(e) => println!("  {} single transfer FAILED: {e}", srv.name),
            }
        }
        if let Some(c) = ceiling.as_deref_mut() {
            match blast(rt, expect, 65464, &mut dest) {
                Some(secs) => c.push(secs),
                None => println!("  loopback ceiling: the blast lost datagrams"),
            }
        }
    }
    secs.iter_mut()
        .map(|v| if v.is_empty() { f64::NAN } else { median(v) })
        .zip(neg)
        .collect()
}

struct StormResult {
    secs: f64,
    failures: usize,
    /// Timeouts the clients retransmitted after, summed.
    retransmits: u32,
    first_error: Option<String>,
}

fn storm(
    rt: &tokio::runtime::Runtime,
    srv: &Srv,
    clients: usize,
    window: u16,
    expect: &Arc<Vec<u8>>,
) -> StormResult {
    // The clients are driven by the boot-storm bench's epoll client engine (two threads,
    // one recv and one send per block): they share the two cores with the server under
    // test, and a tokio task per client cost them about twice the CPU per block.
    let engines = tftp_client::Engines::start(2);
    let e = expect.clone();
    let check: tftp_client::Check =
        Arc::new(move |off: usize, data: &[u8]| e.get(off..off + data.len()) == Some(data));
    let std::net::SocketAddr::V4(server) = srv.addr else {
        panic!("the bench serves IPv4 only");
    };
    rt.block_on(async {
        let t0 = Instant::now();
        let mut outcomes = Vec::with_capacity(clients);
        for _ in 0..clients {
            let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            sock.set_nonblocking(true).unwrap();
            let _ = raise_rcvbuf(&sock, 212_992);
            let (done, outcome) = tokio::sync::oneshot::channel();
            engines.submit(tftp_client::Job {
                sock,
                server,
                file: "ipxe.efi".into(),
                blksize: 1468,
                windowsize: window,
                // firmware keeps retrying for a long time; so do these clients
                max_timeouts: 60,
                check: check.clone(),
                done,
            });
            outcomes.push(outcome);
        }
        let mut failures = 0;
        let mut retransmits = 0;
        let mut first_error = None;
        for o in outcomes {
            let r = match o.await {
                Ok(out) => {
                    retransmits += out.retransmits;
                    out.result
                }
                Err(_) => Err("client engine stopped".to_string()),
            }
            .and_then(|n| {
                (n == expect.len())
                    .then_some(())
                    .ok_or_else(|| format!("short file: {n} of {}", expect.len()))
            });
            if let Err(e) = r {
                failures += 1;
                first_error.get_or_insert(e);
            }
        }
        StormResult {
            secs: t0.elapsed().as_secs_f64(),
            failures,
            retransmits,
            first_error,
        }
    })
}

/// Run `singles` over `cases` (server, options, label), print a line per case and
/// return the median seconds of each.
fn run_singles<L: std::fmt::Display>(
    rt: &tokio::runtime::Runtime,
    cases: &[(&Srv, ReqOpts, L)],
    expect: &Arc<Vec<u8>>,
    runs: usize,
    mb: f64,
    ceiling: Option<&mut Vec<f64>>,
) -> Vec<f64> {
    let r = singles(
        rt,
        &cases.iter().map(|(s, o, _)| (*s, *o)).collect::<Vec<_>>(),
        expect,
        runs,
        ceiling,
    );
    for ((srv, _, label), (s, n)) in cases.iter().zip(&r) {
        println!(
            "  {:<10} {:>8.3} s  {:>8.1} MB/s   [asked {label}; {n}]",
            srv.name,
            s,
            mb / s
        );
    }
    r.into_iter().map(|x| x.0).collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("__tftp_server") {
        return serve_child(PathBuf::from(&args[2]));
    }
    let o = parse_opts();
    // one socket per transfer on both sides
    unsafe {
        let r = libc::rlimit {
            rlim_cur: 65536,
            rlim_max: 65536,
        };
        libc::setrlimit(libc::RLIMIT_NOFILE, &r);
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let big = Arc::new(pattern(o.big_mib << 20, 1));
    let small = Arc::new(pattern(o.storm_kib << 10, 2));
    std::fs::write(root.join("big.bin"), &*big).unwrap();
    std::fs::write(root.join("ipxe.efi"), &*small).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();

    println!(
        "tftp bench: single {} MiB transfer x{} runs; storm of {} clients x {} KiB",
        o.big_mib, o.runs, o.clients, o.storm_kib
    );
    let bp = start_bootplane(&root);
    let hpa = start_tftpd_hpa(&root);
    let dm = start_dnsmasq(&root, o.clients.max(50) + 50);

    if !o.storm_only {
        // (a) single large transfer, best options per server
        println!(
        "\n(a) single transfer of {} MiB, best options per server (median of {} interleaved runs)",
        o.big_mib, o.runs
    );
        let mb = (o.big_mib << 20) as f64 / 1e6;
        // Room for a whole window of 64 KiB blocks (64 x 64 KiB) on the client side.
        let big_buf = 16 << 20;
        let single = |blksize, windowsize| ReqOpts {
            max_timeouts: 10,
            blksize,
            windowsize,
            rcvbuf: big_buf,
            rtt: Duration::ZERO,
        };
        let w = o.window;
        let cases = [
            (
                &bp,
                single(65464, w),
                format!("blksize 65464 windowsize {w}"),
            ),
            (&hpa, single(65464, 1), "blksize 65464".to_string()),
            (&dm, single(65464, 1), "blksize 65464".to_string()),
            (
                &bp,
                single(65464, 1),
                "blksize 65464 lockstep (reference)".to_string(),
            ),
        ];
        // each round also measures what loopback allows at all: the same bytes with no
        // protocol (interleaved like the servers, so load changes hit it alike)
        let mut ceil = Vec::new();
        let r = run_singles(&rt, &cases, &big, o.runs, mb, Some(&mut ceil));
        println!(
            "  speed ratio bootplane/tftpd-hpa = {:.2}x (goal >= 3x)",
            r[1] / r[0]
        );
        println!("  speed ratio bootplane/dnsmasq   = {:.2}x", r[2] / r[0]);
        if ceil.is_empty() {
            println!("  loopback ceiling: every blast lost datagrams");
        } else {
            let c = median(&mut ceil);
            println!(
                "  loopback ceiling {:>8.3} s  {:>8.1} MB/s   [the same bytes as back-to-back 65468-byte datagrams, no protocol, no ACKs; median of {}]",
                c,
                mb / c,
                ceil.len()
            );
            println!(
                "  3x tftpd-hpa would be {:.3} s: {:.2}x the ceiling; bootplane is at {:.2}x it",
                r[1] / 3.0,
                r[1] / 3.0 / c,
                r[0] / c
            );
        }

        // (a2) the same file at an Ethernet-MTU blksize (1468: what a 1500-byte path allows)
        println!("\n(a2) single transfer of {} MiB at blksize 1468 (Ethernet MTU; median of {} interleaved runs)", o.big_mib, o.runs);
        let cases = [
            (&bp, single(1468, 64), "blksize 1468 windowsize 64"),
            (&hpa, single(1468, 1), "blksize 1468"),
            (&dm, single(1468, 1), "blksize 1468"),
        ];
        let r2 = run_singles(&rt, &cases, &big, o.runs, mb, None);
        println!("  speed ratio bootplane/tftpd-hpa = {:.2}x", r2[1] / r2[0]);
        println!("  speed ratio bootplane/dnsmasq   = {:.2}x", r2[2] / r2[0]);

        // (a3) (a) again over a path with a LAN's round-trip time
        let rtt = Duration::from_micros(o.rtt_us);
        println!(
            "\n(a3) (a) over a path with a {} us round trip, emulated by the client (median of {} interleaved runs)",
            o.rtt_us, o.runs
        );
        let lan = |blksize, windowsize| ReqOpts {
            rtt,
            ..single(blksize, windowsize)
        };
        let cases = [
            (&bp, lan(65464, w), format!("blksize 65464 windowsize {w}")),
            (&hpa, lan(65464, 1), "blksize 65464".to_string()),
            (&dm, lan(65464, 1), "blksize 65464".to_string()),
        ];
        let r3 = run_singles(&rt, &cases, &big, o.runs, mb, None);
        println!(
            "  speed ratio bootplane/tftpd-hpa = {:.2}x (goal >= 3x)",
            r3[1] / r3[0]
        );
        println!("  speed ratio bootplane/dnsmasq   = {:.2}x", r3[2] / r3[0]);
        let (hwm, _) = bp.rss_kib();
        println!("  (bootplane RSS after (a): peak {:.1} MiB, mostly the mapped 64 MiB file's page-cache pages)", hwm as f64 / 1024.0);
    }
    drop(bp);
    drop(hpa);
    // a fresh bootplane process for the storm, so its RSS is the storm's
    let bp = start_bootplane(&root);

    // (b) storm
    let storm_runs = o.runs.min(3);
    println!("\n(b) storm: {} concurrent clients x {} KiB, blksize 1468, windowsize {} offered (median of {})", o.clients, o.storm_kib, o.storm_window, storm_runs);
    let mut totals = Vec::new();
    for srv in [&bp, &dm] {
        let cpu0 = srv.cpu_secs();
        let mut secs = Vec::new();
        let mut fails = 0;
        let mut retx = 0;
        let mut err = None;
        for _ in 0..storm_runs {
            let r = storm(&rt, srv, o.clients, o.storm_window, &small);
            secs.push(r.secs);
            fails += r.failures;
            retx += r.retransmits;
            if err.is_none() {
                err = r.first_error;
            }
        }
        let cpu = (srv.cpu_secs() - cpu0) / storm_runs as f64;
        let m = median(&mut secs);
        let (hwm, _) = srv.rss_kib();
        let (anon, file) = srv.rss_parts_kib();
        println!(
            "  {:<10} total {:>7.3} s  failures {:>4}  client timeouts {:>4}  server CPU {:>6.2} s/run  server RSS peak {:>6.1} MiB (now anon {:.1} + file {:.1} MiB){}",
            srv.name,
            m,
            fails,
            retx,
            cpu,
            hwm as f64 / 1024.0,
            anon as f64 / 1024.0,
            file as f64 / 1024.0,
            err.map(|e| format!("  first error: {e}")).unwrap_or_default()
        );
        totals.push(m);
    }
    println!(
        "  time ratio bootplane/dnsmasq = {:.2} (goal <= 0.5)",
        totals[0] / totals[1]
    );
    drop(bp);
    drop(dm);
}
