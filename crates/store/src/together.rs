//! Several objects written in one transaction ([`Store::write_all`]): all of them
//! commit, at one revision, or none does. A claim's binding (its Server, the claim
//! with its status, its boot configuration) is one such write, and so is a batch of
//! new Events: on etcd each write of a controller is a Raft round trip and a revision,
//! so one transaction instead of five is what lets claims bind at etcd's speed.
//!
//! Each write is checked and stamped as [`Store::create`] and [`Store::update_from`]
//! would (validation, uniqueness, server-owned metadata, generation); a replacement
//! is a compare-and-swap against the object it was made from, a creation requires the
//! name to be free. When one of them fails, the error names that object.

use std::sync::Arc;

use serde_json::Value;

use super::kv::{Action, Compare, KvError, Op};
use super::{
    keep_server_metadata, map_write, meta, next_version, stamp_created, validate, Result, Store,
    StoreError,
};
use crate::backend::KvBackend;
use bootplane_model::registry::ResourceType;

/// One write of [`Store::write_all`].
pub enum Write<'a> {
    /// Create the object (as [`Store::create`]; `generateName` is not expanded).
    Create(&'a ResourceType, Value),
    /// Replace `cur` (as read from this store) with the object: metadata, spec and
    /// status together, server-owned metadata kept from `cur`.
    Replace(&'a ResourceType, Arc<Value>, Value),
}

impl<B: KvBackend> Store<B> {
    /// Commit every write in one transaction; the objects as stored, in order. Nothing
    /// is written when any write is refused (`Conflict` for a replacement whose object
    /// changed, `AlreadyExists` for a creation whose name is taken, naming that object).
    pub async fn write_all(&self, writes: Vec<Write<'_>>) -> Result<Vec<Arc<Value>>> {
        // The ops, who each one writes (for errors), and per write its result when
        // known already (unchanged) or `None` (the next op's value).
        let (mut ops, mut who, mut out) = (Vec::new(), Vec::new(), Vec::new());
        let mut held = Vec::new();
        for w in writes {
            let (rt, name, op) = match w {
                Write::Create(rt, mut obj) => {
                    validate::check(rt, &mut obj, None)?;
                    held.push(self.check_unique(rt, &obj, None)?);
                    stamp_created(&mut obj);
                    let name = meta::name(&obj).to_string();
                    let key = rt.key(meta::namespace(&obj), &name);
                    (rt, name, Op::put(key, Compare::Absent, obj))
                }
                Write::Replace(rt, cur, obj) => {
                    match self.ready_replace(rt, &cur, obj, &mut held)? {
                        Some((name, op)) => (rt, name, op),
                        None => {
                            out.push(Some(cur));
                            continue;
                        }
                    }
                }
            };
            if self.dry {
                if let Action::Put(v) = &op.action {
                    let at = match op.compare {
                        Compare::ModRev(rv) => rv,
                        _ => 0,
                    };
                    self.dry_check(rt, &op.key, v, Some(at))?;
                    out.push(Some(v.clone()));
                }
                continue;
            }
            ops.push(op);
            who.push((rt, name));
            out.push(None);
        }
        if ops.is_empty() {
            return Ok(out.into_iter().flatten().collect());
        }
        let keys: Vec<String> = ops.iter().map(|o| o.key.clone()).collect();
        let named = |key: &str| {
            let i = keys.iter().position(|k| k == key).unwrap_or(0);
            who[i].clone()
        };
        let result = self.kv.txn(ops).await;
        drop(held);
        let mut values = match result {
            Ok(r) => r.values.into_iter(),
            Err(KvError::AlreadyExists { key }) => {
                let (rt, name) = named(&key);
                return Err(StoreError::AlreadyExists {
                    qualified: rt.qualified(),
                    name,
                });
            }
            Err(KvError::Conflict { key, .. } | KvError::NotFound { key }) => {
                let (rt, name) = named(&key);
                return Err(Self::conflict(rt, &name));
            }
            Err(e) => {
                let (rt, name) = &who[0];
                return Err(map_write(rt, name, e));
            }
        };
        Ok(out
            .into_iter()
            .map(|v| v.unwrap_or_else(|| values.next().flatten().expect("a put returns its value")))
            .collect())
    }

    /// A replacement checked and stamped as [`Store::update_from`] does: its name and op,
    /// `None` when it changes nothing.
    fn ready_replace(
        &self,
        rt: &ResourceType,
        cur: &Arc<Value>,
        mut new: Value,
        held: &mut Vec<Option<super::unique::Held>>,
    ) -> Result<Option<(String, Op)>> {
        let (name, ns, cur_rv) = Self::same_object(rt, cur, &new)?;
        keep_server_metadata(rt, &name, cur, &mut new)?;
        validate::check(rt, &mut new, Some(cur))?;
        held.push(self.check_unique(rt, &new, Some(cur))?);
        if !next_version(cur, cur_rv, &mut new) {
            return Ok(None);
        }
        if meta::is_deleting(&new) && meta::finalizers(&new).is_empty() {
            return Err(StoreError::BadRequest(format!(
                "{name}: a write of several objects cannot remove one (its last finalizer)"
            )));
        }
        let key = rt.key(ns.as_deref(), &name);
        Ok(Some((name, Op::put(key, Compare::ModRev(cur_rv), new))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Registry;
    use serde_json::json;

    fn rt(name: &str) -> Arc<ResourceType> {
        Registry::global().resolve(name).unwrap()
    }

    #[tokio::test]
    async fn every_write_commits_at_one_revision_or_none_does() {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(d.path()).unwrap();
        let (srv, claim, sbc) = (rt("server"), rt("serverclaim"), rt("sbc"));
        let server = s
            .create(&srv, json!({"metadata": {"name": "s1"}, "spec": {"systemUUID": "4c4c4544-0000-0000-0000-000000000001"}}))
            .await
            .unwrap();
        let c = s
            .create(
                &claim,
                json!({"metadata": {"name": "c1"}, "spec": {"image": "i", "power": "Off"}}),
            )
            .await
            .unwrap();
        let before = s.revision();

        // a stale server: nothing is written, and the error names the server
        let mut stale = (*server).clone();
        stale["metadata"]["resourceVersion"] = json!("100");
        let bound = |from: &Value| {
            let mut o = from.clone();
            o["spec"]["serverClaimRef"] = json!({"name": "c1", "namespace": "default"});
            o["status"] = json!({"state": "Reserved"});
            o
        };
        let mut cl = (*c).clone();
        cl["spec"]["serverRef"] = json!({"name": "s1"});
        cl["status"] = json!({"phase": "Bound"});
        let boot = json!({"metadata": {"name": "c1", "namespace": "default"}, "spec": {"serverRef": {"name": "s1"}, "image": "i"}, "status": {"state": "Ready"}});
        let err = s
            .write_all(vec![
                Write::Replace(&srv, Arc::new(stale.clone()), bound(&stale)),
                Write::Replace(&claim, c.clone(), cl.clone()),
                Write::Create(&sbc, boot.clone()),
            ])
            .await
            .unwrap_err();
        match &err {
            StoreError::Conflict {
                qualified, name, ..
            } => {
                assert_eq!(
                    (qualified.as_str(), name.as_str()),
                    ("servers.metal.ironcore.dev", "s1")
                )
            }
            e => panic!("{e}"),
        }
        assert_eq!(s.revision(), before);
        assert!(s.get(&sbc, Some("default"), "c1").is_err());
        assert!(s
            .get(&claim, Some("default"), "c1")
            .unwrap()
            .get("status")
            .is_none());

        // fresh: one revision for all three, spec and status of each together
        let out = s
            .write_all(vec![
                Write::Replace(&srv, server.clone(), bound(&server)),
                Write::Replace(&claim, c.clone(), cl),
                Write::Create(&sbc, boot.clone()),
            ])
            .await
            .unwrap();
        assert_eq!(s.revision(), before + 1);
        let rvs: Vec<_> = out.iter().map(|o| meta::resource_version(o)).collect();
        assert_eq!(rvs, vec![Some(before + 1); 3]);
        assert_eq!(out[0]["status"]["state"], "Reserved");
        assert_eq!(out[0]["metadata"]["generation"], 2, "the spec changed");
        assert_eq!(out[1]["status"]["phase"], "Bound");
        assert_eq!(out[2]["status"]["state"], "Ready");
        assert_eq!(s.get(&srv, None, "s1").unwrap(), out[0]);

        // the name taken: AlreadyExists naming the boot configuration, nothing written
        let mut again = (*out[1]).clone();
        again["metadata"]["labels"] = json!({"x": "y"});
        let err = s
            .write_all(vec![
                Write::Replace(&claim, out[1].clone(), again),
                Write::Create(&sbc, boot),
            ])
            .await
            .unwrap_err();
        assert!(
            matches!(&err, StoreError::AlreadyExists { name, .. } if name == "c1"),
            "{err}"
        );
        assert_eq!(s.revision(), before + 1);
        // a write that changes nothing writes nothing
        let same = s
            .write_all(vec![Write::Replace(
                &claim,
                out[1].clone(),
                (*out[1]).clone(),
            )])
            .await
            .unwrap();
        assert_eq!(same[0], out[1]);
        assert_eq!(s.revision(), before + 1);
    }
}
