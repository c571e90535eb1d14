//! The streamer behind `bootplane provision`: read → decode → verify → write.
//!
//! Stages run on their own threads joined by bounded channels:
//!
//! 1. **read** (1 thread): sequential large reads from the source (a packed image is read
//!    frame by frame; a plain `.zst` is decoded right here, serially, since its frames
//!    are not indexed; a raw image is read straight into aligned buffers).
//! 2. **decode** (one thread per core, packed images only): each frame is decompressed
//!    into a pooled, 4096-aligned buffer; zstd checks the frame's XXH64 checksum and, when
//!    enabled, the frame's SHA-256 is compared with the manifest — in parallel.
//! 3. **hash** (1 thread): puts frames back in order and feeds the whole-image SHA-256,
//!    the one serial computation, so it gets a core of its own.
//! 4. **write** (several threads, so several O_DIRECT writes are in flight): positional
//!    writes of whole aligned frames; the last partial block is padded (read-modify-write
//!    on fixed-size targets).
//!
//! Safety: the first MiB of the target is zeroed and synced before anything else is
//! written, and is written from memory only after every other byte is written, synced
//! and the whole-image SHA-256 matched; any failure (or a kill) leaves it zero.
//!
//! Resume: after a durable prefix (`fdatasync`, at most once a second) a checkpoint file
//! records how many frames are on the target and the SHA-256 midstate after them; a rerun
//! with the same image and target continues from there (frame 0 is re-read for the held
//! first MiB). Before continuing it always re-reads the target up to the checkpoint and
//! checks it hashes to the recorded midstate, so a target changed in between is caught
//! (exit 23, checkpoint dropped, the next run starts over) rather than trusted: the
//! whole-image SHA-256 that gates the first MiB covers the target's bytes, not only the
//! source's. The checkpoint (and its temporary file) is never opened through a symlink:
//! it may live in a world-writable directory (`/var/tmp` for devices), so a symlink at
//! either path is refused (exit 23), the temporary file is created `O_EXCL | O_NOFOLLOW`
//! (mode 0600) and renamed over the checkpoint, and the checkpoint is read `O_NOFOLLOW`.
//! With [`Options::checkpoint_on_target`] (the agent's install: no persistent state) the
//! checkpoint is a 4 KiB block inside the held first MiB of the target itself
//! ([`TARGET_CKPT_OFF`], starting [`TARGET_CKPT_MAGIC`]): the head is zero but for that
//! block until the image's own first MiB replaces it, so a copy resumes after a reset, and
//! a failure that drops the checkpoint (integrity, manifest, mismatch) zeroes it too.
//! Per-frame SHA-256 is on by default with 4+ cores (`--frame-sha256`); with
//! fewer cores it would cost the serial hash its core, and zstd's per-frame checksum plus
//! the whole-image SHA-256 already reject any corruption before the first MiB is written.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::error::{PResult, ProvisionError};
use super::format::{self, Manifest};
use super::hash::ResumableSha256;
use super::progress::Progress;
use super::source::{self, Source};
use super::spec;
use super::target::{AlignedBuf, Pool, PooledBuf, Target, TargetKind};

mod checkpoint;
mod place;
mod read;

use checkpoint::{read_target_checkpoint, write_target_checkpoint, Checkpoint, Keeper};
pub use checkpoint::{TARGET_CKPT_MAGIC, TARGET_CKPT_OFF};
use place::Placement;
pub(super) use read::read_full;
use read::{decode_stream, decode_worker, read_framed, read_raw};

/// Bytes at the start of the target written last.
pub(crate) const HELD: u64 = 1 << 20;
/// Chunk size for plain zstd and raw sources.
pub(crate) const STREAM_CHUNK: u64 = 4 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FrameSha {
    /// On when the machine has at least 4 cores.
    #[default]
    Auto,
    On,
    Off,
}

