//! The management-network lab: bootplane's namespace with a bridge `mg0` (NET.1/24)
//! serving the management DHCP scope, and one namespace per simulated BMC on that bridge
//! (a veth with a chosen MAC), which leases its address with busybox udhcpc.

use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use serde_json::Value;

use super::bootplane::{bootplane_cli, get_json_in, serve_in};
use super::netns::Netns;
use super::process::{must, read, run_bounded, wait_for, Proc};

/// The management subnet's first three octets.
pub const NET: &str = "10.198.7";

/// bootplane's namespace (bridge `mg0`) and one namespace per simulated BMC.
pub struct Lab {
    pub srv: Netns,
    pub bmcs: Vec<(String, Netns)>,
    pub dir: tempfile::TempDir,
    pub bp: Option<Proc>,
}

impl Lab {
    pub fn new(macs: &[&str]) -> Lab {
        let srv = Netns::new("mgmt");
        srv.bridge("mg0", &format!("{NET}.1/24"));
        let mut bmcs = Vec::new();
        for (i, mac) in macs.iter().enumerate() {
            let ns = Netns::new(&format!("bmc{i}"));
            let port = format!("m{i}");
            must(
                "ip",
                &[
                    "link", "add", &port, "netns", &srv.name, "type", "veth", "peer", "name",
                    "eth0", "address", mac, "netns", &ns.name,
                ],
            );
            srv.ip(&["link", "set", &port, "master", "mg0"]);
            srv.ip(&["link", "set", &port, "up"]);
            ns.ip(&["link", "set", "eth0", "up"]);
            bmcs.push((mac.to_string(), ns));
        }
        Lab {
            srv,
            bmcs,
            dir: tempfile::tempdir().unwrap(),
            bp: None,
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `bootplane serve` in the lab's namespace: the management scope on `mg0`, the
    /// MAC-prefix database `mac_db`, power.redfish polling every second (3 credential attempts per 300 s), `extra`
    /// TOML at the end (inside `[discovery.dhcp]`; first boot off).
    pub fn start(&mut self, mac_db: &str, extra: &str) {
        self.start_with(mac_db, "", extra);
    }

    /// [`Lab::start`] with `discovery` TOML keys added to `[discovery]` (the whole lab
    /// subnet is in `approved_bmcs` unless they set it).
    pub fn start_with(&mut self, mac_db: &str, discovery: &str, extra: &str) {
        std::fs::write(self.path("macs.yaml"), mac_db).unwrap();
        let cfg = format!(
            r#"state_dir = "{state}"
[controller]
power_driver = "test"
[power.redfish]
poll_interval_secs = 1
timeout_secs = 2
retry_max_secs = 2
auth_attempts = 3
auth_interval_secs = 300
[discovery]
enabled = true
first_boot = false
mac_db = "{macs}"
{approved}
{discovery}
[discovery.dhcp]
enabled = true
interface = "mg0"
mode = "authoritative"
range = "{NET}.100-{NET}.150"
lease_time_secs = 600
{extra}
"#,
            state = self.path("state").display(),
            macs = self.path("macs.yaml").display(),
            approved = if discovery.contains("approved_bmcs") {
                String::new()
            } else {
                format!("approved_bmcs = [\"{NET}.0/24\"]")
            },
        );
        std::fs::write(self.path("bootplane.toml"), cfg).unwrap();
        self.bp = Some(serve_in(
            &self.srv,
            &self.path("bootplane.toml"),
            &self.path("bootplane.log"),
        ));
    }

    pub fn cli(&self, args: &[&str], stdin: Option<&str>) -> Output {
        bootplane_cli(&self.srv, &self.path("state"), args, stdin)
    }

    pub fn get(&self, kind: &str, name: &str) -> Option<Value> {
        get_json_in(&self.srv, &self.path("state"), kind, name)
    }

    /// busybox udhcpc in BMC `i`'s namespace (hostname and vendor class sent); the
    /// address it was given (configured on its eth0 by the hook script).
    pub fn lease(&self, i: usize) -> String {
        let log = self.path(&format!("udhcpc-{i}.log"));
        let script = self.path("udhcpc.sh");
        std::fs::write(
            &script,
            "#!/bin/sh\ncase \"$1\" in\n  bound|renew) ip addr replace \"$ip/24\" dev \"$interface\"; echo \"$1 $ip\" >> \"$LEASE_LOG\" ;;\nesac\nexit 0\n",
        )
        .unwrap();
        must("chmod", &["+x", script.to_str().unwrap()]);
        let mut c = self.bmcs[i].1.cmd("busybox");
        c.env("LEASE_LOG", &log).args([
            "udhcpc",
            "-i",
            "eth0",
            "-f",
            "-q",
            "-n",
            "-t",
            "5",
            "-T",
            "1",
            "-x",
            &format!("hostname:bmc{i}"),
            "-V",
            "FakeBMC-Vendor",
            "-s",
            script.to_str().unwrap(),
        ]);
        let out = run_bounded(c, 30);
        assert!(
            out.status.success(),
            "udhcpc in bmc{i} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = read(&log);
        let last = text.lines().last().expect("udhcpc bound");
        last.split_whitespace().nth(1).unwrap().to_string()
    }

    /// `/metrics` from inside bootplane's namespace.
    pub fn metrics(&self) -> String {
        let token = read(&self.path("state/api-token")).trim().to_string();
        let agent = super::api_agent(&self.path("state"));
        self.srv.run(move || {
            agent
                .get("https://127.0.0.1:9090/metrics")
                .set("Authorization", &format!("Bearer {token}"))
                .call()
                .unwrap()
                .into_string()
                .unwrap()
        })
    }

    pub fn wait<T>(&self, secs: u64, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
        let mut found = None;
        wait_for(
            Duration::from_secs(secs),
            || {
                found = f();
                found.is_some()
            },
            || format!("{what}; log:\n{}", tail(&read(&self.path("bootplane.log")))),
        );
        found.unwrap()
    }
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}

/// `bmc-` and the MAC's 12 hex digits (the Endpoint, BMC and BMCSecret name).
pub fn endpoint_name(mac: &str) -> String {
    format!("bmc-{}", mac.replace(':', ""))
}

/// Condition `ty` of `o` (`null` when absent).
pub fn condition(o: &Value, ty: &str) -> Value {
    o["status"]["conditions"]
        .as_array()
        .and_then(|l| l.iter().find(|c| c["type"] == ty).cloned())
        .unwrap_or(Value::Null)
}

/// The value of the sample `name` in Prometheus text.
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("{name} not on /metrics:\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

/// The first column of a `bootplane get` table (the names).
pub fn names(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .collect()
}
