//! Reconcilers of the s390x provisioning flow (`provisioning.bootplane.dev/v1alpha1`):
//! image → export policy → provisioning job → disk (DESIGN.md, steps 1–6).
//!
//! - **Image** (import): checks the file under `provision.images_dir`, exports its
//!   directory on the export backend ([`crate::nfs`]) as `/images/<ns>/<name>`, and
//!   creates (owned by the Image, deterministic names) a `StorageVolume` with the NFS
//!   details, an `ExportPolicy` and a `ZonalImage`. No default rules are created: a
//!   policy without rules denies every client. A finalizer removes the export when the
//!   Image is deleted.
//! - **ExportPolicy**: the policy's rules are the `ExportPolicyRule`s naming it; they are
//!   pushed to the backend with `set_rules` (sorted by index, ties by name), and the
//!   names in force are recorded in `status.appliedRules`. Every push goes through one
//!   lock, so a slower reconcile can never re-apply a rule set that a later deletion
//!   has already replaced.
//! - **BareMetalSpec**: projects one `BareMetalServer` (same name, same labels, among
//!   them `provisioning.bootplane.dev/image-id`), once: a server deleted later is not
//!   re-created (the spec's status says `Released`).
//! - **BareMetalServer** (the server controller): reads the NFS details from the
//!   image's StorageVolume, creates the `ExportPolicyRule` `<server>-provision` for the
//!   job's address, waits until the backend has it in force, records the NFS details in
//!   the server's spec and creates the `ServerAction` `<server>-provision` (type
//!   `Provision`); it mirrors the action's state and progress into the server's status.
//!   Deleting the server (finalizer) deletes its rule and pushes the policy to the
//!   backend at once, cancels a running job, and applies the image's retention policy.
//! - **ServerAction** (the server manager): hands the action to the job runner
//!   ([`crate::provision::JobRunner`]) with the action's UID as the job id, and copies
//!   the job's state, progress and reason into the action's status (`Pending → Running
//!   → Succeeded | Failed`).
//!
//! Restart safety: every object has a deterministic name and ownerReferences, every
//! write is a compare-and-swap or an idempotent create, and the job id is the action's
//! UID, so the runner never runs two jobs for one action. A local job dies with the
//! bootplane process that started it (PDEATHSIG); after a restart an action that was
//! `Running` but whose job the runner no longer knows is started again with the same id
//! (`status.restarts` counts this; `bootplane provision` resumes from its checkpoint).
//! At start-up every ExportPolicy is pushed to the backend before the backend's
//! supervisor runs, so the NFS server never serves rules the store no longer has.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::queue::WorkQueue;
use super::{controller_ref, finish, set_condition, watch_loop, Key, Next};
use crate::model::meta;
use crate::model::registry::ResourceType;
use crate::nfs::{Access, ClientMatch, ExportBackend, ExportRule, NfsError, Protocol};
use crate::provision::{JobError, JobRunner, JobState, NfsSource, ProvisionRequest};
use crate::shutdown::Shutdown;
use crate::store::{Part, Store, StoreError};

/// API group of the flow's resources.
pub const GROUP: &str = "provisioning.bootplane.dev";
/// Label linking a BareMetalSpec / BareMetalServer to its Image (value: the Image's name).
pub const IMAGE_LABEL: &str = "provisioning.bootplane.dev/image-id";
/// Finalizer on Images: the export is removed from the backend before the Image goes.
pub const IMAGE_FINALIZER: &str = "provisioning.bootplane.dev/export";
/// Finalizer on BareMetalServers: rule revoked and retention applied before it goes.
pub const SERVER_FINALIZER: &str = "provisioning.bootplane.dev/server";
/// Index of the rule the server controller creates for a provisioning job.
pub const JOB_RULE_INDEX: u64 = 100;
/// How often an action whose job is lost is started again before it fails.
pub const MAX_RESTARTS: u64 = 3;

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
}

fn s<'a>(v: &'a Value, p: &str) -> Option<&'a str> {
    v.pointer(p).and_then(Value::as_str)
}

fn ns_of(v: &Value) -> String {
    meta::namespace(v).unwrap_or("default").to_string()
}

/// Export name of an image: `/images/<namespace>/<name>`.
pub fn export_name(ns: &str, image: &str) -> String {
    format!("/images/{ns}/{image}")
}

/// Rule name the server controller uses for a server's provisioning job.
pub fn rule_name(server: &str) -> String {
    format!("{server}-provision")
}

/// Resolve an Image's `spec.source` under `images_dir`: must stay inside it (also
/// through symlinks) and be a regular file. Returns (file, its directory, size).
pub fn resolve_source(images_dir: &Path, source: &str) -> Result<(PathBuf, PathBuf, u64), String> {
    if source.starts_with('/')
        || source
            .split('/')
            .any(|c| c == ".." || c == "." || c.is_empty())
    {
        return Err(format!(
            "source {source:?} must be a relative path without . or .."
        ));
    }
    let root = images_dir
        .canonicalize()
        .map_err(|e| format!("images dir {}: {e}", images_dir.display()))?;
    let file = root
        .join(source)
        .canonicalize()
        .map_err(|e| format!("image file {}: {e}", images_dir.join(source).display()))?;
    let dir = file
        .parent()
        .ok_or_else(|| format!("image file {} has no directory", file.display()))?
        .to_path_buf();
    if !dir.starts_with(&root) || dir == root {
        return Err(format!(
            "image file {} must be in a directory below {} (the directory is exported)",
            file.display(),
            root.display()
        ));
    }
    let md = std::fs::metadata(&file).map_err(|e| format!("image file {}: {e}", file.display()))?;
    if !md.is_file() {
        return Err(format!(
            "image file {} is not a regular file",
            file.display()
        ));
    }
    Ok((file, dir, md.len()))
}

