//! BMC → Servers: the part of the BMC reconciler that registers the machines a BMC
//! reports (`[discovery] enabled`): one `Server` per Redfish system, found again by its
//! system UUID, never duplicated, never deleted by discovery.
//!
//! A new system becomes a Server named `<bmc>-<system id>` with `spec.systemUUID`,
//! `spec.systemURI`, `spec.bmcRef`, labels `bootplane.dev/bmc`, `.../manufacturer`,
//! `.../model`, `.../serial` (as label values allow), and in its status the NICs the BMC
//! reports (`networkInterfaces`: MAC and link) and what the system says of itself
//! (manufacturer, model, serial, BIOS version, power). The Server reconciler takes it from
//! there (`Initial → Discovery`). A system the BMC no longer lists keeps its Server, whose
//! condition `SystemPresent` turns False (reason `SystemGone`); listed again, True.
//! A NIC whose MAC another Server holds is left out of the new Server's status (the
//! store refuses two holders of a MAC), and its condition `MACAddressesUnique` False
//! names the MAC and the holder.
//!
//! **A cap.** At most `max` (`discovery.max_systems_per_bmc`) Servers name one BMC:
//! only the first `max` systems a BMC lists are read at all, and no Server is created
//! once `max` name the BMC; the rest are counted ([`Synced::capped`]) for the BMC's
//! condition. While a BMC is over the cap no Server of it is marked gone (its system
//! may be among those not read).
//!
//! **Invariant:** one Server per system UUID: a system whose UUID a Server already has
//! (whatever its name and however it was made) gets no second one, and the name is a
//! function of BMC and system id, so two reconciles racing create it once.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use futures::StreamExt;
use serde_json::{json, Map, Value};

use super::set_condition;
use crate::model::ident::{parse_mac, parse_uuid, MacFmt};
use crate::model::meta;
use crate::model::registry::ResourceType;
use crate::model::views::{condition, read, Server};
use crate::redfish::{self, Bmc};
use crate::store::{Store, StoreError};

pub use super::{APPROVAL_LABEL, APPROVAL_PENDING};

/// Label naming the BMC a discovered Server came from.
pub(crate) const BMC_LABEL: &str = "bootplane.dev/bmc";
/// New systems of one BMC read at once (the pool's per-BMC limit applies beneath).
const READ_AHEAD: usize = 8;
/// The condition saying whether the BMC still lists the Server's system.
pub(crate) const PRESENT: &str = "SystemPresent";
/// The condition set False on a new Server when NICs its BMC reports were left out
/// because another Server holds their MAC.
pub(crate) const MACS_UNIQUE: &str = "MACAddressesUnique";

/// What the Servers in the store say about systems, kept by the BMC set's watch.
#[derive(Default)]
pub(crate) struct SystemIndex {
    inner: Mutex<IndexInner>,
}

#[derive(Default)]
struct IndexInner {
    /// Lowercase system UUID → Server name.
    by_uuid: HashMap<String, String>,
    /// Server name → its UUID (to undo `by_uuid` on change).
    uuid_of: HashMap<String, String>,
    /// BMC name → (Server name → system UUID) of the Servers naming it in `spec.bmcRef`.
    by_bmc: HashMap<String, HashMap<String, String>>,
    /// Server name → the BMC it names.
    bmc_of: HashMap<String, String>,
}

impl SystemIndex {
    /// Note a Server's current state (or its deletion).
    pub(crate) fn on_server(&self, s: &Value, deleted: bool) {
        let name = meta::name(s).to_string();
        let mut i = self.inner.lock().unwrap();
        if let Some(u) = i.uuid_of.remove(&name) {
            if i.by_uuid.get(&u) == Some(&name) {
                i.by_uuid.remove(&u);
            }
        }
        if let Some(b) = i.bmc_of.remove(&name) {
            if let Some(m) = i.by_bmc.get_mut(&b) {
                m.remove(&name);
            }
        }
        if deleted {
            return;
        }
        let s: Server = read(s);
        let uuid = (s.spec.system_uuid.as_deref()).and_then(|u| parse_uuid(u).ok());
        if let Some(u) = &uuid {
            i.by_uuid.insert(u.clone(), name.clone());
            i.uuid_of.insert(name.clone(), u.clone());
        }
        if let Some(b) = s.spec.bmc_ref.map(|r| r.name).filter(|b| !b.is_empty()) {
            i.by_bmc
                .entry(b.clone())
                .or_default()
                .insert(name.clone(), uuid.unwrap_or_default());
            i.bmc_of.insert(name, b);
        }
    }

