//! `bootplane probe wipe`: erase disks by policy and prove it by reading back, the
//! agent side of "wipe on release" (docs/wipe.md).
//!
//! `metadata` zeroes the ranges [`crate::parttable::plan`] derives from the partition
//! table (first and last MiB of the device and of every partition, btrfs mirrors) and
//! reads every one of them back. `full` makes every byte read as zero (NVMe Format with
//! user data erase where the controller offers it; else `BLKDISCARD`, checked by samples
//! chunk by chunk, with `BLKZEROOUT` where discarded blocks do not read as zero; else an
//! `O_DIRECT` overwrite; a regular file gets its hole punched) and then reads the whole
//! device back. A device is reported `verified` only after that read-back found nothing
//! but zeros. Human lines go to stderr (progress at most once a second); the last line
//! on stdout is the [`WipeReport`], also posted to `--report URL` (or the kernel's
//! `bootplane.wipe=`).
//!
//! Exit status: 0 every device wiped and verified (and the report accepted, when posted);
//! 1 a device failed (read-only, a write or the verification failed, the deadline
//! passed) or the report was not accepted; 2 usage, or refused before anything was
//! written (mounted, held, not a device).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::blockdev::{self, Aligned, Checked, Dev, BUF};
use crate::http::{self, Outcome};
use crate::parttable::{self, Range};
use crate::sys::{cmdline_value, read_cmdline};
pub use crate::wipe_report::{DiskWipe, Method, Policy, WipeReport};

/// Usage text.
pub const USAGE: &str = "usage: bootplane probe wipe (--device DEV ... | --all) \
--policy metadata|full [--report URL] [--deadline SECS] [--poweroff]";

/// How long the report post is retried when `--deadline` leaves less than this.
const MIN_POST: Duration = Duration::from_secs(60);
/// Discard, zeroout and sampling work in pieces this large (the deadline is checked
/// between them).
const CHUNK: u64 = 1 << 30;
/// Samples read back from each discarded chunk.
const SAMPLES: u64 = 8;
/// Bytes per sample.
const SAMPLE: u64 = 4096;
/// Readers of the whole-device verification (two reads in flight).
const READERS: u64 = 2;

/// Parsed arguments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Args {
    pub devices: Vec<PathBuf>,
    pub all: bool,
    pub policy: Option<Policy>,
    pub report: Option<String>,
    pub deadline: Option<u64>,
    pub poweroff: bool,
}

/// Parse the arguments after `wipe`.
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
            "--device" => a.devices.push(PathBuf::from(value("--device")?)),
            "--all" if inline.is_none() => a.all = true,
            "--policy" => {
                let v = value("--policy")?;
                a.policy = Some(
                    Policy::parse(&v)
                        .ok_or_else(|| format!("unknown policy {v:?}: metadata or full"))?,
                );
            }
            "--report" => a.report = Some(value("--report")?),
            "--deadline" => {
                let v = value("--deadline")?;
                a.deadline = Some(
                    v.parse()
                        .map_err(|_| format!("--deadline: not a number of seconds: {v:?}"))?,
                );
            }
            "--poweroff" if inline.is_none() => a.poweroff = true,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if a.all && !a.devices.is_empty() {
        return Err("--all and --device exclude each other".into());
    }
    Ok(a)
}

/// Time, the deadline and progress lines (at most one a second), shared by the readers.
pub struct Clock {
    start: Instant,
    deadline: Option<Duration>,
    last: Mutex<Instant>,
}

impl Clock {
    pub fn new(deadline: Option<Duration>) -> Clock {
        let now = Instant::now();
        Clock {
            start: now,
            deadline,
            last: Mutex::new(now),
        }
    }

    /// An error once the deadline has passed.
    pub fn check(&self) -> Result<(), String> {
        match self.deadline {
            Some(d) if self.start.elapsed() > d => {
                Err(format!("deadline of {}s passed", d.as_secs()))
            }
            _ => Ok(()),
        }
    }

