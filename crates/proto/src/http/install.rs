//! The install side of the boot listener: the script of a claimed Server whose image is a
//! disk image not yet installed (the agent image with the disk image's URL, SHA-256 and
//! root-device hints, the claim's signed Ignition URL and a signed report URL), which the
//! agent (`bootplane probe install`, docs/install.md) follows, and `POST
//! /discovery/install/<server>[/<token>]`, where it reports.
//!
//! The same identity rules as the inventory ([`super::discovery`]): the machine's own
//! address, or a valid token of purpose `install` minted into its install script for the
//! current boot of its boot configuration. Then, in order: the Server must be installing
//! (409), the body must be JSON of the agent's [`InstallReport`] shape (400, at most
//! [`super::discovery::MAX_INVENTORY_BYTES`], 413 before anything is read), within bounds
//! and consistent ([`check`], 422), for the disk image it was booted for (its SHA-256,
//! 409) and from the Server's system (UUID, 409). Only then is it queued for the
//! controller that writes the boot configuration's `Installed` condition (202). Each
//! outcome is counted (`bootplane_http_discovery_install_total`).

use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::StatusCode;

use super::discovery::{text_ok, AgentRoute};
use super::respond::{bad_request, text, Resp, INSTALL_PREFIX};
use super::token::Purpose;
use super::{AgentReport, BootFiles, BootHttp, BootState, InstallPlan, MachineBoot, Report};
use crate::ipxe::InstallScript;
use crate::model::ident::parse_uuid;
use bootplane_probe::InstallReport;

/// Longest device, image, hint text or path in a report.
const MAX_TEXT: usize = 1024;
/// Most `chosenBy` entries.
const MAX_HINTS: usize = 16;

/// Why an install report is refused (the 422's message).
pub fn check(r: &InstallReport) -> Result<(), String> {
    if r.action != "install" {
        return Err(format!("action: {:?}, expected \"install\"", r.action));
    }
    let texts = [
        ("device", r.device.as_deref()),
        ("image", Some(r.image.as_str())),
        ("sha256", r.sha256.as_deref()),
        ("error", r.error.as_deref()),
        (
            "ignition.partition",
            r.ignition.as_ref().map(|i| i.partition.as_str()),
        ),
        (
            "ignition.foundBy",
            r.ignition.as_ref().map(|i| i.found_by.as_str()),
        ),
        (
            "ignition.path",
            r.ignition.as_ref().map(|i| i.path.as_str()),
        ),
    ];
    for (f, v) in texts {
        text_ok(f, v, MAX_TEXT)?;
    }
    if r.chosen_by.len() > MAX_HINTS {
        return Err(format!(
            "chosenBy: {} entries, at most {MAX_HINTS}",
            r.chosen_by.len()
        ));
    }
    for (i, h) in r.chosen_by.iter().enumerate() {
        text_ok(&format!("chosenBy[{i}]"), Some(h), MAX_TEXT)?;
    }
    if !r.seconds.is_finite() || r.seconds < 0.0 {
        return Err("seconds: not a duration".into());
    }
    // A run that says it succeeded must name the device and have verified the image.
    if r.ok && (r.device.is_none() || !r.verified || r.sha256.is_none() || r.error.is_some()) {
        return Err("ok is true but no device, no verified sha256, or an error".into());
    }
    Ok(())
}

impl BootHttp {
    /// The install script of `m` (booting the agent image `files` to install `plan`),
    /// with fresh signed report and Ignition URLs.
    pub(super) fn install_script(
        &self,
        m: &MachineBoot,
        files: &BootFiles,
        plan: &InstallPlan,
        now: u64,
    ) -> Result<Bytes, crate::ipxe::RenderError> {
        let mint = |p| {
            self.signer
                .mint(p, &m.server, &m.boot_id, now, self.token_ttl)
        };
        let report = format!(
            "{}{INSTALL_PREFIX}{}/{}",
            self.base_url,
            m.server,
            mint(Purpose::Install)
        );
        let ignition = format!(
            "{}/ignition/{}/{}",
            self.base_url,
            m.server,
            mint(Purpose::Ignition)
        );
        let hints = percent_encoding::utf8_percent_encode(
            &plan.root_device_hints,
            percent_encoding::NON_ALPHANUMERIC,
        )
        .to_string();
        let d = InstallScript {
            server: &m.server,
            image: &files.image,
            kernel_url: &files.kernel_url,
            initrd_url: &files.initrd_url,
            cmdline: &files.cmdline,
            install_url: &report,
            disk_image: &plan.image,
            disk_url: &plan.image_url,
            disk_sha256: &plan.sha256,
            root_hints: &hints,
            ignition_url: &ignition,
            console: &self.console,
            base_url: &self.base_url,
        };
        Ok(Bytes::from(self.renderer.install_script(&d)?))
    }

