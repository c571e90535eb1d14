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
//! - annotation `bootplane.dev/reset-requested` → the power driver's reset, once;
//! - the boot generation (annotation `bootplane.dev/boot-generation`, [`boot_generation`])
//!   moves on before every reset and once each time the server is seen powered off:
//!   signed boot tokens are bound to it, so a token minted in one boot of the machine
//!   is refused after bootplane power-cycled it.

use serde_json::{json, Value};

use super::{claim_ref, set_condition, Controllers, Next};
use crate::model::views::{
    condition, read, BootConfigurationState, ConditionStatus, PowerState, ReclaimPolicy, Server,
    ServerBootConfiguration, ServerState,
};
use crate::power::{Outcome, Power};
use crate::store::{Part, StoreError};

pub async fn reconcile(c: &Controllers, name: &str) -> Result<Next, StoreError> {
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
            step = Some(super::firstboot::step(c, fb, (&s, &sv), &mut status).await?);
        }
        Some(Available) if claimed => {
            status["state"] = json!(Reserved);
        }
        Some(Reserved) if !claimed => release(c, (&s, &sv), &mut status, power.as_ref())?,
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
            super::firstboot::finish(c, &sv, &step).await?;
            Ok(step.next)
        }
        None => Ok(Next::Done),
    }
}

/// The condition of a discovered Server saying whether an operator approved it
/// ([`super::APPROVAL_LABEL`]).
pub const APPROVED: &str = "Approved";

pub use crate::model::wire::RESET_ANNOTATION;

/// Annotation holding the server's boot generation: `N` (a count of the boots
/// bootplane ended or restarted), `N-off` once the current power-off is counted. Written
/// by this reconciler only (the `agent` role cannot write Servers); the boot index folds
/// `N` into the boot id signed tokens are bound to.
pub const BOOT_GENERATION_ANNOTATION: &str = "bootplane.dev/boot-generation";

/// The suffix of a generation whose power-off is counted already.
const SEALED_OFF: &str = "-off";

/// `server`'s boot generation and whether its current power-off is counted in it.
pub fn boot_generation(server: &Server) -> (u64, bool) {
    let v =
        (server.metadata.annotations.get(BOOT_GENERATION_ANNOTATION)).map_or("0", String::as_str);
    let (n, off) = match v.strip_suffix(SEALED_OFF) {
        Some(n) => (n, true),
        None => (v, false),
    };
    (n.parse().unwrap_or(0), off)
}

/// The generation annotation `server` needs for its recorded power state, when it
/// differs from the one it has: a power-off seen is counted once (sealed with
/// [`SEALED_OFF`]), a power-on after it unseals.
pub fn generation_after_power(server: &Server) -> Option<String> {
    let (n, off) = boot_generation(server);
    let recorded = (server.metadata.annotations).contains_key(BOOT_GENERATION_ANNOTATION);
    match server.status.power_state {
        // Off and never counted: no boot bootplane saw has ended (a reset always writes
        // the annotation first), so a Server registered powered off costs no write.
        Some(PowerState::Off) if !recorded => None,
        // On and never counted: record generation 0, so the power-off that ends this
        // boot is counted.
        Some(PowerState::On) if !recorded => Some("0".to_string()),
        Some(PowerState::Off) if !off => Some(format!("{}{SEALED_OFF}", n.saturating_add(1))),
        Some(PowerState::On) if off => Some(n.to_string()),
        _ => None,
    }
}

/// The generation annotation before a reset of `server` is handed to the driver: the
/// next one, unsealed (the server is on afterwards).
pub fn generation_before_reset(server: &Server) -> String {
    boot_generation(server).0.saturating_add(1).to_string()
}

/// The boot id of Server `server` claimed with boot configuration `sbc`:
/// `<sbc uid>/<sbc generation>/<boot generation>` ([`boot_generation`]).
pub fn claimed_boot_id(server: &Server, sbc: &ServerBootConfiguration) -> String {
    format!("{}/{}", sbc.boot_id(), boot_generation(server).0)
}

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
    let (ns, bn) = sv
        .spec
        .boot_configuration_ref
        .as_ref()
        .map_or(("default", ""), |r| {
            (r.namespace.as_deref().unwrap_or("default"), r.name.as_str())
        });
    let sbc_state = (c.store.get(&c.t_sbc, Some(ns), bn).ok())
        .and_then(|b| read::<ServerBootConfiguration>(&b).status.state);
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
                    other
                        .as_ref()
                        .map_or("absent", BootConfigurationState::as_str)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn server(generation: Option<&str>, power: &str) -> Server {
        let mut s = json!({"metadata": {"name": "a"}, "status": {"powerState": power}});
        if let Some(g) = generation {
            s["metadata"]["annotations"] = json!({BOOT_GENERATION_ANNOTATION: g});
        }
        read(&s)
    }

    #[test]
    fn a_power_off_is_counted_once_and_a_reset_always() {
        // Never counted, on: generation 0 is recorded (once), so its power-off counts.
        assert_eq!(boot_generation(&server(None, "On")), (0, false));
        assert_eq!(
            generation_after_power(&server(None, "On")).as_deref(),
            Some("0")
        );
        assert_eq!(generation_after_power(&server(Some("0"), "On")), None);
        // Registered powered off: nothing to count, no write.
        assert_eq!(generation_after_power(&server(None, "Off")), None);
        // Seen off after a boot: the next generation, sealed; seen off again: nothing more.
        let v = generation_after_power(&server(Some("0"), "Off")).unwrap();
        assert_eq!(v, "1-off");
        assert_eq!(boot_generation(&server(Some(&v), "Off")), (1, true));
        assert_eq!(generation_after_power(&server(Some(&v), "Off")), None);
        // On again: unsealed, same generation (the boot it starts is the one counted).
        let v = generation_after_power(&server(Some(&v), "On")).unwrap();
        assert_eq!(v, "1");
        assert_eq!(generation_after_power(&server(Some(&v), "On")), None);
        // The next power-off counts again.
        assert_eq!(
            generation_after_power(&server(Some(&v), "Off")).as_deref(),
            Some("2-off")
        );
        // Other states (unknown, paused) change nothing.
        assert_eq!(
            generation_after_power(&server(Some("3-off"), "Paused")),
            None
        );
        assert_eq!(generation_after_power(&server(Some("3"), "")), None);
        // A reset always moves on, whether the server was on or off.
        assert_eq!(generation_before_reset(&server(Some("3"), "On")), "4");
        assert_eq!(generation_before_reset(&server(Some("3-off"), "Off")), "4");
        assert_eq!(generation_before_reset(&server(None, "On")), "1");
        // A value that is not a generation counts as none.
        assert_eq!(boot_generation(&server(Some("x"), "On")), (0, false));
    }

    #[test]
    fn the_boot_id_moves_with_the_claim_its_configuration_and_the_generation() {
        let sbc = json!({"metadata": {"uid": "u-1", "generation": 2}});
        let id = |g: Option<&str>, sbc: &Value| claimed_boot_id(&server(g, "On"), &read(sbc));
        assert_eq!(id(None, &sbc), "u-1/2/0");
        assert_eq!(id(Some("4-off"), &sbc), "u-1/2/4");
        assert_ne!(id(Some("5"), &sbc), id(Some("4"), &sbc));
        let other = json!({"metadata": {"uid": "u-2", "generation": 2}});
        assert_ne!(id(Some("4"), &other), id(Some("4"), &sbc));
    }
}
