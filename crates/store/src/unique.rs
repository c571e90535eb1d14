//! Identity unique across Servers: a MAC (`status.networkInterfaces[].macAddress`) or
//! a system UUID (`spec.systemUUID`) one Server holds is refused on another with
//! `Conflict` (409), so the boot listener's lookups by MAC and UUID, and the DHCP
//! lease → MAC path, name one machine (two Servers sharing a MAC would let one take
//! the other's boot, see docs/threat-model.md).
//!
//! Checked on every write of a Server that adds a key it did not hold before (most
//! writes add none and cost nothing), against the store's listing, which both engines
//! answer from memory. Each Server's keys are kept per stored revision, so a check
//! parses only the Servers written since the previous one.
//!
//! **Invariant:** a write adding a key claims it (in [`Cache`]'s pending set, in the same
//! critical section as its check) until its commit has ended, and a check refuses a key
//! another write has claimed: two writes of one store racing on the same new key cannot
//! both pass, and writes adding different keys still commit together (group commit).
//! Stores sharing an etcd cluster check against their own copies of it, so two
//! appliances racing can still both pass; the boot index then keeps both holders and the
//! next write that adds the key to either is refused.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use super::backend::KvBackend;
use super::kv::Rev;
use super::{Result, Store, StoreError};
use bootplane_model::ident::{parse_uuid, Mac, MacFmt};
use bootplane_model::meta;
use bootplane_model::registry::ResourceType;
use bootplane_model::views::nics;

/// The identity keys of one Server.
#[derive(Debug, Default, Clone, PartialEq)]
struct Keys {
    macs: HashSet<Mac>,
    uuid: Option<String>,
}

fn keys(obj: &Value) -> Keys {
    Keys {
        macs: nics(obj).into_iter().filter_map(|n| n.mac).collect(),
        uuid: obj
            .pointer("/spec/systemUUID")
            .and_then(Value::as_str)
            .and_then(|u| parse_uuid(u.trim()).ok()),
    }
}

/// Whether the rule applies to objects of `rt` (metal-operator Servers).
fn applies(rt: &ResourceType) -> bool {
    rt.group == "metal.ironcore.dev" && rt.kind == "Server"
}

/// A Server's keys and the revision they were read at.
type Seen = (Rev, Arc<Keys>);

/// The Servers' keys as last seen, by store key, with the revision they were read at,
/// and the keys writes in flight are adding.
#[derive(Default)]
pub(super) struct Cache {
    seen: Mutex<HashMap<Arc<str>, Seen>>,
    /// The keys each write in flight adds (by claim number), its Server's name, until
    /// its commit has ended. Locked for a whole check, so it also orders the checks.
    pending: Mutex<Pending>,
}

#[derive(Default)]
struct Pending {
    next: u64,
    claims: Vec<(u64, String, Keys)>,
}

/// The keys a write in flight adds, released when it is dropped (after the commit).
pub(super) struct Held {
    cache: Arc<Cache>,
    id: u64,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut p = self.cache.pending.lock().unwrap_or_else(|e| e.into_inner());
        p.claims.retain(|(id, _, _)| *id != self.id);
    }
}

