//! Secrets at rest: the Secret and BMCSecret objects' text is encrypted where the
//! store hands it to its engine (the bytes redb writes, the values etcd is sent) and
//! decrypted where it comes back (redb at open, etcd's list and watch into the
//! mirror). In memory it stays plain (see ARCHITECTURE.md's store room).
//!
//! The envelope is Kubernetes' EncryptionConfiguration layout under our own prefix:
//! `bootplane:enc:xchacha20poly1305:v1:` + key name + `:` + 24-byte nonce +
//! ciphertext and 16-byte tag, with the store key (`/core/secrets/ns/name`) as
//! associated data, so a value copied onto another object's key does not decrypt.
//!
//! On etcd the values are written as `v2`: after the key name's `:` come the
//! [`Binding`] (16 bytes: the etcd key's create revision, 0 for the write that
//! creates it, and its `version`, both big-endian) and then the nonce; the associated
//! data is the store key *and* the binding. etcd bumps a key's `version` on every put
//! (an attacker's `etcdctl put` too) and gives a re-created key a new create revision,
//! so an older value put back under its key (a rollback) is bound to a version etcd no
//! longer holds and is refused ([`SealError::Replayed`]); the engine knows the version
//! it writes because every sealed write is guarded by the previous mod revision. A
//! `v1` value (written before) still opens, and counts as stale so the next pass of
//! [`super::Store::reseal`] rewrites it as `v2`. A create is bound to the revision
//! etcd will give it (its current one, asked just before, plus one); when etcd gives another
//! (a write elsewhere in between), the value opens nowhere and the writer rewrites it
//! at once bound to the real create revision (version 2): so a deleted key's first
//! value put back as a new key is bound to a create revision that key no longer has.
//! **Legacy** values (`v1`, and `v2` bound to create revision 0 by appliances of
//! before) open only until the cluster's marker says every one was re-sealed
//! (`super::etcd::marker`); after it they are refused ([`SealError::Legacy`]).
//! The embedded engine keeps
//! writing `v1`: its file and the key file are in the same state directory, so
//! whoever can put an old record back can read the keys too.
//! XChaCha20-Poly1305's 192-bit nonce is drawn at random for every write: random
//! nonces that long never repeat in practice whatever the write rate (a 96-bit one
//! would want a bound on writes per key).
//!
//! The key file (`[store] encryption_key_file`, default `<state_dir>/secrets.key`,
//! created 0600 with one random 256-bit key on first start) is TOML:
//!
//! ```toml
//! [[keys]]
//! name = "key2"          # the first key encrypts every new write
//! secret = "base64 of 32 bytes"
//! [[keys]]
//! name = "key1"          # the others still decrypt
//! secret = "..."
//! ```
//!
//! Each engine keeps a [`Ledger`] of which key each sealed object is stored under
//! (`identity`: stored in clear, before encryption existed); [`super::Store::reseal`]
//! rewrites the ones not under the first key. Keys never appear in `Debug` output,
//! logs or errors: errors name the key name only.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use anyhow::{bail, Context as _};
use base64::Engine as _;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use serde::Deserialize;

/// The store keys whose values are sealed: core Secrets and BMCSecrets, and APITokens
/// (not for secrecy, they hold a hash, but so that a token written to etcd directly,
/// without the key, does not authenticate: see [`must_be_sealed`]).
pub(crate) const SEALED_PREFIXES: [&str; 3] = [
    "/core/secrets/",
    "/metal.ironcore.dev/bmcsecrets/",
    TOKEN_PREFIX,
];
/// The store keys of `APIToken`s.
const TOKEN_PREFIX: &str = "/auth.bootplane.dev/apitokens/";

