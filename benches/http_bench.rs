//! Boot HTTP listener vs nginx (Debian, sendfile on), side by side in one run, on
//! 127.0.0.1 only. Our listener runs as a child process (this binary re-executed with
//! `BOOTPLANE_HTTP_BENCH_CHILD` set) so its RSS is its own.
//!
//! (a) per-machine iPXE script requests/s (wrk) vs nginx serving a static file of the
//!     same size; goal >= 1.0x.
//! (b) 8 parallel full downloads (curl) of a large asset, aggregate throughput vs nginx
//!     sendfile; goal >= 0.9x.
//! (c) peak RSS while 1,000 clients (wrk -c1000) download the large asset; goal <= 64 MiB.
//!
//! Both sides are tuned as an operator with one load generator would: all of wrk's
//! connections come from 127.0.0.1, so our listener's per-source share
//! (`http.max_connections_per_source`, default 512) is raised to its total
//! (`http.max_connections`, 4096); nginx runs 2 workers × 4096 connections with
//! sendfile, tcp_nopush, `open_file_cache` (no open/stat per request) and unlimited
//! keep-alive requests. Neither side logs requests (nginx `access_log off`; our child
//! installs no log subscriber). The run prints both.
//!
//! The sides alternate within every round (bootplane, nginx, ...; `--rounds`, at least
//! 3) and each figure is printed as median and spread (min-max) of each side and of the
//! per-round ratio, with every goal, met or not.
//!
//! `cargo bench --bench http_bench` (1 GiB asset, 3 rounds) or
//! `cargo bench --bench http_bench -- --quick` (64 MiB asset, shorter runs).
//! Options: `--size-mib N`, `--secs S`, `--rounds R`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "BOOTPLANE_HTTP_BENCH_CHILD";
const UUID: &str = "4c4c4544-0042-3510-8052-b4c04f4e4d32";
/// The token key of the server under test and the boot its machine is in.
const TOKEN_KEY: [u8; 32] = [1u8; 32];
const BOOT_ID: &str = "bench/1";

#[path = "support/procfs.rs"]
mod procfs;
#[path = "support/rounds.rs"]
mod rounds;
use rounds::{goal, Pair};

