//! iPXE script rendering from editable templates (pure, no I/O).
//!
//! Six templates, each a minijinja template with an iPXE body:
//! - `boot.ipxe.j2`: the chainload script served at `/boot.ipxe`; it sends iPXE on to
//!   its per-machine script with `${uuid}`, `${net0/mac:hexhyp}`, `${buildarch}` and
//!   `${platform}` URL-encoded by iPXE itself (`:uristring`).
//! - `machine.ipxe.j2`: a machine whose boot configuration is ready: `kernel` (with the
//!   image's command line, the Ignition URL and console args), `initrd`, `boot`.
//! - `default.ipxe.j2`: everyone else (unknown, not claimed, error): exit to the local
//!   disk, a retry loop, or a discovery image. It is always a runnable iPXE script.
//! - `discovery.ipxe.j2`: a known Server in `Discovery`: the discovery image with the
//!   signed URL its agent posts the inventory to (`bootplane.inventory=`).
//! - `cleanup.ipxe.j2`: a known Server in `Cleanup`: the same agent image with the wipe
//!   policy and the signed URL its agent posts the wipe report to (`bootplane.wipe=`).
//! - `install.ipxe.j2`: a claimed Server whose image is a disk image not yet installed:
//!   the agent image with the disk image's URL, SHA-256 and root-device hints, the claim's
//!   Ignition URL and the signed URL its agent posts the install report to.
//!
//! The shipped versions live in `ipxe/` and are compiled in as defaults; the HTTP
//! listener loads operator-edited copies from `boot.ipxe_templates` at start-up and hands
//! their text to [`Renderer::new`]. Values are checked before rendering: a value with a
//! line break or a control character would let data inject iPXE commands, so it is
//! refused ([`RenderError::UnsafeValue`]).

use minijinja::{context, Environment};
use serde::Serialize;

/// Template names (also the file names looked up in the templates directory).
pub(crate) const BOOT_TEMPLATE: &str = "boot.ipxe.j2";
pub(crate) const MACHINE_TEMPLATE: &str = "machine.ipxe.j2";
pub(crate) const DEFAULT_TEMPLATE: &str = "default.ipxe.j2";
pub(crate) const DISCOVERY_TEMPLATE: &str = "discovery.ipxe.j2";
pub(crate) const CLEANUP_TEMPLATE: &str = "cleanup.ipxe.j2";
pub(crate) const INSTALL_TEMPLATE: &str = "install.ipxe.j2";

/// The shipped templates, used when the templates directory lacks a file.
pub(crate) const BUILTIN_TEMPLATES: [(&str, &str); 6] = [
    (BOOT_TEMPLATE, include_str!("../../../../ipxe/boot.ipxe.j2")),
    (
        MACHINE_TEMPLATE,
        include_str!("../../../../ipxe/machine.ipxe.j2"),
    ),
    (
        DEFAULT_TEMPLATE,
        include_str!("../../../../ipxe/default.ipxe.j2"),
    ),
    (
        DISCOVERY_TEMPLATE,
        include_str!("../../../../ipxe/discovery.ipxe.j2"),
    ),
    (
        CLEANUP_TEMPLATE,
        include_str!("../../../../ipxe/cleanup.ipxe.j2"),
    ),
    (
        INSTALL_TEMPLATE,
        include_str!("../../../../ipxe/install.ipxe.j2"),
    ),
];

#[derive(Debug, thiserror::Error)]
pub(crate) enum RenderError {
    #[error("template {name}: {source}")]
    Template {
        name: String,
        source: minijinja::Error,
    },
    #[error("value for {field} contains a line break or control character")]
    UnsafeValue { field: &'static str },
}

/// What the per-machine script needs.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct MachineScript<'a> {
    pub server: &'a str,
    pub image: &'a str,
    pub arch: &'a str,
    pub kernel_url: &'a str,
    pub initrd_url: &'a str,
    pub rootfs_url: &'a str,
    pub cmdline: &'a str,
    pub ignition_url: &'a str,
    pub console: &'a str,
    pub base_url: &'a str,
}

