//! The discovery image end to end: scripts/make-discovery-image.sh builds it (Debian's
//! kernel, busybox-static, the static agent; cached under CARGO_TARGET_TMPDIR), QEMU boots
//! it under TCG with user-mode networking (the guest reaches this test's 127.0.0.1
//! listener as 10.0.2.2; nothing leaves loopback), and the test's own HTTP listener
//! receives the agent's POST.
//!
//! The image is built into a catalog directory, and its `catalog-entry.toml` must parse
//! and resolve (files present with their SHA-256) through bootplane's own catalog code.
//!
//! - `inventory_matches_the_vm_and_it_powers_off`: 2 NICs (e1000 + virtio-net, fixed
//!   MACs), 2 virtio-scsi disks (`scsi-hd` with serial/vendor/product, different sizes,
//!   one non-rotational), 2 sockets, 1 GiB and SMBIOS types 0/1/4 set on the command line:
//!   the posted inventory equals that configuration exactly, the URL's path and query
//!   arrive intact, and after a 202 the VM powers itself off;
//! - `refused_inventory_is_not_retried`: the listener answers 403: exactly one POST, the
//!   agent says why on the console and does not power off (PID 1 exits, the kernel
//!   panics, and `panic=-1` reboots, which `-no-reboot` turns into QEMU exiting);
//! - `lldp_neighbours_are_heard_on_a_veth`: in a namespace of its own, python3 sends two
//!   switches' LLDP frames (and a non-LLDP one) into a veth; `bootplane probe --print` on
//!   the peer reports exactly those two neighbours;
//! - `bootplane_probe_prints_this_host`: `bootplane probe --print` on the test host prints
//!   an inventory the contract type reads back.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use bootplane::http::catalog::{Catalog, FileHasher};
use bootplane_probe::{Cpu, Disk, Inventory, Nic, SystemInfo};
use support::data::once_per_run;
use support::process::*;
use support::require::*;

const UUID: &str = "6f1c2b3a-4d5e-4f60-8a9b-0c1d2e3f4a5b";

/// Build the image once per test run (`once_per_run`, shared with tests/it/e2e_discovery.rs;
/// the script itself caches the downloads).
fn image() -> PathBuf {
    require_tools(&[
        "apt-get",
        "apt-cache",
        "dpkg-deb",
        "qemu-system-x86_64",
        "sha256sum",
        "file",
        "python3",
    ]);
    // Built straight into a catalog directory, as an operator would (images/<name>/).
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let images = tmp.join("discovery-images");
    let out = images.join("bootplane-discovery");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/make-discovery-image.sh");
    once_per_run("discovery-image", || {
        let o = run_cmd(
            Command::new(&script)
                .arg(&out)
                .env("CACHE_DIR", tmp.join("discovery-image/cache")),
            900,
        );
        assert!(
            o.status.success(),
            "make-discovery-image.sh failed:\n{}\n{}",
            text(&o),
            String::from_utf8_lossy(&o.stderr)
        );
    });
    // Its catalog entry is one bootplane's catalog reads and resolves to Ready files.
    let entry = read(&out.join("catalog-entry.toml"));
    let catalog = Catalog::parse(&entry).unwrap_or_else(|e| panic!("{e}: {entry}"));
    let resolved = FileHasher::new(&images)
        .resolve(&catalog, "bootplane-discovery:latest")
        .unwrap()
        .unwrap_or_else(|e| panic!("{e}: {entry}"));
    assert_eq!(resolved.cmdline, "console=ttyS0 panic=-1");
    assert_eq!(resolved.kernel, "bootplane-discovery/vmlinuz");
    assert_eq!(resolved.initrd, "bootplane-discovery/initramfs.img");
    out
}

/// One request the listener got.
struct Posted {
    target: String,
    body: Vec<u8>,
}

