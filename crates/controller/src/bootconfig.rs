//! The ServerBootConfiguration reconciler (boot side): decides `Ready` or `Error`
//! through the configured [`super::BootResolver`] and records why (a disk image the agent
//! failed to install keeps it in `Error`, [`super::install`]).

use serde_json::json;

use super::{set_condition, Controllers, Key, Next};
use crate::model::meta;
use crate::model::views::{read, BootConfigurationState, ServerBootConfiguration};
use crate::store::StoreError;

pub(crate) async fn reconcile(c: &Controllers, key: &Key) -> Result<Next, StoreError> {
    let (ns, name) = key;
    let b = match c.store.get(&c.t_sbc, Some(ns), name) {
        Ok(b) => b,
        Err(StoreError::NotFound { .. }) => return Ok(Next::Done),
        Err(e) => return Err(e),
    };
    if meta::is_deleting(&b) {
        return Ok(Next::Done);
    }
    let mut status = b.get("status").cloned().unwrap_or_else(|| json!({}));
    let mut next = Next::Done;
    let install_failed = super::install::failed(&read::<ServerBootConfiguration>(&b));
    match c.resolver.resolve(&c.store, &b) {
        // The agent could not install its disk image: it stays in Error, saying why,
        // until the claim is deleted or the configuration changes.
        Ok(()) if install_failed.is_some() => {
            status["state"] = json!(BootConfigurationState::Error);
            let why = install_failed.unwrap_or_default();
            set_condition(
                &mut status,
                "Ready",
                false,
                super::install::INSTALL_FAILED,
                &why,
            );
        }
        Ok(()) => {
            status["state"] = json!(BootConfigurationState::Ready);
            set_condition(
                &mut status,
                "Ready",
                true,
                "Resolved",
                "image and ignition resolved",
            );
        }
        Err((reason, message)) => {
            status["state"] = json!(BootConfigurationState::Error);
            set_condition(&mut status, "Ready", false, &reason, &message);
            // Files may appear or be fixed on disk without any store event: look again.
            next = Next::After(std::time::Duration::from_secs(15));
        }
    }
    if Some(&status) != b.get("status") {
        c.store.update_status(&c.t_sbc, &b, status.clone()).await?;
        c.events
            .status_change(&c.t_sbc, &b, b.get("status"), &status);
    }
    Ok(next)
}
