//! Local job runner: each job is a `bootplane provision --source ... --target ...`
//! child process (the command is configurable), bounded by a timeout and a limit on
//! concurrent jobs, watched through its JSON progress lines on stderr.
//!
//! The child runs in its own process group, so a timeout or a cancel kills whatever it
//! started too. Outcome mapping: exit 0 → `Succeeded`; exit N → `Failed` with
//! "exit code N: <last error line>"; killed by a signal, or timed out → `Failed` with
//! that reason. Failed attempts are retried when [`RetryPolicy`] says the failure
//! class is transient (by default: killed by a signal or timed out; exit codes only
//! when listed, since a checksum mismatch will not improve by retrying), with
//! exponential backoff. A cancelled job is never retried.

use std::collections::{HashMap, VecDeque};
use std::os::unix::process::ExitStatusExt as _;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt as _, StreamExt as _};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tokio_util::codec::{FramedRead, LinesCodec};
use tokio_util::sync::CancellationToken;

use super::progress::{parse_line, Line};
use super::{JobError, JobId, JobRunner, JobState, JobStatus, ProvisionRequest};

/// Which failures are retried, how often, how far apart.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RetryPolicy {
    /// Retries after the first attempt (0 = never retry).
    pub max_retries: u32,
    /// Delay before the first retry; doubles each time (max 5 minutes).
    pub backoff_ms: u64,
    /// Retry when the child was killed by a signal it did not send itself (OOM killer,
    /// an operator's `kill`).
    pub on_signal: bool,
    /// Retry after a timeout.
    pub on_timeout: bool,
    /// Non-zero exit codes that mean a transient failure. Default `[10]`: in
    /// `bootplane provision`'s exit-code table (`image::error`) 10 is "source cannot
    /// be opened or read" (NFS server restarting, network), and the streamer resumes from
    /// its checkpoint; integrity (13), target (20-22) and usage (2) failures are final.
    pub exit_codes: Vec<i32>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: 2,
            backoff_ms: 2_000,
            on_signal: true,
            on_timeout: true,
            exit_codes: vec![10],
        }
    }
}

/// `[provision.local]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct LocalConfig {
    /// Program and leading arguments; the runner appends `--source S --target T
    /// [--sha256 H] [--manifest M]`. Empty = this binary + `provision`.
    pub command: Vec<String>,
    /// Per-attempt wall-clock limit.
    pub timeout_secs: u64,
    /// Jobs running at once; more wait as `Pending`.
    pub max_concurrent: usize,
    /// Jobs remembered (finished ones are forgotten oldest first beyond this).
    pub max_jobs: usize,
    pub retry: RetryPolicy,
}

impl Default for LocalConfig {
    fn default() -> Self {
        LocalConfig {
            command: Vec::new(),
            timeout_secs: 3600,
            max_concurrent: 4,
            max_jobs: 1000,
            retry: RetryPolicy::default(),
        }
    }
}

impl LocalConfig {
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.timeout_secs == 0 {
            anyhow::bail!("provision.local.timeout_secs must be at least 1");
        }
        if self.max_concurrent == 0 || self.max_jobs == 0 {
            anyhow::bail!("provision.local.max_concurrent and max_jobs must be at least 1");
        }
        if self.command.first().is_some_and(|c| c.is_empty()) {
            anyhow::bail!("provision.local.command must not start with an empty program");
        }
        Ok(())
    }
}

struct Job {
    status: Mutex<JobStatus>,
    cancel: CancellationToken,
}

impl Job {
    fn update(&self, f: impl FnOnce(&mut JobStatus)) {
        let mut s = self.status.lock().unwrap_or_else(|e| e.into_inner());
        let (was_finished, attempts) = (s.state.is_finished(), s.attempts);
        f(&mut s);
        let m = super::metrics::global();
        let runner = "local";
        if s.attempts > attempts {
            m.attempts
                .get_or_create(&super::metrics::RunnerLabel { runner })
                .inc();
        }
        if !was_finished && s.state.is_finished() {
            let state = if s.state == JobState::Succeeded {
                "Succeeded"
            } else {
                "Failed"
            };
            m.finished
                .get_or_create(&super::metrics::FinishedLabels { runner, state })
                .inc();
        }
    }

