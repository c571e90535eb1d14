//! The API's audit log: every write (POST, PUT, PATCH, DELETE) and every denied
//! request (401, 403) as one JSON line: time (RFC 3339), user, groups, source address,
//! verb, API group, resource, namespace, name, HTTP code and result (`allowed`,
//! `denied`, `error`). Never a token, a header or a body.
//!
//! Lines of authenticated callers (writes and 403s) go through a bounded channel to
//! one writer thread, and [`Audit::record`] waits for room when it is full: a slow disk
//! slows the writers down, and no write goes unrecorded. Unauthenticated requests
//! (401) are not queued one by one: they are summed per source (IPv4 address, IPv6
//! /64; at most [`MAX_SOURCES`] sources per interval, the rest in one line with source
//! `null`) and the writer writes one line per source per
//! `api.audit_unauthenticated_interval_ms`, the first request's fields with a `count`
//! (and `until`, the last one's time). So a flood of 401s neither delays nor crowds out
//! other lines, nor rotates the history away. The writer appends to the file (mode
//! 0600) and rotates it by size: `audit.log` → `audit.log.1` → … → `audit.log.N`, the
//! oldest dropped.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use prometheus_client::metrics::counter::Counter;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::authz::Attrs;

/// Lines that may wait for the writer.
const QUEUE: usize = 4096;
/// Sources whose 401s get a line of their own per interval; the others share one.
pub(crate) const MAX_SOURCES: usize = 64;

/// Where and how the log is kept.
#[derive(Clone, Debug)]
pub struct AuditSettings {
    pub path: PathBuf,
    /// Rotate when the file would grow past this.
    pub max_bytes: u64,
    /// Rotated files kept (`.1` … `.N`); 0 keeps none.
    pub keep: usize,
    /// How long 401s are summed per source before their line is written.
    pub unauthenticated_interval: Duration,
}

/// One request as the audit log records it.
pub(crate) struct Event<'a> {
    pub user: &'a str,
    pub groups: &'a [String],
    pub source: Option<SocketAddr>,
    pub attrs: &'a Attrs,
    pub code: u16,
}

/// The sending side, shared by every request. Cheap to clone.
#[derive(Clone)]
pub struct Audit {
    tx: mpsc::Sender<String>,
    anonymous: Arc<Mutex<Summaries>>,
    /// Lines lost because the writer is gone (it ended); never a full queue.
    dropped: Counter,
    unauthenticated: Counter,
}

/// The 401s of the current interval, per source.
#[derive(Default)]
struct Summaries {
    by_source: HashMap<Option<IpAddr>, Summary>,
    /// Sources past [`MAX_SOURCES`]: one summary, and how many sources it holds.
    rest: Option<(Summary, u64)>,
}

/// The first 401 of a source in an interval (its line), how many followed, and when
/// the last came.
struct Summary {
    line: Value,
    count: u64,
    until: String,
}

impl Summaries {
    fn add(&mut self, key: Option<IpAddr>, line: impl FnOnce() -> Value, now: String) {
        if let Some(s) = self.by_source.get_mut(&key) {
            s.count += 1;
            s.until = now;
            return;
        }
        if self.by_source.len() < MAX_SOURCES {
            let s = Summary {
                line: line(),
                count: 1,
                until: now,
            };
            self.by_source.insert(key, s);
            return;
        }
        match &mut self.rest {
            Some((s, _)) => {
                s.count += 1;
                s.until = now;
            }
            None => {
                let mut l = line();
                l["source"] = Value::Null;
                self.rest = Some((
                    Summary {
                        line: l,
                        count: 1,
                        until: now,
                    },
                    0,
                ));
            }
        }
        if let Some((_, n)) = &mut self.rest {
            *n += 1;
        }
    }

    /// The lines of the interval, oldest first; the summaries start afresh.
    fn take(&mut self) -> Vec<String> {
        let mut all: Vec<(Summary, Option<u64>)> = self
            .by_source
            .drain()
            .map(|(_, s)| (s, None))
            .chain(self.rest.take().map(|(s, n)| (s, Some(n))))
            .collect();
        all.sort_by(|a, b| a.0.line["time"].as_str().cmp(&b.0.line["time"].as_str()));
        all.into_iter()
            .map(|(mut s, sources)| {
                s.line["count"] = Value::from(s.count);
                s.line["until"] = Value::from(s.until);
                if let Some(n) = sources {
                    s.line["sources"] = Value::from(n);
                }
                s.line.to_string()
            })
            .collect()
    }
}

