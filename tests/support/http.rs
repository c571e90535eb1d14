//! Boot HTTP test helpers: an in-process listener on 127.0.0.1 with a temp directory
//! of assets and images and an in-memory index, and the real `curl` run from a chosen
//! loopback source address.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bootplane::http::catalog::{self, FileHasher};
use bootplane::http::files::FileIo;
use bootplane::http::handler::{BootHttp, Settings};
use bootplane::http::index::MemoryIndex;
use bootplane::http::server::{self, Limits};
use bootplane::http::token::TokenSigner;
use bootplane::http::{
    BootEvent, BootIndex, BootState, IgnitionData, MachineBoot, MachineId, Metrics,
};
use bootplane::ipxe::DefaultAction;
use bootplane::shutdown::Coordinator;

pub const UUID: &str = "4c4c4544-0042-3510-8052-b4c04f4e4d32";
pub const MAC: [u8; 6] = [0x52, 0x54, 0x00, 0xab, 0xcd, 0xef];
pub const MACHINE_IP: &str = "127.0.0.2";
pub const OTHER_IP: &str = "127.0.0.3";
pub const IGNITION: &str = "{\"ignition\":{\"version\":\"3.4.0\"}}";

pub struct Srv {
    pub addr: SocketAddr,
    pub base: String,
    pub index: Arc<MemoryIndex>,
    pub metrics: Arc<Metrics>,
    /// Names of the threads that looked machines up (that served scripts/Ignition).
    pub threads: Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>,
    pub dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The token key of the servers [`start`] makes.
pub const TOKEN_KEY: [u8; 32] = [42u8; 32];

impl Srv {
    /// `server`'s script URL with a Script token for the boot its index entry holds
    /// (what the DHCP reply to its iPXE carries with signed URLs on).
    pub fn signed_script_url(&self, server: &str) -> String {
        use bootplane::http::token::Purpose;
        let boot = self
            .index
            .lookup(&MachineId::Server(server.into()))
            .map(|m| m.boot_id.clone())
            .unwrap_or_default();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let t = TokenSigner::new(&TOKEN_KEY).mint(Purpose::Script, server, &boot, now, 600);
        format!("{}/ipxe/script?server={server}&token={t}", self.base)
    }