    /// [`Clock::check`], and a progress line when the last one is a second old.
    pub fn progress(&self, dev: &str, what: &str, done: u64, total: u64) -> Result<(), String> {
        self.check()?;
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if last.elapsed() >= Duration::from_secs(1) {
            *last = Instant::now();
            let pct = (done * 100).checked_div(total).unwrap_or(100);
            eprintln!(
                "bootplane probe wipe: {dev}: {what} {pct}% ({} of {} MiB)",
                done >> 20,
                total >> 20
            );
        }
        Ok(())
    }

    /// Time left before the deadline (None without one).
    pub fn left(&self) -> Option<Duration> {
        self.deadline
            .map(|d| d.saturating_sub(self.start.elapsed()))
    }
}

fn log(m: &str) {
    eprintln!("bootplane probe wipe: {m}");
}

/// Run the command (the arguments after `wipe`); returns the exit status.
pub fn run(args: &[String]) -> i32 {
    let a = match parse_args(args) {
        Ok(a) => a,
        Err(e) if e.is_empty() => {
            println!("{USAGE}");
            return 0;
        }
        Err(e) => {
            eprintln!("bootplane probe wipe: {e}\n{USAGE}");
            return 2;
        }
    };
    let cmdline = read_cmdline();
    let boot_url = cmdline_value(&cmdline, "bootplane.wipe");
    let url = match a.report.clone().or_else(|| boot_url.clone()) {
        Some(u) => match http::parse_url(&u) {
            Ok(u) => Some(u),
            Err(e) => {
                log(&e);
                return 2;
            }
        },
        None => None,
    };
    let policy = a.policy.or_else(|| {
        cmdline_value(&cmdline, "bootplane.wipe_policy").and_then(|p| Policy::parse(&p))
    });
    let Some(policy) = policy else {
        eprintln!("bootplane probe wipe: no policy: pass --policy metadata|full (or boot with bootplane.wipe_policy=)\n{USAGE}");
        return 2;
    };
    // Booted to wipe (the url from the kernel command line): every disk unless named.
    let all = a.all || (a.devices.is_empty() && a.report.is_none() && boot_url.is_some());
    if !all && a.devices.is_empty() {
        eprintln!("bootplane probe wipe: no device: pass --device DEV or --all\n{USAGE}");
        return 2;
    }
    let clock = Clock::new(a.deadline.map(Duration::from_secs));
    let (report, mut code) = wipe(&a.devices, all, policy, &clock);
    let body = serde_json::to_string(&report).expect("a wipe report always serializes");
    println!("{body}");
    if let Some(url) = url {
        let deadline = clock
            .left()
            .map_or(Duration::from_secs(http::DEFAULT_DEADLINE), |l| {
                l.max(MIN_POST)
            });
        log(&format!("posting the report to {}:{}", url.host, url.port));
        match http::post(&url, body.as_bytes(), deadline, log) {
            Outcome::Accepted(c) => {
                log(&format!("report accepted ({c})"));
                if a.poweroff {
                    log("powering off");
                    crate::sys::power_off();
                }
            }
            Outcome::Refused(c, why) => {
                log(&format!("report refused ({c}): {why}; not retrying"));
                code = code.max(1);
            }
            Outcome::GaveUp(why) => {
                log(&format!(
                    "gave up posting the report after {}s: {why}",
                    deadline.as_secs()
                ));
                code = code.max(1);
            }
        }
    }
    code
}

