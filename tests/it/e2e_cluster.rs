//! End to end on two appliances sharing etcd (issue 21): a machine boots with real
//! firmware while its Server, its Ignition Secret and its ServerClaim were written
//! through another appliance than the one that answers its DHCP.
//!
//! The lab (tests/support/qemu.rs) is one namespace with a bridge `br0`; in it:
//!
//! - a 3-member etcd cluster on the namespace's 127.0.0.1, which both appliances reach
//!   (they run in that namespace; the host's loopback is not theirs);
//! - appliance **A**: API on 127.0.0.1:9091, its boot HTTP listener on 10.199.65.2 (a
//!   second address of the bridge, so the VM could reach it), DHCP and TFTP off. It is
//!   started first and the test waits until it leads the `metal` controller group, so
//!   the metal controllers run on A: A powers the VM on (the `qemu` driver, a tap on
//!   `br0`) and writes the claim's boot configuration;
//! - appliance **B**: authoritative DHCP on `br0`, TFTP and boot HTTP on 10.199.65.1,
//!   API on 127.0.0.1:9090; it leads nothing and knows the machine only from its etcd
//!   watch.
//!
//! The Server, the Secret and the ServerClaim are applied through A's API. The VM
//! (SeaBIOS + QEMU's iPXE ROM) gets its lease from B, chains `undionly.kpxe` from B's
//! TFTP, fetches its script, a Debian kernel and an initramfs from B's HTTP, and the
//! initramfs runs the real `ignition` client, which fetches the config from B. Checked:
//! the console (B's address only), B's metrics (DHCP ACKs, TFTP transfers, script and
//! Ignition requests) and A's (none of them), B's lease of the VM's MAC, the conditions
//! `IPXEScriptFetched` and `IgnitionDataFetched` read through A, that A still leads
//! `metal` and B does not, and that deleting the claim through A stops the VM.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use serde_json::Value;
use support::api::condition_true;
use support::bootplane::{
    api_url, bootplane_cli_at, get_json_at, ipxe_templates, serve_in_with, tail,
};
use support::etcd::EtcdCluster;
use support::image::write_catalog;
use support::netns::Netns;
use support::process::*;
use support::qemu::*;
use support::require::*;

/// The lab's network: 10.199.65.0/24.
const NET: u8 = 65;

/// One appliance of the lab.
struct Appliance {
    name: &'static str,
    /// Its API, as reached inside the namespace.
    api: String,
    state: PathBuf,
    log: PathBuf,
    proc: Option<Proc>,
}

impl Appliance {
    fn cli(&self, ns: &Netns, args: &[&str], stdin: Option<&str>) -> Output {
        bootplane_cli_at(ns, &self.api, &self.state, args, stdin)
    }

    fn get_json(&self, ns: &Netns, kind: &str, name: &str) -> Option<Value> {
        get_json_at(ns, &self.api, &self.state, kind, name)
    }

    fn log(&self) -> String {
        read(&self.log)
    }

    fn pid(&self) -> u32 {
        self.proc.as_ref().expect("running").child.id()
    }

    /// Its `/metrics` text (read inside the namespace); "" when it does not answer.
    fn metrics(&self, ns: &Netns) -> String {
        let token = read(&self.state.join("api-token")).trim().to_string();
        let url = format!("{}/metrics", self.api);
        if !self.state.join("tls/ca.crt").exists() {
            return String::new();
        }
        let agent = support::api_agent(&self.state);
        ns.run(move || {
            agent
                .get(&url)
                .set("Authorization", &format!("Bearer {token}"))
                .timeout(Duration::from_secs(5))
                .call()
                .ok()
                .and_then(|r| r.into_string().ok())
                .unwrap_or_default()
        })
    }

    /// Its `bootplane_store_leader{group="GROUP"}`: None when not exported (yet).
    fn leads(&self, ns: &Netns, group: &str) -> Option<bool> {
        let text = self.metrics(ns);
        let label = format!("group=\"{group}\"");
        text.lines()
            .filter(|l| l.starts_with("bootplane_store_leader{") && l.contains(&label))
            .find_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .map(|v| v == 1.0)
    }
}

/// The sum of the samples of metric `name` whose labels contain every one of `labels`
/// (`key="value"`), 0 when there are none.
fn sample_sum(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, rest) = match series.split_once('{') {
                Some((n, rest)) => (n, rest),
                None => (series, ""),
            };
            (n == name && labels.iter().all(|lb| rest.contains(lb)))
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

