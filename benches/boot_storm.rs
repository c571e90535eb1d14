//! Boot storm: N simulated machines boot at once through bootplane, and the same storm
//! goes to dnsmasq (DHCP + TFTP) + nginx (HTTP) in the same run.
//!
//! ```sh
//! cargo bench --bench boot_storm                          # 1,000 machines
//! cargo bench --bench boot_storm -- --machines 10000
//! cargo bench --bench boot_storm -- --quick               # 100 machines
//! cargo bench --bench boot_storm -- --firmware windowsize  # firmware offering windowsize 8
//! cargo bench --bench boot_storm -- --machines 500 --ramp 2 --only bootplane
//! cargo bench --bench boot_storm -- --client-threads 2 --client-tftp-threads 2  # the defaults
//! cargo bench --bench boot_storm -- --cluster              # appliances on etcd, below
//! cargo bench --bench boot_storm -- --cluster --quick      # 100 machines, 1 round
//! ```
//!
//! `--cluster` (issue 21, `storm_support/cluster.rs`) runs, in one invocation and
//! interleaved round by round (`--rounds`, default 3): 1 appliance on the embedded
//! store; 2 appliances on a 3-member etcd both answering the machines' segment; the
//! same 2 with the `metal` leader SIGKILLed when half of the machines have powered on.
//! It prints failures by stage, time to complete, median and spread per scenario and
//! of the per-round ratio, and every goal, met or not. A machine whose boot fails at a
//! stage may start over from DHCP, as firmware retries its boot sequence
//! (`--boot-retries N`, default 0: a failed stage is a failed machine).
//!
//! Each machine is a tokio task in this process that behaves like PXE firmware and
//! iPXE (its TFTP transfer is driven by a small epoll client engine, see
//! `storm_support/tftp_client.rs`, because this process shares the two cores with the
//! server under test and a tokio task per lockstep block cost it about twice the CPU):
//! DHCP DORA (broadcast flag, option 93 arch 0, option 97 UUID, PXEClient class;
//! DISCOVER/REQUEST retransmitted after 4, 8, 16, 32 s as the PXE spec says; a NAK
//! starts over with a DISCOVER, as often as it takes, as firmware does) → TFTP
//! read of the boot file named in the ACK, a 1 MiB file (`blksize 1468`, `tsize`,
//! lockstep like firmware, or offering windowsize 8 with `--firmware windowsize`; 1 s
//! timeout doubling to 8 s, 6 timeouts = failure) → iPXE's own DHCP DORA, as the
//! loaded iPXE does before anything else (stage `ipxe dhcp`: the firmware's options
//! plus option 61 client id, option 77 user class `iPXE` and option 175 with iPXE's
//! features; iPXE's timers 1, 2, 4, 8 s; a NAK starts over), whose ACK gives the
//! address the machine uses from then on and, from bootplane, a claimed machine's
//! script token in option 224 → HTTP
//! GET of `/boot.ipxe`, its `chain` URL with iPXE's `${...}` variables filled in
//! (`${224:uristring}` with the ACK's option 224 percent-encoded, empty when absent),
//! and the `ignition.config.url` of the per-machine script's kernel line (one
//! keep-alive connection, reconnecting with 1/2/4 s backoff on errors). Both sides get
//! the same two DHCP exchanges per machine (dnsmasq answers iPXE's as any other; its
//! ACK has no option 224 and nginx's static scripts need none), so the comparison stays
//! like for like. Every socket after DHCP is bound to the machine's leased address,
//! because bootplane checks identity by the source address ↔ lease ↔ MAC ↔ server.
//!
//! Network: per side, two namespaces (unique names, deleted on drop even on panic)
//! joined by a veth; server 10.199.64.1/18, pool 10.199.64.10 onwards. The pool's
//! addresses are put on the client veth up front (one `ip -b` batch, untimed) and the
//! server side gets permanent neighbour entries for them: the kernel's ARP table is
//! shared by all namespaces and limited by the host's `gc_thresh3` (1024 here), which a
//! 10,000-machine storm would overflow; permanent entries do not count. The machines
//! still learn their address only from DHCP and use only that one.
//!
//! Arrivals: machine i powers on at `ramp × i / N` (default ramp N/1000 s, i.e. 1,000
//! machines/s, the rate of a few racks coming back from a power loss; `--ramp 0` is
//! all at once). Nothing else bounds concurrency unless `--concurrency C` is given.
//!
//! bootplane: `bootplane serve` in its namespace, authoritative DHCP on the veth with
//! the pool, TFTP, HTTP; N Servers registered by MAC + UUID, one ignition Secret, N
//! ServerClaims by serverRef; the storm starts once every boot configuration is Ready.
//! Peer: dnsmasq (`--dhcp-authoritative`, `--dhcp-boot`, `--enable-tftp`, lease max
//! and tftp-max raised to fit the storm) and nginx (2 workers, static `/boot.ipxe`,
//! per-machine scripts by MAC and Ignition files generated for the N machines).
//!
//! Both sides log no per-request lines (bootplane at warn; dnsmasq `--quiet-dhcp
//! --quiet-tftp`; nginx without an access log, with `open_file_cache`).
//!
//! The sides alternate, bootplane then the peer, for `--rounds` rounds (default 3),
//! each round on fresh namespaces. Prints per side and round: machines booted,
//! failures by stage, completion time (first power on → last Ignition), p50/p99
//! per-machine boot time, server peak RSS (VmHWM, summed over the peer's processes)
//! and CPU time during the storm; then the median and spread (min-max) of each figure
//! and of the per-round ratio, and every goal, met or not.

use std::collections::HashMap;
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use dhcproto::v4::{self, DhcpOption, Message, MessageType, OptionCode};
use dhcproto::{Decodable, Decoder, Encodable, Encoder};
use http_body_util::{BodyExt, Empty};
use serde_json::{json, Value};
use tokio::net::{TcpSocket, UdpSocket};
use tokio::sync::mpsc;

const SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 199, 64, 1);
const PREFIX: u8 = 18;
const POOL_START: u32 = 0x0AC7_400A; // 10.199.64.10
const POOL_MAX: usize = 16_000; // stays inside 10.199.64.0/18
const HTTP_PORT: u16 = 8080;
const BOOT_FILE: &str = "storm.bin";
const BOOT_FILE_SIZE: usize = 1 << 20;
const BLKSIZE: usize = 1468;
const IGNITION: &str = r#"{"ignition":{"version":"3.4.0"},"storage":{"files":[{"path":"/etc/motd","contents":{"source":"data:,booted%20in%20a%20storm"}}]}}"#;

static COUNTER: AtomicUsize = AtomicUsize::new(0);

// ---------------------------------------------------------------- arguments

struct Args {
    machines: usize,
    ramp: f64,
    concurrency: usize,
    only: Option<String>,
    timeout: u64,
    client_threads: usize,
    tftp_threads: usize,
    /// `--cluster`: the cluster scenarios instead of bootplane vs the peer.
    cluster: bool,
    /// Rounds of each cluster scenario.
    rounds: usize,
    /// Whole-boot retries per machine (default 0).
    boot_retries: Option<u32>,
    /// The TFTP windowsize the simulated firmware offers (1: lockstep, the default;
    /// `--firmware windowsize`: 8, as firmware with RFC 7440 support).
    tftp_window: u16,
}

fn args() -> Args {
    let a: Vec<String> = std::env::args().collect();
    let get = |name: &str| {
        a.iter()
            .position(|x| x == name)
            .and_then(|i| a.get(i + 1))
            .cloned()
    };
    let quick = a.iter().any(|x| x == "--quick");
    let machines: usize = get("--machines")
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 100 } else { 1000 });
    assert!(
        (1..=POOL_MAX - 100).contains(&machines),
        "--machines must be within 1..={}",
        POOL_MAX - 100
    );
    Args {
        machines,
        ramp: get("--ramp")
            .and_then(|v| v.parse().ok())
            .unwrap_or(machines as f64 / 1000.0),
        concurrency: get("--concurrency")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        only: get("--only"),
        timeout: get("--timeout").and_then(|v| v.parse().ok()).unwrap_or(900),
        client_threads: get("--client-threads")
            .and_then(|v| v.parse().ok())
            .unwrap_or(2),
        tftp_threads: get("--client-tftp-threads")
            .and_then(|v| v.parse().ok())
            .unwrap_or(2),
        cluster: a.iter().any(|x| x == "--cluster"),
        rounds: get("--rounds")
            .and_then(|v| v.parse().ok())
            .unwrap_or(if quick && a.iter().any(|x| x == "--cluster") {
                1
            } else {
                3
            })
            .max(1),
        boot_retries: get("--boot-retries").and_then(|v| v.parse().ok()),
        tftp_window: match get("--firmware").as_deref() {
            None | Some("lockstep") => 1,
            Some("windowsize") => 8,
            Some(other) => panic!("--firmware {other:?}: lockstep or windowsize"),
        },
    }
}