/// Check every device, then wipe and verify each; the report and the exit status.
pub fn wipe(devices: &[PathBuf], all: bool, policy: Policy, clock: &Clock) -> (WipeReport, i32) {
    let mut report = WipeReport {
        action: "wipe".into(),
        policy,
        ok: false,
        system_uuid: crate::collect::system_uuid(Path::new("/")),
        disks: Vec::new(),
        error: None,
    };
    let devices = if all {
        let d = blockdev::all_disks(Path::new("/sys/block"));
        let names: Vec<String> = d.iter().map(|p| p.display().to_string()).collect();
        log(&format!("--all: {} disks: {}", d.len(), names.join(" ")));
        d
    } else {
        devices.to_vec()
    };
    // Every device is checked before the first byte is written to any.
    let mut checked = Vec::new();
    for d in &devices {
        match blockdev::check(d) {
            Ok(c) => checked.push(c),
            Err(e) => {
                log(&format!("refused: {e}; nothing was written"));
                report.error = Some(format!("refused: {e}"));
                report.disks = devices
                    .iter()
                    .map(|d| DiskWipe::new(d.display().to_string()))
                    .collect();
                return (report, 2);
            }
        }
    }
    for c in checked {
        let d = wipe_one(c, policy, clock);
        match &d.error {
            None => log(&format!(
                "{}: {} wipe by {}, {} bytes verified in {:.1}s",
                d.device,
                policy.as_str(),
                d.method
                    .and_then(|m| serde_json::to_value(m).ok())
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
                d.bytes_verified,
                d.seconds
            )),
            Some(e) => log(&format!("{}: failed: {e}", d.device)),
        }
        report.disks.push(d);
    }
    report.ok = report.disks.iter().all(|d| d.verified && d.error.is_none());
    let code = if report.ok { 0 } else { 1 };
    (report, code)
}

/// Wipe and verify one device.
pub fn wipe_one(c: Checked, policy: Policy, clock: &Clock) -> DiskWipe {
    let start = Instant::now();
    let mut d = DiskWipe::new(c.path.display().to_string());
    d.serial = c.serial.clone();
    d.size_bytes = c.size_hint;
    let r = blockdev::open(c).and_then(|dev| {
        d.size_bytes = dev.size;
        match policy {
            Policy::Metadata => metadata(&dev, &mut d, clock),
            Policy::Full => full(&dev, &mut d, clock),
        }
    });
    if let Err(e) = r {
        d.verified = false;
        d.error = Some(e);
    }
    d.seconds = (start.elapsed().as_secs_f64() * 1000.0).round() / 1000.0;
    d
}

/// Read `r` into a vector.
fn read(dev: &Dev, r: Range) -> Result<Vec<u8>, String> {
    let mut buf = Aligned::zeroed(r.len() as usize);
    let got = dev.read_into(r, &mut buf)?;
    Ok(buf.bytes()[..got].to_vec())
}

/// The `metadata` policy: zero the planned ranges, sync, re-read the partition table,
/// read every range back.
fn metadata(dev: &Dev, d: &mut DiskWipe, clock: &Clock) -> Result<(), String> {
    let size = dev.size;
    let w = parttable::WINDOW.min(size);
    let head = read(dev, Range { start: 0, end: w })?;
    let tail = read(
        dev,
        Range {
            start: size - w,
            end: size,
        },
    )?;
    let table = parttable::parse(&head, &tail, size);
    log(&format!(
        "{}: {:?} partition table, {} partitions",
        d.device,
        table.scheme,
        table.parts.len()
    ));
    for n in &table.notes {
        log(&format!("{}: {n}", d.device));
    }
    d.notes.extend(table.notes.iter().cloned());
    let ranges = parttable::plan(size, &table.parts);
    let total: u64 = ranges.iter().map(Range::len).sum();
    let zeros = Aligned::zeroed(BUF);
    d.method = Some(Method::ZeroRanges);
    let mut done = 0;
    for r in &ranges {
        let name = d.device.clone();
        d.bytes_written += dev.write_zeros(*r, &zeros, &mut |n| {
            clock.progress(&name, "zeroing", done + n, total)
        })?;
        done += r.len();
        d.ranges_zeroed += 1;
    }
    dev.sync()?;
    if let Err(e) = dev.reread_partitions() {
        log(&format!("{}: {e}", d.device));
        d.notes.push(e);
    }
    dev.drop_cache();
    let mut buf = Aligned::zeroed(BUF);
    let mut done = 0;
    for r in &ranges {
        let name = d.device.clone();
        let bad = dev.first_nonzero(*r, &mut buf, &mut |n| {
            clock.progress(&name, "verifying", done + n, total)
        })?;
        if let Some(at) = bad {
            return Err(fail(d, at));
        }
        done += r.len();
        d.bytes_verified += r.len();
    }
    d.verified = true;
    Ok(())
}