/// The values of `discovery.ipxe.j2`.
#[derive(Debug, Serialize)]
pub(crate) struct DiscoveryScript<'a> {
    pub server: &'a str,
    pub image: &'a str,
    pub kernel_url: &'a str,
    pub initrd_url: &'a str,
    pub cmdline: &'a str,
    pub inventory_url: &'a str,
    pub lldp_wait: u32,
    pub console: &'a str,
    pub base_url: &'a str,
}

/// The values of `cleanup.ipxe.j2`.
#[derive(Debug, Serialize)]
pub(crate) struct CleanupScript<'a> {
    pub server: &'a str,
    pub image: &'a str,
    pub kernel_url: &'a str,
    pub initrd_url: &'a str,
    pub cmdline: &'a str,
    pub wipe_url: &'a str,
    pub policy: &'a str,
    pub console: &'a str,
    pub base_url: &'a str,
}

/// The values of `install.ipxe.j2`.
#[derive(Debug, Serialize)]
pub(crate) struct InstallScript<'a> {
    pub server: &'a str,
    pub image: &'a str,
    pub kernel_url: &'a str,
    pub initrd_url: &'a str,
    pub cmdline: &'a str,
    pub install_url: &'a str,
    pub disk_image: &'a str,
    pub disk_url: &'a str,
    pub disk_sha256: &'a str,
    pub root_hints: &'a str,
    pub ignition_url: &'a str,
    pub console: &'a str,
    pub base_url: &'a str,
}

/// What to do for a machine without a ready boot configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DefaultAction {
    /// `exit`: iPXE returns to the firmware, which boots the next device (local disk).
    Exit,
    /// Sleep, then chain `/boot.ipxe` again.
    Retry { secs: u32 },
    /// Boot a discovery image.
    Discovery {
        kernel_url: String,
        initrd_url: String,
        cmdline: String,
    },
}

/// Compiled templates. Cheap to share (`Arc`) and safe to use from many threads.
pub struct Renderer {
    env: Environment<'static>,
}

