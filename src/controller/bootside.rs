//! The boot side's view of the store: a [`crate::http::BootIndex`] kept current by
//! watching Servers, ServerBootConfigurations and Secrets (the boot listener answers
//! from memory and never waits on the store), boot-progress conditions written back
//! onto the ServerBootConfiguration off the hot path, and the catalog-based
//! [`BootResolver`] that decides `Ready`/`Error`.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::mpsc;

use super::{set_condition, BootResolver};
use crate::api::resource::ResourceType;
use crate::http::catalog::{Catalog, FileHasher};
use crate::http::index::MemoryIndex;
use crate::http::{
    BootEvent, BootFiles, BootIndex, BootState, IgnitionData, MachineBoot, MachineId,
};
use crate::shutdown::Shutdown;
use crate::store::{meta, secret_data, Part, Store, StoreError};

/// Resolves a boot configuration's image against the catalog (every file present with
/// its SHA-256) and its ignition secret, translated and validated once per secret
/// resourceVersion (the controller and the boot index share the result).
pub struct CatalogResolver {
    pub catalog: Catalog,
    pub hasher: FileHasher,
    ignition: Mutex<HashMap<(String, String), (u64, IgnitionResult)>>,
}

type IgnitionResult = Result<IgnitionData, (String, String)>;

impl CatalogResolver {
    pub fn new(catalog: Catalog, hasher: FileHasher) -> CatalogResolver {
        CatalogResolver {
            catalog,
            hasher,
            ignition: Mutex::new(HashMap::new()),
        }
    }

    /// The Ignition payload a boot configuration hands out (`None` when it names no
    /// secret). Without `format` the secret's `ignition` key is Ignition JSON, as
    /// boot-operator has it; `format: fcos` is Butane.
    pub fn ignition_payload(
        &self,
        store: &Store,
        sbc: &Value,
    ) -> Result<Option<IgnitionData>, (String, String)> {
        let ns = meta::namespace(sbc).unwrap_or("default");
        let Some(name) = sbc
            .pointer("/spec/ignitionSecretRef/name")
            .and_then(Value::as_str)
        else {
            return Ok(None);
        };
        let t = store.registry().resolve("secret").expect("secret type");
        let secret = store.get(&t, Some(ns), name).map_err(|_| {
            (
                "IgnitionSecretMissing".to_string(),
                format!("secret {ns}/{name} not found"),
            )
        })?;
        let rv = meta::resource_version(&secret).unwrap_or(0);
        let key = (ns.to_string(), name.to_string());
        if let Some((crv, r)) = self.ignition.lock().unwrap().get(&key) {
            if *crv == rv {
                return r.clone().map(Some);
            }
        }
        let r = translate_secret(ns, name, &secret);
        self.ignition.lock().unwrap().insert(key, (rv, r.clone()));
        r.map(Some)
    }
}

impl BootResolver for CatalogResolver {
    fn resolve(&self, store: &Store, sbc: &Value) -> Result<(), (String, String)> {
        let image = sbc
            .pointer("/spec/image")
            .and_then(Value::as_str)
            .unwrap_or("");
        if image.is_empty() {
            return Err(("NoImage".into(), "spec.image is empty".into()));
        }
        match self.hasher.resolve(&self.catalog, image) {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err((e.reason().into(), e.to_string())),
            Err(e) => return Err(("ImageIOError".into(), format!("reading image files: {e}"))),
        }
        self.ignition_payload(store, sbc).map(|_| ())
    }
}