#[derive(Debug, Clone)]
pub struct Options {
    pub source: String,
    pub target: PathBuf,
    pub manifest: Option<String>,
    pub sha256: Option<String>,
    pub frame_sha256: FrameSha,
    pub zero_skip: bool,
    pub resume: bool,
    pub checkpoint: Option<PathBuf>,
    /// Keep the checkpoint on the target itself, in a block of the held first MiB
    /// ([`TARGET_CKPT_OFF`]), instead of a file: for a machine with no persistent state
    /// (the agent's install), so a copy resumes after a reset. `checkpoint` is ignored.
    pub checkpoint_on_target: bool,
    pub max_rate: Option<u64>,
    pub decoders: Option<usize>,
    pub writers: usize,
    /// Run the hash stage on a CPU of its own and the other stages on the rest (when
    /// two or more CPUs are allowed).
    pub pin_hash: bool,
    pub quiet: bool,
    /// Refuse a target that is a symbolic link (`O_NOFOLLOW`).
    pub no_follow_target: bool,
    /// Source kinds beyond local paths and `http(s)://` (`bootplane provision` adds
    /// `nfs://`); none by default.
    pub schemes: Vec<spec::Scheme>,
}

impl Options {
    pub fn new(source: &str, target: impl Into<PathBuf>) -> Self {
        Options {
            source: source.to_string(),
            target: target.into(),
            manifest: None,
            sha256: None,
            frame_sha256: FrameSha::Auto,
            zero_skip: false,
            resume: true,
            checkpoint: None,
            checkpoint_on_target: false,
            max_rate: None,
            decoders: None,
            writers: 3,
            pin_hash: true,
            quiet: true,
            no_follow_target: false,
            schemes: Vec::new(),
        }
    }
}

/// What a successful run did.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub raw_size: u64,
    pub sha256: String,
    pub resumed_from: u64,
    pub direct: bool,
    pub frame_sha256: bool,
    pub format: &'static str,
    /// CPU seconds per stage: read, decode, hash, write.
    pub cpu: BTreeMap<&'static str, f64>,
    /// Where the hash thread's wall time went, in seconds (see [`HashTime`]).
    pub hash_thread: BTreeMap<&'static str, f64>,
}

/// Where the serial stage's (the hash thread's) wall time goes. The whole-image
/// SHA-256 bounds the copy, so every second it is not hashing is lost: waiting for
/// the next frame (decoders behind), waiting for a writer to take a frame (target
/// behind), or runnable but off its core (another thread or process ran there; the
/// kernel's `schedstat` run-queue wait). `hashing` is the wall time inside the
/// SHA-256 calls (preemptions there included); `cpu` is the thread's CPU time, so
/// bytes / `cpu` is the hash rate the thread got while it had its core.
#[derive(Debug, Default, Clone, Copy)]
struct HashTime {
    wall: Duration,
    hashing: Duration,
    wait_input: Duration,
    wait_output: Duration,
    /// Run-queue wait over the stage, from `/proc/thread-self/schedstat`.
    runqueue: Duration,
    /// CPU time of the thread over the stage.
    cpu: Duration,
}

impl HashTime {
    fn map(&self) -> BTreeMap<&'static str, f64> {
        let ms = |d: Duration| (d.as_secs_f64() * 1e3).round() / 1e3;
        [
            ("wall", ms(self.wall)),
            ("hashing", ms(self.hashing)),
            ("wait_input", ms(self.wait_input)),
            ("wait_output", ms(self.wait_output)),
            ("runqueue", ms(self.runqueue)),
            ("cpu", ms(self.cpu)),
        ]
        .into_iter()
        .collect()
    }
}

/// This thread's run-queue wait so far (the second field of
/// `/proc/thread-self/schedstat`), zero where the kernel does not keep it.
fn runqueue_wait() -> Duration {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse().ok())
        .map(Duration::from_nanos)
        .unwrap_or_default()
}

/// Nice value of the stages other than the hash: the whole-image SHA-256 is the one
/// serial computation, so when the machine has fewer cores than runnable stages the
/// hash thread should win its core. The decoders, reader and writers only need to
/// keep ahead of it, which they do on what is left. Lowering one's own priority needs
/// no privilege; raising the hash thread's would.
const HELPER_NICE: i32 = 5;

/// Lower the calling thread's priority to [`HELPER_NICE`] (Linux nice values are per
/// thread); best effort.
fn lower_priority() {
    // SAFETY: gettid and setpriority have no memory arguments.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, HELPER_NICE);
    }
}

enum Kind {
    Framed(Arc<Manifest>),
    Zstd,
    Raw,
}

