//! The cluster's keyring in etcd ([`crate::keyring`] has the cryptography): where
//! the records live, the operator's steps (`bootplane store keygen`, `join`, `admit`,
//! `rotate`, `keys`), and an appliance's side at start and while it runs.
//!
//! Keys, under `store.etcd.prefix` and outside `{prefix}objects` (so no mirror holds
//! them):
//! - `{prefix}keyring/created`: written once, by `keygen`, in the same transaction as
//!   the first member's wrapping (a second `keygen` anywhere is refused);
//! - `{prefix}keyring/members/NAME`: the ring wrapped for appliance NAME
//!   (`store.etcd.name`);
//! - `{prefix}keyring/requests/NAME`: NAME's join request (its public key), removed by
//!   the `admit` that wraps the ring for it.
//!
//! At start ([`sealer_for`]) an appliance with an identity file, or on a cluster that
//! has a keyring, takes its keys from its wrapping (unwrapped with its identity,
//! checked against its pin) and never from the key file; one that has no wrapping
//! refuses to start with an error naming `join` and `admit`. On a cluster without a
//! keyring nothing changes: the key file, as before (the log names `keygen`).
//!
//! Rotation (`store rotate`, on a member): a new random key first, the generation
//! bumped, and every member's record rewritten in one transaction (each compared to
//! the revision read, and each member's public key checked against its endorsement
//! first). Each appliance follows its own record ([`Follower`]) and swaps the new ring
//! in; the background reseal pass ([`crate::rotate`]) then rewrites what is under the
//! older keys. The mirror asks for the record again before it applies a value sealed
//! with a key it does not hold yet, so another appliance's first re-sealed writes
//! never race the new ring.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use etcd_client::{Compare, CompareOp, EventType, GetOptions, Txn, TxnOp, WatchOptions};
use tokio_util::sync::CancellationToken;

use super::client;
use crate::keyring::{
    check_fingerprint, fingerprint, parse_record, parse_request, request, unwrap, wrap, Identity,
    Pin, Ring, IDENTITY_FILE, PIN_FILE,
};
use crate::seal::{read_raw_key_file, Sealer, SEALED_PREFIXES};
use crate::settings::{EtcdConfig, StoreConfig};

/// Most members and requests read.
const MAX_MEMBERS: i64 = 256;

/// Where the keyring's records are, for one prefix and member.
struct Keys {
    prefix: String,
}

impl Keys {
    fn new(cfg: &EtcdConfig) -> Keys {
        Keys {
            prefix: format!("{}keyring/", cfg.prefix),
        }
    }
    fn created(&self) -> String {
        format!("{}created", self.prefix)
    }
    fn members(&self) -> String {
        format!("{}members/", self.prefix)
    }
    fn member(&self, name: &str) -> String {
        format!("{}members/{name}", self.prefix)
    }
    fn requests(&self) -> String {
        format!("{}requests/", self.prefix)
    }
    fn request(&self, name: &str) -> String {
        format!("{}requests/{name}", self.prefix)
    }
}

/// The first key after every key starting with `prefix`.
fn prefix_end(prefix: &str) -> Vec<u8> {
    super::prefix_end(prefix.as_bytes())
}

/// One etcd key's value and mod revision, `None` when absent.
async fn get(client: &etcd_client::Client, key: &str) -> anyhow::Result<Option<(Vec<u8>, i64)>> {
    let r = client
        .kv_client()
        .get(key, None)
        .await
        .with_context(|| format!("reading {key} from etcd"))?;
    Ok(r.kvs()
        .first()
        .map(|kv| (kv.value().to_vec(), kv.mod_revision())))
}

/// Every key under `prefix`: (name after the prefix, value, mod revision), and the
/// revision they were read at.
async fn list(
    client: &etcd_client::Client,
    prefix: &str,
) -> anyhow::Result<(Vec<(String, Vec<u8>, i64)>, i64)> {
    let opts = GetOptions::new()
        .with_range(prefix_end(prefix))
        .with_limit(MAX_MEMBERS + 1);
    let r = client
        .kv_client()
        .get(prefix, Some(opts))
        .await
        .with_context(|| format!("listing {prefix} from etcd"))?;
    if r.kvs().len() as i64 > MAX_MEMBERS {
        bail!("more than {MAX_MEMBERS} keys under {prefix}: refused");
    }
    let at = r.header().map(|h| h.revision()).unwrap_or(0);
    let all = r
        .kvs()
        .iter()
        .filter_map(|kv| {
            let name = kv.key_str().ok()?.strip_prefix(prefix)?.to_string();
            Some((name, kv.value().to_vec(), kv.mod_revision()))
        })
        .collect();
    Ok((all, at))
}