    /// `POST /discovery/install/<rest>` with `body`.
    pub(super) fn install_report(
        &self,
        rest: &str,
        body: &Bytes,
        client: IpAddr,
        server_out: &mut Option<Arc<MachineBoot>>,
    ) -> Resp {
        let m = match self.admit(AgentRoute::Install, rest, client, server_out) {
            Ok(m) => m,
            Err(resp) => return *resp,
        };
        let BootState::Install(plan) = &m.state else {
            self.count_install("conflict");
            return text(
                StatusCode::CONFLICT,
                &format!("server {} is not installing a disk image\n", m.server),
            );
        };
        let report: InstallReport = match serde_json::from_slice(body) {
            Ok(r) => r,
            Err(e) => {
                self.count_install("malformed");
                return bad_request(&format!("install report: {e}"));
            }
        };
        if let Err(why) = check(&report) {
            self.count_install("invalid");
            return text(
                StatusCode::UNPROCESSABLE_ENTITY,
                &format!("install report: {why}\n"),
            );
        }
        if let Some(sha) = &report.sha256 {
            if !sha.eq_ignore_ascii_case(&plan.sha256) {
                self.count_install("conflict");
                return text(
                    StatusCode::CONFLICT,
                    &format!(
                        "install report: sha256 {sha} is not that of {} ({})\n",
                        plan.image, plan.sha256
                    ),
                );
            }
        }
        if let Some(u) = &m.uuid {
            let reported = parse_uuid(&report.system_uuid).unwrap_or_default();
            if *u != reported {
                self.count_install("conflict");
                tracing::warn!(server = %m.server, client = %client, reported, expected = %u, "install report of another system refused");
                return text(
                    StatusCode::CONFLICT,
                    &format!(
                        "install report: systemUUID {:?} is not server {}'s ({u})\n",
                        report.system_uuid, m.server
                    ),
                );
            }
        }
        let report = AgentReport {
            server: m.server.clone(),
            boot_id: m.boot_id.clone(),
            client,
            report: Report::Install(report),
        };
        self.queue(AgentRoute::Install, report)
    }

    fn count_install(&self, result: &'static str) {
        self.count_agent(AgentRoute::Install, result);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bootplane_probe::IgnitionWritten;

    fn good() -> InstallReport {
        InstallReport {
            action: "install".into(),
            ok: true,
            system_uuid: "5A2C0000-0000-4000-8000-000000000001".into(),
            device: Some("/dev/vda".into()),
            chosen_by: vec!["size 8 GiB >= 4".into()],
            image: "http://10.0.0.1:8080/assets/images/deb/disk.zst".into(),
            sha256: Some("ab".repeat(32)),
            verified: true,
            bytes_written: 1 << 30,
            resumed_from: 0,
            seconds: 3.5,
            ignition: Some(IgnitionWritten {
                partition: "/dev/vda3".into(),
                found_by: "partlabel boot".into(),
                path: "ignition/config.ign".into(),
                bytes: 100,
            }),
            error: None,
        }
    }

    #[test]
    fn checks_bounds_and_consistency() {
        assert_eq!(check(&good()), Ok(()));
        let mut r = good();
        r.action = "wipe".into();
        assert!(check(&r).unwrap_err().starts_with("action"));
        let mut r = good();
        r.verified = false;
        assert!(check(&r).unwrap_err().contains("ok is true"));
        let mut r = good();
        r.ok = false;
        r.verified = false;
        r.error = Some("sha256 mismatch".into());
        assert_eq!(check(&r), Ok(()));
        let mut r = good();
        r.device = Some("/dev/\u{1b}x".into());
        assert!(check(&r).unwrap_err().contains("control character"));
        let mut r = good();
        r.chosen_by = vec!["x".into(); MAX_HINTS + 1];
        assert!(check(&r).unwrap_err().contains("chosenBy"));
        let mut r = good();
        r.seconds = -1.0;
        assert!(check(&r).unwrap_err().contains("seconds"));
        let mut r = good();
        r.image = "i".repeat(MAX_TEXT + 1);
        assert!(check(&r).unwrap_err().contains("longer than"));
    }
}
