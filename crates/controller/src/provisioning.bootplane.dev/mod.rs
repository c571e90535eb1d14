//! Reconcilers of the provisioning flow (`provisioning.bootplane.dev/v1alpha1`):
//! image → export policy → provisioning job → disk. Written for s390x LPARs (no PXE
//! firmware there), but nothing in it is specific to one architecture.
//!
//! One file per reconciler, each on typed views of the fields it reads (states are
//! enums that serialize to the stored strings):
//!
//! - [`image`] (import): checks the file under `provision.images_dir`, exports its
//!   directory on the export backend ([`crate::nfs`]) as `/images/<ns>/<name>`, and
//!   creates (owned by the Image, deterministic names) a `StorageVolume` with the NFS
//!   details, an `ExportPolicy` and a `ZonalImage`. No default rules are created: a
//!   policy without rules denies every client. A finalizer removes the export when the
//!   Image is deleted.
//! - [`export_policy`]: the policy's rules are the `ExportPolicyRule`s naming it; they
//!   are pushed to the backend with `set_rules` (sorted by index, ties by name), and the
//!   names in force are recorded in `status.appliedRules`. Every push goes through one
//!   lock, so a slower reconcile can never re-apply a rule set that a later deletion
//!   has already replaced.
//! - [`bare_metal_spec`]: projects one `BareMetalServer` (same name, same labels, among
//!   them `provisioning.bootplane.dev/image-id`), once: a server deleted later is not
//!   re-created (the spec's status says `Released`).
//! - [`bare_metal_server`] (the server controller): reads the NFS details from the
//!   image's StorageVolume, creates the `ExportPolicyRule` `<server>-provision` for the
//!   job's address, waits until the backend has it in force, records the NFS details in
//!   the server's spec and creates the `ServerAction` `<server>-provision` (type
//!   `Provision`); it mirrors the action's state and progress into the server's status.
//!   Deleting the server (finalizer) deletes its rule and pushes the policy to the
//!   backend at once, cancels a running job, and applies the image's retention policy.
//! - [`server_action`] (the server manager): hands the action to the job runner
//!   ([`crate::provision::JobRunner`]) with the action's UID as the job id, and copies
//!   the job's state, progress and reason into the action's status (`Pending → Running
//!   → Succeeded | Failed`).
//!
//! This file holds what they share: the [`Provisioning`] controller (queues, watches,
//! dispatch of watch events to queues, workers) and the write helpers. Writers patch the
//! stored JSON (`merge`): fields no view knows are kept, in their stored order.
//!
//! Restart safety: every object has a deterministic name and ownerReferences, every
//! write is a compare-and-swap or an idempotent create, and the job id is the action's
//! UID, so the runner never runs two jobs for one action. A local job dies with the
//! bootplane process that started it (PDEATHSIG); after a restart an action that was
//! `Running` but whose job the runner no longer knows is started again with the same id
//! (`status.restarts` counts this; `bootplane provision` resumes from its checkpoint).
//! At start-up every ExportPolicy is pushed to the backend before the backend's
//! supervisor runs, so the NFS server never serves rules the store no longer has.

mod bare_metal_server;
mod bare_metal_spec;
mod export_policy;
mod image;
mod server_action;

pub use bare_metal_server::server_status_from_action;
pub use export_policy::{backend_rules, NamedRules};
pub use image::resolve_source;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{json, Value};

use super::queue::WorkQueue;
use super::runtime::Runtime;
use super::Key;
use crate::model::meta;
use crate::model::registry::ResourceType;
use crate::model::views;
use crate::nfs::ExportBackend;
use crate::provision::JobRunner;
use crate::shutdown::Shutdown;
use crate::store::{Part, Store, StoreError};

/// API group of the flow's resources.
pub(crate) const GROUP: &str = "provisioning.bootplane.dev";
/// Label linking a BareMetalSpec / BareMetalServer to its Image (value: the Image's name).
pub(crate) const IMAGE_LABEL: &str = "provisioning.bootplane.dev/image-id";
/// Finalizer on Images: the export is removed from the backend before the Image goes.
pub(crate) const IMAGE_FINALIZER: &str = "provisioning.bootplane.dev/export";
/// Finalizer on BareMetalServers: rule revoked and retention applied before it goes.
pub(crate) const SERVER_FINALIZER: &str = "provisioning.bootplane.dev/server";
/// Index of the rule the server controller creates for a provisioning job.
pub(crate) const JOB_RULE_INDEX: u64 = 100;
/// How often an action whose job is lost is started again before it fails.
pub(crate) const MAX_RESTARTS: u64 = 3;

/// What the flow's controllers need from the configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    pub images_dir: PathBuf,
    pub nfs_server: String,
    pub job_address: String,
    /// False when the export backend is disabled in the config: images then fail with
    /// a reason saying so.
    pub nfs_enabled: bool,
}

