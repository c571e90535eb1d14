//! The ServerAction reconciler (the server manager): hands a `Provision` action to the
//! job runner ([`crate::provision::JobRunner`]) under a job id bound to the action (its
//! UID and the digest of the request its spec makes, [`action_request`]), and copies the
//! job's state, progress and reason into the action's status
//! (`Pending → Running → Succeeded | Failed`). A job under that id is only taken for
//! the action when it runs that very request ([`JobStatus::request_sha256`]); any other
//! fails the action instead of being mirrored. A job the runner no longer knows (lost
//! when bootplane restarted) is started again with the same id, at most
//! [`MAX_RESTARTS`] times (`status.restarts`).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{lenient, merge, read, status_of, NameRef, Provisioning, MAX_RESTARTS};
use crate::model::views::{string_enum, ObjectMeta};
use crate::provision::{JobError, JobState, JobStatus, NfsSource, ProvisionRequest};
use crate::store::StoreError;
use crate::{Key, Next};

string_enum! {
    /// `ServerAction.status.state`.
    ActionState { Pending, Running, Succeeded, Failed }
}

impl ActionState {
    pub(crate) fn is_finished(&self) -> bool {
        matches!(self, ActionState::Succeeded | ActionState::Failed)
    }
}

string_enum! {
    /// `ServerAction.spec.type`: only `Provision` is carried out by this appliance.
    ActionType { Provision, Deprovision }
}

/// The fields of a `ServerAction` the flow reads.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ServerAction {
    pub metadata: ObjectMeta,
    pub spec: ServerActionSpec,
    pub status: ServerActionStatus,
}

/// `ServerAction.spec`, as the server controller writes it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ServerActionSpec {
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<ActionType>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_ref: Option<NameRef>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Read as absent when it is not a complete NFS source.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "lenient")]
    pub nfs: Option<NfsSource>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    pub target: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub manifest: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ServerActionStatus {
    pub state: Option<ActionState>,
    pub reason: Option<String>,
    pub job_ref: Option<String>,
    pub restarts: Option<u64>,
    pub progress: Option<Progress>,
}

/// A job's progress, in an action's status and mirrored into its server's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Progress {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub percent: Option<u64>,
    /// Bytes per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
}

/// The `ServerAction.status` fields a reconcile sets; `reason: Some(None)` removes the
/// reason.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
struct ActionStatusPatch {
    #[serde(skip_serializing_if = "Option::is_none")]
    state: Option<ActionState>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    job_ref: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    runner: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    attempts: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    restarts: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    progress: Option<Progress>,
    #[serde(skip_serializing_if = "Option::is_none")]
    started_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    finished_at: Option<String>,
}

impl ActionStatusPatch {
    /// The action failed for `reason` (now).
    fn failed(reason: String) -> ActionStatusPatch {
        ActionStatusPatch {
            state: Some(ActionState::Failed),
            reason: Some(Some(reason)),
            finished_at: Some(crate::store::now()),
            ..Default::default()
        }
    }

    /// The action waits for `reason`.
    fn pending(reason: String) -> ActionStatusPatch {
        ActionStatusPatch {
            state: Some(ActionState::Pending),
            reason: Some(Some(reason)),
            ..Default::default()
        }
    }

    /// Set or remove the reason.
    fn reason(reason: Option<String>) -> ActionStatusPatch {
        ActionStatusPatch {
            reason: Some(reason),
            ..Default::default()
        }
    }
}

fn progress(p: &crate::provision::Progress) -> Progress {
    Progress {
        bytes: Some(p.bytes),
        total: p.total,
        percent: p
            .total
            .filter(|t| *t > 0)
            .map(|t| ((p.bytes as u128 * 100) / t as u128).min(100) as u64),
        rate: p.rate.map(|r| r.max(0.0) as u64),
        stage: p.stage.clone(),
    }
}

fn job_state(s: JobState) -> ActionState {
    match s {
        JobState::Pending => ActionState::Pending,
        JobState::Running => ActionState::Running,
        JobState::Succeeded => ActionState::Succeeded,
        JobState::Failed => ActionState::Failed,
    }
}

/// The job an action asks for, under its id: the action's UID, `-`, and the first 16
/// hex digits of the request's [`ProvisionRequest::digest`].
pub(crate) fn action_request(a: &ServerAction) -> ProvisionRequest {
    let spec = &a.spec;
    let mut req = ProvisionRequest {
        id: None,
        server: spec
            .server_ref
            .as_ref()
            .map(|r| r.name.clone())
            .unwrap_or_default(),
        image: spec.image.clone(),
        nfs: spec.nfs.clone(),
        source: None,
        sha256: spec.sha256.clone().filter(|h| !h.is_empty()),
        manifest: spec.manifest.clone(),
        target: spec.target.clone(),
        resolved_target: None,
    };
    req.id = Some(format!("{}-{}", a.metadata.uid, &req.digest()[..16]));
    req
}