fn main() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        child(PathBuf::from(dir));
        return;
    }
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let opt = |name: &str, default: u64| -> u64 {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let size_mib = opt("--size-mib", if quick { 64 } else { 1024 });
    let secs = opt("--secs", if quick { 3 } else { 8 });
    let rounds = opt("--rounds", 3).max(1) as usize;
    raise_nofile();
    for tool in ["wrk", "curl", "nginx"] {
        let found = Command::new("sh")
            .arg("-c")
            .arg(format!("command -v {tool} || test -x /usr/sbin/{tool}"))
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(
            found,
            "{tool} missing: apt-get install wrk curl nginx-light"
        );
    }

    let dir = tempfile::tempdir().unwrap();
    let assets = dir.path().join("assets");
    std::fs::create_dir_all(&assets).unwrap();
    let big = assets.join("big.bin");
    write_big(&big, size_mib << 20);
    let big_len = size_mib << 20;

    let ours = Server::ours(dir.path());
    // With signed URLs a claimed machine's script needs the script token its DHCP reply
    // carries (option 224, sent on by boot.ipxe): minted here with the server's key for
    // its boot and, as an authoritative reply's is, bound to the address it leased (wrk's
    // 127.0.0.1), valid for the whole run.
    let token = bootplane::http::token::TokenSigner::new(&TOKEN_KEY).mint_for(
        bootplane::http::token::Purpose::Script,
        ("server-a", BOOT_ID),
        Some(std::net::Ipv4Addr::LOCALHOST.into()),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
        86_400,
    );
    let script_path = format!(
        "/ipxe/script?uuid={UUID}&mac=52-54-00-ab-cd-ef&buildarch=x86_64&platform=pcbios&token={token}"
    );
    let script = http_get(ours.addr, &script_path);
    assert!(
        script.starts_with(b"#!ipxe\n"),
        "{}",
        String::from_utf8_lossy(&script)
    );
    std::fs::write(assets.join("script.ipxe"), &script).unwrap();
    let nginx = Server::nginx(dir.path());
    assert_eq!(http_get(nginx.addr, "/script.ipxe"), script);

    println!(
        "http_bench: asset {size_mib} MiB, wrk {secs}s, {rounds} round(s), script {} bytes",
        script.len()
    );
    println!(
        "    tuning for one load generator: bootplane per-source connection share = total ({}; \
         every wrk connection comes from 127.0.0.1), nginx 2 workers x 4096 connections, \
         sendfile + tcp_nopush + open_file_cache, keepalive_requests 1000000, no access log on either side",
        bootplane::http::server::Limits::default().max_connections
    );

    // (a) requests/s
    let mut rps = Pair::new(
        "HTTP (a) iPXE script requests/s",
        "req/s",
        "bootplane",
        "nginx static",
    );
    let mut cpu_req = Pair::new(
        "HTTP (a) server CPU per request",
        "us",
        "bootplane",
        "nginx",
    );
    for _ in 0..rounds {
        let (r, c) = wrk_rps(
            &ours,
            &format!("http://{}{}", ours.addr, script_path),
            64,
            secs,
        );
        rps.a.push(r);
        cpu_req.a.push(c);
        let (r, c) = wrk_rps(
            &nginx,
            &format!("http://{}/script.ipxe", nginx.addr),
            64,
            secs,
        );
        rps.b.push(r);
        cpu_req.b.push(c);
    }
    rps.print();
    cpu_req.print();

    // (b) 8 parallel downloads
    let mut dl = Pair::new(
        &format!("HTTP (b) 8 parallel {size_mib} MiB downloads"),
        "MiB/s",
        "bootplane",
        "nginx sendfile",
    );
    let mut cpu_gib = Pair::new(
        "HTTP (b) server CPU per GiB sent",
        "s",
        "bootplane",
        "nginx",
    );
    let hz = procfs::clk_tck();
    let gib = (8 * big_len) as f64 / (1u64 << 30) as f64;
    for _ in 0..rounds {
        let c0 = cpu_ticks(&ours);
        dl.a.push(
            parallel_downloads(&format!("http://{}/assets/big.bin", ours.addr), 8, big_len)
                / 1048576.0,
        );
        cpu_gib.a.push((cpu_ticks(&ours) - c0) as f64 / hz / gib);
        let c0 = cpu_ticks(&nginx);
        dl.b.push(
            parallel_downloads(&format!("http://{}/big.bin", nginx.addr), 8, big_len) / 1048576.0,
        );
        cpu_gib.b.push((cpu_ticks(&nginx) - c0) as f64 / hz / gib);
    }
    dl.print();
    cpu_gib.print();
    drop(ours);

    // (c) RSS with 1,000 concurrent downloads, on a fresh child.
    let ours = Server::ours(dir.path());
    let base_rss = rss_kib(ours.pid()).unwrap_or(0);
    let (peak, file_peak, ok) = rss_under_load(
        &ours,
        &format!("http://{}/assets/big.bin", ours.addr),
        secs.max(5),
    );
    let nginx_peak = {
        let (p, _, _) = rss_under_load(
            &nginx,
            &format!("http://{}/big.bin", nginx.addr),
            secs.max(5),
        );
        p
    };
    println!(
        "(c) peak RSS with 1000 concurrent downloads (one round): bootplane {:.1} MiB (idle {:.1} MiB, file-backed part {:.1} MiB, {} clients got data)  nginx master+workers {:.1} MiB",
        peak as f64 / 1024.0,
        base_rss as f64 / 1024.0,
        file_peak as f64 / 1024.0,
        ok,
        nginx_peak as f64 / 1024.0
    );
    println!();
    goal(
        "(a) script requests/s >= 1.0x nginx static",
        rps.ratio().median >= 1.0,
        &format!("{}x per round", rps.ratio().fmt(2)),
    );
    goal(
        "(b) download throughput >= 0.9x nginx sendfile",
        dl.ratio().median >= 0.9,
        &format!("{}x per round", dl.ratio().fmt(2)),
    );
    goal(
        "(c) peak RSS <= 64 MiB with 1,000 downloads",
        peak <= 64 * 1024,
        &format!("{:.1} MiB", peak as f64 / 1024.0),
    );
    println!("\ntable rows:");
    let cmd = format!(
        "cargo bench --bench http_bench -- --size-mib {size_mib} --secs {secs} --rounds {rounds}"
    );
    println!("{}", rps.table_row(&cmd));
    println!("{}", dl.table_row(&cmd));
    rounds::print_machine();
}

