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
//!   `Cleanup` when its disks are to be wiped ([`super::cleanup`]: the agent wipes, then
//!   off and `Available`, or `Error`), else power off, then `Available` (reclaimPolicy
//!   `Recycle`) or `Released` (`Retain`);
//! - annotation `bootplane.dev/reset-requested` → the power driver's reset, once;
//! - the boot generation (annotation `bootplane.dev/boot-generation`,
//!   [`super::powerstate`])
//!   moves on before every reset and once each time the server is seen powered off:
//!   signed boot tokens are bound to it, so a token minted in one boot of the machine
//!   is refused after bootplane power-cycled it.

use serde_json::{json, Value};

use super::{claim_ref, set_condition, Controllers, Next};
// The boot generation and the power answers live one room down (the first boot shares
// them).
use super::powerstate::{
    generation_after_power, generation_before_reset, record_power, BOOT_GENERATION_ANNOTATION,
};
use crate::model::views::{
    condition, read, BootConfigurationState, ConditionStatus, PowerState, ReclaimPolicy, Server,
    ServerBootConfiguration, ServerState,
};
use crate::power::Power;
use crate::store::{Part, StoreError};

pub(crate) async fn reconcile(c: &Controllers, name: &str) -> Result<Next, StoreError> {
    let s = match c.store.get(&c.t_server, None, name) {
        Ok(s) => s,
        Err(StoreError::NotFound { .. }) => return Ok(Next::Done),
        Err(e) => return Err(e),
    };
    let sv: Server = read(&s);
    if sv.metadata.is_deleting() {
        return Ok(Next::Done);
    }
    // A claim reference to a claim that no longer exists (deleted before it could
    // finalize, e.g. across a crash) is dropped.
    if let Some((ns, cn)) = claim_ref(&sv) {
        if let Err(StoreError::NotFound { .. }) = c.store.get(&c.t_claim, Some(&ns), &cn) {
            let patch = json!({"spec": {"serverClaimRef": null, "bootConfigurationRef": null, "power": "Off"}});
            c.store
                .patch(&c.t_server, None, name, &patch, Part::Main)
                .await?;
            return Ok(Next::Done);
        }
    }
    if sv.metadata.annotations.contains_key(RESET_ANNOTATION) {
        return reset(c, &s, name).await;
    }
    // Seen off (whoever recorded it: this driver, the BMC poll, an operator's
    // confirmation): the boot it ended is over for its tokens.
    let s = match generation_after_power(&sv) {
        Some(v) => set_boot_generation(c, &s, &v).await?,
        None => s,
    };
    let mut status = s.get("status").cloned().unwrap_or_else(|| json!({}));
    // An empty state is no state.
    let state = (sv.status.state.clone()).filter(|s| !s.as_str().is_empty());
    let power = sv.status.power_state.clone();
    let claimed = claim_ref(&sv).is_some();
    let first_boot = c
        .first_boot
        .as_ref()
        .filter(|_| super::firstboot::has_bmc(&sv));
    let mut step = None;
    let pending = super::awaiting_approval(&sv);
    let approved = condition(&sv.status.conditions, APPROVED).map(|c| &c.status);
    if !pending && approved == Some(&ConditionStatus::False) {
        set_condition(
            &mut status,
            APPROVED,
            true,
            "Approved",
            "approved by an operator",
        );
    }
    use ServerState::*;
    match state {
        None | Some(Initial) if pending => {
            status["state"] = json!(Initial);
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
        Some(Initial) if first_boot.is_some() && !claimed => {
            status["state"] = json!(Discovery);
        }
        None if first_boot.is_some() => {
            status["state"] = json!(Initial);
        }
        None => {
            status["state"] = json!(Initial);
            set_condition(
                &mut status,
                "Discovered",
                false,
                "AwaitingRegistration",
                "no first boot for this server (it names no BMC, or [discovery] first_boot is off); register the inventory with status.state Available",
            );
        }
        Some(Discovery) if first_boot.is_some() && !claimed => {
            let fb = first_boot.unwrap();
            let task = &super::firstboot::DISCOVERY;
            step = Some((
                super::firstboot::step(c, (task, fb), (&s, &sv), &mut status).await?,
                task,
            ));
        }
        Some(Available) if claimed => {
            status["state"] = json!(Reserved);
        }
        Some(Reserved) if !claimed => match wipe_policy(c, &sv) {
            Some(p) => {
                let base = super::cleanup::begin(c, &sv, p, &mut status).await?;
                let st = super::firstboot::Step {
                    next: Next::Done,
                    attempt: None,
                    base: Some(base),
                };
                step = Some((st, &super::cleanup::CLEANUP));
            }
            None => release(c, (&s, &sv), &mut status, power.as_ref())?,
        },
        Some(Cleanup) if !claimed && c.cleanup.is_some() => {
            let cl = c.cleanup.as_ref().unwrap();
            step = Some((
                super::cleanup::step(c, cl, (&s, &sv), &mut status).await?,
                &super::cleanup::CLEANUP,
            ));
        }
        Some(Reserved) => drive_reserved(c, (&s, &sv), &mut status, power.as_ref())?,
        _ => {
            // Available without claim, Released, Error, Parked, Initial: an unclaimed
            // server is kept powered as its spec says only when it asks for Off.
            if !claimed && sv.spec.power == Some(PowerState::Off) && power == Some(PowerState::On) {
                apply_power(c, &s, &mut status, Power::Off);
            }
        }
    }
    // A discovery boot records its attempt before the driver acts (so a retried
    // reconcile never boots twice): the status goes onto that newer version.
    let base = step
        .as_ref()
        .and_then(|(st, _)| st.base.clone())
        .unwrap_or_else(|| s.clone());
    if Some(&status) != base.get("status") {
        c.store
            .update_status(&c.t_server, &base, status.clone())
            .await?;
        c.events
            .status_change(&c.t_server, &base, base.get("status"), &status);
    }
    match step {
        Some((step, task)) => {
            super::firstboot::finish(c, task, &sv, &step).await?;
            Ok(step.next)
        }
        None => Ok(Next::Done),
    }
}

/// The agent's policy for releasing `sv` from its claim: `None` keeps today's release
/// (power off, then `Available` or `Released`): `reclaimPolicy: Retain` (the data stays
/// for its owner), no `[cleanup]`, or a policy of `none`.
fn wipe_policy(c: &Controllers, sv: &Server) -> Option<bootplane_probe::Policy> {
    if sv.spec.reclaim_policy == Some(ReclaimPolicy::Retain) {
        return None;
    }
    c.cleanup.as_ref()?.policy_for(sv).agent()
}

/// The condition of a discovered Server saying whether an operator approved it
/// ([`super::APPROVAL_LABEL`]).
pub(crate) const APPROVED: &str = "Approved";

pub use crate::model::wire::RESET_ANNOTATION;

/// Write the generation annotation `v` onto `s` (optimistic: a newer version of the
/// Server makes the write fail and the reconcile run again).
async fn set_boot_generation(
    c: &Controllers,
    s: &Value,
    v: &str,
) -> Result<std::sync::Arc<Value>, StoreError> {
    let sv: Server = read(s);
    let patch = json!({"metadata": {
        "resourceVersion": sv.metadata.resource_version,
        "annotations": {BOOT_GENERATION_ANNOTATION: v},
    }});
    c.store
        .patch(&c.t_server, None, &sv.metadata.name, &patch, Part::Main)
        .await
}

async fn reset(c: &Controllers, s: &std::sync::Arc<Value>, name: &str) -> Result<Next, StoreError> {
    // The new boot's generation is in the store before the driver starts the machine:
    // tokens minted from here on are for the boot that follows, the earlier ones die.
    let s = &set_boot_generation(c, s, &generation_before_reset(&read(s))).await?;
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
fn release(
    c: &Controllers,
    (s, sv): (&Value, &Server),
    status: &mut Value,
    power: Option<&PowerState>,
) -> Result<(), StoreError> {
    if power != Some(&PowerState::Off) {
        apply_power(c, s, status, Power::Off);
    }
    // The power as written just now (by apply_power) or as it was.
    if status.get("powerState").and_then(Value::as_str) == Some(PowerState::Off.as_str()) {
        status["state"] = json!(match sv.spec.reclaim_policy {
            Some(ReclaimPolicy::Retain) => ServerState::Released,
            _ => ServerState::Available,
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
    (s, sv): (&Value, &Server),
    status: &mut Value,
    power: Option<&PowerState>,
) -> Result<(), StoreError> {
    let (ns, bn) = boot_configuration_of(sv);
    let sbc_state = (c.store.get(&c.t_sbc, Some(ns), bn).ok())
        .and_then(|b| read::<ServerBootConfiguration>(&b).status.state);
    if let Some(want) = reserved_conditions(sv, status, sbc_state.as_ref(), power) {
        apply_power(c, s, status, want);
    }
    Ok(())
}

/// The namespace and name of the claimed server's boot configuration.
fn boot_configuration_of(sv: &Server) -> (&str, &str) {
    sv.spec
        .boot_configuration_ref
        .as_ref()
        .map_or(("default", ""), |r| {
            (r.namespace.as_deref().unwrap_or("default"), r.name.as_str())
        })
}

/// The conditions of a claimed server whose boot configuration is in `sbc_state`, set
/// in `status`; the power to apply, when the server is not powered as it should be
/// (the caller applies it, which sets `PowerReady`).
fn reserved_conditions(
    sv: &Server,
    status: &mut Value,
    sbc_state: Option<&BootConfigurationState>,
    power: Option<&PowerState>,
) -> Option<Power> {
    let (ns, bn) = boot_configuration_of(sv);
    let want = Power::parse(sv.spec.power.as_ref().map_or("Off", PowerState::as_str))
        .unwrap_or(Power::Off);
    let power = power.map_or("", PowerState::as_str);
    match sbc_state {
        Some(BootConfigurationState::Ready) => {
            set_condition(
                status,
                "BootConfigurationReady",
                true,
                "Ready",
                &format!("ServerBootConfiguration {ns}/{bn} is Ready"),
            );
            if power != want.as_str() {
                return Some(want);
            }
            set_condition(
                status,
                "PowerReady",
                true,
                "InState",
                &format!("server is powered {}", want.as_str()),
            );
        }
        other => {
            set_condition(
                status,
                "BootConfigurationReady",
                false,
                "Waiting",
                &format!(
                    "waiting for ServerBootConfiguration {ns}/{bn} to become Ready (now {})",
                    other.map_or("absent", BootConfigurationState::as_str)
                ),
            );
            if want == Power::Off && power != "Off" {
                return Some(Power::Off);
            }
        }
    }
    None
}

/// The status an Available server takes when a claim binds it (`sv`, its spec already
/// naming the claim and boot configuration) and its boot configuration is in
/// `sbc_state`: what this reconciler would write over its next two passes, so the
/// binding can write it at once. `None` when the server must be powered first (the
/// reconciler does that, through its driver).
pub(crate) fn status_when_bound(
    s: &Value,
    sv: &Server,
    sbc_state: Option<&BootConfigurationState>,
) -> Option<Value> {
    if sv.status.state != Some(ServerState::Available) || super::awaiting_approval(sv) {
        return None;
    }
    let mut status = s.get("status").cloned().unwrap_or_else(|| json!({}));
    status["state"] = json!(ServerState::Reserved);
    match reserved_conditions(sv, &mut status, sbc_state, sv.status.power_state.as_ref()) {
        Some(_) => None,
        None => Some(status),
    }
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