pub struct Provisioning {
    pub store: Store,
    pub backend: Arc<dyn ExportBackend>,
    pub runner: Arc<dyn JobRunner>,
    pub settings: Settings,
    images: Arc<WorkQueue<Key>>,
    policies: Arc<WorkQueue<Key>>,
    specs: Arc<WorkQueue<Key>>,
    servers: Arc<WorkQueue<Key>>,
    actions: Arc<WorkQueue<Key>>,
    /// Serialises pushes of rule sets to the backend (see the module doc).
    push: tokio::sync::Mutex<()>,
    t_image: Arc<ResourceType>,
    t_zonal: Arc<ResourceType>,
    t_volume: Arc<ResourceType>,
    t_policy: Arc<ResourceType>,
    t_rule: Arc<ResourceType>,
    t_spec: Arc<ResourceType>,
    t_server: Arc<ResourceType>,
    t_action: Arc<ResourceType>,
    /// Stage changes (`status.state`, conditions) of every object written here.
    events: crate::store::events::Recorder,
}

/// `{"name": …}`: a reference to an object in the same namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NameRef {
    pub name: String,
}

impl NameRef {
    pub(crate) fn new(name: &str) -> NameRef {
        NameRef {
            name: name.to_string(),
        }
    }
}

/// The references in a `spec` that route a watch event to the queues.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct SpecRefs {
    image_ref: Option<NameRef>,
    export_policy_ref: Option<NameRef>,
    bare_metal_spec_ref: Option<NameRef>,
    server_ref: Option<NameRef>,
}

impl SpecRefs {
    /// The references of `o` (none when its spec does not read).
    fn of(o: &Value) -> SpecRefs {
        o.get("spec")
            .and_then(|s| SpecRefs::deserialize(s).ok())
            .unwrap_or_default()
    }
}

fn ns_of(v: &Value) -> String {
    meta::namespace(v).unwrap_or("default").to_string()
}

/// The Image an object belongs to (its [`IMAGE_LABEL`]).
fn image_label(o: &Value) -> Option<&str> {
    meta::labels(o)
        .and_then(|l| l.get(IMAGE_LABEL))
        .and_then(Value::as_str)
}

/// The typed view `T` of `o`, an object of type `rt`. The store validated `o` against
/// its CRD, which the views follow, so this fails only on a view that does not (a
/// bug): reported as a bad object, and the reconcile is retried with backoff.
fn read<T: DeserializeOwned>(rt: &ResourceType, o: &Value) -> Result<T, StoreError> {
    views::view(o).map_err(|e| {
        StoreError::BadRequest(format!(
            "{} {:?} does not read as expected: {e}",
            rt.kind,
            meta::name(o)
        ))
    })
}

/// `o.status`, or an empty object: what a status write starts from.
fn status_of(o: &Value) -> Value {
    o.get("status").cloned().unwrap_or(json!({}))
}

/// The JSON of a spec or status struct (plain structs with string keys: cannot fail).
fn to_json(t: &impl Serialize) -> Value {
    serde_json::to_value(t).expect("a plain struct serializes to JSON")
}

/// Set, in the JSON object `into` (made an object first if it is not), each field
/// `patch` serializes: a field already there keeps its place, a new one goes last, and
/// a field serialized as null (`Some(None)`) is removed. Fields the patch skips are left
/// as they are.
fn merge(into: &mut Value, patch: &impl Serialize) {
    let Value::Object(fields) = to_json(patch) else {
        return;
    };
    if !into.is_object() {
        *into = json!({});
    }
    let obj = into.as_object_mut().expect("made an object above");
    for (k, v) in fields {
        if v.is_null() {
            obj.remove(&k);
        } else {
            obj.insert(k, v);
        }
    }
}

/// A new object of type `rt` named `ns/name`, controlled by `owner` (a
/// [`super::controller_ref`]), with `spec`.
fn owned_object(rt: &ResourceType, ns: &str, name: &str, owner: Value, spec: Value) -> Value {
    json!({
        "apiVersion": rt.api_version(), "kind": rt.kind,
        "metadata": {"name": name, "namespace": ns, "ownerReferences": owner},
        "spec": spec,
    })
}

/// Export name of an image: `/images/<namespace>/<name>`.
pub(crate) fn export_name(ns: &str, image: &str) -> String {
    format!("/images/{ns}/{image}")
}

/// Rule name the server controller uses for a server's provisioning job (also the
/// name of its ServerAction).
pub(crate) fn rule_name(server: &str) -> String {
    format!("{server}-provision")
}

