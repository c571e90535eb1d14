//! The BareMetalServer reconciler (the server controller): once the server's Image and
//! its StorageVolume are `Available`, creates the `ExportPolicyRule` `<server>-provision`
//! for the job's address, waits until the backend has it in force, records the NFS
//! details in the server's spec and creates the `ServerAction` `<server>-provision`
//! (type `Provision`); then mirrors the action's state and progress into the server's
//! status. Deleting the server (finalizer [`SERVER_FINALIZER`]) deletes its rule and
//! pushes the policy to the backend at once, cancels a running job, and applies the
//! image's retention policy.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use super::export_policy::{ExportPolicy, ExportPolicyRuleSpec};
use super::image::{Image, ImageState, StorageVolume, VolumeState};
use super::server_action::{
    action_request, ActionState, ActionType, Progress, ServerAction, ServerActionSpec,
};
use super::{
    merge, owned_object, read, rule_name, status_of, to_json, NameRef, Provisioning, IMAGE_LABEL,
    JOB_RULE_INDEX, SERVER_FINALIZER,
};
use crate::model::views::{BareMetalServer, BareMetalServerState};
use crate::nfs::Access;
use crate::provision::{JobError, NfsSource};
use crate::store::StoreError;
use crate::{controller_ref, set_condition, Key, Next};

/// The `BareMetalServer.status` fields the server controller sets (and the condition
/// `Provisioned`).
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
struct ServerStatusPatch {
    #[serde(skip_serializing_if = "Option::is_none")]
    image_ref: Option<NameRef>,
    #[serde(skip_serializing_if = "Option::is_none")]
    state: Option<BareMetalServerState>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    progress: Option<Progress>,
}

impl ServerStatusPatch {
    fn state(state: BareMetalServerState, message: String) -> ServerStatusPatch {
        ServerStatusPatch {
            state: Some(state),
            message: Some(message),
            ..Default::default()
        }
    }
}

/// The `BareMetalServer.spec` fields the server controller sets before the job starts.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ServerSpecPatch {
    nfs: NfsSource,
    export_policy_rule_ref: NameRef,
    action_ref: NameRef,
}

/// The server's status derived from its action's status (pure): state, message and
/// progress.
pub fn server_status_from_action(
    action: &ServerAction,
) -> (BareMetalServerState, String, Progress) {
    let st = &action.status;
    let state = match st.state {
        Some(ActionState::Succeeded) => BareMetalServerState::Provisioned,
        Some(ActionState::Failed) => BareMetalServerState::Failed,
        _ => BareMetalServerState::Provisioning,
    };
    let message = match state {
        BareMetalServerState::Provisioned => "image written and verified".to_string(),
        _ => st.reason.clone().unwrap_or_else(|| {
            format!(
                "action {} is {}",
                action.metadata.name,
                st.state.as_ref().map_or("Pending", |s| s.as_str())
            )
        }),
    };
    (state, message, st.progress.clone().unwrap_or_default())
}

/// The status patch mirroring `action`.
fn mirror(action: &ServerAction) -> ServerStatusPatch {
    let (state, message, progress) = server_status_from_action(action);
    ServerStatusPatch {
        state: Some(state),
        message: Some(message),
        progress: Some(progress),
        ..Default::default()
    }
}

/// What a server waits for before its job can start, as its status message.
type Waiting = String;

impl Provisioning {
    pub(super) async fn reconcile_server(&self, key: &Key) -> Result<Next, StoreError> {
        let (ns, name) = key;
        let Some(obj) = self.get(&self.t_server, ns, name)? else {
            return Ok(Next::Done);
        };
        let sv: BareMetalServer = read(&self.t_server, &obj)?;
        if sv.metadata.is_deleting() {
            return self.finalize_server(key, &obj, &sv).await;
        }
        let obj = self
            .add_finalizer(&self.t_server, obj, SERVER_FINALIZER)
            .await?;
        let mut st = status_of(&obj);
        let image = image_of(&sv);
        let image_ref = ServerStatusPatch {
            image_ref: Some(NameRef::new(&image)),
            ..Default::default()
        };
        merge(&mut st, &image_ref);
        let action_name = rule_name(name);
        // Once provisioning is finished the outcome is kept; only progress mirroring.
        if let Ok(a) = self.store.get(&self.t_action, Some(ns), &action_name) {
            if sv.spec.action_ref.is_some() {
                let action: ServerAction = read(&self.t_action, &a)?;
                merge(&mut st, &mirror(&action));
                let (state, message, _) = server_status_from_action(&action);
                set_condition(
                    &mut st,
                    "Provisioned",
                    state == BareMetalServerState::Provisioned,
                    state.as_str(),
                    &message,
                );
                self.set_status(&self.t_server, &obj, st).await?;
                return Ok(Next::Done);
            }
        }
        // The server's spec is updated on the way: its status is written on that version.
        let obj = match self.provision(key, obj.clone(), &sv, &image).await? {
            Ok((obj, patch)) => {
                merge(&mut st, &patch);
                obj
            }
            Err(waiting) => {
                let patch = ServerStatusPatch::state(BareMetalServerState::Pending, waiting);
                merge(&mut st, &patch);
                self.set_status(&self.t_server, &obj, st).await?;
                return Ok(Next::Done);
            }
        };
        self.set_status(&self.t_server, &obj, st).await?;
        self.apply_retention(ns, &image).await?;
        Ok(Next::Done)
    }