    /// Shut the server down (broadcast, then drain) and wait until its runtime and
    /// threads have ended; panics if that takes longer than `limit`.
    pub fn shutdown(mut self, limit: Duration) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let t = self.thread.take().unwrap();
        let deadline = std::time::Instant::now() + limit;
        while !t.is_finished() {
            assert!(
                std::time::Instant::now() < deadline,
                "server did not shut down within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        t.join().expect("server thread");
    }
}

impl Drop for Srv {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The in-memory index, noting which threads ask it.
struct Recording {
    inner: Arc<MemoryIndex>,
    threads: Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>,
}

impl BootIndex for Recording {
    fn lookup(&self, id: &MachineId) -> Option<Arc<MachineBoot>> {
        let name = std::thread::current().name().unwrap_or("?").to_string();
        self.threads.lock().unwrap().insert(name);
        self.inner.lookup(id)
    }
    fn record_progress(&self, server: &str, event: BootEvent, client: std::net::IpAddr) {
        self.inner.record_progress(server, event, client)
    }
    fn owns(&self, m: &MachineBoot, client: std::net::IpAddr) -> bool {
        self.inner.owns(m, client)
    }
}

pub fn images_dir(root: &Path) -> PathBuf {
    root.join("images")
}

/// Write assets (an `.efi` file, a 3 MB blob), demo image files and their catalog.
fn populate(root: &Path) {
    let assets = root.join("assets");
    std::fs::create_dir_all(assets.join("sub")).unwrap();
    let efi: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
    std::fs::write(assets.join("tool.efi"), efi).unwrap();
    let blob: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 24) as u8)
        .collect();
    std::fs::write(assets.join("sub/blob.bin"), blob).unwrap();
    std::fs::write(root.join("secret.txt"), b"TOP-SECRET-OUTSIDE-ROOT").unwrap();
    let img = images_dir(root);
    std::fs::create_dir_all(img.join("os-image")).unwrap();
    std::fs::write(img.join("os-image/vmlinuz"), vec![b'K'; 70_000]).unwrap();
    std::fs::write(img.join("os-image/initrd.img"), vec![b'I'; 90_000]).unwrap();
    let sha = |p: &str| FileHasher::new(&img).sha256(p).unwrap().unwrap();
    let cat = format!(
        "[[image]]\nref = \"os-image:latest\"\ncmdline = \"rd.neednet=1\"\nkernel = {{ path = \"os-image/vmlinuz\", sha256 = \"{}\" }}\ninitrd = {{ path = \"os-image/initrd.img\", sha256 = \"{}\" }}\n",
        sha("os-image/vmlinuz"),
        sha("os-image/initrd.img")
    );
    std::fs::write(img.join(catalog::CATALOG_FILE), cat).unwrap();
}

/// The claimed machine, resolved through the catalog like the boot-side reconciler does.
pub fn ready_machine(root: &Path, base: &str) -> MachineBoot {
    let img = images_dir(root);
    let cat = catalog::load(&img).unwrap();
    let resolved = FileHasher::new(&img)
        .resolve(&cat, "os-image:latest")
        .unwrap()
        .expect("demo image resolves");
    MachineBoot {
        server: "server-a".into(),
        uuid: Some(UUID.into()),
        ips: vec![MACHINE_IP.parse().unwrap()],
        macs: vec![MAC],
        state: BootState::Ready,
        boot_id: "sbc-uid-a/1".into(),
        files: Some(resolved.boot_files(base)),
        ignition: Some(IgnitionData {
            data: IGNITION.into(),
            content_type: "application/json".into(),
        }),
    }
}

pub fn start(limits: Limits, tweak: impl FnOnce(&mut Settings) + Send + 'static) -> Srv {
    start_shape(limits, None, tweak)
}

/// As [`start`], but served the way `serve` does: `workers` threads, each with its own
/// current-thread runtime and SO_REUSEPORT socket ([`server::run_workers`]).
pub fn start_workers(
    limits: Limits,
    workers: usize,
    tweak: impl FnOnce(&mut Settings) + Send + 'static,
) -> Srv {
    start_shape(limits, Some(workers), tweak)
}

fn start_shape(
    limits: Limits,
    workers: Option<usize>,
    tweak: impl FnOnce(&mut Settings) + Send + 'static,
) -> Srv {
    let dir = tempfile::tempdir().unwrap();
    populate(dir.path());
    let root = dir.path().to_path_buf();
    let index = Arc::new(MemoryIndex::new());
    let metrics = Arc::new(Metrics::new());
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let threads = Arc::new(std::sync::Mutex::new(std::collections::BTreeSet::new()));
    let idx = Arc::new(Recording {
        inner: index.clone(),
        threads: threads.clone(),
    });
    let m = metrics.clone();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
            let (single, listeners) = match workers {
                None => (
                    Some(tokio::net::TcpListener::bind(any).await.unwrap()),
                    vec![],
                ),
                Some(n) => (None, server::bind(any, n).unwrap()),
            };
            let addr = match &single {
                Some(l) => l.local_addr().unwrap(),
                None => listeners[0].local_addr().unwrap(),
            };
            let base = format!("http://{addr}");
            let mut s = Settings {
                base_url: base.clone(),
                console: "console=ttyS0,115200".into(),
                default_action: DefaultAction::Exit,
                token_ttl_secs: 600,
                signer: TokenSigner::new(&TOKEN_KEY),
                templates: vec![],
                assets_dir: Some(root.join("assets")),
                images_dir: Some(images_dir(&root)),
                ipxe_fallback_dir: Some("/usr/lib/ipxe".into()),
                file_io: FileIo::Sendfile,
                stream_budget_bytes: 8 << 20,
                sign_ignition_urls: true,
            };
            tweak(&mut s);
            let app = Arc::new(BootHttp::new(s, idx, m).unwrap());
            let coord = Coordinator::new();
            let task = match single {
                Some(l) => tokio::spawn(server::run(l, app, limits, coord.handle())),
                None => tokio::spawn(server::run_workers(listeners, app, limits, coord.handle())),
            };
            addr_tx.send(addr).unwrap();
            let _ = stop_rx.await;
            coord.drain(Duration::from_secs(5)).await;
            task.await.unwrap().unwrap();
        });
    });
    let addr = addr_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("test server started");
    Srv {
        addr,
        base: format!("http://{addr}"),
        index,
        metrics,
        threads,
        dir,
        stop: Some(stop_tx),
        thread: Some(thread),
    }
}

