//! End to end on three appliances sharing etcd (issues 21 and 35): a machine boots with
//! real firmware while its Server, its Ignition Secret and its ServerClaim were written
//! through another appliance than the ones that answer its boot, and while, mid-boot,
//! the appliance that was serving it is killed and the `metal` leader is paused.
//!
//! The lab (tests/support/qemu.rs) is one namespace with a bridge `br0`; in it:
//!
//! - a 3-member etcd cluster on the namespace's 127.0.0.1, which every appliance reaches
//!   (they run in that namespace; the host's loopback is not theirs);
//! - appliance **A**: API on 127.0.0.1:9091, its boot HTTP listener on 10.199.65.2 (an
//!   address of the bridge, so the VM could reach it), DHCP and TFTP off. It is started
//!   first and the test waits until it leads the `metal` controller group, so the metal
//!   controllers run on A: A powers the VM on (the `qemu` driver, a tap on `br0`);
//! - two boot appliances, **B** and **C**: authoritative DHCP on `br0`, TFTP and boot
//!   HTTP on an address each. The one that owns the VM's MAC among them (the DHCP
//!   members' rendezvous hash, `crates/proto/src/dhcp/members.rs`) is the *first*, on
//!   10.199.65.1 (API 127.0.0.1:9090); the other is the *second*, on 10.199.65.3 (API
//!   127.0.0.1:9092).
//!
//! The Server, the Secret and the ServerClaim are applied through A. The VM (SeaBIOS +
//! QEMU's iPXE ROM) gets its lease from the first (the second leaves its DISCOVER to
//! it), fetches `boot.ipxe` and chains `undionly.kpxe` from the first's TFTP. As soon as
//! that transfer is complete, the first is SIGKILLed and A SIGSTOPped. The chained
//! iPXE's DHCP is then answered by the second (once the first's membership lapsed, or on
//! its behalf if the first had OFFERed), and the script, a Debian kernel, an initramfs
//! and the Ignition config (fetched by the real `ignition` client) all come from the
//! second. Checked: the console (the first's address up to `undionly`, the second's
//! after), the boot progress conditions read through the second, the metrics of both
//! (A's boot services answered nothing), `metal` moving to the second while A is
//! paused; then A resumes (its leadership gone: it logs `lost leadership`), the second
//! is killed too, A leads `metal` again, and deleting the claim through A stops the VM.

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