/// The key 401s are summed under: the IPv4 address, or the IPv6 /64.
fn source_key(s: Option<SocketAddr>) -> Option<IpAddr> {
    s.map(|s| match s.ip().to_canonical() {
        IpAddr::V6(v6) => {
            let b = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(b.into())
        }
        v4 => v4,
    })
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

impl Audit {
    /// Open (create, 0600) the log and start its writer thread, which ends when every
    /// `Audit` is dropped. The counters go into `registry`.
    pub fn start(
        s: AuditSettings,
        registry: &mut prometheus_client::registry::Registry,
    ) -> Result<Audit> {
        let file = open(&s.path)?;
        let size = file.metadata().map(|m| m.len()).unwrap_or(0);
        let (tx, rx) = mpsc::channel(QUEUE);
        let dropped = Counter::default();
        registry.register(
            "audit_dropped_lines",
            "Audit log lines lost because the writer had ended (writes wait for room, 401s are summed)",
            dropped.clone(),
        );
        let unauthenticated = Counter::default();
        registry.register(
            "audit_unauthenticated_requests",
            "Unauthenticated API requests (401), summed per source in the audit log",
            unauthenticated.clone(),
        );
        let anonymous = Arc::new(Mutex::new(Summaries::default()));
        let w = Writer {
            file,
            size,
            failing: false,
            s,
        };
        let summaries = anonymous.clone();
        std::thread::Builder::new()
            .name("api-audit".into())
            .spawn(move || w.run(rx, summaries))
            .context("starting the audit log writer")?;
        Ok(Audit {
            tx,
            anonymous,
            dropped,
            unauthenticated,
        })
    }

    /// Record `e`: a 401 is added to its source's summary at once; any other line is
    /// queued, waiting for room when the writer is behind (never dropped).
    pub(crate) async fn record(&self, e: &Event<'_>) {
        let line = || {
            let a = e.attrs;
            let result = match e.code {
                401 | 403 => "denied",
                c if c < 400 => "allowed",
                _ => "error",
            };
            json!({
                "time": now(),
                "user": e.user,
                "groups": e.groups,
                "source": e.source.map(|s| s.to_string()),
                "verb": a.verb,
                "group": a.group,
                "resource": a.resource_path(),
                "namespace": a.namespace,
                "name": a.name,
                "code": e.code,
                "result": result,
            })
        };
        if e.code == 401 {
            self.unauthenticated.inc();
            let mut m = self.anonymous.lock().unwrap_or_else(|p| p.into_inner());
            m.add(source_key(e.source), line, now());
            return;
        }
        if self.tx.send(line().to_string()).await.is_err() {
            self.dropped.inc();
        }
    }
}

/// The writer thread's file.
struct Writer {
    file: File,
    size: u64,
    failing: bool,
    s: AuditSettings,
}

impl Writer {
    /// Write queued lines as they come and the 401 summaries once per interval, until
    /// every sender is gone (then the last summaries).
    fn run(mut self, mut rx: mpsc::Receiver<String>, summaries: Arc<Mutex<Summaries>>) {
        let rt = match tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                tracing::error!(error = %e, "audit log writer: no runtime");
                return;
            }
        };
        let take = || summaries.lock().unwrap_or_else(|p| p.into_inner()).take();
        rt.block_on(async {
            let every = self
                .s
                .unauthenticated_interval
                .max(Duration::from_millis(10));
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    l = rx.recv() => match l {
                        Some(l) => self.write(l),
                        None => break,
                    },
                    _ = tick.tick() => {
                        for l in take() {
                            self.write(l);
                        }
                    }
                }
            }
        });
        for l in take() {
            self.write(l);
        }
    }

    fn write(&mut self, mut line: String) {
        line.push('\n');
        let n = line.len() as u64;
        if self.size > 0 && self.size + n > self.s.max_bytes {
            match rotate(&self.s) {
                Ok(f) => {
                    self.file = f;
                    self.size = 0;
                }
                Err(e) => {
                    tracing::error!(path = %self.s.path.display(), error = %format!("{e:#}"), "rotating the audit log")
                }
            }
        }
        match self.file.write_all(line.as_bytes()) {
            Ok(()) => {
                self.size += n;
                self.failing = false;
            }
            Err(e) if !self.failing => {
                self.failing = true;
                tracing::error!(path = %self.s.path.display(), error = %e, "writing the audit log");
            }
            Err(_) => {}
        }
    }
}

fn open(path: &Path) -> Result<File> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("opening audit log {}", path.display()))
}

/// `path.N`.
fn numbered(path: &Path, n: usize) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".{n}"));
    PathBuf::from(s)
}