impl Renderer {
    /// Compile templates. `overrides` (name, text) replace the built-in ones by name.
    pub(crate) fn new(overrides: &[(String, String)]) -> Result<Renderer, RenderError> {
        let mut env = Environment::new();
        env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
        env.set_keep_trailing_newline(true);
        for (name, text) in BUILTIN_TEMPLATES {
            let text = overrides
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, t)| t.clone())
                .unwrap_or_else(|| text.to_string());
            env.add_template_owned(name.to_string(), text)
                .map_err(|source| RenderError::Template {
                    name: name.to_string(),
                    source,
                })?;
        }
        Ok(Renderer { env })
    }

    /// The built-in templates only.
    pub fn builtin() -> Renderer {
        Renderer::new(&[]).expect("built-in iPXE templates compile")
    }

    fn render(&self, name: &str, ctx: minijinja::Value) -> Result<String, RenderError> {
        let t = self
            .env
            .get_template(name)
            .map_err(|source| RenderError::Template {
                name: name.into(),
                source,
            })?;
        t.render(ctx).map_err(|source| RenderError::Template {
            name: name.into(),
            source,
        })
    }

    /// The chainload script served at `/boot.ipxe`.
    pub(crate) fn boot_script(&self, base_url: &str) -> Result<String, RenderError> {
        check("base_url", base_url)?;
        self.render(BOOT_TEMPLATE, context! { base_url })
    }

    /// The script of a machine whose boot configuration is ready.
    pub(crate) fn machine_script(&self, m: &MachineScript<'_>) -> Result<String, RenderError> {
        for (field, v) in [
            ("server", m.server),
            ("image", m.image),
            ("arch", m.arch),
            ("kernel_url", m.kernel_url),
            ("initrd_url", m.initrd_url),
            ("rootfs_url", m.rootfs_url),
            ("cmdline", m.cmdline),
            ("ignition_url", m.ignition_url),
            ("console", m.console),
            ("base_url", m.base_url),
        ] {
            check(field, v)?;
        }
        self.render(MACHINE_TEMPLATE, minijinja::Value::from_serialize(m))
    }

    /// The script of a Server in `Discovery`: boot the discovery image, whose agent posts
    /// the inventory to `inventory_url`.
    pub(crate) fn discovery_script(&self, d: &DiscoveryScript<'_>) -> Result<String, RenderError> {
        for (field, v) in [
            ("server", d.server),
            ("image", d.image),
            ("kernel_url", d.kernel_url),
            ("initrd_url", d.initrd_url),
            ("cmdline", d.cmdline),
            ("inventory_url", d.inventory_url),
            ("console", d.console),
            ("base_url", d.base_url),
        ] {
            check(field, v)?;
        }
        self.render(DISCOVERY_TEMPLATE, minijinja::Value::from_serialize(d))
    }

    /// The script of a Server in `Cleanup`: boot the agent image, whose agent wipes the
    /// disks by `policy` and posts its report to `wipe_url`.
    pub(crate) fn cleanup_script(&self, d: &CleanupScript<'_>) -> Result<String, RenderError> {
        for (field, v) in [
            ("server", d.server),
            ("image", d.image),
            ("kernel_url", d.kernel_url),
            ("initrd_url", d.initrd_url),
            ("cmdline", d.cmdline),
            ("wipe_url", d.wipe_url),
            ("policy", d.policy),
            ("console", d.console),
            ("base_url", d.base_url),
        ] {
            check(field, v)?;
        }
        self.render(CLEANUP_TEMPLATE, minijinja::Value::from_serialize(d))
    }

    /// The script of a claimed Server whose disk image is to be installed: boot the agent
    /// image, whose agent installs it and posts its report to `install_url`.
    pub(crate) fn install_script(&self, d: &InstallScript<'_>) -> Result<String, RenderError> {
        for (field, v) in [
            ("server", d.server),
            ("image", d.image),
            ("kernel_url", d.kernel_url),
            ("initrd_url", d.initrd_url),
            ("cmdline", d.cmdline),
            ("install_url", d.install_url),
            ("disk_image", d.disk_image),
            ("disk_url", d.disk_url),
            ("disk_sha256", d.disk_sha256),
            ("root_hints", d.root_hints),
            ("ignition_url", d.ignition_url),
            ("console", d.console),
            ("base_url", d.base_url),
        ] {
            check(field, v)?;
        }
        self.render(INSTALL_TEMPLATE, minijinja::Value::from_serialize(d))
    }

    /// The script for a machine without a ready boot configuration. `reason` is shown
    /// with `echo`; it is reduced to safe printable characters first.
    pub(crate) fn default_script(
        &self,
        action: &DefaultAction,
        reason: &str,
        base_url: &str,
        console: &str,
    ) -> Result<String, RenderError> {
        check("base_url", base_url)?;
        check("console", console)?;
        let reason = sanitize_echo(reason);
        let ctx = match action {
            DefaultAction::Exit => context! { action => "exit", reason, base_url, console },
            DefaultAction::Retry { secs } => {
                context! { action => "retry", retry_secs => secs, reason, base_url, console }
            }
            DefaultAction::Discovery {
                kernel_url,
                initrd_url,
                cmdline,
            } => {
                check("kernel_url", kernel_url)?;
                check("initrd_url", initrd_url)?;
                check("cmdline", cmdline)?;
                context! { action => "discovery", kernel_url, initrd_url, cmdline, reason, base_url, console }
            }
        };
        self.render(DEFAULT_TEMPLATE, ctx)
    }
}

fn check(field: &'static str, v: &str) -> Result<(), RenderError> {
    if v.chars().any(|c| c.is_control()) {
        return Err(RenderError::UnsafeValue { field });
    }
    Ok(())
}

