//! Collector tests against fixture sysfs/procfs trees built in temporary directories.

use super::*;
use std::path::PathBuf;

/// A temporary root removed on drop (std only: this crate has no dev-dependencies).
pub(crate) struct Root(pub PathBuf);

impl Root {
    pub(crate) fn new(tag: &str) -> Root {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "bootplane-probe-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Root(p)
    }
    pub(crate) fn write(&self, rel: &str, data: impl AsRef<[u8]>) {
        let p = self.0.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    }
    fn link(&self, rel: &str, target: &str) {
        let p = self.0.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(target, p).unwrap();
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A disk: its device directory under sys/devices and the sys/block link to it.
fn disk(r: &Root, name: &str, devpath: &str, files: &[(&str, &[u8])]) {
    let dev = format!("sys/devices/{devpath}/block/{name}");
    for (f, v) in files {
        r.write(&format!("{dev}/{f}"), v);
    }
    r.link(
        &format!("sys/block/{name}"),
        &format!("../devices/{devpath}/block/{name}"),
    );
}

fn nic(r: &Root, name: &str, physical: bool, files: &[(&str, &str)]) {
    for (f, v) in files {
        r.write(&format!("sys/class/net/{name}/{f}"), v);
    }
    if physical {
        std::fs::create_dir_all(r.0.join(format!("sys/class/net/{name}/device"))).unwrap();
    }
}

#[test]
fn full_tree() {
    let r = Root::new("full");
    let table = crate::smbios::tests::sample_table();
    r.write("sys/firmware/dmi/tables/DMI", &table);
    let mut ep = vec![0u8; 0x18];
    ep[..5].copy_from_slice(b"_SM3_");
    ep[7] = 3;
    r.write("sys/firmware/dmi/tables/smbios_entry_point", &ep);
    nic(&r, "lo", false, &[("address", "00:00:00:00:00:00\n")]);
    nic(&r, "br0", false, &[("address", "02:00:00:00:00:01\n")]);
    nic(
        &r,
        "eth0",
        true,
        &[
            ("address", "52:54:00:AA:BB:01\n"),
            ("carrier", "1\n"),
            ("speed", "1000\n"),
        ],
    );
    // Down: carrier unreadable, speed -1.
    nic(
        &r,
        "eth1",
        true,
        &[("address", "52:54:00:aa:bb:02\n"), ("speed", "-1\n")],
    );
    let mut pg80 = vec![0x00, 0x80, 0x00, 0x0a];
    pg80.extend_from_slice(b"SCSI-SER-1");
    disk(
        &r,
        "sda",
        "pci0000:00/0000:00:03.0/virtio1/host0/target0:0:0/0:0:0:0",
        &[
            ("size", b"2097152\n"),
            ("device/model", b"Disk Model 16   \n"),
            ("device/vendor", b"ACME    \n"),
            ("device/vpd_pg80", &pg80),
            ("queue/rotational", b"1\n"),
        ],
    );
    disk(
        &r,
        "vda",
        "pci0000:00/0000:00:04.0/virtio2",
        &[
            ("size", b"100\n"),
            ("serial", b"VIRT-1\n"),
            ("device/vendor", b"0x1af4\n"),
        ],
    );
    disk(
        &r,
        "nvme0n1",
        "pci0000:00/0000:00:05.0/nvme/nvme0",
        &[
            ("size", b"8\n"),
            ("device/serial", b"  NVME-9  \n"),
            ("device/model", b"Fast\n"),
        ],
    );
    disk(&r, "loop0", "virtual", &[("size", b"8\n")]);
    disk(&r, "dm-0", "virtual", &[("size", b"8\n")]);
    disk(
        &r,
        "sr0",
        "pci0000:00/ata2/host1/target1:0:0/1:0:0:0",
        &[("size", b"8\n")],
    );

    let inv = inventory(&r.0);
    assert_eq!(inv.system_uuid, "12345678-1234-5678-9abc-def012345678");
    assert_eq!(inv.system.manufacturer.as_deref(), Some("Acme"));
    assert_eq!(inv.system.bios_version.as_deref(), Some("1.16.2"));
    assert_eq!(inv.memory_bytes, (1 << 30) + (64u64 << 30) + (512 << 10));
    assert_eq!(inv.cpus.len(), 2);
    assert_eq!(inv.cpus[0].id, "CPU 0");
    assert_eq!(inv.cpus[0].model.as_deref(), Some("Xeon X"));
    let nics: Vec<_> = inv
        .nics
        .iter()
        .map(|n| {
            (
                n.name.as_str(),
                n.mac_address.as_str(),
                n.carrier,
                n.speed_mbps,
            )
        })
        .collect();
    assert_eq!(
        nics,
        vec![
            ("eth0", "52:54:00:aa:bb:01", true, Some(1000)),
            ("eth1", "52:54:00:aa:bb:02", false, None)
        ]
    );
    let names: Vec<_> = inv.disks.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, vec!["nvme0n1", "sda", "vda"]);
    let sda = &inv.disks[1];
    assert_eq!(sda.size_bytes, 1 << 30);
    assert_eq!(sda.model.as_deref(), Some("Disk Model 16"));
    assert_eq!(sda.vendor.as_deref(), Some("ACME"));
    assert_eq!(sda.serial.as_deref(), Some("SCSI-SER-1"));
    assert!(sda.rotational);
    assert_eq!(sda.transport.as_deref(), Some("scsi"));
    assert_eq!(inv.disks[2].serial.as_deref(), Some("VIRT-1"));
    assert_eq!(inv.disks[2].transport.as_deref(), Some("virtio"));
    assert_eq!(inv.disks[2].vendor, None, "a PCI vendor id is not a vendor");
    assert_eq!(inv.disks[0].serial.as_deref(), Some("NVME-9"));
    assert_eq!(inv.disks[0].transport.as_deref(), Some("nvme"));
}

#[test]
fn fallbacks_without_smbios() {
    let r = Root::new("fallback");
    r.write(
        "sys/class/dmi/id/product_uuid",
        "ABCDEF01-2345-6789-ABCD-EF0123456789\n",
    );
    r.write(
        "proc/cpuinfo",
        "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Test CPU\nphysical id\t: 0\ncpu cores\t: 2\n\n\
         processor\t: 1\nvendor_id\t: GenuineIntel\nmodel name\t: Test CPU\nphysical id\t: 0\ncpu cores\t: 2\n\n\
         processor\t: 2\nvendor_id\t: GenuineIntel\nmodel name\t: Test CPU\nphysical id\t: 1\ncpu cores\t: 2\n\n",
    );
    r.write(
        "proc/meminfo",
        "MemTotal:        1000000 kB\nMemFree: 1 kB\n",
    );
    let inv = inventory(&r.0);
    assert_eq!(inv.system_uuid, "abcdef01-2345-6789-abcd-ef0123456789");
    assert_eq!(inv.memory_bytes, 1_024_000_000);
    assert_eq!(inv.cpus.len(), 2);
    assert_eq!((inv.cpus[0].cores, inv.cpus[0].threads), (2, 2));
    assert_eq!(inv.cpus[1].id, "package 1");
    assert!(inv.nics.is_empty() && inv.disks.is_empty());
}

#[test]
fn transports() {
    let t = |n: &str, p: &str| transport(n, p);
    assert_eq!(
        t(
            "sda",
            "../devices/pci0000:00/0000:00:1f.2/ata1/host0/target0:0:0/0:0:0:0/block/sda"
        )
        .as_deref(),
        Some("ata")
    );
    assert_eq!(t("sdb", "../devices/pci0000:00/0000:00:14.0/usb2/2-1/2-1:1.0/host6/target6:0:0/6:0:0:0/block/sdb").as_deref(), Some("usb"));
    assert_eq!(
        t(
            "vda",
            "../devices/pci0000:00/0000:00:04.0/virtio2/block/vda"
        )
        .as_deref(),
        Some("virtio")
    );
    assert_eq!(t("xyz", "../devices/platform/xyz").as_deref(), None);
}
