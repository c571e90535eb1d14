//! `bootplane probe install`: put an OS image on this machine's own disk, the agent side
//! of "install through the in-band agent" (docs/install.md).
//!
//! 1. The target: `--device`, or the one whole disk matching `--root-device-hints`
//!    ([`crate::hints`]) among the disks `wipe --all` would take (or the `--candidate`
//!    devices); none or two matching, or a disk in use, is refused before anything is
//!    written (exit 2).
//! 2. The Ignition config (`--ignition FILE|URL`) is read before the image is written.
//! 3. The image is streamed by `bootplane-image`'s streamer, the one `bootplane
//!    provision` runs: verified against its SHA-256 (the manifest's pin, or `--sha256`),
//!    `O_DIRECT`, the first MiB zeroed first and written last, resumable from its
//!    checkpoint, which the agent (no persistent state) keeps on the device itself, in
//!    a block of the held first MiB (`stream::TARGET_CKPT_OFF`), so an install resumes
//!    after a reset too; `--checkpoint FILE` keeps it in a file instead.
//! 4. The config is written into the installed system's boot partition
//!    ([`crate::bootpart`]).
//! 5. The last stdout line is the [`InstallReport`], also posted to `--report URL` (or
//!    the kernel's `bootplane.install=`); `--reboot`/`--poweroff` only once it was
//!    accepted.
//!
//! Setting the next boot to the disk (a UEFI boot entry, Redfish's one-time `Hdd`) is the
//! server's job once it has accepted the report; the agent leaves the firmware alone.
//!
//! Exit status: 0 installed (and the report accepted, when posted); 1 the install failed
//! (source, verification, target I/O, Ignition, the deadline) or the report was not
//! accepted, and then the chosen device's first MiB is zero, so it does not look
//! bootable; 2 usage, or refused before anything was written.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bootplane_image::stream::{self, Options};

use crate::blockdev::{self, Aligned};
use crate::bootpart;
use crate::collect::attr;
use crate::hints::{self, DiskFacts, Hints};
use crate::http::{self, Outcome};
pub use crate::install_report::{IgnitionWritten, InstallReport};
use crate::parttable::Range;
use crate::sys::{cmdline_value, read_cmdline};

/// Usage text.
pub const USAGE: &str = "usage: bootplane probe install --image URL|FILE [--sha256 HEX] \
(--device DEV | --root-device-hints JSON [--candidate DEV ...]) [--ignition FILE|URL] \
[--report URL] [--deadline SECS] [--checkpoint FILE] [--reboot | --poweroff]";

/// Largest Ignition config accepted.
pub const MAX_IGNITION: u64 = 4 << 20;
/// Bytes at the start of the device that are zero whenever the install did not finish.
const HEAD: u64 = 1 << 20;
/// How long the report post is retried when `--deadline` leaves less than this.
const MIN_POST: Duration = Duration::from_secs(60);

/// Parsed arguments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Args {
    pub image: Option<String>,
    pub sha256: Option<String>,
    pub device: Option<PathBuf>,
    pub hints: Option<String>,
    pub candidates: Vec<PathBuf>,
    pub ignition: Option<String>,
    pub report: Option<String>,
    pub deadline: Option<u64>,
    pub checkpoint: Option<PathBuf>,
    pub reboot: bool,
    pub poweroff: bool,
}