    /// Steps 3 and on: the NFS details, the job's export rule, the server's spec and the
    /// Provision action. Returns the server as updated and the status patch mirroring the
    /// action, or what the server waits for.
    async fn provision(
        &self,
        key: &Key,
        obj: Arc<Value>,
        sv: &BareMetalServer,
        image: &str,
    ) -> Result<Result<(Arc<Value>, ServerStatusPatch), Waiting>, StoreError> {
        let (ns, name) = key;
        if image.is_empty() {
            return Ok(Err(format!("label {IMAGE_LABEL} is missing")));
        }
        let img = match self.available_image(ns, image)? {
            Ok(img) => img,
            Err(waiting) => return Ok(Err(waiting)),
        };
        // Step 3: the NFS details come from the StorageVolume.
        let vol = match self.store.get(&self.t_volume, Some(ns), image) {
            Ok(v) => Some(read::<StorageVolume>(&self.t_volume, &v)?),
            Err(_) => None,
        };
        let Some(vol) = vol.filter(|v| v.status.state == Some(VolumeState::Available)) else {
            return Ok(Err(format!(
                "waiting for StorageVolume {image} to be Available"
            )));
        };
        let nfs = NfsSource {
            server: vol.spec.nfs_server,
            export: vol.spec.export_path,
            path: vol.spec.path,
        };
        let rname = rule_name(name);
        if let Err(waiting) = self.job_rule_in_force(key, &obj, sv, image).await? {
            return Ok(Err(waiting));
        }
        // Update the server: NFS details, rule and action references.
        let mut want = obj.get("spec").cloned().unwrap_or(Value::Null);
        let spec_patch = ServerSpecPatch {
            nfs: nfs.clone(),
            export_policy_rule_ref: NameRef::new(&rname),
            action_ref: NameRef::new(&rname),
        };
        merge(&mut want, &spec_patch);
        let obj = self.ensure_spec(&self.t_server, obj, &want).await?;
        // Step 3 ends with the Provision action.
        let aspec = ServerActionSpec {
            type_: Some(ActionType::Provision),
            server_ref: Some(NameRef::new(name)),
            image: Some(image.to_string()),
            nfs: Some(nfs),
            sha256: Some(img.spec.sha256.unwrap_or_default()),
            target: sv.spec.target.clone(),
            manifest: img.spec.manifest,
        };
        let owner = controller_ref(&self.t_server, &obj);
        let mut action = owned_object(&self.t_action, ns, &rname, owner, to_json(&aspec));
        action["metadata"]["labels"] = serde_json::json!({ IMAGE_LABEL: image });
        let a = self.ensure(&self.t_action, action).await?;
        Ok(Ok((obj, mirror(&read(&self.t_action, &a)?))))
    }

    /// The server's Image, once it is `Available` and not being deleted.
    fn available_image(&self, ns: &str, image: &str) -> Result<Result<Image, Waiting>, StoreError> {
        let Ok(i) = self.store.get(&self.t_image, Some(ns), image) else {
            return Ok(Err(format!("waiting for Image {image} to exist")));
        };
        let img: Image = read(&self.t_image, &i)?;
        let deleting = img.metadata.is_deleting();
        match &img.status.state {
            Some(ImageState::Available) if !deleting => return Ok(Ok(img)),
            _ => {}
        }
        let state = img.status.state.as_ref().map_or("Pending", |s| s.as_str());
        let msg = img.status.message.as_deref().unwrap_or("");
        Ok(Err(format!(
            "waiting for Image {image} (state {}{}){}",
            state,
            if deleting { ", deleting" } else { "" },
            if msg.is_empty() {
                String::new()
            } else {
                format!(": {msg}")
            }
        )))
    }

    /// Create the job's ExportPolicyRule (the job's address may read the image) and
    /// report whether the backend has it in force: the job may only start then.
    async fn job_rule_in_force(
        &self,
        key: &Key,
        obj: &Value,
        sv: &BareMetalServer,
        image: &str,
    ) -> Result<Result<(), Waiting>, StoreError> {
        let (ns, name) = key;
        let client = sv
            .spec
            .job_address
            .clone()
            .unwrap_or_else(|| self.settings.job_address.clone());
        let rname = rule_name(name);
        let rule_spec = ExportPolicyRuleSpec {
            export_policy_ref: NameRef::new(image),
            index: JOB_RULE_INDEX,
            client,
            access: Access::Ro,
            protocols: Vec::new(),
            superuser: false,
        };
        let owner = controller_ref(&self.t_server, obj);
        let mut rule = owned_object(&self.t_rule, ns, &rname, owner, to_json(&rule_spec));
        rule["metadata"]["labels"] = serde_json::json!({ IMAGE_LABEL: image });
        self.ensure_owned(&self.t_rule, rule).await?;
        let policy = match self.store.get(&self.t_policy, Some(ns), image) {
            Ok(p) => Some(read::<ExportPolicy>(&self.t_policy, &p)?),
            Err(_) => None,
        };
        match policy {
            Some(p) if p.status.applied_rules.contains(&rname) => Ok(Ok(())),
            Some(p) => Ok(Err(format!(
                "waiting for export rule {rname} to be in force ({})",
                p.status.message
            ))),
            None => Ok(Err(format!("waiting for ExportPolicy {image}"))),
        }
    }

