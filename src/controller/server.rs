//! The Server reconciler: the server state machine as far as the embedded mode
//! reaches it, and power.
//!
//! - a Server discovered from a BMC that is not approved (label `bootplane.dev/approval:
//!   pending`) stays `Initial`, condition `Approved` False (`AwaitingApproval`), until
//!   an operator changes the label;
//! - no state yet → `Initial`; with first boots on (`[discovery]`) a Server naming a BMC
//!   goes on to `Discovery` ([`super::firstboot`]: discovery image, inventory, then
//!   `Available`); any other waits for an operator to register its inventory with
//!   `status.state: Available` through the API;
//! - `Available` + `spec.serverClaimRef` → `Reserved`;
//! - `Reserved`: wait for the ServerBootConfiguration to be `Ready` (condition
//!   `BootConfigurationReady` says why not), then apply `spec.power` through the power
//!   driver (condition `PowerReady` says what is pending);
//! - `Reserved` without a claim (claim deleted), or whose claim no longer exists →
//!   power off, then `Available` (reclaimPolicy `Recycle`) or `Released` (`Retain`);
//! - annotation `bootplane.dev/reset-requested` → the power driver's reset, once.

use serde_json::{json, Value};

use super::{claim_ref, set_condition, Controllers, Next};
use crate::model::meta;
use crate::power::{Outcome, Power};
use crate::store::{Part, StoreError};

pub async fn reconcile(c: &Controllers, name: &str) -> Result<Next, StoreError> {
    let s = match c.store.get(&c.t_server, None, name) {
        Ok(s) => s,
        Err(StoreError::NotFound { .. }) => return Ok(Next::Done),
        Err(e) => return Err(e),
    };
    if meta::is_deleting(&s) {
        return Ok(Next::Done);
    }
    // A claim reference to a claim that no longer exists (deleted before it could
    // finalize, e.g. across a crash) is dropped.
    if let Some((ns, cn)) = claim_ref(&s) {
        if let Err(StoreError::NotFound { .. }) = c.store.get(&c.t_claim, Some(&ns), &cn) {
            let patch = json!({"spec": {"serverClaimRef": null, "bootConfigurationRef": null, "power": "Off"}});
            c.store
                .patch(&c.t_server, None, name, &patch, Part::Main)
                .await?;
            return Ok(Next::Done);
        }
    }
    if s.pointer("/metadata/annotations")
        .and_then(|a| a.get(RESET_ANNOTATION))
        .is_some()
    {
        return reset(c, &s, name).await;
    }
    let mut status = s.get("status").cloned().unwrap_or_else(|| json!({}));
    let state = status
        .get("state")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let power = status
        .get("powerState")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let claimed = claim_ref(&s).is_some();
    let first_boot = c
        .first_boot
        .as_ref()
        .filter(|_| super::firstboot::has_bmc(&s));
    let mut step = None;
    let pending = super::awaiting_approval(&s);
    if !pending && has_condition(&status, APPROVED, "False") {
        set_condition(
            &mut status,
            APPROVED,
            true,
            "Approved",
            "approved by an operator",
        );
    }
    match state.as_str() {
        "" | "Initial" if pending => {
            status["state"] = json!("Initial");
            set_condition(
                &mut status,
                APPROVED,
                false,
                "AwaitingApproval",
                &format!(
                    "discovered from a BMC not in discovery.approved_bmcs: not booted nor claimable until an operator changes the label {} from {} to approved",
                    super::APPROVAL_LABEL,
                    super::APPROVAL_PENDING
                ),
            );
        }
        "Initial" if first_boot.is_some() && !claimed => {
            status["state"] = json!("Discovery");
        }
        "" if first_boot.is_some() => {
            status["state"] = json!("Initial");
        }
        "" => {
            status["state"] = json!("Initial");
            set_condition(
                &mut status,
                "Discovered",
                false,
                "AwaitingRegistration",
                "no first boot for this server (it names no BMC, or [discovery] first_boot is off); register the inventory with status.state Available",
            );
        }
        "Discovery" if first_boot.is_some() && !claimed => {
            step = Some(super::firstboot::step(c, first_boot.unwrap(), &s, &mut status).await?);
        }
        "Available" if claimed => {
            status["state"] = json!("Reserved");
        }
        "Reserved" if !claimed => release(c, &s, &mut status, &power)?,
        "Reserved" => drive_reserved(c, &s, &mut status, &power)?,
        _ => {
            // Available without claim, Released, Error, Parked, Initial: an unclaimed
            // server is kept powered as its spec says only when it asks for Off.
            if !claimed
                && s.pointer("/spec/power").and_then(Value::as_str) == Some("Off")
                && power == "On"
            {
                apply_power(c, &s, &mut status, Power::Off);
            }
        }
    }
    // A discovery boot records its attempt before the driver acts (so a retried
    // reconcile never boots twice): the status goes onto that newer version.
    let base = step
        .as_ref()
        .and_then(|st| st.base.clone())
        .unwrap_or_else(|| s.clone());
    if Some(&status) != base.get("status") {
        c.store
            .update_status(&c.t_server, &base, status.clone())
            .await?;
        c.events
            .status_change(&c.t_server, &base, base.get("status"), &status);
    }
    match step {
        Some(step) => {
            super::firstboot::finish(c, &s, &step).await?;
            Ok(step.next)
        }
        None => Ok(Next::Done),
    }
}