/// The envelope's prefix, before the key name: key-bound ([`Format::V1`]).
const MAGIC: &[u8] = b"bootplane:enc:xchacha20poly1305:v1:";
/// The prefix of an envelope bound to the key and a [`Binding`] ([`Format::V2`]).
const MAGIC_V2: &[u8] = b"bootplane:enc:xchacha20poly1305:v2:";
/// What a v2 envelope's associated data starts with (a v1's is the store key, which
/// starts with `/`, so the two never collide).
const AD_V2: &[u8] = b"bootplane:v2\0";
/// A [`Binding`]'s length in an envelope.
const BINDING: usize = 16;
const NONCE: usize = 24;
const TAG: usize = 16;
/// The ledger's name for a sealed object stored in clear (Kubernetes' name for the
/// provider that does not encrypt); no key may be called so.
pub(crate) const IDENTITY: &str = "identity";
/// How the ledger names a key whose object is in a legacy envelope (`KEY@v1`).
pub const LEGACY_SUFFIX: &str = "@v1";
/// Largest key file read.
const MAX_FILE: u64 = 64 << 10;
/// Most keys in a key file.
const MAX_KEYS: usize = 32;

/// Whether the value of store key `key` is sealed at rest.
pub(crate) fn is_sealed(key: &str) -> bool {
    SEALED_PREFIXES.iter().any(|p| key.starts_with(p))
}

/// Whether a value of `key` stored in clear is refused on etcd (instead of read, and
/// sealed by the next reseal pass, as a Secret of before encryption is): an APIToken
/// in clear is what anyone who may write etcd could add to become admin.
#[cfg_attr(not(feature = "etcd"), allow(dead_code))] // the etcd engine's
pub(crate) fn must_be_sealed(key: &str) -> bool {
    key.starts_with(TOKEN_PREFIX)
}

/// What a v2 envelope is bound to besides its object's store key: the etcd key's
/// create revision (0: sealed by the write that creates the key, whose revision is
/// not known before it commits) and `version` (1 for that write, +1 per put).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Binding {
    pub create_rev: u64,
    pub version: u64,
}

impl Binding {
    /// The binding appliances of before gave the write that creates a key (its create
    /// revision not known): legacy, refused once the cluster's marker is written.
    #[cfg(test)]
    pub const CREATE: Binding = Binding {
        create_rev: 0,
        version: 1,
    };

    fn bytes(&self) -> [u8; BINDING] {
        let mut b = [0u8; BINDING];
        b[..8].copy_from_slice(&self.create_rev.to_be_bytes());
        b[8..].copy_from_slice(&self.version.to_be_bytes());
        b
    }

    fn from_bytes(b: &[u8]) -> Binding {
        Binding {
            create_rev: u64::from_be_bytes(b[..8].try_into().expect("8 bytes")),
            version: u64::from_be_bytes(b[8..BINDING].try_into().expect("8 bytes")),
        }
    }

    /// Whether a value sealed with this binding may be the one etcd holds at `held`
    /// (the key's create revision and version as etcd reports them).
    pub(crate) fn admits(&self, held: &Binding) -> bool {
        self.version == held.version
            && (self.create_rev == held.create_rev || (self.create_rev == 0 && held.version == 1))
    }
}

/// The envelope a stored value was in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// Bound to the store key only (the embedded engine's; on etcd, written before
    /// the binding existed).
    V1,
    /// Bound to the store key and a [`Binding`].
    V2,
}

/// The associated data of a v2 envelope.
fn ad_v2(key: &str, b: &Binding) -> Vec<u8> {
    let mut ad = Vec::with_capacity(AD_V2.len() + key.len() + 1 + BINDING);
    ad.extend_from_slice(AD_V2);
    ad.extend_from_slice(key.as_bytes());
    ad.push(0);
    ad.extend_from_slice(&b.bytes());
    ad
}

/// A stored value that could not be opened. Names the object's store key and the
/// key name, never the data.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum SealError {
    #[error("{key} is encrypted with key {name:?}, which the key file does not have")]
    UnknownKey { key: String, name: String },
    #[error(
        "{key} does not decrypt with key {name:?} (another key of that name, or a damaged value)"
    )]
    Decrypt { key: String, name: String },
    #[error("{key} holds a malformed encrypted value")]
    Malformed { key: String },
    #[error(
        "{key} holds a value sealed for version {sealed} of its etcd key, but etcd holds version {held}: an older value was put back under the key (not by bootplane); refused"
    )]
    Replayed { key: String, sealed: u64, held: u64 },
    #[error(
        "{key} is stored in clear, which bootplane never writes for this type on etcd: refused"
    )]
    Unsealed { key: String },
    #[error(
        "{key} holds a value sealed in a legacy envelope (v1, or bound to no create revision), which this cluster refuses since every value was re-sealed: an older value put back under the key (not by bootplane); refused"
    )]
    Legacy { key: String },
}

