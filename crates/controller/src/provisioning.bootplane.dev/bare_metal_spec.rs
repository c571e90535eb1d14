//! The BareMetalSpec reconciler: projects one `BareMetalServer` (same name, same
//! labels, among them [`IMAGE_LABEL`]), once: a server deleted later is not re-created
//! (the spec's status says `Released`).

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{
    merge, read, status_of, to_json, NameRef, Provisioning, IMAGE_LABEL, SERVER_FINALIZER,
};
use crate::model::meta;
use crate::model::views::{string_enum, ObjectMeta};
use crate::store::StoreError;
use crate::{controller_ref, Key, Next};

string_enum! {
    /// `BareMetalSpec.status.state`.
    BareMetalSpecState { Pending, Projected, Released }
}

/// The fields of a `BareMetalSpec` the flow reads.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub(crate) struct BareMetalSpec {
    pub metadata: ObjectMeta,
    pub spec: BareMetalSpecSpec,
    pub status: BareMetalSpecStatus,
}

/// The fields of `BareMetalSpec.spec` the projected server gets.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct BareMetalSpecSpec {
    pub target: Option<String>,
    pub job_address: Option<String>,
    pub description: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub(crate) struct BareMetalSpecStatus {
    /// UID of the server projected (set once it was).
    #[serde(rename = "serverUID")]
    pub server_uid: Option<String>,
}

/// The `BareMetalSpec.status` fields the projection sets.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct BareMetalSpecStatusPatch {
    state: BareMetalSpecState,
    #[serde(skip_serializing_if = "Option::is_none")]
    server_ref: Option<NameRef>,
    #[serde(rename = "serverUID", skip_serializing_if = "Option::is_none")]
    server_uid: Option<String>,
    message: String,
}

/// The spec of the projected `BareMetalServer`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ProjectedServerSpec {
    bare_metal_spec_ref: NameRef,
    #[serde(skip_serializing_if = "Option::is_none")]
    target: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    job_address: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<String>,
}

impl Provisioning {
    pub(super) async fn reconcile_spec(&self, key: &Key) -> Result<Next, StoreError> {
        let (ns, name) = key;
        let Some(obj) = self.get(&self.t_spec, ns, name)? else {
            return Ok(Next::Done);
        };
        let spec: BareMetalSpec = read(&self.t_spec, &obj)?;
        if spec.metadata.is_deleting() {
            return Ok(Next::Done);
        }
        let mut st = status_of(&obj);
        if !spec.metadata.labels.contains_key(IMAGE_LABEL) {
            let patch = BareMetalSpecStatusPatch {
                state: BareMetalSpecState::Pending,
                server_ref: None,
                server_uid: None,
                message: format!("label {IMAGE_LABEL} (the Image's name) is missing"),
            };
            merge(&mut st, &patch);
            self.set_status(&self.t_spec, &obj, st).await?;
            return Ok(Next::Done);
        }
        let server = match self.get(&self.t_server, ns, name)? {
            Some(sv) => sv,
            None if spec
                .status
                .server_uid
                .as_deref()
                .is_some_and(|u| !u.is_empty()) =>
            {
                let patch = BareMetalSpecStatusPatch {
                    state: BareMetalSpecState::Released,
                    server_ref: None,
                    server_uid: None,
                    message: "the BareMetalServer was deleted; delete and re-apply the BareMetalSpec to provision again".into(),
                };
                merge(&mut st, &patch);
                self.set_status(&self.t_spec, &obj, st).await?;
                return Ok(Next::Done);
            }
            None => {
                let sspec = ProjectedServerSpec {
                    bare_metal_spec_ref: NameRef::new(name),
                    target: spec.spec.target,
                    job_address: spec.spec.job_address,
                    description: spec.spec.description,
                };
                let server = json!({
                    "apiVersion": self.t_server.api_version(), "kind": "BareMetalServer",
                    "metadata": {
                        "name": name, "namespace": ns,
                        "labels": meta::labels(&obj).cloned().unwrap_or_default(),
                        "ownerReferences": controller_ref(&self.t_spec, &obj),
                        "finalizers": [SERVER_FINALIZER],
                    },
                    "spec": to_json(&sspec),
                });
                let sv = self.ensure(&self.t_server, server).await?;
                tracing::info!(server = %format!("{ns}/{name}"), "BareMetalServer projected");
                sv
            }
        };
        let patch = BareMetalSpecStatusPatch {
            state: if meta::is_deleting(&server) {
                BareMetalSpecState::Released
            } else {
                BareMetalSpecState::Projected
            },
            server_ref: Some(NameRef::new(name)),
            server_uid: Some(meta::uid(&server).to_string()),
            message: format!("projected as BareMetalServer {name}"),
        };
        merge(&mut st, &patch);
        self.set_status(&self.t_spec, &obj, st).await?;
        Ok(Next::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_json_is_unchanged() {
        let mut st = json!({"message": "old"});
        merge(
            &mut st,
            &BareMetalSpecStatusPatch {
                state: BareMetalSpecState::Projected,
                server_ref: Some(NameRef::new("m1")),
                server_uid: Some("u-1".into()),
                message: "projected as BareMetalServer m1".into(),
            },
        );
        assert_eq!(
            serde_json::to_string(&st).unwrap(),
            r#"{"message":"projected as BareMetalServer m1","state":"Projected","serverRef":{"name":"m1"},"serverUID":"u-1"}"#
        );
        let spec = ProjectedServerSpec {
            bare_metal_spec_ref: NameRef::new("m1"),
            target: Some("/dev/dasda".into()),
            job_address: None,
            description: Some("d".into()),
        };
        assert_eq!(
            serde_json::to_string(&spec).unwrap(),
            r#"{"bareMetalSpecRef":{"name":"m1"},"target":"/dev/dasda","description":"d"}"#
        );
    }
}