/// The condition of a discovered Server saying whether an operator approved it
/// ([`super::APPROVAL_LABEL`]).
pub const APPROVED: &str = "Approved";

fn has_condition(status: &Value, ty: &str, st: &str) -> bool {
    status
        .get("conditions")
        .and_then(Value::as_array)
        .is_some_and(|l| l.iter().any(|c| c["type"] == ty && c["status"] == st))
}

pub use crate::model::wire::RESET_ANNOTATION;

async fn reset(c: &Controllers, s: &std::sync::Arc<Value>, name: &str) -> Result<Next, StoreError> {
    let mut status = s.get("status").cloned().unwrap_or_else(|| json!({}));
    let driver = c.power.name_for(s);
    record_power(&mut status, c.power.reset(s), "ResetFailed", |st| {
        st["powerState"] = json!("On");
        set_condition(
            st,
            "PowerReady",
            true,
            "Reset",
            &format!("server reset by the {driver} driver"),
        );
    });
    if Some(&status) != s.get("status") {
        c.store
            .update_status(&c.t_server, s, status.clone())
            .await?;
        c.events
            .status_change(&c.t_server, s, s.get("status"), &status);
    }
    let patch = json!({"metadata": {"annotations": {RESET_ANNOTATION: null}}});
    c.store
        .patch(&c.t_server, None, name, &patch, Part::Main)
        .await?;
    Ok(Next::Done)
}

/// A reserved server whose claim is gone: power it off, then make it Available
/// (`reclaimPolicy: Recycle`) or Released (`Retain`).
fn release(c: &Controllers, s: &Value, status: &mut Value, power: &str) -> Result<(), StoreError> {
    if power != "Off" {
        apply_power(c, s, status, Power::Off);
    }
    if status.get("powerState").and_then(Value::as_str) == Some("Off") {
        let policy = s
            .pointer("/spec/reclaimPolicy")
            .and_then(Value::as_str)
            .unwrap_or("Recycle");
        status["state"] = json!(if policy == "Retain" {
            "Released"
        } else {
            "Available"
        });
        set_condition(
            status,
            "PowerReady",
            true,
            "Released",
            "server released from its claim",
        );
        if let Some(l) = status.get_mut("conditions").and_then(Value::as_array_mut) {
            l.retain(|c| c.get("type").and_then(Value::as_str) != Some("BootConfigurationReady"));
        }
    }
    Ok(())
}

/// A claimed server: wait for its boot configuration to be Ready, then power it as
/// its spec asks.
fn drive_reserved(
    c: &Controllers,
    s: &Value,
    status: &mut Value,
    power: &str,
) -> Result<(), StoreError> {
    let sbc_ref = s
        .pointer("/spec/bootConfigurationRef")
        .cloned()
        .unwrap_or(Value::Null);
    let ns = sbc_ref
        .get("namespace")
        .and_then(Value::as_str)
        .unwrap_or("default");
    let bn = sbc_ref.get("name").and_then(Value::as_str).unwrap_or("");
    let sbc_state = c.store.get(&c.t_sbc, Some(ns), bn).ok().and_then(|b| {
        b.pointer("/status/state")
            .and_then(Value::as_str)
            .map(String::from)
    });
    let want = Power::parse(
        s.pointer("/spec/power")
            .and_then(Value::as_str)
            .unwrap_or("Off"),
    )
    .unwrap_or(Power::Off);
    match sbc_state.as_deref() {
        Some("Ready") => {
            set_condition(
                status,
                "BootConfigurationReady",
                true,
                "Ready",
                &format!("ServerBootConfiguration {ns}/{bn} is Ready"),
            );
            if power != want.as_str() {
                apply_power(c, s, status, want);
            } else {
                set_condition(
                    status,
                    "PowerReady",
                    true,
                    "InState",
                    &format!("server is powered {}", want.as_str()),
                );
            }
        }
        other => {
            set_condition(
                status,
                "BootConfigurationReady",
                false,
                "Waiting",
                &format!(
                    "waiting for ServerBootConfiguration {ns}/{bn} to become Ready (now {})",
                    other.unwrap_or("absent")
                ),
            );
            if want == Power::Off && power != "Off" {
                apply_power(c, s, status, Power::Off);
            }
        }
    }
    Ok(())
}

fn apply_power(c: &Controllers, s: &Value, status: &mut Value, want: Power) {
    let driver = c.power.name_for(s);
    record_power(status, c.power.set_power(s, want), "DriverError", |st| {
        st["powerState"] = json!(want.as_str());
        set_condition(
            st,
            "PowerReady",
            true,
            "Applied",
            &format!("power {} applied by the {driver} driver", want.as_str()),
        );
    });
}

/// A power driver's answer into `status`: `done` when it is applied, else `PowerReady`
/// False with why (`Pending`, the driver's retry reason, or `err_reason` and the error).
pub(super) fn record_power(
    status: &mut Value,
    r: anyhow::Result<Outcome>,
    err_reason: &str,
    done: impl FnOnce(&mut Value),
) {
    match r {
        Ok(Outcome::Done) => done(status),
        Ok(Outcome::Pending(msg)) => {
            set_condition(status, "PowerReady", false, "Pending", &msg);
        }
        Ok(Outcome::Retrying(reason, msg)) => {
            set_condition(status, "PowerReady", false, reason, &msg);
        }
        Err(e) => {
            set_condition(status, "PowerReady", false, err_reason, &format!("{e:#}"));
        }
    }
}