impl SealError {
    /// The key name the value names, when it could be read.
    pub fn key_name(&self) -> Option<&str> {
        match self {
            SealError::UnknownKey { name, .. } | SealError::Decrypt { name, .. } => Some(name),
            SealError::Malformed { .. }
            | SealError::Replayed { .. }
            | SealError::Unsealed { .. }
            | SealError::Legacy { .. } => None,
        }
    }
}

/// One named key.
struct Key {
    name: Arc<str>,
    aead: XChaCha20Poly1305,
}

/// The keys of one reading of the key file; the first seals.
struct Keyring {
    keys: Vec<Key>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyring")
            .field(
                "names",
                &self.keys.iter().map(|k| &*k.name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyFile {
    #[serde(default)]
    keys: Vec<KeyEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyEntry {
    name: String,
    secret: String,
}

fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && n != IDENTITY
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-._".contains(c))
}

/// One key's name and bytes, as a key file or the cluster's keyring holds it (the
/// keyring wraps these for each appliance). `Debug` shows the name only.
#[derive(Clone, PartialEq, Eq)]
pub struct RawKey {
    pub name: String,
    pub secret: [u8; 32],
}

impl std::fmt::Debug for RawKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RawKey({:?})", self.name)
    }
}

/// Check a list of keys: 1 to [`MAX_KEYS`], valid names, no name twice. Errors name
/// the key (by position or name), never its secret.
pub(crate) fn check_keys(keys: &[RawKey]) -> anyhow::Result<()> {
    if keys.is_empty() {
        bail!("it holds no [[keys]]");
    }
    if keys.len() > MAX_KEYS {
        bail!("it holds {} keys, more than {MAX_KEYS}", keys.len());
    }
    for (i, k) in keys.iter().enumerate() {
        if !valid_name(&k.name) {
            bail!(
                "key {} has name {:?}: names are 1-64 characters of [A-Za-z0-9-._], not {IDENTITY:?}",
                i + 1,
                k.name
            );
        }
        if keys[..i].iter().any(|o| o.name == k.name) {
            bail!("key name {:?} appears twice", k.name);
        }
    }
    Ok(())
}

/// Most keys a key file or the cluster's keyring may hold.
pub(crate) const MAX_RING_KEYS: usize = MAX_KEYS;

impl Keyring {
    /// The keyring of checked keys (the first seals).
    pub(crate) fn from_raw(raw: &[RawKey]) -> anyhow::Result<Keyring> {
        check_keys(raw)?;
        Ok(Keyring {
            keys: raw
                .iter()
                .map(|k| Key {
                    name: Arc::from(k.name.as_str()),
                    aead: XChaCha20Poly1305::new_from_slice(&k.secret).expect("32 bytes"),
                })
                .collect(),
        })
    }

    /// Parse a key file's text; errors name the key (by position or name), never
    /// its secret.
    fn parse(text: &str) -> anyhow::Result<Keyring> {
        Keyring::from_raw(&raw_keys(text)?)
    }
}

/// A key file's keys; errors name the key (by position or name), never its secret.
pub(crate) fn raw_keys(text: &str) -> anyhow::Result<Vec<RawKey>> {
    // toml's error quotes the offending line, which may hold a secret: not shown.
    let file: KeyFile = toml::from_str(text).map_err(|e| {
        let at = e.span().map(|s| text[..s.start].lines().count().max(1));
        anyhow::anyhow!(
            "not a key file (expected [[keys]] tables with name and secret){}",
            at.map(|l| format!(", near line {l}")).unwrap_or_default()
        )
    })?;
    if file.keys.is_empty() {
        bail!("it holds no [[keys]]");
    }
    if file.keys.len() > MAX_KEYS {
        bail!("it holds {} keys, more than {MAX_KEYS}", file.keys.len());
    }
    let mut keys = Vec::with_capacity(file.keys.len());
    for (i, e) in file.keys.iter().enumerate() {
        if !valid_name(&e.name) {
            bail!(
                    "key {} has name {:?}: names are 1-64 characters of [A-Za-z0-9-._], not {IDENTITY:?}",
                    i + 1,
                    e.name
                );
        }
        let secret: [u8; 32] = base64::engine::general_purpose::STANDARD
            .decode(e.secret.trim())
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| anyhow::anyhow!("key {:?}: secret is not 32 bytes in base64", e.name))?;
        keys.push(RawKey {
            name: e.name.clone(),
            secret,
        });
    }
    check_keys(&keys)?;
    Ok(keys)
}

