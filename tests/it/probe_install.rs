//! `bootplane probe install` on real devices: an OS disk image built here (sgdisk GPT
//! with an ESP and a partition named `boot` holding ext4 labelled `boot`, a marker file
//! in each, random bytes in a root partition), packed with the real `bootplane image
//! pack`, served by a small HTTP/1.1 server of this file (HEAD, GET, `Range`, and a stall
//! on demand), and installed by the real binary on loop devices chosen by root device
//! hints. What is checked is read from the host: the device's bytes against the raw
//! image, the Ignition config in the boot partition (content, mode 0600), the first MiB
//! after a failure, and the last stdout line (the JSON report).
//!
//! Loop devices have no serial, WWN or by-path link; the hints used are `size` and
//! `name`, among the `--candidate` loop devices (the agent's own candidates, the disks of
//! `/sys/block`, leave loop devices out).

use crate::support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bootplane_probe::InstallReport;
use support::process::{run_cmd, tool};
use support::require::require_tools;

use super::probe_wipe::{explain, Backing, Loop};

const MIB: u64 = 1 << 20;
/// Size of the OS image.
const IMAGE: u64 = 64 * MIB;
const ESP_MARK: &str = "ESP-MARKER-9b1e";
const BOOT_MARK: &str = "BOOT-MARKER-3c7a";
const IGNITION: &str =
    r#"{"ignition":{"version":"3.4.0"},"storage":{"files":[{"path":"/etc/bootplane-marker"}]}}"#;

/// The OS image: raw bytes on disk, packed next to it, and the boot partition's range.
struct OsImage {
    dir: PathBuf,
    raw: PathBuf,
    boot: (u64, u64),
}

impl Drop for OsImage {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Partition offsets and sizes in bytes, from `sgdisk -p`.
fn layout(target: &str) -> Vec<(u64, u64)> {
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

fn wait_for(dev: &str) {
    for _ in 0..200 {
        if Path::new(dev).exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{dev} did not appear");
}

/// Mount `dev` on a new directory, run `f` in it, unmount.
fn with_mount<T>(dev: &str, opts: &str, f: impl FnOnce(&Path) -> T) -> T {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "probe-install-mnt-{}-{}",
        std::process::id(),
        dev.replace('/', "_")
    ));
    std::fs::create_dir_all(&dir).unwrap();
    tool("mount", &["-o", opts, dev, dir.to_str().unwrap()]);
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&dir)));
    let _ = Command::new("umount").arg(&dir).status();
    let _ = std::fs::remove_dir(&dir);
    out.unwrap_or_else(|e| std::panic::resume_unwind(e))
}

