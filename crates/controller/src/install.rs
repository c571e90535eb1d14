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
use crate::http::AgentReport;
use crate::model::registry::ResourceType;
use crate::model::views::{read, BootConfigurationState, Server, ServerBootConfiguration};
use crate::store::{Modified, Store, StoreError};

/// The boot configuration's condition an install report sets.
pub const INSTALLED: &str = "Installed";
/// Its reason when the install failed (the boot configuration stays in `Error`).
pub const INSTALL_FAILED: &str = "InstallFailed";

/// What a report says, as the condition will: installed or not, and the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub ok: bool,
    pub message: String,
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
