//! Unit tests of the boot listener's handler (no socket).

use super::*;
use crate::http::index::MemoryIndex;
use crate::http::{BootFiles, IgnitionData};
use http_body_util::BodyExt;

fn app(index: Arc<MemoryIndex>) -> BootHttp {
    let s = Settings {
        base_url: "http://10.0.0.1:8080/".into(),
        console: "console=ttyS0".into(),
        default_action: DefaultAction::Exit,
        token_ttl_secs: 60,
        signer: TokenSigner::new(&[7u8; 32]),
        templates: vec![],
        assets_dir: None,
        images_dir: None,
        ipxe_fallback_dir: None,
        file_io: FileIo::Sendfile,
        stream_budget_bytes: 1 << 20,
        sign_ignition_urls: true,
    };
    BootHttp::new(s, index, Arc::new(Metrics::new())).unwrap()
}

fn machine() -> MachineBoot {
    MachineBoot {
        server: "server-a".into(),
        uuid: Some("4c4c4544-0042-3510-8052-b4c04f4e4d32".into()),
        ips: vec!["127.0.0.2".parse().unwrap()],
        macs: vec![[0x52, 0x54, 0, 0xab, 0xcd, 0xef]],
        state: BootState::Ready,
        boot_id: "sbc-uid-1/1".into(),
        files: Some(BootFiles {
            image: "os-image:latest".into(),
            arch: "amd64".into(),
            kernel_url: "http://10.0.0.1:8080/assets/images/k".into(),
            initrd_url: "http://10.0.0.1:8080/assets/images/i".into(),
            rootfs_url: String::new(),
            cmdline: "rd.neednet=1".into(),
        }),
        ignition: Some(IgnitionData {
            data: Bytes::from_static(b"{\"ignition\":{}}"),
            content_type: "application/json".into(),
        }),
    }
}

async fn get(app: &BootHttp, uri: &str, client: &str) -> (StatusCode, String) {
    let req = Request::get(uri).body(()).unwrap();
    let r = app.handle(req, client.parse().unwrap()).await;
    let status = r.status();
    let body = r.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn script_identity_and_tokens() {
    let idx = Arc::new(MemoryIndex::new());
    idx.upsert(machine());
    let a = app(idx.clone());
    // Issue 32: the script carries the Ignition token, so it needs a token of its own
    // even from the machine's registered address (which anyone on the link can take).
    for from in ["127.0.0.2", "127.0.0.3"] {
        let (s, _) = get(
            &a,
            "/ipxe/script?uuid=4C4C4544-0042-3510-8052-B4C04F4E4D32&mac=52-54-00-ab-cd-ef",
            from,
        )
        .await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{from}");
    }
    assert!(idx.events().is_empty());
    // The DHCP reply to the machine's MAC carries one, and /boot.ipxe sends it on.
    let mac = [0x52, 0x54, 0, 0xab, 0xcd, 0xef];
    let leased = Some("127.0.0.2".parse().unwrap());
    let token = a.machine_script_token(mac, leased, unix_now()).unwrap();
    assert_eq!(
        a.machine_script_token([2, 0, 0, 0, 0, 9], leased, unix_now()),
        None
    );
    let chain = |token: &str| {
        format!("/ipxe/script?uuid=4C4C4544-0042-3510-8052-B4C04F4E4D32&mac=52-54-00-ab-cd-ef&buildarch=x86_64&platform=pcbios&token={token}")
    };
    let (s, body) = get(&a, &chain(&token), "127.0.0.2").await;
    assert_eq!(s, StatusCode::OK);
    assert!(
        body.contains("ignition.config.url=http://10.0.0.1:8080/ignition/server-a/"),
        "{body}"
    );
    assert_eq!(idx.events().len(), 1);
    // Bound to the address its DHCP reply leased: read off the segment (replies to
    // clients without an address are broadcast), it is no use from another address.
    let (s, _) = get(&a, &chain(&token), "127.0.0.3").await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    // Without a leased address (a proxy offer) the token is unbound.
    let unbound = a.machine_script_token(mac, None, unix_now()).unwrap();
    let (s, _) = get(&a, &chain(&unbound), "127.0.0.3").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(idx.events().len(), 2);
    // A token minted long ago has expired.
    let old = a
        .machine_script_token(mac, leased, unix_now() - 3600)
        .unwrap();
    let (s, _) = get(&a, &chain(&old), "127.0.0.2").await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    // The token minted into the script opens the Ignition from any address.
    let url = body
        .split_whitespace()
        .find_map(|w| w.strip_prefix("ignition.config.url="))
        .unwrap();
    let path = url.strip_prefix("http://10.0.0.1:8080").unwrap();
    let (s, ign) = get(&a, path, "127.0.0.9").await;
    assert_eq!((s, ign.as_str()), (StatusCode::OK, "{\"ignition\":{}}"));
    let (s, _) = get(&a, "/ignition/server-a", "127.0.0.9").await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, _) = get(&a, "/ignition/server-a/1.AAAA", "127.0.0.9").await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    // The registered address is not enough with signed URLs (issue 32), and a bad
    // token is refused there too.
    let (s, _) = get(&a, "/ignition/server-a", "127.0.0.2").await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, _) = get(&a, "/ignition/server-a/1.AAAA", "127.0.0.2").await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, _) = get(&a, path, "127.0.0.2").await;
    assert_eq!(s, StatusCode::OK);
    // Another boot of the same server (claimed again): the old token is worthless.
    let mut again = machine();
    again.boot_id = "sbc-uid-2/1".into();
    idx.upsert(again);
    let (s, _) = get(&a, path, "127.0.0.9").await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    // Signed script URL for a machine fetching from elsewhere.
    let su = a.signed_script_url("server-a");
    let (s, _) = get(
        &a,
        su.strip_prefix("http://10.0.0.1:8080").unwrap(),
        "127.0.0.9",
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let t = a.metrics().encode();
    assert!(
        t.contains("bootplane_http_identity_refused_total{route=\"script\"} 4"),
        "{t}"
    );
}