/// Build the OS image and pack it with `bootplane image pack`.
fn os_image(test: &str) -> OsImage {
    require_tools(&[
        "losetup",
        "sgdisk",
        "mkfs.ext4",
        "mkfs.vfat",
        "mcopy",
        "mtype",
        "mdir",
        "mount",
        "umount",
        "partx",
    ]);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("probe-install-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let raw = dir.join("os.raw");
    std::fs::File::create(&raw).unwrap().set_len(IMAGE).unwrap();
    let r = raw.to_str().unwrap();
    tool(
        "sgdisk",
        &[
            "--zap-all",
            "-n1:1MiB:+8MiB",
            "-t1:ef00",
            "-c1:EFI-SYSTEM",
            "-n2:0:+16MiB",
            "-t2:8300",
            "-c2:boot",
            "-n3:0:0",
            "-t3:8300",
            "-c3:root",
            r,
        ],
    );
    let parts = layout(r);
    assert_eq!(parts.len(), 3, "{parts:?}");
    {
        let b = Backing(raw.clone());
        let l = Loop::new(&b, false);
        std::mem::forget(b);
        let _ = run_cmd(Command::new("partx").args(["-u", &l.dev]), 60);
        let (p1, p2) = (format!("{}p1", l.dev), format!("{}p2", l.dev));
        wait_for(&p2);
        tool("mkfs.vfat", &["-n", "EFI-SYSTEM", &p1]);
        tool("mkfs.ext4", &["-q", "-F", "-L", "boot", &p2]);
        // vfat through mtools: the host kernel may not have vfat (a container's does not).
        let mark = dir.join("esp-marker");
        std::fs::write(&mark, ESP_MARK).unwrap();
        tool(
            "mcopy",
            &["-i", &p1, mark.to_str().unwrap(), "::esp-marker"],
        );
        with_mount(&p2, "rw", |m| {
            std::fs::write(m.join("boot-marker"), BOOT_MARK).unwrap()
        });
    }
    // Random bytes in the root partition (incompressible: the packed image is about as
    // large, so the reset test can stop the copy halfway through it).
    let f = std::fs::OpenOptions::new().write(true).open(&raw).unwrap();
    let mut urandom = std::fs::File::open("/dev/urandom").unwrap();
    let mut chunk = vec![0u8; MIB as usize];
    let (root, len) = parts[2];
    for i in 0..(len / MIB).saturating_sub(1) {
        urandom.read_exact(&mut chunk).unwrap();
        f.write_all_at(&chunk, root + i * MIB).unwrap();
    }
    f.sync_all().unwrap();
    let packed = dir.join("os.img.zst");
    let o = run_cmd(
        Command::new(env!("CARGO_BIN_EXE_bootplane")).args([
            "image",
            "pack",
            r,
            "-o",
            packed.to_str().unwrap(),
        ]),
        300,
    );
    assert!(o.status.success(), "{}", explain(&o));
    OsImage {
        dir,
        raw,
        boot: parts[1],
    }
}

/// A small HTTP/1.1 file server over `dir`: HEAD, GET and `Range: bytes=N-`; while
/// `stall` is set, bodies are sent slowly and stop after `stall_after` bytes in all.
struct Server {
    url: String,
    sent: Arc<AtomicU64>,
    stall: Arc<AtomicBool>,
}

impl Server {
    fn new(dir: &Path, stall_after: u64) -> Server {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let sent = Arc::new(AtomicU64::new(0));
        let stall = Arc::new(AtomicBool::new(stall_after > 0));
        let (d, s, st) = (dir.to_path_buf(), sent.clone(), stall.clone());
        std::thread::spawn(move || {
            for c in l.incoming().flatten() {
                let (d, s, st) = (d.clone(), s.clone(), st.clone());
                std::thread::spawn(move || serve(c, &d, &s, &st, stall_after));
            }
        });
        Server { url, sent, stall }
    }
}

fn serve(mut c: TcpStream, dir: &Path, sent: &AtomicU64, stall: &AtomicBool, after: u64) {
    let mut r = BufReader::new(c.try_clone().unwrap());
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut from = 0u64;
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
                break;
            }
            if let Some(v) = h.to_ascii_lowercase().strip_prefix("range: bytes=") {
                from = v.trim().trim_end_matches('-').parse().unwrap_or(0);
            }
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        let (method, path) = (f[0], f.get(1).copied().unwrap_or("/"));
        let file = dir.join(path.trim_start_matches('/'));
        let Ok(body) = std::fs::read(&file) else {
            let _ = c.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n");
            continue;
        };
        let len = body.len() as u64;
        let head = match from {
            0 => format!("HTTP/1.1 200 OK\r\ncontent-length: {len}\r\n\r\n"),
            n => format!(
                "HTTP/1.1 206 Partial Content\r\ncontent-length: {}\r\ncontent-range: bytes {n}-{}/{len}\r\n\r\n",
                len - n,
                len - 1
            ),
        };
        if c.write_all(head.as_bytes()).is_err() {
            return;
        }
        if method == "HEAD" {
            continue;
        }
        for piece in body[from as usize..].chunks(64 << 10) {
            // Slow (about 6 MB/s) while stalling, so the streamer checkpoints on the way.
            while stall.load(Ordering::SeqCst) && sent.load(Ordering::SeqCst) >= after {
                std::thread::sleep(Duration::from_millis(20));
            }
            if stall.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(10));
            }
            if c.write_all(piece).is_err() {
                return;
            }
            sent.fetch_add(piece.len() as u64, Ordering::SeqCst);
        }
    }
}

fn install(args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_bootplane"));
    c.args(["probe", "install"]).args(args);
    run_cmd(&mut c, 600)
}

fn report(o: &Output) -> InstallReport {
    let out = String::from_utf8_lossy(&o.stdout);
    let last = out
        .lines()
        .last()
        .unwrap_or_else(|| panic!("no stdout: {}", explain(o)));
    serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {last:?}"))
}

fn read_range(file: &Path, off: u64, len: u64) -> Vec<u8> {
    let mut b = vec![0u8; len as usize];
    std::fs::File::open(file)
        .unwrap()
        .read_exact_at(&mut b, off)
        .unwrap();
    b
}

/// Fill the first MiB of `file` with a pattern (a disk that "looks" used).
fn scribble_head(file: &Path) {
    let f = std::fs::OpenOptions::new().write(true).open(file).unwrap();
    f.write_all_at(&vec![0xa5u8; MIB as usize], 0).unwrap();
    f.sync_all().unwrap();
}

fn checkpoint(test: &str) -> String {
    let p = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "probe-install-{test}-{}.checkpoint",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&p);
    p.to_str().unwrap().to_string()
}