/// `Some(v)` for a field that deserializes as `T`, `None` for one that does not (read
/// as absent, as the untyped reading did).
fn lenient<'de, D: Deserializer<'de>, T: DeserializeOwned>(d: D) -> Result<Option<T>, D::Error> {
    Ok(serde_json::from_value(Value::deserialize(d)?).ok())
}

impl Provisioning {
    pub fn new(
        store: Store,
        backend: Arc<dyn ExportBackend>,
        runner: Arc<dyn JobRunner>,
        settings: Settings,
        events: crate::store::events::Recorder,
    ) -> Arc<Provisioning> {
        let reg = store.registry();
        let t = |k: &str| {
            reg.by_kind(&format!("{GROUP}/v1alpha1"), k)
                .unwrap_or_else(|| panic!("{k} type is registered"))
        };
        Arc::new(Provisioning {
            events,
            backend,
            runner,
            settings,
            images: WorkQueue::new(),
            policies: WorkQueue::new(),
            specs: WorkQueue::new(),
            servers: WorkQueue::new(),
            actions: WorkQueue::new(),
            push: tokio::sync::Mutex::new(()),
            t_image: t("Image"),
            t_zonal: t("ZonalImage"),
            t_volume: t("StorageVolume"),
            t_policy: t("ExportPolicy"),
            t_rule: t("ExportPolicyRule"),
            t_spec: t("BareMetalSpec"),
            t_server: t("BareMetalServer"),
            t_action: t("ServerAction"),
            store,
        })
    }

    /// Converge the backend, run it, and run watches and workers on the one
    /// [`Runtime`] until shutdown.
    pub async fn run(self: Arc<Self>, workers: usize, shutdown: Shutdown, backend_run: bool) {
        if self.settings.nfs_enabled {
            self.converge_exports().await;
        }
        let backend = backend_run.then(|| {
            let (b, sd) = (self.backend.clone(), shutdown.child());
            tokio::spawn(async move { b.run(sd).await })
        });
        let types = [
            self.t_image.clone(),
            self.t_zonal.clone(),
            self.t_volume.clone(),
            self.t_policy.clone(),
            self.t_rule.clone(),
            self.t_spec.clone(),
            self.t_server.clone(),
            self.t_action.clone(),
        ];
        // These reconcilers drive the export backend and the job runner: at most 8
        // workers each, whatever `controller.workers` says.
        Runtime::new(self.clone(), self.store.clone(), workers.clamp(1, 8))
            .watch(types, |c: &Provisioning, t, o, del| c.dispatch(t, o, del))
            .reconciler("image", self.images.clone(), |c, k| async move {
                c.reconcile_image(&k).await
            })
            .reconciler("exportpolicy", self.policies.clone(), |c, k| async move {
                c.reconcile_policy(&k).await
            })
            .reconciler("baremetalspec", self.specs.clone(), |c, k| async move {
                c.reconcile_spec(&k).await
            })
            .reconciler("baremetalserver", self.servers.clone(), |c, k| async move {
                c.reconcile_server(&k).await
            })
            .reconciler("serveraction", self.actions.clone(), |c, k| async move {
                c.reconcile_action(&k).await
            })
            .run(shutdown)
            .await;
        // The backend stops its server on the same shutdown signal (bounded).
        if let Some(h) = backend {
            if tokio::time::timeout(Duration::from_secs(8), h)
                .await
                .is_err()
            {
                tracing::warn!("nfs export backend did not stop within 8s");
            }
        }
    }

    fn servers_of_image(&self, ns: &str, image: &str) {
        let (list, _) = self.store.list(&self.t_server, Some(ns), None);
        for sv in list {
            if image_label(&sv) == Some(image) {
                self.servers
                    .add((ns.to_string(), meta::name(&sv).to_string()));
            }
        }
    }

    fn dispatch(&self, t: &ResourceType, o: &Value, deleted: bool) {
        let ns = ns_of(o);
        let name = meta::name(o).to_string();
        let refs = SpecRefs::of(o);
        match t.kind.as_str() {
            "Image" => {
                self.images.add((ns.clone(), name.clone()));
                self.servers_of_image(&ns, &name);
            }
            "ZonalImage" | "StorageVolume" => {
                let img = refs.image_ref.map(|r| r.name).unwrap_or_default();
                if !img.is_empty() {
                    self.images.add((ns.clone(), img.clone()));
                    self.servers_of_image(&ns, &img);
                }
            }
            "ExportPolicy" => {
                self.policies.add((ns.clone(), name.clone()));
                self.servers_of_image(&ns, &name);
            }
            "ExportPolicyRule" => {
                if let Some(p) = refs.export_policy_ref {
                    self.policies.add((ns, p.name));
                }
            }
            "BareMetalSpec" => self.specs.add((ns, name)),
            "BareMetalServer" => {
                if let Some(sp) = refs.bare_metal_spec_ref {
                    self.specs.add((ns.clone(), sp.name));
                }
                if deleted {
                    if let Some(img) = image_label(o) {
                        self.images.add((ns.clone(), img.to_string()));
                    }
                } else {
                    self.servers.add((ns, name));
                }
            }
            "ServerAction" => {
                if !deleted {
                    self.actions.add((ns.clone(), name));
                }
                if let Some(sv) = refs.server_ref {
                    self.servers.add((ns, sv.name));
                }
            }
            _ => {}
        }
    }