struct Plan {
    kind: Kind,
    src: Arc<dyn Source>,
    expected: [u8; 32],
    raw_size: Option<u64>,
    chunk: u64,
}

fn plan(opts: &Options) -> PResult<Plan> {
    let src = spec::open(&opts.source, &opts.schemes)?;
    let want = match &opts.sha256 {
        Some(h) => Some(format::parse_sha256(h).ok_or_else(|| {
            ProvisionError::Usage(format!("--sha256 {h:?} is not 64 hex digits"))
        })?),
        None => None,
    };
    let mbytes = match &opts.manifest {
        Some(m) => Some(
            spec::fetch_small(m, 64 << 20, &opts.schemes)?
                .ok_or_else(|| ProvisionError::Manifest(format!("{m} not found")))?,
        ),
        None => spec::fetch_small(
            &format!("{}.manifest.json", opts.source),
            64 << 20,
            &opts.schemes,
        )?,
    };
    if let Some(b) = mbytes {
        let m = Manifest::parse(&b).map_err(|e| ProvisionError::Manifest(e.0))?;
        let expected = format::parse_sha256(&m.sha256)
            .ok_or_else(|| ProvisionError::Manifest("bad sha256".into()))?;
        if let Some(w) = want {
            if w != expected {
                return Err(ProvisionError::Manifest(format!(
                    "manifest is for image {} but --sha256 is {}",
                    m.sha256,
                    hex::encode(w)
                )));
            }
        }
        if let Some(len) = src.len() {
            if len < m.compressed_size {
                return Err(ProvisionError::Truncated(format!(
                    "{} has {len} bytes, the manifest expects {}",
                    src.describe(),
                    m.compressed_size
                )));
            }
            if len > m.compressed_size {
                return Err(ProvisionError::Trailing(format!(
                    "{} has {} bytes after the image's {}",
                    src.describe(),
                    len - m.compressed_size,
                    m.compressed_size
                )));
            }
        }
        return Ok(Plan {
            raw_size: Some(m.raw_size),
            chunk: m.frame_size,
            kind: Kind::Framed(Arc::new(m)),
            src,
            expected,
        });
    }
    let expected = want.ok_or_else(|| {
        ProvisionError::Usage(format!(
            "no manifest for {} (give --manifest) and no --sha256 to verify against",
            source::shown(&opts.source)
        ))
    })?;
    let mut head = [0u8; 18];
    let mut r = src.open_at(0)?;
    let mut n = 0;
    while n < head.len() {
        match r.read(&mut head[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) => {
                return Err(ProvisionError::Source(format!(
                    "reading {}: {e}",
                    src.describe()
                )))
            }
        }
    }
    if format::is_zstd_magic(&head[..n]) {
        Ok(Plan {
            kind: Kind::Zstd,
            raw_size: None,
            chunk: STREAM_CHUNK,
            src,
            expected,
        })
    } else {
        Ok(Plan {
            raw_size: src.len(),
            kind: Kind::Raw,
            chunk: STREAM_CHUNK,
            src,
            expected,
        })
    }
}

/// A lower bound of the raw size of a plain zstd stream (its first frame's content size).
fn zstd_min_size(src: &dyn Source) -> Option<u64> {
    let mut head = vec![0u8; 18];
    let mut r = src.open_at(0).ok()?;
    let n = r.read(&mut head).ok()?;
    zstd::zstd_safe::get_frame_content_size(&head[..n])
        .ok()
        .flatten()
}

struct Shared {
    err: Mutex<Option<ProvisionError>>,
    abort: AtomicBool,
    cpu: [AtomicU64; 4],
}

impl Shared {
    fn fail(&self, e: ProvisionError) {
        if let Ok(mut g) = self.err.lock() {
            if g.is_none() {
                *g = Some(e);
            }
        }
        self.abort.store(true, Ordering::SeqCst);
    }
    fn aborted(&self) -> bool {
        self.abort.load(Ordering::Relaxed)
    }
    fn add_cpu(&self, stage: usize) {
        self.cpu[stage].fetch_add(thread_cpu_ns(), Ordering::Relaxed);
    }
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

struct Chunk {
    idx: u64,
    buf: PooledBuf,
    len: usize,
}

struct WriteJob {
    seq: u64,
    idx: u64,
    buf: PooledBuf,
    start: usize,
    end: usize,
    off: u64,
    zero: bool,
    state: String,
}

struct Seq<'a> {
    plan: &'a Plan,
    target: &'a Target,
    opts: &'a Options,
    start: u64,
    hasher: ResumableSha256,
    held: Vec<u8>,
    time: HashTime,
}

