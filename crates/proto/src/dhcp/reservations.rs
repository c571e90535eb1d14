//! Static DHCP reservations from the registered Servers (metal-operator `Server`
//! objects in the store), merged with the `[[dhcp.reservations]]` of the config file.
//!
//! Which fields give what (metal-operator `metal.ironcore.dev/v1alpha1` `Server`):
//! - the MACs: `status.networkInterfaces[].macAddress` (required per interface in the
//!   CRD; the Server spec itself carries no MAC);
//! - the reserved address: the first IPv4 address of that same interface, from
//!   `status.networkInterfaces[].ips[]` (or the deprecated `status.networkInterfaces[].ip`),
//!   that lies inside one of the configured DHCP subnets. That is the address the
//!   machine was discovered with (metal-operator's discovery fills it), so reserving it
//!   keeps a registered machine on the address the rest of the fleet knows it by.
//!   An interface with no such address gets no reservation (the machine is served from
//!   the dynamic pool like any other client). The subnet's router and the appliance's
//!   own address are never reserved for a Server (whoever may write a Server's status
//!   must not take them over);
//! - the hostname handed out with it (option 12): the Server's `metadata.name`;
//! - `spec.systemUUID` is logged with the reservation (the client's option 97 UUID is
//!   what the boot side matches, not DHCP).
//!
//! Conflicts: the config file wins over Servers (per MAC and per address); between
//! Servers the one whose name sorts first keeps an address both claim, the other
//! reservation is dropped with a warning. The watch re-lists after a compaction and
//! publishes the merged list on a `tokio::sync::watch` channel that the DHCP loop reads,
//! once per burst of events and only when a reservation changed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::Ipv4Addr;

use serde_json::Value;
use tokio::sync::watch;

use super::settings::{Reservation, Subnet};
use crate::model::ident::{Mac, MacFmt};
use crate::model::meta;
use crate::model::views::nics;
use crate::shutdown::Shutdown;
use crate::store::watcher::{Batch, Watcher};
use crate::store::Store;

/// The reservations one Server object asks for (see the module doc for the fields);
/// `appliance` is this appliance's address on the subnets (never reserved).
pub(crate) fn from_server(
    obj: &Value,
    subnets: &[Subnet],
    appliance: Option<Ipv4Addr>,
) -> Vec<Reservation> {
    let name = meta::name(obj);
    let mut out = Vec::new();
    for nic in nics(obj) {
        let Some(mac) = nic.mac else {
            continue;
        };
        let Some(ip) = nic.ips.iter().find_map(|a| match a {
            std::net::IpAddr::V4(ip)
                if Some(*ip) != appliance
                    && subnets
                        .iter()
                        .any(|s| s.contains(*ip) && s.router != Some(*ip)) =>
            {
                Some(*ip)
            }
            _ => None,
        }) else {
            continue;
        };
        out.push(Reservation {
            mac,
            ip,
            hostname: (!name.is_empty()).then(|| name.chars().take(63).collect()),
        });
    }
    out
}

/// Config reservations first, then the Servers' in name order; a MAC or an address
/// already taken by an earlier entry is skipped (and logged).
pub(crate) fn merge(
    config: &[Reservation],
    servers: &BTreeMap<String, Vec<Reservation>>,
) -> Vec<Reservation> {
    let mut out: Vec<Reservation> = Vec::new();
    let mut macs: HashSet<Mac> = HashSet::new();
    let mut ips: HashSet<Ipv4Addr> = HashSet::new();
    for r in config {
        if macs.insert(r.mac) && ips.insert(r.ip) {
            out.push(r.clone());
        }
    }
    for (server, list) in servers {
        for r in list {
            if macs.contains(&r.mac) || ips.contains(&r.ip) {
                tracing::warn!(server, ip = %r.ip, mac = %MacFmt(&r.mac),
                    "dhcp reservation conflicts with an earlier one; ignored");
                continue;
            }
            macs.insert(r.mac);
            ips.insert(r.ip);
            out.push(r.clone());
        }
    }
    out
}

/// [`watch_servers`] with the subnets and config-file reservations of `settings`.
pub fn start(
    store: Store,
    settings: &super::DhcpSettings,
    shutdown: Shutdown,
) -> watch::Receiver<Vec<Reservation>> {
    watch_servers(
        store,
        settings.reservations.clone(),
        settings.subnets.clone(),
        settings.server_ip,
        shutdown,
    )
}