    /// Write `status` as `o`'s status unless it is that already (CAS on `o`'s version).
    async fn set_status(
        &self,
        rt: &ResourceType,
        o: &Value,
        status: Value,
    ) -> Result<(), StoreError> {
        if o.get("status") == Some(&status) {
            return Ok(());
        }
        let mut n = o.clone();
        n["status"] = status.clone();
        self.store.update(rt, n, Part::Status).await?;
        self.events.status_change(rt, o, o.get("status"), &status);
        Ok(())
    }

    /// Create `obj` unless an object of that name exists; returns the stored one.
    async fn ensure(&self, rt: &ResourceType, obj: Value) -> Result<Arc<Value>, StoreError> {
        let ns = ns_of(&obj);
        let name = meta::name(&obj).to_string();
        match self.store.get(rt, Some(&ns), &name) {
            Ok(o) => Ok(o),
            Err(StoreError::NotFound { .. }) => match self.store.create(rt, obj).await {
                Ok(o) => Ok(o),
                Err(StoreError::AlreadyExists { .. }) => self.store.get(rt, Some(&ns), &name),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    /// Make `o.spec` equal `spec` (CAS on the read version).
    async fn ensure_spec(
        &self,
        rt: &ResourceType,
        o: Arc<Value>,
        spec: &Value,
    ) -> Result<Arc<Value>, StoreError> {
        if o.get("spec") == Some(spec) {
            return Ok(o);
        }
        let mut n = (*o).clone();
        n["spec"] = spec.clone();
        self.store.update(rt, n, Part::Main).await
    }

    /// [`Self::ensure`] an owned object, then [`Self::ensure_spec`] its spec.
    async fn ensure_owned(&self, rt: &ResourceType, obj: Value) -> Result<Arc<Value>, StoreError> {
        let spec = obj.get("spec").cloned().unwrap_or(json!({}));
        let o = self.ensure(rt, obj).await?;
        self.ensure_spec(rt, o, &spec).await
    }

    async fn add_finalizer(
        &self,
        rt: &ResourceType,
        o: Arc<Value>,
        f: &str,
    ) -> Result<Arc<Value>, StoreError> {
        let mut fins = meta::finalizers(&o);
        if fins.iter().any(|x| x == f) {
            return Ok(o);
        }
        fins.push(f.into());
        let mut n = (*o).clone();
        n["metadata"]["finalizers"] = json!(fins);
        self.store.update(rt, n, Part::Main).await
    }

    async fn remove_finalizer(
        &self,
        rt: &ResourceType,
        o: &Value,
        f: &str,
    ) -> Result<(), StoreError> {
        let fins = meta::finalizers(o);
        if !fins.iter().any(|x| x == f) {
            return Ok(());
        }
        let mut n = o.clone();
        n["metadata"]["finalizers"] =
            json!(fins.into_iter().filter(|x| x != f).collect::<Vec<_>>());
        self.store.update(rt, n, Part::Main).await?;
        Ok(())
    }

    /// Get `ns/name` of type `rt`; `None` when it does not exist.
    fn get(
        &self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
    ) -> Result<Option<Arc<Value>>, StoreError> {
        match self.store.get(rt, Some(ns), name) {
            Ok(o) => Ok(Some(o)),
            Err(StoreError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default, Serialize)]
    struct Patch {
        #[serde(skip_serializing_if = "Option::is_none")]
        state: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        reason: Option<Option<String>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        extra: Option<u64>,
    }

    #[test]
    fn merge_keeps_places_appends_and_removes() {
        let mut st = json!({"reason": "r", "state": "Pending", "other": 1});
        merge(
            &mut st,
            &Patch {
                state: Some("Running".into()),
                extra: Some(2),
                ..Default::default()
            },
        );
        assert_eq!(
            serde_json::to_string(&st).unwrap(),
            r#"{"reason":"r","state":"Running","other":1,"extra":2}"#
        );
        merge(
            &mut st,
            &Patch {
                reason: Some(None),
                ..Default::default()
            },
        );
        assert!(st.get("reason").is_none() && st["other"] == 1 && st["extra"] == 2);
        let mut null = Value::Null;
        merge(
            &mut null,
            &Patch {
                extra: Some(1),
                ..Default::default()
            },
        );
        assert_eq!(null, json!({"extra": 1}));
    }
}