    fn snapshot(&self) -> JobStatus {
        self.status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[derive(Default)]
struct Table {
    jobs: HashMap<JobId, Arc<Job>>,
    order: VecDeque<JobId>,
}

/// See the module doc.
pub struct LocalRunner {
    cfg: LocalConfig,
    argv: Vec<String>,
    table: Mutex<Table>,
    slots: Arc<Semaphore>,
}

enum Outcome {
    Succeeded,
    Cancelled,
    Failed { reason: String, retryable: bool },
}

impl LocalRunner {
    pub fn new(cfg: LocalConfig) -> anyhow::Result<LocalRunner> {
        use anyhow::Context as _;
        cfg.validate()?;
        let argv = if cfg.command.is_empty() {
            let exe = std::env::current_exe().context("locating the bootplane binary")?;
            vec![exe.display().to_string(), "provision".to_string()]
        } else {
            cfg.command.clone()
        };
        let slots = Arc::new(Semaphore::new(cfg.max_concurrent));
        Ok(LocalRunner {
            cfg,
            argv,
            table: Mutex::new(Table::default()),
            slots,
        })
    }

    fn get(&self, id: &str) -> Option<Arc<Job>> {
        self.table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .jobs
            .get(id)
            .cloned()
    }

    /// Cancel every job and wait (bounded) for them to end.
    pub async fn shutdown(&self) {
        let jobs: Vec<Arc<Job>> = self
            .table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .jobs
            .values()
            .cloned()
            .collect();
        for j in &jobs {
            j.cancel.cancel();
        }
        for j in jobs {
            wait_finished(&j, Duration::from_secs(10)).await;
        }
    }

    fn args_for(&self, req: &ProvisionRequest) -> Vec<String> {
        let mut a = self.argv[1..].to_vec();
        a.extend(req.provision_args(req.source_arg()));
        a
    }
}

async fn wait_finished(job: &Job, limit: Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    while !job.snapshot().state.is_finished() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn kill_group(pid: Option<u32>) {
    if let Some(pid) = pid {
        // SAFETY: kill(2) on the process group created for this child (process_group(0)).
        unsafe {
            libc::kill(-(pid as i32), libc::SIGKILL);
        }
    }
}

fn signal_name(s: i32) -> &'static str {
    match s {
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGHUP => "SIGHUP",
        _ => "signal",
    }
}

async fn run_attempt(
    job: &Job,
    program: &str,
    args: &[String],
    id: &str,
    timeout: Duration,
    policy: &RetryPolicy,
) -> Outcome {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .env("BOOTPLANE_JOB_ID", id)
        .env("BOOTPLANE_PROGRESS", "json")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .process_group(0);
    // The job dies with bootplane, so a restarted bootplane never finds an orphan still
    // writing the disk; the controller starts the job again under the same id.
    crate::sys::die_with_parent(cmd.as_std_mut());
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return Outcome::Failed {
                reason: format!("starting {program}: {e}"),
                retryable: false,
            }
        }
    };
    let pid = child.id();
    let Some(stderr) = child.stderr.take() else {
        kill_group(pid);
        return Outcome::Failed {
            reason: "child has no stderr pipe".into(),
            retryable: false,
        };
    };
    let mut lines = FramedRead::new(stderr, LinesCodec::new_with_max_length(64 * 1024));
    let mut last_error: Option<String> = None;
    let mut last_text: Option<String> = None;
    let handle = |line: String, last_error: &mut Option<String>, last_text: &mut Option<String>| {
        let parsed = parse_line(&line);
        match &parsed {
            Line::Text(t) => *last_text = Some(t.chars().take(500).collect()),
            Line::Empty => {}
            Line::Progress { .. } => job.update(|s| {
                if let Some(e) = s.progress.apply(&parsed) {
                    *last_error = Some(e.chars().take(500).collect());
                }
            }),
        }
    };
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let mut eof = false;
    let status = loop {
        tokio::select! {
            l = lines.next(), if !eof => match l {
                Some(Ok(line)) => handle(line, &mut last_error, &mut last_text),
                Some(Err(_)) => {} // over-long line (skipped by the codec) or read error
                None => eof = true,
            },
            s = child.wait() => break s,
            _ = &mut deadline => {
                kill_group(pid);
                let _ = child.wait().await;
                return Outcome::Failed { reason: format!("timed out after {} s", timeout.as_secs()), retryable: policy.on_timeout };
            }
            _ = job.cancel.cancelled() => {
                kill_group(pid);
                let _ = child.wait().await;
                return Outcome::Cancelled;
            }
        }
    };
    // The child is gone; take what is left in the pipe (bounded: a grandchild could
    // hold it open), then kill any leftovers of its process group.
    if !eof {
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            while let Some(l) = lines.next().await {
                if let Ok(line) = l {
                    handle(line, &mut last_error, &mut last_text);
                }
            }
        })
        .await;
    }
    kill_group(pid);
    let status = match status {
        Ok(s) => s,
        Err(e) => {
            return Outcome::Failed {
                reason: format!("waiting for the job process: {e}"),
                retryable: false,
            }
        }
    };
    let detail = last_error
        .or(last_text)
        .unwrap_or_else(|| "no error output".into());
    if status.success() {
        Outcome::Succeeded
    } else if let Some(code) = status.code() {
        Outcome::Failed {
            reason: format!("exit code {code}: {detail}"),
            retryable: policy.exit_codes.contains(&code),
        }
    } else {
        let sig = status.signal().unwrap_or(0);
        Outcome::Failed {
            reason: format!("killed by {} ({sig}): {detail}", signal_name(sig)),
            retryable: policy.on_signal,
        }
    }
}

