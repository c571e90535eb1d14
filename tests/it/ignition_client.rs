//! The real Ignition client (Debian's `ignition`, `-platform file`) fetches a machine's
//! config over HTTP from bootplane's own boot listener and applies it with `-stage files
//! -root DIR` into a temp directory; the files, links, directories and units must appear
//! there with the right contents and modes.
//!
//! The whole path is the product's: bootplane runs as a process (tests/support/bootplane.rs), the
//! test registers a Server (address 127.0.0.5, labels), a Butane `fcos` Secret and a
//! ServerClaim through the API, the operator template comes from a private
//! `boot.ignition_templates` directory (picked by the Server's
//! `bootplane.dev/ignition-template` label, with a `files/` tree), and the claim's
//! secret is merged on top. Identity: the machine's script is fetched from its
//! registered address (curl bound to 127.0.0.5); the Ignition URL in it carries the
//! signed per-boot token, and Ignition (which cannot bind a source address) uses that
//! URL from 127.0.0.1, where the unsigned URL is refused.
//!
//! Host safety: every path Ignition writes is under the temp dir (`-root`,
//! `-config-cache`, `-state-file`, `-neednet`); only the `fetch` and `files` stages run.
//! Debian's build always relabels for SELinux at the end of `files` by running
//! `setfiles`; the test puts a no-op `setfiles` first in PATH (SELinux labels are not
//! what is tested here) and gives the root an `etc/selinux/config` saying `disabled`.

use crate::support;

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use support::api::*;
use support::bootplane::*;
use support::http::curl_get;

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
fn real_ignition_client_fetches_from_bootplane_and_applies_files() {
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

    // The operator's template directory: `machine.bu` (selected by label) with a files
    // tree, and a `default.bu` that must NOT be used for this server.
    let tdir = dir.join("templates");
    std::fs::create_dir_all(tdir.join("files/tree/bin")).unwrap();
    std::fs::write(tdir.join("machine.bu"), TEMPLATE).unwrap();
    std::fs::write(
        tdir.join("default.bu"),
        "variant: fcos\nversion: 1.4.0\nstorage:\n  files:\n    - path: /etc/wrong-template\n      contents:\n        inline: x\n",
    )
    .unwrap();
    std::fs::write(tdir.join("files/tree/bin/hello"), "#!/bin/sh\necho hello\n").unwrap();
    std::fs::set_permissions(
        tdir.join("files/tree/bin/hello"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::fs::write(tdir.join("files/tree/README"), "tools\n").unwrap();
    std::fs::set_permissions(
        tdir.join("files/tree/README"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();

    let tset = format!("boot.ignition_templates={:?}", tdir.display().to_string());
    let b = Bootplane::start(&["--set", &tset]);

    const MACHINE_IP: &str = "127.0.0.5";
    let mut srv = server(
        "server-a",
        json!({"rack": "r7", "bootplane.dev/hostname": "node-a",
               "bootplane.dev/ignition-template": "machine"}),
        "Recycle",
    );
    srv["spec"]["systemUUID"] = json!("38947555-7742-3448-3784-823347823834");
    srv["status"]["networkInterfaces"] =
        json!([{"name": "eth0", "macAddress": "52:54:00:AA:BB:CC", "ip": MACHINE_IP}]);
    assert_eq!(b.call("POST", SERVERS, Some(&srv)).0, 201);
    let big: String = (0..200)
        .map(|i| format!("          option{i} = value{i}\n"))
        .collect();
    let secret = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "claim-a-ign", "namespace": "default"},
        "stringData": {"format": "fcos", "ignition": SECRET.replace("REPEAT\n", &big)}});
    let sbc_path = b.claim_ready_with_ignition("claim-a", "server-a", &secret, 30);

    // The machine asks for its script with the token of its DHCP reply.
    let base = format!("http://127.0.0.1:{}", b.http_port);
    let (_, ign_url) = b.signed_script(MACHINE_IP, "server-a", 30);
    assert!(
        ign_url.starts_with(&format!("{base}/ignition/server-a/")),
        "signed per-boot URL: {ign_url}"
    );
    // Without the token, 127.0.0.1 is not this machine.
    let (code, _) = curl_get("127.0.0.1", &format!("{base}/ignition/server-a"));
    assert_eq!(code, 403, "unsigned ignition URL from a foreign address");

    let local = dir.join("local.ign");
    std::fs::write(
        &local,
        format!(r#"{{"ignition":{{"version":"3.3.0","config":{{"replace":{{"source":"{ign_url}"}}}}}}}}"#),
    )
    .unwrap();
    let fetch_log = run("fetch", dir, &local, &dir.join("shim"));
    assert!(
        fetch_log.contains(&format!("GET {base}/ignition/server-a/")),
        "{fetch_log}"
    );
    run("files", dir, &local, &dir.join("shim"));

    let root = dir.join("root");
    let read =
        |p: &str| std::fs::read_to_string(root.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
    assert!(
        !root.join("etc/wrong-template").exists(),
        "the label picks machine.bu, not default.bu"
    );
    // Secret overrides the template's hostname (merge order: template, then secret).
    assert_eq!(read("etc/hostname"), "overridden-by-secret\n");
    assert_eq!(mode(&root.join("etc/hostname")), 0o644);
    // The machine's facts, from the Server and the claim bound to it.
    assert_eq!(
        read("etc/bootplane/machine.env"),
        "NAME=server-a\nUUID=38947555-7742-3448-3784-823347823834\nMAC=52:54:00:aa:bb:cc\nCLAIM=default/claim-a\nRACK=r7\n"
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

    // The fetch is recorded on the boot configuration.
    b.wait_for(20, "IgnitionDataFetched", || {
        let s = b.get(&sbc_path);
        s["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "IgnitionDataFetched" && c["status"] == "True")
            .then_some(())
    });
}
