//! The provisioning job runner (the "fleetman" role): takes a provisioning request
//! (image source on NFS, checksum or manifest, target disk, server) and runs a job that
//! streams the image onto the disk, reporting state and progress.
//!
//! One trait, [`JobRunner`], two backends selected by `[provision] runner`:
//! - [`local`] (default): runs `bootplane provision ...` as a child process with a
//!   timeout, reads its JSON progress lines from stderr ([`progress`]), maps the exit
//!   status to a reason and retries per [`local::RetryPolicy`];
//! - [`kubernetes`]: renders a `batch/v1` Job (NFS volume, service-node selector
//!   `genctl.role.service=true`, resource limits, TTL, backoff limit) and creates it
//!   through the Kubernetes API. The rendered Job is validated against the Kubernetes
//!   OpenAPI schema in tests; it is untested against a live cluster (none can run here).
//!
//! [`api::router`] exposes the runner over REST (`POST/GET/DELETE
//! /apis/bootplane.dev/v1alpha1/jobs[/{id}]`) for the API listener.

pub mod api;
pub mod kubernetes;
pub mod local;
pub mod metrics;
pub mod progress;

use std::sync::Arc;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

pub use api::router;
pub use progress::Progress;

/// Job identifier (caller-chosen for idempotency, or a generated UUID).
pub type JobId = String;

/// Where the image comes from: an NFS export (the s390x flow) or any URL/path
/// `bootplane provision --source` accepts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NfsSource {
    /// NFS server address (IP or host name).
    pub server: String,
    /// Export path clients mount: the export name on the ganesha backend (e.g.
    /// `/images/ubuntu`), the directory path on knfsd, the junction path on ONTAP.
    pub export: String,
    /// File inside the export (e.g. `ubuntu.img.zst`).
    pub path: String,
}

impl NfsSource {
    /// `nfs://server/export/path`, the form libnfs and `bootplane provision` take.
    pub fn url(&self) -> String {
        let host = if self.server.contains(':') && !self.server.starts_with('[') {
            format!("[{}]", self.server)
        } else {
            self.server.clone()
        };
        format!(
            "nfs://{}{}/{}",
            host,
            self.export.trim_end_matches('/'),
            self.path.trim_start_matches('/')
        )
    }
}

/// A provisioning request (REST body of `POST .../jobs`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProvisionRequest {
    /// Optional idempotency key: starting a job with an id that exists returns that
    /// job instead of starting another (the server manager passes the action's UID).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The BareMetalServer this job provisions.
    pub server: String,
    /// Image name (informational; labels and logs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nfs: Option<NfsSource>,
    /// A source URL or path instead of `nfs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest: Option<String>,
    /// Target block device or file on the node running the job.
    pub target: String,
}

impl ProvisionRequest {
    /// The `--source` argument for `bootplane provision`.
    pub fn source_arg(&self) -> String {
        match (&self.nfs, &self.source) {
            (Some(n), _) => n.url(),
            (None, Some(s)) => s.clone(),
            (None, None) => String::new(),
        }
    }

    /// The arguments after `bootplane provision`: `--source SOURCE --target T
    /// [--sha256 H] [--manifest M]`. `source` is [`Self::source_arg`] or, where the job
    /// sees the image elsewhere (a pod's NFS volume), that path.
    pub fn provision_args(&self, source: String) -> Vec<String> {
        let mut a = vec![
            "--source".to_string(),
            source,
            "--target".into(),
            self.target.clone(),
        ];
        if let Some(h) = &self.sha256 {
            a.extend(["--sha256".into(), h.clone()]);
        }
        if let Some(m) = &self.manifest {
            a.extend(["--manifest".into(), m.clone()]);
        }
        a
    }