// ---------------------------------------------------------------- child: our server

fn child(dir: PathBuf) {
    use bootplane::http::files::FileIo;
    use bootplane::http::handler::{BootHttp, Settings};
    use bootplane::http::index::MemoryIndex;
    use bootplane::http::server::{bind, run, run_workers, worker_count, Limits};
    use bootplane::http::{BootFiles, BootState, IgnitionData, MachineBoot, Metrics};
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        // As `serve` runs it: `http.workers` threads (default one per core), each with a
        // current-thread runtime and its own SO_REUSEPORT socket.
        // BOOTPLANE_HTTP_BENCH_WORKERS=N sets N; `multi` is one socket on this
        // multi-thread runtime (the shape before the workers, for comparison).
        let shape = std::env::var("BOOTPLANE_HTTP_BENCH_WORKERS").unwrap_or_default();
        let listeners = if shape == "multi" {
            vec![]
        } else {
            bind(
                "127.0.0.1:0".parse().unwrap(),
                worker_count(shape.parse().unwrap_or(0)),
            )
            .unwrap()
        };
        let single = if shape == "multi" {
            Some(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap())
        } else {
            None
        };
        let addr = match &single {
            Some(l) => l.local_addr().unwrap(),
            None => listeners[0].local_addr().unwrap(),
        };
        let base = format!("http://{addr}");
        let index = Arc::new(MemoryIndex::new());
        index.upsert(MachineBoot {
            server: "server-a".into(),
            uuid: Some(UUID.into()),
            ips: vec!["127.0.0.1".parse().unwrap()],
            macs: vec![[0x52, 0x54, 0, 0xab, 0xcd, 0xef]],
            state: BootState::Ready,
            boot_id: BOOT_ID.into(),
            files: Some(BootFiles {
                image: "os-image:latest".into(),
                arch: "amd64".into(),
                kernel_url: format!("{base}/assets/images/os-image/vmlinuz"),
                initrd_url: format!("{base}/assets/images/os-image/initrd.img"),
                rootfs_url: String::new(),
                cmdline: "rd.neednet=1 ip=dhcp".into(),
            }),
            ignition: Some(IgnitionData {
                data: "{}".into(),
                content_type: "application/json".into(),
            }),
        });
        let io = match std::env::var("BOOTPLANE_HTTP_BENCH_IO").as_deref() {
            Ok("read") => FileIo::Read,
            Ok("mmap") => FileIo::Mmap,
            _ => FileIo::Sendfile,
        };
        let s = Settings {
            base_url: base,
            console: "console=tty0 console=ttyS0,115200".into(),
            default_action: bootplane::ipxe::DefaultAction::Exit,
            token_ttl_secs: 3600,
            signer: bootplane::http::token::TokenSigner::new(&TOKEN_KEY),
            templates: vec![],
            assets_dir: Some(dir.join("assets")),
            images_dir: None,
            ipxe_fallback_dir: None,
            file_io: io,
            stream_budget_bytes: bootplane::http::HttpConfig::default().stream_budget_bytes,
            sign_ignition_urls: true,
        };
        let metrics = Arc::new(Metrics::new());
        let app = Arc::new(BootHttp::new(s, index, metrics.clone()).unwrap());
        let coord = bootplane::shutdown::Coordinator::new();
        // BOOTPLANE_HTTP_BENCH_IDLE_MS: the idle timeout (5000 is the bound before it
        // was split from the header read timeout).
        let mut limits = Limits::default();
        // Every wrk connection comes from the one loopback address: no per-source share.
        limits.max_connections_per_source = limits.max_connections;
        if let Some(ms) = std::env::var("BOOTPLANE_HTTP_BENCH_IDLE_MS")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            limits.idle_timeout = Duration::from_millis(ms);
        }
        let task = match single {
            Some(l) => tokio::spawn(run(l, app, limits, coord.handle())),
            None => tokio::spawn(run_workers(listeners, app, limits, coord.handle())),
        };
        println!("READY {addr}");
        std::io::stdout().flush().unwrap();
        // Run until the parent closes our stdin.
        let _ = tokio::task::spawn_blocking(|| {
            let mut b = [0u8; 1];
            let _ = std::io::stdin().read(&mut b);
        })
        .await;
        coord.drain(Duration::from_secs(2)).await;
        let _ = task.await;
        let m = metrics.encode();
        for l in m
            .lines()
            .filter(|l| l.starts_with("bootplane_http_connection"))
        {
            eprintln!("child: {l}");
        }
    });
}

