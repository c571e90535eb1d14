//! The boot listener (`BootHttp::from_config` + `bootplane::http::run`) from a
//! `Config`'s `[http]` and `[boot]` sections: operator templates loaded from
//! `boot.ipxe_templates`, the token key created under `state_dir`, the discovery
//! default resolved through the image catalog, and a clean shutdown.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use bootplane::config::Config;
use bootplane::http::index::MemoryIndex;
use bootplane::http::{BootHttp, Metrics};
use bootplane::shutdown::Coordinator;
use support::http::curl;

#[test]
fn serve_from_config_uses_templates_catalog_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let tpl = dir.path().join("tpl");
    std::fs::create_dir_all(&tpl).unwrap();
    std::fs::write(
        tpl.join("boot.ipxe.j2"),
        "#!ipxe\n# operator template\nchain {{ base_url }}/ipxe/script?mac=${net0/mac:hexhyp}\n",
    )
    .unwrap();
    let images = dir.path().join("images");
    std::fs::create_dir_all(images.join("disc")).unwrap();
    std::fs::write(images.join("disc/k"), b"kernel").unwrap();
    std::fs::write(images.join("disc/i"), b"initrd").unwrap();
    let h = bootplane::http::catalog::FileHasher::new(&images);
    std::fs::write(
        images.join("catalog.toml"),
        format!(
            "[[image]]\nref = \"discovery:latest\"\ncmdline = \"discover=1\"\nkernel = {{ path = \"disc/k\", sha256 = \"{}\" }}\ninitrd = {{ path = \"disc/i\", sha256 = \"{}\" }}\n",
            h.sha256("disc/k").unwrap().unwrap(),
            h.sha256("disc/i").unwrap().unwrap()
        ),
    )
    .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cfg = Config {
        state_dir: dir.path().join("state"),
        ..Config::default()
    };
    cfg.http.listen = format!("127.0.0.1:{port}").parse().unwrap();
    cfg.http.assets_dir = dir.path().to_path_buf();
    cfg.http.unknown_action = "discovery".into();
    cfg.http.discovery_image = Some("discovery:latest".into());
    cfg.boot.ipxe_templates = tpl;
    cfg.boot.images_dir = images;
    cfg.validate().unwrap();
    let base = format!("http://127.0.0.1:{port}");

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let coord = Coordinator::new();
    let (c, s) = (cfg.clone(), coord.handle());
    let task = rt.spawn(async move {
        let app = BootHttp::from_config(
            &c.http,
            &c.boot,
            &c.state_dir,
            Arc::new(MemoryIndex::new()),
            Arc::new(Metrics::new()),
        )?;
        bootplane::http::run(&c.http, Arc::new(app), s).await
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "listener did not come up"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let boot = curl("127.0.0.1", &format!("{base}/boot.ipxe"), &[]);
    assert_eq!(boot.code, 200);
    assert!(
        boot.text().contains("# operator template"),
        "{}",
        boot.text()
    );
    let unknown = curl(
        "127.0.0.1",
        &format!("{base}/ipxe/script?mac=02-00-00-00-00-07"),
        &[],
    );
    assert_eq!(unknown.code, 200);
    let t = unknown.text();
    assert!(
        t.contains(&format!(
            "kernel {base}/assets/images/disc/k initrd=initrd discover=1"
        )),
        "{t}"
    );
    assert_eq!(
        curl("127.0.0.1", &format!("{base}/assets/images/disc/k"), &[]).text(),
        "kernel"
    );
    let key = std::fs::read(cfg.state_dir.join("http-token-key")).unwrap();
    assert_eq!(key.len(), 32);

    assert!(rt.block_on(coord.drain(Duration::from_secs(5))));
    rt.block_on(task).unwrap().unwrap();
}