    /// Server deletion: revoke NFS access at once, stop its job, apply retention.
    async fn finalize_server(
        &self,
        key: &Key,
        obj: &Value,
        sv: &BareMetalServer,
    ) -> Result<Next, StoreError> {
        let (ns, name) = key;
        if !sv.metadata.finalizers.iter().any(|f| f == SERVER_FINALIZER) {
            return Ok(Next::Done);
        }
        let image = image_of(sv);
        let rname = rule_name(name);
        match self
            .store
            .delete(&self.t_rule, Some(ns), &rname, None)
            .await
        {
            Ok(_) | Err(StoreError::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
        if self.settings.nfs_enabled && !image.is_empty() {
            if let Next::After(_) = self.sync_policy(&(ns.clone(), image.clone())).await? {
                let mut st = status_of(obj);
                let patch = ServerStatusPatch::state(
                    BareMetalServerState::Deprovisioning,
                    format!("revoking NFS access: ExportPolicy {image} could not be pushed to the backend, retrying"),
                );
                merge(&mut st, &patch);
                self.set_status(&self.t_server, obj, st).await?;
                return Ok(Next::After(Duration::from_secs(2)));
            }
        }
        if let Ok(a) = self.store.get(&self.t_action, Some(ns), &rule_name(name)) {
            let action: ServerAction = read(&self.t_action, &a)?;
            if !action
                .status
                .state
                .as_ref()
                .is_some_and(ActionState::is_finished)
            {
                let id = action_request(&action).id.unwrap_or_default();
                match self.runner.cancel(&id).await {
                    Ok(()) | Err(JobError::NotFound(_)) => {}
                    Err(e) => {
                        tracing::warn!(server = %name, error = %e, "cancelling provisioning job")
                    }
                }
            }
        }
        tracing::info!(server = %format!("{ns}/{name}"), rule = %rname, "BareMetalServer deleted, export rule revoked");
        self.remove_finalizer(&self.t_server, obj, SERVER_FINALIZER)
            .await?;
        if !image.is_empty() {
            self.apply_retention(ns, &image).await?;
        }
        Ok(Next::Done)
    }
}

/// The Image a BareMetalServer names in its `IMAGE_LABEL` (empty when it has none).
fn image_of(sv: &BareMetalServer) -> String {
    sv.metadata
        .labels
        .get(IMAGE_LABEL)
        .cloned()
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::views::view;
    use serde_json::json;

    #[test]
    fn server_state_follows_the_action() {
        let a = |st: Value| -> ServerAction {
            view(&json!({"metadata": {"name": "x-provision"}, "status": st})).unwrap()
        };
        let progress = |p: Progress| serde_json::to_value(p).unwrap();
        assert_eq!(
            server_status_from_action(&a(json!({}))).0,
            BareMetalServerState::Provisioning
        );
        assert_eq!(
            progress(
                server_status_from_action(&a(
                    json!({"state": "Running", "progress": {"bytes": 5}})
                ))
                .2
            ),
            json!({"bytes": 5})
        );
        let (st, msg, _) = server_status_from_action(&a(
            json!({"state": "Failed", "reason": "exit code 13: sha"}),
        ));
        assert_eq!((st.as_str(), msg.as_str()), ("Failed", "exit code 13: sha"));
        assert_eq!(
            server_status_from_action(&a(json!({"state": "Succeeded"}))).0,
            BareMetalServerState::Provisioned
        );
        assert_eq!(
            server_status_from_action(&a(json!({"state": "Running"}))).1,
            "action x-provision is Running"
        );
        assert_eq!(
            progress(server_status_from_action(&a(json!({}))).2),
            json!({})
        );
    }

    #[test]
    fn spec_patch_keeps_the_other_fields() {
        let mut spec = json!({"bareMetalSpecRef": {"name": "m1"}, "target": "/dev/dasda", "actionRef": {"name": "old"}});
        let patch = ServerSpecPatch {
            nfs: NfsSource {
                server: "10.0.0.1".into(),
                export: "/images/default/demo".into(),
                path: "disk.img".into(),
            },
            export_policy_rule_ref: NameRef::new("m1-provision"),
            action_ref: NameRef::new("m1-provision"),
        };
        merge(&mut spec, &patch);
        assert_eq!(
            serde_json::to_string(&spec).unwrap(),
            r#"{"bareMetalSpecRef":{"name":"m1"},"target":"/dev/dasda","actionRef":{"name":"m1-provision"},"nfs":{"server":"10.0.0.1","export":"/images/default/demo","path":"disk.img"},"exportPolicyRuleRef":{"name":"m1-provision"}}"#
        );
    }
}