/// Whether the cluster has a keyring (`keygen` ran, or any member has a wrapping).
async fn has_keyring(client: &etcd_client::Client, k: &Keys) -> anyhow::Result<bool> {
    if get(client, &k.created()).await?.is_some() {
        return Ok(true);
    }
    let opts = GetOptions::new()
        .with_range(prefix_end(&k.members()))
        .with_count_only();
    let r = client
        .kv_client()
        .get(k.members(), Some(opts))
        .await
        .with_context(|| format!("reading {} from etcd", k.members()))?;
    Ok(r.count() > 0)
}

/// The fix for an appliance with no wrapping, as the errors say it.
fn join_fix(me: &str, fp: Option<&str>) -> String {
    format!(
        "run `bootplane store join` here, then `bootplane store admit {me} --fingerprint {}` on an appliance of the cluster",
        fp.unwrap_or("FINGERPRINT")
    )
}

/// An appliance's keys and identity: the identity file and pin in its state dir.
struct Local {
    me: String,
    identity_path: PathBuf,
    pin_path: PathBuf,
}

impl Local {
    fn new(cfg: &StoreConfig, state_dir: &Path) -> Local {
        Local {
            me: cfg.etcd.member_name(),
            identity_path: state_dir.join(IDENTITY_FILE),
            pin_path: state_dir.join(PIN_FILE),
        }
    }

    /// This appliance's ring, unwrapped from its record (and the record's revision).
    async fn ring(
        &self,
        client: &etcd_client::Client,
        k: &Keys,
        identity: &Identity,
    ) -> anyhow::Result<(Ring, i64)> {
        let Some((value, rev)) = get(client, &k.member(&self.me)).await? else {
            bail!(
                "this appliance ({}) has no wrapping in the cluster's keyring (no {}): {}",
                self.me,
                k.member(&self.me),
                join_fix(&self.me, Some(&identity.fingerprint()))
            );
        };
        Ok((unwrap(&value, &self.me, identity)?, rev))
    }

    fn identity(&self) -> anyhow::Result<Identity> {
        if std::fs::symlink_metadata(&self.identity_path).is_err() {
            bail!(
                "this appliance ({}) has no store identity ({} is missing): it is not a member of the cluster's keyring; run this on an appliance that ran `bootplane store keygen` or was admitted",
                self.me,
                self.identity_path.display()
            );
        }
        Identity::load(&self.identity_path)
    }
}

