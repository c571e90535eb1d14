//! Real TFTP clients (tftp-hpa, atftp, curl, busybox) against the server on loopback:
//! every file arrives byte-identical (SHA-256) for sizes 0, 511, 512, 513, 1 MiB and
//! 33 MiB (67,584 blocks of 512: block numbers roll over), with and without options.

use crate::support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use bootplane::tftp::TftpConfig;
use support::data::*;
use support::require::require;
use support::tftp::*;

const LIMIT: Duration = Duration::from_secs(120);
const BIG: usize = 33 << 20;

fn sizes() -> Vec<(&'static str, usize)> {
    vec![
        ("s0", 0),
        ("s511", 511),
        ("s512", 512),
        ("s513", 513),
        ("s1m", 1 << 20),
        ("s33m", BIG),
    ]
}

fn setup() -> (tempfile::TempDir, TestServer) {
    let d = tmpdir();
    let root = d.path().join("root");
    std::fs::create_dir(&root).unwrap();
    write_files(&root, &sizes());
    let s = start_server("127.0.0.1:0", &root, TftpConfig::default(), None);
    (d, s)
}

fn check(root: &Path, name: &str, got: &Path, run: &Run, what: &str) {
    assert!(
        run.ok,
        "{what} {name} failed\nstdout: {}\nstderr: {}",
        run.stdout, run.stderr
    );
    assert_eq!(
        sha256_file(got),
        sha256_file(&root.join(name)),
        "{what} {name}: content differs"
    );
}

#[test]
fn tftp_hpa_all_sizes() {
    require("tftp");
    let (d, s) = setup();
    let root = d.path().join("root");
    for (name, _) in sizes() {
        let out = out_path(d.path(), &format!("hpa-{name}"));
        let mut c = Command::new("tftp");
        c.args([
            "-m",
            "binary",
            "127.0.0.1",
            &s.addr.port().to_string(),
            "-c",
            "get",
            name,
            out.to_str().unwrap(),
        ]);
        let r = run_client(&mut c, LIMIT);
        check(&root, name, &out, &r, "tftp-hpa");
    }
    assert!(s.metrics.transfers_completed.get() >= sizes().len() as u64);
}

#[test]
fn atftp_all_sizes_with_blksize_512_and_windowsize() {
    require("atftp");
    let (d, s) = setup();
    let root = d.path().join("root");
    let port = s.addr.port().to_string();
    // blksize 512 with tsize (OACK path, rollover at 33 MiB)
    for (name, _) in sizes() {
        let out = out_path(d.path(), &format!("at-{name}"));
        let mut c = Command::new("atftp");
        c.args([
            "-g",
            "-r",
            name,
            "-l",
            out.to_str().unwrap(),
            "--option",
            "blksize 512",
            "--option",
            "tsize 0",
            "127.0.0.1",
            &port,
        ]);
        check(
            &root,
            name,
            &out,
            &run_client(&mut c, LIMIT),
            "atftp blksize 512",
        );
    }
    // big blocks and a window (RFC 7440). Not 8192 x 16: atftp 0.8 itself stalls there
    // under CPU contention (its socket queue fills while it stops reading).
    for (blk, win) in [("1428", "8"), ("4096", "16"), ("65464", "4")] {
        for name in ["s513", "s1m", "s33m"] {
            let out = out_path(d.path(), &format!("atw-{blk}-{win}-{name}"));
            let mut c = Command::new("atftp");
            c.args([
                "-g",
                "-r",
                name,
                "-l",
                out.to_str().unwrap(),
                "--option",
                &format!("blksize {blk}"),
                "--option",
                &format!("windowsize {win}"),
                "127.0.0.1",
                &port,
            ]);
            check(
                &root,
                name,
                &out,
                &run_client(&mut c, LIMIT),
                &format!("atftp blksize {blk} windowsize {win}"),
            );
        }
    }
}

#[test]
fn curl_all_sizes() {
    require("curl");
    let (d, s) = setup();
    let root = d.path().join("root");
    for (name, _) in sizes() {
        for blk in ["512", "1468"] {
            let out = out_path(d.path(), &format!("curl-{blk}-{name}"));
            let mut c = Command::new("curl");
            c.args([
                "-sS",
                "--max-time",
                "100",
                "--tftp-blksize",
                blk,
                "-o",
                out.to_str().unwrap(),
            ]);
            c.arg(format!("tftp://127.0.0.1:{}/{name}", s.addr.port()));
            check(
                &root,
                name,
                &out,
                &run_client(&mut c, LIMIT),
                &format!("curl blksize {blk}"),
            );
        }
    }
}