impl Seq<'_> {
    /// In-order stage: keep the first MiB, hash, pad the tail, hand to the writers.
    fn run(&mut self, rx: Receiver<Chunk>, tx: SyncSender<WriteJob>, sh: &Shared) -> PResult<()> {
        let mut pending: BTreeMap<u64, Chunk> = BTreeMap::new();
        let mut next = 0u64;
        let mut seq = 0u64;
        let t0 = Instant::now();
        let (rq0, cpu0) = (runqueue_wait(), thread_cpu_ns());
        let mut rate_bytes = 0u64;
        loop {
            let w = Instant::now();
            let Ok(c) = rx.recv() else { break };
            self.time.wait_input += w.elapsed();
            // After a failure, keep draining so the decoders are never blocked.
            if sh.aborted() {
                continue;
            }
            pending.insert(c.idx, c);
            if let Err(e) = self.ready(&mut pending, &mut next, &mut seq, &tx, t0, &mut rate_bytes)
            {
                sh.fail(e);
            }
        }
        self.time.wall = t0.elapsed();
        self.time.runqueue = runqueue_wait().saturating_sub(rq0);
        self.time.cpu = Duration::from_nanos(thread_cpu_ns().saturating_sub(cpu0));
        if !pending.is_empty() && !sh.aborted() {
            return Err(ProvisionError::Internal(
                "frames missing at the end of the stream".into(),
            ));
        }
        Ok(())
    }

    /// Resume check: the first MiB of frame 0 (from the source) followed by what the
    /// target holds up to the checkpoint must hash to the checkpoint's midstate.
    fn verify_prefix(&self, frame0: &[u8]) -> PResult<()> {
        let end = self.start * self.plan.chunk;
        let mut h = ResumableSha256::new();
        let held = (HELD as usize).min(frame0.len());
        h.update(&frame0[..held]);
        let step = 4usize << 20;
        let mut tb = super::target::AlignedBuf::new(step);
        let mut off = held as u64;
        while off < end {
            let n = step.min((end - off) as usize);
            let got = self.target.read_at(&mut tb.as_mut_slice()[..n], off)?;
            if got < n {
                return Err(ProvisionError::Checkpoint(format!(
                    "target ends at {} before the checkpointed {end} bytes",
                    off + got as u64
                )));
            }
            h.update(&tb.as_slice()[..n]);
            off += n as u64;
        }
        if h != self.hasher {
            return Err(ProvisionError::Checkpoint(format!(
                "the target's first {end} bytes are not what the checkpoint recorded (changed since the interrupted copy); checkpoint dropped, rerun starts over"
            )));
        }
        Ok(())
    }

    fn ready(
        &mut self,
        pending: &mut BTreeMap<u64, Chunk>,
        next: &mut u64,
        seq: &mut u64,
        tx: &SyncSender<WriteJob>,
        t0: Instant,
        rate_bytes: &mut u64,
    ) -> PResult<()> {
        let block = self.target.block;
        {
            while let Some(c) = pending.remove(next) {
                *next = if *next == 0
                    && self.start > 1
                    && matches!(self.plan.kind, Kind::Framed(_) | Kind::Raw)
                {
                    self.start
                } else {
                    *next + 1
                };
                let Chunk { idx, mut buf, len } = c;
                let raw_off = idx * self.plan.chunk;
                if raw_off < HELD {
                    let h = (HELD - raw_off).min(len as u64) as usize;
                    self.held.extend_from_slice(&buf.as_slice()[..h]);
                }
                if idx == 0 && self.start > 0 {
                    self.verify_prefix(&buf.as_slice()[..len])?;
                }
                if idx < self.start {
                    continue;
                }
                let h = Instant::now();
                self.hasher.update(&buf.as_slice()[..len]);
                self.time.hashing += h.elapsed();
                let w_start = (HELD.saturating_sub(raw_off) as usize).min(len);
                let mut end = len;
                if len % block != 0 && w_start < len {
                    end = len.div_ceil(block) * block;
                    let tail_off = raw_off + (len / block * block) as u64;
                    let keep = len % block;
                    let mut old = vec![0u8; 0];
                    if !matches!(self.target.kind, TargetKind::File { fresh: true })
                        && tail_off < self.target.size
                    {
                        let mut tb = super::target::AlignedBuf::new(block);
                        let n = self
                            .target
                            .read_at(&mut tb.as_mut_slice()[..block], tail_off)?;
                        old = tb.as_slice()[..n].to_vec();
                    }
                    let s = buf.as_mut_slice();
                    for k in keep..block {
                        s[len / block * block + k] = old.get(k).copied().unwrap_or(0);
                    }
                }
                // Only whole, unpadded ranges: BLKZEROOUT must not touch bytes past the image.
                let zero = self.opts.zero_skip
                    && w_start < len
                    && end == len
                    && match &self.plan.kind {
                        Kind::Framed(m) => {
                            m.is_zero(raw_off + w_start as u64, (len - w_start) as u64)
                        }
                        _ => false,
                    };
                if let Some(rate) = self.opts.max_rate {
                    *rate_bytes += len as u64;
                    let due = Duration::from_secs_f64(*rate_bytes as f64 / rate.max(1) as f64);
                    let el = t0.elapsed();
                    if due > el {
                        std::thread::sleep(due - el);
                    }
                }
                let job = WriteJob {
                    seq: *seq,
                    idx,
                    buf,
                    start: w_start,
                    end: end.max(w_start),
                    off: raw_off + w_start as u64,
                    zero,
                    state: self.hasher.save(),
                };
                *seq += 1;
                let w = Instant::now();
                let sent = tx.send(job);
                self.time.wait_output += w.elapsed();
                if sent.is_err() {
                    return Err(ProvisionError::Internal("writers ended early".into()));
                }
            }
        }
        Ok(())
    }
}