// ---------------------------------------------------------------- namespaces

// Namespaces (unique names, deleted with what runs in them on drop) and child
// processes (killed on drop), shared with the integration tests (tests/support).
#[path = "../tests/support/mod.rs"]
mod support;
use support::netns::{enter_thread, veth_pair, Netns};
use support::process::Proc;

#[path = "support/procfs.rs"]
mod procfs;
#[path = "support/rounds.rs"]
mod rounds;
use rounds::{goal, Pair};
#[path = "storm_support/tftp_client.rs"]
mod tftp_client;
// `--cluster`: the storm against appliances on etcd (issue 21).
#[path = "storm_support/cluster.rs"]
mod cluster;
use procfs::{children, clk_tck};

/// What the storm needs of a namespace beyond the shared test helper's.
trait StormNetns {
    /// Run `ip -n NS -b FILE` over `lines`.
    fn ip_batch(&self, lines: &str, dir: &Path);
}

impl StormNetns for Netns {
    fn ip_batch(&self, lines: &str, dir: &Path) {
        let f = dir.join(format!("batch-{}", COUNTER.fetch_add(1, Ordering::SeqCst)));
        std::fs::write(&f, lines).unwrap();
        self.ip(&["-b", f.to_str().unwrap()]);
    }
}

/// Server and client namespaces joined by veth `vs` ↔ `vc`, with the pool prepared.
struct Lab {
    server: Netns,
    client: Netns,
    pool: Vec<Ipv4Addr>,
}

impl Lab {
    fn new(pool_size: usize, dir: &Path) -> Lab {
        let (server, client) = veth_pair("s", "c", &format!("{SERVER_IP}/{PREFIX}"));
        client.ip(&[
            "route",
            "add",
            &format!("10.199.64.0/{PREFIX}"),
            "dev",
            "vc",
        ]);
        let out = client.ip(&["-o", "link", "show", "vc"]);
        let i = out.find("link/ether ").expect("link/ether") + 11;
        let vc_mac = out[i..i + 17].to_string();
        let pool: Vec<Ipv4Addr> = (0..pool_size as u32)
            .map(|k| Ipv4Addr::from(POOL_START + k))
            .collect();
        let mut addrs = String::new();
        let mut neigh = String::new();
        for a in &pool {
            addrs.push_str(&format!("addr add {a}/32 dev vc\n"));
            neigh.push_str(&format!(
                "neigh replace {a} lladdr {vc_mac} dev vs nud permanent\n"
            ));
        }
        client.ip_batch(&addrs, dir);
        server.ip_batch(&neigh, dir);
        Lab {
            server,
            client,
            pool,
        }
    }

    fn range(&self) -> (Ipv4Addr, Ipv4Addr) {
        (self.pool[0], *self.pool.last().unwrap())
    }
}

// ---------------------------------------------------------------- process stats

#[derive(Clone, Copy, Default)]
struct Usage {
    hwm_kib: u64,
    cpu_ticks: u64,
}

fn proc_usage(pid: u32) -> Option<Usage> {
    Some(Usage {
        cpu_ticks: procfs::cpu_ticks(pid)?,
        hwm_kib: procfs::status_kib(pid, "VmHWM:").unwrap_or(0),
    })
}

/// Summed usage of `pids` and their children (nginx workers).
fn usage_of(pids: &[u32]) -> Usage {
    let mut all: Vec<u32> = pids.to_vec();
    for p in pids {
        all.extend(children(*p));
    }
    let mut u = Usage::default();
    for p in all {
        if let Some(x) = proc_usage(p) {
            u.hwm_kib += x.hwm_kib;
            u.cpu_ticks += x.cpu_ticks;
        }
    }
    u
}

/// Sample the summed RSS of `pids` (and children) until `stop`; returns the peak.
fn sample_rss(pids: Vec<u32>, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut peak = 0;
        let mut all = pids.clone();
        for p in &pids {
            all.extend(children(*p));
        }
        while !stop.load(Ordering::SeqCst) {
            peak = peak.max(
                all.iter()
                    .map(|p| procfs::status_kib(*p, "VmRSS:").unwrap_or(0))
                    .sum(),
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        peak
    })
}

// ---------------------------------------------------------------- machines

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Stage {
    Dhcp,
    Tftp,
    /// iPXE's own DHCP exchange (user class `iPXE`), whose ACK carries the script token.
    IpxeDhcp,
    Chain,
    Script,
    Ignition,
    /// Still booting when the side's `--timeout` ended (not a failure of a stage).
    Unfinished,
}

const STAGES: [Stage; 7] = [
    Stage::Dhcp,
    Stage::Tftp,
    Stage::IpxeDhcp,
    Stage::Chain,
    Stage::Script,
    Stage::Ignition,
    Stage::Unfinished,
];

impl Stage {
    fn name(self) -> &'static str {
        match self {
            Stage::Dhcp => "dhcp",
            Stage::Tftp => "tftp",
            Stage::IpxeDhcp => "ipxe dhcp",
            Stage::Chain => "boot.ipxe",
            Stage::Script => "script",
            Stage::Ignition => "ignition",
            Stage::Unfinished => "unfinished at --timeout",
        }
    }
}

#[derive(Clone, Copy)]
struct Machine {
    idx: usize,
    mac: [u8; 6],
    uuid: [u8; 16],
}

impl Machine {
    fn new(idx: usize) -> Machine {
        let i = idx as u32;
        let mac = [0x02, 0x5b, 0x00, (i >> 16) as u8, (i >> 8) as u8, i as u8];
        let mut uuid = [0u8; 16];
        uuid[..4].copy_from_slice(&0x5b5b_0000u32.to_be_bytes());
        uuid[6] = 0x40;
        uuid[8] = 0x80;
        uuid[12..].copy_from_slice(&i.to_be_bytes());
        Machine { idx, mac, uuid }
    }
    fn name(&self) -> String {
        format!("storm-{:05}", self.idx)
    }
    fn mac_colon(&self) -> String {
        self.mac
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":")
    }
    fn mac_hyp(&self) -> String {
        self.mac_colon().replace(':', "-")
    }
    fn uuid_str(&self) -> String {
        let h = hex::encode(self.uuid);
        format!(
            "{}-{}-{}-{}-{}",
            &h[..8],
            &h[8..12],
            &h[12..16],
            &h[16..20],
            &h[20..]
        )
    }
}

struct Result1 {
    ok: bool,
    failed: Option<(Stage, String)>,
    total: Duration,
    stage: [Duration; 6],
    retransmits: u32,
    /// Attempts that failed (by stage) before a whole-boot retry (`--boot-retries`).
    absorbed: Vec<(Stage, String)>,
    /// The address the machine booted with.
    ip: Option<Ipv4Addr>,
    /// When its boot ended (booted or failed).
    ended: Instant,
}

/// Replies to the shared port-68 socket, by xid.
type Waiters = Arc<Mutex<HashMap<u32, mpsc::UnboundedSender<Message>>>>;

fn dhcp_socket() -> std::io::Result<UdpSocket> {
    use nix::sys::socket::{
        bind, setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType, SockaddrIn,
    };
    let fd = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    setsockopt(&fd, sockopt::Broadcast, &true)?;
    setsockopt(&fd, sockopt::BindToDevice, &std::ffi::OsString::from("vc"))?;
    let _ = bootplane::net::raise_rcvbuf(&fd, 16 << 20);
    let _ = setsockopt(&fd, sockopt::SndBufForce, &(4 << 20));
    bind(fd.as_raw_fd(), &SockaddrIn::new(0, 0, 0, 0, 68))?;
    UdpSocket::from_std(std::net::UdpSocket::from(fd))
}

struct Ctx {
    dhcp: Arc<UdpSocket>,
    tftp: tftp_client::Engines,
    /// A block's first and last bytes are the boot file's at their offsets.
    check: tftp_client::Check,
    waiters: Waiters,
    expect_file: &'static str,
    /// windowsize offered in the TFTP read request (1: lockstep).
    tftp_window: u16,
}

/// Which DHCP client speaks: the PXE firmware (ROM) or the iPXE it loaded over TFTP.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Client {
    Firmware,
    Ipxe,
}