#[test]
fn busybox_all_sizes() {
    require("busybox");
    let (d, s) = setup();
    let root = d.path().join("root");
    for (name, _) in sizes() {
        for blk in [None, Some("1024")] {
            let out = out_path(d.path(), &format!("bb-{}-{name}", blk.unwrap_or("none")));
            let mut c = Command::new("busybox");
            c.args(["tftp", "-g", "-r", name, "-l", out.to_str().unwrap()]);
            if let Some(b) = blk {
                c.args(["-b", b]);
            }
            c.args(["127.0.0.1", &s.addr.port().to_string()]);
            check(
                &root,
                name,
                &out,
                &run_client(&mut c, LIMIT),
                &format!("busybox blksize {blk:?}"),
            );
        }
    }
}

#[test]
fn netascii_mac_prefix_and_backslash_paths_with_real_clients() {
    require("tftp");
    require("atftp");
    let d = tmpdir();
    let root = d.path().join("root");
    std::fs::create_dir_all(root.join("efi/boot")).unwrap();
    let text = b"line one\nline two\r\nbare cr\rend\n".repeat(100);
    std::fs::write(root.join("text.txt"), &text).unwrap();
    std::fs::write(root.join("ipxe.efi"), pattern(100_000, 9)).unwrap();
    std::fs::write(root.join("efi/boot/bootx64.efi"), pattern(3000, 10)).unwrap();
    let s = start_server("127.0.0.1:0", &root, TftpConfig::default(), None);
    let port = s.addr.port().to_string();

    // netascii: tftp-hpa converts CRLF back; the result equals the original.
    let out = d.path().join("text.out");
    let mut c = Command::new("tftp");
    c.args([
        "-m",
        "netascii",
        "127.0.0.1",
        &port,
        "-c",
        "get",
        "text.txt",
        out.to_str().unwrap(),
    ]);
    let r = run_client(&mut c, LIMIT);
    assert!(r.ok, "{} {}", r.stdout, r.stderr);
    assert_eq!(std::fs::read(&out).unwrap(), text);

    // MAC-prefixed name resolves to the shared file; backslashes map to slashes.
    for (req, real) in [
        ("52:54:00:12:34:56/ipxe.efi", "ipxe.efi"),
        ("01-52-54-00-12-34-56/ipxe.efi", "ipxe.efi"),
        ("efi\\boot\\bootx64.efi", "efi/boot/bootx64.efi"),
    ] {
        let out = out_path(d.path(), req).with_extension("out");
        let mut c = Command::new("atftp");
        c.args([
            "-g",
            "-r",
            req,
            "-l",
            out.to_str().unwrap(),
            "127.0.0.1",
            &port,
        ]);
        check(
            &root,
            real,
            &out,
            &run_client(&mut c, LIMIT),
            &format!("atftp {req}"),
        );
    }
}

#[test]
fn single_port_mode_with_real_clients() {
    require("tftp");
    require("atftp");
    let d = tmpdir();
    let root = d.path().join("root");
    std::fs::create_dir(&root).unwrap();
    write_files(&root, &[("a", 200_000), ("b", 1 << 20)]);
    let settings = TftpConfig {
        single_port: true,
        ..TftpConfig::default()
    };
    let s = start_server("127.0.0.1:0", &root, settings, None);
    let port = s.addr.port().to_string();
    // Two clients at once through the one port.
    let out_a = d.path().join("a.out");
    let out_b = d.path().join("b.out");
    let mut ca = Command::new("tftp");
    ca.args([
        "-m",
        "binary",
        "127.0.0.1",
        &port,
        "-c",
        "get",
        "a",
        out_a.to_str().unwrap(),
    ]);
    let mut cb = Command::new("atftp");
    cb.args([
        "-g",
        "-r",
        "b",
        "-l",
        out_b.to_str().unwrap(),
        "--option",
        "blksize 1428",
        "--option",
        "windowsize 8",
        "127.0.0.1",
        &port,
    ]);
    let t = std::thread::spawn(move || run_client(&mut cb, LIMIT));
    let ra = run_client(&mut ca, LIMIT);
    let rb = t.join().unwrap();
    check(&root, "a", &out_a, &ra, "tftp-hpa single-port");
    check(&root, "b", &out_b, &rb, "atftp single-port");
}