/// Decode, translate (Butane) or parse, and validate a secret's `ignition` key, so an
/// invalid config puts the boot configuration into Error instead of being served.
fn translate_secret(ns: &str, name: &str, secret: &Value) -> IgnitionResult {
    let data = secret_data(&secret, "ignition").ok_or_else(|| {
        (
            "IgnitionKeyMissing".to_string(),
            format!("secret {ns}/{name} has no data key \"ignition\""),
        )
    })?;
    let format = secret_data(&secret, "format")
        .map(|f| String::from_utf8_lossy(&f).trim().to_string())
        .filter(|f| !f.is_empty());
    let text = String::from_utf8(data).map_err(|_| {
        (
            "InvalidIgnition".to_string(),
            format!("secret {ns}/{name}: key \"ignition\" is not UTF-8"),
        )
    })?;
    // Butane (`format: fcos`) is translated, plain Ignition JSON parsed; both are
    // validated against their spec version's schema and Ignition's rules, so an invalid
    // config puts the boot configuration into Error instead of being served.
    let parsed = crate::ignition::render::IgnitionSecret {
        ignition: text,
        format,
    };
    let config = parsed
        .to_config(&crate::ignition::FilesDir::default())
        .map_err(|e| (e.reason().to_string(), format!("secret {ns}/{name}: {e}")))?;
    let body =
        serde_json::to_vec(&config).map_err(|e| ("InvalidIgnition".to_string(), e.to_string()))?;
    Ok(IgnitionData {
        data: Bytes::from(body),
        content_type: "application/json".into(),
    })
}

fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let parts: Vec<&str> = s.split([':', '-']).collect();
    if parts.len() != 6 {
        return None;
    }
    let mut m = [0u8; 6];
    for (i, p) in parts.iter().enumerate() {
        m[i] = u8::from_str_radix(p, 16).ok()?;
    }
    Some(m)
}

fn valid_uuid(s: &str) -> Option<String> {
    uuid::Uuid::parse_str(s)
        .ok()
        .map(|u| u.hyphenated().to_string())
}

/// Keeps a [`MemoryIndex`] equal to what the store says each machine should boot.
pub struct StoreBootIndex {
    pub mem: MemoryIndex,
    store: Store,
    resolver: Arc<CatalogResolver>,
    base_url: String,
    progress: mpsc::Sender<(String, BootEvent, IpAddr)>,
    /// DHCP leases (when bootplane's DHCP server runs): a machine's leased address
    /// counts as its own for the identity check.
    leases: Option<crate::dhcp::leases::LeaseIndex>,
    t_server: Arc<ResourceType>,
    t_sbc: Arc<ResourceType>,
}

impl BootIndex for StoreBootIndex {
    fn lookup(&self, id: &MachineId) -> Option<Arc<MachineBoot>> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let m = self.mem.lookup(id).or_else(|| {
            let MachineId::Ip(IpAddr::V4(ip)) = id else {
                return None;
            };
            let l = self.leases.as_ref()?.by_ip(*ip).filter(|l| l.active(now))?;
            self.mem.lookup(&MachineId::Mac(l.mac))
        })?;
        let Some(leases) = &self.leases else {
            return Some(m);
        };
        let extra: Vec<IpAddr> = m
            .macs
            .iter()
            .filter_map(|mac| leases.by_mac(mac))
            .filter(|l| l.active(now))
            .map(|l| IpAddr::V4(l.ip))
            .filter(|ip| !m.ips.contains(ip))
            .collect();
        if extra.is_empty() {
            return Some(m);
        }
        let mut with_lease = (*m).clone();
        with_lease.ips.extend(extra);
        Some(Arc::new(with_lease))
    }

    fn record_progress(&self, server: &str, event: BootEvent, client: IpAddr) {
        self.mem.record_progress(server, event, client);
        // Never block the request: a full queue drops the status write (the fetch
        // itself is still logged and counted by the listener).
        if self
            .progress
            .try_send((server.to_string(), event, client))
            .is_err()
        {
            tracing::warn!(
                server,
                "boot progress queue full; status condition not recorded"
            );
        }
    }
}

impl StoreBootIndex {
    /// Build the index and start its watch and progress-writer tasks.
    pub fn start(
        store: Store,
        resolver: Arc<CatalogResolver>,
        base_url: String,
        leases: Option<crate::dhcp::leases::LeaseIndex>,
        shutdown: Shutdown,
    ) -> Arc<StoreBootIndex> {
        let (tx, rx) = mpsc::channel(4096);
        let reg = store.registry();
        let idx = Arc::new(StoreBootIndex {
            mem: MemoryIndex::new(),
            store,
            resolver,
            base_url,
            progress: tx,
            leases,
            t_server: reg.resolve("server").expect("server"),
            t_sbc: reg.resolve("sbc").expect("sbc"),
        });
        let i = idx.clone();
        let s1 = shutdown.child();
        tokio::spawn(async move { i.watch(s1).await });
        let i = idx.clone();
        tokio::spawn(async move { i.write_progress(rx, shutdown).await });
        idx
    }

