//! Cleanup (metal-operator's designed `Cleanup` state): a Server released from its claim
//! has its disks wiped by bootplane's agent before it is `Available` to the next tenant.
//!
//! ```toml
//! [cleanup]
//! policy = "metadata"        # none | metadata | full (unset: metadata when [discovery]
//!                            # boots Servers into the agent image, else none)
//! image = ""                 # the agent image (default: discovery.image)
//! report_timeout_secs = 3600 # per boot, until the agent's wipe report arrives
//! attempts = 2               # boots before the Server goes to Error
//! retry_backoff_secs = 60    # off this long before the next boot (doubling)
//! ```
//!
//! - The policy of one release is the stronger of the Server's (annotation
//!   [`POLICY_ANNOTATION`] on the Server, else `[cleanup] policy`) and the claim's (the
//!   same annotation on the ServerClaim, carried onto the Server as
//!   [`CLAIM_POLICY_ANNOTATION`] when the claim lets go of it): a tenant may ask for more
//!   than the provider's policy, never less. `reclaimPolicy: Retain` keeps the data
//!   for its owner (`Released`, no wipe).
//! - `Reserved` without a claim and a policy other than `none` → `Cleanup`: the policy
//!   is recorded ([`WIPE_POLICY_ANNOTATION`], the boot side serves it) and `Cleaned` is
//!   False (`Pending`); then an agent boot ([`super::firstboot`], the cleanup script with
//!   a signed wipe report URL, [`crate::http::wipe`]).
//! - The agent's report ([`write`]): every disk wiped and verified → `Cleaned` True
//!   (`Verified`), then powered off and `Available`; a disk that failed or could not be
//!   verified → `Cleaned` False (`WipeFailed`, naming the disk and why) and `Error`,
//!   powered off, never `Available`. No report after `attempts` boots → `Error`
//!   (`WipeTimeout`). What the agent did is kept in [`LAST_WIPE_ANNOTATION`].
//! - A Server in `Error` after a cleanup goes through `Cleanup` again when an operator
//!   sets its state back (`bootplane.dev/cleanup-attempt` removed).
//!
//! **Invariant:** a released Server whose policy is not `none` reaches `Available` only
//! through a wipe report that says every disk was wiped and read back.

use std::time::Duration;

use bootplane_probe::{Policy, WipeReport};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::firstboot::{FirstBoot, Step, Task};
use super::{set_condition, Controllers};
use crate::http::AgentReport;
use crate::model::registry::ResourceType;
use crate::model::views::{condition, read, ConditionStatus, Server, ServerState};
use crate::store::{Modified, Part, Store, StoreError};

/// The condition a cleanup sets.
pub(crate) const CLEANED: &str = "Cleaned";
/// On a Server: its wipe policy (`none`, `metadata`, `full`); on a ServerClaim: the
/// policy its tenant asks for at release.
pub const POLICY_ANNOTATION: &str = "bootplane.dev/cleanup-policy";
/// On a Server: the policy its last claim asked for (written when the claim let go).
pub const CLAIM_POLICY_ANNOTATION: &str = "bootplane.dev/claim-cleanup-policy";
/// On a Server in `Cleanup`: the policy this cleanup wipes by.
pub const WIPE_POLICY_ANNOTATION: &str = "bootplane.dev/wipe-policy";
/// On a Server: what the last wipe did (its report's disks, as JSON).
pub const LAST_WIPE_ANNOTATION: &str = "bootplane.dev/last-wipe";
/// The cleanup boot in progress (`"<attempt> <unix start>"`).
pub(crate) const ATTEMPT_ANNOTATION: &str = "bootplane.dev/cleanup-attempt";

/// Cleanup's agent boot.
pub(crate) const CLEANUP: Task = Task {
    annotation: ATTEMPT_ANNOTATION,
    condition: CLEANED,
    what: "cleanup",
    report: "wipe report",
    timeout_reason: "WipeTimeout",
    gave_up: Some(ServerState::Error),
};

/// `[cleanup] policy`: what a released Server's disks get.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WipePolicy {
    None,
    Metadata,
    Full,
}

impl WipePolicy {
    pub fn parse(s: &str) -> Option<WipePolicy> {
        match s {
            "none" => Some(WipePolicy::None),
            "metadata" => Some(WipePolicy::Metadata),
            "full" => Some(WipePolicy::Full),
            _ => None,
        }
    }