#[tokio::test]
async fn unknown_unclaimed_and_malformed() {
    let idx = Arc::new(MemoryIndex::new());
    let mut m = machine();
    m.state = BootState::NotClaimed;
    idx.upsert(m);
    let a = app(idx);
    let (s, body) = get(
        &a,
        "/ipxe/script?uuid=00000000-0000-0000-0000-000000000001",
        "127.0.0.5",
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert!(
        body.starts_with("#!ipxe\n")
            && body.contains("unknown machine")
            && body.contains("\nexit\n"),
        "{body}"
    );
    // An unclaimed machine's script holds no secret: its own address still gets it.
    let (s, body) = get(&a, "/ipxe/script?mac=52:54:00:ab:cd:ef", "127.0.0.2").await;
    assert_eq!(s, StatusCode::OK);
    assert!(body.contains("server-a is not claimed"), "{body}");
    for bad in [
        "/ipxe/script?uuid=nope",
        "/ipxe/script?mac=12-34",
        "/ipxe/script?uuid=%ff",
        "/ignition/..",
        "/ignition/A_B",
    ] {
        let (s, _) = get(&a, bad, "127.0.0.2").await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{bad}");
    }
    let (s, body) = get(&a, "/boot.ipxe", "127.0.0.2").await;
    assert_eq!(s, StatusCode::OK);
    assert!(
        body.contains("http://10.0.0.1:8080/ipxe/script?uuid=${uuid}&")
            && body.contains("&token=${224:uristring} "),
        "{body}"
    );
    let (s, _) = get(&a, "/nothing", "127.0.0.2").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

#[test]
fn key_file_created_once() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("sub/key");
    let k1 = load_or_create_key(&p).unwrap();
    assert_eq!(k1, load_or_create_key(&p).unwrap());
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
        0o600
    );
}

#[test]
fn key_file_others_may_read_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("key");
    std::fs::write(&p, [7u8; 32]).unwrap();
    for m in [0o644, 0o640, 0o604] {
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(m)).unwrap();
        let e = load_or_create_key(&p).unwrap_err().to_string();
        assert!(
            e.contains("group or others") && e.contains(&format!("{m:04o}")),
            "{e}"
        );
    }
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(load_or_create_key(&p).unwrap(), [7u8; 32]);
}