/// An HTTP listener on 127.0.0.1 answering every POST with `status`.
fn listener(status: &'static str) -> (u16, mpsc::Receiver<Posted>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let mut req = Vec::new();
            let mut buf = [0u8; 8192];
            let posted = loop {
                let Ok(n) = s.read(&mut buf) else { break None };
                if n == 0 || req.len() > 1 << 20 {
                    break None;
                }
                req.extend_from_slice(&buf[..n]);
                let Some(i) = req.windows(4).position(|w| w == b"\r\n\r\n") else {
                    continue;
                };
                let head = String::from_utf8_lossy(&req[..i]).into_owned();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("Content-Length: "))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                if req.len() >= i + 4 + len {
                    let target = head.split(' ').nth(1).unwrap_or_default().to_string();
                    break Some(Posted {
                        target,
                        body: req[i + 4..i + 4 + len].to_vec(),
                    });
                }
            };
            let _ = s.write_all(
                format!("HTTP/1.1 {status}\r\nContent-Length: 22\r\nConnection: close\r\n\r\nidentity check refused").as_bytes(),
            );
            if let Some(p) = posted {
                let _ = tx.send(p);
            }
        }
    });
    (port, rx)
}

/// The VM of these tests; returns (QEMU's exit, the serial console).
fn boot(dir: &Path, image: &Path, port: u16) -> (std::process::Output, String) {
    for (name, mib) in [("d1.img", 64u64), ("d2.img", 96)] {
        std::fs::File::create(dir.join(name))
            .unwrap()
            .set_len(mib << 20)
            .unwrap();
    }
    let serial = dir.join("serial.log");
    let append = format!(
        "console=ttyS0 panic=-1 bootplane.inventory=http://10.0.2.2:{port}/discovery/inventory?server=x&token=y \
         bootplane.lldp_wait=2"
    );
    let d = |n: &str| dir.join(n).to_string_lossy().into_owned();
    let mut c = Command::new("qemu-system-x86_64");
    c.args(["-machine", "pc,accel=tcg", "-m", "1024", "-smp", "2,sockets=2,cores=1,threads=1"])
        .args(["-display", "none", "-monitor", "none", "-no-reboot"])
        .args(["-serial", &format!("file:{}", serial.display())])
        .args(["-kernel", &image.join("vmlinuz").to_string_lossy()])
        .args(["-initrd", &image.join("initramfs.img").to_string_lossy()])
        .args(["-append", &append])
        .args(["-smbios", "type=0,vendor=Bootplane,version=BP-1.0"])
        .args(["-smbios", &format!("type=1,manufacturer=Bootplane,product=ProbeVM,serial=SN-1234,sku=SKU-9,uuid={UUID}")])
        .args(["-smbios", "type=4,manufacturer=BootplaneCPU,version=ProbeCore,max-speed=2500"])
        .args(["-netdev", "user,id=n0", "-device", "e1000,netdev=n0,mac=52:54:00:12:34:01"])
        .args(["-netdev", "user,id=n1"])
        .args(["-device", "virtio-net-pci,netdev=n1,mac=52:54:00:12:34:02,speed=10000,duplex=full"])
        .args(["-device", "virtio-scsi-pci,id=scsi0"])
        .args(["-drive", &format!("file={},format=raw,if=none,id=d1", d("d1.img"))])
        .args(["-device", "scsi-hd,drive=d1,bus=scsi0.0,scsi-id=0,lun=0,serial=SER-A1,vendor=ACME,product=FastDisk,rotation_rate=1"])
        .args(["-drive", &format!("file={},format=raw,if=none,id=d2", d("d2.img"))])
        .args(["-device", "scsi-hd,drive=d2,bus=scsi0.0,scsi-id=1,lun=0,serial=SER-B2,vendor=ACME,product=BigDisk"]);
    let o = run_for(&mut c, Duration::from_secs(420));
    (o, strip_ansi(&read(&serial)))
}