impl Keyring {
    /// `plain` sealed with the first key: v1 (bound to `key`), or v2 when `binding`.
    fn seal(&self, key: &str, binding: Option<&Binding>, plain: &[u8]) -> Vec<u8> {
        use rand::RngCore as _;
        let k = &self.keys[0];
        let mut nonce = [0u8; NONCE];
        rand::rngs::OsRng.fill_bytes(&mut nonce);
        let ad = match binding {
            Some(b) => ad_v2(key, b),
            None => key.as_bytes().to_vec(),
        };
        let ct = k
            .aead
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: plain,
                    aad: &ad,
                },
            )
            .expect("xchacha20poly1305 encrypts any length a store value has");
        let mut out =
            Vec::with_capacity(MAGIC.len() + k.name.len() + 1 + BINDING + NONCE + ct.len());
        out.extend_from_slice(if binding.is_some() { MAGIC_V2 } else { MAGIC });
        out.extend_from_slice(k.name.as_bytes());
        out.push(b':');
        if let Some(b) = binding {
            out.extend_from_slice(&b.bytes());
        }
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&ct);
        out
    }

    /// Open an envelope's `body` (after its magic) of `format`. A v2 body's binding
    /// must admit `held` (what etcd holds, when known) before it is decrypted.
    fn open(
        &self,
        key: &str,
        format: Format,
        body: &[u8],
        held: Option<&Binding>,
    ) -> Result<(Vec<u8>, Arc<str>, bool), SealError> {
        let malformed = || SealError::Malformed { key: key.into() };
        let mut legacy = format == Format::V1;
        let colon = body.iter().position(|b| *b == b':').ok_or_else(malformed)?;
        let name = std::str::from_utf8(&body[..colon]).map_err(|_| malformed())?;
        let mut rest = &body[colon + 1..];
        let ad = match format {
            Format::V1 => key.as_bytes().to_vec(),
            Format::V2 => {
                if rest.len() < BINDING {
                    return Err(malformed());
                }
                let sealed = Binding::from_bytes(&rest[..BINDING]);
                legacy = sealed.create_rev == 0;
                rest = &rest[BINDING..];
                if let Some(held) = held.filter(|h| !sealed.admits(h)) {
                    return Err(SealError::Replayed {
                        key: key.into(),
                        sealed: sealed.version,
                        held: held.version,
                    });
                }
                ad_v2(key, &sealed)
            }
        };
        if rest.len() < NONCE + TAG || name.is_empty() || name.len() > 64 {
            return Err(malformed());
        }
        let k =
            self.keys
                .iter()
                .find(|k| &*k.name == name)
                .ok_or_else(|| SealError::UnknownKey {
                    key: key.into(),
                    name: name.into(),
                })?;
        let plain = k
            .aead
            .decrypt(
                XNonce::from_slice(&rest[..NONCE]),
                Payload {
                    msg: &rest[NONCE..],
                    aad: &ad,
                },
            )
            .map_err(|_| SealError::Decrypt {
                key: key.into(),
                name: name.into(),
            })?;
        Ok((plain, k.name.clone(), legacy))
    }
}

/// The name of the key a sealed stored value names in its envelope (in clear), `None`
/// for a value that is not sealed (or not readably).
#[cfg_attr(not(feature = "etcd"), allow(dead_code))] // the etcd engine's
pub(crate) fn sealed_key_name(stored: &[u8]) -> Option<&str> {
    let body = stored
        .strip_prefix(MAGIC)
        .or_else(|| stored.strip_prefix(MAGIC_V2))?;
    let colon = body.iter().take(65).position(|b| *b == b':')?;
    std::str::from_utf8(&body[..colon]).ok()
}

/// What a stored value opened to.
pub(crate) struct Opened<'a> {
    /// The plain text.
    pub text: std::borrow::Cow<'a, [u8]>,
    /// The key it was sealed with; `None`: it was stored in clear.
    pub key: Option<Arc<str>>,
    /// A legacy envelope (`v1`, or `v2` bound to create revision 0): see the module doc.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // the etcd engine's
    pub legacy: bool,
}

