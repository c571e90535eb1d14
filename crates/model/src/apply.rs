//! Server-side apply (`PATCH` with `application/apply-patch+yaml`, `kubectl apply
//! --server-side`, what Flux and Argo CD send): which manager owns which fields, the
//! conflicts between managers, and the object an apply makes. Pure: objects in,
//! object out.
//!
//! A configuration's fields are its leaves: every key whose value is not a mapping
//! (scalars and lists: a list is one field, replaced whole, as kube treats an atomic
//! list; bootplane keeps no list-map keys) under every top-level key but `apiVersion`,
//! `kind`, `metadata` and (for a kind with a status subresource) `status`, and each key of
//! `metadata.labels` and `metadata.annotations`. What a manager owns is kept in
//! `metadata.managedFields` as kube writes it (`fieldsType: FieldsV1`, `f:<key>` nested).
//!
//! An apply by manager M with configuration C:
//! - a field of C that another manager owns with another value is a conflict (409, each
//!   field and manager named) unless forced, when M takes it over; the same value is
//!   shared ownership, as kube's;
//! - a field M applied before and C leaves out is removed, unless another manager owns it;
//! - every field of C is set to C's value; M's entry in `managedFields` becomes C's fields.

use std::collections::BTreeSet;

use serde_json::{json, Map, Value};

/// A field: the keys from the object's root to a leaf.
type Path = Vec<String>;

/// A field another manager owns with another value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    pub manager: String,
    /// `.spec.systemUUID`, as kube names it.
    pub field: String,
}

/// Who applies, how, and when.
pub struct Request<'a> {
    pub manager: &'a str,
    /// `force=true` (`--force-conflicts`): take conflicting fields over.
    pub force: bool,
    /// The configuration's `apiVersion`, recorded in the manager's entry.
    pub api_version: &'a str,
    /// RFC 3339, recorded in the manager's entry.
    pub now: &'a str,
    /// The kind has a status subresource: `status` is not applied through the object.
    pub status_subresource: bool,
}

/// The fields of configuration `config`.
pub fn fields(config: &Value, status_subresource: bool) -> BTreeSet<Path> {
    let mut out = BTreeSet::new();
    let Some(m) = config.as_object() else {
        return out;
    };
    for (k, v) in m {
        match k.as_str() {
            "apiVersion" | "kind" => {}
            "status" if status_subresource => {}
            "metadata" => {
                for sub in ["labels", "annotations"] {
                    if let Some(l) = v.get(sub).and_then(Value::as_object) {
                        for key in l.keys() {
                            out.insert(vec!["metadata".into(), sub.into(), key.clone()]);
                        }
                    }
                }
            }
            _ => leaves(v, &mut vec![k.clone()], &mut out),
        }
    }
    out
}

/// The leaves under `v`; an empty mapping owns nothing (it neither sets nor clears what
/// others put there).
fn leaves(v: &Value, at: &mut Path, out: &mut BTreeSet<Path>) {
    match v.as_object() {
        Some(m) => {
            for (k, child) in m {
                at.push(k.clone());
                leaves(child, at, out);
                at.pop();
            }
        }
        None => {
            out.insert(at.clone());
        }
    }
}

/// `fieldsV1` of a set of fields: `{"f:spec": {"f:systemUUID": {}}}`.
pub fn to_fields_v1(set: &BTreeSet<Path>) -> Value {
    let mut root = Map::new();
    for p in set {
        let mut cur = &mut root;
        for k in p {
            let next = cur.entry(format!("f:{k}")).or_insert_with(|| json!({}));
            cur = next.as_object_mut().expect("built as mappings");
        }
    }
    Value::Object(root)
}