/// The sealer of an appliance on etcd, and the follower of its keyring record when
/// the keys come from the cluster's keyring (see the module doc).
pub async fn sealer_for(
    cfg: &StoreConfig,
    state_dir: &Path,
) -> anyhow::Result<(Sealer, Option<Arc<Follower>>)> {
    let client = client::connect(&cfg.etcd).await?;
    let k = Keys::new(&cfg.etcd);
    let local = Local::new(cfg, state_dir);
    let has_identity = std::fs::symlink_metadata(&local.identity_path).is_ok();
    let keyring = tokio::time::timeout(request_limit(cfg), has_keyring(&client, &k))
        .await
        .map_err(|_| anyhow::anyhow!("reading {} from etcd: timed out", k.prefix))??;
    if !keyring && !has_identity {
        let sealer = Sealer::load(&cfg.key_file(state_dir))?;
        tracing::info!(
            path = %cfg.key_file(state_dir).display(),
            "secrets at rest: keys from this appliance's key file; `bootplane store keygen` puts them in the cluster's keyring in etcd, so that other appliances join with `bootplane store join` instead of a copy of the file (docs/cluster.md)"
        );
        return Ok((sealer, None));
    }
    if !keyring {
        bail!(
            "this appliance has a store identity ({}) but the cluster has no keyring under {}: run `bootplane store keygen` on the cluster's first appliance and `bootplane store join` here, or remove the identity file to use the key file",
            local.identity_path.display(),
            k.prefix
        );
    }
    if !has_identity {
        bail!(
            "the cluster's secrets keyring (under {}) has no wrapping for this appliance ({}): {}",
            k.prefix,
            local.me,
            join_fix(&local.me, None)
        );
    }
    let identity = local.identity()?;
    let (ring, _) = tokio::time::timeout(request_limit(cfg), local.ring(&client, &k, &identity))
        .await
        .map_err(|_| anyhow::anyhow!("reading {} from etcd: timed out", k.member(&local.me)))??;
    let pin = match Pin::read(&local.pin_path)? {
        Some(pin) => {
            pin.admits(&local.me, &ring)?;
            pin
        }
        None => Pin::of(&ring),
    };
    if pin != Pin::of(&ring) || std::fs::symlink_metadata(&local.pin_path).is_err() {
        Pin::of(&ring).write(&local.pin_path)?;
    }
    let sealer = Sealer::from_keys(&ring.keys, &local.identity_path)?;
    tracing::info!(
        generation = ring.generation,
        keys = ?ring.names(),
        "secrets at rest: keys from the cluster's keyring in etcd; new writes use key {}",
        ring.primary()
    );
    let follower = Follower {
        client,
        key: k.member(&local.me),
        me: local.me,
        identity,
        pin_path: local.pin_path,
        sealer: sealer.clone(),
        pin: tokio::sync::Mutex::new(Pin::of(&ring)),
    };
    Ok((sealer, Some(Arc::new(follower))))
}

fn request_limit(cfg: &StoreConfig) -> Duration {
    Duration::from_millis(cfg.etcd.request_timeout_ms) * 2
}

/// An appliance's side of rotations: follows its record and swaps a newer ring into
/// its sealer (checked against its pin, which it then updates).
pub struct Follower {
    client: etcd_client::Client,
    key: String,
    me: String,
    identity: Identity,
    pin_path: PathBuf,
    sealer: Sealer,
    pin: tokio::sync::Mutex<Pin>,
}

impl Follower {
    /// Read this appliance's record again and take its ring when it is newer: `true`
    /// when the keys changed. A ring the pin refuses, or that does not open, leaves
    /// the keys as they were (the error says why).
    pub(crate) async fn refresh(&self) -> anyhow::Result<bool> {
        let mut pin = self.pin.lock().await;
        let Some((value, _)) = get(&self.client, &self.key).await? else {
            bail!(
                "this appliance's wrapping {} was deleted from etcd (bootplane never deletes it): it keeps the keys it has; check who can write etcd",
                self.key
            );
        };
        let ring = unwrap(&value, &self.me, &self.identity)?;
        if Pin::of(&ring) == *pin {
            return Ok(false);
        }
        pin.admits(&self.me, &ring)?;
        self.sealer.replace(&ring.keys)?;
        *pin = Pin::of(&ring);
        if let Err(e) = pin.write(&self.pin_path) {
            tracing::error!(
                error = format!("{e:#}"),
                "the keyring's pin file was not written; the new keys are used"
            );
        }
        tracing::info!(
            generation = ring.generation,
            keys = ?ring.names(),
            "the cluster's keyring changed: new writes use key {}; the older keys' objects are re-sealed in the background",
            ring.primary()
        );
        Ok(true)
    }