/// `(rule object name, backend rule)` in evaluation order, and `(name, why)` for the
/// rules that were skipped.
pub type NamedRules = (Vec<(String, ExportRule)>, Vec<(String, String)>);

/// Backend rules from ExportPolicyRule objects: sorted by (index, name) and renumbered
/// 1.. so equal indexes cannot collide; rules whose client does not parse are returned
/// separately (they grant nothing).
pub fn backend_rules(objs: &[Arc<Value>]) -> NamedRules {
    let mut sorted: Vec<&Arc<Value>> = objs.iter().collect();
    sorted.sort_by(|a, b| {
        let ia = a
            .pointer("/spec/index")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        let ib = b
            .pointer("/spec/index")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        (ia, meta::name(a)).cmp(&(ib, meta::name(b)))
    });
    let mut ok = Vec::new();
    let mut bad = Vec::new();
    for o in sorted {
        let name = meta::name(o).to_string();
        let client = match s(o, "/spec/client").unwrap_or("").parse::<ClientMatch>() {
            Ok(c) => c,
            Err(e) => {
                bad.push((name, e.to_string()));
                continue;
            }
        };
        let access = match s(o, "/spec/access").unwrap_or("ro") {
            "rw" => Access::Rw,
            "none" => Access::None,
            _ => Access::Ro,
        };
        let protocols = o
            .pointer("/spec/protocols")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|p| match p.as_str() {
                        Some("nfs3") => Some(Protocol::Nfs3),
                        Some("nfs4") => Some(Protocol::Nfs4),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        let superuser = o
            .pointer("/spec/superuser")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        ok.push((
            name,
            ExportRule {
                index: ok.len() as u32 + 1,
                client,
                access,
                protocols,
                superuser,
            },
        ));
    }
    (ok, bad)
}

/// The server's status derived from its action's status (pure).
pub fn server_status_from_action(action: &Value) -> (String, String, Value) {
    let st = action.get("status").cloned().unwrap_or(json!({}));
    let state = match st.get("state").and_then(Value::as_str) {
        Some("Succeeded") => "Provisioned",
        Some("Failed") => "Failed",
        _ => "Provisioning",
    };
    let message = match state {
        "Provisioned" => "image written and verified".to_string(),
        _ => st
            .get("reason")
            .and_then(Value::as_str)
            .map(String::from)
            .unwrap_or_else(|| {
                format!(
                    "action {} is {}",
                    meta::name(action),
                    st.get("state").and_then(Value::as_str).unwrap_or("Pending")
                )
            }),
    };
    let progress = st.get("progress").cloned().unwrap_or(json!({}));
    (state.to_string(), message, progress)
}

fn progress_json(p: &crate::provision::Progress) -> Value {
    let mut v = json!({"bytes": p.bytes});
    if let Some(t) = p.total {
        v["total"] = json!(t);
        if t > 0 {
            v["percent"] = json!(((p.bytes as u128 * 100) / t as u128).min(100) as u64);
        }
    }
    if let Some(r) = p.rate {
        v["rate"] = json!(r.max(0.0) as u64);
    }
    if let Some(s) = &p.stage {
        v["stage"] = json!(s);
    }
    v
}

fn job_state(s: JobState) -> &'static str {
    match s {
        JobState::Pending => "Pending",
        JobState::Running => "Running",
        JobState::Succeeded => "Succeeded",
        JobState::Failed => "Failed",
    }
}