impl Provisioning {
    pub(super) async fn reconcile_action(&self, key: &Key) -> Result<Next, StoreError> {
        let (ns, name) = key;
        let Some(obj) = self.get(&self.t_action, ns, name)? else {
            return Ok(Next::Done);
        };
        let a: ServerAction = read(&self.t_action, &obj)?;
        let mut st = status_of(&obj);
        if a.status
            .state
            .as_ref()
            .is_some_and(ActionState::is_finished)
            || a.metadata.is_deleting()
        {
            return Ok(Next::Done);
        }
        if a.spec.type_ != Some(ActionType::Provision) {
            let ty = a.spec.type_.as_ref().map_or("", |t| t.as_str());
            merge(
                &mut st,
                &ActionStatusPatch::failed(format!(
                    "action type {ty:?} is not carried out by this appliance"
                )),
            );
            self.set_status(&self.t_action, &obj, st).await?;
            return Ok(Next::Done);
        }
        let req = action_request(&a);
        let id = req.id.clone().unwrap_or_default();
        match self.runner.status(&id).await {
            Ok(js) if js.request_sha256.as_deref() != Some(req.digest().as_str()) => {
                tracing::warn!(action = %format!("{ns}/{name}"), job = %id, "a job under this action's id runs another request; not taken for it");
                merge(
                    &mut st,
                    &ActionStatusPatch::failed(format!(
                        "job {id} runs another request than this action's; it is not taken for it"
                    )),
                );
                self.set_status(&self.t_action, &obj, st).await?;
                Ok(Next::Done)
            }
            Ok(js) => self.mirror_job(key, &obj, &id, st, js).await,
            Err(JobError::NotFound(_)) => self.start_job(key, &obj, &a, req, st).await,
            Err(e) => {
                merge(
                    &mut st,
                    &ActionStatusPatch::reason(Some(format!("job runner: {e}"))),
                );
                self.set_status(&self.t_action, &obj, st).await?;
                Ok(Next::After(Duration::from_secs(2)))
            }
        }
    }

    /// Copy the job's status into the action's.
    async fn mirror_job(
        &self,
        key: &Key,
        obj: &Value,
        id: &str,
        mut st: Value,
        js: JobStatus,
    ) -> Result<Next, StoreError> {
        let (ns, name) = key;
        let mut patch = ActionStatusPatch {
            state: Some(job_state(js.state)),
            job_ref: Some(id.to_string()),
            runner: Some(self.runner.name().to_string()),
            attempts: Some(js.attempts),
            progress: Some(progress(&js.progress)),
            started_at: js
                .started_at
                .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
            ..Default::default()
        };
        let mut reason = js.reason.clone();
        if js.state == JobState::Failed {
            // Name the NFS server as the cause when it is down.
            if let Err(e) = self.backend.health().await {
                reason = Some(format!("{}; {e}", reason.unwrap_or_default()));
            }
            patch.finished_at = Some(crate::store::now());
        }
        if js.state == JobState::Succeeded {
            patch.finished_at = Some(crate::store::now());
            reason = None;
        }
        merge(&mut st, &patch);
        merge(&mut st, &ActionStatusPatch::reason(reason));
        self.set_status(&self.t_action, obj, st).await?;
        if js.state.is_finished() {
            tracing::info!(action = %format!("{ns}/{name}"), state = %job_state(js.state), reason = js.reason.as_deref().unwrap_or(""), "provisioning job finished");
            Ok(Next::Done)
        } else {
            Ok(Next::After(Duration::from_millis(300)))
        }
    }

