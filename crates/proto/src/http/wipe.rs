//! The cleanup side of the boot listener: the script of a Server in `Cleanup` (the agent
//! image with the wipe policy and a signed report URL) and `POST /discovery/wipe/<server>
//! [/<token>]`, where the agent (`bootplane probe wipe`, docs/wipe.md) reports what it
//! wiped and verified.
//!
//! The same identity rules as the inventory ([`super::discovery`]): the machine's own
//! address, or a valid token of purpose `wipe` minted into that Server's cleanup script
//! for its current cleanup boot. Then, in order: the Server must be in `Cleanup` (409),
//! the body must be JSON of the agent's [`WipeReport`] shape (400) within
//! [`super::discovery::MAX_INVENTORY_BYTES`] (413, before anything is read), every value
//! within bounds ([`check`], 422), its policy the one the Server was booted for and its
//! system UUID the Server's (409). Only then is it queued for the controller that writes
//! the Server's `Cleaned` condition (202). A report that says a disk failed is accepted
//! like any other: the controller turns it into `Error`, never `Available`. Each outcome
//! is counted (`bootplane_http_discovery_wipe_total`).

use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::StatusCode;

use super::discovery::{text_ok, AgentRoute};
use super::respond::{bad_request, text, Resp, WIPE_PREFIX};
use super::token::Purpose;
use super::{AgentReport, BootFiles, BootHttp, BootState, MachineBoot, Report};
use crate::ipxe::CleanupScript;
use crate::model::ident::parse_uuid;
use crate::sys::unix_now;
use bootplane_probe::{Policy, WipeReport};

/// Most disks one report may list.
const MAX_DISKS: usize = 256;
/// Most notes per disk.
const MAX_NOTES: usize = 32;
/// Longest device path, serial or note.
const MAX_TEXT: usize = 256;
/// Longest error message.
const MAX_ERROR: usize = 1024;

/// Why a wipe report is refused (the 422's message).
pub fn check(r: &WipeReport) -> Result<(), String> {
    if r.action != "wipe" {
        return Err(format!("action: {:?}, expected \"wipe\"", r.action));
    }
    text_ok("error", r.error.as_deref(), MAX_ERROR)?;
    if r.disks.len() > MAX_DISKS {
        return Err(format!(
            "disks: {} entries, at most {MAX_DISKS}",
            r.disks.len()
        ));
    }
    for (i, d) in r.disks.iter().enumerate() {
        if d.device.is_empty() {
            return Err(format!("disks[{i}].device: must not be empty"));
        }
        text_ok(&format!("disks[{i}].device"), Some(&d.device), MAX_TEXT)?;
        text_ok(&format!("disks[{i}].serial"), d.serial.as_deref(), MAX_TEXT)?;
        text_ok(&format!("disks[{i}].error"), d.error.as_deref(), MAX_ERROR)?;
        if d.notes.len() > MAX_NOTES {
            return Err(format!(
                "disks[{i}].notes: {} entries, at most {MAX_NOTES}",
                d.notes.len()
            ));
        }
        for (j, n) in d.notes.iter().enumerate() {
            text_ok(&format!("disks[{i}].notes[{j}]"), Some(n), MAX_TEXT)?;
        }
        if !d.seconds.is_finite() || d.seconds < 0.0 {
            return Err(format!("disks[{i}].seconds: not a duration"));
        }
        if d.verified && d.error.is_some() {
            return Err(format!("disks[{i}]: verified and failed at once"));
        }
    }
    // A run that says it succeeded must have verified every disk it names.
    if r.ok && (r.error.is_some() || r.disks.iter().any(|d| !d.verified)) {
        return Err("ok is true but a disk is not verified or the run failed".into());
    }
    Ok(())
}

impl BootHttp {
    /// The cleanup script of `m` (a Server in `Cleanup` booting the agent image `files`),
    /// with a fresh signed wipe report URL.
    pub(super) fn cleanup_script(
        &self,
        m: &MachineBoot,
        files: &BootFiles,
        policy: Policy,
    ) -> Result<Bytes, crate::ipxe::RenderError> {
        let token = self.signer.mint(
            Purpose::Wipe,
            &m.server,
            &m.boot_id,
            unix_now(),
            self.token_ttl,
        );
        let url = format!("{}{WIPE_PREFIX}{}/{}", self.base_url, m.server, token);
        let d = CleanupScript {
            server: &m.server,
            image: &files.image,
            kernel_url: &files.kernel_url,
            initrd_url: &files.initrd_url,
            cmdline: &files.cmdline,
            wipe_url: &url,
            policy: policy.as_str(),
            console: &self.console,
            base_url: &self.base_url,
        };
        Ok(Bytes::from(self.renderer.cleanup_script(&d)?))
    }

