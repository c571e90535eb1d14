//! Collectors: the inventory read from a root directory (`/` on a machine, a fixture tree
//! in tests): SMBIOS from `sys/firmware/dmi/tables`, NICs from `sys/class/net`, disks
//! from `sys/block`, CPUs and memory from SMBIOS with `proc/cpuinfo` and `proc/meminfo`
//! as fallbacks. Runtime-only facts (IP addresses, the architecture, LLDP) are added by
//! [`crate::cli`]. Every file read is capped at [`MAX_FILE`] bytes (the DMI table at
//! [`crate::smbios::MAX_TABLE`]); directories at [`MAX_ENTRIES`] entries.

use std::io::Read;
use std::path::Path;

use crate::inventory::{Cpu, Disk, Inventory, Nic, SystemInfo};
use crate::smbios;

/// Largest sysfs/procfs file read.
pub const MAX_FILE: usize = 1 << 20;
/// Most entries read from one directory (NICs, disks).
pub const MAX_ENTRIES: usize = 1024;

/// Read at most `cap` bytes of a file.
pub fn read_capped(path: &Path, cap: usize) -> Option<Vec<u8>> {
    let f = std::fs::File::open(path).ok()?;
    let mut v = Vec::new();
    f.take(cap as u64).read_to_end(&mut v).ok()?;
    Some(v)
}

/// A small text attribute, trimmed; `None` when missing, unreadable or empty.
pub fn attr(path: &Path) -> Option<String> {
    let v = read_capped(path, 4096)?;
    smbios::clean(&v)
}

/// Sorted entry names of a directory (capped).
fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .take(MAX_ENTRIES)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// SMBIOS as the kernel exposes it; `None` when the table is missing.
pub fn read_smbios(root: &Path) -> Option<smbios::Smbios> {
    let dir = root.join("sys/firmware/dmi/tables");
    let table = read_capped(&dir.join("DMI"), smbios::MAX_TABLE)?;
    let version = read_capped(&dir.join("smbios_entry_point"), 64)
        .and_then(|ep| smbios::entry_point_version(&ep));
    Some(smbios::parse(&table, version))
}

/// The system UUID: SMBIOS type 1's, else the kernel's `product_uuid` (lowercase).
fn uuid_of(sm: &smbios::Smbios, root: &Path) -> Option<String> {
    sm.uuid.clone().or_else(|| {
        attr(&root.join("sys/class/dmi/id/product_uuid")).map(|u| u.to_ascii_lowercase())
    })
}

/// The system UUID as [`inventory`] reads it (empty when there is none).
pub fn system_uuid(root: &Path) -> String {
    uuid_of(&read_smbios(root).unwrap_or_default(), root).unwrap_or_default()
}

/// Everything readable from `root` (no IPs, no LLDP, no architecture).
pub fn inventory(root: &Path) -> Inventory {
    let sm = read_smbios(root).unwrap_or_default();
    let uuid = uuid_of(&sm, root);
    let cpus = if sm.processors.is_empty() {
        cpuinfo_packages(root)
    } else {
        sm.processors
            .iter()
            .map(|p| Cpu {
                id: p.socket.clone(),
                manufacturer: p.manufacturer.clone(),
                model: p.version.clone(),
                architecture: None,
                cores: p.cores,
                threads: p.threads,
                max_speed_mhz: p.max_speed_mhz,
            })
            .collect()
    };
    let memory_bytes = match sm.memory_bytes() {
        0 => meminfo_total(root).unwrap_or(0),
        n => n,
    };
    Inventory {
        system_uuid: uuid.unwrap_or_default(),
        system: SystemInfo {
            manufacturer: sm.manufacturer,
            product: sm.product,
            serial_number: sm.serial,
            sku: sm.sku,
            bios_version: sm.bios_version,
        },
        nics: nics(root),
        disks: disks(root),
        cpus,
        memory_bytes,
    }
}

/// Physical NICs: entries of `sys/class/net` with a `device` link (loopback, bridges,
/// veth, tun and bonds have none).
pub fn nics(root: &Path) -> Vec<Nic> {
    let base = root.join("sys/class/net");
    entries(&base)
        .into_iter()
        .filter(|n| n != "lo" && base.join(n).join("device").exists())
        .map(|name| {
            let d = base.join(&name);
            Nic {
                mac_address: attr(&d.join("address"))
                    .unwrap_or_default()
                    .to_ascii_lowercase(),
                // Reading `carrier` fails (EINVAL) while the interface is down: no carrier.
                carrier: attr(&d.join("carrier")).as_deref() == Some("1"),
                speed_mbps: attr(&d.join("speed"))
                    .and_then(|s| s.parse::<i64>().ok())
                    .filter(|&s| s > 0 && s < u32::MAX as i64)
                    .map(|s| s as u32),
                name,
                ips: Vec::new(),
                neighbors: Vec::new(),
            }
        })
        .collect()
}

