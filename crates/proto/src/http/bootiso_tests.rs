//! The boot-target routes through [`BootHttp::handle`]: the generic and per-machine ISO,
//! the EFI binary, token purposes, 403/404/503, HEAD and Range.

use super::*;
use crate::http::files::FileIo;
use crate::http::handler::Settings;
use crate::http::index::MemoryIndex;
use crate::http::token::TokenSigner;
use crate::http::{BootHttp, BootState, MachineBoot, Metrics};
use crate::ipxe::DefaultAction;
use http::header::{self, HeaderMap};
use http::{Request, StatusCode};
use http_body_util::BodyExt;

const BASE: &str = "http://10.0.0.1:8080";

fn app(idx: Arc<MemoryIndex>, iso: BootIso) -> BootHttp {
    let s = Settings {
        base_url: format!("{BASE}/"),
        console: "console=ttyS0".into(),
        default_action: DefaultAction::Exit,
        token_ttl_secs: 60,
        signer: TokenSigner::new(&[9u8; 32]),
        templates: vec![],
        assets_dir: None,
        images_dir: None,
        ipxe_fallback_dir: Some("/usr/lib/ipxe".into()),
        file_io: FileIo::Read,
        stream_budget_bytes: 1 << 20,
        sign_ignition_urls: true,
    };
    BootHttp::new(s, idx, Arc::new(Metrics::new()))
        .unwrap()
        .with_boot_iso(iso)
}

fn machine(boot_id: &str) -> MachineBoot {
    MachineBoot {
        server: "server-a".into(),
        uuid: None,
        ips: vec!["127.0.0.2".parse().unwrap()],
        macs: vec![],
        state: BootState::NotClaimed,
        boot_id: boot_id.into(),
        files: None,
        ignition: None,
    }
}

fn fake_iso() -> BootIso {
    BootIso::from_bytes(vec![0xeb; 3000], vec![2; 5000], vec![3; 9000], &[4; 7000]).unwrap()
}