    pub fn validate(&self) -> Result<(), JobError> {
        let bad = |m: String| Err(JobError::Invalid(m));
        if let Some(id) = &self.id {
            if id.is_empty()
                || id.len() > 128
                || !id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            {
                return bad(format!(
                    "id {id:?} must be 1-128 characters of [A-Za-z0-9._-]"
                ));
            }
        }
        if self.server.is_empty()
            || self.server.len() > 253
            || self.server.chars().any(|c| c.is_control() || c == '/')
        {
            return bad(format!("server {:?} is not a valid name", self.server));
        }
        match (&self.nfs, &self.source) {
            (Some(_), Some(_)) => return bad("give either nfs or source, not both".into()),
            (None, None) => return bad("nfs or source is required".into()),
            (Some(n), None) => {
                if n.server.is_empty()
                    || n.server.contains('/')
                    || n.server
                        .chars()
                        .any(|c| c.is_control() || c.is_whitespace())
                {
                    return bad(format!("nfs.server {:?} is not a host", n.server));
                }
                if !n.export.starts_with('/') || n.export.split('/').any(|c| c == "..") {
                    return bad(format!(
                        "nfs.export {:?} must be an absolute path without ..",
                        n.export
                    ));
                }
                if n.path.is_empty() || n.path.split('/').any(|c| c == "..") {
                    return bad(format!(
                        "nfs.path {:?} must be a relative file path without ..",
                        n.path
                    ));
                }
            }
            (None, Some(s)) => {
                if s.is_empty() || s.starts_with('-') {
                    return bad(format!("source {s:?} is not valid"));
                }
            }
        }
        if self.source_arg().chars().any(|c| c.is_control()) {
            return bad("source contains control characters".into());
        }
        if let Some(h) = &self.sha256 {
            if h.len() != 64 || !h.chars().all(|c| c.is_ascii_hexdigit()) {
                return bad("sha256 must be 64 hex digits".into());
            }
        }
        if let Some(m) = &self.manifest {
            if m.is_empty() || m.starts_with('-') {
                return bad("manifest must be a path or URL".into());
            }
        }
        if !self.target.starts_with('/') || self.target.chars().any(|c| c.is_control()) {
            return bad(format!("target {:?} must be an absolute path", self.target));
        }
        Ok(())
    }
}

/// `Pending → Running → Succeeded | Failed` (the ServerAction states).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobState {
    Pending,
    Running,
    Succeeded,
    Failed,
}

impl JobState {
    pub fn is_finished(self) -> bool {
        matches!(self, JobState::Succeeded | JobState::Failed)
    }
}

/// Status of one job (REST body of `GET .../jobs/{id}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobStatus {
    pub id: JobId,
    pub server: String,
    pub state: JobState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default)]
    pub progress: Progress,
    /// Attempts started so far (1 on the first run).
    #[serde(default)]
    pub attempts: u32,
    /// Backend-specific handle (e.g. the Kubernetes Job name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_ref: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<chrono::DateTime<chrono::Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<chrono::DateTime<chrono::Utc>>,
}

impl JobStatus {
    pub fn pending(id: JobId, server: String) -> Self {
        JobStatus {
            id,
            server,
            state: JobState::Pending,
            reason: None,
            progress: Progress::default(),
            attempts: 0,
            job_ref: None,
            started_at: None,
            finished_at: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error("invalid provisioning request: {0}")]
    Invalid(String),
    #[error("no job {0:?}")]
    NotFound(String),
    #[error("too many jobs: {0}")]
    Busy(String),
    #[error("{0}")]
    Backend(String),
}

/// Runs provisioning jobs.
pub trait JobRunner: Send + Sync {
    fn name(&self) -> &'static str;
    /// Start a job (or return the existing one when `req.id` names a known job).
    fn start(&self, req: ProvisionRequest) -> BoxFuture<'_, Result<JobId, JobError>>;
    fn status<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<JobStatus, JobError>>;
    /// Stop a job; it ends `Failed` with reason "cancelled". Cancelling a finished job
    /// changes nothing.
    fn cancel<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), JobError>>;
    /// Every job this runner knows (at most [`MAX_LISTED`]), oldest first.
    fn list(&self) -> BoxFuture<'_, Result<Vec<JobStatus>, JobError>>;
}

/// Most jobs one list answer carries.
pub const MAX_LISTED: usize = 1000;

/// `[provision]` section of the config file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ProvisionConfig {
    /// `local` (default) or `kubernetes`.
    pub runner: String,
    pub local: local::LocalConfig,
    pub kubernetes: kubernetes::KubernetesConfig,
    /// Directory holding the images that `Image` resources name (`spec.source` is
    /// relative to it; each image's directory becomes its NFS export). Default:
    /// `<state_dir>/nfs-images`.
    pub images_dir: Option<std::path::PathBuf>,
    /// Address provisioning jobs use to reach the NFS server (written into each
    /// StorageVolume).
    pub nfs_server: String,
    /// Address or CIDR the provisioning jobs read NFS from: the export rule the server
    /// controller creates grants read access to exactly this client (a
    /// BareMetalSpec can override it with `spec.jobAddress`).
    pub job_address: String,
}