struct Tracker {
    done: BTreeMap<u64, (u64, String, u64)>, // seq -> (idx, state, bytes)
    next_seq: u64,
    last_ckpt: Instant,
}

/// Writer thread: one positional write per job, then progress and checkpoint
/// bookkeeping. After a failure it keeps draining (without writing) until the end.
fn write_worker(
    rx: &Mutex<Receiver<WriteJob>>,
    target: &Target,
    tracker: &Mutex<Tracker>,
    ckpt: &(dyn Fn(u64, &str) -> PResult<()> + Sync),
    progress: &Progress,
    sh: &Shared,
) {
    loop {
        let job = match rx.lock() {
            Ok(r) => r.recv(),
            Err(_) => return,
        };
        let Ok(j) = job else { return };
        if sh.aborted() {
            continue;
        }
        if let Err(e) = write_one(j, target, tracker, ckpt, progress) {
            sh.fail(e);
        }
    }
}

fn write_one(
    j: WriteJob,
    target: &Target,
    tracker: &Mutex<Tracker>,
    ckpt: &(dyn Fn(u64, &str) -> PResult<()> + Sync),
    progress: &Progress,
) -> PResult<()> {
    if j.start < j.end {
        let zeroed = j.zero && target.zero_range(j.off, (j.end - j.start) as u64)?;
        if !zeroed {
            target.write_at(&j.buf.as_slice()[j.start..j.end], j.off)?;
        }
    }
    let raw_len = (j.end - j.start) as u64;
    drop(j.buf);
    let mut do_ckpt = None;
    if let Ok(mut t) = tracker.lock() {
        t.done.insert(j.seq, (j.idx, j.state, raw_len));
        let mut last = None;
        loop {
            let n = t.next_seq;
            match t.done.remove(&n) {
                Some(v) => {
                    t.next_seq += 1;
                    last = Some(v);
                }
                None => break,
            }
        }
        if let Some((idx, state, _)) = last {
            if t.last_ckpt.elapsed() >= Duration::from_secs(1) {
                t.last_ckpt = Instant::now();
                do_ckpt = Some((idx + 1, state));
            }
        }
    }
    progress.bytes.fetch_add(raw_len, Ordering::Relaxed);
    if let Some((done, state)) = do_ckpt {
        target.sync()?;
        ckpt(done, &state)?;
    }
    Ok(())
}

