//! Agent boots: a Server booted into bootplane's agent image (the discovery image) until
//! its agent reports. Two tasks use it: first boot (the metalprobe role, `Initial →
//! Discovery → Available`, the agent posts the inventory) and cleanup (`Reserved →
//! Cleanup → Available`, the agent wipes the disks and posts what it did,
//! [`super::cleanup`]).
//!
//! - No boot yet: boot it through the power driver (one-time network boot + power on, the
//!   driver's [`crate::power::PowerDriver::reset`]); the boot side serves the agent image
//!   with a signed report URL. The attempt and its start are kept in the task's
//!   annotation ([`Task::annotation`], `"<n> <unix start>"`). A boot that has not
//!   reported within the report timeout is powered off, and the next one starts
//!   `retry_backoff × 2^(n-1)` later; after `attempts` boots the Server is left powered
//!   off with the task's condition False, reason [`Task::timeout_reason`] (discovery
//!   stays in `Discovery`; cleanup goes to `Error`, never `Available`).
//! - The task's condition True (the report was written, [`super::inventory`] or
//!   [`super::cleanup`]): power off, then `Available`.
//!
//! Conditions: `Discovered` (False `Booting`/`Waiting`/`InventoryTimeout`, True
//! `InventoryReported`), `Cleaned` ([`super::cleanup`]); power through `PowerReady` as
//! everywhere else.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::powerstate::record_power;
use super::{set_condition, Controllers, Next};
use crate::model::views::ServerState;
use crate::model::views::{condition, ConditionStatus, PowerState, Server};
use crate::power::Power;
use crate::store::{Part, StoreError};
use crate::sys::unix_now;

/// Annotation holding the discovery boot in progress: `"<attempt> <unix start>"`.
pub(crate) const ATTEMPT_ANNOTATION: &str = "bootplane.dev/discovery-attempt";

/// What an agent boot is for: its annotation, its condition and how it is named.
pub(crate) struct Task {
    /// Holds the boot in progress (`"<attempt> <unix start>"`).
    pub annotation: &'static str,
    /// The condition the agent's report turns True.
    pub condition: &'static str,
    /// The boot's name in messages (`discovery`, `cleanup`).
    pub what: &'static str,
    /// What the agent sends (`inventory`, `wipe report`).
    pub report: &'static str,
    /// The condition's reason once every attempt timed out.
    pub timeout_reason: &'static str,
    /// The state then (`None`: stays where it is).
    pub gave_up: Option<ServerState>,
}

/// First boot: the agent posts the inventory.
pub(crate) const DISCOVERY: Task = Task {
    annotation: ATTEMPT_ANNOTATION,
    condition: super::inventory::DISCOVERED,
    what: "discovery",
    report: "inventory",
    timeout_reason: "InventoryTimeout",
    gave_up: None,
};

/// How agent boots are timed (`[discovery]` for first boots, `[cleanup]` for wipes).
#[derive(Debug, Clone)]
pub struct FirstBoot {
    pub report_timeout: Duration,
    pub attempts: u32,
    pub retry_backoff: Duration,
}

impl FirstBoot {
    pub fn from_config(c: &super::discovery::DiscoveryConfig) -> Option<FirstBoot> {
        (c.enabled && c.first_boot).then(|| FirstBoot {
            report_timeout: Duration::from_secs(c.report_timeout_secs),
            attempts: c.attempts,
            retry_backoff: Duration::from_secs(c.retry_backoff_secs),
        })
    }
}

/// Whether a Server takes part in first boots: it names a BMC.
pub(crate) fn has_bmc(s: &Server) -> bool {
    s.spec.bmc_ref.is_some() || s.spec.bmc.is_some()
}

/// Whether the task's report was written (its condition True).
fn reported(task: &Task, s: &Server) -> bool {
    condition(&s.status.conditions, task.condition)
        .is_some_and(|c| c.status == ConditionStatus::True)
}

/// `(attempt, started)` from the task's annotation.
fn attempt_of(task: &Task, s: &Server) -> Option<(u32, u64)> {
    let a = s.metadata.annotations.get(task.annotation)?;
    let (n, t) = a.split_once(' ')?;
    Some((n.parse().ok()?, t.parse().ok()?))
}

/// What [`step`] decided beyond the status: when to look again, and a new value for the
/// attempt annotation (`Some(None)`: remove it), written after the status.
pub(crate) struct Step {
    pub next: Next,
    pub attempt: Option<Option<String>>,
    /// The Server as stored after this step recorded a new attempt (before booting it):
    /// the status is written onto it.
    pub base: Option<Arc<Value>>,
}

impl Step {
    fn next(next: Next) -> Step {
        Step {
            next,
            attempt: None,
            base: None,
        }
    }
}

