//! In-memory [`BootIndex`]: machines keyed by UUID, MAC and IP, plus a log of boot
//! progress events. Used by the tests and as the cache the store-backed index fills
//! from its watch.

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

#[derive(Default)]
struct Maps {
    by_name: HashMap<String, Arc<MachineBoot>>,
    by_uuid: HashMap<String, String>,
    by_mac: HashMap<[u8; 6], String>,
    by_ip: HashMap<IpAddr, String>,
}

/// Machines held in memory behind a read-mostly lock.
#[derive(Default)]
pub struct MemoryIndex {
    maps: RwLock<Maps>,
    events: Mutex<Vec<ProgressRecord>>,
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
            maps.by_uuid.insert(u.to_ascii_lowercase(), name.clone());
        }
        for mac in &m.macs {
            maps.by_mac.insert(*mac, name.clone());
        }
        for ip in &m.ips {
            maps.by_ip.insert(*ip, name.clone());
        }
        maps.by_name.insert(name, Arc::new(m));
    }

    pub fn remove(&self, server: &str) {
        let mut maps = self.maps.write().unwrap_or_else(|e| e.into_inner());
        remove_keys(&mut maps, server);
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
            maps.by_uuid.remove(&u.to_ascii_lowercase());
        }
        for mac in &old.macs {
            maps.by_mac.remove(mac);
        }
        for ip in &old.ips {
            maps.by_ip.remove(ip);
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
        maps.by_name.get(name).cloned()
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