struct Got {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

async fn req(a: &BootHttp, method: &str, uri: &str, range: Option<&str>) -> Got {
    let mut b = Request::builder().method(method).uri(uri);
    if let Some(r) = range {
        b = b.header(header::RANGE, r);
    }
    let r = a
        .handle(b.body(()).unwrap(), "127.0.0.9".parse().unwrap())
        .await;
    let status = r.status();
    let headers = r.headers().clone();
    let body = r.into_body().collect().await.unwrap().to_bytes();
    Got {
        status,
        headers,
        body,
    }
}

fn path(url: &str) -> &str {
    url.strip_prefix(BASE).unwrap()
}

/// The chain script inside an ISO (the file after the last "#!ipxe").
fn script_in(iso: &[u8]) -> String {
    let at = iso
        .windows(6)
        .rposition(|w| w == b"#!ipxe")
        .expect("script in iso");
    let end = iso[at..].iter().position(|b| *b == 0).unwrap();
    String::from_utf8(iso[at..at + end].to_vec()).unwrap()
}

#[tokio::test]
async fn generic_iso_with_head_range_and_cache() {
    let a = app(Arc::new(MemoryIndex::new()), fake_iso());
    assert_eq!(a.boot_iso_url(), format!("{BASE}/boot.iso"));
    let g = req(&a, "GET", "/boot.iso", None).await;
    assert_eq!(g.status, StatusCode::OK);
    assert_eq!(&g.body[16 * 2048 + 1..16 * 2048 + 6], b"CD001");
    assert_eq!(
        g.headers[header::CONTENT_TYPE],
        "application/x-iso9660-image"
    );
    assert_eq!(
        script_in(&g.body),
        format!("#!ipxe\ndhcp\nchain {BASE}/boot.ipxe\n")
    );
    let etag = g.headers[header::ETAG].clone();
    let again = req(&a, "GET", "/boot.iso", None).await;
    assert_eq!(
        (again.headers[header::ETAG].clone(), &again.body),
        (etag, &g.body)
    );
    let h = req(&a, "HEAD", "/boot.iso", None).await;
    assert_eq!(h.status, StatusCode::OK);
    assert!(h.body.is_empty());
    assert_eq!(
        h.headers[header::CONTENT_LENGTH],
        g.body.len().to_string().as_str()
    );
    let r = req(&a, "GET", "/boot.iso", Some("bytes=32769-32773")).await;
    assert_eq!(r.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(&r.body[..], b"CD001");
    let total = g.body.len();
    assert_eq!(
        r.headers[header::CONTENT_RANGE],
        format!("bytes 32769-32773/{total}").as_str()
    );
    // Several ranges: the whole image.
    let r = req(&a, "GET", "/boot.iso", Some("bytes=0-1,5-6")).await;
    assert_eq!((r.status, r.body.len()), (StatusCode::OK, total));
    let r = req(&a, "GET", "/boot.iso", Some(&format!("bytes={total}-"))).await;
    assert_eq!(r.status, StatusCode::RANGE_NOT_SATISFIABLE);
    let t = a.metrics().encode();
    assert!(
        t.contains("bootplane_http_requests_total{route=\"boot_iso\",code=\"200\"} 4"),
        "{t}"
    );
}

#[tokio::test]
async fn per_machine_targets_and_token_purposes() {
    let idx = Arc::new(MemoryIndex::new());
    idx.upsert(machine("sbc-1/1"));
    let a = app(idx.clone(), fake_iso());
    let iso_url = a.signed_boot_url("server-a", BootArtifact::Iso);
    let efi_url = a.signed_boot_url("server-a", BootArtifact::Efi);
    assert!(iso_url.starts_with(&format!("{BASE}/ipxe/boot.iso?server=server-a&token=")));
    assert!(efi_url.starts_with(&format!("{BASE}/ipxe/boot.efi?server=server-a&token=")));

    let g = req(&a, "GET", path(&iso_url), None).await;
    assert_eq!(g.status, StatusCode::OK);
    let script = script_in(&g.body);
    let chained = script
        .strip_prefix("#!ipxe\ndhcp\nchain ")
        .and_then(|s| s.strip_suffix('\n'))
        .unwrap_or_else(|| panic!("{script}"));
    assert!(chained.starts_with(&format!("{BASE}/ipxe/script?server=server-a&token=")));
    // The embedded script URL works from any address (a script token).
    let s = req(&a, "GET", path(chained), None).await;
    assert_eq!(s.status, StatusCode::OK, "{:?}", s.body);
    // Cached: the same image (same token) while the boot and the token are fresh.
    let g2 = req(&a, "GET", path(&iso_url), None).await;
    assert_eq!(g2.body, g.body);

    let e = req(&a, "GET", path(&efi_url), None).await;
    assert_eq!(e.status, StatusCode::OK);
    assert_eq!(
        e.body,
        std::fs::read("/usr/lib/ipxe/ipxe.efi").expect("apt-get install ipxe")
    );
    let r = req(&a, "GET", path(&efi_url), Some("bytes=0-1")).await;
    assert_eq!(
        (r.status, &r.body[..]),
        (StatusCode::PARTIAL_CONTENT, &b"MZ"[..])
    );

    // Each token opens its own route only.
    let token = |u: &str| u.split("token=").nth(1).unwrap().to_string();
    let (ti, te, ts) = (token(&iso_url), token(&efi_url), token(chained));
    for (route, t) in [
        ("boot.efi", &ti),
        ("boot.iso", &te),
        ("boot.iso", &ts),
        ("boot.efi", &ts),
    ] {
        let g = req(
            &a,
            "GET",
            &format!("/ipxe/{route}?server=server-a&token={t}"),
            None,
        )
        .await;
        assert_eq!(g.status, StatusCode::FORBIDDEN, "{route} {t}");
        assert!(g.body.starts_with(b"forbidden: "), "{:?}", g.body);
    }
    let s = req(
        &a,
        "GET",
        &format!("/ipxe/script?server=server-a&token={ti}"),
        None,
    )
    .await;
    assert_eq!(s.status, StatusCode::FORBIDDEN);
    for bad in ["", "&token=", "&token=1.AAAA"] {
        let g = req(
            &a,
            "GET",
            &format!("/ipxe/boot.iso?server=server-a{bad}"),
            None,
        )
        .await;
        assert_eq!(g.status, StatusCode::FORBIDDEN, "{bad}");
    }
    // Expired.
    let old = a
        .signer
        .mint(Purpose::BootIso, "server-a", "sbc-1/1", 1000, 60);
    let g = req(
        &a,
        "GET",
        &format!("/ipxe/boot.iso?server=server-a&token={old}"),
        None,
    )
    .await;
    assert_eq!(
        (g.status, &g.body[..]),
        (StatusCode::FORBIDDEN, &b"forbidden: token expired\n"[..])
    );
    // Unknown server, malformed requests.
    let g = req(
        &a,
        "GET",
        &format!("/ipxe/boot.iso?server=server-b&token={ti}"),
        None,
    )
    .await;
    assert_eq!(g.status, StatusCode::NOT_FOUND);
    for bad in ["/ipxe/boot.iso", "/ipxe/boot.efi?server=A_B&token=x"] {
        assert_eq!(
            req(&a, "GET", bad, None).await.status,
            StatusCode::BAD_REQUEST,
            "{bad}"
        );
    }
    // The tokens die with the boot: another claim of the same server.
    idx.upsert(machine("sbc-2/1"));
    for u in [&iso_url, &efi_url] {
        assert_eq!(
            req(&a, "GET", path(u), None).await.status,
            StatusCode::FORBIDDEN,
            "{u}"
        );
    }
    let fresh = a.signed_boot_url("server-a", BootArtifact::Iso);
    let g3 = req(&a, "GET", path(&fresh), None).await;
    assert_eq!(g3.status, StatusCode::OK);
    assert_ne!(
        script_in(&g3.body),
        script,
        "a new boot gets a new script token"
    );
    let t = a.metrics().encode();
    assert!(
        t.contains("bootplane_http_identity_refused_total{route=\"boot_iso\"}"),
        "{t}"
    );
    assert!(
        t.contains("bootplane_http_identity_refused_total{route=\"boot_efi\"}"),
        "{t}"
    );
}

#[tokio::test]
async fn missing_files_answer_503_naming_them() {
    let idx = Arc::new(MemoryIndex::new());
    idx.upsert(machine("sbc-1/1"));
    let cfg = BootIsoConfig {
        isolinux_bin: "/nonexistent/isolinux.bin".into(),
        ..BootIsoConfig::default()
    };
    let a = app(idx.clone(), BootIso::load(&cfg));
    let g = req(&a, "GET", "/boot.iso", None).await;
    assert_eq!(g.status, StatusCode::SERVICE_UNAVAILABLE);
    let msg = String::from_utf8_lossy(&g.body).into_owned();
    assert!(
        msg.contains("/nonexistent/isolinux.bin (Debian isolinux)"),
        "{msg}"
    );
    let u = a.signed_boot_url("server-a", BootArtifact::Iso);
    assert_eq!(
        req(&a, "GET", path(&u), None).await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    // The EFI target does not need the ISO's files.
    let u = a.signed_boot_url("server-a", BootArtifact::Efi);
    assert_eq!(req(&a, "GET", path(&u), None).await.status, StatusCode::OK);
    let a = app(idx, BootIso::unconfigured());
    assert_eq!(
        req(&a, "GET", "/boot.iso", None).await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
}

/// The ISO from Debian's real files, read back by isoinfo: five files, El Torito
/// pointing at ISOLINUX.BIN.
#[test]
fn debian_files_make_a_readable_iso() {
    let iso = BootIso::load(&BootIsoConfig::default());
    let img = iso
        .image(&chain_script("http://10.0.0.1:8080/boot.ipxe"))
        .expect("apt-get install isolinux syslinux-common ipxe");
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("b.iso");
    std::fs::write(&p, &img).unwrap();
    let out = std::process::Command::new("isoinfo")
        .args(["-l", "-i", p.to_str().unwrap()])
        .output()
        .expect("isoinfo (apt-get install genisoimage)");
    let l = String::from_utf8_lossy(&out.stdout);
    for n in [
        "ISOLINUX.BIN;1",
        "LDLINUX.C32;1",
        "ISOLINUX.CFG;1",
        "IPXE.KRN;1",
        "CHAIN.IPX;1",
    ] {
        assert!(l.contains(n), "{n}: {l}");
    }
    assert!(img.len() < 2 << 20, "{} bytes", img.len());
}