fn expected() -> Inventory {
    let nic = |name: &str, mac: &str, speed: u32| Nic {
        name: name.into(),
        mac_address: mac.into(),
        carrier: true,
        speed_mbps: Some(speed),
        ips: Vec::new(),
        neighbors: Vec::new(),
    };
    let disk = |name: &str, mib: u64, model: &str, serial: &str, rotational: bool| Disk {
        name: name.into(),
        size_bytes: mib << 20,
        model: Some(model.into()),
        vendor: Some("ACME".into()),
        serial: Some(serial.into()),
        rotational,
        transport: Some("scsi".into()),
    };
    let cpu = |id: &str| Cpu {
        id: id.into(),
        manufacturer: Some("BootplaneCPU".into()),
        model: Some("ProbeCore".into()),
        architecture: Some("x86_64".into()),
        cores: 1,
        threads: 1,
        max_speed_mhz: Some(2500),
    };
    Inventory {
        system_uuid: UUID.into(),
        system: SystemInfo {
            manufacturer: Some("Bootplane".into()),
            product: Some("ProbeVM".into()),
            serial_number: Some("SN-1234".into()),
            sku: Some("SKU-9".into()),
            bios_version: Some("BP-1.0".into()),
        },
        nics: vec![
            nic("eth0", "52:54:00:12:34:01", 1000),
            nic("eth1", "52:54:00:12:34:02", 10000),
        ],
        disks: vec![
            disk("sda", 64, "FastDisk", "SER-A1", false),
            disk("sdb", 96, "BigDisk", "SER-B2", true),
        ],
        cpus: vec![cpu("CPU 0"), cpu("CPU 1")],
        memory_bytes: 1 << 30,
    }
}

#[test]
fn inventory_matches_the_vm_and_it_powers_off() {
    let image = image();
    let dir = tempfile::tempdir().unwrap();
    let (port, rx) = listener("202 Accepted");
    let (o, console) = boot(dir.path(), &image, port);
    let posted = rx
        .try_recv()
        .unwrap_or_else(|_| panic!("no inventory posted; serial console:\n{console}"));
    assert_eq!(
        posted.target, "/discovery/inventory?server=x&token=y",
        "{console}"
    );
    let mut inv: Inventory = serde_json::from_slice(&posted.body)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&posted.body)));
    // Addresses: the slirp lease on each NIC (IPv6 autoconfiguration varies with timing).
    for n in &mut inv.nics {
        assert!(
            n.ips.iter().any(|ip| ip == "10.0.2.15"),
            "{}: {:?}\n{console}",
            n.name,
            n.ips
        );
        n.ips.clear();
    }
    // Disk names follow the kernel's probe order, which varies from boot to boot: both
    // names must be there, and each disk is compared by its serial number.
    let by_serial = |inv: &mut Inventory| {
        let mut names: Vec<String> = inv
            .disks
            .iter_mut()
            .map(|d| std::mem::take(&mut d.name))
            .collect();
        names.sort();
        inv.disks.sort_by(|a, b| a.serial.cmp(&b.serial));
        names
    };
    let mut want = expected();
    assert_eq!(by_serial(&mut inv), by_serial(&mut want), "disk names");
    assert_eq!(inv, want, "serial console:\n{console}");
    assert!(rx.try_recv().is_err(), "one post only");
    assert!(
        o.status.success(),
        "qemu: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        console.contains("bootplane probe: inventory accepted (202)"),
        "{console}"
    );
    assert!(
        console.contains("reboot: Power down"),
        "the VM powers itself off:\n{console}"
    );
    assert!(!console.contains("Kernel panic"), "{console}");
}

#[test]
fn refused_inventory_is_not_retried() {
    let image = image();
    let dir = tempfile::tempdir().unwrap();
    let (port, rx) = listener("403 Forbidden");
    let (o, console) = boot(dir.path(), &image, port);
    assert!(rx.try_recv().is_ok(), "one post:\n{console}");
    assert!(rx.try_recv().is_err(), "no retry after a 403:\n{console}");
    assert!(
        o.status.success(),
        "qemu: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        console.contains(
            "bootplane probe: inventory refused (403): identity check refused; not retrying"
        ),
        "{console}"
    );
    assert!(!console.contains("reboot: Power down"), "{console}");
    assert!(
        console.contains("Kernel panic"),
        "PID 1 exits after a refusal:\n{console}"
    );
}

