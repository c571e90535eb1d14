//! `bootplane provision --source nfs://...` against a real NFS server: nfs-ganesha (VFS
//! FSAL) with rpcbind, both inside a network namespace and a private mount namespace
//! this test creates, reached over the namespace's loopback.

use crate::support;

use std::fs;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use support::bootplane::bin;
use support::data::sha256_hex;
use support::image::*;
use support::netns::Netns;
use support::process::*;

const MIB: usize = 1 << 20;

fn ganesha_conf(export: &Path, state: &Path) -> String {
    format!(
        r#"NFS_CORE_PARAM {{ Protocols = 3; NFS_Port = 2049; MNT_Port = 20048; Enable_NLM = false; Enable_RQUOTA = false; }}
NFSV4 {{ Graceless = true; RecoveryBackend = fs; RecoveryRoot = "{state}"; }}
EXPORT {{
  Export_Id = 1; Path = "{export}"; Pseudo = "{export}";
  Access_Type = RO; Squash = No_Root_Squash; SecType = sys; Protocols = 3; Transports = TCP;
  FSAL {{ Name = VFS; }}
}}
LOG {{ Default_Log_Level = WARN; }}
"#,
        export = export.display(),
        state = state.display()
    )
}

#[test]
fn nfs_source_against_ganesha() {
    let d = tempfile::tempdir().unwrap();
    let export = d.path().join("export");
    let state = d.path().join("state");
    fs::create_dir_all(export.join("images")).unwrap();
    fs::create_dir_all(&state).unwrap();
    let data = mixed(11 * MIB + 4321, 99);
    let raw = d.path().join("raw");
    fs::write(&raw, &data).unwrap();
    pack(&raw, &export.join("images/os.bpz"), 4);
    tool(
        "zstd",
        &[
            "-q",
            "-f",
            raw.to_str().unwrap(),
            "-o",
            export.join("images/os.zst").to_str().unwrap(),
        ],
    );
    let conf = d.path().join("ganesha.conf");
    fs::write(&conf, ganesha_conf(&export, &state)).unwrap();

    let ns = Netns::new("img");
    // rpcbind and ganesha talk over /run: give them a private one.
    let script = format!(
        "mount -t tmpfs tmpfs /run && mkdir -p /run/rpcbind /run/ganesha && (rpcbind -f -w &) && sleep 0.3 && \
         exec ganesha.nfsd -F -f {} -L {} -p /run/ganesha/pid",
        conf.display(),
        d.path().join("ganesha.log").display()
    );
    let mut server = ns
        .cmd("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("unshare (util-linux) missing");
    let base = format!("nfs://127.0.0.1{}", export.display());
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let o = ns
            .cmd("nfs-ls")
            .arg(format!("{base}/images/"))
            .output()
            .expect("nfs-ls (libnfs-utils) missing");
        if o.status.success() && String::from_utf8_lossy(&o.stdout).contains("os.bpz") {
            break;
        }
        assert!(
            server.try_wait().unwrap().is_none(),
            "ganesha exited: {}",
            fs::read_to_string(d.path().join("ganesha.log")).unwrap_or_default()
        );
        assert!(Instant::now() < deadline, "ganesha not serving within 40s");
        std::thread::sleep(Duration::from_millis(300));
    }

    let run = |args: &[&str]| {
        let o = run_cmd(ns.cmd(bin()).arg("provision").args(args), 120);
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        (o.status.code().unwrap_or(-1), err)
    };
    // Packed image, manifest found next to it on the export.
    let out = d.path().join("out1");
    let (code, err) = run(&[
        "--source",
        &format!("{base}/images/os.bpz"),
        "--target",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(fs::read(&out).unwrap(), data);
    // A zstd CLI image with a whole-image checksum.
    let out = d.path().join("out2");
    let (code, err) = run(&[
        "--source",
        &format!("{base}/images/os.zst"),
        "--target",
        out.to_str().unwrap(),
        "--sha256",
        &sha256_hex(&data),
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(fs::read(&out).unwrap(), data);
    // Missing file, and a path outside any export: source errors.
    let (code, err) = run(&[
        "--source",
        &format!("{base}/images/nope.bpz"),
        "--target",
        d.path().join("o3").to_str().unwrap(),
    ]);
    assert_eq!(code, 10, "{err}");
    let (code, err) = run(&[
        "--source",
        "nfs://127.0.0.1/not/exported.bpz",
        "--target",
        d.path().join("o4").to_str().unwrap(),
    ]);
    assert_eq!(code, 10, "{err}");
    let _ = server.kill();
    let _ = server.wait();
    drop(ns);
}