/// The fields of a `fieldsV1`: `f:` keys nested; where an entry goes on with a list's
/// items (`k:`, `v:`, `i:`) the path ends at that entry, which is then owned whole
/// (bootplane's lists are atomic); `.` (the entry exists) adds nothing.
pub fn from_fields_v1(v: &Value) -> BTreeSet<Path> {
    fn walk(v: &Value, at: &mut Path, out: &mut BTreeSet<Path>) {
        let Some(m) = v.as_object() else { return };
        let mut deeper = false;
        for (k, child) in m {
            match k.strip_prefix("f:") {
                Some(name) => {
                    deeper = true;
                    at.push(name.to_string());
                    walk(child, at, out);
                    at.pop();
                }
                // `.`: the entry itself exists; what it holds is in its `f:` keys.
                None if k == "." => {}
                None => {
                    if !at.is_empty() {
                        out.insert(at.clone());
                    }
                }
            }
        }
        if !deeper && !at.is_empty() {
            out.insert(at.clone());
        }
    }
    let mut out = BTreeSet::new();
    walk(v, &mut Vec::new(), &mut out);
    out
}

fn get<'a>(v: &'a Value, p: &[String]) -> Option<&'a Value> {
    p.iter().try_fold(v, |cur, k| cur.get(k))
}

fn set(v: &mut Value, p: &[String], value: Value) {
    let mut cur = v;
    for k in &p[..p.len() - 1] {
        if !cur.get(k).is_some_and(Value::is_object) {
            cur[k.as_str()] = json!({});
        }
        cur = &mut cur[k.as_str()];
    }
    cur[p[p.len() - 1].as_str()] = value;
}

fn remove(v: &mut Value, p: &[String]) {
    let Some((last, parent)) = p.split_last() else {
        return;
    };
    let mut cur = v;
    for k in parent {
        match cur.get_mut(k) {
            Some(next) => cur = next,
            None => return,
        }
    }
    if let Some(m) = cur.as_object_mut() {
        m.shift_remove(last);
    }
}

/// One field is the other or lies under it.
fn related(a: &[String], b: &[String]) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

fn dotted(p: &[String]) -> String {
    p.iter().map(|k| format!(".{k}")).collect()
}

/// One `managedFields` entry and the fields it holds.
struct Entry {
    raw: Value,
    fields: BTreeSet<Path>,
    changed: bool,
}

impl Entry {
    fn manager(&self) -> &str {
        self.raw["manager"].as_str().unwrap_or_default()
    }

    fn is_apply_of(&self, manager: &str) -> bool {
        self.manager() == manager && self.raw["operation"] == "Apply"
    }
}

/// The object that applying `config` as `req` says makes of `live` (`None`: there is
/// none yet), with its `metadata.managedFields`; or the conflicts.
pub fn apply(
    live: Option<&Value>,
    config: &Value,
    req: &Request<'_>,
) -> Result<Value, Vec<Conflict>> {
    let mine = fields(config, req.status_subresource);
    let mut entries: Vec<Entry> = live
        .and_then(|l| l.pointer("/metadata/managedFields"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|e| Entry {
            fields: from_fields_v1(&e["fieldsV1"]),
            raw: e.clone(),
            changed: false,
        })
        .collect();
    let before: BTreeSet<Path> = (entries.iter())
        .filter(|e| e.is_apply_of(req.manager))
        .flat_map(|e| e.fields.iter().cloned())
        .collect();
    entries.retain(|e| !e.is_apply_of(req.manager));
    let mut conflicts = Vec::new();
    for e in &mut entries {
        let mut taken = Vec::new();
        for p in &e.fields {
            for q in mine.iter().filter(|q| related(p, q)) {
                let same = p == q && live.and_then(|l| get(l, q)) == get(config, q);
                if !same {
                    conflicts.push(Conflict {
                        manager: e.manager().to_string(),
                        field: dotted(q),
                    });
                    taken.push(p.clone());
                }
            }
        }
        if req.force && !taken.is_empty() {
            for p in taken {
                e.fields.remove(&p);
            }
            e.changed = true;
        }
    }
    if !conflicts.is_empty() && !req.force {
        conflicts.dedup();
        return Err(conflicts);
    }
    let mut obj = live.cloned().unwrap_or_else(|| {
        let mut meta = Map::new();
        for k in ["name", "namespace"] {
            if let Some(v) = config.pointer(&format!("/metadata/{k}")) {
                meta.insert(k.into(), v.clone());
            }
        }
        json!({"metadata": meta})
    });
    for k in ["apiVersion", "kind"] {
        if let Some(v) = config.get(k) {
            obj[k] = v.clone();
        }
    }
    for gone in before.difference(&mine) {
        let kept = entries
            .iter()
            .any(|e| e.fields.iter().any(|p| related(p, gone)));
        if !kept {
            remove(&mut obj, gone);
        }
    }
    for p in &mine {
        if let Some(v) = get(config, p) {
            set(&mut obj, p, v.clone());
        }
    }
    let mut managed: Vec<Value> = entries
        .into_iter()
        .filter(|e| !e.fields.is_empty())
        .map(|mut e| {
            if e.changed {
                e.raw["fieldsV1"] = to_fields_v1(&e.fields);
            }
            e.raw
        })
        .collect();
    managed.push(json!({
        "manager": req.manager,
        "operation": "Apply",
        "apiVersion": req.api_version,
        "time": req.now,
        "fieldsType": "FieldsV1",
        "fieldsV1": to_fields_v1(&mine),
    }));
    obj["metadata"]["managedFields"] = Value::Array(managed);
    Ok(obj)
}

/// Who wrote an object other than by apply (create, replace, merge, JSON or strategic
/// patch, `kubectl label`), for [`record_update`].
pub struct Update<'a> {
    /// `fieldManager`, or the first word of the client's user agent, as kube's.
    pub manager: &'a str,
    /// The group/version the object was written as.
    pub api_version: &'a str,
    /// RFC 3339.
    pub now: &'a str,
    /// The kind has a status subresource.
    pub status_subresource: bool,
    /// The write was to the status subresource: only `status` is recorded, in an entry
    /// of its own (`subresource: status`).
    pub status: bool,
}