    /// `POST /discovery/wipe/<rest>` with `body`.
    pub(super) fn wipe_report(
        &self,
        rest: &str,
        body: &Bytes,
        client: IpAddr,
        server_out: &mut Option<Arc<MachineBoot>>,
    ) -> Resp {
        let m = match self.admit(AgentRoute::Wipe, rest, client, server_out) {
            Ok(m) => m,
            Err(resp) => return *resp,
        };
        let BootState::Cleanup(policy) = m.state else {
            self.count_wipe("conflict");
            return text(
                StatusCode::CONFLICT,
                &format!("server {} is not in Cleanup\n", m.server),
            );
        };
        let report: WipeReport = match serde_json::from_slice(body) {
            Ok(r) => r,
            Err(e) => {
                self.count_wipe("malformed");
                return bad_request(&format!("wipe report: {e}"));
            }
        };
        if let Err(why) = check(&report) {
            self.count_wipe("invalid");
            return text(
                StatusCode::UNPROCESSABLE_ENTITY,
                &format!("wipe report: {why}\n"),
            );
        }
        if report.policy != policy {
            self.count_wipe("conflict");
            return text(
                StatusCode::CONFLICT,
                &format!(
                    "wipe report: policy {} but server {} was booted to wipe by {}\n",
                    report.policy.as_str(),
                    m.server,
                    policy.as_str()
                ),
            );
        }
        if let Some(u) = &m.uuid {
            let reported = parse_uuid(&report.system_uuid).unwrap_or_default();
            if *u != reported {
                self.count_wipe("conflict");
                tracing::warn!(server = %m.server, client = %client, reported, expected = %u, "wipe report of another system refused");
                return text(
                    StatusCode::CONFLICT,
                    &format!(
                        "wipe report: systemUUID {:?} is not server {}'s ({u})\n",
                        report.system_uuid, m.server
                    ),
                );
            }
        }
        let report = AgentReport {
            server: m.server.clone(),
            boot_id: m.boot_id.clone(),
            client,
            report: Report::Wipe(report),
        };
        self.queue(AgentRoute::Wipe, report)
    }

    fn count_wipe(&self, result: &'static str) {
        self.count_agent(AgentRoute::Wipe, result);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bootplane_probe::{DiskWipe, Method};

    fn good() -> WipeReport {
        let mut d = DiskWipe::new("/dev/vda".into());
        d.size_bytes = 1 << 30;
        d.method = Some(Method::ZeroRanges);
        d.verified = true;
        WipeReport {
            action: "wipe".into(),
            policy: Policy::Metadata,
            ok: true,
            system_uuid: "5A2C0000-0000-4000-8000-000000000001".into(),
            disks: vec![d],
            error: None,
        }
    }

    #[test]
    fn checks_bounds_and_consistency() {
        assert_eq!(check(&good()), Ok(()));
        let mut r = good();
        r.action = "install".into();
        assert!(check(&r).unwrap_err().starts_with("action"));
        let mut r = good();
        r.disks = vec![r.disks[0].clone(); MAX_DISKS + 1];
        assert!(check(&r).unwrap_err().contains("at most 256"));
        let mut r = good();
        r.disks[0].device = String::new();
        assert!(check(&r).unwrap_err().contains("must not be empty"));
        let mut r = good();
        r.disks[0].serial = Some("a\nb".into());
        assert!(check(&r).unwrap_err().contains("control character"));
        let mut r = good();
        r.disks[0].notes = vec!["n".into(); MAX_NOTES + 1];
        assert!(check(&r).unwrap_err().contains("notes"));
        let mut r = good();
        r.disks[0].seconds = f64::NAN;
        assert!(check(&r).unwrap_err().contains("seconds"));
        // ok must agree with the disks.
        let mut r = good();
        r.disks[0].verified = false;
        assert!(check(&r).unwrap_err().contains("ok is true"));
        let mut r = good();
        r.disks[0].verified = false;
        r.disks[0].error = Some("device is read-only".into());
        r.ok = false;
        assert_eq!(check(&r), Ok(()));
        let mut r = good();
        r.disks[0].error = Some("x".into());
        assert!(check(&r).unwrap_err().contains("verified and failed"));
    }

    #[test]
    fn only_posts_to_the_agent_routes_take_a_body() {
        use super::super::discovery::takes_body;
        assert!(takes_body(&http::Method::POST, "/discovery/wipe/s1/t"));
        assert!(!takes_body(&http::Method::GET, "/discovery/wipe/s1/t"));
    }
}