/// Whether process `pid` descends from `ancestor` (through /proc's PPid).
fn descends_from(mut pid: u32, ancestor: u32) -> bool {
    for _ in 0..16 {
        if pid == ancestor {
            return true;
        }
        let status = read(Path::new(&format!("/proc/{pid}/status")));
        match status
            .lines()
            .find_map(|l| l.strip_prefix("PPid:"))
            .and_then(|v| v.trim().parse().ok())
        {
            Some(p) if p > 1 => pid = p,
            _ => return false,
        }
    }
    false
}

/// The `--set` overrides for appliance `name` on `etcd` (prefix `/e2e-cluster/`).
fn etcd_sets(etcd: &EtcdCluster, name: &str) -> Vec<String> {
    vec![
        "store.backend=\"etcd\"".to_string(),
        format!("store.etcd.endpoints={:?}", etcd.endpoints()),
        "store.etcd.prefix=\"/e2e-cluster/\"".to_string(),
        format!("store.etcd.name={name:?}"),
        "store.etcd.lease_ttl_secs=3".to_string(),
        format!(
            "store.encryption_key_file={:?}",
            etcd.key_file().display().to_string()
        ),
    ]
}

fn sets(kv: Vec<String>) -> Vec<String> {
    kv.into_iter()
        .flat_map(|kv| ["--set".to_string(), kv])
        .collect()
}