impl Default for ProvisionConfig {
    fn default() -> Self {
        ProvisionConfig {
            runner: "local".into(),
            local: local::LocalConfig::default(),
            kubernetes: kubernetes::KubernetesConfig::default(),
            images_dir: None,
            nfs_server: "127.0.0.1".into(),
            job_address: "127.0.0.1".into(),
        }
    }
}

impl ProvisionConfig {
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.nfs_server.is_empty()
            || self
                .nfs_server
                .chars()
                .any(|c| c.is_whitespace() || c.is_control() || c == '/')
        {
            anyhow::bail!(
                "provision.nfs_server {:?} must be a host name or address",
                self.nfs_server
            );
        }
        self.job_address
            .parse::<crate::nfs::ClientMatch>()
            .map_err(|e| anyhow::anyhow!("provision.job_address: {e}"))?;
        match self.runner.as_str() {
            "local" => self.local.validate(),
            "kubernetes" => self.kubernetes.validate(),
            other => {
                anyhow::bail!("unknown provision.runner {other:?} (expected local or kubernetes)")
            }
        }
    }
}

/// Build the configured runner.
pub fn from_config(cfg: &ProvisionConfig) -> anyhow::Result<Arc<dyn JobRunner>> {
    cfg.validate()?;
    Ok(match cfg.runner.as_str() {
        "kubernetes" => Arc::new(kubernetes::KubernetesRunner::new(cfg.kubernetes.clone())?),
        _ => Arc::new(local::LocalRunner::new(cfg.local.clone())?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn req() -> ProvisionRequest {
        ProvisionRequest {
            id: None,
            server: "s390-01".into(),
            image: Some("ubuntu".into()),
            nfs: Some(NfsSource {
                server: "10.0.0.1".into(),
                export: "/srv/images/ubuntu".into(),
                path: "ubuntu.img.zst".into(),
            }),
            source: None,
            sha256: Some("a".repeat(64)),
            manifest: None,
            target: "/dev/dasda".into(),
        }
    }

    #[test]
    fn nfs_url() {
        assert_eq!(
            req().source_arg(),
            "nfs://10.0.0.1/srv/images/ubuntu/ubuntu.img.zst"
        );
        let mut r = req();
        r.nfs.as_mut().unwrap().server = "fd00::1".into();
        assert_eq!(
            r.source_arg(),
            "nfs://[fd00::1]/srv/images/ubuntu/ubuntu.img.zst"
        );
    }

    #[test]
    fn validation() {
        req().validate().unwrap();
        type Mutation = Box<dyn Fn(&mut ProvisionRequest)>;
        let cases: Vec<Mutation> = vec![
            Box::new(|r| r.sha256 = Some("xyz".into())),
            Box::new(|r| r.target = "dasda".into()),
            Box::new(|r| r.nfs = None),
            Box::new(|r| r.source = Some("/x".into())),
            Box::new(|r| r.nfs.as_mut().unwrap().path = "../etc/shadow".into()),
            Box::new(|r| r.nfs.as_mut().unwrap().export = "srv".into()),
            Box::new(|r| r.id = Some("a b".into())),
            Box::new(|r| r.server = String::new()),
            Box::new(|r| {
                r.nfs = None;
                r.source = Some("--target=/etc".into())
            }),
        ];
        for (i, c) in cases.iter().enumerate() {
            let mut r = req();
            c(&mut r);
            assert!(
                matches!(r.validate(), Err(JobError::Invalid(_))),
                "case {i}"
            );
        }
    }

    #[test]
    fn request_json_rejects_unknown_fields() {
        let j = r#"{"server":"s1","source":"/img","target":"/dev/x","bogus":1}"#;
        assert!(serde_json::from_str::<ProvisionRequest>(j).is_err());
        let j = r#"{"server":"s1","source":"/img","target":"/dev/x"}"#;
        serde_json::from_str::<ProvisionRequest>(j)
            .unwrap()
            .validate()
            .unwrap();
    }

    #[test]
    fn status_json_shape() {
        let s = JobStatus::pending("j1".into(), "s1".into());
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["state"], "Pending");
        assert_eq!(v["progress"]["bytes"], 0);
    }
}