    /// The agent's policy (`None` for no wipe).
    pub fn agent(self) -> Option<Policy> {
        match self {
            WipePolicy::None => None,
            WipePolicy::Metadata => Some(Policy::Metadata),
            WipePolicy::Full => Some(Policy::Full),
        }
    }
}

/// `[cleanup]` as written.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct CleanupConfig {
    /// Unset: `metadata` when `[discovery]` boots Servers into the agent image, else `none`.
    pub policy: Option<WipePolicy>,
    /// The agent image's catalog reference; empty: `discovery.image`.
    pub image: String,
    pub report_timeout_secs: u64,
    pub attempts: u32,
    pub retry_backoff_secs: u64,
}

impl Default for CleanupConfig {
    fn default() -> Self {
        CleanupConfig {
            policy: None,
            image: String::new(),
            report_timeout_secs: 3600,
            attempts: 2,
            retry_backoff_secs: 60,
        }
    }
}

impl CleanupConfig {
    /// Refuse values that cannot work.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.report_timeout_secs == 0 || self.attempts == 0 {
            anyhow::bail!("cleanup: report_timeout_secs and attempts must be at least 1");
        }
        Ok(())
    }
}

/// What the Server reconciler needs of `[cleanup]`.
#[derive(Debug, Clone)]
pub struct Cleanup {
    /// The policy of a Server that names none.
    pub default: WipePolicy,
    pub timing: FirstBoot,
}

impl Cleanup {
    /// `[cleanup]` with `[discovery]` (the agent image and whether first boots run).
    pub fn from_config(c: &CleanupConfig, d: &super::discovery::DiscoveryConfig) -> Cleanup {
        Cleanup {
            default: c.policy.unwrap_or(if d.enabled && d.first_boot {
                WipePolicy::Metadata
            } else {
                WipePolicy::None
            }),
            timing: FirstBoot {
                report_timeout: Duration::from_secs(c.report_timeout_secs),
                attempts: c.attempts,
                retry_backoff: Duration::from_secs(c.retry_backoff_secs),
            },
        }
    }

    /// The agent image's catalog reference: `[cleanup] image`, else the discovery image.
    pub fn agent_image<'a>(
        c: &'a CleanupConfig,
        d: &'a super::discovery::DiscoveryConfig,
    ) -> &'a str {
        if c.image.is_empty() {
            &d.image
        } else {
            &c.image
        }
    }

    /// The policy a release of `sv` wipes by.
    pub fn policy_for(&self, sv: &Server) -> WipePolicy {
        let a = &sv.metadata.annotations;
        let own = a
            .get(POLICY_ANNOTATION)
            .and_then(|p| WipePolicy::parse(p))
            .unwrap_or(self.default);
        let claim = a
            .get(CLAIM_POLICY_ANNOTATION)
            .and_then(|p| WipePolicy::parse(p))
            .unwrap_or(WipePolicy::None);
        own.max(claim)
    }
}

/// The policy a Server in `Cleanup` is wiped by (the boot side serves it).
pub fn wipe_policy(sv: &Server) -> Policy {
    sv.metadata
        .annotations
        .get(WIPE_POLICY_ANNOTATION)
        .and_then(|p| Policy::parse(p))
        .unwrap_or(Policy::Metadata)
}

/// The `boot_id` of a Server's cleanup boot: its uid and its boot generation.
pub fn boot_id(server: &Value) -> String {
    format!(
        "cleanup/{}/{}",
        crate::model::meta::uid(server),
        super::powerstate::boot_generation(&read(server)).0
    )
}

/// Start the cleanup of a released Server `s` by `policy`: record the policy (and drop
/// the claim's, now applied) pinned to `s`'s version, then `Cleanup` with `Cleaned`
/// pending. Returns the version the status goes onto.
pub(crate) async fn begin(
    c: &Controllers,
    sv: &Server,
    policy: Policy,
    status: &mut Value,
) -> Result<std::sync::Arc<Value>, StoreError> {
    let patch = json!({"metadata": {
        "resourceVersion": sv.metadata.resource_version,
        "annotations": {
            WIPE_POLICY_ANNOTATION: policy.as_str(),
            CLAIM_POLICY_ANNOTATION: null,
            ATTEMPT_ANNOTATION: null,
        },
    }});
    let base = c
        .store
        .patch(&c.t_server, None, &sv.metadata.name, &patch, Part::Main)
        .await?;
    status["state"] = json!(ServerState::Cleanup);
    set_condition(
        status,
        CLEANED,
        false,
        "Pending",
        &format!(
            "released from its claim: its disks are wiped ({}) before it is Available",
            policy.as_str()
        ),
    );
    if let Some(l) = status.get_mut("conditions").and_then(Value::as_array_mut) {
        l.retain(|c| c.get("type").and_then(Value::as_str) != Some("BootConfigurationReady"));
    }
    Ok(base)
}