use bootplane::dhcp::members::owner;
use bootplane::model::ident::parse_mac;

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
fn machine_boots_while_the_appliance_serving_it_is_killed_and_the_leader_paused() {
    require_all();
    require("ldd");
    require("etcd");
    assert!(
        Path::new(IGNITION).exists(),
        "{IGNITION} missing (apt-get install ignition)"
    );
    let (vmlinuz, e1000) = debian_kernel();
    let lab = QemuLab::new(NET);
    let (first_ip, a_ip, second_ip) = (lab.addr(1), lab.addr(2), lab.addr(3));
    // A's boot listener and the second's address on the bridge.
    for ip in [&a_ip, &second_ip] {
        lab.ns
            .ip(&["addr", "add", &format!("{ip}/24"), "dev", "br0"]);
    }
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
    // Real firmware's path through TFTP: the ROM chains undionly.kpxe from TFTP.
    let t = ipxe_templates(lab.dir.path(), &[("boot.ipxe.j2", UNDIONLY_CHAIN_BOOT)]);
    let config = lab.path("bootplane.toml");
    std::fs::write(&config, lab.config(&images, &t)).unwrap();

    // Which of b and c owns the VM's MAC: that one serves first, on the lab's address.
    let mac = "52:54:00:e2:41:01";
    let owner = owner(["b", "c"], &parse_mac(mac).unwrap()).unwrap();
    let (first_name, second_name) = if owner == "b" { ("b", "c") } else { ("c", "b") };
    let appliance = |name: &'static str, api: &str| Appliance {
        name,
        api: api_url(api),
        state: lab.path(&format!("state-{name}")),
        log: lab.path(&format!("bootplane-{name}.log")),
        proc: None,
    };
    let mut a = appliance("a", "127.0.0.1:9091");
    let mut first = appliance(first_name, "127.0.0.1:9090");
    let mut second = appliance(second_name, "127.0.0.1:9092");
    let logs = |all: &[&Appliance]| {
        let mut t = String::new();
        for p in all {
            t.push_str(&format!(
                "--- appliance {} ---\n{}\n",
                p.name,
                tail(&p.log(), 60)
            ));
        }
        t + "--- etcd ---\n" + &etcd.logs()
    };

    // A first (API only), and A leads metal before the others exist.
    let start = |p: &mut Appliance, extra: Vec<String>, ready: &[&str]| {
        let mut kv = etcd_sets(&etcd, p.name);
        kv.push(format!("state_dir={:?}", p.state.display().to_string()));
        kv.extend(extra);
        p.proc = Some(serve_in_with(&lab.ns, &config, &sets(kv), &p.log, ready));
    };
    let extra = vec![
        "api.listen=\"127.0.0.1:9091\"".to_string(),
        format!("http.listen=\"{a_ip}:8080\""),
        format!("http.public_url=\"http://{a_ip}:8080\""),
        "dhcp.enabled=false".to_string(),
        "tftp.enabled=false".to_string(),
    ];
    start(&mut a, extra, &["bootplane started"]);
    wait_for(
        Duration::from_secs(30),
        || a.leads(&lab.ns, "metal") == Some(true),
        || format!("appliance a does not lead metal\n{}", tail(&a.log(), 60)),
    );

    // The boot appliances: DHCP, TFTP and HTTP on the bridge, each on its address.
    let ready = [
        "dhcp server listening",
        "tftp server listening",
        "bootplane started",
    ];
    start(
        &mut first,
        vec![format!("dhcp.server_ip=\"{first_ip}\"")],
        &ready,
    );
    let extra = vec![
        "api.listen=\"127.0.0.1:9092\"".to_string(),
        format!("http.listen=\"{second_ip}:8080\""),
        format!("http.public_url=\"http://{second_ip}:8080\""),
        format!("tftp.listen=\"{second_ip}:69\""),
        format!("dhcp.server_ip=\"{second_ip}\""),
    ];
    start(&mut second, extra, &ready);
    for p in [&first, &second] {
        wait_for(
            Duration::from_secs(30),
            || {
                let m = p.metrics(&lab.ns);
                p.leads(&lab.ns, "metal") == Some(false)
                    && sample_sum(&m, "bootplane_dhcp_cluster_members", &[]) == 2.0
            },
            || {
                format!(
                    "appliance {} does not see both boot appliances\n{}",
                    p.name,
                    logs(&[&a, &first, &second])
                )
            },
        );
    }
    assert_eq!(a.leads(&lab.ns, "metal"), Some(true), "a leads metal");
    let a_log = a.log();
    for service in ["dhcp server listening", "tftp server listening"] {
        assert!(
            !a_log.contains(service),
            "appliance a runs a boot service ({service})"
        );
    }

    // Everything is written through A.
    let (f, s2) = (first_ip.as_str(), second_ip.as_str());
    let serial: Vec<String> = vec![
        "using 82540em".into(),
        format!("Filename: http://{f}:8080/boot.ipxe"),
        "bootplane-e2e: driver 82540em".into(),
        format!("tftp://{f}/undionly.kpxe"),
        "PXE->EB".into(),
        "using undionly".into(),
        format!("Filename: http://{s2}:8080/boot.ipxe"),
        "bootplane-e2e: driver undionly".into(),
        "bootplane: identifying 52-54-00-e2-41-01 (".into(),
        "-00e2-000000000001)".into(),
        format!("http://{s2}:8080/ipxe/script... ok"),
        "bootplane: booting cluster-linux".into(),
        "/assets/images/os/kernel".into(),
        "/assets/images/os/initrd".into(),
        "Linux version".into(),
        "bootplane-e2e: linux init running".into(),
        format!("bootplane-e2e: url http://{s2}:8080/"),
        "bootplane-e2e: ignition fetch ok".into(),
        "hello-from-cluster-linux".into(),
    ];
    let serial_refs: Vec<&str> = serial.iter().map(String::as_str).collect();
    let s = Scenario {
        server: "cluster-linux",
        mac_last: 1,
        firmware: "bios",
        serial: &serial_refs,
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
        || format!("server not powered on\n{}", logs(&[&a, &first, &second])),
    );
    std::thread::sleep(Duration::from_secs(1));
    let vms = qemu_pids(&lab.ns);
    assert_eq!(vms.len(), 1, "qemu processes after power On");
    assert!(
        descends_from(vms[0], a.pid()),
        "the VM was started by appliance a"
    );

    // The firmware loads undionly.kpxe from the first; then the first dies and A stops.
    wait_for(
        s.boot_limit,
        || {
            let m = first.metrics(&lab.ns);
            sample_sum(&m, "bootplane_tftp_transfers_completed_total", &[]) >= 1.0
        },
        || {
            format!(
                "no TFTP transfer from the first\n--- serial ---\n{}\n{}",
                serial_at(&a.state, s.server),
                logs(&[&a, &first, &second])
            )
        },
    );
    let first_metrics = first.metrics(&lab.ns);
    first.proc.as_mut().expect("running").kill9();
    must("kill", &["-STOP", &a.pid().to_string()]);
    eprintln!(
        "{} killed and a paused after the firmware's TFTP",
        first.name
    );

    let console = || serial_at(&a.state, s.server);
    wait_console(&s, console, || {
        format!(
            "--- qemu.log ---\n{}\n{}",
            read(&a.state.join(format!("qemu/{}/qemu.log", s.server))),
            logs(&[&a, &first, &second])
        )
    });
    keep_log("cluster-linux.serial.log", &console());
    for p in [&a, &first, &second] {
        keep_log(&format!("cluster-linux.bootplane-{}.log", p.name), &p.log());
    }
    let seen = console();
    assert!(
        !seen.contains(&a_ip),
        "the VM was pointed at appliance a ({a_ip}):\n{seen}"
    );

    // The conditions the second recorded, read through it; it leads metal meanwhile.
    wait_for(
        Duration::from_secs(30),
        || {
            second.get_json(&lab.ns, "sbc", &claim).is_some_and(|v| {
                condition_true(&v, "IPXEScriptFetched") && condition_true(&v, "IgnitionDataFetched")
            })
        },
        || format!("conditions not recorded\n{}", logs(&[&first, &second])),
    );
    wait_for(
        Duration::from_secs(30),
        || second.leads(&lab.ns, "metal") == Some(true),
        || {
            format!(
                "metal did not move to {}\n{}",
                second.name,
                logs(&[&second])
            )
        },
    );

    // Who answered what: the first the firmware (DHCP, boot.ipxe, TFTP), the second
    // the chained iPXE and Linux (DHCP, the script, the assets and Ignition).
    let m2 = second.metrics(&lab.ns);
    let acks = sample_sum(&first_metrics, "bootplane_dhcp_acks_total", &[]);
    assert!(acks >= 1.0, "the first's DHCP ACKs: {acks}");
    let acks = sample_sum(&m2, "bootplane_dhcp_acks_total", &[]);
    assert!(
        acks >= 2.0,
        "the second's DHCP ACKs (undionly, udhcpc): {acks}\n{m2}"
    );
    assert_eq!(sample_sum(&m2, "bootplane_dhcp_cluster_members", &[]), 1.0);
    for route in ["script", "ignition", "assets"] {
        let n = sample_sum(
            &m2,
            "bootplane_http_requests_total",
            &[&format!("route=\"{route}\""), "code=\"200\""],
        );
        assert!(n >= 1.0, "the second served no {route} request:\n{m2}");
    }
    for progress in ["IPXEScriptFetched", "IgnitionDataFetched"] {
        let label = format!("event=\"{progress}\"");
        assert!(
            sample_sum(&m2, "bootplane_http_boot_progress_total", &[&label]) >= 1.0,
            "the second recorded no {progress}"
        );
    }
    let leases = second.cli(&lab.ns, &["get", "leases"], None);
    assert!(
        text(&leases).to_lowercase().contains(mac),
        "the second's lease list lacks the VM: {}",
        text(&leases)
    );

    // A resumes: its leadership went with its lease; it leads again once the second is
    // gone too, and deleting the claim through it stops the VM.
    must("kill", &["-CONT", &a.pid().to_string()]);
    wait_for(
        Duration::from_secs(30),
        || a.log().contains("lost leadership"),
        || format!("a did not notice it lost metal\n{}", tail(&a.log(), 60)),
    );
    second.proc.as_mut().expect("running").kill9();
    wait_for(
        Duration::from_secs(30),
        || a.leads(&lab.ns, "metal") == Some(true),
        || format!("a does not lead metal again\n{}", tail(&a.log(), 60)),
    );
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
    drop(a.proc.take());
}
