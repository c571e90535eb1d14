//! Kubernetes job runner: each provisioning job is a `batch/v1` Job on a service node.
//!
//! [`render_job`] is pure and is validated against the Kubernetes OpenAPI schema for
//! `batch/v1` Job in `tests/it/provision_kubernetes.rs`. The Job mounts the image export as
//! an `nfs` volume (read-only), selects service nodes with `genctl.role.service=true`,
//! sets CPU/memory requests and limits, `ttlSecondsAfterFinished`, `backoffLimit` and
//! `activeDeadlineSeconds`, and runs `bootplane provision` privileged (it writes a
//! block device, mounted from the host with a `hostPath` volume).
//!
//! [`KubernetesRunner`] creates the Job with `POST /apis/batch/v1/namespaces/{ns}/jobs`
//! and maps `GET` results (`status.conditions` Complete/Failed, `active`) to job states;
//! byte-level progress is not available from the Job object. It speaks plain HTTP to an
//! API endpoint such as `kubectl proxy` on 127.0.0.1 (no TLS client in this build), was
//! tested only against a fake API server, and is **untested against a live cluster**.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt as _;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::{JobError, JobId, JobRunner, JobState, JobStatus, ProvisionRequest};

/// `[provision.kubernetes]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct KubernetesConfig {
    /// API endpoint, e.g. `http://127.0.0.1:8001` (`kubectl proxy`).
    pub api_url: String,
    /// Bearer token file (optional behind `kubectl proxy`).
    pub token_file: Option<std::path::PathBuf>,
    pub namespace: String,
    /// Container image with the `bootplane` binary.
    pub image: String,
    pub image_pull_policy: String,
    pub service_account: Option<String>,
    pub node_selector: BTreeMap<String, String>,
    pub cpu_request: String,
    pub cpu_limit: String,
    pub memory_request: String,
    pub memory_limit: String,
    pub ttl_seconds_after_finished: i32,
    pub backoff_limit: i32,
    pub active_deadline_seconds: i64,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        KubernetesConfig {
            api_url: "http://127.0.0.1:8001".into(),
            token_file: None,
            namespace: "bootplane".into(),
            image: "ghcr.io/bootplane/bootplane:latest".into(),
            image_pull_policy: "IfNotPresent".into(),
            service_account: None,
            node_selector: BTreeMap::from([(
                "genctl.role.service".to_string(),
                "true".to_string(),
            )]),
            cpu_request: "500m".into(),
            cpu_limit: "2".into(),
            memory_request: "256Mi".into(),
            memory_limit: "1Gi".into(),
            ttl_seconds_after_finished: 3600,
            backoff_limit: 2,
            active_deadline_seconds: 3600,
        }
    }
}

impl KubernetesConfig {
    pub fn validate(&self) -> anyhow::Result<()> {
        if !self.api_url.starts_with("http://") {
            anyhow::bail!("provision.kubernetes.api_url must be http:// (e.g. kubectl proxy; no TLS client in this build)");
        }
        if !crate::model::meta::valid_dns_label(&self.namespace) {
            anyhow::bail!(
                "provision.kubernetes.namespace {:?} is not a DNS label",
                self.namespace
            );
        }
        if self.image.is_empty() {
            anyhow::bail!("provision.kubernetes.image is required");
        }
        if self.backoff_limit < 0
            || self.ttl_seconds_after_finished < 0
            || self.active_deadline_seconds <= 0
        {
            anyhow::bail!("provision.kubernetes backoff_limit/ttl must be >= 0 and active_deadline_seconds > 0");
        }
        Ok(())
    }
}

/// A DNS-1123 label built from `s` (lowercase, `[a-z0-9-]`, at most `max` chars).
fn label_safe(s: &str, max: usize) -> String {
    let mut out: String = s
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    out.truncate(max);
    let out = out.trim_matches('-').to_string();
    if out.is_empty() {
        "x".into()
    } else {
        out
    }
}