/// The keys from the key file, re-read on [`Sealer::reload`]. Cheap to clone; the
/// key file's path and the key names are all it shows.
#[derive(Clone)]
pub struct Sealer {
    inner: Arc<Inner>,
}

struct Inner {
    /// The key file; with the cluster's keyring, this appliance's identity file.
    path: PathBuf,
    /// The keys come from the cluster's keyring in etcd (`super::keyring`), swapped in
    /// by [`Sealer::replace`]; the key file is not read.
    cluster: bool,
    ring: RwLock<Arc<Keyring>>,
    /// The file's (mtime, size, inode) when it was last read.
    seen: Mutex<(i64, i64, u64, u64)>,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer")
            .field("path", &self.inner.path)
            .field("keys", &self.key_names())
            .finish()
    }
}

fn file_stamp(md: &std::fs::Metadata) -> (i64, i64, u64, u64) {
    (md.mtime(), md.mtime_nsec(), md.size(), md.ino())
}

/// Read the key file, refusing one that group or others may access.
fn read_key_file(path: &Path) -> anyhow::Result<(Keyring, (i64, i64, u64, u64))> {
    let (text, stamp) = read_key_text(path)?;
    let ring =
        Keyring::parse(&text).with_context(|| format!("encryption key file {}", path.display()))?;
    Ok((ring, stamp))
}

/// The keys of the key file at `path` (checked as [`Sealer::load`] does; not created).
pub fn read_raw_key_file(path: &Path) -> anyhow::Result<Vec<RawKey>> {
    let (text, _) = read_key_text(path)?;
    raw_keys(&text).with_context(|| format!("encryption key file {}", path.display()))
}

/// A private file's text (at most `max` bytes), refusing one that group or others
/// may access or that another uid owns; `what` names it in errors.
pub(crate) fn read_private(
    path: &Path,
    what: &str,
    max: u64,
) -> anyhow::Result<(String, (i64, i64, u64, u64))> {
    use std::io::Read as _;
    let f =
        std::fs::File::open(path).with_context(|| format!("opening {what} {}", path.display()))?;
    let md = f
        .metadata()
        .with_context(|| format!("reading {what} {}", path.display()))?;
    let mode = md.mode() & 0o7777;
    if mode & 0o077 != 0 {
        bail!(
            "{what} {} has mode {mode:04o}: group or others may read it; make it 0600 (chmod 600) and restart",
            path.display()
        );
    }
    if md.uid() != nix::unistd::geteuid().as_raw() {
        bail!(
            "{what} {} belongs to uid {}, not to the uid running bootplane",
            path.display(),
            md.uid()
        );
    }
    let mut text = String::new();
    f.take(max + 1)
        .read_to_string(&mut text)
        .with_context(|| format!("reading {what} {}", path.display()))?;
    if text.len() as u64 > max {
        bail!("{what} {} is over {max} bytes", path.display());
    }
    Ok((text, file_stamp(&md)))
}

/// The key file's text and stamp.
fn read_key_text(path: &Path) -> anyhow::Result<(String, (i64, i64, u64, u64))> {
    read_private(path, "encryption key file", MAX_FILE)
}

/// A new key file's text: one random 256-bit key named `key1`.
fn generated() -> String {
    use rand::RngCore as _;
    let mut raw = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut raw);
    format!(
        "# bootplane's keys for Secrets and BMCSecrets at rest (docs/configuration.md, [store]).\n\
         # The first key encrypts new writes; every key listed decrypts. To rotate, put a new\n\
         # key first (32 random bytes, base64: `head -c 32 /dev/urandom | base64`), then\n\
         # restart or send SIGHUP; remove the old key once bootplane logs that none is left.\n\
         [[keys]]\nname = \"key1\"\nsecret = \"{}\"\n",
        base64::engine::general_purpose::STANDARD.encode(raw)
    )
}

