//! Progress reporting for `bootplane provision`.
//!
//! On a terminal: one self-rewriting status line on stderr. Otherwise: JSON lines on
//! stderr, one object per line, at most every 500 ms during the copy and once per stage
//! change. The job runner parses these; the schema (all keys always present):
//!
//! ```json
//! {"stage":"copy","bytes":123,"total":456,"rate":1.2e9,"eta":0.5,"elapsed":1.0}
//! ```
//!
//! - `stage`: `open` (source, manifest and target checks), `resume` (continuing from a
//!   checkpoint; `bytes` is where), `copy` (read → decode → verify → write), `finalize`
//!   (whole-image check, sync, first MiB), `done` (success), `error` (failure).
//! - `bytes`: raw image bytes verified and written so far; `total`: raw image size or
//!   `null` when unknown (plain zstd/raw sources without a manifest until the end).
//! - `rate`: bytes/s over the copy so far (from the resume point); `eta`: seconds left
//!   or `null`; `elapsed`: seconds since start.
//! - `done` adds `"sha256":"<hex>"`; `error` adds `"code":<exit code>`, `"class"` (see
//!   [`ProvisionError::class`](super::error::ProvisionError::class)) and `"error":"<message>"`.
//!
//! The bar is a dozen lines written here rather than `indicatif`: one status line does
//! not justify a new dependency in the shared lock file.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub struct Progress {
    pub bytes: AtomicU64,
    total: AtomicU64, // u64::MAX = unknown
    start_bytes: AtomicU64,
    stage: Mutex<&'static str>,
    start: Instant,
    copy_start: Mutex<Option<Instant>>,
    tty: bool,
    quiet: bool,
    stop: AtomicBool,
    stop_tx: Mutex<Option<std::sync::mpsc::Sender<()>>>,
}

impl Progress {
    pub(crate) fn new(quiet: bool) -> Arc<Self> {
        Arc::new(Progress {
            bytes: AtomicU64::new(0),
            total: AtomicU64::new(u64::MAX),
            start_bytes: AtomicU64::new(0),
            stage: Mutex::new("open"),
            start: Instant::now(),
            copy_start: Mutex::new(None),
            tty: std::io::stderr().is_terminal(),
            quiet,
            stop: AtomicBool::new(false),
            stop_tx: Mutex::new(None),
        })
    }

    pub(crate) fn set_total(&self, t: Option<u64>) {
        self.total.store(t.unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    pub(crate) fn set_stage(&self, s: &'static str) {
        if let Ok(mut st) = self.stage.lock() {
            *st = s;
        }
        if s == "copy" {
            if let Ok(mut c) = self.copy_start.lock() {
                *c = Some(Instant::now());
            }
            self.start_bytes
                .store(self.bytes.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        self.emit(None);
    }

    /// Change the stage without printing (the caller prints with extra keys).
    pub(crate) fn set_stage_silent(&self, s: &'static str) {
        if let Ok(mut st) = self.stage.lock() {
            *st = s;
        }
    }

    fn snapshot(&self) -> serde_json::Map<String, serde_json::Value> {
        let bytes = self.bytes.load(Ordering::Relaxed);
        let total = self.total.load(Ordering::Relaxed);
        let total = (total != u64::MAX).then_some(total);
        let since = self
            .copy_start
            .lock()
            .ok()
            .and_then(|c| *c)
            .map(|c| c.elapsed().as_secs_f64())
            .unwrap_or(0.0);
        let done = bytes.saturating_sub(self.start_bytes.load(Ordering::Relaxed));
        let rate = if since > 0.0 {
            done as f64 / since
        } else {
            0.0
        };
        let eta = match total {
            Some(t) if rate > 0.0 => Some(t.saturating_sub(bytes) as f64 / rate),
            _ => None,
        };
        let mut m = serde_json::Map::new();
        m.insert(
            "stage".into(),
            (*self.stage.lock().map(|s| *s).as_ref().unwrap_or(&"?")).into(),
        );
        m.insert("bytes".into(), bytes.into());
        m.insert("total".into(), total.into());
        m.insert("rate".into(), ((rate * 10.0).round() / 10.0).into());
        m.insert("eta".into(), eta.map(|e| (e * 10.0).round() / 10.0).into());
        m.insert(
            "elapsed".into(),
            ((self.start.elapsed().as_secs_f64() * 1000.0).round() / 1000.0).into(),
        );
        m
    }

    /// Print one progress record (extra keys appended).
    pub(crate) fn emit(&self, extra: Option<serde_json::Map<String, serde_json::Value>>) {
        if self.quiet {
            return;
        }
        let mut m = self.snapshot();
        if let Some(x) = extra {
            m.extend(x);
        }
        let mut err = std::io::stderr().lock();
        if self.tty {
            let b = m["bytes"].as_u64().unwrap_or(0) as f64 / 1e6;
            let rate = m["rate"].as_f64().unwrap_or(0.0) / 1e6;
            let line = match m["total"].as_u64() {
                Some(t) if t > 0 => {
                    let frac = (b * 1e6 / t as f64).clamp(0.0, 1.0);
                    let filled = (frac * 30.0) as usize;
                    format!(
                        "{:>8} [{}{}] {:5.1}% {:.0}/{:.0} MB {:.0} MB/s eta {}s",
                        m["stage"].as_str().unwrap_or(""),
                        "#".repeat(filled),
                        " ".repeat(30 - filled),
                        frac * 100.0,
                        b,
                        t as f64 / 1e6,
                        rate,
                        m["eta"]
                            .as_f64()
                            .map(|e| format!("{e:.0}"))
                            .unwrap_or_else(|| "?".into())
                    )
                }
                _ => format!(
                    "{:>8} {:.0} MB {:.0} MB/s",
                    m["stage"].as_str().unwrap_or(""),
                    b,
                    rate
                ),
            };
            let end = if matches!(m["stage"].as_str(), Some("done") | Some("error")) {
                "\n"
            } else {
                ""
            };
            let _ = write!(err, "\r\x1b[2K{line}{end}");
            if let Some(e) = m.get("error") {
                let _ = writeln!(err, "error: {}", e.as_str().unwrap_or(""));
            }
        } else {
            let _ = writeln!(err, "{}", serde_json::Value::Object(m));
        }
        let _ = err.flush();
    }

    /// Start the periodic reporter (every 500 ms); it stops as soon as
    /// [`finish`](Self::finish) is called.
    pub(crate) fn spawn_ticker(self: &Arc<Self>) -> std::thread::JoinHandle<()> {
        let me = self.clone();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        if let Ok(mut g) = self.stop_tx.lock() {
            *g = Some(tx);
        }
        std::thread::spawn(move || {
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                rx.recv_timeout(Duration::from_millis(500))
            {
                if me.stop.load(Ordering::Relaxed) {
                    break;
                }
                me.emit(None);
            }
        })
    }

    pub(crate) fn finish(&self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Ok(mut g) = self.stop_tx.lock() {
            g.take();
        }
    }
}