fn fail(d: &mut DiskWipe, at: u64) -> String {
    d.first_nonzero_offset = Some(at);
    format!("verification failed: non-zero byte at offset {at}")
}

/// The `full` policy: make every byte zero, then read the whole device back (once
/// more after a `BLKZEROOUT` when a discard left non-zero blocks the samples missed).
fn full(dev: &Dev, d: &mut DiskWipe, clock: &Clock) -> Result<(), String> {
    let whole = Range {
        start: 0,
        end: dev.size,
    };
    d.ranges_zeroed = 1;
    let method = zero_everything(dev, d, clock)?;
    d.method = Some(method);
    dev.sync()?;
    if dev.is_block() {
        if let Err(e) = dev.reread_partitions() {
            d.notes.push(e);
        }
    }
    let mut bad = verify_all(dev, &d.device, clock)?;
    if let (Some(at), Method::Discard | Method::DiscardZeroout) = (bad, method) {
        let m = format!("non-zero byte at {at} after discard: zeroing out the whole device");
        log(&format!("{}: {m}", d.device));
        d.notes.push(m);
        let m = zero_out(dev, whole, d, clock)?;
        d.method = Some(m);
        dev.sync()?;
        bad = verify_all(dev, &d.device, clock)?;
    }
    if let Some(at) = bad {
        return Err(fail(d, at));
    }
    d.bytes_verified = dev.size;
    d.verified = true;
    Ok(())
}

/// Zero the whole device by the best method it offers; which one was used.
fn zero_everything(dev: &Dev, d: &mut DiskWipe, clock: &Clock) -> Result<Method, String> {
    let whole = Range {
        start: 0,
        end: dev.size,
    };
    if !dev.is_block() {
        return match dev.punch_hole() {
            Ok(()) => Ok(Method::PunchHole),
            Err(e) => {
                d.notes.push(format!("punch hole: {e}; overwriting"));
                overwrite(dev, whole, d, clock)
            }
        };
    }
    if blockdev::nvme_namespace(&dev.checked.kind).is_some() {
        match nvme_format(dev, clock) {
            Ok(()) => return Ok(Method::NvmeFormat),
            Err(e) => {
                log(&format!("{}: {e}; using discard/zeroout", d.device));
                d.notes.push(e);
            }
        }
    }
    discard_checked(dev, d, clock)
}

fn nvme_format(dev: &Dev, clock: &Clock) -> Result<(), String> {
    let (caps, nsid) = crate::nvme::probe(dev.file())?;
    if !caps.format {
        return Err("nvme: the controller does not offer format nvm".into());
    }
    let timeout = clock
        .left()
        .map_or(0, |l| l.as_millis().min(u32::MAX as u128) as u32);
    log(&format!(
        "nvme namespace {nsid}: format nvm with user data erase"
    ));
    crate::nvme::format_user_data_erase(dev.file(), caps, nsid, timeout)
}

/// `BLKDISCARD` chunk by chunk, each checked by [`SAMPLES`] reads; `BLKZEROOUT` (or an
/// overwrite) where a sample is not zero. Without discard, [`zero_out`] it all.
fn discard_checked(dev: &Dev, d: &mut DiskWipe, clock: &Clock) -> Result<Method, String> {
    let size = dev.size;
    let step = CHUNK / dev.sector * dev.sector;
    let mut buf = Aligned::zeroed(SAMPLE as usize);
    let (mut discarded, mut zeroed) = (0u64, 0u64);
    let mut off = 0;
    while off < size {
        let r = Range {
            start: off,
            end: (off + step).min(size),
        };
        clock.progress(&d.device, "discarding", off, size)?;
        if let Err(e) = dev.discard(r) {
            if off == 0 {
                let m = format!("discard: {e}; zeroing out instead");
                log(&format!("{}: {m}", d.device));
                d.notes.push(m);
                return zero_out(
                    dev,
                    Range {
                        start: 0,
                        end: size,
                    },
                    d,
                    clock,
                );
            }
            return Err(format!("discard at {off}: {e}"));
        }
        if samples_zero(dev, r, &mut buf)? {
            discarded += 1;
        } else {
            zero_out(dev, r, d, clock)?;
            zeroed += 1;
        }
        off = r.end;
    }
    Ok(match (discarded, zeroed) {
        (_, 0) => Method::Discard,
        (0, _) => Method::Zeroout,
        _ => {
            d.notes.push(format!(
                "{zeroed} of {} GiB chunks did not read as zero after discard",
                discarded + zeroed
            ));
            Method::DiscardZeroout
        }
    })
}