/// Kernel disk name prefixes that are not disks.
const NOT_DISKS: &[&str] = &["loop", "ram", "zram", "dm-", "md", "sr", "fd", "nbd"];

/// Whole disks from `sys/block`.
pub fn disks(root: &Path) -> Vec<Disk> {
    let base = root.join("sys/block");
    entries(&base)
        .into_iter()
        .filter(|n| !NOT_DISKS.iter().any(|p| n.starts_with(p)))
        .map(|name| {
            let d = base.join(&name);
            let sectors: u64 = attr(&d.join("size"))
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            let link = std::fs::read_link(&d)
                .or_else(|_| std::fs::canonicalize(&d))
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default();
            Disk {
                size_bytes: sectors.saturating_mul(512),
                model: attr(&d.join("device/model")),
                // virtio-blk's `device/vendor` is the PCI vendor ID (0x1af4), not a vendor.
                vendor: attr(&d.join("device/vendor")).filter(|v| !v.starts_with("0x")),
                serial: disk_serial(&d),
                rotational: attr(&d.join("queue/rotational")).as_deref() == Some("1"),
                transport: transport(&name, &link),
                name,
            }
        })
        .collect()
}

/// The serial: `serial` (virtio-blk), `device/serial` (NVMe), or SCSI VPD page 0x80.
pub fn disk_serial(d: &Path) -> Option<String> {
    attr(&d.join("serial"))
        .or_else(|| attr(&d.join("device/serial")))
        .or_else(|| {
            let v = read_capped(&d.join("device/vpd_pg80"), 4096)?;
            let len = u16::from_be_bytes([*v.get(2)?, *v.get(3)?]) as usize;
            smbios::clean(v.get(4..(4 + len).min(v.len()))?)
        })
}

/// The transport from the kernel's device path (`../devices/pci0000:00/.../block/sda`).
pub fn transport(name: &str, path: &str) -> Option<String> {
    let has = |s: &str| path.split('/').any(|c| c.starts_with(s));
    let t = if has("usb") {
        "usb"
    } else if name.starts_with("nvme") || has("nvme") {
        "nvme"
    } else if has("ata") {
        "ata"
    } else if has("target") || has("host") {
        "scsi"
    } else if has("virtio") {
        "virtio"
    } else if name.starts_with("mmcblk") {
        "mmc"
    } else {
        return None;
    };
    Some(t.to_string())
}

/// One entry per physical package of `proc/cpuinfo` (when SMBIOS has no processors).
pub fn cpuinfo_packages(root: &Path) -> Vec<Cpu> {
    let Some(raw) = read_capped(&root.join("proc/cpuinfo"), MAX_FILE) else {
        return Vec::new();
    };
    let text = String::from_utf8_lossy(&raw);
    let mut out: Vec<(String, Cpu)> = Vec::new();
    for block in text.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let field = |k: &str| {
            block.lines().find_map(|l| {
                let (a, b) = l.split_once(':')?;
                (a.trim() == k).then(|| b.trim().to_string())
            })
        };
        let pkg = field("physical id").unwrap_or_else(|| "0".into());
        if let Some((_, cpu)) = out.iter_mut().find(|(p, _)| *p == pkg) {
            cpu.threads += 1;
            continue;
        }
        out.push((
            pkg.clone(),
            Cpu {
                id: format!("package {pkg}"),
                manufacturer: field("vendor_id"),
                model: field("model name"),
                architecture: None,
                cores: field("cpu cores").and_then(|c| c.parse().ok()).unwrap_or(1),
                threads: 1,
                max_speed_mhz: None,
            },
        ));
        if out.len() >= MAX_ENTRIES {
            break;
        }
    }
    out.into_iter().map(|(_, c)| c).collect()
}

/// `MemTotal` of `proc/meminfo` in bytes: what the kernel manages, a little less than
/// what is installed (used only when SMBIOS has no memory devices).
pub fn meminfo_total(root: &Path) -> Option<u64> {
    let raw = read_capped(&root.join("proc/meminfo"), MAX_FILE)?;
    String::from_utf8_lossy(&raw).lines().find_map(|l| {
        let kb = l
            .strip_prefix("MemTotal:")?
            .trim()
            .strip_suffix("kB")?
            .trim();
        kb.parse::<u64>().ok().map(|k| k * 1024)
    })
}

#[cfg(test)]
#[path = "collect_tests.rs"]
mod tests;