async fn run_job(
    job: Arc<Job>,
    slots: Arc<Semaphore>,
    program: String,
    args: Vec<String>,
    id: String,
    cfg: LocalConfig,
) {
    let permit = tokio::select! {
        p = slots.acquire_owned() => p.ok(),
        _ = job.cancel.cancelled() => None,
    };
    if permit.is_none() {
        job.update(|s| {
            s.state = JobState::Failed;
            s.reason = Some("cancelled".into());
            s.finished_at = Some(chrono::Utc::now());
        });
        return;
    }
    let timeout = Duration::from_secs(cfg.timeout_secs);
    let mut backoff = Duration::from_millis(cfg.retry.backoff_ms);
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        job.update(|s| {
            s.state = JobState::Running;
            s.attempts = attempt;
            s.started_at.get_or_insert_with(chrono::Utc::now);
        });
        let outcome = run_attempt(&job, &program, &args, &id, timeout, &cfg.retry).await;
        let (reason, retry) = match outcome {
            Outcome::Succeeded => {
                job.update(|s| {
                    s.state = JobState::Succeeded;
                    s.reason = None;
                    s.finished_at = Some(chrono::Utc::now());
                });
                tracing::info!(job = %id, attempts = attempt, "provisioning job succeeded");
                return;
            }
            Outcome::Cancelled => ("cancelled".to_string(), false),
            Outcome::Failed { reason, retryable } => {
                (reason, retryable && attempt <= cfg.retry.max_retries)
            }
        };
        if !retry {
            tracing::warn!(job = %id, attempts = attempt, %reason, "provisioning job failed");
            let reason = if attempt > 1 {
                format!("{reason} (after {attempt} attempts)")
            } else {
                reason
            };
            job.update(|s| {
                s.state = JobState::Failed;
                s.reason = Some(reason);
                s.finished_at = Some(chrono::Utc::now());
            });
            return;
        }
        tracing::warn!(job = %id, attempt, %reason, retry_in_ms = backoff.as_millis() as u64, "provisioning attempt failed; retrying");
        job.update(|s| s.reason = Some(format!("attempt {attempt} failed: {reason}; retrying")));
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = job.cancel.cancelled() => {
                job.update(|s| {
                    s.state = JobState::Failed;
                    s.reason = Some("cancelled".into());
                    s.finished_at = Some(chrono::Utc::now());
                });
                return;
            }
        }
        backoff = (backoff * 2).min(Duration::from_secs(300));
    }
}

impl JobRunner for LocalRunner {
    fn name(&self) -> &'static str {
        "local"
    }

    fn start(&self, req: ProvisionRequest) -> BoxFuture<'_, Result<JobId, JobError>> {
        async move {
            req.validate()?;
            let id = req.id.clone().unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
            let job = {
                let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
                if t.jobs.contains_key(&id) {
                    return Ok(id);
                }
                while t.jobs.len() >= self.cfg.max_jobs {
                    let Some(pos) = t.order.iter().position(|j| t.jobs.get(j).is_none_or(|job| job.snapshot().state.is_finished())) else {
                        return Err(JobError::Busy(format!("{} jobs are unfinished", t.jobs.len())));
                    };
                    if let Some(old) = t.order.remove(pos) {
                        t.jobs.remove(&old);
                    }
                }
                let mut status = JobStatus::pending(id.clone(), req.server.clone());
                status.request_sha256 = Some(req.digest());
                let job = Arc::new(Job { status: Mutex::new(status), cancel: CancellationToken::new() });
                t.jobs.insert(id.clone(), job.clone());
                t.order.push_back(id.clone());
                job
            };
            let args = self.args_for(&req);
            super::metrics::global()
                .started
                .get_or_create(&super::metrics::RunnerLabel { runner: "local" })
                .inc();
            tracing::info!(job = %id, server = %req.server, source = %crate::image::source::shown(&req.source_arg()), target = %req.resolved_target.as_deref().unwrap_or(&req.target), "starting provisioning job");
            tokio::spawn(run_job(job, self.slots.clone(), self.argv[0].clone(), args, id.clone(), self.cfg.clone()));
            Ok(id)
        }
        .boxed()
    }

    fn status<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<JobStatus, JobError>> {
        async move {
            self.get(id)
                .map(|j| j.snapshot())
                .ok_or_else(|| JobError::NotFound(id.into()))
        }
        .boxed()
    }

    fn cancel<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), JobError>> {
        async move {
            let job = self.get(id).ok_or_else(|| JobError::NotFound(id.into()))?;
            job.cancel.cancel();
            wait_finished(&job, Duration::from_secs(10)).await;
            Ok(())
        }
        .boxed()
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<JobStatus>, JobError>> {
        async move { Ok(self.list_now()) }.boxed()
    }
}

impl LocalRunner {
    fn list_now(&self) -> Vec<JobStatus> {
        let t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        t.order
            .iter()
            .filter_map(|id| t.jobs.get(id))
            .take(super::MAX_LISTED)
            .map(|j| j.snapshot())
            .collect()
    }
}

impl Drop for LocalRunner {
    fn drop(&mut self) {
        if let Ok(t) = self.table.lock() {
            for j in t.jobs.values() {
                j.cancel.cancel();
            }
        }
    }
}