impl Client {
    /// Seconds to wait for a reply before each (re)transmission: the PXE spec's 4, 8,
    /// 16, 32 for firmware, iPXE's default 1, 2, 4, 8 (`config/dhcp.h`).
    fn timers(self) -> [u64; 4] {
        match self {
            Client::Firmware => [4, 8, 16, 32],
            Client::Ipxe => [1, 2, 4, 8],
        }
    }
}

/// The DHCP option carrying a claimed machine's script token, which `boot.ipxe` sends
/// on as `${224:uristring}`.
use bootplane::dhcp::core::SCRIPT_TOKEN_OPTION;

/// iPXE's `uristring` setting type: every byte but RFC 3986 unreserved characters
/// percent-encoded.
fn uristring(raw: &[u8]) -> String {
    let mut out = String::with_capacity(raw.len());
    for &b in raw {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn dhcp_msg(
    m: &Machine,
    client: Client,
    xid: u32,
    mtype: MessageType,
    req: Option<(Ipv4Addr, Ipv4Addr)>,
) -> Vec<u8> {
    let mut msg = Message::default();
    msg.set_opcode(v4::Opcode::BootRequest)
        .set_htype(v4::HType::Eth)
        .set_xid(xid)
        .set_flags(v4::Flags::default().set_broadcast())
        .set_chaddr(&m.mac);
    let o = msg.opts_mut();
    o.insert(DhcpOption::MessageType(mtype));
    let mut wanted = vec![
        OptionCode::SubnetMask,
        OptionCode::Router,
        OptionCode::DomainNameServer,
        OptionCode::Hostname,
        OptionCode::VendorExtensions,
        OptionCode::ClassIdentifier,
        OptionCode::TFTPServerName,
        OptionCode::BootfileName,
    ];
    match client {
        Client::Firmware => {
            o.insert(DhcpOption::MaxMessageSize(1464));
        }
        Client::Ipxe => {
            // As iPXE's DHCP (net/udp/dhcp.c): the ROM's options plus a client
            // identifier, user class `iPXE` and its features encapsulated in option
            // 175 (PXE extensions, HTTP, TFTP, DNS, bzImage), asking for 175 too.
            o.insert(DhcpOption::MaxMessageSize(1472));
            o.insert(DhcpOption::ClientIdentifier(
                std::iter::once(1u8).chain(m.mac).collect(),
            ));
            o.insert(DhcpOption::UserClass(b"iPXE".to_vec()));
            o.insert(DhcpOption::Unknown(v4::UnknownOption::new(
                OptionCode::Unknown(175),
                vec![0x10, 1, 2, 0x13, 1, 1, 0x15, 1, 1, 0x17, 1, 1, 0x18, 1, 1],
            )));
            wanted.push(OptionCode::Unknown(175));
        }
    }
    o.insert(DhcpOption::ParameterRequestList(wanted));
    o.insert(DhcpOption::ClientSystemArchitecture(
        v4::Architecture::X86_Bios,
    ));
    o.insert(DhcpOption::ClientNetworkInterface(1, 2, 1));
    o.insert(DhcpOption::ClientMachineIdentifier(
        std::iter::once(0u8).chain(m.uuid).collect(),
    ));
    o.insert(DhcpOption::ClassIdentifier(
        b"PXEClient:Arch:00000:UNDI:002001".to_vec(),
    ));
    if let Some((ip, sid)) = req {
        o.insert(DhcpOption::RequestedIpAddress(ip));
        o.insert(DhcpOption::ServerIdentifier(sid));
    }
    let mut buf = Vec::with_capacity(400);
    msg.encode(&mut Encoder::new(&mut buf))
        .expect("encoding dhcp");
    buf
}

/// One DHCP exchange step: send `pkt`, wait for a reply of `want` (or NAK) with the
/// client's retransmission schedule ([`Client::timers`]). With `chosen` (a REQUEST to
/// that server) only replies carrying its server identifier count, as iPXE and
/// busybox udhcpc take them.
async fn exchange(
    ctx: &Ctx,
    rx: &mut mpsc::UnboundedReceiver<Message>,
    (pkt, client): (&[u8], Client),
    (want, chosen): (MessageType, Option<Ipv4Addr>),
    retx: &mut u32,
) -> Result<Message, String> {
    let dst = SocketAddr::from((Ipv4Addr::BROADCAST, 67));
    let timers = client.timers();
    for (k, secs) in timers.into_iter().enumerate() {
        if k > 0 {
            *retx += 1;
        }
        ctx.dhcp
            .send_to(pkt, dst)
            .await
            .map_err(|e| format!("send: {e}"))?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        loop {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Err(_) => break,
                Ok(None) => return Err("receiver gone".into()),
                Ok(Some(m)) if chosen.is_some_and(|c| server_of(&m) != Some(c)) => continue,
                Ok(Some(m)) => match m.opts().msg_type() {
                    Some(t) if t == want => return Ok(m),
                    Some(MessageType::Nak) => return Err("nak".into()),
                    _ => continue,
                },
            }
        }
    }
    Err(format!(
        "no {want:?} after 4 tries ({} s)",
        timers.iter().sum::<u64>()
    ))
}

/// A reply's server identifier (option 54).
fn server_of(m: &Message) -> Option<Ipv4Addr> {
    match m.opts().get(OptionCode::ServerIdentifier) {
        Some(DhcpOption::ServerIdentifier(s)) => Some(*s),
        _ => None,
    }
}

struct Lease {
    ip: Ipv4Addr,
    tftp: Ipv4Addr,
    file: String,
    /// Option 224 of the ACK: the script token bootplane gives a claimed machine's iPXE.
    token: Option<Vec<u8>>,
}

/// A DORA of `client` (the firmware, or iPXE after the TFTP stage) for machine `m`.
async fn dhcp(ctx: &Ctx, m: &Machine, client: Client, retx: &mut u32) -> Result<Lease, String> {
    let xid = 0x5b00_0000 ^ (m.idx as u32) ^ rand::random::<u32>() & 0x00ff_0000;
    let (tx, mut rx) = mpsc::unbounded_channel();
    ctx.waiters.lock().unwrap().insert(xid, tx);
    let r = async {
        // PXE firmware answers a NAK by starting over with a DISCOVER, as often as it
        // takes (each exchange has the PXE timers, 4, 8, 16, 32 s, and gives up after
        // them; iPXE's are 1, 2, 4, 8 s); the side's `--timeout` bounds the whole storm.
        loop {
            let offer = exchange(
                ctx,
                &mut rx,
                (
                    &dhcp_msg(m, client, xid, MessageType::Discover, None),
                    client,
                ),
                (MessageType::Offer, None),
                retx,
            )
            .await?;
            let sid = match offer.opts().get(OptionCode::ServerIdentifier) {
                Some(DhcpOption::ServerIdentifier(s)) => *s,
                _ => return Err("offer without server identifier".into()),
            };
            let req = dhcp_msg(
                m,
                client,
                xid,
                MessageType::Request,
                Some((offer.yiaddr(), sid)),
            );
            let want = (MessageType::Ack, Some(sid));
            match exchange(ctx, &mut rx, (&req, client), want, retx).await {
                Ok(ack) => {
                    let file = match ack.opts().get(OptionCode::BootfileName) {
                        Some(DhcpOption::BootfileName(f)) => String::from_utf8_lossy(f)
                            .trim_end_matches('\0')
                            .to_string(),
                        _ => String::from_utf8_lossy(ack.fname().unwrap_or_default())
                            .trim_end_matches('\0')
                            .to_string(),
                    };
                    let tftp = match ack.opts().get(OptionCode::TFTPServerName) {
                        Some(DhcpOption::TFTPServerName(n)) => String::from_utf8_lossy(n)
                            .trim_end_matches('\0')
                            .parse()
                            .ok(),
                        _ => None,
                    }
                    .filter(|_| ack.siaddr().is_unspecified())
                    .unwrap_or(if ack.siaddr().is_unspecified() {
                        sid
                    } else {
                        ack.siaddr()
                    });
                    let token = match ack.opts().get(OptionCode::Unknown(SCRIPT_TOKEN_OPTION)) {
                        Some(DhcpOption::Unknown(u)) => Some(u.data().to_vec()),
                        _ => None,
                    };
                    return Ok(Lease {
                        ip: ack.yiaddr(),
                        tftp,
                        file,
                        token,
                    });
                }
                Err(e) if e == "nak" => {
                    *retx += 1;
                    continue;
                }
                Err(e) => return Err(e),
            }
        }
    }
    .await;
    ctx.waiters.lock().unwrap().remove(&xid);
    r
}

fn expected_byte(off: usize) -> u8 {
    (off.wrapping_mul(31) ^ (off >> 9)) as u8
}

/// Fetch the boot file through the TFTP client engine (see `storm_support/tftp_client.rs`):
/// a socket bound to the leased address, `blksize` 1468 with `tsize`, in lockstep unless
/// the firmware mode offers a windowsize (`--firmware windowsize`).
async fn tftp(ctx: &Ctx, lease: &Lease, retx: &mut u32) -> Result<usize, String> {
    let sock = std::net::UdpSocket::bind(SocketAddrV4::new(lease.ip, 0))
        .map_err(|e| format!("bind {}: {e}", lease.ip))?;
    sock.set_nonblocking(true).map_err(|e| e.to_string())?;
    let (done, outcome) = tokio::sync::oneshot::channel();
    ctx.tftp.submit(tftp_client::Job {
        sock,
        server: SocketAddrV4::new(lease.tftp, 69),
        file: lease.file.clone(),
        blksize: BLKSIZE,
        windowsize: ctx.tftp_window,
        max_timeouts: 6,
        check: ctx.check.clone(),
        done,
    });
    let out = outcome
        .await
        .map_err(|_| "tftp client engine stopped".to_string())?;
    *retx += out.retransmits;
    out.result
}

/// An HTTP/1.1 client bound to the machine's address, keeping one connection.
struct Http {
    local: Ipv4Addr,
    conn: Option<hyper::client::conn::http1::SendRequest<Empty<Bytes>>>,
}

fn split_url(url: &str) -> Option<(SocketAddr, String, String)> {
    let rest = url.strip_prefix("http://")?;
    let (hostport, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let addr: SocketAddr = if hostport.contains(':') {
        hostport.parse().ok()?
    } else {
        format!("{hostport}:80").parse().ok()?
    };
    Some((addr, hostport.to_string(), path.to_string()))
}

impl Http {
    async fn connect(&mut self, addr: SocketAddr) -> Result<(), String> {
        let s = TcpSocket::new_v4().map_err(|e| e.to_string())?;
        s.bind(SocketAddr::from((self.local, 0)))
            .map_err(|e| format!("bind {}: {e}", self.local))?;
        let stream = tokio::time::timeout(Duration::from_secs(10), s.connect(addr))
            .await
            .map_err(|_| "connect timed out".to_string())?
            .map_err(|e| format!("connect: {e}"))?;
        let _ = stream.set_nodelay(true);
        let (send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| format!("handshake: {e}"))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        self.conn = Some(send);
        Ok(())
    }

    async fn get_once(&mut self, url: &str) -> Result<(u16, Bytes), String> {
        let (addr, host, path) = split_url(url).ok_or_else(|| format!("bad url {url}"))?;
        let ready = match self.conn.as_mut() {
            Some(c) => c.ready().await.is_ok(),
            None => false,
        };
        if !ready {
            self.conn = None;
            self.connect(addr).await?;
        }
        let req = http::Request::get(path)
            .header(http::header::HOST, host)
            .header(http::header::USER_AGENT, "iPXE/1.21.1 (storm)")
            .body(Empty::<Bytes>::new())
            .map_err(|e| e.to_string())?;
        let conn = self.conn.as_mut().expect("connected");
        let fut = async {
            let resp = conn
                .send_request(req)
                .await
                .map_err(|e| format!("request: {e}"))?;
            let code = resp.status().as_u16();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| format!("body: {e}"))?
                .to_bytes();
            Ok::<_, String>((code, body))
        };
        match tokio::time::timeout(Duration::from_secs(30), fut).await {
            Ok(Ok(x)) => Ok(x),
            Ok(Err(e)) => {
                self.conn = None;
                Err(e)
            }
            Err(_) => {
                self.conn = None;
                Err("request timed out".into())
            }
        }
    }

    /// GET with retries on transport errors and 5xx (1, 2, 4 s backoff).
    async fn get(&mut self, url: &str, retx: &mut u32) -> Result<Bytes, String> {
        let mut last = String::new();
        for (k, backoff) in [0u64, 1, 2, 4].into_iter().enumerate() {
            if k > 0 {
                *retx += 1;
                tokio::time::sleep(Duration::from_secs(backoff)).await;
            }
            match self.get_once(url).await {
                Ok((200, b)) => return Ok(b),
                Ok((c, b)) if c < 500 => {
                    return Err(format!(
                        "status {c}: {}",
                        String::from_utf8_lossy(&b).trim()
                    ))
                }
                Ok((c, _)) => last = format!("status {c}"),
                Err(e) => last = e,
            }
        }
        Err(last)
    }
}

/// Where a machine's HTTP requests go: one fixed base URL, or the address that
/// answered its DHCP (next-server) on the boot port (several appliances on a segment).
#[derive(Clone)]
enum HttpBase {
    Fixed(String),
    FromLease,
}

/// One machine's boot, retried from DHCP after a failed stage up to `retries` times
/// (firmware that finds no boot program tries its boot sequence again); the failures
/// of the attempts before are kept as `absorbed`.
async fn boot(ctx: Arc<Ctx>, m: Machine, base: HttpBase, retries: u32) -> Result1 {
    let start = Instant::now();
    let mut absorbed = Vec::new();
    let mut retx = 0;
    let mut attempt = 0;
    loop {
        let mut r = boot_once(&ctx, &m, &base).await;
        retx += r.retransmits;
        match &r.failed {
            Some(failed) if attempt < retries => {
                absorbed.push(failed.clone());
                attempt += 1;
            }
            _ => {
                r.total = start.elapsed();
                r.ended = Instant::now();
                r.retransmits = retx;
                r.absorbed = absorbed;
                return r;
            }
        }
    }
}

async fn boot_once(ctx: &Ctx, m: &Machine, base: &HttpBase) -> Result1 {
    let start = Instant::now();
    let mut stage = [Duration::ZERO; 6];
    let mut retx = 0u32;
    let mut t = Instant::now();
    let mut lap = |s: Stage, stage: &mut [Duration; 6]| {
        stage[s as usize] = t.elapsed();
        t = Instant::now();
    };
    let fail = |s: Stage, e: String, stage: [Duration; 6], retx: u32| Result1 {
        ok: false,
        failed: Some((s, e)),
        total: start.elapsed(),
        stage,
        retransmits: retx,
        absorbed: Vec::new(),
        ip: None,
        ended: Instant::now(),
    };
    let lease = match dhcp(ctx, m, Client::Firmware, &mut retx).await {
        Ok(l) => l,
        Err(e) => return fail(Stage::Dhcp, e, stage, retx),
    };
    if lease.file != ctx.expect_file {
        return fail(
            Stage::Dhcp,
            format!("boot file {:?}", lease.file),
            stage,
            retx,
        );
    }
    lap(Stage::Dhcp, &mut stage);
    match tftp(ctx, &lease, &mut retx).await {
        Ok(n) if n == BOOT_FILE_SIZE => {}
        Ok(n) => return fail(Stage::Tftp, format!("got {n} bytes"), stage, retx),
        Err(e) => return fail(Stage::Tftp, e, stage, retx),
    }
    lap(Stage::Tftp, &mut stage);
    // The loaded iPXE configures the NIC again with its own DORA (user class `iPXE`),
    // on both sides: bootplane's ACK carries the claimed machine's script token in
    // option 224; from here on the machine uses the address of this ACK, as iPXE does.
    let ipxe = match dhcp(ctx, m, Client::Ipxe, &mut retx).await {
        Ok(l) => l,
        Err(e) => return fail(Stage::IpxeDhcp, e, stage, retx),
    };
    lap(Stage::IpxeDhcp, &mut stage);
    // iPXE chains the file its ACK names: the answering appliance's script URL.
    let http_base = match base {
        HttpBase::Fixed(b) => b.clone(),
        HttpBase::FromLease => match ipxe.file.strip_suffix("/boot.ipxe") {
            Some(b) if b.starts_with("http://") => b.to_string(),
            _ => format!("http://{}:{HTTP_PORT}", ipxe.tftp),
        },
    };
    let mut http = Http {
        local: ipxe.ip,
        conn: None,
    };
    let chain = match http.get(&format!("{http_base}/boot.ipxe"), &mut retx).await {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(e) => return fail(Stage::Chain, e, stage, retx),
    };
    let Some(next) = chain
        .lines()
        .filter(|l| l.trim_start().starts_with("chain "))
        .flat_map(|l| l.split_whitespace())
        .find(|w| w.starts_with("http"))
    else {
        return fail(Stage::Chain, "no chain url".into(), stage, retx);
    };
    // iPXE's settings expansion for the variables the scripts use.
    let next = next
        .replace("${uuid:uristring}", &m.uuid_str())
        .replace("${uuid}", &m.uuid_str())
        .replace("${net0/mac:hexhyp}", &m.mac_hyp())
        .replace("${net0/mac}", &m.mac_colon())
        .replace("${buildarch:uristring}", "i386")
        .replace("${platform:uristring}", "pcbios")
        .replace(
            "${224:uristring}",
            &uristring(ipxe.token.as_deref().unwrap_or_default()),
        );
    lap(Stage::Chain, &mut stage);
    let script = match http.get(&next, &mut retx).await {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(e) => return fail(Stage::Script, e, stage, retx),
    };
    let Some(ign_url) = script
        .lines()
        .filter(|l| l.starts_with("kernel "))
        .flat_map(|l| l.split_whitespace())
        .find_map(|w| w.strip_prefix("ignition.config.url="))
        .map(str::to_string)
    else {
        let first: String = script.chars().take(200).collect();
        return fail(
            Stage::Script,
            format!("no ignition url in script: {first}"),
            stage,
            retx,
        );
    };
    lap(Stage::Script, &mut stage);
    match http.get(&ign_url, &mut retx).await {
        Ok(b) if b.windows(10).any(|w| w == b"\"ignition\"") => {}
        Ok(_) => {
            return fail(
                Stage::Ignition,
                "not an ignition config".into(),
                stage,
                retx,
            )
        }
        Err(e) => return fail(Stage::Ignition, e, stage, retx),
    }
    lap(Stage::Ignition, &mut stage);
    Result1 {
        ok: true,
        failed: None,
        total: start.elapsed(),
        stage,
        retransmits: retx,
        absorbed: Vec::new(),
        ip: Some(ipxe.ip),
        ended: Instant::now(),
    }
}

struct StormResult {
    results: Vec<Result1>,
    completion: Duration,
    /// CPU time of this process (the simulated machines) during the storm.
    client_cpu: f64,
}

fn self_cpu() -> f64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Something to do when half of the machines have powered on (the machine N/2's
/// power-on runs it): the cluster scenario's SIGKILL of an appliance.
type AtHalf = Box<dyn FnOnce() + Send>;

/// Run the storm from inside the client namespace.
fn storm(a: &StormArgs, at_half: Option<AtHalf>) -> StormResult {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(a.client_threads)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        let sock = Arc::new(dhcp_socket().expect("binding the client's port 68 on vc"));
        let waiters: Waiters = Arc::default();
        let rx_task = {
            let (sock, waiters) = (sock.clone(), waiters.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 2048];
                loop {
                    let Ok((n, _)) = sock.recv_from(&mut buf).await else {
                        continue;
                    };
                    let Ok(msg) = Message::decode(&mut Decoder::new(&buf[..n])) else {
                        continue;
                    };
                    if msg.opcode() != v4::Opcode::BootReply {
                        continue;
                    }
                    if let Some(tx) = waiters.lock().unwrap().get(&msg.xid()) {
                        let _ = tx.send(msg);
                    }
                }
            })
        };
        let ctx = Arc::new(Ctx {
            dhcp: sock,
            tftp: tftp_client::Engines::start(a.tftp_threads),
            check: Arc::new(
                |off: usize, data: &[u8]| match (data.first(), data.last()) {
                    (Some(f), Some(l)) => {
                        *f == expected_byte(off) && *l == expected_byte(off + data.len() - 1)
                    }
                    _ => true,
                },
            ),
            waiters,
            expect_file: BOOT_FILE,
            tftp_window: a.tftp_window,
        });
        let sem = Arc::new(tokio::sync::Semaphore::new(if a.concurrency == 0 {
            tokio::sync::Semaphore::MAX_PERMITS
        } else {
            a.concurrency
        }));
        let cpu0 = self_cpu();
        let t0 = tokio::time::Instant::now();
        let t0s = Instant::now();
        let mut handles = Vec::with_capacity(a.machines);
        let at_half = Arc::new(Mutex::new(at_half));
        for i in 0..a.machines {
            let at = t0 + Duration::from_secs_f64(a.ramp * i as f64 / a.machines as f64);
            let (ctx, sem, base) = (ctx.clone(), sem.clone(), a.http_base.clone());
            let hook = (i == a.machines / 2).then(|| at_half.clone());
            let retries = a.boot_retries;
            handles.push(tokio::spawn(async move {
                tokio::time::sleep_until(at).await;
                if let Some(f) = hook.and_then(|h| h.lock().unwrap().take()) {
                    f();
                }
                let _permit = sem.acquire_owned().await.expect("semaphore");
                boot(ctx, Machine::new(i), base, retries).await
            }));
        }
        let deadline = t0 + Duration::from_secs(a.timeout);
        let mut results = Vec::with_capacity(a.machines);
        for h in handles {
            match tokio::time::timeout_at(deadline, h).await {
                Ok(Ok(r)) => results.push(r),
                Ok(Err(e)) => results.push(Result1 {
                    ok: false,
                    failed: Some((Stage::Dhcp, format!("task: {e}"))),
                    total: Duration::ZERO,
                    stage: [Duration::ZERO; 6],
                    retransmits: 0,
                    absorbed: Vec::new(),
                    ip: None,
                    ended: Instant::now(),
                }),
                Err(_) => results.push(Result1 {
                    ok: false,
                    failed: Some((Stage::Unfinished, "storm timed out".into())),
                    total: Duration::ZERO,
                    stage: [Duration::ZERO; 6],
                    retransmits: 0,
                    absorbed: Vec::new(),
                    ip: None,
                    ended: Instant::now(),
                }),
            }
        }
        let completion = t0s.elapsed();
        rx_task.abort();
        StormResult {
            results,
            completion,
            client_cpu: self_cpu() - cpu0,
        }
    })
}

