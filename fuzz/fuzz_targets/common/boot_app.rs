//! The boot listener's application (`BootHttp`) as `serve` builds it, for the HTTP
//! targets: one claimed machine (registered address 127.0.0.2), an assets directory and
//! an images directory with a few small files, a fixed token key. Responses are checked
//! against the listener's invariants (no redirects, Content-Length = body, partial
//! bodies inside the file, Ignition only to its machine). Both HTTP targets go through
//! [`client`] and [`handle`].

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;

use bootplane::http::files::{FileBody, FileIo, RawPart};
use bootplane::http::handler::Settings;
use bootplane::http::index::MemoryIndex;
use bootplane::http::token::TokenSigner;
use bootplane::http::{
    BootEvent, BootFiles, BootHttp, BootIndex, BootState, IgnitionData, MachineBoot, MachineId,
    Metrics,
};
use bootplane::ipxe::DefaultAction;
use bytes::Bytes;
use http::{header, Request, Response, StatusCode};

const OWNER: [u8; 4] = [127, 0, 0, 2];
const IGNITION: &[u8] = b"{\"ignition\":{\"version\":\"3.4.0\"},\"fuzz\":\"secret-ignition\"}";
/// Largest asset file; bodies are never longer than a multipart of 32 of them.
const FILE_MAX: u64 = 4096;

/// The memory index without its progress log (which would grow for every input).
struct Index(MemoryIndex);

impl BootIndex for Index {
    fn lookup(&self, id: &MachineId) -> Option<Arc<MachineBoot>> {
        self.0.lookup(id)
    }
    fn record_progress(&self, _server: &str, _event: BootEvent, _client: IpAddr) {}
}

fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("bootplane-fuzz-http-{}", std::process::id()));
    std::fs::create_dir_all(d.join("assets/sub")).unwrap();
    std::fs::create_dir_all(d.join("images/os")).unwrap();
    let body: Vec<u8> = (0..FILE_MAX).map(|i| (i % 251) as u8).collect();
    std::fs::write(d.join("assets/ipxe.efi"), &body).unwrap();
    std::fs::write(d.join("assets/sub/a b.txt"), b"hello\n").unwrap();
    std::fs::write(d.join("assets/empty"), b"").unwrap();
    std::fs::write(d.join("images/os/vmlinuz"), &body[..1000]).unwrap();
    d
}

fn app() -> BootHttp {
    let d = dir();
    let s = Settings {
        base_url: "http://10.0.0.1:8080/".into(),
        console: "console=ttyS0".into(),
        default_action: DefaultAction::Exit,
        token_ttl_secs: 3600,
        signer: TokenSigner::new(&[7u8; 32]),
        templates: vec![],
        assets_dir: Some(d.join("assets")),
        images_dir: Some(d.join("images")),
        ipxe_fallback_dir: None,
        file_io: FileIo::Read,
        stream_budget_bytes: 1 << 20,
        sign_ignition_urls: true,
    };
    let idx = MemoryIndex::new();
    idx.upsert(MachineBoot {
        server: "server-a".into(),
        boot_id: "sbc-uid-a/1".into(),
        uuid: Some("4c4c4544-0042-3510-8052-b4c04f4e4d32".into()),
        ips: vec![IpAddr::from(OWNER)],
        macs: vec![[0x52, 0x54, 0, 0xab, 0xcd, 0xef]],
        state: BootState::Ready,
        files: Some(BootFiles {
            image: "os-image:latest".into(),
            arch: "amd64".into(),
            kernel_url: "http://10.0.0.1:8080/assets/images/os/vmlinuz".into(),
            initrd_url: "http://10.0.0.1:8080/assets/images/os/initrd".into(),
            rootfs_url: String::new(),
            cmdline: "rd.neednet=1".into(),
        }),
        ignition: Some(IgnitionData {
            data: Bytes::from_static(IGNITION),
            content_type: "application/json".into(),
        }),
    });
    idx.upsert(MachineBoot {
        server: "server-b".into(),
        boot_id: String::new(),
        uuid: None,
        ips: vec![],
        macs: vec![[0x52, 0x54, 0, 0, 0, 1]],
        state: BootState::NotClaimed,
        files: None,
        ignition: None,
    });
    BootHttp::new(s, Arc::new(Index(idx)), Arc::new(Metrics::new())).expect("boot app")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

thread_local! {
    /// Built once per fuzzing process: every input meets the same files and index.
    static APP: (tokio::runtime::Runtime, BootHttp) = (runtime(), app());
}

/// The client address an input byte selects: the claimed machine's own address when
/// `bit` is clear, another one when it is set.
pub fn client(bit: bool) -> IpAddr {
    if bit {
        IpAddr::from([127, 0, 0, 9])
    } else {
        IpAddr::from(OWNER)
    }
}

/// Handle `req` from `client` with this process's boot app and check the response;
/// returns the status.
pub fn handle(req: Request<()>, client: IpAddr) -> StatusCode {
    let is_head = req.method() == http::Method::HEAD;
    let is_ignition = req.uri().path().starts_with("/ignition/");
    let resp: Response<FileBody> = APP.with(|(rt, app)| rt.block_on(app.handle(req, client)));
    let (parts, mut body) = resp.into_parts();
    assert!(
        !parts.status.is_redirection() || parts.status == StatusCode::NOT_MODIFIED,
        "the boot listener never redirects ({})",
        parts.status
    );
    if let Some(cl) = parts.headers.get(header::CONTENT_LENGTH) {
        let cl: u64 = cl.to_str().unwrap().parse().unwrap();
        if !is_head {
            assert_eq!(cl, body.remaining(), "Content-Length and body disagree");
        }
    }
    assert!(body.remaining() <= 64 * (FILE_MAX + 256), "body of {} bytes", body.remaining());
    let mut got = Vec::new();
    let file_len = body.file().map(|f| f.metadata().unwrap().len());
    while let Some(p) = body.pop_part() {
        match p {
            RawPart::Data(b) => got.extend_from_slice(&b),
            RawPart::File { pos, end } => {
                let len = file_len.expect("file part without a file");
                assert!(pos <= end && end <= len, "file part {pos}..{end} of {len}");
            }
        }
    }
    if is_ignition && parts.status == StatusCode::OK {
        // Only a valid token opens it (signed URLs: whatever the address); the fuzzer
        // cannot sign one.
        panic!("ignition served to {client} without the machine's token");
    }
    if client != IpAddr::from(OWNER) {
        assert!(
            !got.windows(16).any(|w| w == b"secret-ignition\"".as_slice()),
            "ignition data leaked to {client}"
        );
    }
    parts.status
}