impl<B: KvBackend> Store<B> {
    /// Refuse `new` (replacing `old`) when it adds a MAC or system UUID another
    /// Server holds or another write in flight is adding. When it adds one, what it
    /// returns is to be held until the write's commit has ended.
    pub(super) fn check_unique(
        &self,
        rt: &ResourceType,
        new: &Value,
        old: Option<&Value>,
    ) -> Result<Option<Held>> {
        if !applies(rt) {
            return Ok(None);
        }
        let mine = keys(new);
        let before = old.map(keys).unwrap_or_default();
        let added: HashSet<Mac> = mine.macs.difference(&before.macs).copied().collect();
        let uuid = mine.uuid.filter(|u| before.uuid.as_ref() != Some(u));
        if added.is_empty() && uuid.is_none() {
            return Ok(None);
        }
        let name = meta::name(new);
        let mut pending = self
            .unique
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let clash = |k: &Keys| -> Option<String> {
            if let Some(m) = added.iter().find(|m| k.macs.contains(*m)) {
                Some(format!("macAddress {}", MacFmt(m)))
            } else if uuid.is_some() && k.uuid == uuid {
                Some(format!(
                    "systemUUID {}",
                    uuid.as_deref().unwrap_or_default()
                ))
            } else {
                None
            }
        };
        let mut taken = None;
        self.each_other(rt, name, |k, holder| {
            if let Some(what) = clash(k) {
                taken = Some(format!(
                    "{what} is already registered to server {:?}",
                    holder()
                ));
            }
            taken.is_none()
        });
        if taken.is_none() {
            taken = (pending.claims.iter())
                .filter(|(_, n, _)| n != name)
                .find_map(|(_, n, k)| {
                    clash(k).map(|w| format!("{w} is being registered to server {n:?}"))
                });
        }
        if let Some(message) = taken {
            return Err(StoreError::Conflict {
                qualified: rt.qualified(),
                name: name.to_string(),
                message,
            });
        }
        let id = pending.next;
        pending.next += 1;
        let claim = Keys { macs: added, uuid };
        pending.claims.push((id, name.to_string(), claim));
        Ok(Some(Held {
            cache: self.unique.clone(),
            id,
        }))
    }

    /// Of `macs`, those a Server other than `name` holds now, each with the name of a
    /// Server holding it (what a write of `name` adding them would be refused for).
    pub fn mac_holders(&self, rt: &ResourceType, name: &str, macs: &[Mac]) -> Vec<(Mac, String)> {
        let mut held = Vec::new();
        if !applies(rt) || macs.is_empty() {
            return held;
        }
        self.each_other(rt, name, |k, holder| {
            for m in macs.iter().filter(|m| k.macs.contains(*m)) {
                if !held.iter().any(|(h, _)| h == m) {
                    held.push((*m, holder()));
                }
            }
            held.len() < macs.len()
        });
        held
    }

    /// Call `f` with the keys of every Server but `name` (and a way to read its name)
    /// until it returns false, refreshing the cache of keys on the way.
    fn each_other(
        &self,
        rt: &ResourceType,
        name: &str,
        mut f: impl FnMut(&Keys, &dyn Fn() -> String) -> bool,
    ) {
        let own_key = rt.key(None, name);
        let (kvs, _) = self.kv.range(&rt.prefix(None));
        let mut seen = self.unique.seen.lock().unwrap_or_else(|e| e.into_inner());
        let mut live = HashSet::with_capacity(kvs.len());
        let mut more = true;
        for kv in &kvs {
            live.insert(kv.key.clone());
            let k = match seen.get(&kv.key) {
                Some((rev, k)) if *rev == kv.mod_rev => k.clone(),
                _ => {
                    let k = Arc::new(keys(&kv.value()));
                    seen.insert(kv.key.clone(), (kv.mod_rev, k.clone()));
                    k
                }
            };
            if !more || *kv.key == *own_key {
                continue;
            }
            more = f(&k, &|| meta::name(&kv.value()).to_string());
        }
        seen.retain(|k, _| live.contains(k));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_read_macs_in_any_form_and_the_uuid() {
        let k = keys(&json!({
            "spec": {"systemUUID": "4C4C4544-0042-3510-8052-B4C04F4E4D32"},
            "status": {"networkInterfaces": [
                {"macAddress": "52-54-00-AA-BB-01"}, {"macAddress": "bad"}
            ]}
        }));
        assert_eq!(k.macs, HashSet::from([[0x52, 0x54, 0, 0xaa, 0xbb, 1]]));
        assert_eq!(
            k.uuid.as_deref(),
            Some("4c4c4544-0042-3510-8052-b4c04f4e4d32")
        );
    }
}
