//! The real Ignition client (Debian's `ignition`, `-platform file`) fetches a machine's
//! rendered config over HTTP from a small server in this test on 127.0.0.1 (the local
//! config only `replace`s itself with that URL) and applies it with `-stage files
//! -root DIR` into a temp directory; the files, links, directories and units must appear
//! there with the right contents and modes.
//!
//! Host safety: every path Ignition writes is under the temp dir (`-root`,
//! `-config-cache`, `-state-file`, `-neednet`); only the `fetch` and `files` stages run.
//! Debian's build always relabels for SELinux at the end of `files` by running
//! `setfiles`; the test puts a no-op `setfiles` first in PATH (SELinux labels are not
//! what is tested here) and gives the root an `etc/selinux/config` saying `disabled`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bootplane::ignition::{
    FilesDir, IgnitionSecret, MachineFacts, RenderCache, RenderKey, Renderer, Template,
};

const IGNITION: &str = "/usr/lib/dracut/modules.d/30ignition/ignition";

const TEMPLATE: &str = r#"variant: fcos
version: 1.4.0
storage:
  files:
    - path: /etc/hostname
      mode: 0644
      contents:
        inline: "{{ hostname }}\n"
    - path: /etc/bootplane/machine.env
      mode: 0600
      contents:
        inline: |
          NAME={{ name }}
          UUID={{ uuid }}
          MAC={{ mac }}
          CLAIM={{ claim.namespace }}/{{ claim.name }}
          RACK={{ labels.rack }}
  trees:
    - local: tree
      path: /opt/tools
"#;

const SECRET: &str = r#"variant: fcos
version: 1.4.0
storage:
  directories:
    - path: /var/lib/app
      mode: 0750
  files:
    - path: /etc/hostname
      mode: 0644
      contents:
        inline: "overridden-by-secret\n"
    - path: /etc/app/big.conf
      mode: 0640
      contents:
        inline: |
REPEAT
  links:
    - path: /etc/app/current
      target: /etc/app/big.conf
systemd:
  units:
    - name: app.service
      enabled: true
      contents: |
        [Unit]
        Description=App
        [Service]
        ExecStart=/usr/bin/sleep infinity
        [Install]
        WantedBy=multi-user.target
      dropins:
        - name: 10-env.conf
          contents: |
            [Service]
            EnvironmentFile=/etc/bootplane/machine.env
    - name: unwanted.service
      mask: true
"#;

struct Server {
    port: u16,
    stop: Arc<AtomicBool>,
    hits: Arc<AtomicUsize>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// A tiny HTTP/1.0 server: `GET /ignition/<server>` answers from the render cache.
fn serve(cache: Arc<RenderCache>, secret_rev: &'static str, template_rev: String) -> Server {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let port = l.local_addr().unwrap().port();
    let stop = Arc::new(AtomicBool::new(false));
    let hits = Arc::new(AtomicUsize::new(0));
    let (s2, h2) = (stop.clone(), hits.clone());
    let handle = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(120);
        while !s2.load(Ordering::SeqCst) && Instant::now() < deadline {
            let (mut sock, _) = match l.accept() {
                Ok(c) => c,
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                }
            };
            let _ = sock.set_nonblocking(false);
            let _ = sock.set_read_timeout(Some(Duration::from_secs(5)));
            let mut line = String::new();
            let mut r = BufReader::new(sock.try_clone().unwrap());
            if r.read_line(&mut line).is_err() {
                continue;
            }
            loop {
                let mut h = String::new();
                if r.read_line(&mut h).map(|n| n == 0).unwrap_or(true) || h == "\r\n" {
                    break;
                }
            }
            let path = line.split_whitespace().nth(1).unwrap_or("");
            let body = path
                .strip_prefix("/ignition/")
                .and_then(|srv| cache.get(srv, secret_rev, &template_rev));
            let resp = match body {
                Some(r) => {
                    h2.fetch_add(1, Ordering::SeqCst);
                    let mut v = format!("HTTP/1.0 200 OK\r\nContent-Type: application/vnd.coreos.ignition+json\r\nContent-Length: {}\r\n\r\n", r.json.len()).into_bytes();
                    v.extend_from_slice(&r.json);
                    v
                }
                None => b"HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_vec(),
            };
            let _ = sock.write_all(&resp);
        }
    });
    Server {
        port,
        stop,
        hits,
        handle: Some(handle),
    }
}