/// Watch the store's Servers and publish the merged reservation list (config first)
/// whenever it changes. Ends on shutdown.
pub(crate) fn watch_servers(
    store: Store,
    config: Vec<Reservation>,
    subnets: Vec<Subnet>,
    appliance: Option<Ipv4Addr>,
    mut shutdown: Shutdown,
) -> watch::Receiver<Vec<Reservation>> {
    let (tx, rx) = watch::channel(config.clone());
    tokio::spawn(async move {
        let Some(t) = store.registry().resolve("server") else {
            return;
        };
        let mut per_server: BTreeMap<String, Vec<Reservation>> = BTreeMap::new();
        let publish = |per: &BTreeMap<String, Vec<Reservation>>| {
            let merged = merge(&config, per);
            tx.send_if_modified(|cur| {
                if *cur == merged {
                    false
                } else {
                    tracing::info!(count = merged.len(), "dhcp reservations updated");
                    *cur = merged;
                    true
                }
            });
        };
        // Every event already waiting is applied before one merge and publish:
        // registering a fleet is a burst of Server events, and merging the whole list
        // per event made that quadratic.
        let mut w = Watcher::new(store, "dhcp reservations")
            .with(t)
            .max_batch(usize::MAX);
        loop {
            let batch = tokio::select! {
                b = w.next() => b,
                _ = shutdown.recv() => return,
            };
            match batch {
                None => return,
                Some(Batch::Listed(servers)) => {
                    per_server.clear();
                    for (_, s) in servers {
                        let r = from_server(&s, &subnets, appliance);
                        if !r.is_empty() {
                            per_server.insert(meta::name(&s).to_string(), r);
                        }
                    }
                    publish(&per_server);
                }
                Some(Batch::Events(changes)) => {
                    // Events that leave a server's reservation as it was (status
                    // updates) change nothing.
                    let mut changed = false;
                    for c in changes {
                        let name = meta::name(&c.event.object).to_string();
                        let r = if c.deleted() {
                            Vec::new()
                        } else {
                            from_server(&c.event.object, &subnets, appliance)
                        };
                        if let Some(first) = r.first() {
                            tracing::debug!(server = %name, uuid = ?c.event.object.pointer("/spec/systemUUID"),
                                ip = %first.ip, "server reservation");
                        }
                        changed |= if r.is_empty() {
                            per_server.remove(&name).is_some()
                        } else if per_server.get(&name) == Some(&r) {
                            false
                        } else {
                            per_server.insert(name, r);
                            true
                        };
                    }
                    if changed {
                        publish(&per_server);
                    }
                }
            }
        }
    });
    rx
}

/// Index of a merged list by MAC (for tests and diagnostics).
pub fn by_mac(list: &[Reservation]) -> HashMap<Mac, Ipv4Addr> {
    list.iter().map(|r| (r.mac, r.ip)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn subnet() -> Vec<Subnet> {
        let c = super::super::settings::section_from_toml(
            "[dhcp]\nenabled = true\ninterface = \"x\"\nmode = \"authoritative\"\n[[dhcp.subnets]]\nnetwork = \"10.0.0.0/24\"\nranges = [\"10.0.0.100-10.0.0.200\"]\nrouter = \"10.0.0.1\"\n",
        )
        .unwrap();
        super::super::DhcpSettings::from_config(&c, "http://127.0.0.1:8080")
            .unwrap()
            .subnets
    }

    #[test]
    fn server_fields_give_mac_ip_and_name() {
        let s = json!({
            "kind": "Server", "metadata": {"name": "node-1"},
            "spec": {"systemUUID": "4c4c4544-0044-0044-0044-000000000001"},
            "status": {"networkInterfaces": [
                {"name": "eth0", "macAddress": "52:54:00:aa:bb:01", "ips": ["fe80::1", "192.168.9.9", "10.0.0.7"]},
                {"name": "eth1", "macAddress": "52-54-00-AA-BB-02", "ip": "10.0.0.8"},
                {"name": "eth2", "macAddress": "52:54:00:aa:bb:03"},
                {"name": "eth3", "macAddress": "garbage", "ips": ["10.0.0.9"]}
            ]}
        });
        let r = from_server(&s, &subnet(), None);
        assert_eq!(r.len(), 2, "{r:?}");
        assert_eq!(r[0].mac, [0x52, 0x54, 0, 0xaa, 0xbb, 1]);
        assert_eq!(r[0].ip, Ipv4Addr::new(10, 0, 0, 7));
        assert_eq!(r[0].hostname.as_deref(), Some("node-1"));
        assert_eq!((r[1].mac[5], r[1].ip), (2, Ipv4Addr::new(10, 0, 0, 8)));
        assert!(from_server(&json!({"metadata": {"name": "x"}}), &subnet(), None).is_empty());
        assert!(from_server(
            &json!({"status": {"networkInterfaces": "no"}}),
            &subnet(),
            None
        )
        .is_empty());
    }

    #[test]
    fn the_router_and_the_appliance_are_never_reserved() {
        let s = json!({
            "metadata": {"name": "node-1"},
            "status": {"networkInterfaces": [
                {"macAddress": "52:54:00:aa:bb:01", "ips": ["10.0.0.1"]},
                {"macAddress": "52:54:00:aa:bb:02", "ips": ["10.0.0.2"]},
                {"macAddress": "52:54:00:aa:bb:03", "ips": ["10.0.0.3"]}
            ]}
        });
        let r = from_server(&s, &subnet(), Some(Ipv4Addr::new(10, 0, 0, 2)));
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!(r[0].ip, Ipv4Addr::new(10, 0, 0, 3));
    }

    #[test]
    fn config_wins_then_server_name_order() {
        let r = |m: u8, ip: u8| Reservation {
            mac: [2, 0, 0, 0, 0, m],
            ip: Ipv4Addr::new(10, 0, 0, ip),
            hostname: None,
        };
        let config = vec![r(1, 10)];
        let mut servers = BTreeMap::new();
        servers.insert("b".to_string(), vec![r(3, 30), r(4, 11)]);
        servers.insert("a".to_string(), vec![r(1, 20), r(2, 30)]);
        servers.insert("c".to_string(), vec![r(5, 10)]);
        let m = by_mac(&merge(&config, &servers));
        assert_eq!(m.len(), 3, "{m:?}");
        assert_eq!(m[&[2, 0, 0, 0, 0, 1]], Ipv4Addr::new(10, 0, 0, 10));
        assert_eq!(m[&[2, 0, 0, 0, 0, 2]], Ipv4Addr::new(10, 0, 0, 30));
        assert_eq!(m[&[2, 0, 0, 0, 0, 4]], Ipv4Addr::new(10, 0, 0, 11));
    }
}
