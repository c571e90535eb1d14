//! In-memory [`BootIndex`]: machines keyed by UUID, MAC and IP, plus a log of boot
//! progress events. Used by the tests and as the cache the store-backed index fills
//! from its watch.
//!
//! A key two machines share (the store refuses a second Server with a taken MAC or
//! UUID, but objects stored before that rule may still share one) maps to both, the
//! first indexed winning lookups; removing one machine leaves the key to the other.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

use super::{BootEvent, BootIndex, MachineBoot, MachineId};

/// One recorded boot progress event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgressRecord {
    pub server: String,
    pub event: BootEvent,
    pub client: IpAddr,
    pub at: SystemTime,
}

/// The machines holding a key, first indexed first (almost always one).
type Owners = Vec<String>;

#[derive(Default)]
struct Maps {
    by_name: HashMap<String, Arc<MachineBoot>>,
    by_uuid: HashMap<String, Owners>,
    by_mac: HashMap<[u8; 6], Owners>,
    by_ip: HashMap<IpAddr, Owners>,
}

/// Machines held in memory behind a read-mostly lock.
#[derive(Default)]
pub struct MemoryIndex {
    maps: RwLock<Maps>,
    events: Mutex<Vec<ProgressRecord>>,
    /// One-shot Ignition: the boot (`boot_id`) each server was last served its
    /// Ignition in, until [`MemoryIndex::power_cycled`].
    served: Mutex<HashMap<String, String>>,
}

fn add<K: std::hash::Hash + Eq>(map: &mut HashMap<K, Owners>, k: K, name: &str) {
    let owners = map.entry(k).or_default();
    if !owners.iter().any(|n| n == name) {
        owners.push(name.to_string());
    }
}

fn drop_owner<K: std::hash::Hash + Eq>(map: &mut HashMap<K, Owners>, k: &K, name: &str) {
    if let Some(owners) = map.get_mut(k) {
        owners.retain(|n| n != name);
        if owners.is_empty() {
            map.remove(k);
        }
    }
}

impl MemoryIndex {
    pub fn new() -> MemoryIndex {
        MemoryIndex::default()
    }

    /// Insert or replace a machine (by server name).
    pub fn upsert(&self, m: MachineBoot) {
        let mut maps = self.maps.write().unwrap_or_else(|e| e.into_inner());
        remove_keys(&mut maps, &m.server);
        let name = m.server.clone();
        if let Some(u) = &m.uuid {
            add(&mut maps.by_uuid, u.to_ascii_lowercase(), &name);
        }
        for mac in &m.macs {
            add(&mut maps.by_mac, *mac, &name);
        }
        for ip in &m.ips {
            add(&mut maps.by_ip, *ip, &name);
        }
        maps.by_name.insert(name, Arc::new(m));
    }

    /// `server` was powered off or reset: its next boot may fetch its Ignition again
    /// (one-shot mode).
    pub fn power_cycled(&self, server: &str) {
        let mut served = self.served.lock().unwrap_or_else(|e| e.into_inner());
        served.remove(server);
    }

    pub fn remove(&self, server: &str) {
        let mut maps = self.maps.write().unwrap_or_else(|e| e.into_inner());
        remove_keys(&mut maps, server);
        drop(maps);
        self.power_cycled(server);
    }

