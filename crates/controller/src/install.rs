//! Install reports → the ServerBootConfiguration: a claim on a disk image (`[[disk]]` in
//! the catalog) boots the machine into the agent image, whose agent installs the image on
//! the disk the root-device hints choose and posts what it did (docs/install.md). This
//! writes the report onto the claim's boot configuration, off the request path:
//!
//! - installed and verified → condition `Installed` True for the configuration's
//!   generation: the boot side then serves a script that boots the local disk;
//! - failed → `Installed` False (`InstallFailed`, the agent's reason) and the boot
//!   configuration `Error` with `Ready` False saying why, which the claim's boot
//!   configuration shows; the agent never leaves a disk that looks bootable (its first
//!   MiB is written last, only after the whole image was verified). Deleting the claim,
//!   or a new generation of the configuration, starts over.
//!
//! A report for another boot than the configuration's current one (a power cycle or a
//! new claim since) is dropped.

use serde_json::{json, Value};

use super::set_condition;
use crate::http::catalog::{Catalog, FileHasher};
use crate::http::{AgentReport, BootFiles, InstallPlan};
use crate::model::registry::ResourceType;
use crate::model::views::{read, BootConfigurationState, Server, ServerBootConfiguration};
use crate::store::{Modified, Store, StoreError};

/// The boot configuration's condition an install report sets.
pub const INSTALLED: &str = "Installed";
/// On a Server: its root-device hints (JSON), replacing the catalog entry's.
pub const HINTS_ANNOTATION: &str = "bootplane.dev/root-device-hints";
/// Its reason when the install failed (the boot configuration stays in `Error`).
pub const INSTALL_FAILED: &str = "InstallFailed";

/// What a report says, as the condition will: installed or not, and the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub ok: bool,
    pub message: String,
}

/// What install report `i` (posted from `client`) says, as the condition will.
pub fn verdict(i: &bootplane_probe::InstallReport, client: std::net::IpAddr) -> Verdict {
    let device = i.device.as_deref().unwrap_or("no device");
    if i.ok {
        let ignition = i.ignition.as_ref().map_or(String::new(), |g| {
            format!(
                ", Ignition in {} ({}) at {}",
                g.partition, g.found_by, g.path
            )
        });
        return Verdict {
            ok: true,
            message: format!(
                "{} installed on {device} ({}; {} bytes, sha256 {} verified{ignition}), reported from {client}",
                i.image,
                if i.chosen_by.is_empty() { "named".to_string() } else { i.chosen_by.join(", ") },
                i.bytes_written,
                i.sha256.as_deref().unwrap_or("?"),
            ),
        };
    }
    Verdict {
        ok: false,
        message: format!(
            "install of {} on {device} failed: {} (the disk's first MiB is left zero: it does not boot)",
            i.image,
            i.error.as_deref().unwrap_or("the agent reported failure")
        ),
    }
}

/// How a claim on disk image `image` is installed, or why it cannot be (the disk image or
/// the agent image does not resolve); `None` when `image` is no disk image.
pub(crate) fn plan(
    (catalog, hasher, agent_image): (&Catalog, &FileHasher, &str),
    image: &str,
    base_url: &str,
) -> Option<Result<(InstallPlan, BootFiles), (String, String)>> {
    catalog.disk(image)?;
    let plan = hasher
        .resolve_disk(catalog, image)
        .map_err(|e| (e.reason().to_string(), e.to_string()))
        .and_then(|d| {
            let files = match hasher.resolve(catalog, agent_image) {
                Ok(Ok(agent)) => agent.boot_files(base_url),
                Ok(Err(e)) => {
                    return Err((
                        "AgentImage".to_string(),
                        format!("disk image {image} installs through the agent image: {e}"),
                    ))
                }
                Err(e) => return Err(("ImageIOError".into(), format!("reading image files: {e}"))),
            };
            let plan = InstallPlan {
                image: d.reference.clone(),
                image_url: d.image_url(base_url),
                sha256: d.sha256.clone(),
                root_device_hints: d.root_device_hints.clone(),
            };
            Ok((plan, files))
        });
    Some(plan)
}