/// One step of `Cleanup` for `s`: a failed wipe → powered off and `Error`; else the agent
/// boot's step (report → off → `Available`; no report → `Error`).
pub(crate) async fn step(
    c: &Controllers,
    cl: &Cleanup,
    (s, sv): (&Value, &Server),
    status: &mut Value,
) -> Result<Step, StoreError> {
    let failed = condition(&sv.status.conditions, CLEANED)
        .is_some_and(|k| k.status == ConditionStatus::False && k.reason == "WipeFailed");
    if failed {
        if sv.status.power_state != Some(crate::model::views::PowerState::Off) {
            super::firstboot::power_off(c, &CLEANUP, s, status);
        }
        status["state"] = json!(ServerState::Error);
        return Ok(Step {
            next: super::Next::Done,
            attempt: Some(None),
            base: None,
        });
    }
    super::firstboot::step(c, (&CLEANUP, &cl.timing), (s, sv), status).await
}

/// Write a wipe report onto its Server (for the cleanup boot under way; any other is
/// dropped): `Cleaned` True when every disk was wiped and verified, else False
/// (`WipeFailed`) with the first failure; the disks' outcome in [`LAST_WIPE_ANNOTATION`].
pub(crate) async fn write(
    store: &Store,
    t: &ResourceType,
    r: &AgentReport,
    w: &WipeReport,
    events: &crate::store::events::Recorder,
) -> Result<(), StoreError> {
    let current = |s: &Value| {
        read::<Server>(s).status.state == Some(ServerState::Cleanup) && boot_id(s) == r.boot_id
    };
    let over =
        || tracing::info!(server = %r.server, "wipe report for a boot that is over, dropped");
    let s = store.get(t, None, &r.server)?;
    if !current(&s) {
        over();
        return Ok(());
    }
    let summary = json!({
        "policy": w.policy.as_str(),
        "ok": w.ok,
        "disks": w.disks.iter().map(|d| json!({
            "device": d.device,
            "sizeBytes": d.size_bytes,
            "method": d.method,
            "bytesVerified": d.bytes_verified,
            "verified": d.verified,
            "error": d.error,
        })).collect::<Vec<_>>(),
    });
    let patch = json!({"metadata": {"annotations": {LAST_WIPE_ANNOTATION: summary.to_string()}}});
    store.patch(t, None, &r.server, &patch, Part::Main).await?;
    let (ok, reason, msg) = verdict(w, r);
    let mut dropped = false;
    let written = store
        .modify_status(t, None, &r.server, |s, st| {
            dropped = !current(s);
            if !dropped {
                set_condition(st, CLEANED, ok, reason, &msg);
            }
            !dropped
        })
        .await?;
    if dropped {
        over();
    }
    if let Modified::Written { before, after } = written {
        events.status_change(t, &before, before.get("status"), &after["status"]);
    }
    Ok(())
}