/// The fields a write of one part owns: the object's own (not `status` when the kind
/// has the subresource) or, for a status write, `status`'s leaves.
fn part_fields(v: &Value, u: &Update<'_>) -> BTreeSet<Path> {
    if u.status {
        let mut out = BTreeSet::new();
        if let Some(s) = v.get("status") {
            leaves(s, &mut vec!["status".to_string()], &mut out);
        }
        return out;
    }
    fields(v, u.status_subresource)
}

/// Record in `new`'s `metadata.managedFields` a write other than an apply that turned
/// `old` (`None`: a create) into `new`, as kube does (`operation: Update`): the fields it
/// set or changed move to the writer's entry (from any other manager: an update is never
/// a conflict), fields no longer in the object leave every entry, an entry left with no
/// field goes, and a write that changed no field changes no entry. The entries start
/// from `new`'s own when the writer sent others than `old` holds (`kubectl apply
/// --server-side` migrating client-side ownership does), else from `old`'s.
pub fn record_update(old: Option<&Value>, new: &mut Value, u: &Update<'_>) {
    let mf = |v: Option<&Value>| {
        v.and_then(|v| v.pointer("/metadata/managedFields"))
            .cloned()
    };
    let (was, sent) = (mf(old), mf(Some(new)));
    let base = match sent {
        Some(Value::Array(a)) if !a.is_empty() && Some(Value::Array(a.clone())) != was => a,
        _ => match was {
            Some(Value::Array(a)) => a,
            _ => Vec::new(),
        },
    };
    let now_fields = part_fields(new, u);
    let changed: BTreeSet<Path> = (now_fields.iter())
        .filter(|p| old.and_then(|o| get(o, p)) != get(new, p))
        .cloned()
        .collect();
    let sub = if u.status { Some("status") } else { None };
    let is_mine = |e: &Value| {
        e["manager"] == u.manager
            && e["operation"] == "Update"
            && e.get("subresource").and_then(Value::as_str) == sub
    };
    // A leaf still in the object (any part: the other part's entries keep theirs).
    let present = |p: &Path| get(new, p).is_some_and(|v| !v.is_object());
    let base: Vec<Value> = base
        .into_iter()
        .filter(|e| e.get("manager").is_some())
        .collect();
    let mut managed = Vec::with_capacity(base.len() + 1);
    let mut own: BTreeSet<Path> = BTreeSet::new();
    let mut moved = false;
    for e in &base {
        let held = from_fields_v1(&e["fieldsV1"]);
        if is_mine(e) {
            own.extend(held.into_iter().filter(|p| present(p)));
            continue;
        }
        let kept: BTreeSet<Path> = (held.iter())
            .filter(|p| present(p) && !changed.iter().any(|c| related(p, c)))
            .cloned()
            .collect();
        if kept.len() == held.len() {
            managed.push(e.clone());
            continue;
        }
        moved = true;
        if !kept.is_empty() {
            let mut e = e.clone();
            e["fieldsV1"] = to_fields_v1(&kept);
            managed.push(e);
        }
    }
    let had = base
        .iter()
        .find(|e| is_mine(e))
        .map(|e| from_fields_v1(&e["fieldsV1"]));
    own.extend(changed.iter().cloned());
    if changed.is_empty() && !moved && own == had.unwrap_or_default() {
        // Nothing changed hands: the entries stay exactly as they were.
        managed = base;
    } else if !own.is_empty() {
        let mut entry = json!({
            "manager": u.manager,
            "operation": "Update",
            "apiVersion": u.api_version,
            "time": u.now,
            "fieldsType": "FieldsV1",
            "fieldsV1": to_fields_v1(&own),
        });
        if let Some(s) = sub {
            entry["subresource"] = json!(s);
        }
        managed.push(entry);
    }
    // A write without a metadata mapping is the store's to refuse.
    let Some(meta) = new.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    match managed.is_empty() {
        true => {
            meta.shift_remove("managedFields");
        }
        false => {
            meta.insert("managedFields".into(), Value::Array(managed));
        }
    }
}