/// Run a provisioning copy. On error the first MiB of the target is zero.
pub fn provision(opts: &Options) -> PResult<Outcome> {
    let progress = Progress::new(opts.quiet);
    let ticker = progress.spawn_ticker();
    let r = provision_inner(opts, &progress);
    progress.finish();
    let _ = ticker.join();
    match &r {
        Ok(o) => {
            let mut x = serde_json::Map::new();
            x.insert("sha256".into(), o.sha256.clone().into());
            x.insert("resumed_from".into(), o.resumed_from.into());
            x.insert("direct".into(), o.direct.into());
            x.insert("frame_sha256".into(), o.frame_sha256.into());
            x.insert(
                "cpu".into(),
                serde_json::to_value(&o.cpu).unwrap_or_default(),
            );
            x.insert(
                "hash_thread".into(),
                serde_json::to_value(&o.hash_thread).unwrap_or_default(),
            );
            progress.set_total(Some(o.raw_size));
            progress.set_stage_silent("done");
            progress.emit(Some(x));
        }
        Err(e) => {
            let mut x = serde_json::Map::new();
            x.insert("code".into(), e.exit_code().into());
            x.insert("class".into(), e.class().into());
            x.insert("error".into(), e.to_string().into());
            progress.set_stage_silent("error");
            progress.emit(Some(x));
        }
    }
    r
}

/// The copy itself: the read, decode, hash and write stages on their threads (see the
/// module doc) until the source ends or a stage fails (the failure is in `sh`); `seqr`
/// is the in-order stage, holding the hasher and the first MiB afterwards.
fn run_stages(
    seqr: &mut Seq<'_>,
    frame_sha: bool,
    cores: usize,
    ckpt: &(dyn Fn(u64, &str) -> PResult<()> + Sync),
    progress: &Progress,
    sh: &Shared,
) {
    let (opts, plan, target, start) = (seqr.opts, seqr.plan, seqr.target, seqr.start);
    let decoders = opts.decoders.unwrap_or(cores).max(1);
    let writers = opts.writers.max(1);
    let pool = Pool::new(plan.chunk as usize);
    let tracker = Mutex::new(Tracker {
        done: BTreeMap::new(),
        next_seq: 0,
        last_ckpt: Instant::now(),
    });
    // Queue depths in frames: deep enough to ride out scheduling hiccups on a busy
    // machine, small enough to keep memory bounded (about 16 raw frames in flight).
    let (chunk_tx, chunk_rx) = sync_channel::<Chunk>(decoders.max(4));
    let (job_tx, job_rx) = sync_channel::<WriteJob>(writers.max(4));
    let job_rx = Mutex::new(job_rx);
    let (comp_tx, comp_rx) = sync_channel::<(u64, Vec<u8>)>((decoders * 2).max(6));
    let comp_rx = Mutex::new(comp_rx);
    // With per-frame SHA-256 the decoders hash too (more CPU than the whole-image hash on
    // a two-core machine): confined to the CPUs left they fell behind (834 -> 686 MB/s on
    // two cores), so they keep every CPU unless there are four or more (as `auto` has it).
    let place = opts
        .pin_hash
        .then(Placement::plan)
        .flatten()
        .filter(|p| !frame_sha || p.cpus >= 4);
    let lower_priority = || {
        if let Some(p) = &place {
            Placement::set(&p.helpers);
        }
        lower_priority();
    };
    std::thread::scope(|s| {
        for _ in 0..writers {
            s.spawn(|| {
                lower_priority();
                write_worker(&job_rx, target, &tracker, ckpt, progress, sh);
                sh.add_cpu(3);
            });
        }
        match &plan.kind {
            Kind::Framed(m) => {
                let sh2 = sh;
                s.spawn(move || {
                    lower_priority();
                    if let Err(e) = read_framed(plan, m, start, comp_tx, sh2) {
                        sh2.fail(e);
                    }
                    sh2.add_cpu(0);
                });
                for _ in 0..decoders {
                    let tx = chunk_tx.clone();
                    let (pool, comp_rx) = (&pool, &comp_rx);
                    s.spawn(move || {
                        lower_priority();
                        decode_worker(m, comp_rx, &tx, pool, frame_sha, sh);
                        sh.add_cpu(1);
                    });
                }
                drop(chunk_tx);
            }
            Kind::Zstd => {
                drop(comp_tx);
                let pool = &pool;
                s.spawn(move || {
                    lower_priority();
                    if let Err(e) = decode_stream(plan, chunk_tx, pool, sh) {
                        sh.fail(e);
                    }
                    sh.add_cpu(1);
                });
            }
            Kind::Raw => {
                drop(comp_tx);
                let pool = &pool;
                s.spawn(move || {
                    lower_priority();
                    if let Err(e) = read_raw(plan, start, chunk_tx, pool, sh) {
                        sh.fail(e);
                    }
                    sh.add_cpu(0);
                });
            }
        }
        if let Some(p) = &place {
            Placement::set(&p.hash);
        }
        if let Err(e) = seqr.run(chunk_rx, job_tx, sh) {
            sh.fail(e);
        }
        if let Some(p) = &place {
            Placement::set(&p.before);
        }
        sh.add_cpu(2);
    });
}