impl Provisioning {
    pub fn new(
        store: Store,
        backend: Arc<dyn ExportBackend>,
        runner: Arc<dyn JobRunner>,
        settings: Settings,
    ) -> Arc<Provisioning> {
        let reg = store.registry();
        let t = |k: &str| {
            reg.by_kind(&format!("{GROUP}/v1alpha1"), k)
                .unwrap_or_else(|| panic!("{k} type is registered"))
        };
        Arc::new(Provisioning {
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

    /// Push every ExportPolicy in the store to the backend (start-up convergence).
    pub async fn converge_exports(&self) {
        let (policies, _) = self.store.list(&self.t_policy, None, None);
        for p in policies {
            let key = (ns_of(&p), meta::name(&p).to_string());
            if let Err(e) = self.sync_policy(&key).await {
                tracing::warn!(policy = %format!("{}/{}", key.0, key.1), error = %e, "pushing export policy at start-up");
            }
        }
    }

    /// Converge the backend, run it, and run watches and workers until shutdown.
    pub async fn run(self: Arc<Self>, workers: usize, mut shutdown: Shutdown, backend_run: bool) {
        if self.settings.nfs_enabled {
            self.converge_exports().await;
        }
        let backend = backend_run.then(|| {
            let (b, sd) = (self.backend.clone(), shutdown.child());
            tokio::spawn(async move { b.run(sd).await })
        });
        let mut tasks = tokio::task::JoinSet::new();
        for t in [
            self.t_image.clone(),
            self.t_zonal.clone(),
            self.t_volume.clone(),
            self.t_policy.clone(),
            self.t_rule.clone(),
            self.t_spec.clone(),
            self.t_server.clone(),
            self.t_action.clone(),
        ] {
            let c = self.clone();
            tasks.spawn(
                async move { watch_loop(&c.store, t, |t, o, del| c.dispatch(t, o, del)).await },
            );
        }
        for _ in 0..workers.clamp(1, 8) {
            macro_rules! worker {
                ($q:ident, $f:ident, $what:expr) => {{
                    let c = self.clone();
                    tasks.spawn(async move {
                        while let Some(k) = c.$q.get().await {
                            let r = c.$f(&k).await;
                            finish(&c.$q, k, r, $what);
                        }
                    });
                }};
            }
            worker!(images, reconcile_image, "image");
            worker!(policies, reconcile_policy, "exportpolicy");
            worker!(specs, reconcile_spec, "baremetalspec");
            worker!(servers, reconcile_server, "baremetalserver");
            worker!(actions, reconcile_action, "serveraction");
        }
        shutdown.recv().await;
        for q in [
            &self.images,
            &self.policies,
            &self.specs,
            &self.servers,
            &self.actions,
        ] {
            q.shutdown();
        }
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
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
            if meta::labels(&sv)
                .and_then(|l| l.get(IMAGE_LABEL))
                .and_then(Value::as_str)
                == Some(image)
            {
                self.servers
                    .add((ns.to_string(), meta::name(&sv).to_string()));
            }
        }
    }

    fn dispatch(&self, t: &ResourceType, o: &Value, deleted: bool) {
        let ns = ns_of(o);
        let name = meta::name(o).to_string();
        match t.kind.as_str() {
            "Image" => {
                self.images.add((ns.clone(), name.clone()));
                self.servers_of_image(&ns, &name);
            }
            "ZonalImage" | "StorageVolume" => {
                let img = s(o, "/spec/imageRef/name").unwrap_or("").to_string();
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
                if let Some(p) = s(o, "/spec/exportPolicyRef/name") {
                    self.policies.add((ns, p.to_string()));
                }
            }
            "BareMetalSpec" => self.specs.add((ns, name)),
            "BareMetalServer" => {
                if let Some(sp) = s(o, "/spec/bareMetalSpecRef/name") {
                    self.specs.add((ns.clone(), sp.to_string()));
                }
                if deleted {
                    if let Some(img) = meta::labels(o)
                        .and_then(|l| l.get(IMAGE_LABEL))
                        .and_then(Value::as_str)
                    {
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
                if let Some(sv) = s(o, "/spec/serverRef/name") {
                    self.servers.add((ns, sv.to_string()));
                }
            }
            _ => {}
        }
    }

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
        n["status"] = status;
        self.store.update(rt, n, Part::Status).await?;
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

    // ---- Image import ----------------------------------------------------------------

    async fn reconcile_image(&self, key: &Key) -> Result<Next, StoreError> {
        let (ns, name) = key;
        let img = match self.store.get(&self.t_image, Some(ns), name) {
            Ok(o) => o,
            Err(StoreError::NotFound { .. }) => return Ok(Next::Done),
            Err(e) => return Err(e),
        };
        let export = export_name(ns, name);
        if meta::is_deleting(&img) {
            if meta::finalizers(&img).iter().any(|f| f == IMAGE_FINALIZER) {
                if self.settings.nfs_enabled {
                    let _g = self.push.lock().await;
                    if let Err(e) = self.backend.remove_export(&export).await {
                        let mut st = img.get("status").cloned().unwrap_or(json!({}));
                        st["state"] = json!("Deleting");
                        st["message"] = json!(format!("removing export {export}: {e}"));
                        self.set_status(&self.t_image, &img, st).await?;
                        return Ok(Next::After(Duration::from_secs(2)));
                    }
                }
                tracing::info!(image = %format!("{ns}/{name}"), export = %export, "image deleted, export removed");
                self.remove_finalizer(&self.t_image, &img, IMAGE_FINALIZER)
                    .await?;
            }
            return Ok(Next::Done);
        }
        let img = self
            .add_finalizer(&self.t_image, img, IMAGE_FINALIZER)
            .await?;
        let mut st = img.get("status").cloned().unwrap_or(json!({}));
        let fail = |st: &mut Value, msg: String| {
            st["state"] = json!("Failed");
            st["message"] = json!(msg.clone());
            set_condition(st, "Exported", false, "ImportFailed", &msg);
        };
        if !self.settings.nfs_enabled {
            fail(
                &mut st,
                "the nfs export backend is disabled (set nfs.enabled = true)".into(),
            );
            self.set_status(&self.t_image, &img, st).await?;
            return Ok(Next::Done);
        }
        let source = s(&img, "/spec/source").unwrap_or("").to_string();
        let (file, dir, size) = match resolve_source(&self.settings.images_dir, &source) {
            Ok(x) => x,
            Err(msg) => {
                fail(&mut st, msg);
                self.set_status(&self.t_image, &img, st).await?;
                // The file may appear later; files are not watched.
                return Ok(Next::After(Duration::from_secs(10)));
            }
        };
        let file_name = file
            .file_name()
            .and_then(|f| f.to_str())
            .unwrap_or("")
            .to_string();

        // StorageVolume: where the image lives on NFS.
        let sv_spec = json!({
            "nfsServer": self.settings.nfs_server,
            "exportPath": export,
            "path": file_name,
            "localPath": dir.display().to_string(),
            "size": size,
            "imageRef": {"name": name},
        });
        let sv = self
            .ensure(
                &self.t_volume,
                json!({
                    "apiVersion": self.t_volume.api_version(), "kind": "StorageVolume",
                    "metadata": {"name": name, "namespace": ns, "ownerReferences": controller_ref(&self.t_image, &img)},
                    "spec": sv_spec,
                }),
            )
            .await?;
        let sv = self.ensure_spec(&self.t_volume, sv, &sv_spec).await?;
        let exported = {
            let _g = self.push.lock().await;
            self.backend.ensure_export(&export, &dir).await
        };
        if let Err(e) = exported {
            let msg = format!("exporting {} as {export}: {e}", dir.display());
            self.set_status(
                &self.t_volume,
                &sv,
                json!({"state": "Error", "message": msg, "backend": self.backend.name()}),
            )
            .await?;
            fail(&mut st, msg);
            self.set_status(&self.t_image, &img, st).await?;
            return Ok(Next::After(Duration::from_secs(3)));
        }
        self.set_status(
            &self.t_volume,
            &sv,
            json!({"state": "Available", "message": format!("exported by {}", self.backend.name()), "backend": self.backend.name()}),
        )
        .await?;

        // ExportPolicy: no default rules (no rule = no access).
        let ep_spec = json!({"exportPath": export, "storageVolumeRef": {"name": name}});
        let ep = self
            .ensure(
                &self.t_policy,
                json!({
                    "apiVersion": self.t_policy.api_version(), "kind": "ExportPolicy",
                    "metadata": {"name": name, "namespace": ns, "ownerReferences": controller_ref(&self.t_image, &img)},
                    "spec": ep_spec,
                }),
            )
            .await?;
        self.ensure_spec(&self.t_policy, ep, &ep_spec).await?;

        // ZonalImage: the image as available in its zone.
        let zone = s(&img, "/spec/zone").unwrap_or("default").to_string();
        let zname = format!("{name}-{zone}");
        let z_spec =
            json!({"imageRef": {"name": name}, "zone": zone, "storageVolumeRef": {"name": name}});
        let z = self
            .ensure(
                &self.t_zonal,
                json!({
                    "apiVersion": self.t_zonal.api_version(), "kind": "ZonalImage",
                    "metadata": {"name": zname, "namespace": ns, "ownerReferences": controller_ref(&self.t_image, &img)},
                    "spec": z_spec,
                }),
            )
            .await?;
        let z = self.ensure_spec(&self.t_zonal, z, &z_spec).await?;
        self.set_status(
            &self.t_zonal,
            &z,
            json!({"state": "Available", "message": format!("nfs://{}{export}/{file_name}", self.settings.nfs_server)}),
        )
        .await?;

        st["state"] = json!("Available");
        st["message"] = json!(format!("exported as {export}"));
        st["size"] = json!(size);
        st["exportPath"] = json!(export);
        set_condition(
            &mut st,
            "Exported",
            true,
            "Exported",
            &format!("{} exported as {export}", dir.display()),
        );
        self.set_status(&self.t_image, &img, st).await?;
        self.apply_retention(ns, name).await?;
        Ok(Next::Done)
    }

    /// Retention `Delete`: delete the Image once no BareMetalServer uses it any more
    /// (only after at least one did, recorded by the condition `Used`).
    async fn apply_retention(&self, ns: &str, image: &str) -> Result<(), StoreError> {
        let img = match self.store.get(&self.t_image, Some(ns), image) {
            Ok(o) => o,
            Err(StoreError::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        if s(&img, "/spec/retentionPolicy") != Some("Delete") || meta::is_deleting(&img) {
            return Ok(());
        }
        let used_before = img
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .is_some_and(|l| {
                l.iter()
                    .any(|c| c.get("type").and_then(Value::as_str) == Some("Used"))
            });
        let (servers, _) = self.store.list(&self.t_server, Some(ns), None);
        let users = servers
            .filter(|sv| {
                !meta::is_deleting(sv)
                    && meta::labels(sv)
                        .and_then(|l| l.get(IMAGE_LABEL))
                        .and_then(Value::as_str)
                        == Some(image)
            })
            .count();
        if users > 0 && !used_before {
            let mut st = img.get("status").cloned().unwrap_or(json!({}));
            set_condition(
                &mut st,
                "Used",
                true,
                "InUse",
                "a BareMetalServer uses this image",
            );
            self.set_status(&self.t_image, &img, st).await?;
        } else if users == 0 && used_before {
            tracing::info!(image = %format!("{ns}/{image}"), "retention policy Delete: last server gone, deleting the image");
            match self
                .store
                .delete(&self.t_image, Some(ns), image, None)
                .await
            {
                Ok(_) | Err(StoreError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    // ---- Export policies -------------------------------------------------------------

    async fn reconcile_policy(&self, key: &Key) -> Result<Next, StoreError> {
        if !self.settings.nfs_enabled {
            return Ok(Next::Done);
        }
        self.sync_policy(key).await
    }

    /// Push the policy's rules to the backend and record them in its status.
    async fn sync_policy(&self, key: &Key) -> Result<Next, StoreError> {
        let (ns, name) = key;
        let _g = self.push.lock().await;
        let p = match self.store.get(&self.t_policy, Some(ns), name) {
            Ok(o) => o,
            Err(StoreError::NotFound { .. }) => return Ok(Next::Done),
            Err(e) => return Err(e),
        };
        if meta::is_deleting(&p) {
            return Ok(Next::Done);
        }
        let export = s(&p, "/spec/exportPath").unwrap_or("").to_string();
        let (all, _) = self.store.list(&self.t_rule, Some(ns), None);
        let mine: Vec<Arc<Value>> = all
            .into_iter()
            .filter(|r| {
                s(r, "/spec/exportPolicyRef/name") == Some(name.as_str()) && !meta::is_deleting(r)
            })
            .collect();
        let (rules, bad) = backend_rules(&mine);
        let names: Vec<String> = rules.iter().map(|(n, _)| n.clone()).collect();
        let res = self
            .backend
            .set_rules(&export, rules.into_iter().map(|(_, r)| r).collect())
            .await;
        let mut st = p.get("status").cloned().unwrap_or(json!({}));
        let next = match &res {
            Ok(()) => {
                st["state"] = json!("Applied");
                st["message"] = json!(format!(
                    "{} rule(s) in force on {}",
                    names.len(),
                    self.backend.name()
                ));
                st["appliedRules"] = json!(names);
                set_condition(
                    &mut st,
                    "Applied",
                    true,
                    "Applied",
                    "rules are in force on the export backend",
                );
                Next::Done
            }
            Err(e) => {
                let reason = match e {
                    NfsError::Down(_) => "ServerDown",
                    NfsError::PortInUse(_) => "PortInUse",
                    NfsError::UnknownExport(_) => "NotExported",
                    _ => "BackendError",
                };
                st["state"] = json!("Error");
                st["message"] = json!(format!("pushing rules to {}: {e}", self.backend.name()));
                // What is in force is unknown: nothing is claimed as applied.
                st["appliedRules"] = json!([]);
                set_condition(&mut st, "Applied", false, reason, &e.to_string());
                Next::After(Duration::from_secs(2))
            }
        };
        match self.set_status(&self.t_policy, &p, st).await {
            Ok(()) | Err(StoreError::NotFound { .. }) => {}
            Err(StoreError::Conflict { .. }) => return Ok(Next::After(Duration::from_millis(20))),
            Err(e) => return Err(e),
        }
        for r in &mine {
            let (state, msg) = match (&res, bad.iter().find(|(n, _)| n == meta::name(r))) {
                (_, Some((_, why))) => ("Error", why.clone()),
                (Ok(()), None) => ("Applied", format!("in force on {export}")),
                (Err(e), None) => ("Pending", e.to_string()),
            };
            let st = json!({"state": state, "message": msg});
            match self.set_status(&self.t_rule, r, st).await {
                Ok(()) | Err(StoreError::NotFound { .. } | StoreError::Conflict { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(next)
    }

    // ---- BareMetalSpec → BareMetalServer ---------------------------------------------

    async fn reconcile_spec(&self, key: &Key) -> Result<Next, StoreError> {
        let (ns, name) = key;
        let spec = match self.store.get(&self.t_spec, Some(ns), name) {
            Ok(o) => o,
            Err(StoreError::NotFound { .. }) => return Ok(Next::Done),
            Err(e) => return Err(e),
        };
        if meta::is_deleting(&spec) {
            return Ok(Next::Done);
        }
        let mut st = spec.get("status").cloned().unwrap_or(json!({}));
        let image = meta::labels(&spec)
            .and_then(|l| l.get(IMAGE_LABEL))
            .and_then(Value::as_str)
            .map(String::from);
        let Some(_image) = image else {
            st["state"] = json!("Pending");
            st["message"] = json!(format!("label {IMAGE_LABEL} (the Image's name) is missing"));
            self.set_status(&self.t_spec, &spec, st).await?;
            return Ok(Next::Done);
        };
        let server = match self.store.get(&self.t_server, Some(ns), name) {
            Ok(sv) => sv,
            Err(StoreError::NotFound { .. }) => {
                if st
                    .get("serverUID")
                    .and_then(Value::as_str)
                    .is_some_and(|u| !u.is_empty())
                {
                    st["state"] = json!("Released");
                    st["message"] = json!("the BareMetalServer was deleted; delete and re-apply the BareMetalSpec to provision again");
                    self.set_status(&self.t_spec, &spec, st).await?;
                    return Ok(Next::Done);
                }
                let mut sspec = json!({"bareMetalSpecRef": {"name": name}});
                for f in ["target", "jobAddress", "description"] {
                    if let Some(v) = spec.pointer(&format!("/spec/{f}")) {
                        sspec[f] = v.clone();
                    }
                }
                let obj = json!({
                    "apiVersion": self.t_server.api_version(), "kind": "BareMetalServer",
                    "metadata": {
                        "name": name, "namespace": ns,
                        "labels": spec.pointer("/metadata/labels").cloned().unwrap_or(json!({})),
                        "ownerReferences": controller_ref(&self.t_spec, &spec),
                        "finalizers": [SERVER_FINALIZER],
                    },
                    "spec": sspec,
                });
                let sv = self.ensure(&self.t_server, obj).await?;
                tracing::info!(server = %format!("{ns}/{name}"), "BareMetalServer projected");
                sv
            }
            Err(e) => return Err(e),
        };
        st["state"] = json!(if meta::is_deleting(&server) {
            "Released"
        } else {
            "Projected"
        });
        st["serverRef"] = json!({"name": name});
        st["serverUID"] = json!(meta::uid(&server));
        st["message"] = json!(format!("projected as BareMetalServer {name}"));
        self.set_status(&self.t_spec, &spec, st).await?;
        Ok(Next::Done)
    }

    // ---- BareMetalServer (server controller) -----------------------------------------

    async fn reconcile_server(&self, key: &Key) -> Result<Next, StoreError> {
        let (ns, name) = key;
        let sv = match self.store.get(&self.t_server, Some(ns), name) {
            Ok(o) => o,
            Err(StoreError::NotFound { .. }) => return Ok(Next::Done),
            Err(e) => return Err(e),
        };
        if meta::is_deleting(&sv) {
            return self.finalize_server(key, &sv).await;
        }
        let sv = self
            .add_finalizer(&self.t_server, sv, SERVER_FINALIZER)
            .await?;
        let mut st = sv.get("status").cloned().unwrap_or(json!({}));
        let image = meta::labels(&sv)
            .and_then(|l| l.get(IMAGE_LABEL))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        st["imageRef"] = json!({"name": image});
        let action_name = rule_name(name);
        // Once provisioning is finished the outcome is kept; only progress mirroring.
        if let Ok(a) = self.store.get(&self.t_action, Some(ns), &action_name) {
            if sv.pointer("/spec/actionRef/name").is_some() {
                let (state, message, progress) = server_status_from_action(&a);
                st["state"] = json!(state);
                st["message"] = json!(message);
                st["progress"] = progress;
                set_condition(
                    &mut st,
                    "Provisioned",
                    state == "Provisioned",
                    &state,
                    &message,
                );
                self.set_status(&self.t_server, &sv, st).await?;
                return Ok(Next::Done);
            }
        }
        let pending = |st: &mut Value, msg: String| {
            st["state"] = json!("Pending");
            st["message"] = json!(msg);
        };
        if image.is_empty() {
            pending(&mut st, format!("label {IMAGE_LABEL} is missing"));
            self.set_status(&self.t_server, &sv, st).await?;
            return Ok(Next::Done);
        }
        let img_state = self
            .store
            .get(&self.t_image, Some(ns), &image)
            .ok()
            .map(|i| {
                (
                    s(&i, "/status/state").unwrap_or("Pending").to_string(),
                    s(&i, "/status/message").unwrap_or("").to_string(),
                    meta::is_deleting(&i),
                    i,
                )
            });
        let img = match img_state {
            Some((state, _, false, i)) if state == "Available" => i,
            Some((state, msg, deleting, _)) => {
                pending(
                    &mut st,
                    format!(
                        "waiting for Image {image} (state {}{}){}",
                        state,
                        if deleting { ", deleting" } else { "" },
                        if msg.is_empty() {
                            String::new()
                        } else {
                            format!(": {msg}")
                        }
                    ),
                );
                self.set_status(&self.t_server, &sv, st).await?;
                return Ok(Next::Done);
            }
            None => {
                pending(&mut st, format!("waiting for Image {image} to exist"));
                self.set_status(&self.t_server, &sv, st).await?;
                return Ok(Next::Done);
            }
        };
        // Step 3: the NFS details come from the StorageVolume.
        let vol = match self.store.get(&self.t_volume, Some(ns), &image) {
            Ok(v) if s(&v, "/status/state") == Some("Available") => v,
            _ => {
                pending(
                    &mut st,
                    format!("waiting for StorageVolume {image} to be Available"),
                );
                self.set_status(&self.t_server, &sv, st).await?;
                return Ok(Next::Done);
            }
        };
        let nfs = json!({
            "server": s(&vol, "/spec/nfsServer").unwrap_or(""),
            "export": s(&vol, "/spec/exportPath").unwrap_or(""),
            "path": s(&vol, "/spec/path").unwrap_or(""),
        });
        let client = s(&sv, "/spec/jobAddress")
            .map(String::from)
            .unwrap_or_else(|| self.settings.job_address.clone());
        let rname = rule_name(name);
        let rule_spec = json!({
            "exportPolicyRef": {"name": image},
            "index": JOB_RULE_INDEX,
            "client": client,
            "access": "ro",
            "protocols": [],
            "superuser": false,
        });
        let rule = self
            .ensure(
                &self.t_rule,
                json!({
                    "apiVersion": self.t_rule.api_version(), "kind": "ExportPolicyRule",
                    "metadata": {"name": rname, "namespace": ns, "ownerReferences": controller_ref(&self.t_server, &sv),
                                 "labels": {IMAGE_LABEL: image}},
                    "spec": rule_spec,
                }),
            )
            .await?;
        self.ensure_spec(&self.t_rule, rule, &rule_spec).await?;
        // The job may only start once the backend has the rule in force.
        let applied = self
            .store
            .get(&self.t_policy, Some(ns), &image)
            .ok()
            .map(|p| {
                let names = p
                    .pointer("/status/appliedRules")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                (
                    names.iter().any(|n| n.as_str() == Some(rname.as_str())),
                    s(&p, "/status/message").unwrap_or("").to_string(),
                )
            });
        match applied {
            Some((true, _)) => {}
            Some((false, msg)) => {
                pending(
                    &mut st,
                    format!("waiting for export rule {rname} to be in force ({msg})"),
                );
                self.set_status(&self.t_server, &sv, st).await?;
                return Ok(Next::Done);
            }
            None => {
                pending(&mut st, format!("waiting for ExportPolicy {image}"));
                self.set_status(&self.t_server, &sv, st).await?;
                return Ok(Next::Done);
            }
        }
        // Update the server: NFS details, rule and action references.
        let mut want = sv.get("spec").cloned().unwrap_or(json!({}));
        want["nfs"] = nfs.clone();
        want["exportPolicyRuleRef"] = json!({"name": rname});
        want["actionRef"] = json!({"name": action_name});
        let sv = self.ensure_spec(&self.t_server, sv, &want).await?;
        // Step 3 ends with the Provision action.
        let mut aspec = json!({
            "type": "Provision",
            "serverRef": {"name": name},
            "image": image,
            "nfs": nfs,
            "sha256": s(&img, "/spec/sha256").unwrap_or(""),
            "target": s(&sv, "/spec/target").unwrap_or(""),
        });
        if let Some(m) = s(&img, "/spec/manifest") {
            aspec["manifest"] = json!(m);
        }
        let a = self
            .ensure(
                &self.t_action,
                json!({
                    "apiVersion": self.t_action.api_version(), "kind": "ServerAction",
                    "metadata": {"name": action_name, "namespace": ns, "ownerReferences": controller_ref(&self.t_server, &sv),
                                 "labels": {IMAGE_LABEL: image}},
                    "spec": aspec,
                }),
            )
            .await?;
        let (state, message, progress) = server_status_from_action(&a);
        st["state"] = json!(state);
        st["message"] = json!(message);
        st["progress"] = progress;
        self.set_status(&self.t_server, &sv, st).await?;
        self.apply_retention(ns, &image).await?;
        Ok(Next::Done)
    }

    /// Server deletion: revoke NFS access at once, stop its job, apply retention.
    async fn finalize_server(&self, key: &Key, sv: &Value) -> Result<Next, StoreError> {
        let (ns, name) = key;
        if !meta::finalizers(sv).iter().any(|f| f == SERVER_FINALIZER) {
            return Ok(Next::Done);
        }
        let image = meta::labels(sv)
            .and_then(|l| l.get(IMAGE_LABEL))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
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
                let mut st = sv.get("status").cloned().unwrap_or(json!({}));
                st["state"] = json!("Deprovisioning");
                st["message"] = json!(format!("revoking NFS access: ExportPolicy {image} could not be pushed to the backend, retrying"));
                self.set_status(&self.t_server, sv, st).await?;
                return Ok(Next::After(Duration::from_secs(2)));
            }
        }
        if let Ok(a) = self.store.get(&self.t_action, Some(ns), &rule_name(name)) {
            let state = s(&a, "/status/state").unwrap_or("");
            if state != "Succeeded" && state != "Failed" {
                match self.runner.cancel(meta::uid(&a)).await {
                    Ok(()) | Err(JobError::NotFound(_)) => {}
                    Err(e) => {
                        tracing::warn!(server = %name, error = %e, "cancelling provisioning job")
                    }
                }
            }
        }
        tracing::info!(server = %format!("{ns}/{name}"), rule = %rname, "BareMetalServer deleted, export rule revoked");
        self.remove_finalizer(&self.t_server, sv, SERVER_FINALIZER)
            .await?;
        if !image.is_empty() {
            self.apply_retention(ns, &image).await?;
        }
        Ok(Next::Done)
    }

    // ---- ServerAction (server manager) -----------------------------------------------

    async fn reconcile_action(&self, key: &Key) -> Result<Next, StoreError> {
        let (ns, name) = key;
        let a = match self.store.get(&self.t_action, Some(ns), name) {
            Ok(o) => o,
            Err(StoreError::NotFound { .. }) => return Ok(Next::Done),
            Err(e) => return Err(e),
        };
        let mut st = a.get("status").cloned().unwrap_or(json!({}));
        let state = st
            .get("state")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if state == "Succeeded" || state == "Failed" || meta::is_deleting(&a) {
            return Ok(Next::Done);
        }
        let id = meta::uid(&a).to_string();
        if s(&a, "/spec/type") != Some("Provision") {
            st["state"] = json!("Failed");
            st["reason"] = json!(format!(
                "action type {:?} is not carried out by this appliance",
                s(&a, "/spec/type").unwrap_or("")
            ));
            st["finishedAt"] = json!(crate::store::now());
            self.set_status(&self.t_action, &a, st).await?;
            return Ok(Next::Done);
        }
        match self.runner.status(&id).await {
            Ok(js) => {
                st["state"] = json!(job_state(js.state));
                st["jobRef"] = json!(id);
                st["runner"] = json!(self.runner.name());
                st["attempts"] = json!(js.attempts);
                st["progress"] = progress_json(&js.progress);
                if let Some(t) = js.started_at {
                    st["startedAt"] = json!(t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
                }
                let mut reason = js.reason.clone();
                if js.state == JobState::Failed {
                    // Name the NFS server as the cause when it is down.
                    if let Err(e) = self.backend.health().await {
                        reason = Some(format!("{}; {e}", reason.unwrap_or_default()));
                    }
                    st["finishedAt"] = json!(crate::store::now());
                }
                if js.state == JobState::Succeeded {
                    st["finishedAt"] = json!(crate::store::now());
                    reason = None;
                }
                match reason {
                    Some(r) => st["reason"] = json!(r),
                    None => {
                        if let Some(m) = st.as_object_mut() {
                            m.remove("reason");
                        }
                    }
                }
                self.set_status(&self.t_action, &a, st).await?;
                if js.state.is_finished() {
                    tracing::info!(action = %format!("{ns}/{name}"), state = job_state(js.state), reason = js.reason.as_deref().unwrap_or(""), "provisioning job finished");
                    Ok(Next::Done)
                } else {
                    Ok(Next::After(Duration::from_millis(300)))
                }
            }
            Err(JobError::NotFound(_)) => {
                let mut restarts = st.get("restarts").and_then(Value::as_u64).unwrap_or(0);
                if st
                    .get("jobRef")
                    .and_then(Value::as_str)
                    .is_some_and(|j| !j.is_empty())
                {
                    // Started before, unknown now: the runner lost it (bootplane restarted;
                    // a local job died with its parent). Start it again, same id.
                    restarts += 1;
                    if restarts > MAX_RESTARTS {
                        st["state"] = json!("Failed");
                        st["reason"] = json!(format!("job {id} was lost {MAX_RESTARTS} times (bootplane restarted while it ran)"));
                        st["finishedAt"] = json!(crate::store::now());
                        self.set_status(&self.t_action, &a, st).await?;
                        return Ok(Next::Done);
                    }
                    tracing::warn!(action = %format!("{ns}/{name}"), job = %id, restarts, "provisioning job lost, starting it again");
                }
                if let Err(e) = self.backend.health().await {
                    st["state"] = json!("Pending");
                    st["reason"] = json!(format!("waiting for the NFS server: {e}"));
                    self.set_status(&self.t_action, &a, st).await?;
                    return Ok(Next::After(Duration::from_secs(2)));
                }
                let nfs: Option<NfsSource> = a
                    .pointer("/spec/nfs")
                    .cloned()
                    .and_then(|v| serde_json::from_value(v).ok());
                let req = ProvisionRequest {
                    id: Some(id.clone()),
                    server: s(&a, "/spec/serverRef/name").unwrap_or("").to_string(),
                    image: s(&a, "/spec/image").map(String::from),
                    nfs,
                    source: None,
                    sha256: s(&a, "/spec/sha256")
                        .filter(|h| !h.is_empty())
                        .map(String::from),
                    manifest: s(&a, "/spec/manifest").map(String::from),
                    target: s(&a, "/spec/target").unwrap_or("").to_string(),
                };
                match self.runner.start(req).await {
                    Ok(_) => {
                        st["state"] = json!("Pending");
                        st["jobRef"] = json!(id);
                        st["runner"] = json!(self.runner.name());
                        st["restarts"] = json!(restarts);
                        if let Some(m) = st.as_object_mut() {
                            m.remove("reason");
                        }
                        self.set_status(&self.t_action, &a, st).await?;
                        Ok(Next::After(Duration::from_millis(200)))
                    }
                    Err(JobError::Invalid(m)) => {
                        st["state"] = json!("Failed");
                        st["reason"] = json!(format!("invalid provisioning request: {m}"));
                        st["finishedAt"] = json!(crate::store::now());
                        self.set_status(&self.t_action, &a, st).await?;
                        Ok(Next::Done)
                    }
                    Err(e) => {
                        st["state"] = json!("Pending");
                        st["reason"] = json!(format!("job runner: {e}"));
                        self.set_status(&self.t_action, &a, st).await?;
                        Ok(Next::After(Duration::from_secs(2)))
                    }
                }
            }
            Err(e) => {
                st["reason"] = json!(format!("job runner: {e}"));
                self.set_status(&self.t_action, &a, st).await?;
                Ok(Next::After(Duration::from_secs(2)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_sorted_by_index_then_name_and_renumbered() {
        let r = |n: &str, i: u64, c: &str| {
            Arc::new(
                json!({"metadata": {"name": n}, "spec": {"index": i, "client": c, "access": "ro"}}),
            )
        };
        let (ok, bad) = backend_rules(&[
            r("b", 100, "10.0.0.2"),
            r("a", 100, "10.0.0.1"),
            r("deny", 1, "10.0.0.0/24"),
            r("broken", 5, "not-an-ip"),
        ]);
        let names: Vec<&str> = ok.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["deny", "a", "b"]);
        assert_eq!(
            ok.iter().map(|(_, r)| r.index).collect::<Vec<_>>(),
            [1, 2, 3]
        );
        assert_eq!(bad.len(), 1);
        assert_eq!(bad[0].0, "broken");
    }

    #[test]
    fn source_must_stay_below_images_dir() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("img")).unwrap();
        std::fs::write(t.path().join("img/disk.img"), b"x").unwrap();
        std::fs::write(t.path().join("top.img"), b"x").unwrap();
        let (f, d, n) = resolve_source(t.path(), "img/disk.img").unwrap();
        assert!(f.ends_with("img/disk.img") && d.ends_with("img") && n == 1);
        assert!(resolve_source(t.path(), "../etc/passwd").is_err());
        assert!(resolve_source(t.path(), "/etc/passwd").is_err());
        assert!(resolve_source(t.path(), "top.img")
            .unwrap_err()
            .contains("directory below"));
        std::os::unix::fs::symlink("/etc", t.path().join("esc")).unwrap();
        assert!(resolve_source(t.path(), "esc/passwd").is_err());
        assert!(resolve_source(t.path(), "img/missing").is_err());
    }

    #[test]
    fn server_state_follows_the_action() {
        let a = |st: Value| json!({"metadata": {"name": "x-provision"}, "status": st});
        assert_eq!(server_status_from_action(&a(json!({}))).0, "Provisioning");
        assert_eq!(
            server_status_from_action(&a(json!({"state": "Running", "progress": {"bytes": 5}}))).2,
            json!({"bytes": 5})
        );
        let (st, msg, _) = server_status_from_action(&a(
            json!({"state": "Failed", "reason": "exit code 13: sha"}),
        ));
        assert_eq!((st.as_str(), msg.as_str()), ("Failed", "exit code 13: sha"));
        assert_eq!(
            server_status_from_action(&a(json!({"state": "Succeeded"}))).0,
            "Provisioned"
        );
    }

    #[test]
    fn progress_percent() {
        let p = crate::provision::Progress {
            bytes: 50,
            total: Some(200),
            rate: Some(10.5),
            stage: Some("copy".into()),
        };
        assert_eq!(
            progress_json(&p),
            json!({"bytes": 50, "total": 200, "percent": 25, "rate": 10, "stage": "copy"})
        );
    }
}