/// A Server's own root-device hints (annotation [`HINTS_ANNOTATION`], a JSON object of
/// Ironic's keys) in place of the catalog's; a malformed one is the reason it cannot boot.
pub(crate) fn with_server_hints(
    (mut plan, files): (InstallPlan, BootFiles),
    sv: &crate::model::views::Server,
) -> Result<(InstallPlan, BootFiles), (String, String)> {
    if let Some(text) = sv.metadata.annotations.get(HINTS_ANNOTATION) {
        plan.root_device_hints = crate::http::catalog::hints_json(text).map_err(|why| {
            (
                "BadRootDeviceHints".to_string(),
                format!("annotation {HINTS_ANNOTATION}: {why}"),
            )
        })?;
    }
    Ok((plan, files))
}

/// Whether boot configuration `b`'s disk image is installed (`Installed` True, written by
/// the install report for this generation of it).
pub(crate) fn installed(b: &ServerBootConfiguration) -> bool {
    crate::model::views::condition(&b.status.conditions, INSTALLED).is_some_and(|c| {
        c.status == crate::model::views::ConditionStatus::True
            && c.observed_generation == Some(b.metadata.generation)
    })
}

/// Set condition `ty` and its `observedGeneration` (the configuration's `generation`).
fn set_observed(status: &mut Value, ty: &str, ok: bool, reason: &str, msg: &str, generation: i64) {
    set_condition(status, ty, ok, reason, msg);
    if let Some(c) = status
        .get_mut("conditions")
        .and_then(Value::as_array_mut)
        .and_then(|l| l.iter_mut().find(|c| c["type"] == ty))
    {
        c["observedGeneration"] = json!(generation);
    }
}

/// Whether `b` failed to install in its current generation (the boot configuration
/// reconciler keeps it in `Error`).
pub fn failed(b: &ServerBootConfiguration) -> Option<String> {
    crate::model::views::condition(&b.status.conditions, INSTALLED)
        .filter(|c| {
            c.reason == INSTALL_FAILED && c.observed_generation == Some(b.metadata.generation)
        })
        .map(|c| c.message.clone())
}

/// Write install report `r` (its verdict `v`) onto the boot configuration of its Server.
pub(crate) async fn write(
    store: &Store,
    (t_server, t_sbc): (&ResourceType, &ResourceType),
    r: &AgentReport,
    v: &Verdict,
    events: &crate::store::events::Recorder,
) -> Result<(), StoreError> {
    let over =
        || tracing::info!(server = %r.server, "install report for a boot that is over, dropped");
    let s = store.get(t_server, None, &r.server)?;
    let sv: Server = read(&s);
    let Some(bref) = sv.spec.boot_configuration_ref.clone() else {
        over();
        return Ok(());
    };
    let ns = bref.namespace.clone().unwrap_or_else(|| "default".into());
    let current = |b: &Value| {
        super::powerstate::claimed_boot_id(&sv, &read::<ServerBootConfiguration>(b)) == r.boot_id
    };
    let mut dropped = false;
    let written = store
        .modify_status(t_sbc, Some(&ns), &bref.name, |b, st| {
            dropped = !current(b);
            if dropped {
                return false;
            }
            let generation = read::<ServerBootConfiguration>(b).metadata.generation;
            if v.ok {
                set_observed(st, INSTALLED, true, "Installed", &v.message, generation);
            } else {
                set_observed(st, INSTALLED, false, INSTALL_FAILED, &v.message, generation);
                st["state"] = json!(BootConfigurationState::Error);
                set_condition(st, "Ready", false, INSTALL_FAILED, &v.message);
            }
            true
        })
        .await?;
    if dropped {
        over();
    }
    if let Modified::Written { before, after } = written {
        events.status_change(t_sbc, &before, before.get("status"), &after["status"]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_holds_only_for_its_generation() {
        let b = |gen: i64, observed: i64| -> ServerBootConfiguration {
            read(&json!({
                "metadata": {"name": "b", "generation": gen},
                "status": {"conditions": [{"type": INSTALLED, "status": "False",
                    "reason": INSTALL_FAILED, "message": "sha256 mismatch", "observedGeneration": observed}]},
            }))
        };
        assert_eq!(failed(&b(2, 2)).as_deref(), Some("sha256 mismatch"));
        assert_eq!(failed(&b(3, 2)), None);
        let mut st = json!({});
        set_observed(&mut st, INSTALLED, true, "Installed", "ok", 7);
        assert_eq!(st["conditions"][0]["observedGeneration"], 7);
        assert_eq!(st["conditions"][0]["status"], "True");
    }
}
