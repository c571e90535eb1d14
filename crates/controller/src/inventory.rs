//! Inventory reports → Server status: the writer behind the boot listener's
//! `POST /discovery/inventory` (the listener checks identity and shape and queues; this
//! writes, off the request path).
//!
//! A report adds to `status.networkInterfaces` (name, MAC, carrier, IPs, LLDP
//! neighbours): the interfaces already there (the BMC's, the operator's) and their
//! addresses stay, a reported MAC updates its interface or is appended, and addresses
//! inside a dynamic DHCP range are left out (a pool address is the lease's, not the
//! machine's: registered, it would become the machine's identity and a reservation).
//! It fills
//! `status.storages` (one storage per transport, its drives with capacity, model, vendor,
//! media type), `status.processors`, `status.totalSystemMemory` and, where the BMC left
//! them empty, manufacturer/model/serial/SKU/BIOS version; drive serial numbers (the
//! CRD's drives have no field for them) go into the annotation
//! [`DRIVE_SERIALS_ANNOTATION`]. The condition `Discovered` turns True (reason
//! `InventoryReported`), and the Server reconciler powers the machine off and makes it
//! `Available`. A report for a Server no longer in `Discovery`, or for another discovery
//! boot than the one it was accepted for, is dropped.

use std::collections::BTreeMap;
use std::net::IpAddr;

use bootplane_probe::Inventory;
use serde_json::{json, Value};

use super::set_condition;
use crate::dhcp::settings::Subnet;
use crate::http::AgentReport;
use crate::model::ident::{parse_mac, MacFmt};
use crate::model::meta;
use crate::model::registry::ResourceType;
use crate::model::views::{read, Server, ServerState};
use crate::store::{Modified, Part, Store, StoreError};

/// Annotation holding the drives' serial numbers (`{"sda": "SERIAL", ...}` as JSON).
pub(crate) const DRIVE_SERIALS_ANNOTATION: &str = "bootplane.dev/drive-serials";
/// The condition a report sets.
pub(crate) const DISCOVERED: &str = "Discovered";

/// The `boot_id` of a Server's discovery boot: its uid (new for a re-created Server)
/// and its boot generation (new for each attempt, [`super::powerstate::boot_generation`]).
pub(crate) fn boot_id(server: &Value) -> String {
    format!(
        "discovery/{}/{}",
        meta::uid(server),
        super::powerstate::boot_generation(&read(server)).0
    )
}