    /// Drop every machine whose server name `keep` rejects.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        let mut maps = self.maps.write().unwrap_or_else(|e| e.into_inner());
        let gone: Vec<String> = maps.by_name.keys().filter(|n| !keep(n)).cloned().collect();
        for n in gone {
            remove_keys(&mut maps, &n);
        }
    }

    /// Every progress event recorded so far, oldest first.
    pub fn events(&self) -> Vec<ProgressRecord> {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

fn remove_keys(maps: &mut Maps, server: &str) {
    if let Some(old) = maps.by_name.remove(server) {
        if let Some(u) = &old.uuid {
            drop_owner(&mut maps.by_uuid, &u.to_ascii_lowercase(), server);
        }
        for mac in &old.macs {
            drop_owner(&mut maps.by_mac, mac, server);
        }
        for ip in &old.ips {
            drop_owner(&mut maps.by_ip, ip, server);
        }
    }
}

impl BootIndex for MemoryIndex {
    fn lookup(&self, id: &MachineId) -> Option<Arc<MachineBoot>> {
        let maps = self.maps.read().unwrap_or_else(|e| e.into_inner());
        let name = match id {
            MachineId::Uuid(u) if u.bytes().any(|b| b.is_ascii_uppercase()) => {
                maps.by_uuid.get(&u.to_ascii_lowercase())
            }
            MachineId::Uuid(u) => maps.by_uuid.get(u),
            MachineId::Mac(m) => maps.by_mac.get(m),
            MachineId::Ip(ip) => maps.by_ip.get(ip),
            MachineId::Server(name) => return maps.by_name.get(name).cloned(),
        }?;
        maps.by_name.get(name.first()?).cloned()
    }

    fn take_ignition(&self, m: &MachineBoot) -> bool {
        let mut served = self.served.lock().unwrap_or_else(|e| e.into_inner());
        if served.get(&m.server) == Some(&m.boot_id) {
            return false;
        }
        // Bounded by the machines there are (entries go with their server).
        served.insert(m.server.clone(), m.boot_id.clone());
        true
    }

    fn record_progress(&self, server: &str, event: BootEvent, client: IpAddr) {
        let now = SystemTime::now();
        let mut ev = self.events.lock().unwrap_or_else(|e| e.into_inner());
        // A repeat of the newest record (a machine re-fetching in a loop) only moves its time.
        if let Some(last) = ev.last_mut() {
            if last.server == server && last.event == event && last.client == client {
                last.at = now;
                return;
            }
        }
        // Bounded: many machines looping must not grow memory without end.
        if ev.len() >= 10_000 {
            ev.drain(..5_000);
        }
        ev.push(ProgressRecord {
            server: server.to_string(),
            event,
            client,
            at: now,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::BootState;

    fn m(name: &str, uuid: &str, ip: &str) -> MachineBoot {
        MachineBoot {
            server: name.into(),
            uuid: Some(uuid.into()),
            ips: vec![ip.parse().unwrap()],
            macs: vec![[2, 0, 0, 0, 0, 1]],
            state: BootState::NotClaimed,
            boot_id: String::new(),
            files: None,
            ignition: None,
        }
    }

    #[test]
    fn retain_drops_the_others_under_every_key() {
        let idx = MemoryIndex::new();
        idx.upsert(m("a", "4c4c4544-0042-3510-8052-b4c04f4e4d32", "127.0.0.2"));
        let mut b = m("b", "4c4c4544-0042-3510-8052-b4c04f4e4d33", "127.0.0.3");
        b.macs = vec![[2, 0, 0, 0, 0, 2]];
        idx.upsert(b);
        idx.retain(|n| n == "b");
        assert!(idx
            .lookup(&MachineId::Ip("127.0.0.2".parse().unwrap()))
            .is_none());
        assert!(idx.lookup(&MachineId::Mac([2, 0, 0, 0, 0, 1])).is_none());
        assert!(idx
            .lookup(&MachineId::Uuid(
                "4c4c4544-0042-3510-8052-b4c04f4e4d32".into()
            ))
            .is_none());
        assert_eq!(
            idx.lookup(&MachineId::Mac([2, 0, 0, 0, 0, 2]))
                .unwrap()
                .server,
            "b"
        );
    }

    #[test]
    fn lookup_by_each_key_and_replace() {
        let idx = MemoryIndex::new();
        idx.upsert(m("a", "4c4c4544-0042-3510-8052-b4c04f4e4d32", "127.0.0.2"));
        let by_uuid = idx
            .lookup(&MachineId::Uuid(
                "4C4C4544-0042-3510-8052-B4C04F4E4D32".into(),
            ))
            .unwrap();
        assert_eq!(by_uuid.server, "a");
        assert_eq!(
            idx.lookup(&MachineId::Mac([2, 0, 0, 0, 0, 1]))
                .unwrap()
                .server,
            "a"
        );
        assert_eq!(
            idx.lookup(&MachineId::Ip("127.0.0.2".parse().unwrap()))
                .unwrap()
                .server,
            "a"
        );
        idx.upsert(m("a", "4c4c4544-0042-3510-8052-b4c04f4e4d33", "127.0.0.3"));
        assert!(idx
            .lookup(&MachineId::Ip("127.0.0.2".parse().unwrap()))
            .is_none());
        idx.remove("a");
        assert!(idx.lookup(&MachineId::Mac([2, 0, 0, 0, 0, 1])).is_none());
    }

    #[test]
    fn a_shared_key_survives_the_removal_of_one_holder() {
        let idx = MemoryIndex::new();
        let uuid = "4c4c4544-0042-3510-8052-b4c04f4e4d32";
        idx.upsert(m("a", uuid, "127.0.0.2"));
        idx.upsert(m("b", uuid, "127.0.0.2"));
        let by_mac = || idx.lookup(&MachineId::Mac([2, 0, 0, 0, 0, 1]));
        assert_eq!(by_mac().unwrap().server, "a", "first indexed wins");
        idx.remove("a");
        assert_eq!(by_mac().unwrap().server, "b");
        let by_ip = idx.lookup(&MachineId::Ip("127.0.0.2".parse().unwrap()));
        assert_eq!(by_ip.unwrap().server, "b");
        assert_eq!(
            idx.lookup(&MachineId::Uuid(uuid.into())).unwrap().server,
            "b"
        );
        idx.remove("b");
        assert!(by_mac().is_none());
    }

    #[test]
    fn ignition_is_taken_once_per_boot() {
        let idx = MemoryIndex::new();
        let mut a = m("a", "4c4c4544-0042-3510-8052-b4c04f4e4d32", "127.0.0.2");
        a.boot_id = "sbc/1".into();
        assert!(idx.take_ignition(&a));
        assert!(!idx.take_ignition(&a), "second fetch in the same boot");
        idx.power_cycled("a");
        assert!(idx.take_ignition(&a), "after a power cycle");
        a.boot_id = "sbc/2".into();
        assert!(idx.take_ignition(&a), "a changed boot configuration");
    }

    #[test]
    fn progress_is_recorded() {
        let idx = MemoryIndex::new();
        idx.record_progress(
            "a",
            BootEvent::IgnitionDataFetched,
            "127.0.0.2".parse().unwrap(),
        );
        idx.record_progress(
            "a",
            BootEvent::IgnitionDataFetched,
            "127.0.0.2".parse().unwrap(),
        );
        let ev = idx.events();
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].event.condition_type(), "IgnitionDataFetched");
    }
}
