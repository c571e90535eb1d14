//! `bootplane probe wipe` on real devices: loop devices over sparse files (partitioned
//! with sgdisk, ext4, vfat and xfs made in the partitions, markers written at the start,
//! middle and end), a read-only loop device, a mounted partition and a plain disk
//! image, all driven through the real binary. What is checked is read from the host:
//! `wipefs --no-act` and `blkid -p` find no signature, the backing file holds no marker
//! (the middle one stays after `metadata`: that policy erases metadata, not data), and
//! the last stdout line is the JSON report.
//!
//! Every test makes its own backing file (named after the test and the process) and its
//! own loop device (`losetup --find`), detached and removed on drop, also on panic.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::mpsc;

use bootplane_probe::{Method, WipeReport};
use support::process::{run_cmd, tool};
use support::require::require_tools;

const MIB: u64 = 1 << 20;
/// Size of the partitioned test disks (xfs needs a 300 MiB file system).
pub(crate) const DISK: u64 = 1024 * MIB;
const MARK: &[u8] = b"TENANT-DATA-MARKER-5f1c";

/// A sparse backing file, removed on drop.
pub(crate) struct Backing(pub(crate) PathBuf);

impl Backing {
    pub(crate) fn new(test: &str, size: u64) -> Backing {
        let p = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("probe-wipe-{test}-{}.img", std::process::id()));
        let f = std::fs::File::create(&p).unwrap();
        f.set_len(size).unwrap();
        Backing(p)
    }
}

impl Drop for Backing {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A loop device (with partition scanning) over a backing file, detached on drop.
pub(crate) struct Loop {
    pub(crate) dev: String,
}

impl Loop {
    pub(crate) fn new(backing: &Backing, read_only: bool) -> Loop {
        let file = backing.0.to_str().unwrap();
        let mut args = vec!["--find", "--show", "--partscan"];
        if read_only {
            args.push("--read-only");
        }
        args.push(file);
        let o = tool("losetup", &args);
        Loop {
            dev: String::from_utf8_lossy(&o.stdout).trim().to_string(),
        }
    }

    fn part(&self, n: usize) -> String {
        format!("{}p{n}", self.dev)
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
    }
}

/// A mount, unmounted on drop (before its loop device: declared after it).
struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Partition `target` with GPT: `p1` MiB (ext4), `p2` MiB (vfat), the rest (xfs); the
/// partitions' (offset, size) in bytes.
fn partition(target: &str, p1: u32, p2: u32) -> Vec<(u64, u64)> {
    let (n1, n2) = (format!("-n1:1MiB:+{p1}MiB"), format!("-n2:0:+{p2}MiB"));
    tool(
        "sgdisk",
        &[
            "--zap-all",
            &n1,
            "-t1:8300",
            &n2,
            "-t2:ef00",
            "-n3:0:0",
            "-t3:8300",
            target,
        ],
    );
    let o = tool("sgdisk", &["-p", target]);
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.first()?.parse::<u32>().ok()?;
            let s: u64 = f.get(1)?.parse().ok()?;
            let e: u64 = f.get(2)?.parse().ok()?;
            Some((s * 512, (e - s + 1) * 512))
        })
        .collect()
}

/// A partitioned loop disk with ext4, vfat and xfs and the three markers.
pub(crate) fn tenant_disk(test: &str) -> (Backing, Loop, Vec<(u64, u64)>) {
    require_tools(&[
        "losetup",
        "sgdisk",
        "mkfs.ext4",
        "mkfs.vfat",
        "mkfs.xfs",
        "wipefs",
        "blkid",
    ]);
    let b = Backing::new(test, DISK);
    let l = Loop::new(&b, false);
    let parts = partition(&l.dev, 100, 64);
    assert_eq!(parts.len(), 3, "{parts:?}");
    let _ = run_cmd(Command::new("partx").args(["-u", &l.dev]), 60);
    wait_for(&l.part(3));
    tool("mkfs.ext4", &["-q", "-F", &l.part(1)]);
    tool("mkfs.vfat", &[&l.part(2)]);
    tool("mkfs.xfs", &["-q", "-f", &l.part(3)]);
    assert!(!probe_signatures(&l.dev, &parts).is_empty());
    write_markers(&b.0, DISK);
    (b, l, parts)
}

fn wait_for(dev: &str) {
    for _ in 0..100 {
        if Path::new(dev).exists() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("{dev} did not appear");
}

/// Offsets of the markers: in the gap after the GPT, the middle, just before the backup GPT.
fn marker_offsets(size: u64) -> [u64; 3] {
    [64 * 1024, size / 2, size - 64 * 1024]
}

fn write_markers(file: &Path, size: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(file).unwrap();
    for at in marker_offsets(size) {
        std::os::unix::fs::FileExt::write_all_at(&f, MARK, at).unwrap();
    }
    f.sync_all().unwrap();
}

/// Which markers the file still holds (start, middle, end).
pub(crate) fn markers(file: &Path, size: u64) -> [bool; 3] {
    let f = std::fs::File::open(file).unwrap();
    marker_offsets(size).map(|at| {
        let mut b = vec![0u8; MARK.len()];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut b, at).unwrap();
        b == MARK
    })
}

