//! The install side of the boot listener: the script of a claimed Server whose image is a
//! disk image not yet installed (the agent image with the disk image's URL, SHA-256 and
//! root-device hints, the claim's signed Ignition URL and a signed report URL), which the
//! agent (`bootplane probe install`, docs/install.md) follows.

use bytes::Bytes;

use super::respond::INSTALL_PREFIX;
use super::token::Purpose;
use super::{BootFiles, BootHttp, InstallPlan, MachineBoot};
use crate::ipxe::InstallScript;

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
}