/// Label values allow `[A-Za-z0-9._-]`, at most 63, alphanumeric at both ends.
fn label_value(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    out.truncate(63);
    out.trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

/// The Job name for a job id: `provision-<server>-<8 hex of sha256(id)>`.
pub(crate) fn job_name(req: &ProvisionRequest, id: &str) -> String {
    let h = hex::encode(&Sha256::digest(id.as_bytes())[..4]);
    format!(
        "provision-{}-{h}",
        label_safe(&req.server, 63 - "provision-".len() - 9)
    )
}

/// Annotation carrying [`ProvisionRequest::digest`]: a Job found under the same name
/// (409 on create) is taken only when it runs the same request.
pub(crate) const REQUEST_ANNOTATION: &str = "bootplane.dev/request-sha256";

/// Render the `batch/v1` Job (pure).
pub fn render_job(cfg: &KubernetesConfig, req: &ProvisionRequest, id: &str) -> Value {
    let name = job_name(req, id);
    let mut labels = json!({
        "app.kubernetes.io/name": "bootplane-provision",
        "app.kubernetes.io/managed-by": "bootplane",
        "bootplane.dev/server": label_value(&req.server),
        "bootplane.dev/job-id": label_value(id),
    });
    if let Some(img) = &req.image {
        labels["bootplane.dev/image"] = json!(label_value(img));
    }
    let mut volumes = Vec::new();
    let mut mounts = Vec::new();
    let source = match &req.nfs {
        Some(n) => {
            volumes.push(json!({"name": "image", "nfs": {"server": n.server, "path": n.export, "readOnly": true}}));
            mounts.push(json!({"name": "image", "mountPath": "/image", "readOnly": true}));
            format!("/image/{}", n.path.trim_start_matches('/'))
        }
        None => req.source.clone().unwrap_or_default(),
    };
    volumes.push(json!({"name": "target", "hostPath": {"path": req.target}}));
    mounts.push(json!({"name": "target", "mountPath": req.target}));
    let mut args = vec!["provision".to_string()];
    args.extend(req.provision_args(source));
    let mut pod_spec = json!({
        "restartPolicy": "Never",
        "nodeSelector": cfg.node_selector,
        "containers": [{
            "name": "provision",
            "image": cfg.image,
            "imagePullPolicy": cfg.image_pull_policy,
            "command": ["bootplane"],
            "args": args,
            "env": [
                {"name": "BOOTPLANE_JOB_ID", "value": id},
                {"name": "BOOTPLANE_PROGRESS", "value": "json"}
            ],
            "resources": {
                "requests": {"cpu": cfg.cpu_request, "memory": cfg.memory_request},
                "limits": {"cpu": cfg.cpu_limit, "memory": cfg.memory_limit}
            },
            "securityContext": {"privileged": true},
            "volumeMounts": mounts,
        }],
        "volumes": volumes,
    });
    if let Some(sa) = &cfg.service_account {
        pod_spec["serviceAccountName"] = json!(sa);
    }
    json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": cfg.namespace,
            "labels": labels.clone(),
            "annotations": {REQUEST_ANNOTATION: req.digest()},
        },
        "spec": {
            "backoffLimit": cfg.backoff_limit,
            "ttlSecondsAfterFinished": cfg.ttl_seconds_after_finished,
            "activeDeadlineSeconds": cfg.active_deadline_seconds,
            "template": {
                "metadata": {"labels": labels},
                "spec": pod_spec,
            }
        }
    })
}

/// Map a Job object's status to a job state and reason.
pub(crate) fn job_state(job: &Value) -> (JobState, Option<String>) {
    let st = &job["status"];
    if let Some(conds) = st.get("conditions").and_then(Value::as_array) {
        for c in conds {
            if c.get("status").and_then(Value::as_str) != Some("True") {
                continue;
            }
            match c.get("type").and_then(Value::as_str) {
                Some("Complete") | Some("SuccessCriteriaMet") => {
                    return (JobState::Succeeded, None)
                }
                Some("Failed") | Some("FailureTarget") => {
                    let reason = c.get("reason").and_then(Value::as_str).unwrap_or("Failed");
                    let msg = c.get("message").and_then(Value::as_str).unwrap_or("");
                    return (
                        JobState::Failed,
                        Some(
                            format!("{reason}: {msg}")
                                .trim_end_matches(": ")
                                .to_string(),
                        ),
                    );
                }
                _ => {}
            }
        }
    }
    if st.get("active").and_then(Value::as_i64).unwrap_or(0) > 0 {
        (JobState::Running, None)
    } else {
        (JobState::Pending, None)
    }
}

/// See the module doc.
pub struct KubernetesRunner {
    cfg: KubernetesConfig,
    agent: ureq::Agent,
    token: Option<String>,
    /// job id → (Job name, server, request digest)
    jobs: std::sync::Mutex<BTreeMap<String, (String, String, String)>>,
}