    /// Follow the record until `stop`: each change is read and checked by
    /// [`Follower::refresh`]; a cut watch is opened again (and the record read once,
    /// for what changed meanwhile).
    pub(crate) async fn run(self: Arc<Self>, stop: CancellationToken) {
        loop {
            let watched = tokio::select! {
                _ = stop.cancelled() => return,
                r = self.watch_once() => r,
            };
            if let Err(e) = watched {
                tracing::warn!(error = format!("{e:#}"), key = %self.key, "watching the keyring record failed; again in 1 s");
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    async fn watch_once(&self) -> anyhow::Result<()> {
        let mut stream = self
            .client
            .watch_client()
            .watch(self.key.as_str(), Some(WatchOptions::new()))
            .await
            .context("opening the watch")?;
        self.refreshed().await;
        while let Some(resp) = stream.message().await.context("watch")? {
            if resp.canceled() {
                bail!("watch canceled: {}", resp.cancel_reason());
            }
            if resp
                .events()
                .iter()
                .any(|e| e.event_type() == EventType::Put)
            {
                self.refreshed().await;
            } else if !resp.events().is_empty() {
                tracing::error!(key = %self.key, "this appliance's wrapping was deleted from etcd (bootplane never deletes it): it keeps the keys it has; check who can write etcd");
            }
        }
        bail!("the watch ended")
    }

    /// [`Follower::refresh`], its error logged.
    pub(crate) async fn refreshed(&self) {
        if let Err(e) = self.refresh().await {
            tracing::error!(error = format!("{e:#}"), key = %self.key, "the keyring record was not taken; the keys stay as they were");
        }
    }
}

/// What `bootplane store keygen` did.
#[derive(Debug)]
pub struct Keygen {
    pub member: String,
    pub fingerprint: String,
    /// The key file whose keys were adopted, when there was one.
    pub adopted: Option<PathBuf>,
    pub keys: Vec<String>,
}

/// `bootplane store keygen`: this appliance's identity, and the cluster's first
/// ring (the key file's keys when it exists, else one new key), wrapped for it.
pub async fn keygen(cfg: &StoreConfig, state_dir: &Path) -> anyhow::Result<Keygen> {
    let client = client::connect(&cfg.etcd).await?;
    let k = Keys::new(&cfg.etcd);
    let local = Local::new(cfg, state_dir);
    let refused = || {
        anyhow::anyhow!(
            "the cluster already has a keyring (under {}): run `bootplane store join` here instead, then admit this appliance on a member",
            k.prefix
        )
    };
    if has_keyring(&client, &k).await? {
        return Err(refused());
    }
    let key_file = cfg.key_file(state_dir);
    let (keys, adopted) = if std::fs::symlink_metadata(&key_file).is_ok() {
        (read_raw_key_file(&key_file)?, Some(key_file))
    } else {
        (vec![], None)
    };
    let ring = Ring::first(keys)?;
    let (identity, _) = Identity::load_or_create(&local.identity_path)?;
    let created = serde_json::json!({"by": local.me, "at": crate::now()}).to_string();
    let txn = Txn::new()
        .when([Compare::create_revision(k.created(), CompareOp::Equal, 0)])
        .and_then([
            TxnOp::put(k.created(), created, None),
            TxnOp::put(
                k.member(&local.me),
                wrap(&ring, &local.me, &identity.public()),
                None,
            ),
        ]);
    let r = client
        .kv_client()
        .txn(txn)
        .await
        .context("writing the keyring to etcd")?;
    if !r.succeeded() {
        return Err(refused());
    }
    Pin::of(&ring).write(&local.pin_path)?;
    Ok(Keygen {
        member: local.me,
        fingerprint: identity.fingerprint(),
        adopted,
        keys: ring.names(),
    })
}

/// What `bootplane store join` did.
#[derive(Debug)]
pub struct Joined {
    pub member: String,
    pub fingerprint: String,
    /// Already a member (its wrapping is for this identity): nothing written.
    pub already: bool,
}

impl Joined {
    /// The command to run on a member.
    pub fn admit_command(&self) -> String {
        format!(
            "bootplane store admit {} --fingerprint {}",
            self.member, self.fingerprint
        )
    }
}

/// `bootplane store join`: this appliance's identity (made when missing), and its
/// join request in etcd.
pub async fn join(cfg: &StoreConfig, state_dir: &Path) -> anyhow::Result<Joined> {
    let client = client::connect(&cfg.etcd).await?;
    let k = Keys::new(&cfg.etcd);
    let local = Local::new(cfg, state_dir);
    if !has_keyring(&client, &k).await? {
        bail!(
            "the cluster has no keyring under {} yet: run `bootplane store keygen` on its first appliance (one that has the key file, when the cluster has Secrets already)",
            k.prefix
        );
    }
    let (identity, _) = Identity::load_or_create(&local.identity_path)?;
    let joined = |already| Joined {
        member: local.me.clone(),
        fingerprint: identity.fingerprint(),
        already,
    };
    if let Some((value, _)) = get(&client, &k.member(&local.me)).await? {
        if unwrap(&value, &local.me, &identity).is_ok() {
            return Ok(joined(true));
        }
    }
    client
        .kv_client()
        .put(
            k.request(&local.me),
            request(&local.me, &identity.public()),
            None,
        )
        .await
        .context("writing the join request to etcd")?;
    Ok(joined(false))
}

/// What `bootplane store admit` did.
#[derive(Debug)]
pub struct Admitted {
    pub member: String,
    pub generation: u64,
}

/// `bootplane store admit NAME --fingerprint FP`, on a member: the ring wrapped for
/// NAME's requested public key when its fingerprint is `fp`.
pub async fn admit(
    cfg: &StoreConfig,
    state_dir: &Path,
    name: &str,
    fp: &str,
) -> anyhow::Result<Admitted> {
    check_name(name)?;
    let client = client::connect(&cfg.etcd).await?;
    let k = Keys::new(&cfg.etcd);
    let local = Local::new(cfg, state_dir);
    let identity = local.identity()?;
    let (ring, my_rev) = local.ring(&client, &k, &identity).await?;
    let Some((req, req_rev)) = get(&client, &k.request(name)).await? else {
        bail!(
            "no join request from {name} (no {}): run `bootplane store join` on {name} first",
            k.request(name)
        );
    };
    let pk = parse_request(&req, name)?;
    check_fingerprint(name, &pk, fp)?;
    let txn = Txn::new()
        .when([
            Compare::mod_revision(k.member(&local.me), CompareOp::Equal, my_rev),
            Compare::mod_revision(k.request(name), CompareOp::Equal, req_rev),
        ])
        .and_then([
            TxnOp::put(k.member(name), wrap(&ring, name, &pk), None),
            TxnOp::delete(k.request(name), None),
        ]);
    let r = client
        .kv_client()
        .txn(txn)
        .await
        .context("writing the wrapping to etcd")?;
    if !r.succeeded() {
        bail!("the keyring or {name}'s join request changed meanwhile: nothing was written; run admit again");
    }
    Ok(Admitted {
        member: name.into(),
        generation: ring.generation,
    })
}

/// `bootplane store remove NAME`: NAME's wrapping and join request deleted, so later
/// rotations no longer wrap the keys for its identity. `false` when it had neither.
pub async fn remove(cfg: &StoreConfig, name: &str) -> anyhow::Result<bool> {
    check_name(name)?;
    if name == cfg.etcd.member_name() {
        bail!("{name} is this appliance: remove it from another appliance of the cluster");
    }
    let client = client::connect(&cfg.etcd).await?;
    let k = Keys::new(&cfg.etcd);
    let r = client
        .kv_client()
        .txn(Txn::new().and_then([
            TxnOp::delete(k.member(name), None),
            TxnOp::delete(k.request(name), None),
        ]))
        .await
        .context("deleting from etcd")?;
    Ok(r.op_responses().iter().any(|o| match o {
        etcd_client::TxnOpResponse::Delete(d) => d.deleted() > 0,
        _ => false,
    }))
}

fn check_name(name: &str) -> anyhow::Result<()> {
    let cfg = EtcdConfig {
        name: Some(name.into()),
        ..EtcdConfig::default()
    };
    cfg.validate().map_err(|_| {
        anyhow::anyhow!("{name:?} is not an appliance name (1-63 characters of [A-Za-z0-9-._])")
    })
}

/// What `bootplane store rotate` did.
#[derive(Debug)]
pub struct Rotated {
    pub generation: u64,
    pub keys: Vec<String>,
    pub members: Vec<String>,
}

/// `bootplane store rotate [--drop-old]`, on a member: the next generation of the
/// ring (a new key first; or, `drop_old`, the first key only, refused while any
/// sealed object is under another key) wrapped for every member, in one transaction.
pub async fn rotate(
    cfg: &StoreConfig,
    state_dir: &Path,
    drop_old: bool,
) -> anyhow::Result<Rotated> {
    let client = client::connect(&cfg.etcd).await?;
    let k = Keys::new(&cfg.etcd);
    let local = Local::new(cfg, state_dir);
    let identity = local.identity()?;
    let (ring, _) = local.ring(&client, &k, &identity).await?;
    let next = if drop_old {
        let older = sealed_under_older_keys(&client, cfg, ring.primary()).await?;
        if older > 0 {
            bail!(
                "{older} sealed objects are still under keys older than {}: wait until every appliance's bootplane_store_secrets_by_key shows none under them, then run this again",
                ring.primary()
            );
        }
        ring.without_old()
    } else {
        ring.rotated()?
    };
    let (members, at) = list(&client, &k.members()).await?;
    // No member added or changed since the listing (an admit meanwhile would keep the
    // older ring), and each as read.
    let mut when = vec![Compare::mod_revision(k.members(), CompareOp::Less, at + 1).with_prefix()];
    let mut then = Vec::with_capacity(members.len());
    let mut names = Vec::with_capacity(members.len());
    for (name, value, rev) in &members {
        let rec = parse_record(value, name)?;
        // Only a public key a holder of the ring endorsed gets the new ring.
        crate::keyring::check_endorsed(&rec, &ring)?;
        when.push(Compare::mod_revision(
            k.member(name),
            CompareOp::Equal,
            *rev,
        ));
        then.push(TxnOp::put(
            k.member(name),
            wrap(&next, name, &rec.public_key),
            None,
        ));
        names.push(name.clone());
    }
    let r = client
        .kv_client()
        .txn(Txn::new().when(when).and_then(then))
        .await
        .context("writing the rotated keyring to etcd")?;
    if !r.succeeded() {
        bail!("a member's wrapping changed meanwhile (an admit or a rotation elsewhere): nothing was written; run rotate again");
    }
    Ok(Rotated {
        generation: next.generation,
        keys: next.names(),
        members: names,
    })
}

/// How many sealed values in etcd name another key than `primary` (the envelope names
/// its key in clear; nothing is decrypted).
async fn sealed_under_older_keys(
    client: &etcd_client::Client,
    cfg: &StoreConfig,
    primary: &str,
) -> anyhow::Result<usize> {
    // The cluster's sealing marker too (re-sealed by the same background pass).
    let marker = format!("{}objects{}", cfg.etcd.prefix, super::marker::KEY);
    let mut older = match get(client, &marker).await? {
        Some((v, _)) => usize::from(crate::seal::sealed_key_name(&v) != Some(primary)),
        None => 0,
    };
    for p in SEALED_PREFIXES {
        let prefix = format!("{}objects{p}", cfg.etcd.prefix);
        let mut from = prefix.clone().into_bytes();
        loop {
            let opts = GetOptions::new()
                .with_range(prefix_end(&prefix))
                .with_limit(500);
            let page = client
                .kv_client()
                .get(from.clone(), Some(opts))
                .await
                .with_context(|| format!("listing {prefix} from etcd"))?;
            for kv in page.kvs() {
                if crate::seal::sealed_key_name(kv.value()).is_none_or(|n| n != primary) {
                    older += 1;
                }
            }
            match page.kvs().last() {
                Some(last) if page.more() => {
                    from = last.key().to_vec();
                    from.push(0);
                }
                _ => break,
            }
        }
    }
    Ok(older)
}

/// `bootplane store keys`: the members and the pending requests.
#[derive(Debug, Default)]
pub struct Listing {
    /// (name, fingerprint, the key its endorsement names)
    pub members: Vec<(String, String, String)>,
    /// (name, fingerprint)
    pub requests: Vec<(String, String)>,
}

pub async fn keys(cfg: &StoreConfig) -> anyhow::Result<Listing> {
    let client = client::connect(&cfg.etcd).await?;
    let k = Keys::new(&cfg.etcd);
    let mut out = Listing::default();
    for (name, value, _) in list(&client, &k.members()).await?.0 {
        match parse_record(&value, &name) {
            Ok(r) => out
                .members
                .push((name, fingerprint(&r.public_key), r.endorsed_by)),
            Err(e) => out.members.push((name, format!("({e})"), String::new())),
        }
    }
    for (name, value, _) in list(&client, &k.requests()).await?.0 {
        let fp = parse_request(&value, &name)
            .map(|pk| fingerprint(&pk))
            .unwrap_or_else(|e| format!("({e})"));
        out.requests.push((name, fp));
    }
    Ok(out)
}
