//! The boot listener's routes a BMC is pointed at: `/boot.iso` (the generic ISO),
//! `/ipxe/boot.iso` and `/ipxe/boot.efi` (a machine's own, behind a signed token), and
//! the per-machine URLs for them; the images come from [`BootIso`] (`bootiso`).

use std::net::IpAddr;
use std::sync::Arc;

use http::{Request, StatusCode};

use super::bootiso::{chain_script, BootArtifact, BootIso, Image};
use super::metrics::RouteLabels;
use super::respond::{bad_request, ranged_response, route, text, Query, Resp, Source};
use super::token::Purpose;
use super::{BootHttp, MachineBoot, MachineId};
use crate::sys::unix_now;

impl BootHttp {
    /// Use `iso` for the ISO routes ([`BootHttp::from_config`] loads it from `[http.boot_iso]`).
    pub(crate) fn with_boot_iso(mut self, iso: BootIso) -> BootHttp {
        self.boot_iso = iso;
        self
    }

    /// The generic boot ISO's URL (virtual media for any machine bootplane knows by MAC
    /// or UUID).
    pub fn boot_iso_url(&self) -> String {
        format!("{}/boot.iso", self.base_url)
    }

    /// `server`'s own boot target URL (a UEFI HTTP boot URI or a virtual media image),
    /// carrying a token for that artifact bound to the boot the index holds for it now.
    pub fn signed_boot_url(&self, server: &str, artifact: BootArtifact) -> String {
        let boot = self
            .index
            .lookup(&MachineId::Server(server.to_string()))
            .map(|m| m.boot_id.clone())
            .unwrap_or_default();
        let t = self.signer.mint(
            artifact.purpose(),
            server,
            &boot,
            unix_now(),
            self.token_ttl,
        );
        format!(
            "{}{}?server={server}&token={t}",
            self.base_url,
            artifact.path()
        )
    }

    /// `/boot.iso`, `/ipxe/boot.iso`, `/ipxe/boot.efi`.
    pub(super) async fn boot_target<B>(
        &self,
        req: &Request<B>,
        client: IpAddr,
        server_out: &mut Option<Arc<MachineBoot>>,
    ) -> Resp {
        let artifact = match req.uri().path() {
            "/boot.iso" => {
                let url = format!("{}/boot.ipxe", self.base_url);
                let img = self
                    .boot_iso
                    .cached("", "", u64::MAX, |_| chain_script(&url));
                return self.iso_response(req, img);
            }
            "/ipxe/boot.iso" => BootArtifact::Iso,
            _ => BootArtifact::Efi,
        };
        let q = match Query::parse(req.uri().query().unwrap_or("")) {
            Ok(q) => q,
            Err(msg) => return bad_request(&msg),
        };
        let Some(name) = q.server.as_deref() else {
            return bad_request("missing server");
        };
        if !crate::model::meta::valid_object_name(name) {
            return bad_request("malformed server name");
        }
        let Some(m) = self.index.lookup(&MachineId::Server(name.to_string())) else {
            return text(StatusCode::NOT_FOUND, "unknown server\n");
        };
        *server_out = Some(m.clone());
        let checked = match q.token.as_deref() {
            None => Err("no token".to_string()),
            Some(t) => self
                .signer
                .verify(t, artifact.purpose(), &m.server, &m.boot_id, unix_now())
                .map_err(|e| e.to_string()),
        };
        if let Err(why) = checked {
            let route = if artifact == BootArtifact::Iso {
                route::ISO
            } else {
                route::EFI
            };
            self.metrics()
                .identity_refused
                .get_or_create(&RouteLabels { route })
                .inc();
            tracing::warn!(server = %m.server, client = %client, route, why = %why, "boot target refused");
            return text(StatusCode::FORBIDDEN, &format!("forbidden: {why}\n"));
        }
        match artifact {
            BootArtifact::Efi => self.asset(req, "ipxe.efi").await,
            BootArtifact::Iso => {
                let img = self
                    .boot_iso
                    .cached(&m.server, &m.boot_id, self.token_ttl / 2, |now| {
                        let t = self.signer.mint(
                            Purpose::Script,
                            &m.server,
                            &m.boot_id,
                            now,
                            self.token_ttl,
                        );
                        chain_script(&format!(
                            "{}/ipxe/script?server={}&token={t}",
                            self.base_url, m.server
                        ))
                    });
                self.iso_response(req, img)
            }
        }
    }

    fn iso_response<B>(&self, req: &Request<B>, img: Result<Arc<Image>, String>) -> Resp {
        let img = match img {
            Ok(i) => i,
            Err(e) => {
                tracing::warn!(error = %e, "cannot build the boot iso");
                return text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &format!("boot iso unavailable: {e}\n"),
                );
            }
        };
        ranged_response(
            req,
            &img.meta,
            "application/x-iso9660-image",
            Source::Bytes(img.body.clone()),
        )
    }
}