#[test]
fn probe_install_by_size_hint_writes_the_image_and_the_ignition_config() {
    let img = os_image("hints");
    let srv = Server::new(&img.dir, 0);
    let ign = img.dir.join("config.ign");
    std::fs::write(&ign, IGNITION).unwrap();
    let (tb, ob) = (
        Backing::new("install-target", 1024 * MIB),
        Backing::new("install-other", 2048 * MIB),
    );
    scribble_head(&tb.0);
    let (t, other) = (Loop::new(&tb, false), Loop::new(&ob, false));
    let image_url = format!("{}/os.img.zst", srv.url);
    let ck = checkpoint("hints");
    let o = install(&[
        "--image",
        &image_url,
        "--root-device-hints",
        r#"{"size": "== 1"}"#,
        "--candidate",
        &other.dev,
        "--candidate",
        &t.dev,
        "--ignition",
        ign.to_str().unwrap(),
        "--checkpoint",
        &ck,
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", explain(&o));
    let r = report(&o);
    assert!(r.ok && r.verified && r.error.is_none(), "{r:?}");
    assert_eq!(r.device.as_deref(), Some(t.dev.as_str()));
    assert_eq!(r.chosen_by, vec!["size 1 GiB == 1".to_string()]);
    assert_eq!(r.bytes_written, IMAGE);
    assert_eq!(r.image, image_url);
    let w = r.ignition.clone().expect("ignition written");
    assert_eq!(
        (w.partition, w.found_by.as_str()),
        (format!("{}p2", t.dev), "partlabel boot")
    );
    // Every byte outside the boot partition is the image's; the other disk is untouched.
    let (bo, bl) = img.boot;
    let raw = std::fs::read(&img.raw).unwrap();
    let dev = read_range(&tb.0, 0, IMAGE);
    assert!(
        dev[..bo as usize] == raw[..bo as usize],
        "bytes before the boot partition differ"
    );
    assert!(
        dev[(bo + bl) as usize..] == raw[(bo + bl) as usize..],
        "bytes after the boot partition differ"
    );
    assert!(read_range(&ob.0, 0, MIB).iter().all(|&b| b == 0));
    let sha = String::from_utf8_lossy(&tool("sha256sum", &[img.raw.to_str().unwrap()]).stdout)
        [..64]
        .to_string();
    assert_eq!(r.sha256.as_deref(), Some(sha.as_str()));
    // The config is in the boot partition, 0600, and the image's own files are there.
    let p2 = format!("{}p2", t.dev);
    wait_for(&p2);
    let (content, mode, marker) = with_mount(&p2, "ro", |m| {
        let c = m.join("ignition/config.ign");
        (
            std::fs::read_to_string(&c).unwrap(),
            std::fs::metadata(&c).unwrap().permissions().mode() & 0o7777,
            std::fs::read_to_string(m.join("boot-marker")).unwrap(),
        )
    });
    assert_eq!(
        (content.as_str(), mode, marker.as_str()),
        (IGNITION, 0o600, BOOT_MARK)
    );
    let p1 = format!("{}p1", t.dev);
    let esp = tool("mtype", &["-i", &p1, "::esp-marker"]);
    assert_eq!(String::from_utf8_lossy(&esp.stdout), ESP_MARK);
    let o = run_cmd(Command::new("mdir").args(["-i", &p1, "::ignition"]), 60);
    assert!(!o.status.success(), "the config went to the esp too");
}

#[test]
fn probe_install_wrong_sha256_leaves_the_first_mib_zero() {
    let img = os_image("badsha");
    let srv = Server::new(&img.dir, 0);
    let tb = Backing::new("install-badsha", 256 * MIB);
    scribble_head(&tb.0);
    let t = Loop::new(&tb, false);
    let zeros = "0".repeat(64);
    // A raw image (no manifest) checked against a wrong --sha256: written, then refused
    // by the whole-image check, its first MiB never written.
    let o = install(&[
        "--image",
        &format!("{}/os.raw", srv.url),
        "--sha256",
        &zeros,
        "--device",
        &t.dev,
        "--checkpoint",
        &checkpoint("badsha"),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", explain(&o));
    let r = report(&o);
    assert!(!r.ok && !r.verified, "{r:?}");
    let e = r.error.clone().unwrap_or_default();
    assert!(e.contains("verification failed"), "{e}");
    assert!(
        read_range(&tb.0, 0, MIB).iter().all(|&b| b == 0),
        "first MiB not zero"
    );
    // The packed image with a --sha256 its manifest contradicts: refused before the copy,
    // and the disk still does not look bootable.
    scribble_head(&tb.0);
    let o = install(&[
        "--image",
        &format!("{}/os.img.zst", srv.url),
        "--sha256",
        &zeros,
        "--device",
        &t.dev,
        "--checkpoint",
        &checkpoint("badsha"),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", explain(&o));
    let e = report(&o).error.unwrap_or_default();
    assert!(e.contains("manifest is for image"), "{e}");
    assert!(
        read_range(&tb.0, 0, MIB).iter().all(|&b| b == 0),
        "first MiB not zero"
    );
}

#[test]
fn probe_install_refuses_hints_matching_none_or_two_and_bad_hints() {
    require_tools(&["losetup", "sha256sum"]);
    let (ab, bb) = (
        Backing::new("install-h1", 1024 * MIB),
        Backing::new("install-h2", 1024 * MIB),
    );
    scribble_head(&ab.0);
    scribble_head(&bb.0);
    let (a, b) = (Loop::new(&ab, false), Loop::new(&bb, false));
    let img = "http://127.0.0.1:9/never-read.img";
    let run = |hints: &str| {
        install(&[
            "--image",
            img,
            "--root-device-hints",
            hints,
            "--candidate",
            &a.dev,
            "--candidate",
            &b.dev,
        ])
    };
    let o = run(r#"{"size": "<= 1"}"#);
    assert_eq!(o.status.code(), Some(2), "{}", explain(&o));
    let r = report(&o);
    let e = r.error.clone().unwrap_or_default();
    assert!(
        e.contains("2 disks match the root device hints, want exactly one"),
        "{e}"
    );
    assert!(e.contains(&a.dev) && e.contains(&b.dev), "{e}");
    assert!(r.device.is_none() && !r.ok);
    let o = run(&format!(r#"{{"name": "{}", "size": "> 1"}}"#, a.dev));
    assert_eq!(o.status.code(), Some(2), "{}", explain(&o));
    let e = report(&o).error.unwrap_or_default();
    assert!(e.contains("no disk matches the root device hints"), "{e}");
    assert!(
        e.contains(&format!("{} (size 1 GiB > 1 does not hold)", a.dev)),
        "{e}"
    );
    assert!(
        e.contains(&format!(
            "{} (name is \"{}\", not \"{}\", size",
            b.dev, b.dev, a.dev
        )),
        "{e}"
    );
    for bad in [
        r#"{"size": "#,
        r#"{"serail": "x"}"#,
        r#"{"size": "about 1"}"#,
        "{}",
    ] {
        let o = run(bad);
        assert_eq!(o.status.code(), Some(2), "{bad}: {}", explain(&o));
        assert!(
            report(&o)
                .error
                .unwrap_or_default()
                .starts_with("refused: "),
            "{bad}"
        );
    }
    // Nothing was written to either disk.
    for f in [&ab.0, &bb.0] {
        assert!(
            read_range(f, 0, MIB).iter().all(|&x| x == 0xa5),
            "{} changed",
            f.display()
        );
    }
}

#[test]
fn probe_install_killed_mid_copy_resumes_to_the_right_bytes() {
    let img = os_image("reset");
    let srv = Server::new(&img.dir, 20 * MIB);
    let tb = Backing::new("install-reset", 256 * MIB);
    scribble_head(&tb.0);
    let t = Loop::new(&tb, false);
    let url = format!("{}/os.img.zst", srv.url);
    // No --checkpoint: the agent keeps it on the device, where a reset leaves it.
    let args = ["probe", "install", "--image", &url, "--device", &t.dev];
    let mut child = Command::new(env!("CARGO_BIN_EXE_bootplane"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the copy stalls with a checkpoint behind it, then "reset".
    let at = bootplane::image::stream::TARGET_CKPT_OFF;
    let magic = bootplane::image::stream::TARGET_CKPT_MAGIC;
    let start = Instant::now();
    while !(srv.sent.load(Ordering::SeqCst) >= 20 * MIB && read_range(&tb.0, at, 16) == magic) {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "no checkpoint after 20 MiB"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    // The first MiB is zero but for the checkpoint block: nothing bootable in it.
    let head = read_range(&tb.0, 0, MIB);
    let (before, block, after) = (
        &head[..at as usize],
        &head[at as usize..][..4096],
        &head[at as usize + 4096..],
    );
    assert!(
        before.iter().chain(after).all(|&b| b == 0),
        "first MiB not zero after the kill"
    );
    assert!(block.starts_with(magic), "no checkpoint block");
    srv.stall.store(false, Ordering::SeqCst);
    let o = run_cmd(
        Command::new(env!("CARGO_BIN_EXE_bootplane")).args(args),
        600,
    );
    assert_eq!(o.status.code(), Some(0), "{}", explain(&o));
    let r = report(&o);
    assert!(r.ok && r.verified, "{r:?}");
    assert!(r.resumed_from > 0, "did not resume: {r:?}");
    let raw = std::fs::read(&img.raw).unwrap();
    assert!(
        read_range(&tb.0, 0, IMAGE) == raw,
        "the device does not hold the image"
    );
    // The image's own first MiB replaced the checkpoint block.
    assert!(read_range(&tb.0, at, 16) != magic, "checkpoint left behind");
}