/// [`plan`], and when the source or image is bad, the first MiB of an existing target
/// (that passes the busy checks) zeroed: it must not stay bootable with whatever it
/// held before.
fn plan_or_clear_target(opts: &Options) -> PResult<Plan> {
    plan(opts).inspect_err(|e| {
        if !matches!(e, ProvisionError::Usage(_) | ProvisionError::Internal(_))
            && opts.target.exists()
        {
            if let Ok(t) = Target::open_with(&opts.target, None, opts.no_follow_target) {
                // An on-target checkpoint survives a source that is down for now (it is
                // checked against the image and the target before it is used).
                let keep = (opts.checkpoint_on_target && !matches!(e, ProvisionError::Manifest(_)))
                    .then(|| read_target_checkpoint(&t))
                    .flatten()
                    .and_then(|c| serde_json::to_vec(&c).ok());
                let _ = t.zero_head(HELD);
                if let Some(k) = keep {
                    let _ = write_target_checkpoint(&t, &k);
                }
            }
        }
    })
}

/// Where a `--resume` run continues: the frames done and the SHA-256 midstate after them,
/// from a checkpoint of this image and chunk size (frame 0 and a fresh hash otherwise).
fn resume_point(
    opts: &Options,
    plan: &Plan,
    keeper: &Keeper,
    image_hex: &str,
    target: &mut Target,
) -> (u64, ResumableSha256) {
    let mut start = 0u64;
    let mut hasher = ResumableSha256::new();
    if opts.resume {
        let usable = keeper.read(target).filter(|c| {
            c.version == 1
                && c.image_sha256 == image_hex
                && c.chunk_size == plan.chunk
                && c.chunks_done > 0
        });
        if let Some(c) = usable {
            if let Some(h) = ResumableSha256::restore(&c.hash_state)
                .filter(|h| h.len() == c.chunks_done * plan.chunk)
            {
                start = c.chunks_done;
                hasher = h;
                if c.target_fresh {
                    target.mark_fresh();
                }
            }
        }
    }
    if start > 0 && plan.raw_size.is_some_and(|r| start * plan.chunk >= r) {
        start = 0;
        hasher = ResumableSha256::new();
    }
    (start, hasher)
}

/// The last step of a verified copy: everything else synced, the held first MiB (`held`,
/// of an image of `raw_size` bytes) written and synced, a file target trimmed to size.
fn write_held_head(target: &Target, held: &[u8], raw_size: u64) -> PResult<()> {
    target.sync()?;
    if held.len() as u64 != raw_size.min(HELD) {
        return Err(ProvisionError::Internal(format!(
            "held {} bytes of the first MiB",
            held.len()
        )));
    }
    if !held.is_empty() {
        let n = held.len().div_ceil(target.block) * target.block;
        let mut b = super::target::AlignedBuf::new(n);
        b.as_mut_slice()[..held.len()].copy_from_slice(held);
        target.write_at(&b.as_slice()[..n], 0)?;
    }
    target.sync()?;
    target.trim_file(raw_size)?;
    target.sync()
}