#[test]
fn bootplane_probe_prints_this_host() {
    let o = run_cmd(
        Command::new(env!("CARGO_BIN_EXE_bootplane")).args([
            "probe",
            "--print",
            "--lldp-wait",
            "0",
        ]),
        60,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let inv: Inventory =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
    assert!(!inv.cpus.is_empty(), "{inv:?}");
    assert_eq!(
        inv.cpus[0].architecture.as_deref(),
        Some(std::env::consts::ARCH)
    );
    assert!(inv.memory_bytes > 0, "{inv:?}");
    // Usage errors exit 2 with the usage text.
    let o = run_cmd(
        Command::new(env!("CARGO_BIN_EXE_bootplane")).args(["probe", "--bogus"]),
        60,
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("usage: bootplane probe"));
}

/// A switch's LLDP frames (sent by python3 through an AF_PACKET socket on one end of a
/// veth pair in a namespace this test creates) are heard by `bootplane probe` on the
/// other end: the whole command, with a fixture root naming that NIC.
#[test]
fn lldp_neighbours_are_heard_on_a_veth() {
    require_tools(&["ip", "python3"]);
    let ns = support::netns::Netns::new("lldp");
    ns.ip(&["link", "add", "sw0", "type", "veth", "peer", "name", "nic0"]);
    ns.ip(&["link", "set", "sw0", "up"]);
    ns.ip(&["link", "set", "nic0", "up"]);
    let root = tempfile::tempdir().unwrap();
    let nic = root.path().join("sys/class/net/nic0");
    std::fs::create_dir_all(nic.join("device")).unwrap();
    std::fs::write(nic.join("address"), "52:54:00:99:00:01\n").unwrap();
    std::fs::write(nic.join("carrier"), "1\n").unwrap();
    // Two switches on the wire (a second chassis, same port) and a non-LLDP frame, every
    // 200 ms until killed.
    let sender = r#"
import socket, struct, time
def tlv(k, v): return struct.pack(">H", (k << 9) | len(v)) + v
def frame(chassis, name):
    return (bytes.fromhex("0180c200000e021122334455") + b"\x88\xcc" + tlv(1, b"\x04" + chassis)
            + tlv(2, b"\x05swp1") + tlv(3, b"\x00\x78") + tlv(4, b"to rack 9")
            + tlv(5, name) + tlv(6, b"Switch OS 4.2") + b"\x00\x00")
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind(("sw0", 0))
while True:
    s.send(frame(bytes.fromhex("021122334455"), b"leaf-01"))
    s.send(frame(bytes.fromhex("02aabbccddee"), b"leaf-02"))
    s.send(bytes.fromhex("ffffffffffff021122334455") + b"\x08\x00" + b"\x00" * 46)
    time.sleep(0.2)
"#;
    let mut c = ns.cmd("python3");
    c.args(["-c", sender]);
    let _sender = Proc::spawn(c);
    let mut c = ns.cmd(env!("CARGO_BIN_EXE_bootplane"));
    c.args(["probe", "--print", "--lldp-wait", "2", "--root"])
        .arg(root.path());
    let o = run_cmd(&mut c, 60);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let inv: Inventory =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
    assert_eq!(inv.nics.len(), 1, "{inv:?}");
    let mut heard = inv.nics[0].neighbors.clone();
    heard.sort_by(|a, b| a.system_name.cmp(&b.system_name));
    let neighbour = |mac: &str, name: &str| bootplane_probe::Neighbor {
        mac_address: Some(mac.into()),
        chassis_id: Some(mac.into()),
        port_id: Some("swp1".into()),
        port_description: Some("to rack 9".into()),
        system_name: Some(name.into()),
        system_description: Some("Switch OS 4.2".into()),
    };
    assert_eq!(
        heard,
        vec![
            neighbour("02:11:22:33:44:55", "leaf-01"),
            neighbour("02:aa:bb:cc:dd:ee", "leaf-02")
        ]
    );
}