    /// Recompute one server's entry from the store.
    pub fn refresh(&self, server: &str) {
        let Ok(s) = self.store.get(&self.t_server, None, server) else {
            self.mem.remove(server);
            return;
        };
        let mut ips: Vec<IpAddr> = Vec::new();
        let mut macs = Vec::new();
        for nic in s
            .pointer("/status/networkInterfaces")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(m) = nic
                .get("macAddress")
                .and_then(Value::as_str)
                .and_then(parse_mac)
            {
                macs.push(m);
            }
            let more = nic
                .get("ips")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str);
            for ip in nic
                .get("ip")
                .and_then(Value::as_str)
                .into_iter()
                .chain(more)
            {
                if let Ok(a) = ip.parse() {
                    ips.push(a);
                }
            }
        }
        let uuid = s
            .pointer("/spec/systemUUID")
            .and_then(Value::as_str)
            .and_then(valid_uuid);
        let (state, files, ignition) = self.boot_state(&s);
        self.mem.upsert(MachineBoot {
            server: server.to_string(),
            uuid,
            ips,
            macs,
            state,
            files,
            ignition,
        });
    }

    fn boot_state(&self, s: &Value) -> (BootState, Option<BootFiles>, Option<IgnitionData>) {
        let Some(r) = s
            .pointer("/spec/bootConfigurationRef")
            .filter(|r| !r.is_null())
        else {
            return (BootState::NotClaimed, None, None);
        };
        let ns = r
            .get("namespace")
            .and_then(Value::as_str)
            .unwrap_or("default");
        let name = r.get("name").and_then(Value::as_str).unwrap_or("");
        let Ok(sbc) = self.store.get(&self.t_sbc, Some(ns), name) else {
            return (
                BootState::Error(format!("ServerBootConfiguration {ns}/{name} not found")),
                None,
                None,
            );
        };
        match sbc.pointer("/status/state").and_then(Value::as_str) {
            Some("Ready") => {}
            Some("Error") => {
                let why = sbc
                    .pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .and_then(|l| l.iter().find(|c| c["type"] == "Ready"))
                    .and_then(|c| c.get("message").and_then(Value::as_str))
                    .unwrap_or("boot configuration is in Error");
                return (BootState::Error(why.to_string()), None, None);
            }
            _ => return (BootState::NotClaimed, None, None),
        }
        let image = sbc
            .pointer("/spec/image")
            .and_then(Value::as_str)
            .unwrap_or("");
        let files = match self.resolver.hasher.resolve(&self.resolver.catalog, image) {
            Ok(Ok(r)) => r.boot_files(&self.base_url),
            Ok(Err(e)) => return (BootState::Error(e.to_string()), None, None),
            Err(e) => {
                return (
                    BootState::Error(format!("reading image files: {e}")),
                    None,
                    None,
                )
            }
        };
        match self.resolver.ignition_payload(&self.store, &sbc) {
            Ok(ign) => (BootState::Ready, Some(files), ign),
            Err((_, msg)) => (BootState::Error(msg), None, None),
        }
    }

    async fn watch(self: Arc<Self>, mut shutdown: Shutdown) {
        let reg = self.store.registry();
        let types: Vec<Arc<ResourceType>> = ["server", "sbc", "secret"]
            .iter()
            .map(|k| reg.resolve(k).expect("type"))
            .collect();
        'relist: loop {
            let rev = self.store.revision();
            let (servers, _) = self.store.list(&self.t_server, None, None);
            for s in servers {
                self.refresh(meta::name(&s));
            }
            let mut watches = Vec::new();
            for t in &types {
                match self.store.watch(t, None, rev) {
                    Ok(w) => watches.push(w),
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue 'relist;
                    }
                }
            }
            let mut iter = watches.into_iter();
            let (mut ws, mut wb, mut wsec) = (
                iter.next().unwrap(),
                iter.next().unwrap(),
                iter.next().unwrap(),
            );
            loop {
                let ev = tokio::select! {
                    e = ws.next() => e,
                    e = wb.next() => e,
                    e = wsec.next() => e,
                    _ = shutdown.recv() => return,
                };
                match ev {
                    Ok(ev) => {
                        for server in self.affected(&ev.object) {
                            self.refresh(&server);
                        }
                    }
                    Err(StoreError::Gone(_)) => continue 'relist,
                    Err(_) => return,
                }
            }
        }
    }

    /// Servers whose boot entry depends on this object.
    fn affected(&self, o: &Value) -> HashSet<String> {
        let mut out = HashSet::new();
        match o.get("kind").and_then(Value::as_str) {
            Some("Server") => {
                out.insert(meta::name(o).to_string());
            }
            Some("ServerBootConfiguration") => {
                if let Some(s) = o.pointer("/spec/serverRef/name").and_then(Value::as_str) {
                    out.insert(s.to_string());
                }
            }
            Some("Secret") => {
                let ns = meta::namespace(o).unwrap_or("default");
                let (sbcs, _) = self.store.list(&self.t_sbc, Some(ns), None);
                for b in sbcs {
                    if b.pointer("/spec/ignitionSecretRef/name")
                        .and_then(Value::as_str)
                        == Some(meta::name(o))
                    {
                        if let Some(s) = b.pointer("/spec/serverRef/name").and_then(Value::as_str) {
                            out.insert(s.to_string());
                        }
                    }
                }
            }
            _ => {}
        }
        out
    }

    /// Write `IPXEScriptFetched` / `IgnitionDataFetched` onto the machine's boot configuration.
    async fn write_progress(
        self: Arc<Self>,
        mut rx: mpsc::Receiver<(String, BootEvent, IpAddr)>,
        mut shutdown: Shutdown,
    ) {
        loop {
            let (server, event, client) = tokio::select! {
                m = rx.recv() => match m { Some(m) => m, None => return },
                _ = shutdown.recv() => return,
            };
            if let Err(e) = self.record_condition(&server, event, client).await {
                tracing::warn!(server, error = %e, "recording boot progress");
            }
        }
    }

    async fn record_condition(
        &self,
        server: &str,
        event: BootEvent,
        client: IpAddr,
    ) -> Result<(), StoreError> {
        let s = self.store.get(&self.t_server, None, server)?;
        let Some(r) = s
            .pointer("/spec/bootConfigurationRef")
            .filter(|r| !r.is_null())
        else {
            return Ok(());
        };
        let ns = r
            .get("namespace")
            .and_then(Value::as_str)
            .unwrap_or("default")
            .to_string();
        let name = r
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        for _ in 0..8 {
            let b = self.store.get(&self.t_sbc, Some(&ns), &name)?;
            let mut status = b
                .get("status")
                .cloned()
                .unwrap_or_else(|| serde_json::json!({}));
            let msg = format!("fetched by {client}");
            if !set_condition(&mut status, event.condition_type(), true, "Fetched", &msg) {
                return Ok(());
            }
            let mut o = (*b).clone();
            o["status"] = status;
            match self.store.update(&self.t_sbc, o, Part::Status).await {
                Err(StoreError::Conflict { .. }) => continue,
                other => return other.map(|_| ()),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_and_uuids() {
        assert_eq!(
            parse_mac("52:54:00:AB:cd:01"),
            Some([0x52, 0x54, 0, 0xab, 0xcd, 1])
        );
        assert_eq!(
            parse_mac("52-54-00-ab-cd-01"),
            Some([0x52, 0x54, 0, 0xab, 0xcd, 1])
        );
        assert_eq!(parse_mac("52:54:00"), None);
        assert_eq!(
            valid_uuid("4C4C4544-0001-0001-0001-000000000001").as_deref(),
            Some("4c4c4544-0001-0001-0001-000000000001")
        );
        assert_eq!(valid_uuid("1234"), None);
    }
}