/// Create `path` 0600 with `text`, written and synced, unless it exists: whether this
/// call created it (`false`: another process did first). `what` names the file in errors.
pub(crate) fn create_private(path: &Path, text: &str, what: &str) -> anyhow::Result<bool> {
    use std::io::Write as _;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(mut f) => {
            f.write_all(text.as_bytes())
                .and_then(|()| f.sync_all())
                .with_context(|| format!("writing {what} {}", path.display()))?;
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e).with_context(|| format!("creating {what} {}", path.display())),
    }
}

impl Sealer {
    /// Read the key file at `path`, creating it (0600, one random key) when it does
    /// not exist. Refuses a file group or others may read, naming it.
    pub fn load(path: &Path) -> anyhow::Result<Sealer> {
        if std::fs::symlink_metadata(path).is_err()
            && create_private(path, &generated(), "encryption key file")?
        {
            tracing::info!(path = %path.display(), "created the encryption key file for secrets at rest");
        }
        let (ring, seen) = read_key_file(path)?;
        Ok(Sealer {
            inner: Arc::new(Inner {
                path: path.to_path_buf(),
                cluster: false,
                ring: RwLock::new(Arc::new(ring)),
                seen: Mutex::new(seen),
            }),
        })
    }

    /// The keys of the cluster's keyring (unwrapped with the identity at `identity`,
    /// which [`Sealer::path`] then names); [`Sealer::reload`] reads no file.
    pub fn from_keys(keys: &[RawKey], identity: &Path) -> anyhow::Result<Sealer> {
        Ok(Sealer {
            inner: Arc::new(Inner {
                path: identity.to_path_buf(),
                cluster: true,
                ring: RwLock::new(Arc::new(Keyring::from_raw(keys)?)),
                seen: Mutex::new((0, 0, 0, 0)),
            }),
        })
    }

    /// Swap in the keys of a newer keyring (a cluster-wide rotation).
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // the etcd keyring's
    pub(crate) fn replace(&self, keys: &[RawKey]) -> anyhow::Result<()> {
        let ring = Keyring::from_raw(keys)?;
        *self.inner.ring.write().unwrap() = Arc::new(ring);
        Ok(())
    }

    /// Whether the keys come from the cluster's keyring (not a key file).
    pub fn is_cluster(&self) -> bool {
        self.inner.cluster
    }

    /// The key file (the identity file with the cluster's keyring).
    pub(crate) fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The name of the key a sealed stored value names, when it is one this sealer
    /// does not hold (a value sealed after a rotation this appliance has not seen yet).
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // the etcd engine's
    pub(crate) fn unknown_key(&self, stored: &[u8]) -> Option<String> {
        let name = sealed_key_name(stored)?;
        let ring = self.ring();
        (!ring.keys.iter().any(|k| &*k.name == name)).then(|| name.to_string())
    }

    /// Read the key file again when it changed since it was last read (or when
    /// `force`): `Ok(true)` when it was read. A file that no longer reads (missing,
    /// malformed, readable by others) leaves the keys as they were.
    pub(crate) fn reload(&self, force: bool) -> anyhow::Result<bool> {
        if self.inner.cluster {
            return Ok(false);
        }
        let path = &self.inner.path;
        let md = std::fs::metadata(path)
            .with_context(|| format!("reading encryption key file {}", path.display()))?;
        if !force && *self.inner.seen.lock().unwrap() == file_stamp(&md) {
            return Ok(false);
        }
        let (ring, seen) = read_key_file(path)?;
        *self.inner.ring.write().unwrap() = Arc::new(ring);
        *self.inner.seen.lock().unwrap() = seen;
        Ok(true)
    }

    fn ring(&self) -> Arc<Keyring> {
        self.inner.ring.read().unwrap().clone()
    }

    /// The key new writes are sealed with.
    pub(crate) fn primary(&self) -> Arc<str> {
        self.ring().keys[0].name.clone()
    }

    /// Every key's name, the primary first.
    pub(crate) fn key_names(&self) -> Vec<Arc<str>> {
        self.ring().keys.iter().map(|k| k.name.clone()).collect()
    }

    /// `plain`, the value of store key `key`, sealed with the primary key (and the
    /// key's name): v1, or v2 bound to `binding` (the etcd key's create revision and
    /// version once this write commits).
    pub(crate) fn seal(
        &self,
        key: &str,
        binding: Option<&Binding>,
        plain: &[u8],
    ) -> (Vec<u8>, Arc<str>) {
        let ring = self.ring();
        (ring.seal(key, binding, plain), ring.keys[0].name.clone())
    }