#[test]
fn machine_claimed_through_one_appliance_boots_from_the_other() {
    require_all();
    require("ldd");
    require("etcd");
    assert!(
        Path::new(IGNITION).exists(),
        "{IGNITION} missing (apt-get install ignition)"
    );
    let (vmlinuz, e1000) = debian_kernel();
    let lab = QemuLab::new(NET);
    let (b_ip, a_ip) = (lab.addr(1), lab.addr(2));
    // A's boot listener gets an address on the bridge too: reachable by the VM, but
    // nothing the VM is given points there.
    lab.ns
        .ip(&["addr", "add", &format!("{a_ip}/24"), "dev", "br0"]);
    let etcd = EtcdCluster::start_in(3, &lab.ns, "127.0.0.1");

    let images = lab.path("images");
    std::fs::create_dir_all(&images).unwrap();
    let rd = lab.path("initramfs.cpio");
    std::fs::write(&rd, initramfs(&e1000)).unwrap();
    write_catalog(
        &images,
        "os-image:latest",
        &std::fs::read(&vmlinuz).unwrap(),
        &std::fs::read(&rd).unwrap(),
        "panic=-1",
    );
    // Real firmware's path through TFTP: the ROM chains undionly.kpxe from B's TFTP.
    let t = ipxe_templates(lab.dir.path(), &[("boot.ipxe.j2", UNDIONLY_CHAIN_BOOT)]);
    let config = lab.path("bootplane.toml");
    std::fs::write(&config, lab.config(&images, &t)).unwrap();

    let mut a = Appliance {
        name: "a",
        api: api_url("127.0.0.1:9091"),
        state: lab.path("state-a"),
        log: lab.path("bootplane-a.log"),
        proc: None,
    };
    let mut b = Appliance {
        name: "b",
        api: api_url("127.0.0.1:9090"),
        state: lab.path("state-b"),
        log: lab.path("bootplane-b.log"),
        proc: None,
    };
    let logs = |a: &Appliance, b: &Appliance| {
        format!(
            "--- appliance a ---\n{}\n--- appliance b ---\n{}\n--- etcd ---\n{}",
            tail(&a.log(), 60),
            tail(&b.log(), 60),
            etcd.logs()
        )
    };

    // A first (API only), and A leads metal before B exists.
    let mut kv = etcd_sets(&etcd, a.name);
    kv.extend([
        format!("state_dir={:?}", a.state.display().to_string()),
        "api.listen=\"127.0.0.1:9091\"".to_string(),
        format!("http.listen=\"{a_ip}:8080\""),
        format!("http.public_url=\"http://{a_ip}:8080\""),
        "dhcp.enabled=false".to_string(),
        "tftp.enabled=false".to_string(),
    ]);
    a.proc = Some(serve_in_with(
        &lab.ns,
        &config,
        &sets(kv),
        &a.log,
        &["bootplane started"],
    ));
    wait_for(
        Duration::from_secs(30),
        || a.leads(&lab.ns, "metal") == Some(true),
        || format!("appliance a does not lead metal\n{}", tail(&a.log(), 60)),
    );

    // Then B: DHCP, TFTP and HTTP on the bridge (the lab's config), its API on 9090.
    let mut kv = etcd_sets(&etcd, b.name);
    kv.extend([
        format!("state_dir={:?}", b.state.display().to_string()),
        format!("dhcp.server_ip=\"{b_ip}\""),
    ]);
    b.proc = Some(serve_in_with(
        &lab.ns,
        &config,
        &sets(kv),
        &b.log,
        &[
            "dhcp server listening",
            "tftp server listening",
            "bootplane started",
        ],
    ));
    wait_for(
        Duration::from_secs(30),
        || b.leads(&lab.ns, "metal") == Some(false),
        || {
            format!(
                "appliance b exports no metal leader gauge\n{}",
                logs(&a, &b)
            )
        },
    );
    assert_eq!(
        a.leads(&lab.ns, "metal"),
        Some(true),
        "a leads metal once b runs"
    );
    let a_log = a.log();
    for service in ["dhcp server listening", "tftp server listening"] {
        assert!(
            !a_log.contains(service),
            "appliance a runs a boot service ({service})"
        );
    }

    // Everything is written through A.
    let s = Scenario {
        server: "cluster-linux",
        mac_last: 1,
        firmware: "bios",
        serial: &[
            "using 82540em",
            "Filename: http://10.199.65.1:8080/boot.ipxe",
            "bootplane-e2e: driver 82540em",
            "tftp://10.199.65.1/undionly.kpxe",
            "PXE->EB",
            "using undionly",
            "bootplane-e2e: driver undionly",
            "bootplane: identifying 52-54-00-e2-41-01 (",
            "-00e2-000000000001)",
            "http://10.199.65.1:8080/ipxe/script... ok",
            "bootplane: booting cluster-linux",
            "/assets/images/os/kernel",
            "/assets/images/os/initrd",
            "Linux version",
            "bootplane-e2e: linux init running",
            "bootplane-e2e: url http://10.199.65.1:8080/",
            "bootplane-e2e: ignition fetch ok",
            "hello-from-cluster-linux",
        ],
        boot_limit: Duration::from_secs(420),
        ignition: true,
    };
    let claim = format!("{}-claim", s.server);
    let out = a.cli(
        &lab.ns,
        &["apply", "-f", "-"],
        Some(&scenario_yaml(NET, &s)),
    );
    assert!(out.status.success(), "apply through a: {}", text(&out));

    // The metal leader (A) powers the machine on: the VM is A's.
    wait_for(
        Duration::from_secs(30),
        || {
            a.get_json(&lab.ns, "servers", s.server)
                .is_some_and(|v| v["status"]["powerState"] == "On")
        },
        || {
            format!(
                "server not powered on: {:?}\n{}",
                a.get_json(&lab.ns, "servers", s.server),
                logs(&a, &b)
            )
        },
    );
    std::thread::sleep(Duration::from_secs(1));
    let vms = qemu_pids(&lab.ns);
    assert_eq!(vms.len(), 1, "qemu processes after power On");
    assert!(
        descends_from(vms[0], a.pid()),
        "the VM was started by appliance a (the metal leader)"
    );
    assert!(!descends_from(vms[0], b.pid()), "the VM is not b's");

    let serial = || serial_at(&a.state, s.server);
    wait_console(&s, serial, || {
        format!(
            "--- qemu.log ---\n{}\n{}",
            read(&a.state.join(format!("qemu/{}/qemu.log", s.server))),
            logs(&a, &b)
        )
    });
    keep_log("cluster-linux.serial.log", &serial());
    keep_log("cluster-linux.bootplane-a.log", &a.log());
    keep_log("cluster-linux.bootplane-b.log", &b.log());
    let console = serial();
    assert!(
        !console.contains(&a_ip),
        "the VM was pointed at appliance a ({a_ip}):\n{console}"
    );

    // The conditions B recorded, read through A.
    wait_for(
        Duration::from_secs(30),
        || {
            a.get_json(&lab.ns, "sbc", &claim).is_some_and(|v| {
                condition_true(&v, "IPXEScriptFetched") && condition_true(&v, "IgnitionDataFetched")
            })
        },
        || {
            format!(
                "conditions not visible through a: {:?}\n{}",
                a.get_json(&lab.ns, "sbc", &claim),
                logs(&a, &b)
            )
        },
    );

    // B answered DHCP, TFTP, the script and Ignition; A answered none of them.
    let (ma, mb) = (a.metrics(&lab.ns), b.metrics(&lab.ns));
    assert!(!ma.is_empty() && !mb.is_empty(), "both export /metrics");
    let acks = sample_sum(&mb, "bootplane_dhcp_acks_total", &[]);
    // The ROM's iPXE, the chained undionly.kpxe and the initramfs's udhcpc.
    assert!(acks >= 3.0, "b's DHCP ACKs: {acks}\n{mb}");
    let tftp = sample_sum(&mb, "bootplane_tftp_transfers_completed_total", &[]);
    assert!(tftp >= 1.0, "b's TFTP transfers: {tftp}");
    for route in ["boot_ipxe", "script", "ignition", "assets"] {
        let n = sample_sum(
            &mb,
            "bootplane_http_requests_total",
            &[&format!("route=\"{route}\""), "code=\"200\""],
        );
        assert!(n >= 1.0, "b served no {route} request:\n{mb}");
    }
    assert_eq!(sample_sum(&ma, "bootplane_dhcp_acks_total", &[]), 0.0);
    assert_eq!(sample_sum(&ma, "bootplane_dhcp_offers_total", &[]), 0.0);
    assert_eq!(
        sample_sum(&ma, "bootplane_tftp_transfers_started_total", &[]),
        0.0
    );
    let a_http = sample_sum(&ma, "bootplane_http_requests_total", &[]);
    assert_eq!(a_http, 0.0, "appliance a served boot HTTP requests:\n{ma}");
    for progress in ["IPXEScriptFetched", "IgnitionDataFetched"] {
        let label = format!("event=\"{progress}\"");
        assert!(
            sample_sum(&mb, "bootplane_http_boot_progress_total", &[&label]) >= 1.0,
            "b recorded no {progress}"
        );
        assert_eq!(
            sample_sum(&ma, "bootplane_http_boot_progress_total", &[&label]),
            0.0,
            "a recorded {progress}"
        );
    }
    assert!(
        ma.contains("bootplane_http_requests_total"),
        "a exports its boot listener's metrics"
    );
    // The access logs: B's name the VM's script and Ignition, A's has none.
    let b_log = b.log();
    for path in [
        "path=/ipxe/script status=200",
        "path=/ignition/cluster-linux status=200",
    ] {
        assert!(
            b_log
                .lines()
                .any(|l| l.contains(path) && l.contains("server=\"cluster-linux\"")),
            "b's access log lacks {path}"
        );
    }
    assert!(
        !a.log().contains("bootplane::http::access"),
        "a's access log is not empty:\n{}",
        a.log()
    );
    let mac = "52:54:00:e2:41:01";
    let leases = b.cli(&lab.ns, &["get", "leases"], None);
    assert!(
        text(&leases).to_lowercase().contains(mac),
        "b's lease list lacks the VM: {}",
        text(&leases)
    );
    // Leadership did not move while the machine booted.
    assert_eq!(a.leads(&lab.ns, "metal"), Some(true), "a still leads metal");
    assert_eq!(
        b.leads(&lab.ns, "metal"),
        Some(false),
        "b does not lead metal"
    );

    // Unclaim through A: the VM stops, the server is Available again.
    let out = a.cli(&lab.ns, &["delete", "serverclaims", &claim], None);
    assert!(out.status.success(), "delete through a: {}", text(&out));
    wait_for(
        Duration::from_secs(30),
        || {
            a.get_json(&lab.ns, "servers", s.server).is_some_and(|v| {
                v["status"]["state"] == "Available" && v["status"]["powerState"] == "Off"
            })
        },
        || {
            format!(
                "server not released: {:?}",
                a.get_json(&lab.ns, "servers", s.server)
            )
        },
    );
    wait_for(
        Duration::from_secs(15),
        || qemu_pids(&lab.ns).is_empty(),
        || "qemu still running after the claim was deleted".into(),
    );
    drop(b.proc.take());
    drop(a.proc.take());
}