// ---------------------------------------------------------------- servers

struct Server {
    child: Child,
    addr: SocketAddr,
    nginx: bool,
}

impl Server {
    fn ours(dir: &Path) -> Server {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .env(CHILD_ENV, dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .strip_prefix("READY ")
            .unwrap_or_else(|| panic!("child said {line:?}"))
            .parse()
            .unwrap();
        Server {
            child,
            addr,
            nginx: false,
        }
    }

    fn nginx(dir: &Path) -> Server {
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let prefix = dir.join("nginx");
        std::fs::create_dir_all(prefix.join("logs")).unwrap();
        let conf = format!(
            "daemon off;\nmaster_process on;\nuser root;\nworker_processes 2;\npid {p}/nginx.pid;\nerror_log {p}/logs/error.log warn;\n\
             events {{ worker_connections 4096; }}\n\
             http {{\n  access_log off;\n  open_file_cache max=1000 inactive=60s;\n  sendfile on;\n  tcp_nopush on;\n  tcp_nodelay on;\n  keepalive_requests 1000000;\n  default_type application/octet-stream;\n\
             \x20 client_body_temp_path {p}/tmp; proxy_temp_path {p}/tmp; fastcgi_temp_path {p}/tmp; uwsgi_temp_path {p}/tmp; scgi_temp_path {p}/tmp;\n\
             \x20 server {{ listen 127.0.0.1:{port}; root {root}; }}\n}}\n",
            p = prefix.display(),
            root = dir.join("assets").display(),
        );
        let conf_path = prefix.join("nginx.conf");
        std::fs::write(&conf_path, conf).unwrap();
        let bin = if Path::new("/usr/sbin/nginx").exists() {
            "/usr/sbin/nginx"
        } else {
            "nginx"
        };
        let child = Command::new(bin)
            .arg("-p")
            .arg(&prefix)
            .arg("-c")
            .arg(&conf_path)
            .stdin(Stdio::null())
            .spawn()
            .expect("starting nginx");
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(addr).is_err() {
            assert!(
                Instant::now() < deadline,
                "nginx did not start (see {}/logs/error.log)",
                prefix.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Server {
            child,
            addr,
            nginx: true,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.nginx {
            let _ = Command::new("kill")
                .arg("-QUIT")
                .arg(self.child.id().to_string())
                .status();
        } else {
            drop(self.child.stdin.take());
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------- measurements

/// wrk against `url`: (requests/s, server CPU microseconds per request).
fn wrk_rps(srv: &Server, url: &str, conns: u32, secs: u64) -> (f64, f64) {
    let cpu0 = cpu_ticks(srv);
    let out = Command::new("wrk")
        .args([
            "-t2",
            &format!("-c{conns}"),
            &format!("-d{secs}s"),
            "--timeout",
            "10s",
            url,
        ])
        .output()
        .expect("running wrk");
    let cpu1 = cpu_ticks(srv);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("Non-2xx"), "wrk saw errors: {text}");
    let rps: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no Requests/sec in wrk output: {text}"));
    let hz = procfs::clk_tck();
    let us_per_req = (cpu1 - cpu0) as f64 / hz * 1e6 / (rps * secs as f64);
    (rps, us_per_req)
}

/// utime + stime of the server (nginx: master + workers) in clock ticks.
fn cpu_ticks(srv: &Server) -> u64 {
    let mut pids = vec![srv.pid()];
    if srv.nginx {
        pids.extend(procfs::children(srv.pid()));
    }
    pids.iter()
        .map(|p| procfs::cpu_ticks(*p).unwrap_or(0))
        .sum()
}

/// `n` curls in parallel, each downloading the whole file; aggregate bytes/s.
fn parallel_downloads(url: &str, n: usize, len: u64) -> f64 {
    let start = Instant::now();
    let children: Vec<Child> = (0..n)
        .map(|_| {
            Command::new("curl")
                .args([
                    "-s",
                    "-o",
                    "/dev/null",
                    "--max-time",
                    "300",
                    "-w",
                    "%{http_code} %{size_download}",
                    url,
                ])
                .stdout(Stdio::piped())
                .spawn()
                .expect("running curl")
        })
        .collect();
    for c in children {
        let out = c.wait_with_output().unwrap();
        let s = String::from_utf8_lossy(&out.stdout).to_string();
        assert_eq!(s, format!("200 {len}"), "download of {url} incomplete");
    }
    (n as u64 * len) as f64 / start.elapsed().as_secs_f64()
}

/// Run wrk -c1000 against `url`, sampling the server's RSS; returns (peak KiB, peak
/// file-backed KiB, connections that received data).
fn rss_under_load(srv: &Server, url: &str, secs: u64) -> (u64, u64, String) {
    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(0));
    let file_peak = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (stop, peak, file_peak) = (stop.clone(), peak.clone(), file_peak.clone());
        let pids = (srv.pid(), srv.nginx);
        std::thread::spawn(move || {
            let probe = ProbeServer {
                pid: pids.0,
                nginx: pids.1,
            };
            while !stop.load(Ordering::Relaxed) {
                let (t, f) = probe.rss();
                peak.fetch_max(t, Ordering::Relaxed);
                file_peak.fetch_max(f, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let out = Command::new("wrk")
        .args([
            "-t2",
            "-c1000",
            &format!("-d{secs}s"),
            "--timeout",
            "60s",
            url,
        ])
        .output()
        .expect("running wrk");
    stop.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let transfer = text
        .lines()
        .find(|l| l.starts_with("Transfer/sec"))
        .unwrap_or("")
        .trim()
        .to_string();
    let errors = text
        .lines()
        .find(|l| l.contains("Socket errors"))
        .unwrap_or("no socket errors")
        .trim()
        .to_string();
    (
        peak.load(Ordering::Relaxed),
        file_peak.load(Ordering::Relaxed),
        format!("1000 ({transfer}; {errors})"),
    )
}

struct ProbeServer {
    pid: u32,
    nginx: bool,
}

impl ProbeServer {
    fn rss(&self) -> (u64, u64) {
        let mut pids = vec![self.pid];
        if self.nginx {
            pids.extend(procfs::children(self.pid));
        }
        pids.iter().fold((0, 0), |(t, f), p| {
            (
                t + rss_kib(*p).unwrap_or(0),
                f + procfs::status_kib(*p, "RssFile:").unwrap_or(0),
            )
        })
    }
}

fn rss_kib(pid: u32) -> Option<u64> {
    procfs::status_kib(pid, "VmRSS:")
}

// ---------------------------------------------------------------- helpers

fn http_get(addr: SocketAddr, path: &str) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let split = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("http head")
        + 4;
    let head = String::from_utf8_lossy(&out[..split]).to_string();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    out[split..].to_vec()
}

fn write_big(path: &Path, len: u64) {
    let mut f = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path).unwrap());
    let mut block = vec![0u8; 1 << 20];
    for (i, b) in block.iter_mut().enumerate() {
        *b = (i.wrapping_mul(2654435761) >> 13) as u8;
    }
    let mut written = 0;
    while written < len {
        let n = (len - written).min(block.len() as u64) as usize;
        block[0] = (written >> 20) as u8;
        f.write_all(&block[..n]).unwrap();
        written += n as u64;
    }
    f.flush().unwrap();
}

fn raise_nofile() {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain libc calls on a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max.min(65536);
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}