fn run(stage: &str, dir: &Path, local: &Path, shim: &Path) -> String {
    let path = format!(
        "{}:{}",
        shim.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut child = Command::new(IGNITION)
        .args(["-platform", "file", "-stage", stage, "-log-to-stdout"])
        .arg("-root")
        .arg(dir.join("root"))
        .arg("-config-cache")
        .arg(dir.join("cache.json"))
        .arg("-state-file")
        .arg(dir.join("state"))
        .arg("-neednet")
        .arg(dir.join("neednet"))
        .args(["-fetch-timeout", "20s"])
        .env("IGNITION_CONFIG_FILE", local)
        .env("PATH", path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running {IGNITION}: {e} (install Debian's `ignition`, see scripts/test-packages.txt)"));
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("ignition -stage {stage} timed out");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let st = child.wait().unwrap();
    assert!(st.success(), "ignition -stage {stage} failed:\n{out}");
    out
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .permissions()
        .mode()
        & 0o7777
}

#[test]
fn real_ignition_client_fetches_over_http_and_applies_files() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::create_dir_all(dir.join("root/etc/selinux")).unwrap();
    std::fs::write(
        dir.join("root/etc/selinux/config"),
        "SELINUX=disabled\nSELINUXTYPE=targeted\n",
    )
    .unwrap();
    std::fs::create_dir_all(dir.join("shim")).unwrap();
    std::fs::write(
        dir.join("shim/setfiles"),
        "#!/bin/sh\ncat >/dev/null\nexit 0\n",
    )
    .unwrap();
    std::fs::set_permissions(
        dir.join("shim/setfiles"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();

    // Render what server-a gets: template (facts) + claim secret, through the cache.
    let big: String = (0..200)
        .map(|i| format!("          option{i} = value{i}\n"))
        .collect();
    let secret = IgnitionSecret {
        ignition: SECRET.replace("REPEAT\n", &big),
        format: Some("fcos".into()),
    };
    let mut r = Renderer::new();
    let mut files = FilesDir::new();
    files
        .dir("tree")
        .file("tree/bin/hello", "#!/bin/sh\necho hello\n", true)
        .file("tree/README", "tools\n", false);
    r.set_files(files);
    let t = Template::new("default.bu", TEMPLATE);
    let trev = t.revision.clone();
    r.add_template(t).unwrap();
    let facts = MachineFacts {
        name: "server-a".into(),
        uuid: Some("38947555-7742-3448-3784-823347823834".into()),
        hostname: Some("node-a".into()),
        macs: vec!["52:54:00:aa:bb:cc".into()],
        ips: vec!["127.0.0.1".into()],
        labels: [("rack".to_string(), "r7".to_string())].into(),
        claim_name: Some("claim-a".into()),
        claim_namespace: Some("team".into()),
    };
    let cache = Arc::new(RenderCache::new());
    let key = RenderKey {
        server: "server-a".into(),
        secret_revision: "42".into(),
        template_revision: trev.clone(),
    };
    let rendered = cache
        .get_or_render(&key, || r.render(Some("default.bu"), &facts, Some(&secret)))
        .unwrap();
    assert_eq!(rendered.version.as_str(), "3.3.0");
    // The big file is auto-compressed; check the client decompresses it.
    assert!(rendered.config["storage"]["files"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["contents"]["compression"] == "gzip"));

    let srv = serve(cache.clone(), "42", trev);
    let local = dir.join("local.ign");
    std::fs::write(
        &local,
        format!(r#"{{"ignition":{{"version":"3.3.0","config":{{"replace":{{"source":"http://127.0.0.1:{}/ignition/server-a"}}}}}}}}"#, srv.port),
    )
    .unwrap();

    let fetch_log = run("fetch", dir, &local, &dir.join("shim"));
    assert!(
        fetch_log.contains(&format!(
            "GET http://127.0.0.1:{}/ignition/server-a",
            srv.port
        )),
        "{fetch_log}"
    );
    assert!(srv.hits.load(Ordering::SeqCst) >= 1);
    run("files", dir, &local, &dir.join("shim"));

    let root = dir.join("root");
    let read =
        |p: &str| std::fs::read_to_string(root.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
    // Secret overrides the template's hostname (merge order: template, then secret).
    assert_eq!(read("etc/hostname"), "overridden-by-secret\n");
    assert_eq!(mode(&root.join("etc/hostname")), 0o644);
    assert_eq!(
        read("etc/bootplane/machine.env"),
        "NAME=server-a\nUUID=38947555-7742-3448-3784-823347823834\nMAC=52:54:00:aa:bb:cc\nCLAIM=team/claim-a\nRACK=r7\n"
    );
    assert_eq!(mode(&root.join("etc/bootplane/machine.env")), 0o600);
    assert_eq!(
        read("etc/app/big.conf"),
        big.lines()
            .map(|l| format!("{}\n", l.trim_start()))
            .collect::<String>()
    );
    assert_eq!(mode(&root.join("etc/app/big.conf")), 0o640);
    assert_eq!(read("opt/tools/bin/hello"), "#!/bin/sh\necho hello\n");
    assert_eq!(mode(&root.join("opt/tools/bin/hello")), 0o755);
    assert_eq!(read("opt/tools/README"), "tools\n");
    assert_eq!(mode(&root.join("opt/tools/README")), 0o644);
    assert!(root.join("var/lib/app").is_dir());
    assert_eq!(mode(&root.join("var/lib/app")), 0o750);
    assert_eq!(
        std::fs::read_link(root.join("etc/app/current")).unwrap(),
        Path::new("/etc/app/big.conf")
    );
    assert!(read("etc/systemd/system/app.service").contains("ExecStart=/usr/bin/sleep infinity"));
    assert_eq!(
        read("etc/systemd/system/app.service.d/10-env.conf"),
        "[Service]\nEnvironmentFile=/etc/bootplane/machine.env\n"
    );
    assert_eq!(
        std::fs::read_link(root.join("etc/systemd/system/unwanted.service")).unwrap(),
        Path::new("/dev/null")
    );
    assert!(read("etc/systemd/system-preset/20-ignition.preset").contains("enable app.service"));
}
