//! The API's audit log: every write (POST, PUT, PATCH, DELETE) and every denied
//! request (401, 403) as one JSON line: time (RFC 3339), user, groups, source address,
//! verb, API group, resource, namespace, name, HTTP code and result (`allowed`,
//! `denied`, `error`). Never a token, a header or a body.
//!
//! Requests hand their line to a bounded channel ([`Audit::record`] never blocks); one
//! writer thread appends the lines to the file (mode 0600) and rotates it by size:
//! `audit.log` → `audit.log.1` → … → `audit.log.N`, the oldest dropped. When the
//! channel is full the line is dropped, counted in
//! `bootplane_api_audit_dropped_lines_total`, and logged once.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use prometheus_client::metrics::counter::Counter;
use serde_json::json;
use tokio::sync::mpsc;

use super::auth::Attrs;

/// Lines that may wait for the writer.
const QUEUE: usize = 4096;

/// Where and how the log is kept.
#[derive(Clone, Debug)]
pub struct AuditSettings {
    pub path: PathBuf,
    /// Rotate when the file would grow past this.
    pub max_bytes: u64,
    /// Rotated files kept (`.1` … `.N`); 0 keeps none.
    pub keep: usize,
}

/// One request as the audit log records it.
pub struct Event<'a> {
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
    dropped: Counter,
    warned: Arc<AtomicBool>,
}

impl Audit {
    /// Open (create, 0600) the log and start its writer thread, which ends when every
    /// `Audit` is dropped. The dropped-lines counter goes into `registry`.
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
            "Audit log lines dropped because the writer fell behind",
            dropped.clone(),
        );
        std::thread::Builder::new()
            .name("api-audit".into())
            .spawn(move || writer(s, file, size, rx))
            .context("starting the audit log writer")?;
        Ok(Audit {
            tx,
            dropped,
            warned: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Queue the line of `e`; never waits.
    pub fn record(&self, e: &Event) {
        let a = e.attrs;
        let result = match e.code {
            401 | 403 => "denied",
            c if c < 400 => "allowed",
            _ => "error",
        };
        let line = json!({
            "time": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
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
        .to_string();
        if self.tx.try_send(line).is_err() {
            self.dropped.inc();
            if !self.warned.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "audit log writer is behind: dropping lines (counted in bootplane_api_audit_dropped_lines_total)"
                );
            }
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

fn writer(s: AuditSettings, mut file: File, mut size: u64, mut rx: mpsc::Receiver<String>) {
    let mut failing = false;
    while let Some(mut line) = rx.blocking_recv() {
        line.push('\n');
        let n = line.len() as u64;
        if size > 0 && size + n > s.max_bytes {
            match rotate(&s) {
                Ok(f) => {
                    file = f;
                    size = 0;
                }
                Err(e) => {
                    tracing::error!(path = %s.path.display(), error = %format!("{e:#}"), "rotating the audit log")
                }
            }
        }
        match file.write_all(line.as_bytes()) {
            Ok(()) => {
                size += n;
                failing = false;
            }
            Err(e) if !failing => {
                failing = true;
                tracing::error!(path = %s.path.display(), error = %e, "writing the audit log");
            }
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Method;

    #[test]
    fn lines_are_written_and_rotated_by_size() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("audit.log");
        let mut reg = prometheus_client::registry::Registry::default();
        let a = Audit::start(
            AuditSettings {
                path: path.clone(),
                max_bytes: 1000,
                keep: 2,
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
            });
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
}