    /// The stored value of store key `key`, opened: an envelope is decrypted, any
    /// other value (written before encryption existed) is taken as it is. `held`: the
    /// etcd key's create revision and version, which a v2 envelope's binding must
    /// admit (`None`: the embedded engine, which has no versions).
    pub(crate) fn open<'a>(
        &self,
        key: &str,
        stored: &'a [u8],
        held: Option<&Binding>,
    ) -> Result<Opened<'a>, SealError> {
        let (format, body) = match (stored.strip_prefix(MAGIC), stored.strip_prefix(MAGIC_V2)) {
            (Some(body), _) => (Format::V1, body),
            (None, Some(body)) => (Format::V2, body),
            (None, None) => {
                return Ok(Opened {
                    text: std::borrow::Cow::Borrowed(stored),
                    key: None,
                    legacy: false,
                })
            }
        };
        let (plain, name, legacy) = self.ring().open(key, format, body, held)?;
        Ok(Opened {
            text: std::borrow::Cow::Owned(plain),
            key: Some(name),
            legacy,
        })
    }
}

/// Which key each sealed object of one engine is stored under (`identity` for one
/// stored in clear), kept by the engine's one writer of its state (the redb writer
/// thread, the etcd mirror's task) after each change it makes visible.
#[derive(Default)]
pub struct Ledger {
    by_object: Mutex<HashMap<Arc<str>, Arc<str>>>,
}

impl Ledger {
    /// Object `key` is now stored under key `name` (`None`: in clear); [`Ledger::remove`]
    /// when deleted.
    pub(crate) fn note(&self, key: &Arc<str>, name: Option<Arc<str>>) {
        let name = name.unwrap_or_else(|| Arc::from(IDENTITY));
        self.by_object.lock().unwrap().insert(key.clone(), name);
    }

    pub(crate) fn remove(&self, key: &str) {
        self.by_object.lock().unwrap().remove(key);
    }

    /// Replace everything (an engine that listed again).
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // the etcd engine's
    pub(crate) fn reset(&self, all: HashMap<Arc<str>, Arc<str>>) {
        *self.by_object.lock().unwrap() = all;
    }

    /// How many objects are stored under each key name.
    pub fn counts(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for name in self.by_object.lock().unwrap().values() {
            *out.entry(name.to_string()).or_default() += 1;
        }
        out
    }

    /// Whether any object is in a legacy envelope (noted as `KEY@v1`).
    pub fn has_legacy(&self) -> bool {
        let by = self.by_object.lock().unwrap();
        by.values().any(|n| n.ends_with(LEGACY_SUFFIX))
    }

    /// Objects stored under any key but `primary`, at most `max`, in key order.
    pub(crate) fn stale(&self, primary: &str, max: usize) -> Vec<Arc<str>> {
        let mut v: Vec<Arc<str>> = self
            .by_object
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, n)| &***n != primary)
            .map(|(k, _)| k.clone())
            .collect();
        v.sort();
        v.truncate(max);
        v
    }
}

/// What an engine needs to seal and open values: the keys, and its ledger.
#[derive(Clone)]
pub struct Sealing {
    pub sealer: Sealer,
    pub ledger: Arc<Ledger>,
    /// etcd: the name of the key the cluster's marker is sealed with, once seen or
    /// written (`Some`: legacy values are refused; it stays when the marker is deleted).
    marker: Arc<Mutex<Option<Arc<str>>>>,
}

impl Sealing {
    pub(crate) fn new(sealer: Sealer) -> Sealing {
        Sealing {
            sealer,
            ledger: Arc::default(),
            marker: Arc::default(),
        }
    }

    /// Whether legacy values are refused (the marker was seen or written).
    pub fn strict(&self) -> bool {
        self.marker.lock().unwrap().is_some()
    }

    /// The key the marker is sealed with (`Some`: strict).
    pub fn marker(&self) -> Option<Arc<str>> {
        self.marker.lock().unwrap().clone()
    }

    #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // the etcd engine's
    pub(crate) fn set_marker(&self, name: Arc<str>) {
        *self.marker.lock().unwrap() = Some(name);
    }
}

#[cfg(test)]
mod tests;