/// Whether [`SAMPLES`] reads spread over `r` (its first and last block among them) are zero.
fn samples_zero(dev: &Dev, r: Range, buf: &mut Aligned) -> Result<bool, String> {
    let span = r.len().saturating_sub(SAMPLE);
    for i in 0..SAMPLES {
        let at = r.start + (span * i / (SAMPLES - 1)) / dev.sector * dev.sector;
        let s = Range {
            start: at,
            end: (at + SAMPLE).min(r.end),
        };
        if dev.first_nonzero(s, buf, &mut |_| Ok(()))?.is_some() {
            return Ok(false);
        }
    }
    Ok(true)
}

/// `BLKZEROOUT` over `r` in chunks, an overwrite when the device refuses it.
fn zero_out(dev: &Dev, r: Range, d: &mut DiskWipe, clock: &Clock) -> Result<Method, String> {
    let step = CHUNK / dev.sector * dev.sector;
    let mut off = r.start;
    while off < r.end {
        let c = Range {
            start: off,
            end: (off + step).min(r.end),
        };
        clock.progress(&d.device, "zeroing out", off - r.start, r.len())?;
        if let Err(e) = dev.zeroout(c) {
            let m = format!("zeroout at {off}: {e}; overwriting");
            log(&format!("{}: {m}", d.device));
            d.notes.push(m);
            return overwrite(
                dev,
                Range {
                    start: off,
                    end: r.end,
                },
                d,
                clock,
            );
        }
        off = c.end;
    }
    Ok(Method::Zeroout)
}

/// Write zeros over `r` (`O_DIRECT` where possible), then fsync.
fn overwrite(dev: &Dev, r: Range, d: &mut DiskWipe, clock: &Clock) -> Result<Method, String> {
    let zeros = Aligned::zeroed(BUF);
    let name = d.device.clone();
    d.bytes_written += dev.write_zeros(r, &zeros, &mut |n| {
        clock.progress(&name, "overwriting", n, r.len())
    })?;
    dev.sync()?;
    Ok(Method::Overwrite)
}

/// Read the whole device back with [`READERS`] readers on alternate [`BUF`] pieces; the
/// offset of the first non-zero byte, if any.
fn verify_all(dev: &Dev, name: &str, clock: &Clock) -> Result<Option<u64>, String> {
    dev.drop_cache();
    let size = dev.size;
    let done = AtomicU64::new(0);
    let first_bad = AtomicU64::new(u64::MAX);
    let step = BUF as u64;
    let results: Vec<Result<(), String>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..READERS)
            .map(|w| {
                let (done, first_bad) = (&done, &first_bad);
                s.spawn(move || -> Result<(), String> {
                    let mut buf = Aligned::zeroed(BUF);
                    let mut off = w * step;
                    while off < size && off < first_bad.load(Ordering::Relaxed) {
                        let r = Range {
                            start: off,
                            end: (off + step).min(size),
                        };
                        if let Some(at) = dev.first_nonzero(r, &mut buf, &mut |_| Ok(()))? {
                            first_bad.fetch_min(at, Ordering::Relaxed);
                            return Ok(());
                        }
                        let n = done.fetch_add(r.len(), Ordering::Relaxed) + r.len();
                        clock.progress(name, "verifying", n, size)?;
                        off += READERS * step;
                    }
                    Ok(())
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a verification reader panicked".into()))
            })
            .collect()
    });
    let bad = first_bad.load(Ordering::Relaxed);
    if bad != u64::MAX {
        return Ok(Some(bad));
    }
    results.into_iter().collect::<Result<Vec<()>, String>>()?;
    Ok(None)
}

#[cfg(test)]
#[path = "wipe_tests.rs"]
mod tests;