impl KubernetesRunner {
    pub fn new(cfg: KubernetesConfig) -> anyhow::Result<Self> {
        use anyhow::Context as _;
        cfg.validate()?;
        let token = match &cfg.token_file {
            Some(f) => Some(
                std::fs::read_to_string(f)
                    .with_context(|| format!("reading {}", f.display()))?
                    .trim()
                    .to_string(),
            ),
            None => None,
        };
        let agent = ureq::AgentBuilder::new()
            .timeout(Duration::from_secs(15))
            .redirects(0)
            .build();
        Ok(KubernetesRunner {
            cfg,
            agent,
            token,
            jobs: std::sync::Mutex::new(BTreeMap::new()),
        })
    }

    fn jobs_url(&self) -> String {
        format!(
            "{}/apis/batch/v1/namespaces/{}/jobs",
            self.cfg.api_url.trim_end_matches('/'),
            self.cfg.namespace
        )
    }

    async fn request(
        &self,
        method: &'static str,
        url: String,
        body: Option<Value>,
    ) -> Result<(u16, Value), JobError> {
        let agent = self.agent.clone();
        let token = self.token.clone();
        tokio::task::spawn_blocking(move || {
            let mut req = agent
                .request(method, &url)
                .set("Accept", "application/json");
            if let Some(t) = &token {
                req = req.set("Authorization", &format!("Bearer {t}"));
            }
            let res = match &body {
                Some(b) => req
                    .set("Content-Type", "application/json")
                    .send_string(&b.to_string()),
                None => req.call(),
            };
            let (code, text) = match res {
                Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
                Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
                Err(e) => return Err(JobError::Backend(format!("kubernetes {method} {url}: {e}"))),
            };
            Ok((code, serde_json::from_str(&text).unwrap_or(Value::Null)))
        })
        .await
        .map_err(|e| JobError::Backend(format!("kubernetes worker: {e}")))?
    }
}

fn api_message(v: &Value) -> String {
    v.get("message")
        .and_then(Value::as_str)
        .unwrap_or("no message")
        .to_string()
}

impl KubernetesRunner {
    /// The Job `name` that exists already must carry `digest` in its
    /// [`REQUEST_ANNOTATION`].
    async fn check_existing(&self, name: &str, digest: &str) -> Result<(), JobError> {
        let (code, job) = self
            .request("GET", format!("{}/{name}", self.jobs_url()), None)
            .await?;
        if !(200..300).contains(&code) {
            return Err(JobError::Backend(format!(
                "reading Job {name}: http {code}: {}",
                api_message(&job)
            )));
        }
        let theirs = job["metadata"]["annotations"][REQUEST_ANNOTATION].as_str();
        if theirs != Some(digest) {
            return Err(JobError::Forbidden(format!(
                "Job {name} exists and runs another request"
            )));
        }
        Ok(())
    }
}