    fn server_with_uuid(&self, uuid: &str) -> Option<String> {
        self.inner.lock().unwrap().by_uuid.get(uuid).cloned()
    }

    fn servers_of(&self, bmc: &str) -> HashMap<String, String> {
        self.inner
            .lock()
            .unwrap()
            .by_bmc
            .get(bmc)
            .cloned()
            .unwrap_or_default()
    }
}

/// What one sync did (for the BMC's status message and the tests' logs).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Synced {
    pub created: usize,
    pub gone: usize,
    /// Systems skipped because they report no usable UUID.
    pub without_uuid: usize,
    /// Systems not registered because the BMC reached its cap of Servers.
    pub capped: usize,
}

/// What became of one system read.
enum Found {
    /// A Server has its UUID (`true`: made just now).
    Server(bool),
    /// None has, and the BMC has its cap of Servers.
    Capped,
}

/// Per BMC, the systems already matched to a Server: `@odata.id` → UUID, so a poll that
/// lists the same systems reads nothing more than the collection.
#[derive(Default)]
pub(crate) struct Seen(Mutex<HashMap<String, HashMap<String, String>>>);

impl Seen {
    pub(crate) fn forget(&self, bmc: &str) {
        self.0.lock().unwrap().remove(bmc);
    }
}

/// Make the store's Servers match the systems `client` (BMC `bmc`) lists as `ids`; new
/// Servers wait for approval when `pending` ([`APPROVAL_LABEL`]); at most `max` Servers
/// name the BMC.
pub(crate) async fn sync(
    store: &Store,
    t_server: &ResourceType,
    (index, seen): (&SystemIndex, &Seen),
    (bmc, pending, max): (&str, bool, usize),
    client: &Bmc,
    ids: &[String],
) -> Result<Synced, SyncError> {
    let mut out = Synced {
        capped: ids.len().saturating_sub(max),
        ..Synced::default()
    };
    let ids = &ids[..ids.len().min(max)];
    let room = std::sync::atomic::AtomicUsize::new(max.saturating_sub(index.servers_of(bmc).len()));
    let room = &room;
    let known = seen.0.lock().unwrap().get(bmc).cloned().unwrap_or_default();
    let mut present: HashMap<String, String> = HashMap::new();
    let mut new = Vec::new();
    for id in ids {
        match known.get(id) {
            Some(u) => {
                present.insert(id.clone(), u.clone());
            }
            None => new.push(id.clone()),
        }
    }
    // New systems are read side by side (the pool's per-BMC limit bounds them): a
    // blade chassis of 16 systems costs one round of reads, not sixteen.
    // Per new system: `(id, uuid, what became of it)`, or `None` without a usable UUID.
    type Read = Option<(String, String, Found)>;
    let results: Vec<Result<Read, SyncError>> = futures::stream::iter(new)
        .map(|id| async move {
            let sys = client.system(&id).await?;
            let Some(uuid) = sys.uuid.as_deref().and_then(|u| parse_uuid(u).ok()) else {
                return Ok(None);
            };
            let mut created = false;
            if index.server_with_uuid(&uuid).is_none() {
                use std::sync::atomic::Ordering::SeqCst;
                if room
                    .fetch_update(SeqCst, SeqCst, |r| r.checked_sub(1))
                    .is_err()
                {
                    return Ok(Some((id, uuid, Found::Capped)));
                }
                let nics = match client.ethernet_interfaces(&sys).await {
                    Ok(n) => n,
                    Err(redfish::Error::Unsupported(_)) => Vec::new(),
                    Err(e) => return Err(e.into()),
                };
                let new = (bmc, pending);
                created = create(store, t_server, new, &sys, &uuid, &nics).await?;
            }
            Ok(Some((id, uuid, Found::Server(created))))
        })
        .buffer_unordered(READ_AHEAD)
        .collect()
        .await;
    for r in results {
        match r? {
            Some((id, uuid, Found::Server(created))) => {
                out.created += usize::from(created);
                present.insert(id, uuid);
            }
            Some((_, _, Found::Capped)) => out.capped += 1,
            None => out.without_uuid += 1,
        }
    }
    let present_uuids: BTreeSet<&String> = present.values().collect();
    for (server, uuid) in index.servers_of(bmc) {
        let here = present_uuids.contains(&uuid);
        if !here && out.capped > 0 {
            // Perhaps among the systems not read.
            continue;
        }
        out.gone += usize::from(!here);
        mark_present(store, t_server, &server, bmc, here).await?;
    }
    seen.0.lock().unwrap().insert(bmc.to_string(), present);
    Ok(out)
}