/// Shift `path.1..` up by one (the last falls off) and move `path` to `path.1`.
fn rotate(s: &AuditSettings) -> Result<File> {
    if s.keep == 0 {
        std::fs::remove_file(&s.path).ok();
    } else {
        std::fs::remove_file(numbered(&s.path, s.keep)).ok();
        for n in (1..s.keep).rev() {
            let from = numbered(&s.path, n);
            if from.exists() {
                std::fs::rename(&from, numbered(&s.path, n + 1))?;
            }
        }
        std::fs::rename(&s.path, numbered(&s.path, 1))?;
    }
    open(&s.path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Method;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lines_are_written_and_rotated_by_size() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("audit.log");
        let mut reg = prometheus_client::registry::Registry::default();
        let a = Audit::start(
            AuditSettings {
                path: path.clone(),
                max_bytes: 1000,
                keep: 2,
                unauthenticated_interval: Duration::from_secs(10),
            },
            &mut reg,
        )
        .unwrap();
        let attrs = Attrs::derive(
            &Method::DELETE,
            "/apis/metal.ironcore.dev/v1alpha1/servers/a",
            None,
        );
        let groups = vec!["admin".to_string()];
        for _ in 0..40 {
            a.record(&Event {
                user: "admin",
                groups: &groups,
                source: Some("127.0.0.1:5".parse().unwrap()),
                attrs: &attrs,
                code: 200,
            })
            .await;
        }
        drop(a);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !numbered(&path, 2).exists() {
            assert!(std::time::Instant::now() < deadline, "no rotation");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(!numbered(&path, 3).exists());
        for p in [path.clone(), numbered(&path, 1), numbered(&path, 2)] {
            let meta = std::fs::metadata(&p).unwrap();
            assert!(
                meta.len() <= 1000,
                "{} is {} bytes",
                p.display(),
                meta.len()
            );
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(meta.permissions().mode() & 0o777, 0o600);
            let text = std::fs::read_to_string(&p).unwrap();
            for l in text.lines() {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                assert_eq!(v["verb"], "delete");
                assert_eq!(v["resource"], "servers");
                assert_eq!(v["name"], "a");
                assert_eq!(v["result"], "allowed");
                assert_eq!(v["source"], "127.0.0.1:5");
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unauthenticated_requests_are_summed_per_source_and_writes_all_kept() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("audit.log");
        let mut reg = prometheus_client::registry::Registry::default();
        let a = Audit::start(
            AuditSettings {
                path: path.clone(),
                max_bytes: 100 << 20,
                keep: 1,
                unauthenticated_interval: Duration::from_millis(50),
            },
            &mut reg,
        )
        .unwrap();
        let list = Attrs::derive(
            &Method::GET,
            "/apis/metal.ironcore.dev/v1alpha1/servers",
            None,
        );
        let del = Attrs::derive(
            &Method::DELETE,
            "/apis/metal.ironcore.dev/v1alpha1/servers/a",
            None,
        );
        let groups = vec!["admin".to_string()];
        let anon = |src: String| Event {
            user: "system:anonymous",
            groups: &[],
            source: Some(src.parse().unwrap()),
            attrs: &list,
            code: 401,
        };
        // 100,000 401s from 2 addresses (one of them an IPv6 /64 over many
        // addresses), 200 more sources past the per-interval cap, and 20,000 writes
        // interleaved: every write is written, the 401s become a few lines.
        for i in 0..100_000u32 {
            let src = if i % 2 == 0 {
                format!("127.0.0.1:{}", i % 60_000 + 1)
            } else {
                format!("[2001:db8::{:x}]:443", i % 0xffff)
            };
            a.record(&anon(src)).await;
            if i % 5 == 0 {
                a.record(&Event {
                    user: "admin",
                    groups: &groups,
                    source: None,
                    attrs: &del,
                    code: 200,
                })
                .await;
            }
        }
        for i in 0..200u32 {
            a.record(&anon(format!("10.1.{}.{}:1", i / 250, i % 250)))
                .await;
        }
        drop(a);
        let lines = || -> Vec<Value> {
            std::fs::read_to_string(&path)
                .unwrap_or_default()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect()
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let l = lines();
            let writes = l.iter().filter(|v| v["code"] == 200).count();
            let counted: u64 = l
                .iter()
                .filter(|v| v["code"] == 401)
                .map(|v| v["count"].as_u64().unwrap())
                .sum();
            if writes == 20_000 && counted == 100_200 {
                let summaries = l.iter().filter(|v| v["code"] == 401).count();
                // Per interval at most MAX_SOURCES + 1 lines; the run took a few.
                assert!(summaries < 2_000, "{summaries} summary lines");
                assert!(l.iter().any(|v| v["code"] == 401
                    && v["source"].is_null()
                    && v["sources"].as_u64().is_some()));
                assert!(l
                    .iter()
                    .filter(|v| v["code"] == 401)
                    .all(|v| v["user"] == "system:anonymous" && v["until"].is_string()));
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{writes} writes, {counted} 401s counted"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
        assert!(text.contains("audit_dropped_lines_total 0"), "{text}");
        assert!(
            text.contains("audit_unauthenticated_requests_total 100200"),
            "{text}"
        );
    }

    #[test]
    fn ipv6_sources_are_summed_per_64() {
        let k = |s: &str| source_key(Some(s.parse().unwrap()));
        assert_eq!(k("[2001:db8::1]:1"), k("[2001:db8::ffff:2]:9"));
        assert_ne!(k("[2001:db8::1]:1"), k("[2001:db8:0:1::1]:1"));
        assert_eq!(k("127.0.0.1:1"), k("[::ffff:127.0.0.1]:2"));
        assert_ne!(k("127.0.0.1:1"), k("127.0.0.2:1"));
    }
}