/// Every signature wipefs and blkid find on the device, its partition nodes (those that
/// still exist) and at each partition's old offset.
pub(crate) fn probe_signatures(dev: &str, parts: &[(u64, u64)]) -> Vec<String> {
    let mut found = Vec::new();
    let mut targets = vec![dev.to_string()];
    for n in 1..=parts.len() {
        let p = format!("{dev}p{n}");
        if Path::new(&p).exists() {
            targets.push(p);
        }
    }
    for t in &targets {
        let o = run_cmd(Command::new("wipefs").args(["--no-act", t]), 60);
        let out = String::from_utf8_lossy(&o.stdout).trim().to_string();
        if !out.is_empty() {
            found.push(format!("wipefs {t}: {out}"));
        }
        let o = run_cmd(Command::new("blkid").args(["-p", t]), 60);
        let out = String::from_utf8_lossy(&o.stdout).trim().to_string();
        if !out.is_empty() {
            found.push(format!("blkid -p {t}: {out}"));
        }
    }
    for (off, size) in parts {
        let (o, s) = (off.to_string(), size.to_string());
        let out = run_cmd(
            Command::new("blkid").args(["-p", "-O", &o, "-S", &s, dev]),
            60,
        );
        let out = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !out.is_empty() {
            found.push(format!("blkid -p -O {o} {dev}: {out}"));
        }
    }
    found
}

pub(crate) fn wipe(args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_bootplane"));
    c.args(["probe", "wipe"]).args(args);
    run_cmd(&mut c, 600)
}

pub(crate) fn report(o: &Output) -> WipeReport {
    let out = String::from_utf8_lossy(&o.stdout);
    let last = out
        .lines()
        .last()
        .unwrap_or_else(|| panic!("no stdout; stderr: {}", String::from_utf8_lossy(&o.stderr)));
    serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {last:?}"))
}

pub(crate) fn explain(o: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn sha(file: &Path) -> String {
    let o = tool("sha256sum", &[file.to_str().unwrap()]);
    String::from_utf8_lossy(&o.stdout)[..64].to_string()
}

#[test]
fn probe_wipe_metadata_erases_every_signature() {
    let (b, l, parts) = tenant_disk("metadata");
    let o = wipe(&["--device", &l.dev, "--policy", "metadata"]);
    assert_eq!(o.status.code(), Some(0), "{}", explain(&o));
    let r = report(&o);
    assert!(r.ok, "{r:?}");
    let d = &r.disks[0];
    assert_eq!((d.device.as_str(), d.size_bytes), (l.dev.as_str(), DISK));
    assert_eq!(d.method, Some(Method::ZeroRanges));
    assert!(d.verified && d.error.is_none(), "{d:?}");
    // Device ends, three partitions' ends, btrfs mirrors at 64 MiB of each.
    assert!(d.ranges_zeroed >= 5, "{d:?}");
    assert_eq!(d.bytes_verified, d.bytes_written);
    let left = probe_signatures(&l.dev, &parts);
    assert!(left.is_empty(), "signatures left: {left:#?}");
    // metadata erases tables and signatures, not data: the middle marker stays.
    assert_eq!(markers(&b.0, DISK), [false, true, false]);
}

#[test]
fn probe_wipe_full_leaves_only_zeros() {
    let (b, l, parts) = tenant_disk("full");
    let o = wipe(&["--device", &l.dev, "--policy", "full", "--deadline", "300"]);
    assert_eq!(o.status.code(), Some(0), "{}", explain(&o));
    let r = report(&o);
    let d = &r.disks[0];
    assert!(r.ok && d.verified, "{r:?}");
    assert_eq!(d.bytes_verified, DISK);
    // A loop device's discard punches holes in its file: they read as zeros.
    assert!(
        matches!(d.method, Some(Method::Discard) | Some(Method::Zeroout)),
        "{d:?}"
    );
    assert!(probe_signatures(&l.dev, &parts).is_empty());
    assert_eq!(markers(&b.0, DISK), [false, false, false]);
    let mut f = std::fs::File::open(&b.0).unwrap();
    let mut buf = vec![0u8; 8 << 20];
    let mut at = 0u64;
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        if let Some(i) = buf[..n].iter().position(|&x| x != 0) {
            panic!("backing file not zero at {}", at + i as u64);
        }
        at += n as u64;
    }
    assert_eq!(at, DISK);
}

