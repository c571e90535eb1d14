//! TFTP throughput and boot-storm benchmark: bootplane vs tftpd-hpa (`in.tftpd -L`)
//! and dnsmasq (`--enable-tftp --port=0`), side by side in one run, on loopback.
//!
//! Every comparison is from interleaved runs (the servers in turn, run after run) and
//! is printed as median and spread (min-max) of each side and of the per-run ratio
//! (bootplane's time over the peer's), then every goal, met or not.
//!
//! (a) one large transfer (64 MiB by default) at equal block sizes: each peer is asked
//!     for blksize 65464 once, and what it grants is what both sides are asked for in
//!     its comparison; bootplane with windowsize (the peers ignore it) and in lockstep;
//! (a2) the same at blksize 1468 (what a 1500-byte Ethernet path allows);
//! (a3) (a) over a path with a LAN's round-trip time (`--rtt-us`, 100 by default: a
//!     host and its neighbour behind one switch). Loopback has next to no round trip,
//!     so (a) measures only the kernel's copies, where windowsize helps least; this is
//!     the case windowsize exists for (one round trip per window instead of per block).
//!     The kernel here has no `sch_netem`, so the client holds each packet it sends
//!     for one round trip (see `send_after`);
//! (b) a storm of N concurrent clients (1,000 by default) each fetching a 1 MiB file
//!     with firmware-like options (blksize 1468, windowsize 8 offered; `--storm-window
//!     1` is lockstep, as PXE ROMs are), bootplane and dnsmasq alternating for
//!     `--storm-runs` runs (3). Equal socket buffers: dnsmasq has no option for them, so
//!     bootplane's listening socket keeps the kernel default too (`[tftp]
//!     listen_rcvbuf_bytes = 0`). Prints each server's CPU per DATA block (its
//!     utime + stime over the run, from /proc, over clients x blocks).
//! There is no "loopback ceiling" line any more: a blast of datagrams with no protocol
//! received by one tokio task was beaten by bootplane's windowed transfers, so it was
//! no ceiling.
//! The single-transfer client is written here (tokio); the storm's clients are the
//! boot-storm bench's epoll client engine (`storm_support/tftp_client.rs`). Like a real
//! client it receives DATA straight into its destination (one copy per byte); every
//! byte is checked against the file after the last block, outside the timed span.
//!
//! `TFTP_BENCH_WORKERS=N` sets bootplane's `[tftp] workers` (engine threads; default
//! one per core).
//!
//! `cargo bench --bench tftp_bench` (full) or `cargo bench --bench tftp_bench -- --quick`
//! (16 MiB, 200 clients, 3 runs); `-- --storm-only --storm-window 1` runs only (b), with
//! clients in lockstep as PXE ROMs are (the boot-storm bench's TFTP stage). Needs root
//! (in.tftpd and dnsmasq; dnsmasq serves TFTP on 127.0.0.1:69 only).

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
#[path = "support/rounds.rs"]
mod rounds;
use bootplane::tftp::TftpConfig;
use rounds::{goal, Pair, Stat};
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
    /// interleaved storm runs per server
    storm_runs: usize,
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
        storm_runs: 3,
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
            storm_runs: 3,
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
    if let Some(v) = val("--storm-runs") {
        o.storm_runs = v.max(1);
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

    /// (user, system) CPU seconds of the server process so far.
    fn cpu_split(&self) -> (f64, f64) {
        procfs::cpu_split(self.child.id()).unwrap_or_default()
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

/// bootplane's TFTP server in a child process; `rcvbuf` sets `[tftp]
/// listen_rcvbuf_bytes` (None: the default).
fn start_bootplane(root: &Path, rcvbuf: Option<usize>) -> Srv {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .arg("__tftp_server")
        .arg(root)
        .args(rcvbuf.map(|b| b.to_string()))
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
fn serve_child(root: PathBuf, rcvbuf: Option<usize>, workers: usize) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let cfg = bootplane::tftp::TftpConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            root,
            max_transfers: 4096,
            workers,
            listen_rcvbuf_bytes: rcvbuf.unwrap_or(TftpConfig::default().listen_rcvbuf_bytes),
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

/// Interleaved runs (case A, B, C, A, B, C, ...) so load changes on a shared machine
/// hit every server alike. Returns each case's seconds per run and what it negotiated.
fn singles(
    rt: &tokio::runtime::Runtime,
    cases: &[(&Srv, ReqOpts)],
    expect: &Arc<Vec<u8>>,
    runs: usize,
) -> Vec<(Vec<f64>, String)> {
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
    }
    secs.into_iter().zip(neg).collect()
}

/// The blksize `srv` grants when asked for `ask` (one small fetch).
fn negotiated_blksize(
    rt: &tokio::runtime::Runtime,
    srv: &Srv,
    ask: u16,
    expect: &Arc<Vec<u8>>,
) -> u16 {
    let mut dest = vec![0u8; expect.len() + 65536];
    let o = ReqOpts {
        max_timeouts: 10,
        blksize: ask,
        windowsize: 1,
        rcvbuf: 16 << 20,
        rtt: Duration::ZERO,
    };
    rt.block_on(fetch(srv.addr, "big.bin", o, expect.clone(), &mut dest))
        .map(|f| f.blksize as u16)
        .unwrap_or_else(|e| panic!("{}: probing its blksize: {e}", srv.name))
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

/// Run `singles` over `cases` (server, options, label), print a line per case (median
/// and spread of seconds and MB/s) and return each case's seconds per run.
fn run_singles<L: std::fmt::Display>(
    rt: &tokio::runtime::Runtime,
    cases: &[(&Srv, ReqOpts, L)],
    expect: &Arc<Vec<u8>>,
    runs: usize,
    mb: f64,
) -> Vec<Vec<f64>> {
    let r = singles(
        rt,
        &cases.iter().map(|(s, o, _)| (*s, *o)).collect::<Vec<_>>(),
        expect,
        runs,
    );
    for ((srv, _, label), (s, n)) in cases.iter().zip(&r) {
        let st = Stat::of(s);
        println!(
            "  {:<10} {} s  {:>8.1} MB/s   [asked {label}; {n}]",
            srv.name,
            st.fmt(3),
            mb / st.median
        );
    }
    r.into_iter().map(|x| x.0).collect()
}

/// bootplane's and a peer's seconds per run, from the same interleaved runs; the ratio
/// is bootplane's time over the peer's (0.33 = 3x the peer's speed).
fn speed(what: &str, peer: &str, bp: &[f64], other: &[f64]) -> Pair {
    let mut p = Pair::new(what, "s", "bootplane", peer);
    p.a = bp.to_vec();
    p.b = other.to_vec();
    p
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("__tftp_server") {
        let rcvbuf = args.get(3).and_then(|v| v.parse().ok());
        let workers = std::env::var("TFTP_BENCH_WORKERS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        return serve_child(PathBuf::from(&args[2]), rcvbuf, workers);
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
        "tftp bench: single {} MiB transfer x{} interleaved runs; storm of {} clients x {} KiB x{} interleaved runs; load average {}",
        o.big_mib, o.runs, o.clients, o.storm_kib, o.storm_runs, rounds::load()
    );
    let cmd = format!(
        "cargo bench --bench tftp_bench -- {}",
        args.iter()
            .skip(1)
            .filter(|a| *a != "--bench")
            .cloned()
            .collect::<Vec<_>>()
            .join(" ")
    );
    let mut rows = Vec::new();
    let mut goals: Vec<(String, bool, String)> = Vec::new();
    if !o.storm_only {
        let bp = start_bootplane(&root, None);
        let hpa = start_tftpd_hpa(&root);
        let dm = start_dnsmasq(&root, o.clients.max(50) + 50);
        // Equal block sizes: each peer is compared at the blksize it grants when asked
        // for the largest (both sides are then asked for exactly that).
        let b_hpa = negotiated_blksize(&rt, &hpa, 65464, &big);
        let b_dm = negotiated_blksize(&rt, &dm, 65464, &big);
        println!(
            "\nblksize granted when asked for 65464: tftpd-hpa {b_hpa}, dnsmasq {b_dm}, bootplane {}; each comparison below asks both sides for the peer's",
            negotiated_blksize(&rt, &bp, 65464, &big)
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

        // (a) single large transfer at the peer's largest blksize
        println!(
            "\n(a) single transfer of {} MiB on loopback, equal blksize (median (min-max) of {} interleaved runs)",
            o.big_mib, o.runs
        );
        let cases = [
            (&hpa, single(b_hpa, 1), format!("blksize {b_hpa}")),
            (
                &bp,
                single(b_hpa, w),
                format!("blksize {b_hpa} windowsize {w}"),
            ),
            (&bp, single(b_hpa, 1), format!("blksize {b_hpa} lockstep")),
            (&dm, single(b_dm, 1), format!("blksize {b_dm}")),
            (
                &bp,
                single(b_dm, w),
                format!("blksize {b_dm} windowsize {w}"),
            ),
            (&bp, single(b_dm, 1), format!("blksize {b_dm} lockstep")),
        ];
        let r = run_singles(&rt, &cases, &big, o.runs, mb);
        let pairs = [
            speed(
                &format!(
                    "TFTP (a) {} MiB, blksize {b_hpa}, windowsize {w}: time",
                    o.big_mib
                ),
                "tftpd-hpa",
                &r[1],
                &r[0],
            ),
            speed(
                &format!(
                    "TFTP (a) {} MiB, blksize {b_hpa}, both lockstep: time",
                    o.big_mib
                ),
                "tftpd-hpa",
                &r[2],
                &r[0],
            ),
            speed(
                &format!(
                    "TFTP (a) {} MiB, blksize {b_dm}, windowsize {w}: time",
                    o.big_mib
                ),
                "dnsmasq",
                &r[4],
                &r[3],
            ),
            speed(
                &format!(
                    "TFTP (a) {} MiB, blksize {b_dm}, both lockstep: time",
                    o.big_mib
                ),
                "dnsmasq",
                &r[5],
                &r[3],
            ),
        ];
        for p in &pairs {
            p.print();
        }
        goals.push((
            "(a) >= 3x tftpd-hpa's speed on one transfer (windowsize): time ratio <= 0.33".into(),
            pairs[0].ratio().median <= 1.0 / 3.0,
            format!("{}x", pairs[0].ratio().fmt(2)),
        ));
        rows.push(pairs[0].table_row(&cmd));
        rows.push(pairs[1].table_row(&cmd));

        // (a2) the same file at an Ethernet-MTU blksize (1468: what a 1500-byte path allows)
        println!(
            "\n(a2) single transfer of {} MiB at blksize 1468 (Ethernet MTU; {} interleaved runs)",
            o.big_mib, o.runs
        );
        let cases = [
            (&hpa, single(1468, 1), "blksize 1468".to_string()),
            (&bp, single(1468, w), format!("blksize 1468 windowsize {w}")),
            (&bp, single(1468, 1), "blksize 1468 lockstep".to_string()),
            (&dm, single(1468, 1), "blksize 1468".to_string()),
        ];
        let r2 = run_singles(&rt, &cases, &big, o.runs, mb);
        let pairs = [
            speed(
                "TFTP (a2) blksize 1468, windowsize: time",
                "tftpd-hpa",
                &r2[1],
                &r2[0],
            ),
            speed(
                "TFTP (a2) blksize 1468, both lockstep: time",
                "tftpd-hpa",
                &r2[2],
                &r2[0],
            ),
            speed(
                "TFTP (a2) blksize 1468, both lockstep: time",
                "dnsmasq",
                &r2[2],
                &r2[3],
            ),
        ];
        for p in &pairs {
            p.print();
        }
        rows.push(pairs[1].table_row(&cmd));

        // (a3) (a) again over a path with a LAN's round-trip time
        let rtt = Duration::from_micros(o.rtt_us);
        println!(
            "\n(a3) (a) over a path with a {} us round trip, emulated by the client ({} interleaved runs)",
            o.rtt_us, o.runs
        );
        let lan = |blksize, windowsize| ReqOpts {
            rtt,
            ..single(blksize, windowsize)
        };
        let cases = [
            (&hpa, lan(b_hpa, 1), format!("blksize {b_hpa}")),
            (
                &bp,
                lan(b_hpa, w),
                format!("blksize {b_hpa} windowsize {w}"),
            ),
            (&bp, lan(b_hpa, 1), format!("blksize {b_hpa} lockstep")),
        ];
        let r3 = run_singles(&rt, &cases, &big, o.runs, mb);
        let pairs = [
            speed(
                &format!("TFTP (a3) {} us round trip, windowsize: time", o.rtt_us),
                "tftpd-hpa",
                &r3[1],
                &r3[0],
            ),
            speed(
                &format!("TFTP (a3) {} us round trip, both lockstep: time", o.rtt_us),
                "tftpd-hpa",
                &r3[2],
                &r3[0],
            ),
        ];
        for p in &pairs {
            p.print();
        }
        goals.push((
            "(a3) >= 3x tftpd-hpa's speed over a LAN round trip (windowsize): time ratio <= 0.33"
                .into(),
            pairs[0].ratio().median <= 1.0 / 3.0,
            format!("{}x", pairs[0].ratio().fmt(2)),
        ));
        rows.push(pairs[0].table_row(&cmd));
        let (hwm, _) = bp.rss_kib();
        println!("  (bootplane RSS after (a): peak {:.1} MiB, mostly the mapped 64 MiB file's page-cache pages)", hwm as f64 / 1024.0);
        drop(bp);
        drop(hpa);
        drop(dm);
    }

    // (b) storm. Equal socket buffers: dnsmasq has no option for its sockets' buffers,
    // so bootplane's listening socket keeps the kernel default too (`[tftp]
    // listen_rcvbuf_bytes = 0`), the net.core.rmem_default both get.
    let rmem = std::fs::read_to_string("/proc/sys/net/core/rmem_default")
        .unwrap_or_default()
        .trim()
        .to_string();
    let bp = start_bootplane(&root, Some(0));
    let dm = start_dnsmasq(&root, o.clients.max(50) + 50);
    let blocks = (o.storm_kib << 10) / 1468 + 1;
    let total_blocks = (o.clients * blocks) as f64;
    println!(
        "\n(b) storm: {} concurrent clients x {} KiB, blksize 1468, windowsize {} offered; both listening sockets at the kernel default (net.core.rmem_default {rmem}); {} interleaved runs",
        o.clients, o.storm_kib, o.storm_window, o.storm_runs
    );
    let mut time = Pair::new(
        &format!(
            "TFTP (b) storm {} clients x {} KiB, {}: time",
            o.clients,
            o.storm_kib,
            if o.storm_window == 1 {
                "lockstep".to_string()
            } else {
                format!("windowsize {}", o.storm_window)
            }
        ),
        "s",
        "bootplane",
        "dnsmasq",
    );
    let mut cpu_block = Pair::new(
        "TFTP (b) server CPU per DATA block, storm",
        "us",
        "bootplane",
        "dnsmasq",
    );
    let mut fails = [0usize; 2];
    let mut retx = [0u32; 2];
    let mut errs: [Option<String>; 2] = [None, None];
    for run in 0..o.storm_runs {
        for (k, srv) in [&bp, &dm].into_iter().enumerate() {
            let (u0, s0) = srv.cpu_split();
            let r = storm(&rt, srv, o.clients, o.storm_window, &small);
            let (u1, s1) = srv.cpu_split();
            let cpu = (u1 - u0) + (s1 - s0);
            let us = cpu * 1e6 / total_blocks;
            println!(
                "  run {} {:<10} {:>7.3} s  failures {:>4}  client timeouts {:>5}  server CPU {:>6.2} s = {:.2} us per block (user {:.2}, kernel {:.2})  load {}",
                run + 1,
                srv.name,
                r.secs,
                r.failures,
                r.retransmits,
                cpu,
                us,
                (u1 - u0) * 1e6 / total_blocks,
                (s1 - s0) * 1e6 / total_blocks,
                rounds::load()
            );
            if k == 0 {
                time.a.push(r.secs);
                cpu_block.a.push(us);
            } else {
                time.b.push(r.secs);
                cpu_block.b.push(us);
            }
            fails[k] += r.failures;
            retx[k] += r.retransmits;
            if errs[k].is_none() {
                errs[k] = r.first_error;
            }
        }
    }
    for (k, srv) in [&bp, &dm].into_iter().enumerate() {
        let (hwm, _) = srv.rss_kib();
        println!(
            "  {:<10} failures {} client timeouts {} over all runs, server RSS peak {:.1} MiB{}",
            srv.name,
            fails[k],
            retx[k],
            hwm as f64 / 1024.0,
            errs[k]
                .as_ref()
                .map(|e| format!("  first error: {e}"))
                .unwrap_or_default()
        );
    }
    time.print();
    cpu_block.print();
    goals.push((
        "(b) storm time <= 0.5x dnsmasq's, 0 failures".into(),
        time.ratio().median <= 0.5 && fails[0] == 0,
        format!("{}x per run, {} failures", time.ratio().fmt(2), fails[0]),
    ));
    rows.push(time.table_row(&cmd));
    rows.push(cpu_block.table_row(&cmd));
    drop(bp);
    drop(dm);
    println!();
    for (what, met, detail) in &goals {
        goal(what, *met, detail);
    }
    println!("\ntable rows:");
    for r in rows {
        println!("{r}");
    }
    rounds::print_machine();
}