/// Why a sync stopped.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SyncError {
    #[error(transparent)]
    Redfish(#[from] redfish::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The Server name for system `id` of `bmc`: `<bmc>-<id>` as an RFC 1123 name, or
/// `<bmc>-system-<hash>` when the id leaves nothing usable or the name would be too long.
pub(crate) fn server_name(bmc: &str, system_id: &str) -> String {
    let mut id: String = system_id
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    while id.contains("--") {
        id = id.replace("--", "-");
    }
    let id = id.trim_matches('-');
    if id.is_empty() || bmc.len() + 1 + id.len() > 253 {
        use sha2::Digest;
        let h = hex::encode(&sha2::Sha256::digest(system_id.as_bytes())[..6]);
        return format!("{bmc}-system-{h}");
    }
    format!("{bmc}-{id}")
}

/// A label value from free text (≤ 63 characters of `[A-Za-z0-9._-]`, alphanumeric at
/// both ends), or `None` when nothing usable is left.
pub(crate) fn label_value(s: &str) -> Option<String> {
    let v: String = s
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(63)
        .collect();
    let v = v.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    (!v.is_empty()).then(|| v.to_string())
}

/// The `metadata` + `spec` of the Server for `sys`.
pub fn server_object(bmc: &str, sys: &redfish::System, uuid: &str) -> Value {
    let mut labels = Map::new();
    labels.insert(BMC_LABEL.into(), json!(bmc));
    for (k, v) in [
        ("bootplane.dev/manufacturer", &sys.manufacturer),
        ("bootplane.dev/model", &sys.model),
        ("bootplane.dev/serial", &sys.serial_number),
    ] {
        if let Some(v) = v.as_deref().and_then(label_value) {
            labels.insert(k.into(), json!(v));
        }
    }
    json!({
        "apiVersion": "metal.ironcore.dev/v1alpha1",
        "kind": "Server",
        "metadata": {"name": server_name(bmc, &sys.id), "labels": labels},
        "spec": {
            "systemUUID": uuid,
            "systemURI": sys.odata_id,
            "bmcRef": {"name": bmc},
        },
    })
}

/// The status a new Server starts with: what the BMC says of the system and its NICs.
pub(crate) fn initial_status(
    bmc: &str,
    sys: &redfish::System,
    nics: &[redfish::EthernetInterface],
) -> Value {
    let mut st = json!({});
    for (k, v) in [
        ("manufacturer", &sys.manufacturer),
        ("model", &sys.model),
        ("serialNumber", &sys.serial_number),
        ("biosVersion", &sys.bios_version),
    ] {
        if let Some(v) = v {
            st[k] = json!(v);
        }
    }
    if let Some(p) = sys.power_state {
        st["powerState"] = json!(p.as_str());
    }
    let list: Vec<Value> = nics
        .iter()
        .filter_map(|n| {
            let mac = parse_mac(n.mac.as_deref()?).ok()?;
            let carrier = match n.link_status.as_deref() {
                Some("LinkUp") => "Up",
                Some("LinkDown") | Some("NoLink") => "Down",
                _ => "Unknown",
            };
            Some(json!({
                "name": if n.id.is_empty() { "nic".to_string() } else { n.id.clone() },
                "macAddress": MacFmt(&mac).to_string(),
                "carrierStatus": carrier,
            }))
        })
        .collect();
    if !list.is_empty() {
        st["networkInterfaces"] = json!(list);
    }
    set_condition(
        &mut st,
        PRESENT,
        true,
        "ReportedByBMC",
        &format!("BMC {bmc} lists system {}", sys.odata_id),
    );
    st
}

/// Create the Server for `sys` (false: it already existed under that name).
async fn create(
    store: &Store,
    t_server: &ResourceType,
    (bmc, pending): (&str, bool),
    sys: &redfish::System,
    uuid: &str,
    nics: &[redfish::EthernetInterface],
) -> Result<bool, StoreError> {
    let mut obj = server_object(bmc, sys, uuid);
    if pending {
        obj["metadata"]["labels"][APPROVAL_LABEL] = json!(APPROVAL_PENDING);
    }
    // The status goes in with the object, in the one write: a reader (the Server
    // reconciler, a client) never sees the Server without what the BMC said of it.
    let mut status = initial_status(bmc, sys, nics);
    drop_held_macs(store, t_server, meta::name(&obj), bmc, &mut status);
    obj["status"] = status;
    let created = match store.create(t_server, obj).await {
        Ok(o) => o,
        Err(StoreError::AlreadyExists { .. }) => return Ok(false),
        Err(e) => return Err(e),
    };
    let name = meta::name(&created);
    tracing::info!(server = %name, bmc, system = %sys.odata_id, uuid, awaiting_approval = pending, "discovered a server");
    Ok(true)
}

/// Leave out of a new Server's `status` the NICs whose MAC another Server holds (the
/// store refuses a second holder), saying so in condition [`MACS_UNIQUE`] False: the
/// Server is still registered, and the operator sees which MAC two systems report.
fn drop_held_macs(store: &Store, t_server: &ResourceType, name: &str, bmc: &str, st: &mut Value) {
    let Some(list) = st
        .get_mut("networkInterfaces")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    let macs: Vec<_> = list
        .iter()
        .filter_map(|n| parse_mac(n["macAddress"].as_str()?).ok())
        .collect();
    let held = store.mac_holders(t_server, name, &macs);
    if held.is_empty() {
        return;
    }
    list.retain(|n| {
        let mac = n["macAddress"].as_str().and_then(|m| parse_mac(m).ok());
        !held.iter().any(|(h, _)| Some(*h) == mac)
    });
    if list.is_empty() {
        st.as_object_mut().map(|m| m.remove("networkInterfaces"));
    }
    let which: Vec<String> = held
        .iter()
        .map(|(m, holder)| format!("{} (server {holder:?})", MacFmt(m)))
        .collect();
    let msg = format!(
        "BMC {bmc} reports NICs whose MAC another server holds; not recorded: {}",
        which.join(", ")
    );
    tracing::warn!(server = name, bmc, macs = %which.join(", "), "a discovered system reports MACs another server holds");
    set_condition(st, MACS_UNIQUE, false, "MACAddressInUse", &msg);
}

/// Set `SystemPresent` on `server` (one status write, only when it changes).
async fn mark_present(
    store: &Store,
    t_server: &ResourceType,
    server: &str,
    bmc: &str,
    here: bool,
) -> Result<(), StoreError> {
    let r = store
        .modify_status(t_server, None, server, |s, st| {
            if here {
                // Only Servers that had the condition (discovered ones) get it back.
                let had = condition(&read::<Server>(s).status.conditions, PRESENT).is_some();
                let msg = format!("BMC {bmc} lists the system");
                had && set_condition(st, PRESENT, true, "ReportedByBMC", &msg)
            } else {
                let msg = format!("BMC {bmc} no longer lists this system; the Server is kept");
                set_condition(st, PRESENT, false, "SystemGone", &msg)
            }
        })
        .await;
    match r {
        Ok(_) | Err(StoreError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_rfc1123_and_stable() {
        assert_eq!(
            server_name("bmc-a", "System.Embedded.1"),
            "bmc-a-system-embedded-1"
        );
        assert_eq!(server_name("bmc-a", "1"), "bmc-a-1");
        let odd = server_name("bmc-a", "///");
        assert!(odd.starts_with("bmc-a-system-") && odd.len() == "bmc-a-system-".len() + 12);
        assert_eq!(odd, server_name("bmc-a", "///"));
        let long = server_name(&"b".repeat(200), &"x".repeat(100));
        assert!(long.len() <= 253, "{}", long.len());
    }

    #[test]
    fn label_values_are_sanitised() {
        assert_eq!(label_value("Dell Inc."), Some("Dell_Inc".into()));
        assert_eq!(label_value("  "), None);
        assert_eq!(label_value(&"a".repeat(80)).unwrap().len(), 63);
        assert_eq!(label_value("-x-"), Some("x".into()));
    }

    #[test]
    fn index_follows_servers() {
        let i = SystemIndex::default();
        let s = json!({"metadata": {"name": "s1"}, "spec": {"systemUUID": "5A2C0000-0000-4000-8000-000000000001", "bmcRef": {"name": "b"}}});
        i.on_server(&s, false);
        assert_eq!(
            i.server_with_uuid("5a2c0000-0000-4000-8000-000000000001"),
            Some("s1".into())
        );
        assert_eq!(i.servers_of("b").len(), 1);
        i.on_server(&s, true);
        assert!(i
            .server_with_uuid("5a2c0000-0000-4000-8000-000000000001")
            .is_none());
        assert!(i.servers_of("b").is_empty());
    }
}