#[test]
fn probe_wipe_read_only_device_fails_and_says_so() {
    require_tools(&["losetup", "sgdisk", "sha256sum"]);
    let b = Backing::new("readonly", 64 * MIB);
    partition(b.0.to_str().unwrap(), 16, 16);
    write_markers(&b.0, 64 * MIB);
    let before = sha(&b.0);
    let l = Loop::new(&b, true);
    for policy in ["metadata", "full"] {
        let o = wipe(&["--device", &l.dev, "--policy", policy]);
        assert_eq!(o.status.code(), Some(1), "{}", explain(&o));
        let r = report(&o);
        assert!(!r.ok);
        let d = &r.disks[0];
        assert!(!d.verified && d.method.is_none(), "{d:?}");
        let e = d.error.as_deref().unwrap_or("");
        assert!(e.contains("device is read-only"), "{e}");
        assert_eq!(d.size_bytes, 64 * MIB);
    }
    assert_eq!(sha(&b.0), before, "the backing file changed");
}

#[test]
fn probe_wipe_refuses_a_mounted_partition() {
    require_tools(&["losetup", "sgdisk", "mkfs.ext4", "mount", "umount"]);
    let b = Backing::new("mounted", 256 * MIB);
    let l = Loop::new(&b, false);
    partition(&l.dev, 100, 64);
    let _ = run_cmd(Command::new("partx").args(["-u", &l.dev]), 60);
    wait_for(&l.part(1));
    tool("mkfs.ext4", &["-q", "-F", &l.part(1)]);
    write_markers(&b.0, 256 * MIB);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("probe-wipe-mnt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    tool("mount", &[&l.part(1), dir.to_str().unwrap()]);
    let _m = Mount(dir);
    let head = |p: &Path| {
        let mut v = vec![0u8; MIB as usize];
        std::fs::File::open(p).unwrap().read_exact(&mut v).unwrap();
        v
    };
    let before = head(&b.0);
    for args in [
        &["--device", l.dev.as_str(), "--policy", "full"][..],
        &["--device", &l.part(1), "--policy", "metadata"],
    ] {
        let o = wipe(args);
        assert_eq!(o.status.code(), Some(2), "{}", explain(&o));
        let r = report(&o);
        let e = r.error.unwrap_or_default();
        assert!(e.contains("mounted"), "{e}");
        assert!(r.disks.iter().all(|d| d.method.is_none() && !d.verified));
    }
    assert_eq!(head(&b.0), before, "the table was written");
    assert_eq!(markers(&b.0, 256 * MIB), [true, true, true]);
}

/// A one-request HTTP server that answers 200 and hands back the body.
fn receiver() -> (String, mpsc::Receiver<String>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/wipe/report?server=x", l.local_addr().unwrap());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let n = s.read(&mut chunk).unwrap();
            buf.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&buf).to_string();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let len: usize = head
                    .lines()
                    .find_map(|h| {
                        h.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().parse().unwrap())
                    })
                    .unwrap_or(0);
                if body.len() >= len || n == 0 {
                    s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                        .unwrap();
                    let _ = tx.send(body.to_string());
                    return;
                }
            }
        }
    });
    (url, rx)
}

#[test]
fn probe_wipe_disk_image_file_and_report_post() {
    require_tools(&["sgdisk", "wipefs", "blkid"]);
    let size = 96 * MIB;
    let b = Backing::new("file", size);
    partition(b.0.to_str().unwrap(), 16, 16);
    write_markers(&b.0, size);
    let (url, got) = receiver();
    let file = b.0.to_str().unwrap();
    let o = wipe(&["--device", file, "--policy", "metadata", "--report", &url]);
    assert_eq!(o.status.code(), Some(0), "{}", explain(&o));
    let r = report(&o);
    assert!(r.ok && r.disks[0].verified, "{r:?}");
    let posted: WipeReport = serde_json::from_str(&got.recv().unwrap()).unwrap();
    assert_eq!(posted, r, "the post carries the printed report");
    let o = run_cmd(Command::new("wipefs").args(["--no-act", file]), 60);
    assert!(
        String::from_utf8_lossy(&o.stdout).trim().is_empty(),
        "{}",
        explain(&o)
    );
    assert_eq!(markers(&b.0, size), [false, true, false]);
    let o = wipe(&["--device", file, "--policy", "full"]);
    assert_eq!(o.status.code(), Some(0), "{}", explain(&o));
    let r = report(&o);
    assert_eq!(r.disks[0].bytes_verified, size);
    assert!(matches!(
        r.disks[0].method,
        Some(Method::PunchHole) | Some(Method::Overwrite)
    ));
    let data = std::fs::read(&b.0).unwrap();
    assert_eq!(data.len() as u64, size);
    assert!(data.iter().all(|&x| x == 0));
}