/// Keep printable ASCII except `$` (iPXE expands `${...}` inside `echo`).
fn sanitize_echo(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_graphic() && c != '$' || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .take(200)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample<'a>() -> MachineScript<'a> {
        MachineScript {
            server: "server-a",
            image: "os-image:latest",
            arch: "amd64",
            kernel_url: "http://10.0.0.1:8080/assets/images/os-image/vmlinuz",
            initrd_url: "http://10.0.0.1:8080/assets/images/os-image/initrd.img",
            rootfs_url: "",
            cmdline: "rd.neednet=1",
            ignition_url: "http://10.0.0.1:8080/ignition/server-a/123.abc",
            console: "console=ttyS0,115200",
            base_url: "http://10.0.0.1:8080",
        }
    }

    #[test]
    fn boot_script_chains_with_encoded_identity() {
        let s = Renderer::builtin()
            .boot_script("http://10.0.0.1:8080")
            .unwrap();
        assert!(s.starts_with("#!ipxe\n"), "{s}");
        let chain = s.lines().find(|l| l.starts_with("chain ")).unwrap();
        for v in [
            "uuid=${uuid}&",
            "mac=${net0/mac:hexhyp}",
            "buildarch=${buildarch:uristring}",
            "platform=${platform:uristring}",
            // The script token of bootplane's DHCP reply (option 224, issue 32).
            "token=${224:uristring}",
        ] {
            assert!(chain.contains(v), "{chain}");
        }
        assert!(
            chain.contains("http://10.0.0.1:8080/ipxe/script?"),
            "{chain}"
        );
    }

    #[test]
    fn machine_script_has_kernel_ignition_initrd_boot() {
        let s = Renderer::builtin().machine_script(&sample()).unwrap();
        let lines: Vec<&str> = s
            .lines()
            .filter(|l| !l.starts_with('#') && !l.starts_with("echo"))
            .collect();
        assert!(
            lines[0].starts_with("kernel http://10.0.0.1:8080/assets/images/os-image/vmlinuz "),
            "{s}"
        );
        for a in [
            "rd.neednet=1",
            "ignition.config.url=http://10.0.0.1:8080/ignition/server-a/123.abc",
            "ignition.firstboot=1",
            "ignition.platform.id=metal",
            "console=ttyS0,115200",
        ] {
            assert!(
                lines[0].split(' ').any(|w| w == a || a.contains(' ')),
                "missing {a} in {}",
                lines[0]
            );
        }
        assert_eq!(
            lines[1],
            "initrd --name initrd http://10.0.0.1:8080/assets/images/os-image/initrd.img"
        );
        assert_eq!(lines[2], "boot");
    }

    #[test]
    fn injected_line_breaks_are_refused() {
        let mut m = sample();
        m.cmdline = "quiet\nshell";
        assert!(matches!(
            Renderer::builtin().machine_script(&m),
            Err(RenderError::UnsafeValue { field: "cmdline" })
        ));
    }

    #[test]
    fn default_scripts_are_runnable_ipxe() {
        let r = Renderer::builtin();
        let exit = r
            .default_script(
                &DefaultAction::Exit,
                "unknown machine ${x}\n",
                "http://h",
                "",
            )
            .unwrap();
        assert!(
            exit.starts_with("#!ipxe\n") && exit.contains("\nexit\n"),
            "{exit}"
        );
        assert!(
            !exit.contains("${x}") && exit.contains("echo bootplane: unknown machine ?{x}?"),
            "{exit}"
        );
        let retry = r
            .default_script(
                &DefaultAction::Retry { secs: 7 },
                "not claimed",
                "http://h",
                "",
            )
            .unwrap();
        assert!(
            retry.contains("sleep 7\n")
                && retry.contains("chain --autofree --replace http://h/boot.ipxe"),
            "{retry}"
        );
        let disc = DefaultAction::Discovery {
            kernel_url: "http://h/k".into(),
            initrd_url: "http://h/i".into(),
            cmdline: "x=1".into(),
        };
        let d = r
            .default_script(&disc, "unknown", "http://h", "console=ttyS0")
            .unwrap();
        assert!(
            d.contains("kernel http://h/k initrd=initrd x=1 console=ttyS0\n")
                && d.contains("\nboot\n"),
            "{d}"
        );
    }

    #[test]
    fn operator_templates_override_builtin() {
        let r = Renderer::new(&[(
            BOOT_TEMPLATE.to_string(),
            "#!ipxe\nchain {{ base_url }}/custom\n".to_string(),
        )])
        .unwrap();
        assert_eq!(
            r.boot_script("http://h").unwrap(),
            "#!ipxe\nchain http://h/custom\n"
        );
        assert!(Renderer::new(&[(BOOT_TEMPLATE.to_string(), "{% if %}".to_string())]).is_err());
    }
}