/// kube's message for conflicts: `Apply failed with 1 conflict: conflict with "m": .spec.x`.
pub fn conflict_message(conflicts: &[Conflict]) -> String {
    let n = conflicts.len();
    let list: Vec<String> = (conflicts.iter())
        .map(|c| format!("conflict with {:?}: {}", c.manager, c.field))
        .collect();
    let s = if n == 1 { "" } else { "s" };
    format!("Apply failed with {n} conflict{s}: {}", list.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(manager: &str, force: bool) -> Request<'_> {
        Request {
            manager,
            force,
            api_version: "metal.ironcore.dev/v1alpha1",
            now: "2026-11-28T00:00:00Z",
            status_subresource: true,
        }
    }

    fn config(uuid: &str, labels: Value) -> Value {
        json!({"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "Server",
               "metadata": {"name": "a", "labels": labels},
               "spec": {"systemUUID": uuid, "bmcRef": {"name": "b"}}, "status": {"state": "x"}})
    }

    fn managers(o: &Value) -> Vec<(String, Value)> {
        o["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["manager"].as_str().unwrap().to_string(),
                    e["fieldsV1"].clone(),
                )
            })
            .collect()
    }

    #[test]
    fn fields_and_their_fields_v1_round_trip() {
        let c = config("u", json!({"l": "1"}));
        let f = fields(&c, true);
        let want: Vec<Path> = vec![
            vec!["metadata".into(), "labels".into(), "l".into()],
            vec!["spec".into(), "bmcRef".into(), "name".into()],
            vec!["spec".into(), "systemUUID".into()],
        ];
        assert_eq!(f.iter().cloned().collect::<Vec<_>>(), want);
        let v1 = to_fields_v1(&f);
        assert_eq!(v1["f:spec"]["f:systemUUID"], json!({}));
        assert_eq!(from_fields_v1(&v1), f);
        // kube's list items and `.` end a path where they stand.
        let kube = json!({"f:metadata": {"f:labels": {".": {}, "f:l": {}}},
                          "f:spec": {"f:list": {"k:{\"name\":\"a\"}": {".": {}, "f:x": {}}}, "f:s": {}}});
        let got = from_fields_v1(&kube);
        assert!(
            got.contains(&vec!["spec".to_string(), "list".to_string()]),
            "{got:?}"
        );
        assert!(
            got.contains(&vec!["spec".to_string(), "s".to_string()]),
            "{got:?}"
        );
        let labels = vec!["metadata".to_string(), "labels".to_string()];
        assert!(!got.contains(&labels), "`.` owns no label: {got:?}");
        assert_eq!(got.len(), 3, "{got:?}");
        assert!(fields(&c, false).contains(&vec!["status".to_string(), "state".to_string()]));
    }

    #[test]
    fn create_then_conflict_then_force_then_removal() {
        let first = apply(
            None,
            &config("u1", json!({"l": "1", "k": "2"})),
            &req("kubectl", false),
        )
        .unwrap();
        assert_eq!(first["spec"]["systemUUID"], "u1");
        assert_eq!(first["metadata"]["name"], "a");
        assert!(
            first.get("status").is_none(),
            "status goes through its subresource"
        );
        assert_eq!(managers(&first).len(), 1);

        // Another manager, the same value: shared, no conflict.
        let same = json!({"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "Server",
                          "metadata": {"name": "a"}, "spec": {"systemUUID": "u1"}});
        let shared = apply(Some(&first), &same, &req("other", false)).unwrap();
        assert_eq!(managers(&shared).len(), 2);
        // Another value: a conflict naming the field and its manager.
        let mut other = same.clone();
        other["spec"]["systemUUID"] = json!("u2");
        let e = apply(Some(&first), &other, &req("other", false)).unwrap_err();
        assert_eq!(
            e,
            vec![Conflict {
                manager: "kubectl".into(),
                field: ".spec.systemUUID".into()
            }]
        );
        assert_eq!(
            conflict_message(&e),
            "Apply failed with 1 conflict: conflict with \"kubectl\": .spec.systemUUID"
        );
        // Forced: taken over, kubectl keeps the rest.
        let forced = apply(Some(&first), &other, &req("other", true)).unwrap();
        assert_eq!(forced["spec"]["systemUUID"], "u2");
        let m = managers(&forced);
        assert!(
            m[0].0 == "kubectl" && m[0].1["f:spec"].get("f:systemUUID").is_none(),
            "{m:?}"
        );
        assert_eq!(m[1].1["f:spec"]["f:systemUUID"], json!({}));

        // kubectl applies again without label k and without systemUUID: k goes, the
        // UUID stays (other owns it).
        let mut again = config("ignored", json!({"l": "1"}));
        again["spec"].as_object_mut().unwrap().remove("systemUUID");
        let after = apply(Some(&forced), &again, &req("kubectl", false)).unwrap();
        assert_eq!(after["metadata"]["labels"], json!({"l": "1"}));
        assert_eq!(after["spec"]["systemUUID"], "u2");
        assert_eq!(after["spec"]["bmcRef"], json!({"name": "b"}));
    }

    #[test]
    fn an_empty_mapping_owns_and_clears_nothing() {
        let live = apply(None, &config("u1", json!({})), &req("one", false)).unwrap();
        let empty = json!({"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "Server",
                           "metadata": {"name": "a"}, "spec": {}});
        let after = apply(Some(&live), &empty, &req("two", false)).unwrap();
        assert_eq!(after["spec"]["systemUUID"], "u1");
        assert!(fields(&empty, true).is_empty());
    }

    fn upd(manager: &str, status: bool) -> Update<'_> {
        Update {
            manager,
            api_version: "metal.ironcore.dev/v1alpha1",
            now: "2026-11-28T01:00:00Z",
            status_subresource: true,
            status,
        }
    }

    fn entries(o: &Value) -> Vec<(String, String, BTreeSet<Path>)> {
        (o["metadata"]["managedFields"]
            .as_array()
            .into_iter()
            .flatten())
        .map(|e| {
            (
                e["manager"].as_str().unwrap().to_string(),
                e["operation"].as_str().unwrap().to_string(),
                from_fields_v1(&e["fieldsV1"]),
            )
        })
        .collect()
    }

    fn path(s: &str) -> Path {
        s.split('.').map(String::from).collect()
    }

    #[test]
    fn updates_take_the_fields_they_change_and_removed_fields_leave_every_entry() {
        let mut created = config("u1", json!({"l": "1", "k": "2"}));
        created.as_object_mut().unwrap().remove("status");
        record_update(None, &mut created, &upd("kubectl-create", false));
        let e = entries(&created);
        assert_eq!(e.len(), 1, "{e:?}");
        assert_eq!(
            (e[0].0.as_str(), e[0].1.as_str()),
            ("kubectl-create", "Update")
        );
        assert_eq!(e[0].2, fields(&created, true));

        // kubectl label changes one label and removes another: the changed one moves,
        // the removed one leaves every entry, the rest stays the creator's.
        let mut labelled = created.clone();
        labelled["metadata"]["labels"] = json!({"l": "9"});
        record_update(Some(&created), &mut labelled, &upd("kubectl-label", false));
        let e = entries(&labelled);
        assert_eq!(e.len(), 2, "{e:?}");
        let l = path("metadata.labels.l");
        assert!(!e[0].2.contains(&l) && !e[0].2.contains(&path("metadata.labels.k")));
        assert!(e[0].2.contains(&path("spec.systemUUID")), "{e:?}");
        assert_eq!(e[1].2, BTreeSet::from([l.clone()]));
        assert_eq!(
            labelled["metadata"]["managedFields"][1]["time"],
            "2026-11-28T01:00:00Z"
        );

        // A write that changes nothing changes no entry (not even a time).
        let mut same = labelled.clone();
        record_update(Some(&labelled), &mut same, &upd("other", false));
        assert_eq!(same, labelled);

        // An apply of another value conflicts with an updater's field, as kube's.
        let mut cfg = config("u1", json!({"l": "3"}));
        cfg.as_object_mut().unwrap().remove("spec");
        let c = apply(Some(&labelled), &cfg, &req("flux", false)).unwrap_err();
        assert_eq!(
            (c[0].manager.as_str(), c[0].field.as_str()),
            ("kubectl-label", ".metadata.labels.l")
        );

        // An updater that loses its last field loses its entry.
        let mut taken = labelled.clone();
        taken["metadata"]["labels"]["l"] = json!("10");
        record_update(Some(&labelled), &mut taken, &upd("kubectl-edit", false));
        let names: Vec<_> = entries(&taken).into_iter().map(|e| e.0).collect();
        assert_eq!(names, ["kubectl-create", "kubectl-edit"]);
    }

    #[test]
    fn status_writes_have_entries_of_their_own_and_sent_entries_are_a_reset() {
        let mut obj = config("u1", json!({}));
        obj["status"] = json!({"state": "Initial"});
        let mut created = obj.clone();
        record_update(None, &mut created, &upd("c", false));
        let mut st = created.clone();
        st["status"]["state"] = json!("Available");
        record_update(Some(&created), &mut st, &upd("server-controller", true));
        let mf = &st["metadata"]["managedFields"];
        assert_eq!(mf.as_array().unwrap().len(), 2, "{mf}");
        assert_eq!(mf[1]["subresource"], "status");
        assert_eq!(
            from_fields_v1(&mf[1]["fieldsV1"]),
            BTreeSet::from([path("status.state")])
        );
        assert_eq!(
            mf[0], created["metadata"]["managedFields"][0],
            "the main entry stays"
        );

        // Entries the writer sent, other than the stored ones, are the start: `[{}]`
        // clears them, and an update changing nothing then leaves none.
        let mut reset = st.clone();
        reset["metadata"]["managedFields"] = json!([{}]);
        record_update(Some(&st), &mut reset, &upd("c", false));
        assert!(reset["metadata"].get("managedFields").is_none(), "{reset}");
        // A body without metadata is left for the store to refuse.
        let mut bad = json!({"metadata": "x"});
        record_update(Some(&st), &mut bad, &upd("c", false));
        assert_eq!(bad, json!({"metadata": "x"}));
    }

    #[test]
    fn a_field_under_another_managers_leaf_conflicts() {
        let live = apply(
            None,
            &json!({"metadata": {"name": "a"}, "spec": {"x": 1}}),
            &req("one", false),
        )
        .unwrap();
        let deeper = json!({"metadata": {"name": "a"}, "spec": {"x": {"y": 1}}});
        let e = apply(Some(&live), &deeper, &req("two", false)).unwrap_err();
        assert_eq!(e[0].field, ".spec.x.y");
    }
}