pub struct CurlOut {
    pub code: u16,
    pub headers: String,
    pub body: Vec<u8>,
    pub redirects: u32,
}

impl CurlOut {
    pub fn header(&self, name: &str) -> Option<String> {
        // The last response's headers (curl prints one block per response).
        let block = self
            .headers
            .split("\r\n\r\n")
            .filter(|b| !b.trim().is_empty())
            .last()?;
        block.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Run the real curl from `source` (a 127.x address) with extra args against `url`.
/// Never follows redirects (`num_redirects` must stay 0 anyway). Panics when curl is
/// missing: the test must fail, not skip.
pub fn curl(source: &str, url: &str, extra: &[&str]) -> CurlOut {
    let tmp = tempfile::tempdir().unwrap();
    let (h, b) = (tmp.path().join("h"), tmp.path().join("b"));
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "20", "--interface", source, "-D"])
        .arg(&h)
        .arg("-o")
        .arg(&b)
        .args(["-w", "%{http_code} %{num_redirects}"])
        .args(extra)
        .arg(url)
        .output()
        .expect("running curl (apt-get install curl)");
    let w = String::from_utf8_lossy(&out.stdout).to_string();
    let mut it = w.split_whitespace();
    let code = it
        .next()
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("curl failed: {w} {}", String::from_utf8_lossy(&out.stderr)));
    let redirects = it.next().and_then(|c| c.parse().ok()).unwrap_or(0);
    CurlOut {
        code,
        headers: std::fs::read_to_string(&h).unwrap_or_default(),
        body: std::fs::read(&b).unwrap_or_default(),
        redirects,
    }
}

/// GET `url` with curl from the loopback source address `from`: (HTTP code, body);
/// code 0 when no response came.
pub fn curl_get(from: &str, url: &str) -> (u16, String) {
    let out = curl(from, url, &["--max-time", "10"]);
    (out.code, out.text())
}

/// The Ignition URL, with its token, of the script `from` gets at `script_url`, as the
/// machine finds it on its kernel command line (`ignition.config.url=`); `None` when
/// the script is not 200 or has none (a default script).
pub fn script_ignition_url(from: &str, script_url: &str) -> Option<String> {
    let (code, script) = curl_get(from, script_url);
    if code != 200 {
        return None;
    }
    script
        .split_whitespace()
        .find_map(|w| w.strip_prefix("ignition.config.url="))
        .map(String::from)
}

/// Read `s` until the server closes it (EOF or reset); how long that took, or None if
/// it is still open after `limit`.
pub fn wait_closed(s: &mut TcpStream, limit: Duration) -> Option<Duration> {
    use std::io::Read as _;
    let start = Instant::now();
    s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let mut buf = [0u8; 4096];
    while start.elapsed() < limit {
        match s.read(&mut buf) {
            Ok(0) => return Some(start.elapsed()),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return Some(start.elapsed()),
        }
    }
    None
}

/// A TCP connection to `addr` from the loopback source address `src` (127.0.0.x).
pub fn connect_from(src: &str, addr: SocketAddr) -> TcpStream {
    use nix::sys::socket::{bind, connect, socket, AddressFamily, SockFlag, SockType, SockaddrIn};
    use std::os::fd::AsRawFd as _;
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .expect("socket");
    let from: std::net::SocketAddrV4 = format!("{src}:0").parse().unwrap();
    bind(fd.as_raw_fd(), &SockaddrIn::from(from)).expect("bind client source");
    let SocketAddr::V4(dst) = addr else {
        panic!("ipv4 only")
    };
    connect(fd.as_raw_fd(), &SockaddrIn::from(dst)).expect("connect");
    TcpStream::from(fd)
}