#[derive(Clone)]
struct StormArgs {
    machines: usize,
    ramp: f64,
    concurrency: usize,
    http_base: HttpBase,
    timeout: u64,
    client_threads: usize,
    tftp_threads: usize,
    /// Whole-boot retries after a failed stage (0: a failed stage fails the machine).
    boot_retries: u32,
    /// windowsize the firmware offers (1: lockstep).
    tftp_window: u16,
}

// ---------------------------------------------------------------- the two sides

fn boot_file(dir: &Path) -> PathBuf {
    let d = dir.join("tftp");
    std::fs::create_dir_all(&d).unwrap();
    let data: Vec<u8> = (0..BOOT_FILE_SIZE).map(expected_byte).collect();
    std::fs::write(d.join(BOOT_FILE), data).unwrap();
    d
}

fn wait_until(limit: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

struct Side {
    name: &'static str,
    /// Highest summed VmRSS sampled every 100 ms during the storm.
    storm_rss_kib: u64,
    storm: StormResult,
    usage_before: Usage,
    usage_after: Usage,
    note: String,
}

/// The image catalog the storm's boot configurations use (`os-image:latest`, tiny
/// kernel and initrd with their SHA-256), under `dir/images`.
fn storm_images(dir: &Path) -> PathBuf {
    let images = dir.join("images");
    std::fs::create_dir_all(images.join("os")).unwrap();
    let mut entries = String::new();
    for (role, body) in [
        ("kernel", &b"storm kernel\n"[..]),
        ("initrd", &b"storm initrd\n"[..]),
    ] {
        use sha2::Digest;
        std::fs::write(images.join("os").join(role), body).unwrap();
        entries.push_str(&format!(
            "{role} = {{ path = \"os/{role}\", sha256 = \"{}\" }}\n",
            hex::encode(sha2::Sha256::digest(body))
        ));
    }
    std::fs::write(
        images.join("catalog.toml"),
        format!("[[image]]\nref = \"os-image:latest\"\n{entries}"),
    )
    .unwrap();
    images
}

/// A storm appliance's configuration: API on 127.0.0.1:9090, boot HTTP on every
/// address (public URL on `ip`), authoritative DHCP on `iface` over `range`, TFTP of
/// `tftp_root`, the `test` power driver.
fn bootplane_config(
    state: &Path,
    iface: &str,
    ip: Ipv4Addr,
    (lo, hi): (Ipv4Addr, Ipv4Addr),
    tftp_root: &Path,
    images: &Path,
) -> String {
    format!(
        "state_dir = \"{state}\"\n\
         [api]\nlisten = \"127.0.0.1:9090\"\n\
         [http]\nlisten = \"0.0.0.0:{HTTP_PORT}\"\npublic_url = \"http://{ip}:{HTTP_PORT}\"\n\
         [dhcp]\nenabled = true\ninterface = \"{iface}\"\nmode = \"authoritative\"\nrange = \"{lo}-{hi}\"\nprefix_len = {PREFIX}\n\
         [dhcp.boot]\nbios = \"{BOOT_FILE}\"\n\
         [tftp]\nenabled = true\nlisten = \"0.0.0.0:69\"\nroot = \"{tftp}\"\n\
         [boot]\nimages_dir = \"{images}\"\n\
         [controller]\npower_driver = \"test\"\n",
        state = state.display(),
        tftp = tftp_root.display(),
        images = images.display(),
    )
}

fn run_bootplane(a: &Args, dir: &Path) -> Side {
    let n = a.machines;
    let pool = n + (n / 10).max(64);
    let lab = Lab::new(pool, dir);
    let (lo, hi) = lab.range();
    let images = storm_images(dir);
    let tftp_root = boot_file(dir);
    let state = dir.join("state");
    let cfg = dir.join("bootplane.toml");
    std::fs::write(
        &cfg,
        bootplane_config(&state, "vs", SERVER_IP, (lo, hi), &tftp_root, &images),
    )
    .unwrap();
    let log_path = dir.join("bootplane.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut c = lab.server.cmd(env!("CARGO_BIN_EXE_bootplane"));
    c.args(["serve", "--config", cfg.to_str().unwrap()])
        // Per-request logging off on both sides (dnsmasq --quiet-*, nginx no access
        // log): warnings only, plus the two start-up lines the bench waits for.
        .env("RUST_LOG", "warn,bootplane::dhcp=info,bootplane::tftp=info")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log);
    let child = Proc {
        child: c.spawn().expect("starting bootplane"),
    };
    let pid = child.child.id();
    let read_log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    wait_until(Duration::from_secs(60), "bootplane to listen", || {
        let l = read_log();
        l.contains("dhcp server listening") && l.contains("tftp server listening")
    });
    let token_path = state.join("api-token");
    wait_until(Duration::from_secs(30), "the api token", || {
        token_path.exists()
    });
    let token = std::fs::read_to_string(&token_path)
        .unwrap()
        .trim()
        .to_string();

    // Register N servers (by MAC + UUID), one ignition secret, N claims by serverRef.
    let t = Instant::now();
    let ready = register(n, &[(lab.server.name.clone(), token, state.clone())]);
    println!(
        "bootplane: {n} servers registered and claimed, {ready} boot configurations Ready in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    assert_eq!(ready, n, "not every boot configuration became Ready");
    // Let the boot index catch up with the last Ready.
    std::thread::sleep(Duration::from_secs(1));

    let before = usage_of(&[pid]);
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample_rss(vec![pid], stop.clone());
    let sa = StormArgs {
        machines: n,
        ramp: a.ramp,
        concurrency: a.concurrency,
        http_base: HttpBase::Fixed(format!("http://{SERVER_IP}:{HTTP_PORT}")),
        timeout: a.timeout,
        client_threads: a.client_threads,
        tftp_threads: a.tftp_threads,
        boot_retries: a.boot_retries.unwrap_or(0),
        tftp_window: a.tftp_window,
    };
    let storm_res = lab.client.run(move || storm(&sa, None));
    stop.store(true, Ordering::SeqCst);
    let storm_rss_kib = sampler.join().unwrap_or(0);
    let after = usage_of(&[pid]);
    let alive = proc_usage(pid).is_some();
    let note = if alive {
        String::new()
    } else {
        "bootplane exited during the storm".into()
    };
    let _ = std::fs::copy(
        &log_path,
        std::env::temp_dir().join("boot-storm-bootplane.log"),
    );
    drop(child);
    drop(lab);
    Side {
        name: "bootplane",
        storm_rss_kib,
        storm: storm_res,
        usage_before: before,
        usage_after: after,
        note,
    }
}

/// Register and claim N machines through the appliances `apps` (each a namespace name,
/// the API token and the state dir (its CA) of the appliance there, its API on
/// https://127.0.0.1:9090 in it): the
/// writes are spread over the appliances, a client thread per appliance in turn. Waits
/// until every appliance has seen every boot configuration Ready, and returns the
/// fewest any appliance saw.
fn register(n: usize, apps: &[(String, String, std::path::PathBuf)]) -> usize {
    let api = "https://127.0.0.1:9090";
    let agent_of = |app: usize| support::api_agent(&apps[app].2);
    let post = |agent: &ureq::Agent, app: usize, path: &str, body: &Value| {
        let auth = format!("Bearer {}", apps[app].1);
        for k in 0..5 {
            match agent
                .post(&format!("{api}{path}"))
                .set("Authorization", &auth)
                .set("Content-Type", "application/json")
                .send_string(&body.to_string())
            {
                Ok(_) => return,
                Err(ureq::Error::Status(409, _)) => return,
                Err(e) if k == 4 => panic!("POST {path}: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    };
    let k = apps.len();
    let agent = agent_of(0);
    let first = &apps[0].0;
    std::thread::scope(|s| {
        s.spawn(|| {
            enter_thread(first);
            post(
                &agent,
                0,
                "/api/v1/namespaces/default/secrets",
                &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "storm-ign"}, "stringData": {"ignition": IGNITION}}),
            );
        });
    });
    let clients = 16;
    std::thread::scope(|s| {
        for c in 0..clients {
            let post = &post;
            s.spawn(move || {
                enter_thread(&apps[c % k].0);
                let agent = agent_of(c % k);
                for i in (c..n).step_by(clients) {
                    let m = Machine::new(i);
                    post(&agent, c % k, "/apis/metal.ironcore.dev/v1alpha1/servers", &json!({
                        "apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "Server",
                        "metadata": {"name": m.name()},
                        "spec": {"systemUUID": m.uuid_str()},
                        "status": {"state": "Available", "powerState": "Off",
                                   "networkInterfaces": [{"name": "eth0", "macAddress": m.mac_colon()}]},
                    }));
                }
            });
        }
    });
    // Count boot configurations turning Ready from a watch on every appliance (listing
    // 10,000 objects on every poll would itself cost the server memory).
    let sbcs = "/apis/metal.ironcore.dev/v1alpha1/namespaces/default/serverbootconfigurations";
    let ready_counts: Vec<Arc<AtomicUsize>> = (0..k).map(|_| Arc::default()).collect();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    for (app, (netns, token, _)) in apps.iter().enumerate() {
        let agent = agent_of(app);
        let (url, auth, ready_count, ready_tx, netns) = (
            format!("{api}{sbcs}"),
            format!("Bearer {token}"),
            ready_counts[app].clone(),
            ready_tx.clone(),
            netns.clone(),
        );
        let (listed_tx, listed_rx) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            enter_thread(&netns);
            let rv: String = agent
                .get(&url)
                .set("Authorization", &auth)
                .call()
                .ok()
                .and_then(|r| r.into_string().ok())
                .and_then(|s| serde_json::from_str::<Value>(&s).ok())
                .and_then(|v| {
                    v["metadata"]["resourceVersion"]
                        .as_str()
                        .map(str::to_string)
                })
                .expect("listing boot configurations");
            let _ = listed_tx.send(());
            watch_ready(
                &agent,
                &format!("{url}?watch=true&resourceVersion={rv}"),
                &auth,
                n,
                &ready_count,
            );
            let _ = ready_tx.send(());
        });
        listed_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("listing boot configurations");
    }
    std::thread::scope(|s| {
        for c in 0..clients {
            let post = &post;
            s.spawn(move || {
                enter_thread(&apps[(c + 1) % k].0);
                let agent = agent_of((c + 1) % k);
                for i in (c..n).step_by(clients) {
                    let m = Machine::new(i);
                    post(
                        &agent,
                        (c + 1) % k,
                        "/apis/metal.ironcore.dev/v1alpha1/namespaces/default/serverclaims",
                        &json!({
                            "apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "ServerClaim",
                            "metadata": {"name": m.name()},
                            "spec": {"power": "On", "image": "os-image:latest",
                                     "serverRef": {"name": m.name()},
                                     "ignitionSecretRef": {"name": "storm-ign"}},
                        }),
                    );
                }
            });
        }
    });
    let deadline = Instant::now() + Duration::from_secs(120 + n as u64 / 50);
    let mut done = 0;
    while done < k && Instant::now() < deadline {
        if ready_rx.recv_timeout(Duration::from_millis(200)).is_ok() {
            done += 1;
        }
    }
    ready_counts
        .iter()
        .map(|c| c.load(Ordering::SeqCst))
        .min()
        .unwrap_or(0)
}

/// Follow the watch `url` and count the boot configurations seen Ready into `count`,
/// until `n` are (or the watch ends).
fn watch_ready(agent: &ureq::Agent, url: &str, auth: &str, n: usize, count: &AtomicUsize) {
    use std::io::BufRead;
    let Ok(r) = agent.get(url).set("Authorization", auth).call() else {
        return;
    };
    let mut seen = std::collections::HashSet::new();
    for line in std::io::BufReader::new(r.into_reader()).lines() {
        let Ok(line) = line else { return };
        let Ok(ev) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if ev["object"]["status"]["state"] == "Ready" {
            if let Some(name) = ev["object"]["metadata"]["name"].as_str() {
                if seen.insert(name.to_string()) {
                    count.store(seen.len(), Ordering::SeqCst);
                    if seen.len() >= n {
                        return;
                    }
                }
            }
        }
    }
}

fn run_peer(a: &Args, dir: &Path) -> Side {
    let n = a.machines;
    let pool = n + (n / 10).max(64);
    let lab = Lab::new(pool, dir);
    let (lo, hi) = lab.range();
    let tftp_root = boot_file(dir);
    // nginx tree: /boot.ipxe, /ipxe/<mac>.ipxe, /ignition/<name>.ign, /assets/kernel.
    let www = dir.join("www");
    for d in ["ipxe", "ignition", "assets"] {
        std::fs::create_dir_all(www.join(d)).unwrap();
    }
    let base = format!("http://{SERVER_IP}:{HTTP_PORT}");
    std::fs::write(
        www.join("boot.ipxe"),
        format!(
            "#!ipxe\nchain --autofree --replace {base}/ipxe/${{net0/mac:hexhyp}}.ipxe || exit 1\n"
        ),
    )
    .unwrap();
    std::fs::write(www.join("assets/kernel"), b"storm kernel\n").unwrap();
    std::fs::write(www.join("assets/initrd"), b"storm initrd\n").unwrap();
    for i in 0..n {
        let m = Machine::new(i);
        std::fs::write(
            www.join(format!("ipxe/{}.ipxe", m.mac_hyp())),
            format!(
                "#!ipxe\necho booting {name}\nkernel {base}/assets/kernel initrd=initrd ignition.config.url={base}/ignition/{name}.ign ignition.firstboot=1 ignition.platform.id=metal\ninitrd --name initrd {base}/assets/initrd\nboot\n",
                name = m.name()
            ),
        )
        .unwrap();
        std::fs::write(www.join(format!("ignition/{}.ign", m.name())), IGNITION).unwrap();
    }
    let ngx = dir.join("nginx");
    std::fs::create_dir_all(ngx.join("logs")).unwrap();
    let conf = ngx.join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "user root;\nworker_processes 2;\nworker_rlimit_nofile 65536;\npid {p}/nginx.pid;\nerror_log {p}/logs/error.log warn;\n\
             events {{ worker_connections 16384; }}\n\
             http {{\n  access_log off;\n  open_file_cache max=20000 inactive=60s;\n  sendfile on;\n  tcp_nopush on;\n  keepalive_requests 1000;\n  default_type application/octet-stream;\n\
               client_body_temp_path {p}/body;\n  proxy_temp_path {p}/proxy;\n  fastcgi_temp_path {p}/fastcgi;\n  uwsgi_temp_path {p}/uwsgi;\n  scgi_temp_path {p}/scgi;\n\
               server {{ listen {HTTP_PORT} backlog=4096; root {www}; }}\n}}\n",
            p = ngx.display(),
            www = www.display()
        ),
    )
    .unwrap();
    let mut c = lab.server.cmd("nginx");
    c.args([
        "-p",
        ngx.to_str().unwrap(),
        "-c",
        conf.to_str().unwrap(),
        "-g",
        "daemon off;",
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::inherit());
    let nginx = Proc {
        child: c.spawn().expect("starting nginx (apt-get install nginx)"),
    };
    let leases = dir.join("dnsmasq.leases");
    let dlog = dir.join("dnsmasq.log");
    let mut c = lab.server.cmd("dnsmasq");
    c.args([
        "--keep-in-foreground",
        "--conf-file=/dev/null",
        "--port=0",
        "--user=root",
        "--interface=vs",
        "--bind-interfaces",
        "--dhcp-authoritative",
        // The pool is pre-configured on the client veth, so it answers pings: skip
        // dnsmasq's ping check before an offer (bootplane does none either).
        "--no-ping",
        &format!("--dhcp-range={lo},{hi},255.255.192.0,1h"),
        &format!("--dhcp-lease-max={}", pool + 16),
        &format!("--dhcp-leasefile={}", leases.display()),
        &format!("--dhcp-boot={BOOT_FILE}"),
        "--enable-tftp",
        &format!("--tftp-root={}", tftp_root.display()),
        "--tftp-max=2048",
        &format!("--log-facility={}", dlog.display()),
        "--log-async=100",
        // No per-request log lines (bootplane runs at warn).
        "--quiet-dhcp",
        "--quiet-tftp",
        &format!("--pid-file={}", dir.join("dnsmasq.pid").display()),
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::inherit());
    let dnsmasq = Proc {
        child: c
            .spawn()
            .expect("starting dnsmasq (apt-get install dnsmasq)"),
    };
    let (dpid, npid) = (dnsmasq.child.id(), nginx.child.id());
    wait_until(
        Duration::from_secs(20),
        "nginx and dnsmasq to start",
        || {
            let nginx_up = !children(npid).is_empty();
            let dnsmasq_up = std::fs::read_to_string(&dlog)
                .map(|l| l.contains("TFTP root"))
                .unwrap_or(false);
            nginx_up && dnsmasq_up
        },
    );
    std::thread::sleep(Duration::from_millis(500));
    let before = usage_of(&[dpid, npid]);
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample_rss(vec![dpid, npid], stop.clone());
    let sa = StormArgs {
        machines: n,
        ramp: a.ramp,
        concurrency: a.concurrency,
        http_base: HttpBase::Fixed(base),
        timeout: a.timeout,
        client_threads: a.client_threads,
        tftp_threads: a.tftp_threads,
        boot_retries: a.boot_retries.unwrap_or(0),
        tftp_window: a.tftp_window,
    };
    let storm_res = lab.client.run(move || storm(&sa, None));
    stop.store(true, Ordering::SeqCst);
    let storm_rss_kib = sampler.join().unwrap_or(0);
    let after = usage_of(&[dpid, npid]);
    let d_hwm = proc_usage(dpid).map(|u| u.hwm_kib).unwrap_or(0);
    let note = format!(
        "dnsmasq {:.1} MiB, nginx (master + workers) {:.1} MiB",
        d_hwm as f64 / 1024.0,
        after.hwm_kib.saturating_sub(d_hwm) as f64 / 1024.0
    );
    let _ = std::fs::copy(&dlog, std::env::temp_dir().join("boot-storm-dnsmasq.log"));
    drop(dnsmasq);
    drop(nginx);
    drop(lab);
    Side {
        name: "dnsmasq+nginx",
        storm_rss_kib,
        storm: storm_res,
        usage_before: before,
        usage_after: after,
        note,
    }
}

// ---------------------------------------------------------------- report

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

struct Summary {
    ok: usize,
    completion: f64,
    p50: f64,
    p99: f64,
    rss_mib: f64,
    cpu_s: f64,
    /// Machines that failed, by stage ("0" when none).
    failures: String,
    /// Failed attempts a whole-boot retry absorbed, by stage ("0" when none).
    absorbed: String,
    absorbed_n: usize,
    /// Booted machines sharing an address with another booted machine.
    shared_ips: usize,
}

/// "stage k, stage k" for the stages counted in `stages` ("0" when empty).
fn by_stage(stages: impl Iterator<Item = Stage> + Clone) -> String {
    let mut out: Vec<String> = Vec::new();
    for st in STAGES {
        let k = stages.clone().filter(|s| *s == st).count();
        if k > 0 {
            out.push(format!("{} {k}", st.name()));
        }
    }
    if out.is_empty() {
        "0".into()
    } else {
        out.join(", ")
    }
}

fn summarize(s: &Side) -> Summary {
    let r = &s.storm.results;
    let ok = r.iter().filter(|x| x.ok).count();
    let mut t: Vec<f64> = r
        .iter()
        .filter(|x| x.ok)
        .map(|x| x.total.as_secs_f64())
        .collect();
    t.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let failures = by_stage(r.iter().filter_map(|x| x.failed.as_ref().map(|f| f.0)));
    let absorbed = by_stage(r.iter().flat_map(|x| x.absorbed.iter().map(|a| a.0)));
    let absorbed_n: usize = r.iter().map(|x| x.absorbed.len()).sum();
    let mut ips: Vec<Ipv4Addr> = r.iter().filter(|x| x.ok).filter_map(|x| x.ip).collect();
    ips.sort();
    let shared_ips = (0..ips.len())
        .filter(|&i| (i > 0 && ips[i - 1] == ips[i]) || ips.get(i + 1) == Some(&ips[i]))
        .count();
    let retx: u32 = r.iter().map(|x| x.retransmits).sum();
    let cpu_s = (s
        .usage_after
        .cpu_ticks
        .saturating_sub(s.usage_before.cpu_ticks)) as f64
        / clk_tck();
    let rss_mib = s.usage_after.hwm_kib as f64 / 1024.0;
    let stage_p50: Vec<String> = STAGES[..6]
        .iter()
        .map(|st| {
            let mut v: Vec<f64> = r
                .iter()
                .filter(|x| x.ok)
                .map(|x| x.stage[*st as usize].as_secs_f64())
                .collect();
            v.sort_by(|a, b| a.partial_cmp(b).unwrap());
            format!("{} {:.3}/{:.3}", st.name(), pct(&v, 0.5), pct(&v, 0.99))
        })
        .collect();
    println!(
        "{:<14} booted {ok}/{} | failures: {} | completion {:.2}s | boot time p50 {:.2}s p99 {:.2}s | peak RSS {rss_mib:.1} MiB (storm {:.1}) | CPU {cpu_s:.2}s | retransmits {retx}",
        s.name,
        r.len(),
        failures,
        s.storm.completion.as_secs_f64(),
        pct(&t, 0.5),
        pct(&t, 0.99),
        s.storm_rss_kib as f64 / 1024.0,
    );
    println!("{:<14} stage p50/p99 (s): {}", "", stage_p50.join(" | "));
    if absorbed_n > 0 {
        println!(
            "{:<14} failed attempts retried from DHCP (firmware boot retry): {absorbed}",
            ""
        );
        // Each distinct reason once per stage, with its count.
        let mut why: Vec<(String, usize)> = Vec::new();
        for (st, e) in r.iter().flat_map(|x| x.absorbed.iter()) {
            let key = format!("{}: {e}", st.name());
            match why.iter_mut().find(|(k, _)| *k == key) {
                Some((_, n)) => *n += 1,
                None => why.push((key, 1)),
            }
        }
        for (k, n) in why.iter().take(6) {
            println!("{:<14} retried attempt: {k} (x{n})", "");
        }
    }
    if shared_ips > 0 {
        println!("{:<14} {shared_ips} booted machines share an address", "");
    }
    println!(
        "{:<14} simulated machines (this process) used {:.2}s CPU",
        "", s.storm.client_cpu
    );
    if !s.note.is_empty() {
        println!("{:<14} {}", "", s.note);
    }
    let mut shown = 0;
    for x in r.iter().filter(|x| !x.ok) {
        if let Some((st, e)) = &x.failed {
            if shown < 5 {
                println!("{:<14} failure: {}: {e}", "", st.name());
                shown += 1;
            }
        }
    }
    Summary {
        ok,
        completion: s.storm.completion.as_secs_f64(),
        p50: pct(&t, 0.5),
        p99: pct(&t, 0.99),
        rss_mib,
        cpu_s,
        failures,
        absorbed,
        absorbed_n,
        shared_ips,
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn main() {
    let a = args();
    assert!(
        unsafe { libc::geteuid() } == 0,
        "the boot storm needs root (network namespaces)"
    );
    // Thousands of sockets on both sides.
    let lim = libc::rlimit {
        rlim_cur: 65536,
        rlim_max: 65536,
    };
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    let _ = std::io::stdout().flush();
    if a.cluster {
        println!(
            "boot storm, cluster: {} machines, ramp {:.1}s, load average {}",
            a.machines,
            a.ramp,
            loadavg()
        );
        cluster::main_cluster(&a);
        return;
    }
    println!(
        "boot storm: {} machines, ramp {:.1}s ({:.0} power-ons/s), concurrency {}, load average {}",
        a.machines,
        a.ramp,
        if a.ramp > 0.0 {
            a.machines as f64 / a.ramp
        } else {
            f64::INFINITY
        },
        if a.concurrency == 0 {
            "unbounded".to_string()
        } else {
            a.concurrency.to_string()
        },
        loadavg()
    );
    let only = a.only.clone();
    let run_b = only.as_deref() != Some("peer");
    let run_p = only.as_deref() != Some("bootplane");
    // Interleaved rounds, bootplane then the peer in each (A B A B ...).
    let (bs, ps): (Vec<Option<Summary>>, Vec<Option<Summary>>) = rounds::interleave(
        a.rounds,
        |r| {
            run_b.then(|| {
                println!("--- round {} of {}: bootplane ---", r + 1, a.rounds);
                let dir = tempfile::tempdir().unwrap();
                let side = run_bootplane(&a, dir.path());
                let s = summarize(&side);
                println!("load average after bootplane: {}", loadavg());
                s
            })
        },
        |r| {
            run_p.then(|| {
                println!("--- round {} of {}: dnsmasq+nginx ---", r + 1, a.rounds);
                let dir = tempfile::tempdir().unwrap();
                let side = run_peer(&a, dir.path());
                let s = summarize(&side);
                println!("load average after peer: {}", loadavg());
                s
            })
        },
    );
    let bs: Vec<Summary> = bs.into_iter().flatten().collect();
    let ps: Vec<Summary> = ps.into_iter().flatten().collect();
    println!();
    let mode = if a.tftp_window > 1 {
        format!("firmware offering windowsize {}", a.tftp_window)
    } else {
        "lockstep firmware".to_string()
    };
    println!(
        "summary: {} machines, {mode}, {} rounds (median (min-max)), load average now {}",
        a.machines,
        a.rounds,
        loadavg()
    );
    let pair = |what: &str, unit: &str, f: &dyn Fn(&Summary) -> f64| {
        let mut p = Pair::new(what, unit, "bootplane", "dnsmasq+nginx");
        p.a = bs.iter().map(f).collect();
        p.b = ps.iter().map(f).collect();
        p
    };
    let completion = pair(
        &format!("boot storm {} machines, {mode}: completion", a.machines),
        "s",
        &|s| s.completion,
    );
    let pairs = [
        completion.clone(),
        pair("boot time p50", "s", &|s| s.p50),
        pair("boot time p99", "s", &|s| s.p99),
        pair("server CPU", "s", &|s| s.cpu_s),
        pair("server peak RSS", "MiB", &|s| s.rss_mib),
        pair("machines booted", "", &|s| s.ok as f64),
    ];
    for p in &pairs {
        if ps.is_empty() {
            println!("{}: bootplane {}", p.what, p.a_stat());
        } else if bs.is_empty() {
            println!("{}: dnsmasq+nginx {}", p.what, p.b_stat());
        } else {
            p.print();
        }
    }
    if !bs.is_empty() && !ps.is_empty() {
        let peer_all = ps.iter().all(|p| p.ok == a.machines);
        let r = completion.ratio();
        goal(
            "completion <= 0.5x the peer's",
            r.median <= 0.5 && bs.iter().all(|b| b.ok == a.machines),
            &format!(
                "{}x per round{}",
                r.fmt(2),
                if peer_all {
                    String::new()
                } else {
                    ", against the peer's machines booted: it failed some".to_string()
                }
            ),
        );
    }
    if !bs.is_empty() {
        let all = bs.iter().all(|b| b.ok == a.machines);
        let rss = bs.iter().map(|b| b.rss_mib).fold(0.0, f64::max);
        goal(
            &format!(
                "{} machines with 0 failures{}",
                a.machines,
                if a.machines >= 10_000 {
                    " and RSS <= 256 MiB"
                } else {
                    ""
                }
            ),
            all && (a.machines < 10_000 || rss <= 256.0),
            &format!(
                "failures per round: {}; peak RSS {rss:.0} MiB",
                bs.iter()
                    .map(|b| b.failures.clone())
                    .collect::<Vec<_>>()
                    .join(" / ")
            ),
        );
        if !ps.is_empty() {
            println!();
            println!("table row:");
            println!(
                "{}",
                completion.table_row(&format!(
                    "cargo bench --bench boot_storm -- --machines {} --rounds {}{}",
                    a.machines,
                    a.rounds,
                    if a.tftp_window > 1 {
                        " --firmware windowsize"
                    } else {
                        ""
                    }
                ))
            );
        }
    }
    rounds::print_machine();
}