    /// Start the action's job (again, with the same id, when the runner lost it).
    async fn start_job(
        &self,
        key: &Key,
        obj: &Value,
        a: &ServerAction,
        req: ProvisionRequest,
        mut st: Value,
    ) -> Result<Next, StoreError> {
        let (ns, name) = key;
        let id = req.id.clone().unwrap_or_default();
        let mut restarts = a.status.restarts.unwrap_or(0);
        if a.status.job_ref.as_deref().is_some_and(|j| !j.is_empty()) {
            // Started before, unknown now: the runner lost it (bootplane restarted;
            // a local job died with its parent). Start it again, same id.
            restarts += 1;
            if restarts > MAX_RESTARTS {
                merge(
                    &mut st,
                    &ActionStatusPatch::failed(format!(
                        "job {id} was lost {MAX_RESTARTS} times (bootplane restarted while it ran)"
                    )),
                );
                self.set_status(&self.t_action, obj, st).await?;
                return Ok(Next::Done);
            }
            tracing::warn!(action = %format!("{ns}/{name}"), job = %id, restarts, "provisioning job lost, starting it again");
        }
        if let Err(e) = self.backend.health().await {
            merge(
                &mut st,
                &ActionStatusPatch::pending(format!("waiting for the NFS server: {e}")),
            );
            self.set_status(&self.t_action, obj, st).await?;
            return Ok(Next::After(Duration::from_secs(2)));
        }
        match self.runner.start(req).await {
            Ok(_) => {
                let patch = ActionStatusPatch {
                    state: Some(ActionState::Pending),
                    job_ref: Some(id),
                    runner: Some(self.runner.name().to_string()),
                    restarts: Some(restarts),
                    ..Default::default()
                };
                merge(&mut st, &patch);
                merge(&mut st, &ActionStatusPatch::reason(None));
                self.set_status(&self.t_action, obj, st).await?;
                Ok(Next::After(Duration::from_millis(200)))
            }
            Err(e @ (JobError::Invalid(_) | JobError::Forbidden(_))) => {
                let patch = ActionStatusPatch::failed(e.to_string());
                merge(&mut st, &patch);
                self.set_status(&self.t_action, obj, st).await?;
                Ok(Next::Done)
            }
            Err(e) => {
                merge(
                    &mut st,
                    &ActionStatusPatch::pending(format!("job runner: {e}")),
                );
                self.set_status(&self.t_action, obj, st).await?;
                Ok(Next::After(Duration::from_secs(2)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn progress_percent() {
        let p = crate::provision::Progress {
            bytes: 50,
            total: Some(200),
            rate: Some(10.5),
            stage: Some("copy".into()),
        };
        assert_eq!(
            serde_json::to_value(progress(&p)).unwrap(),
            json!({"bytes": 50, "total": 200, "percent": 25, "rate": 10, "stage": "copy"})
        );
    }

    /// A started job's status fields land where the untyped writer put them: known
    /// fields keep their place, new ones follow in the order it set them, and the
    /// reason goes last (or is removed).
    #[test]
    fn status_written_in_the_same_order() {
        let mut st = json!({"state": "Pending", "reason": "waiting", "jobRef": "u"});
        let patch = ActionStatusPatch {
            state: Some(ActionState::Running),
            job_ref: Some("u".into()),
            runner: Some("local".into()),
            attempts: Some(1),
            progress: Some(Progress {
                bytes: Some(0),
                ..Default::default()
            }),
            ..Default::default()
        };
        merge(&mut st, &patch);
        merge(&mut st, &ActionStatusPatch::reason(Some("slow".into())));
        assert_eq!(
            serde_json::to_string(&st).unwrap(),
            r#"{"state":"Running","reason":"slow","jobRef":"u","runner":"local","attempts":1,"progress":{"bytes":0}}"#
        );
        merge(&mut st, &ActionStatusPatch::reason(None));
        assert!(st.get("reason").is_none() && st["state"] == "Running");
        let mut f = json!({});
        merge(&mut f, &ActionStatusPatch::failed("x".into()));
        assert_eq!(
            f.as_object().unwrap().keys().collect::<Vec<_>>(),
            ["state", "reason", "finishedAt"]
        );
    }

    #[test]
    fn spec_reads_leniently_and_writes_as_before() {
        let spec = ServerActionSpec {
            type_: Some(ActionType::Provision),
            server_ref: Some(NameRef::new("m1")),
            image: Some("demo".into()),
            nfs: Some(NfsSource {
                server: "10.0.0.1".into(),
                export: "/images/default/demo".into(),
                path: "disk.img".into(),
            }),
            sha256: Some(String::new()),
            target: "/dev/dasda".into(),
            manifest: None,
        };
        assert_eq!(
            serde_json::to_string(&spec).unwrap(),
            r#"{"type":"Provision","serverRef":{"name":"m1"},"image":"demo","nfs":{"server":"10.0.0.1","export":"/images/default/demo","path":"disk.img"},"sha256":"","target":"/dev/dasda"}"#
        );
        let a: ServerAction = crate::model::views::view(&json!({
            "spec": {"type": "Provision", "nfs": {"server": "s"}, "target": "/dev/x"},
        }))
        .unwrap();
        assert_eq!(a.spec.nfs, None);
        assert_eq!(a.spec.target, "/dev/x");
    }

    /// The job id is bound to the action's UID and to what its spec asks: another
    /// target (or image, or checksum) gives another id and another digest.
    #[test]
    fn job_id_binds_uid_and_request() {
        let mut a: ServerAction = crate::model::views::view(&json!({
            "metadata": {"uid": "u-1"},
            "spec": {"type": "Provision", "target": "/dev/x", "sha256": "ab"},
        }))
        .unwrap();
        let r1 = action_request(&a);
        let id1 = r1.id.clone().unwrap();
        assert!(id1.starts_with("u-1-") && id1.len() == 4 + 16, "{id1}");
        assert_eq!(action_request(&a), r1, "stable");
        a.spec.target = "/dev/y".into();
        let r2 = action_request(&a);
        assert_ne!(r2.id, r1.id);
        assert_ne!(r2.digest(), r1.digest());
        a.metadata.uid = "u-2".into();
        assert_ne!(action_request(&a).id, r2.id);
        assert_eq!(
            action_request(&a).digest(),
            r2.digest(),
            "the id is not in the digest"
        );
    }
}
