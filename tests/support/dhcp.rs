//! DHCP test helpers: a [`Lab`] of two network namespaces joined by a veth (server
//! and client side), the real `bootplane serve` in the server one, and hook scripts for
//! the real DHCP clients (dhclient, udhcpc) in the client one.

use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::time::Duration;

use super::bootplane::bootplane_cli;
use super::netns::{veth_pair, Netns};
use super::process::{must, read, wait_for, Proc};

pub struct Lab {
    pub server: Netns,
    pub client: Netns,
    pub dir: tempfile::TempDir,
    pub net: u8,
}

impl Lab {
    pub fn new(net: u8) -> Lab {
        let (server, client) = veth_pair("s", "c", &format!("10.199.{net}.1/24"));
        Lab {
            server,
            client,
            dir: tempfile::tempdir().unwrap(),
            net,
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn addr(&self, last: u8) -> String {
        format!("10.199.{}.{last}", self.net)
    }

    /// The bootplane CLI in the server namespace, against its API and state directory.
    pub fn cli(&self, args: &[&str], stdin: Option<&str>) -> Output {
        bootplane_cli(&self.server, &self.path("state"), args, stdin)
    }

    /// Start `bootplane serve` in the server namespace with `args` and a config
    /// file holding `config` (plus state_dir); waits until DHCP listens.
    pub fn start_bootplane(&self, config: &str, args: &[&str], log_name: &str) -> Proc {
        let cfg = self.path("bootplane.toml");
        let state = self.path("state");
        std::fs::write(
            &cfg,
            format!("state_dir = \"{}\"\n{config}", state.display()),
        )
        .unwrap();
        let log = std::fs::File::create(self.path(log_name)).unwrap();
        let mut c = self.server.cmd(env!("CARGO_BIN_EXE_bootplane"));
        c.args(["serve", "--config", cfg.to_str().unwrap()])
            .args(args)
            .env("RUST_LOG", "info,bootplane=debug")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(log);
        let p = Proc::spawn(c);
        wait_for(
            Duration::from_secs(15),
            || read(&self.path(log_name)).contains("dhcp server listening"),
            || format!("bootplane did not start: {}", read(&self.path(log_name))),
        );
        p
    }

    /// A client-side hook script for dhclient/udhcpc: logs `<reason> <ip>` and
    /// configures the address (so unicast renewals reach it).
    pub fn client_script(&self) -> PathBuf {
        let p = self.path("client-script.sh");
        let log = self.path("client-script.log");
        let text = format!(
            "#!/bin/sh\n\
             ip=\"${{new_ip_address:-$ip}}\"\n\
             reason=\"${{reason:-$1}}\"\n\
             echo \"$reason $ip\" >> {log}\n\
             case \"$reason\" in\n\
               BOUND|RENEW|REBIND|REBOOT|bound|renew) ip addr replace \"$ip/24\" dev \"$interface\" ;;\n\
             esac\n\
             exit 0\n",
            log = log.display()
        );
        std::fs::write(&p, text).unwrap();
        must("chmod", &["+x", p.to_str().unwrap()]);
        p
    }

    pub fn script_log(&self) -> String {
        read(&self.path("client-script.log"))
    }

    pub fn lease_log(&self) -> String {
        read(&self.path("state/dhcp-leases.log"))
    }
}
