//! The Image reconciler (import): checks the image file, exports its directory on the
//! export backend and creates the Image's `StorageVolume` (where the file is on NFS),
//! `ExportPolicy` (no rules: no access) and `ZonalImage`, all owned by the Image; the
//! finalizer [`IMAGE_FINALIZER`] removes the export before the Image goes. Also the
//! Image's retention policy, applied when the servers using it come and go.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::export_policy::ExportPolicySpec;
use super::{
    export_name, image_label, merge, owned_object, read, status_of, to_json, NameRef, Provisioning,
    IMAGE_FINALIZER,
};
use crate::model::meta;
use crate::model::views::{condition, string_enum, Condition, ObjectMeta};
use crate::store::StoreError;
use crate::{controller_ref, set_condition, Key, Next};

string_enum! {
    /// `Image.status.state`.
    ImageState { Pending, Available, Failed, Deleting }
}

string_enum! {
    /// `Image.spec.retentionPolicy` (absent means `Retain`).
    RetentionPolicy { Retain, Delete }
}

string_enum! {
    /// `StorageVolume.status.state`.
    VolumeState { Pending, Available, Error }
}

string_enum! {
    /// `ZonalImage.status.state`.
    ZonalImageState { Pending, Available, Failed }
}

/// The fields of an `Image` the flow reads.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Image {
    pub metadata: ObjectMeta,
    pub spec: ImageSpec,
    pub status: ImageStatus,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct ImageSpec {
    /// The file, relative to `provision.images_dir`.
    pub source: String,
    pub sha256: Option<String>,
    pub manifest: Option<String>,
    pub zone: Option<String>,
    pub retention_policy: Option<RetentionPolicy>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub(crate) struct ImageStatus {
    pub state: Option<ImageState>,
    pub message: Option<String>,
    pub conditions: Vec<Condition>,
}

/// The `Image.status` fields the import sets (conditions go through
/// [`set_condition`]).
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
struct ImageStatusPatch {
    #[serde(skip_serializing_if = "Option::is_none")]
    state: Option<ImageState>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    export_path: Option<String>,
}

/// A `StorageVolume`: where an image's file is on NFS (the server controller reads it).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub(crate) struct StorageVolume {
    pub spec: StorageVolumeSpec,
    pub status: StorageVolumeStatus,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct StorageVolumeSpec {
    pub nfs_server: String,
    pub export_path: String,
    /// The file inside the export.
    pub path: String,
    /// The exported directory on this machine.
    pub local_path: String,
    pub size: u64,
    pub image_ref: NameRef,
}

/// `StorageVolume.status`, written whole.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct StorageVolumeStatus {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<VolumeState>,
    pub message: String,
    pub backend: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ZonalImageSpec {
    image_ref: NameRef,
    zone: String,
    storage_volume_ref: NameRef,
}

/// `ZonalImage.status`, written whole.
#[derive(Debug, Serialize)]
struct ZonalImageStatus {
    state: ZonalImageState,
    message: String,
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

/// The image failed to import: state `Failed`, condition `Exported` false.
fn fail(st: &mut Value, msg: String) {
    merge(
        st,
        &ImageStatusPatch {
            state: Some(ImageState::Failed),
            message: Some(msg.clone()),
            ..Default::default()
        },
    );
    set_condition(st, "Exported", false, "ImportFailed", &msg);
}

impl Provisioning {
    pub(super) async fn reconcile_image(&self, key: &Key) -> Result<Next, StoreError> {
        let (ns, name) = key;
        let Some(obj) = self.get(&self.t_image, ns, name)? else {
            return Ok(Next::Done);
        };
        let img: Image = read(&self.t_image, &obj)?;
        let export = export_name(ns, name);
        if img.metadata.is_deleting() {
            return self.finalize_image(key, &obj, &img, &export).await;
        }
        let obj = self
            .add_finalizer(&self.t_image, obj, IMAGE_FINALIZER)
            .await?;
        let mut st = status_of(&obj);
        if !self.settings.nfs_enabled {
            fail(
                &mut st,
                "the nfs export backend is disabled (set nfs.enabled = true)".into(),
            );
            self.set_status(&self.t_image, &obj, st).await?;
            return Ok(Next::Done);
        }
        let (file, dir, size) = match resolve_source(&self.settings.images_dir, &img.spec.source) {
            Ok(x) => x,
            Err(msg) => {
                fail(&mut st, msg);
                self.set_status(&self.t_image, &obj, st).await?;
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
        let owner = || controller_ref(&self.t_image, &obj);
        let vol_spec = StorageVolumeSpec {
            nfs_server: self.settings.nfs_server.clone(),
            export_path: export.clone(),
            path: file_name.clone(),
            local_path: dir.display().to_string(),
            size,
            image_ref: NameRef::new(name),
        };
        let vol = owned_object(&self.t_volume, ns, name, owner(), to_json(&vol_spec));
        let vol = self.ensure_owned(&self.t_volume, vol).await?;
        if let Err(msg) = self.export_volume(&vol, &export, &dir).await? {
            fail(&mut st, msg);
            self.set_status(&self.t_image, &obj, st).await?;
            return Ok(Next::After(Duration::from_secs(3)));
        }

        // ExportPolicy: no default rules (no rule = no access).
        let ep_spec = ExportPolicySpec {
            export_path: export.clone(),
            storage_volume_ref: Some(NameRef::new(name)),
        };
        let ep = owned_object(&self.t_policy, ns, name, owner(), to_json(&ep_spec));
        self.ensure_owned(&self.t_policy, ep).await?;

        // ZonalImage: the image as available in its zone.
        let zone = img.spec.zone.as_deref().unwrap_or("default");
        let z_spec = ZonalImageSpec {
            image_ref: NameRef::new(name),
            zone: zone.to_string(),
            storage_volume_ref: NameRef::new(name),
        };
        let z = owned_object(
            &self.t_zonal,
            ns,
            &format!("{name}-{zone}"),
            owner(),
            to_json(&z_spec),
        );
        let z = self.ensure_owned(&self.t_zonal, z).await?;
        let z_status = ZonalImageStatus {
            state: ZonalImageState::Available,
            message: format!("nfs://{}{export}/{file_name}", self.settings.nfs_server),
        };
        self.set_status(&self.t_zonal, &z, to_json(&z_status))
            .await?;

        merge(
            &mut st,
            &ImageStatusPatch {
                state: Some(ImageState::Available),
                message: Some(format!("exported as {export}")),
                size: Some(size),
                export_path: Some(export.clone()),
            },
        );
        set_condition(
            &mut st,
            "Exported",
            true,
            "Exported",
            &format!("{} exported as {export}", dir.display()),
        );
        self.set_status(&self.t_image, &obj, st).await?;
        self.apply_retention(ns, name).await?;
        Ok(Next::Done)
    }

    /// Export `dir` as `export` on the backend and record the outcome in the
    /// StorageVolume `vol`'s status; `Ok(Err(message))` when the backend refused.
    async fn export_volume(
        &self,
        vol: &Value,
        export: &str,
        dir: &Path,
    ) -> Result<Result<(), String>, StoreError> {
        let exported = {
            let _g = self.push.lock().await;
            self.backend.ensure_export(export, dir).await
        };
        let backend = self.backend.name().to_string();
        let (state, message, res) = match exported {
            Err(e) => {
                let msg = format!("exporting {} as {export}: {e}", dir.display());
                (VolumeState::Error, msg.clone(), Err(msg))
            }
            Ok(()) => (
                VolumeState::Available,
                format!("exported by {backend}"),
                Ok(()),
            ),
        };
        let status = StorageVolumeStatus {
            state: Some(state),
            message,
            backend,
        };
        self.set_status(&self.t_volume, vol, to_json(&status))
            .await?;
        Ok(res)
    }

    /// Image deletion: remove the export, then the finalizer.
    async fn finalize_image(
        &self,
        key: &Key,
        obj: &Value,
        img: &Image,
        export: &str,
    ) -> Result<Next, StoreError> {
        let (ns, name) = key;
        if !img.metadata.finalizers.iter().any(|f| f == IMAGE_FINALIZER) {
            return Ok(Next::Done);
        }
        if self.settings.nfs_enabled {
            let _g = self.push.lock().await;
            if let Err(e) = self.backend.remove_export(export).await {
                let mut st = status_of(obj);
                let patch = ImageStatusPatch {
                    state: Some(ImageState::Deleting),
                    message: Some(format!("removing export {export}: {e}")),
                    ..Default::default()
                };
                merge(&mut st, &patch);
                self.set_status(&self.t_image, obj, st).await?;
                return Ok(Next::After(Duration::from_secs(2)));
            }
        }
        tracing::info!(image = %format!("{ns}/{name}"), export = %export, "image deleted, export removed");
        self.remove_finalizer(&self.t_image, obj, IMAGE_FINALIZER)
            .await?;
        Ok(Next::Done)
    }

    /// Retention `Delete`: delete the Image once no BareMetalServer uses it any more
    /// (only after at least one did, recorded by the condition `Used`).
    pub(super) async fn apply_retention(&self, ns: &str, image: &str) -> Result<(), StoreError> {
        let Some(obj) = self.get(&self.t_image, ns, image)? else {
            return Ok(());
        };
        let img: Image = read(&self.t_image, &obj)?;
        if img.spec.retention_policy != Some(RetentionPolicy::Delete) || img.metadata.is_deleting()
        {
            return Ok(());
        }
        let used_before = condition(&img.status.conditions, "Used").is_some();
        let (servers, _) = self.store.list(&self.t_server, Some(ns), None);
        let users = servers
            .filter(|sv| !meta::is_deleting(sv) && image_label(sv) == Some(image))
            .count();
        if users > 0 && !used_before {
            let mut st = status_of(&obj);
            set_condition(
                &mut st,
                "Used",
                true,
                "InUse",
                "a BareMetalServer uses this image",
            );
            self.set_status(&self.t_image, &obj, st).await?;
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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

    /// The objects the import writes are the JSON the untyped code wrote, key for key
    /// and in the same order.
    #[test]
    fn written_json_is_unchanged() {
        let vol = StorageVolumeSpec {
            nfs_server: "10.0.0.1".into(),
            export_path: "/images/default/demo".into(),
            path: "disk.img".into(),
            local_path: "/srv/img/demo".into(),
            size: 5,
            image_ref: NameRef::new("demo"),
        };
        assert_eq!(
            serde_json::to_string(&vol).unwrap(),
            r#"{"nfsServer":"10.0.0.1","exportPath":"/images/default/demo","path":"disk.img","localPath":"/srv/img/demo","size":5,"imageRef":{"name":"demo"}}"#
        );
        let st = StorageVolumeStatus {
            state: Some(VolumeState::Error),
            message: "m".into(),
            backend: "ganesha".into(),
        };
        assert_eq!(
            to_json(&st),
            json!({"state": "Error", "message": "m", "backend": "ganesha"})
        );
        let z = ZonalImageSpec {
            image_ref: NameRef::new("demo"),
            zone: "default".into(),
            storage_volume_ref: NameRef::new("demo"),
        };
        assert_eq!(
            serde_json::to_string(&z).unwrap(),
            r#"{"imageRef":{"name":"demo"},"zone":"default","storageVolumeRef":{"name":"demo"}}"#
        );
        let mut s = json!({"conditions": []});
        fail(&mut s, "bad".into());
        assert_eq!(
            (&s["state"], &s["message"]),
            (&json!("Failed"), &json!("bad"))
        );
        assert_eq!(s["conditions"][0]["reason"], "ImportFailed");
    }
}