/// Parse the arguments after `install`.
pub fn parse_args(args: &[String]) -> Result<Args, String> {
    let mut a = Args::default();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (key, inline) = match arg.split_once('=') {
            Some((k, v)) if k.starts_with("--") => (k, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        let mut value = |name: &str| -> Result<String, String> {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match key {
            "--image" => a.image = Some(value("--image")?),
            "--sha256" => a.sha256 = Some(value("--sha256")?),
            "--device" => a.device = Some(PathBuf::from(value("--device")?)),
            "--root-device-hints" => a.hints = Some(value("--root-device-hints")?),
            "--candidate" => a.candidates.push(PathBuf::from(value("--candidate")?)),
            "--ignition" => a.ignition = Some(value("--ignition")?),
            "--report" => a.report = Some(value("--report")?),
            "--checkpoint" => a.checkpoint = Some(PathBuf::from(value("--checkpoint")?)),
            "--deadline" => {
                let v = value("--deadline")?;
                a.deadline = Some(
                    v.parse()
                        .map_err(|_| format!("--deadline: not a number of seconds: {v:?}"))?,
                );
            }
            "--reboot" if inline.is_none() => a.reboot = true,
            "--poweroff" if inline.is_none() => a.poweroff = true,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if a.device.is_some() && (a.hints.is_some() || !a.candidates.is_empty()) {
        return Err("--device and --root-device-hints/--candidate exclude each other".into());
    }
    if a.reboot && a.poweroff {
        return Err("--reboot and --poweroff exclude each other".into());
    }
    Ok(a)
}

/// `%XX` escapes decoded (the hints on a kernel command line, where spaces and quotes
/// cannot be written as they are).
pub fn percent_decode(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad %-escape at byte {i} of {s:?}"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "not utf-8 after %-decoding".into())
}

fn log(m: &str) {
    eprintln!("bootplane probe install: {m}");
}

/// The arguments with the kernel command line's `bootplane.*` values filled in where
/// a flag is absent.
fn with_cmdline(mut a: Args, cmdline: &str) -> Result<Args, String> {
    let v = |k: &str| cmdline_value(cmdline, k);
    a.report = a.report.or_else(|| v("bootplane.install"));
    a.image = a.image.or_else(|| v("bootplane.image"));
    a.sha256 = a.sha256.or_else(|| v("bootplane.image_sha256"));
    a.ignition = a.ignition.or_else(|| v("bootplane.ignition"));
    if a.device.is_none() && a.hints.is_none() {
        a.hints = v("bootplane.root_hints")
            .map(|h| percent_decode(&h))
            .transpose()?;
    }
    Ok(a)
}

/// Run the command (the arguments after `install`); returns the exit status.
pub fn run(args: &[String]) -> i32 {
    let a = match parse_args(args).and_then(|a| with_cmdline(a, &read_cmdline())) {
        Ok(a) => a,
        Err(e) if e.is_empty() => {
            println!("{USAGE}");
            return 0;
        }
        Err(e) => {
            eprintln!("bootplane probe install: {e}\n{USAGE}");
            return 2;
        }
    };
    let url = match a.report.as_deref().map(http::parse_url).transpose() {
        Ok(u) => u,
        Err(e) => {
            log(&e);
            return 2;
        }
    };
    let Some(image) = a.image.clone() else {
        eprintln!("bootplane probe install: no image: pass --image (or boot with bootplane.image=)\n{USAGE}");
        return 2;
    };
    if a.device.is_none() && a.hints.is_none() {
        eprintln!("bootplane probe install: no device: pass --device DEV or --root-device-hints JSON\n{USAGE}");
        return 2;
    }
    let start = Instant::now();
    let deadline = a.deadline.map(Duration::from_secs);
    if let Some(d) = deadline {
        watchdog(d, image.clone(), url.clone());
    }
    let mut report = InstallReport::new(bootplane_image::source::shown(&image));
    report.system_uuid = crate::collect::system_uuid(Path::new("/"));
    let mut code = install(&a, &image, &mut report);
    report.seconds = (start.elapsed().as_secs_f64() * 1000.0).round() / 1000.0;
    report.ok = code == 0;
    let body = serde_json::to_string(&report).expect("an install report always serializes");
    println!("{body}");
    if let Some(url) = url {
        let left = deadline.map(|d| d.saturating_sub(start.elapsed()));
        if !post(&url, &body, left) {
            code = code.max(1);
        } else if a.reboot {
            log("rebooting");
            crate::sys::reboot();
        } else if a.poweroff {
            log("powering off");
            crate::sys::power_off();
        }
    }
    code
}

/// Post the report; whether it was accepted.
fn post(url: &http::Url, body: &str, left: Option<Duration>) -> bool {
    let deadline = left.map_or(Duration::from_secs(http::DEFAULT_DEADLINE), |l| {
        l.max(MIN_POST)
    });
    log(&format!("posting the report to {}:{}", url.host, url.port));
    match http::post(url, body.as_bytes(), deadline, log) {
        Outcome::Accepted(c) => {
            log(&format!("report accepted ({c})"));
            true
        }
        Outcome::Refused(c, why) => {
            log(&format!("report refused ({c}): {why}; not retrying"));
            false
        }
        Outcome::GaveUp(why) => {
            log(&format!(
                "gave up posting the report after {}s: {why}",
                deadline.as_secs()
            ));
            false
        }
    }
}

/// After `d`, report the failure and exit 1 (the streamer cannot be interrupted, and its
/// first MiB is zero until it has finished, so ending the process is safe).
fn watchdog(d: Duration, image: String, url: Option<http::Url>) {
    std::thread::spawn(move || {
        std::thread::sleep(d);
        let mut r = InstallReport::new(bootplane_image::source::shown(&image));
        r.system_uuid = crate::collect::system_uuid(Path::new("/"));
        r.seconds = d.as_secs_f64();
        r.error = Some(format!("deadline of {}s passed", d.as_secs()));
        let body = serde_json::to_string(&r).expect("an install report always serializes");
        log(r.error.as_deref().unwrap_or_default());
        println!("{body}");
        if let Some(url) = url {
            post(&url, &body, Some(MIN_POST));
        }
        std::process::exit(1);
    });
}

/// The install proper: fills `report`, returns the exit status.
fn install(a: &Args, image: &str, report: &mut InstallReport) -> i32 {
    let (device, why) = match choose_device(a) {
        Ok(d) => d,
        Err(e) => {
            log(&format!("refused: {e}; nothing was written"));
            report.error = Some(format!("refused: {e}"));
            return 2;
        }
    };
    log(&format!(
        "installing {} on {} ({})",
        report.image,
        device.display(),
        why.join(", ")
    ));
    report.device = Some(device.display().to_string());
    report.chosen_by = why;
    let fail = |report: &mut InstallReport, e: String| -> i32 {
        log(&format!("failed: {e}"));
        report.error = Some(e);
        if let Err(z) = zero_head(&device) {
            log(&format!("zeroing the first MiB after the failure: {z}"));
        }
        1
    };
    let config = match a.ignition.as_deref().map(fetch_ignition).transpose() {
        Ok(c) => c,
        Err(e) => return fail(report, e),
    };
    let mut opts = Options::new(image, &device);
    opts.sha256 = a.sha256.clone();
    opts.quiet = false;
    // The checkpoint on the device itself (the agent has no persistent state), unless
    // --checkpoint names a file.
    opts.checkpoint = a.checkpoint.clone();
    opts.checkpoint_on_target = a.checkpoint.is_none();
    match stream::provision(&opts) {
        Ok(o) => {
            report.sha256 = Some(o.sha256.clone());
            report.verified = true;
            report.bytes_written = o.raw_size;
            report.resumed_from = o.resumed_from;
            log(&format!(
                "{} bytes written and verified, sha256 {}{}",
                o.raw_size,
                o.sha256,
                if o.resumed_from > 0 {
                    format!(", resumed at {}", o.resumed_from)
                } else {
                    String::new()
                }
            ));
        }
        // Usage, target busy, too small: refused before anything was written.
        Err(e) if matches!(e.exit_code(), 2 | 20 | 21) => {
            log(&format!("refused: {e}; nothing was written"));
            report.error = Some(format!("refused: {e}"));
            return 2;
        }
        Err(e) => return fail(report, e.to_string()),
    }
    if let Some(config) = config {
        match write_ignition(&device, &config) {
            Ok(w) => report.ignition = Some(w),
            Err(e) => {
                report.verified = false;
                return fail(report, format!("ignition: {e}"));
            }
        }
    }
    0
}

/// The target and why: `--device`, or the one disk matching the hints; checked for use.
fn choose_device(a: &Args) -> Result<(PathBuf, Vec<String>), String> {
    let (path, why) = match (&a.device, &a.hints) {
        (Some(d), _) => (d.clone(), vec!["--device".to_string()]),
        (None, Some(h)) => {
            let hints = Hints::parse(h.as_bytes())?;
            let paths = match a.candidates.is_empty() {
                true => blockdev::all_disks(Path::new("/sys/block")),
                false => a.candidates.clone(),
            };
            let facts: Vec<DiskFacts> = paths.iter().map(|p| disk_facts(p)).collect();
            let (i, why) = hints::choose(&facts, &hints)?;
            (paths[i].clone(), why)
        }
        (None, None) => return Err("no device".into()),
    };
    blockdev::check(&path)?;
    Ok((path, why))
}

/// What the hints are compared with, from sysfs and `/dev/disk/by-path`.
pub fn disk_facts(path: &Path) -> DiskFacts {
    use std::os::unix::fs::MetadataExt as _;
    let mut f = DiskFacts {
        path: path.display().to_string(),
        ..Default::default()
    };
    let Ok(meta) = std::fs::metadata(path) else {
        return f;
    };
    let link = format!(
        "/sys/dev/block/{}:{}",
        libc::major(meta.rdev()),
        libc::minor(meta.rdev())
    );
    let Ok(sysfs) = std::fs::canonicalize(&link) else {
        return f;
    };
    f.size_bytes = attr(&sysfs.join("size"))
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(0)
        .saturating_mul(512);
    f.serial = crate::collect::disk_serial(&sysfs);
    f.wwn = attr(&sysfs.join("wwid")).or_else(|| attr(&sysfs.join("device/wwid")));
    f.vendor = attr(&sysfs.join("device/vendor"));
    f.model = attr(&sysfs.join("device/model")).or_else(|| attr(&sysfs.join("device/name")));
    f.rotational = attr(&sysfs.join("queue/rotational")).map(|r| r == "1");
    let real = std::fs::canonicalize(path).ok();
    f.by_path = std::fs::read_dir("/dev/disk/by-path")
        .map(|d| {
            d.flatten()
                .take(crate::collect::MAX_ENTRIES)
                .map(|e| e.path())
                .filter(|p| real.is_some() && std::fs::canonicalize(p).ok() == real)
                .map(|p| p.display().to_string())
                .collect()
        })
        .unwrap_or_default();
    f.by_path.sort();
    f
}

/// The Ignition config from a file or an `http://` URL, at most [`MAX_IGNITION`] bytes.
fn fetch_ignition(spec: &str) -> Result<Vec<u8>, String> {
    let shown = bootplane_image::source::shown(spec);
    let b = bootplane_image::spec::fetch_small(spec, MAX_IGNITION, &[])
        .map_err(|e| format!("ignition config {shown}: {e}"))?
        .ok_or_else(|| format!("ignition config {shown}: not found"))?;
    if b.len() as u64 > MAX_IGNITION {
        return Err(format!(
            "ignition config {shown} is larger than {MAX_IGNITION} bytes"
        ));
    }
    Ok(b)
}

/// Re-read the partition table, find the boot partition, write the config there.
fn write_ignition(device: &Path, config: &[u8]) -> Result<IgnitionWritten, String> {
    bootpart::reread(device)?;
    let parts = bootpart::partitions(device)?;
    let (p, found_by) = bootpart::pick(&parts)?;
    bootpart::write_config(p, config)?;
    log(&format!(
        "ignition config ({} bytes) written to {}:/{} ({found_by})",
        config.len(),
        p.dev,
        bootpart::CONFIG_PATH
    ));
    Ok(IgnitionWritten {
        partition: p.dev.clone(),
        found_by: found_by.to_string(),
        path: bootpart::CONFIG_PATH.to_string(),
        bytes: config.len() as u64,
    })
}

/// Make the first MiB of `device` zero (and synced) but for the streamer's checkpoint
/// block (`stream::TARGET_CKPT_OFF`, 4 KiB, no signature of anything bootable): a failed
/// install must not look bootable, whatever was on the disk before, and an interrupted
/// one keeps its place.
pub fn zero_head(device: &Path) -> Result<(), String> {
    let dev = blockdev::open(blockdev::check(device)?)?;
    let ckpt = stream::TARGET_CKPT_OFF;
    let zeros = Aligned::zeroed(HEAD as usize);
    for (start, end) in [(0, ckpt), (ckpt + 4096, HEAD)] {
        let r = Range {
            start: start.min(dev.size),
            end: end.min(dev.size),
        };
        if r.end > r.start {
            dev.write_zeros(r, &zeros, &mut |_| Ok(()))?;
        }
    }
    dev.sync()?;
    if dev.is_block() {
        let _ = dev.reread_partitions();
    }
    Ok(())
}

#[cfg(test)]
#[path = "install_tests.rs"]
mod tests;