/// `Cleaned`'s status, reason and message for report `w`.
fn verdict(w: &WipeReport, r: &AgentReport) -> (bool, &'static str, String) {
    let verified: u64 = w.disks.iter().map(|d| d.bytes_verified).sum();
    if w.ok && !w.disks.is_empty() && w.disks.iter().all(|d| d.verified && d.error.is_none()) {
        return (
            true,
            "Verified",
            format!(
                "{} disk(s) wiped ({}) and read back ({} bytes verified), reported from {}",
                w.disks.len(),
                w.policy.as_str(),
                verified,
                r.client
            ),
        );
    }
    let why = if w.disks.is_empty() {
        w.error
            .clone()
            .unwrap_or_else(|| "the agent found no disk to wipe".into())
    } else {
        w.disks
            .iter()
            .find(|d| !d.verified || d.error.is_some())
            .map(|d| {
                format!(
                    "{}: {}",
                    d.device,
                    d.error.as_deref().unwrap_or("not verified")
                )
            })
            .or_else(|| w.error.clone())
            .unwrap_or_else(|| "the agent reported failure".into())
    };
    (
        false,
        "WipeFailed",
        format!(
            "wipe ({}) failed: {why}; the server stays out of Available until an operator looks",
            w.policy.as_str()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use bootplane_probe::{DiskWipe, Method};

    fn server(annotations: Value) -> Server {
        read(&json!({"metadata": {"name": "s", "annotations": annotations}}))
    }

    fn cleanup(default: WipePolicy) -> Cleanup {
        Cleanup {
            default,
            timing: FirstBoot {
                report_timeout: Duration::from_secs(60),
                attempts: 1,
                retry_backoff: Duration::from_secs(1),
            },
        }
    }

    #[test]
    fn the_stronger_of_the_servers_and_the_claims_policy_wins() {
        let c = cleanup(WipePolicy::Metadata);
        assert_eq!(c.policy_for(&server(json!({}))), WipePolicy::Metadata);
        assert_eq!(
            c.policy_for(&server(json!({POLICY_ANNOTATION: "none"}))),
            WipePolicy::None
        );
        assert_eq!(
            c.policy_for(&server(
                json!({POLICY_ANNOTATION: "none", CLAIM_POLICY_ANNOTATION: "full"})
            )),
            WipePolicy::Full
        );
        // A claim cannot lower it.
        assert_eq!(
            c.policy_for(&server(json!({CLAIM_POLICY_ANNOTATION: "none"}))),
            WipePolicy::Metadata
        );
        // Nonsense reads as unset.
        assert_eq!(
            c.policy_for(&server(json!({POLICY_ANNOTATION: "shred"}))),
            WipePolicy::Metadata
        );
        assert_eq!(
            cleanup(WipePolicy::None).policy_for(&server(json!({}))),
            WipePolicy::None
        );
    }

    #[test]
    fn the_default_follows_first_boots_unless_set() {
        let mut d = super::super::discovery::DiscoveryConfig::default();
        let c = CleanupConfig::default();
        assert_eq!(Cleanup::from_config(&c, &d).default, WipePolicy::None);
        d.enabled = true;
        assert_eq!(Cleanup::from_config(&c, &d).default, WipePolicy::Metadata);
        let c = CleanupConfig {
            policy: Some(WipePolicy::Full),
            ..CleanupConfig::default()
        };
        assert_eq!(Cleanup::from_config(&c, &d).default, WipePolicy::Full);
    }

    fn report(disks: Vec<DiskWipe>, ok: bool) -> (WipeReport, AgentReport) {
        let w = WipeReport {
            action: "wipe".into(),
            policy: Policy::Metadata,
            ok,
            system_uuid: String::new(),
            disks,
            error: None,
        };
        let r = AgentReport {
            server: "s".into(),
            boot_id: "b".into(),
            client: "10.0.0.5".parse().unwrap(),
            report: crate::http::Report::Wipe(w.clone()),
        };
        (w, r)
    }

    #[test]
    fn only_every_disk_verified_is_clean() {
        let mut a = DiskWipe::new("/dev/vda".into());
        a.method = Some(Method::ZeroRanges);
        a.verified = true;
        a.bytes_verified = 4 << 20;
        let (w, r) = report(vec![a.clone()], true);
        let (ok, reason, msg) = verdict(&w, &r);
        assert!(ok, "{msg}");
        assert_eq!(reason, "Verified");
        let mut b = DiskWipe::new("/dev/vdb".into());
        b.error = Some("device is read-only".into());
        let (w, r) = report(vec![a.clone(), b], false);
        let (ok, reason, msg) = verdict(&w, &r);
        assert!(!ok);
        assert_eq!(reason, "WipeFailed");
        assert!(msg.contains("/dev/vdb: device is read-only"), "{msg}");
        // ok with no disk is not clean.
        let (w, r) = report(vec![], true);
        assert!(!verdict(&w, &r).0);
        // ok claimed but a disk unverified is not clean.
        let mut c = a.clone();
        c.verified = false;
        let (w, r) = report(vec![c], true);
        assert!(!verdict(&w, &r).0);
    }
}