/// A Kubernetes quantity for `bytes`: the largest binary suffix that divides it exactly.
pub fn quantity(bytes: u64) -> String {
    for (shift, suffix) in [(50, "Pi"), (40, "Ti"), (30, "Gi"), (20, "Mi"), (10, "Ki")] {
        if bytes != 0 && bytes.is_multiple_of(1u64 << shift) {
            return format!("{}{suffix}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// Write `inv` into `status` (and the drive serials into `annotations`); `dynamic`
/// says which addresses are in a dynamic DHCP range (left out).
pub fn apply(
    status: &mut Value,
    annotations: &mut BTreeMap<String, String>,
    inv: &Inventory,
    dynamic: &dyn Fn(IpAddr) -> bool,
) {
    merge_nics(status, inv, dynamic);
    let mut storages: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let mut serials = BTreeMap::new();
    for d in &inv.disks {
        let transport = d.transport.clone().unwrap_or_else(|| "unknown".into());
        let mut drive = json!({
            "name": d.name,
            "capacity": quantity(d.size_bytes),
            "mediaType": if d.rotational { "HDD" } else { "SSD" },
            "type": transport,
        });
        for (k, f) in [("model", &d.model), ("vendor", &d.vendor)] {
            if let Some(f) = f {
                drive[k] = json!(f);
            }
        }
        if let Some(s) = &d.serial {
            serials.insert(d.name.clone(), s.clone());
        }
        storages.entry(transport).or_default().push(drive);
    }
    status["storages"] = storages
        .into_iter()
        .map(|(name, drives)| json!({"name": name, "drives": drives}))
        .collect();
    status["processors"] = inv
        .cpus
        .iter()
        .map(|c| {
            let mut p = json!({
                "id": c.id,
                "type": "CPU",
                "totalCores": c.cores,
                "totalThreads": c.threads,
            });
            for (k, f) in [
                ("manufacturer", &c.manufacturer),
                ("model", &c.model),
                ("architecture", &c.architecture),
            ] {
                if let Some(f) = f {
                    p[k] = json!(f);
                }
            }
            if let Some(mhz) = c.max_speed_mhz {
                p["maxSpeedMHz"] = json!(mhz);
            }
            p
        })
        .collect();
    status["totalSystemMemory"] = json!(quantity(inv.memory_bytes));
    let s = &inv.system;
    for (k, f) in [
        ("manufacturer", &s.manufacturer),
        ("model", &s.product),
        ("serialNumber", &s.serial_number),
        ("sku", &s.sku),
        ("biosVersion", &s.bios_version),
    ] {
        if let Some(f) = f.as_deref().filter(|f| !f.trim().is_empty()) {
            if status
                .get(k)
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
            {
                status[k] = json!(f);
            }
        }
    }
    if serials.is_empty() {
        annotations.remove(DRIVE_SERIALS_ANNOTATION);
    } else {
        annotations.insert(
            DRIVE_SERIALS_ANNOTATION.into(),
            serde_json::to_string(&serials).unwrap_or_default(),
        );
    }
}

/// Add the report's interfaces to `status.networkInterfaces` (see the module doc).
fn merge_nics(status: &mut Value, inv: &Inventory, dynamic: &dyn Fn(IpAddr) -> bool) {
    let mut nics: Vec<Value> = status
        .get("networkInterfaces")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for n in &inv.nics {
        let parsed = parse_mac(&n.mac_address).ok();
        let mac = parsed
            .map(|m| MacFmt(&m).to_string())
            .unwrap_or_else(|| n.mac_address.clone());
        let ips = n
            .ips
            .iter()
            .filter(|a| !a.parse().is_ok_and(dynamic))
            .cloned();
        let held = nics.iter_mut().find(|e| {
            parsed.is_some()
                && e.get("macAddress")
                    .and_then(Value::as_str)
                    .and_then(|m| parse_mac(m.trim()).ok())
                    == parsed
        });
        let v = match held {
            Some(e) => e,
            None => {
                nics.push(json!({"macAddress": mac}));
                nics.last_mut().expect("pushed")
            }
        };
        v["name"] = json!(n.name);
        v["carrierStatus"] = json!(if n.carrier { "Up" } else { "Down" });
        let held_ips: Vec<String> = v
            .get("ips")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .chain(v.get("ip"))
            .filter_map(Value::as_str)
            .map(String::from)
            .collect();
        let mut all: Vec<String> = Vec::new();
        for ip in held_ips.into_iter().chain(ips) {
            if !all.contains(&ip) {
                all.push(ip);
            }
        }
        if let Some(first) = all.first() {
            v["ip"] = json!(first);
            v["ips"] = json!(all);
        }
        if !n.neighbors.is_empty() {
            v["neighbors"] = n
                .neighbors
                .iter()
                .map(|nb| {
                    let mut o = serde_json::Map::new();
                    for (k, f) in [
                        ("macAddress", &nb.mac_address),
                        ("portID", &nb.port_id),
                        ("portDescription", &nb.port_description),
                        ("systemName", &nb.system_name),
                        ("systemDescription", &nb.system_description),
                    ] {
                        if let Some(f) = f {
                            o.insert(k.into(), json!(f));
                        }
                    }
                    Value::Object(o)
                })
                .collect();
        }
    }
    status["networkInterfaces"] = json!(nics);
}

/// Write one inventory report onto its Server (for the discovery boot under way; any
/// other is dropped).
pub(crate) async fn write(
    store: &Store,
    t: &ResourceType,
    (r, inv): (&AgentReport, &bootplane_probe::Inventory),
    pools: &[Subnet],
    events: &crate::store::events::Recorder,
) -> Result<(), StoreError> {
    let dynamic = |a: IpAddr| match a {
        IpAddr::V4(a) => pools.iter().any(|p| p.in_pool(a)),
        IpAddr::V6(_) => false,
    };
    // The report is for this Server's discovery boot under way.
    let current = |s: &Value| {
        read::<Server>(s).status.state == Some(ServerState::Discovery) && boot_id(s) == r.boot_id
    };
    let over =
        || tracing::info!(server = %r.server, "inventory report for a boot that is over, dropped");
    // The drive serials first (a merge patch, retried by the store on conflicts)...
    let s = store.get(t, None, &r.server)?;
    if !current(&s) {
        over();
        return Ok(());
    }
    let mut annotations = read::<Server>(&s).metadata.annotations;
    let before = annotations.clone();
    apply(&mut json!({}), &mut annotations, inv, &dynamic);
    if annotations != before {
        let patch = json!({"metadata": {
            "annotations": {DRIVE_SERIALS_ANNOTATION: annotations.get(DRIVE_SERIALS_ANNOTATION)},
        }});
        store.patch(t, None, &r.server, &patch, Part::Main).await?;
    }
    // ...then the status, read again and redone on a conflict.
    let msg = format!(
        "inventory reported from {}: {} NIC(s), {} disk(s), {} CPU(s), {} memory",
        r.client,
        inv.nics.len(),
        inv.disks.len(),
        inv.cpus.len(),
        quantity(inv.memory_bytes)
    );
    let mut dropped = false;
    let written = store
        .modify_status(t, None, &r.server, |s, st| {
            dropped = !current(s);
            if !dropped {
                apply(st, &mut BTreeMap::new(), inv, &dynamic);
                set_condition(st, DISCOVERED, true, "InventoryReported", &msg);
            }
            !dropped
        })
        .await?;
    if dropped {
        over();
    }
    if let Modified::Written { before, after } = written {
        events.status_change(t, &before, before.get("status"), &after["status"]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bootplane_probe::{Cpu, Disk, Nic};

    #[test]
    fn quantities_use_exact_binary_suffixes() {
        assert_eq!(quantity(1 << 30), "1Gi");
        assert_eq!(quantity(3 << 29), "1536Mi");
        assert_eq!(quantity(1000), "1000");
        assert_eq!(quantity(0), "0");
        assert_eq!(quantity(10 << 40), "10Ti");
    }

    #[test]
    fn a_report_adds_to_the_interfaces_and_skips_pool_addresses() {
        let nic = |mac: &str, ips: &[&str]| Nic {
            name: "eth0".into(),
            mac_address: mac.into(),
            ips: ips.iter().map(|s| s.to_string()).collect(),
            ..Nic::default()
        };
        let inv = Inventory {
            nics: vec![
                nic("52:54:00:aa:00:01", &["10.0.0.50", "10.0.1.9"]),
                nic("52:54:00:aa:00:03", &["10.0.0.51"]),
            ],
            ..Inventory::default()
        };
        let mut st = json!({"networkInterfaces": [
            {"name": "NIC.1", "macAddress": "52:54:00:AA:00:01"},
            {"name": "eth1", "macAddress": "52:54:00:aa:00:02", "ip": "10.0.0.7", "ips": ["10.0.0.7"]},
        ]});
        let pool = |a: IpAddr| a.to_string().starts_with("10.0.0.5");
        apply(&mut st, &mut BTreeMap::new(), &inv, &pool);
        let n = st["networkInterfaces"].as_array().unwrap();
        assert_eq!(n.len(), 3, "{n:?}");
        assert_eq!(
            n[0]["macAddress"], "52:54:00:AA:00:01",
            "the BMC's entry kept"
        );
        assert_eq!(n[0]["ips"], json!(["10.0.1.9"]), "pool address left out");
        assert_eq!(n[1]["ips"], json!(["10.0.0.7"]), "an unreported NIC stays");
        assert_eq!(n[2]["macAddress"], "52:54:00:aa:00:03");
        assert!(n[2].get("ips").is_none(), "{:?}", n[2]);
    }

    #[test]
    fn a_report_fills_the_status() {
        let inv = Inventory {
            system_uuid: "5a2c0000-0000-4000-8000-000000000001".into(),
            nics: vec![Nic {
                name: "eth0".into(),
                mac_address: "52:54:00:AA:00:01".into(),
                carrier: true,
                ips: vec!["10.0.0.5".into()],
                ..Nic::default()
            }],
            disks: vec![
                Disk {
                    name: "sda".into(),
                    size_bytes: 2 << 30,
                    model: Some("QEMU HARDDISK".into()),
                    serial: Some("S1".into()),
                    transport: Some("scsi".into()),
                    ..Disk::default()
                },
                Disk {
                    name: "sdb".into(),
                    size_bytes: 1 << 30,
                    rotational: true,
                    transport: Some("scsi".into()),
                    ..Disk::default()
                },
            ],
            cpus: vec![Cpu {
                id: "CPU 0".into(),
                cores: 2,
                threads: 4,
                max_speed_mhz: Some(2000),
                ..Cpu::default()
            }],
            memory_bytes: 1 << 30,
            ..Inventory::default()
        };
        let mut st = json!({"manufacturer": "BMC says"});
        let mut ann = BTreeMap::new();
        apply(&mut st, &mut ann, &inv, &|_| false);
        assert_eq!(
            st["networkInterfaces"][0]["macAddress"],
            "52:54:00:aa:00:01"
        );
        assert_eq!(st["networkInterfaces"][0]["carrierStatus"], "Up");
        assert_eq!(st["networkInterfaces"][0]["ips"], json!(["10.0.0.5"]));
        assert_eq!(st["storages"][0]["name"], "scsi");
        assert_eq!(st["storages"][0]["drives"][0]["capacity"], "2Gi");
        assert_eq!(st["storages"][0]["drives"][0]["mediaType"], "SSD");
        assert_eq!(st["storages"][0]["drives"][1]["mediaType"], "HDD");
        assert_eq!(st["processors"][0]["totalThreads"], 4);
        assert_eq!(st["totalSystemMemory"], "1Gi");
        assert_eq!(st["manufacturer"], "BMC says");
        assert_eq!(ann[DRIVE_SERIALS_ANNOTATION], r#"{"sda":"S1"}"#);
    }
}