/// Record attempt `n` (started now) before its boot is asked for: a reconcile
/// retried after a failed status write then sees the attempt under way instead of
/// booting the machine a second time. Pinned to `s`'s resourceVersion: the status built
/// from `s` may only go onto the version right after it (a conflict retries the
/// reconcile, nothing booted yet).
async fn record_attempt(
    c: &Controllers,
    task: &Task,
    s: &Server,
    n: u32,
) -> Result<Arc<Value>, StoreError> {
    let patch = json!({"metadata": {
        "resourceVersion": s.metadata.resource_version,
        // An agent boot is a reset: a new boot generation (its report token and the
        // earlier attempts' die with the old one).
        "annotations": {
            task.annotation: format!("{n} {}", unix_now()),
            super::powerstate::BOOT_GENERATION_ANNOTATION: super::powerstate::generation_before_reset(s),
        },
    }});
    c.store
        .patch(&c.t_server, None, &s.metadata.name, &patch, Part::Main)
        .await
}

/// Write the attempt annotation [`step`] asked for.
pub(crate) async fn finish(
    c: &Controllers,
    task: &Task,
    s: &Server,
    step: &Step,
) -> Result<(), StoreError> {
    let Some(v) = &step.attempt else {
        return Ok(());
    };
    let patch = json!({"metadata": {"annotations": {task.annotation: v}}});
    c.store
        .patch(&c.t_server, None, &s.metadata.name, &patch, Part::Main)
        .await
        .map(|_| ())
}

/// One step of `task`'s agent boot for Server `s` (its status being built in `status`,
/// written by the caller onto [`Step::base`] or `s`, then [`finish`]).
pub(crate) async fn step(
    c: &Controllers,
    (task, fb): (&Task, &FirstBoot),
    (s, sv): (&Value, &Server),
    status: &mut Value,
) -> Result<Step, StoreError> {
    // `status` is still `sv`'s, but for the `Approved` condition.
    let off = sv.status.power_state == Some(PowerState::Off);
    if reported(task, sv) {
        if !off {
            power_off(c, task, s, status);
            return Ok(Step::next(Next::Done));
        }
        status["state"] = json!(ServerState::Available);
        return Ok(Step {
            next: Next::Done,
            attempt: attempt_of(task, sv).map(|_| None),
            base: None,
        });
    }
    let now = unix_now();
    let timeout = fb.report_timeout.as_secs();
    let what = task.what;
    match attempt_of(task, sv) {
        None => {
            // A fresh start: make sure it is off first, so the boot is a clean one.
            let base = record_attempt(c, task, sv, 1).await?;
            boot(c, task, &base, status, 1);
            Ok(Step {
                next: Next::After(fb.report_timeout),
                attempt: None,
                base: Some(base),
            })
        }
        Some((n, started)) if now < started + timeout => {
            let left = started + timeout - now;
            set_condition(
                status,
                task.condition,
                false,
                "Booting",
                &format!(
                    "{what} boot {n} of {}: waiting up to {left} s more for the agent's {}",
                    fb.attempts, task.report
                ),
            );
            Ok(Step::next(Next::After(Duration::from_secs(left + 1))))
        }
        Some((n, started)) if n >= fb.attempts => {
            if !off {
                power_off(c, task, s, status);
            }
            if let Some(st) = &task.gave_up {
                status["state"] = json!(st);
            }
            set_condition(
                status,
                task.condition,
                false,
                task.timeout_reason,
                &format!(
                    "no {} after {n} {what} boot(s) of {timeout} s each (the last began at unix {started}); check that the machine network-boots and reaches the boot listener, then remove annotation {} to try again",
                    task.report, task.annotation
                ),
            );
            Ok(Step::next(Next::Done))
        }
        Some((n, started)) => {
            let backoff = fb
                .retry_backoff
                .as_secs()
                .saturating_mul(1 << (n - 1).min(16));
            let next_at = started + timeout + backoff;
            if now < next_at {
                if !off {
                    power_off(c, task, s, status);
                }
                set_condition(
                    status,
                    task.condition,
                    false,
                    "Waiting",
                    &format!(
                        "{what} boot {n} of {} reported nothing within {timeout} s; boot {} in {} s",
                        fb.attempts,
                        n + 1,
                        next_at - now
                    ),
                );
                return Ok(Step::next(Next::After(Duration::from_secs(
                    next_at - now + 1,
                ))));
            }
            let base = record_attempt(c, task, sv, n + 1).await?;
            boot(c, task, &base, status, n + 1);
            Ok(Step {
                next: Next::After(fb.report_timeout),
                attempt: None,
                base: Some(base),
            })
        }
    }
}

/// Start agent boot `n`: the driver's reset (one-time network boot, then on or
/// restart).
fn boot(c: &Controllers, task: &Task, s: &Value, status: &mut Value, n: u32) {
    let driver = c.power.name_for(s);
    let msg = format!(
        "{} boot {n}: one-time network boot through the {driver} driver",
        task.what
    );
    set_condition(status, task.condition, false, "Booting", &msg);
    record_power(status, c.power.reset(s), "ResetFailed", |st| {
        st["powerState"] = json!("On");
        set_condition(st, "PowerReady", true, "Reset", &msg);
    });
}

pub(crate) fn power_off(c: &Controllers, task: &Task, s: &Value, status: &mut Value) {
    let msg = format!("powered off after {}", task.what);
    record_power(
        status,
        c.power.set_power(s, Power::Off),
        "DriverError",
        |st| {
            st["powerState"] = json!("Off");
            set_condition(st, "PowerReady", true, "Applied", &msg);
        },
    );
}