fn provision_inner(opts: &Options, progress: &Arc<Progress>) -> PResult<Outcome> {
    let plan = plan_or_clear_target(opts)?;
    progress.set_total(plan.raw_size);
    let min_size = match plan.kind {
        Kind::Zstd => zstd_min_size(plan.src.as_ref()),
        _ => plan.raw_size,
    };
    // Before the target is touched: a refused checkpoint path changes nothing.
    let mut keeper = Keeper::new(opts)?;
    let mut target = Target::open_with(&opts.target, min_size, opts.no_follow_target)?;
    let fresh_at_start = target.kind == (TargetKind::File { fresh: true });
    if fresh_at_start {
        target.presize(min_size.unwrap_or(0))?;
    }
    let image_hex = hex::encode(plan.expected);

    let (start, hasher) = resume_point(opts, &plan, &keeper, &image_hex, &mut target);
    let head = plan.raw_size.map(|r| r.min(HELD)).unwrap_or(HELD);
    keeper.arm(head);
    target.zero_head(head)?;
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2);
    let frame_sha = match opts.frame_sha256 {
        FrameSha::On => true,
        FrameSha::Off => false,
        FrameSha::Auto => cores >= 4,
    };
    if start > 0 {
        progress.bytes.store(start * plan.chunk, Ordering::Relaxed);
        progress.set_stage("resume");
    }
    progress.set_stage("copy");

    let sh = Shared {
        err: Mutex::new(None),
        abort: AtomicBool::new(false),
        cpu: Default::default(),
    };
    let target = target;
    let ckpt = |done: u64, state: &str| -> PResult<()> {
        let c = Checkpoint {
            version: 1,
            image_sha256: image_hex.clone(),
            chunk_size: plan.chunk,
            chunks_done: done,
            hash_state: state.to_string(),
            target_fresh: fresh_at_start,
        };
        keeper.write(&target, &c)
    };
    // A resumed run's on-target checkpoint was zeroed with the head: put it back.
    if start > 0 && keeper.on_target() {
        ckpt(start, &hasher.save())?;
    }

    let mut seqr = Seq {
        plan: &plan,
        target: &target,
        opts,
        start,
        hasher,
        held: Vec::with_capacity(HELD as usize),
        time: HashTime::default(),
    };
    run_stages(&mut seqr, frame_sha, cores, &ckpt, progress, &sh);

    let cpu: BTreeMap<&'static str, f64> = ["read", "decode", "hash", "write"]
        .iter()
        .enumerate()
        .map(|(i, n)| {
            (
                *n,
                (sh.cpu[i].load(Ordering::Relaxed) as f64 / 1e6).round() / 1e3,
            )
        })
        .collect();
    let fail = |e: ProvisionError| -> ProvisionError {
        let _ = target.zero_head(head);
        keeper.failed(&target, &e);
        e
    };
    if let Some(e) = sh.err.lock().ok().and_then(|mut g| g.take()) {
        return Err(fail(e));
    }
    progress.set_stage("finalize");
    let raw_size = seqr.hasher.len();
    if let Some(r) = plan.raw_size {
        if r != raw_size {
            return Err(fail(ProvisionError::Truncated(format!(
                "got {raw_size} raw bytes, expected {r}"
            ))));
        }
    }
    let digest = seqr.hasher.clone().finalize();
    if digest != plan.expected {
        return Err(fail(ProvisionError::Integrity(format!(
            "image sha256 is {}, expected {}",
            hex::encode(digest),
            image_hex
        ))));
    }
    if let Err(e) = target.check_fits(raw_size) {
        if target.kind != (TargetKind::File { fresh: true }) {
            return Err(fail(e));
        }
    }
    // Everything but the first MiB is verified: make it durable, then write the head.
    if let Err(e) = write_held_head(&target, &seqr.held, raw_size) {
        return Err(fail(e));
    }
    keeper.done();
    progress.bytes.store(raw_size, Ordering::Relaxed);
    Ok(Outcome {
        raw_size,
        sha256: hex::encode(digest),
        resumed_from: start * plan.chunk,
        direct: target.direct,
        frame_sha256: frame_sha && matches!(plan.kind, Kind::Framed(_)),
        format: match plan.kind {
            Kind::Framed(_) => "packed",
            Kind::Zstd => "zstd",
            Kind::Raw => "raw",
        },
        cpu,
        hash_thread: seqr.time.map(),
    })
}

#[cfg(test)]
mod tests;