impl JobRunner for KubernetesRunner {
    fn name(&self) -> &'static str {
        "kubernetes"
    }

    fn start(&self, req: ProvisionRequest) -> BoxFuture<'_, Result<JobId, JobError>> {
        async move {
            req.validate()?;
            let id = req
                .id
                .clone()
                .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
            let body = render_job(&self.cfg, &req, &id);
            let name = body["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let (code, resp) = self.request("POST", self.jobs_url(), Some(body)).await?;
            // 409: the Job exists already (same id → same name): idempotent start, if
            // it runs this very request.
            if !(200..300).contains(&code) && code != 409 {
                return Err(JobError::Backend(format!(
                    "creating Job {name}: http {code}: {}",
                    api_message(&resp)
                )));
            }
            let digest = req.digest();
            if code == 409 {
                self.check_existing(&name, &digest).await?;
            }
            let new = self
                .jobs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(id.clone(), (name, req.server.clone(), digest))
                .is_none();
            if new {
                super::metrics::global()
                    .started
                    .get_or_create(&super::metrics::RunnerLabel {
                        runner: "kubernetes",
                    })
                    .inc();
            }
            Ok(id)
        }
        .boxed()
    }

    fn status<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<JobStatus, JobError>> {
        async move {
            let (name, server, digest) = self
                .jobs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(id)
                .cloned()
                .ok_or_else(|| JobError::NotFound(id.into()))?;
            let (code, job) = self
                .request("GET", format!("{}/{name}", self.jobs_url()), None)
                .await?;
            if code == 404 {
                return Err(JobError::NotFound(format!(
                    "{id} (Job {name} is gone; ttlSecondsAfterFinished may have removed it)"
                )));
            }
            if !(200..300).contains(&code) {
                return Err(JobError::Backend(format!(
                    "reading Job {name}: http {code}: {}",
                    api_message(&job)
                )));
            }
            let (state, reason) = job_state(&job);
            let mut s = JobStatus::pending(id.to_string(), server);
            s.request_sha256 = Some(digest);
            s.state = state;
            s.reason = reason;
            s.job_ref = Some(format!("{}/{name}", self.cfg.namespace));
            s.attempts = (job["status"]["failed"].as_u64().unwrap_or(0)
                + job["status"]["active"].as_u64().unwrap_or(0)
                + job["status"]["succeeded"].as_u64().unwrap_or(0)) as u32;
            Ok(s)
        }
        .boxed()
    }

    fn cancel<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), JobError>> {
        async move {
            let (name, _, _) = self.jobs.lock().unwrap_or_else(|e| e.into_inner()).get(id).cloned().ok_or_else(|| JobError::NotFound(id.into()))?;
            let body = json!({"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Foreground"});
            let (code, resp) = self.request("DELETE", format!("{}/{name}", self.jobs_url()), Some(body)).await?;
            if !(200..300).contains(&code) && code != 404 {
                return Err(JobError::Backend(format!("deleting Job {name}: http {code}: {}", api_message(&resp))));
            }
            Ok(())
        }
        .boxed()
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<JobStatus>, JobError>> {
        async move {
            let mut ids: Vec<String> = self
                .jobs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .keys()
                .cloned()
                .collect();
            ids.sort();
            ids.truncate(super::MAX_LISTED);
            let mut out = Vec::with_capacity(ids.len());
            for id in ids {
                match self.status(&id).await {
                    Ok(s) => out.push(s),
                    // Removed by its TTL since: no longer a job to show.
                    Err(JobError::NotFound(_)) => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(out)
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provision::NfsSource;

    fn req() -> ProvisionRequest {
        ProvisionRequest {
            id: Some("action-7f3a".into()),
            server: "S390_Server.01".into(),
            image: Some("ubuntu 22.04".into()),
            nfs: Some(NfsSource {
                server: "10.0.0.1".into(),
                export: "/srv/images/ubuntu".into(),
                path: "ubuntu.img.zst".into(),
            }),
            source: None,
            sha256: Some("b".repeat(64)),
            manifest: None,
            target: "/dev/dasdb".into(),
            resolved_target: None,
        }
    }

    #[test]
    fn job_shape() {
        let j = render_job(&KubernetesConfig::default(), &req(), "action-7f3a");
        let name = j["metadata"]["name"].as_str().unwrap();
        assert!(
            name.starts_with("provision-s390-server-01-") && name.len() <= 63,
            "{name}"
        );
        assert_eq!(
            j["spec"]["template"]["spec"]["nodeSelector"]["genctl.role.service"],
            "true"
        );
        assert_eq!(
            j["spec"]["template"]["spec"]["volumes"][0]["nfs"],
            json!({"server":"10.0.0.1","path":"/srv/images/ubuntu","readOnly":true})
        );
        let c = &j["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(c["args"][2], "/image/ubuntu.img.zst");
        assert_eq!(c["resources"]["limits"]["memory"], "1Gi");
        assert_eq!(j["spec"]["ttlSecondsAfterFinished"], 3600);
        assert_eq!(j["spec"]["backoffLimit"], 2);
        assert_eq!(
            j["metadata"]["labels"]["bootplane.dev/image"],
            "ubuntu_22.04"
        );
        assert_eq!(j["spec"]["template"]["spec"]["restartPolicy"], "Never");
    }

    #[test]
    fn long_server_names_fit() {
        let mut r = req();
        r.server = "x".repeat(300);
        let n = job_name(&r, "id");
        assert!(
            n.len() <= 63 && crate::model::meta::valid_dns_label(&n),
            "{n}"
        );
        assert_ne!(job_name(&r, "id"), job_name(&r, "id2"));
    }

    #[test]
    fn states_from_job_status() {
        assert_eq!(job_state(&json!({"status": {}})).0, JobState::Pending);
        assert_eq!(
            job_state(&json!({"status": {"active": 1}})).0,
            JobState::Running
        );
        assert_eq!(
            job_state(&json!({"status": {"conditions": [{"type":"Complete","status":"True"}]}})),
            (JobState::Succeeded, None)
        );
        let (s, r) = job_state(
            &json!({"status": {"failed": 3, "conditions": [{"type":"Failed","status":"True","reason":"BackoffLimitExceeded","message":"Job has reached the specified backoff limit"}]}}),
        );
        assert_eq!(s, JobState::Failed);
        assert_eq!(
            r.unwrap(),
            "BackoffLimitExceeded: Job has reached the specified backoff limit"
        );
    }
}
