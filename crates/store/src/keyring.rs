//! The cluster's keyring: one set of data keys (the [`super::seal`] ring that seals
//! Secrets, BMCSecrets and APITokens) for every appliance on one etcd store, kept in
//! etcd wrapped **per appliance**, so that no key travels between appliances and a new
//! appliance is added only by an explicit operator step (`store join` there, `store
//! admit` on a member). This module is the cryptography and the formats; the etcd
//! side (where the records live, `keygen`, `join`, `admit`, `rotate`, following
//! rotations) is [`super::etcd::keyring`].
//!
//! - **Identity**: each appliance's X25519 key pair, the private half in
//!   `<state_dir>/store-identity.key` (0600; refused when group or others may read it,
//!   as the key file is). Its **fingerprint** (the first 16 bytes of the public key's
//!   SHA-256, hex in groups of 4) is what an operator compares between `join`'s output
//!   and `admit`'s argument.
//! - **Wrapping** (`{prefix}keyring/members/NAME`): the ring (its generation, the keys'
//!   names and bytes, the member's name) in libsodium's sealed box to NAME's public key
//!   (X25519 + XSalsa20-Poly1305; anyone may seal, only NAME opens), next to NAME's
//!   public key and an **endorsement**: an HMAC of the name and public key under a key
//!   derived from one of the ring's keys. Only a holder of the ring can endorse, so a
//!   rotation never wraps the new ring for a public key someone put into etcd around
//!   bootplane.
//! - **Continuity** (the pin, `<state_dir>/store-keyring.pin`: the generation and a
//!   SHA-256 commitment of each key, no key bytes): a ring replaces the one an
//!   appliance holds only when its generation is not older and it shares a key with
//!   it. Whoever can write etcd can seal a ring of their own to an appliance's public
//!   key (sealed boxes are anonymous), but cannot make one that shares a key they do
//!   not know: such a ring, or an older one put back, is refused. The first ring an
//!   appliance accepts after `join` has nothing to continue (trust on first use;
//!   docs/cluster.md says what that leaves).
//!
//! Every value read from etcd is bounded ([`MAX_RECORD`], [`MAX_REQUEST`]) and checked;
//! errors name members, keys and files, never key bytes.

use std::path::Path;

use anyhow::{bail, Context as _};
use base64::Engine as _;
use crypto_box::{PublicKey, SecretKey};
use hmac::{Hmac, Mac as _};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::seal::{check_keys, read_private, RawKey, MAX_RING_KEYS};

/// The identity file's name in the state directory.
pub const IDENTITY_FILE: &str = "store-identity.key";
/// The pin's name in the state directory.
pub const PIN_FILE: &str = "store-keyring.pin";
/// Largest member record (a wrapped ring) read from etcd: 32 keys take about 6 KiB.
pub const MAX_RECORD: usize = 16 << 10;
/// Largest join request read from etcd.
pub const MAX_REQUEST: usize = 1 << 10;
/// Largest identity or pin file read.
const MAX_FILE: u64 = 8 << 10;
/// The identity file's first word (its format).
const IDENTITY_MAGIC: &str = "bootplane-store-identity-v1";
/// What the HMAC key of an endorsement is derived with (from a ring key).
const ENDORSE_LABEL: &[u8] = b"bootplane keyring endorsement v1";
/// What a pin's commitment of a key hashes first.
const PIN_LABEL: &[u8] = b"bootplane keyring pin v1\0";
/// The records' format version.
const V: u32 = 1;

type HmacSha256 = Hmac<Sha256>;

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

/// What the keyring refuses, for the callers that tell them apart; names members and
/// fingerprints, never keys.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum KeyringError {
    #[error("{what} is malformed: {why}")]
    Malformed { what: String, why: String },
    #[error(
        "the keyring's wrapping for {member} is for the identity with fingerprint {wrapped_for}, not this appliance's ({mine}): run `bootplane store join` here and admit it again"
    )]
    OtherIdentity {
        member: String,
        wrapped_for: String,
        mine: String,
    },
    #[error(
        "the keyring's wrapping for {member} does not open with this appliance's identity (damaged, or not sealed by bootplane)"
    )]
    DoesNotOpen { member: String },
    #[error(
        "the join request of {member} has fingerprint {requested}, not {given}: compare with what `bootplane store join` printed on {member} (a request someone else wrote is refused); nothing was changed"
    )]
    FingerprintMismatch {
        member: String,
        requested: String,
        given: String,
    },
    #[error(
        "the keyring's record for {member} is not endorsed by a key of the cluster's keyring (written around bootplane, or by another cluster): refused"
    )]
    NotEndorsed { member: String },
    #[error(
        "the keyring for {member} is generation {got}, older than the generation {held} this appliance holds (an older wrapping put back): refused"
    )]
    Rollback { member: String, held: u64, got: u64 },
    #[error(
        "the keyring for {member} shares no key with the one this appliance holds (generation {held}; not sealed by a member of this cluster): refused"
    )]
    Unrelated { member: String, held: u64 },
}

/// The fingerprint of a public key: the first 16 bytes of its SHA-256, lowercase hex
/// in groups of 4 (`3f2a-91bc-...`).
pub fn fingerprint(pk: &PublicKey) -> String {
    let h = Sha256::digest(pk.as_bytes());
    let hex = hex_of(&h[..16]);
    hex.as_bytes()
        .chunks(4)
        .map(|c| std::str::from_utf8(c).expect("hex"))
        .collect::<Vec<_>>()
        .join("-")
}

/// A fingerprint as typed, compared without case, dashes, colons or spaces.
pub fn same_fingerprint(a: &str, b: &str) -> bool {
    let norm = |s: &str| {
        s.chars()
            .filter(|c| !"-: ".contains(*c))
            .map(|c| c.to_ascii_lowercase())
            .collect::<String>()
    };
    norm(a) == norm(b)
}

/// Whether `member`'s requested public key `pk` has the fingerprint `given` (what the
/// operator read on `member`).
pub fn check_fingerprint(member: &str, pk: &PublicKey, given: &str) -> Result<(), KeyringError> {
    let requested = fingerprint(pk);
    if same_fingerprint(&requested, given) {
        Ok(())
    } else {
        Err(KeyringError::FingerprintMismatch {
            member: member.into(),
            requested,
            given: given.into(),
        })
    }
}

fn hex_of(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// This appliance's identity in the keyring: its X25519 secret key. `Debug` shows the
/// fingerprint only.
pub struct Identity {
    secret: SecretKey,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Identity({})", self.fingerprint())
    }
}

impl Identity {
    /// Read the identity file, refusing one group or others may read.
    pub fn load(path: &Path) -> anyhow::Result<Identity> {
        let (text, _) = read_private(path, "store identity file", MAX_FILE)?;
        let line = text
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty() && !l.starts_with('#'))
            .unwrap_or("");
        let secret: [u8; 32] = line
            .strip_prefix(IDENTITY_MAGIC)
            .map(str::trim)
            .and_then(|s| b64().decode(s).ok())
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "store identity file {} is not one bootplane wrote (expected `{IDENTITY_MAGIC} <base64 of 32 bytes>`)",
                    path.display()
                )
            })?;
        Ok(Identity {
            secret: SecretKey::from_bytes(secret),
        })
    }

    /// Read the identity file, or create it (0600, a new key pair) when it does not
    /// exist; `true` when created.
    pub fn load_or_create(path: &Path) -> anyhow::Result<(Identity, bool)> {
        if std::fs::symlink_metadata(path).is_ok() {
            return Ok((Identity::load(path)?, false));
        }
        let secret = SecretKey::generate(&mut rand::rngs::OsRng);
        let text = format!(
            "# bootplane's identity in the store's keyring (docs/cluster.md): private to this\n\
             # appliance, never copied; a new one needs `bootplane store join` and `admit` again.\n\
             {IDENTITY_MAGIC} {}\n",
            b64().encode(secret.to_bytes())
        );
        match super::seal::create_private(path, &text, "store identity file")? {
            true => Ok((Identity { secret }, true)),
            false => Ok((Identity::load(path)?, false)),
        }
    }

    pub fn public(&self) -> PublicKey {
        self.secret.public_key()
    }

    pub fn fingerprint(&self) -> String {
        fingerprint(&self.public())
    }

    #[cfg(test)]
    fn random() -> Identity {
        Identity {
            secret: SecretKey::generate(&mut rand::rngs::OsRng),
        }
    }
}

/// The cluster's data keys at one generation (the first key seals). `Debug` shows the
/// names only ([`RawKey`]'s).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ring {
    pub generation: u64,
    pub keys: Vec<RawKey>,
}

impl Ring {
    /// The first ring of a cluster: `keys` (a key file's, adopted), else one random key.
    pub fn first(keys: Vec<RawKey>) -> anyhow::Result<Ring> {
        let keys = if keys.is_empty() {
            vec![random_key("key1")]
        } else {
            keys
        };
        check_keys(&keys).context("the keyring")?;
        Ok(Ring {
            generation: 1,
            keys,
        })
    }

    /// The next generation with a new random key first (named `keyN`, N past every
    /// number in use); the others stay and still open what they sealed.
    pub fn rotated(&self) -> anyhow::Result<Ring> {
        if self.keys.len() >= MAX_RING_KEYS {
            bail!(
                "the keyring holds {} keys, the most it may: drop the older ones first (`bootplane store rotate --drop-old` once none is in use)",
                self.keys.len()
            );
        }
        let used = |n: u64| self.keys.iter().any(|k| k.name == format!("key{n}"));
        let mut n = self.generation + 1;
        while used(n) {
            n += 1;
        }
        let mut keys = vec![random_key(&format!("key{n}"))];
        keys.extend(self.keys.iter().cloned());
        Ok(Ring {
            generation: self.generation + 1,
            keys,
        })
    }

    /// The next generation with the first key only.
    pub fn without_old(&self) -> Ring {
        Ring {
            generation: self.generation + 1,
            keys: self.keys[..1].to_vec(),
        }
    }

    pub fn primary(&self) -> &str {
        &self.keys[0].name
    }

    pub fn names(&self) -> Vec<String> {
        self.keys.iter().map(|k| k.name.clone()).collect()
    }

    fn key(&self, name: &str) -> Option<&RawKey> {
        self.keys.iter().find(|k| k.name == name)
    }
}

fn random_key(name: &str) -> RawKey {
    use rand::RngCore as _;
    let mut secret = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut secret);
    RawKey {
        name: name.into(),
        secret,
    }
}

/// The plain text inside a wrapping.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Payload {
    v: u32,
    member: String,
    generation: u64,
    keys: Vec<PayloadKey>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PayloadKey {
    name: String,
    secret: String,
}

/// A member's record in etcd (`{prefix}keyring/members/NAME`), as stored.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordText {
    v: u32,
    member: String,
    public_key: String,
    endorsed_by: String,
    endorsement: String,
    ring: String,
}

/// A member's record, parsed (not opened).
#[derive(Debug, Clone)]
pub struct Record {
    pub member: String,
    pub public_key: PublicKey,
    /// The ring key the endorsement is made with.
    pub endorsed_by: String,
    endorsement: Vec<u8>,
    sealed: Vec<u8>,
}

/// A join request (`{prefix}keyring/requests/NAME`), as stored.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RequestText {
    v: u32,
    member: String,
    public_key: String,
}

fn malformed(what: &str, why: impl std::fmt::Display) -> KeyringError {
    KeyringError::Malformed {
        what: what.into(),
        why: why.to_string(),
    }
}

fn public_key(what: &str, s: &str) -> Result<PublicKey, KeyringError> {
    let b: [u8; 32] = b64()
        .decode(s)
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| malformed(what, "public_key is not 32 bytes in base64"))?;
    Ok(PublicKey::from_bytes(b))
}

/// The endorsement of `member`'s `pk` by `key`.
fn endorsement(key: &RawKey, member: &str, pk: &PublicKey) -> Vec<u8> {
    let mut derive = HmacSha256::new_from_slice(&key.secret).expect("any key length");
    derive.update(ENDORSE_LABEL);
    let sub = derive.finalize().into_bytes();
    let mut mac = HmacSha256::new_from_slice(&sub).expect("any key length");
    mac.update(member.as_bytes());
    mac.update(&[0]);
    mac.update(pk.as_bytes());
    mac.finalize().into_bytes().to_vec()
}

/// `ring` wrapped for `member`, whose public key is `pk`: the record's stored bytes.
pub fn wrap(ring: &Ring, member: &str, pk: &PublicKey) -> Vec<u8> {
    let payload = Payload {
        v: V,
        member: member.into(),
        generation: ring.generation,
        keys: ring
            .keys
            .iter()
            .map(|k| PayloadKey {
                name: k.name.clone(),
                secret: b64().encode(k.secret),
            })
            .collect(),
    };
    let plain = serde_json::to_vec(&payload).expect("serializable");
    let sealed = pk
        .seal(&mut rand::rngs::OsRng, &plain)
        .expect("a sealed box takes any length");
    let by = &ring.keys[0];
    let rec = RecordText {
        v: V,
        member: member.into(),
        public_key: b64().encode(pk.as_bytes()),
        endorsed_by: by.name.clone(),
        endorsement: b64().encode(endorsement(by, member, pk)),
        ring: b64().encode(sealed),
    };
    serde_json::to_vec(&rec).expect("serializable")
}

/// Parse `member`'s record (bounded, checked; not opened).
pub fn parse_record(bytes: &[u8], member: &str) -> Result<Record, KeyringError> {
    let what = format!("the keyring's record for {member}");
    if bytes.len() > MAX_RECORD {
        return Err(malformed(
            &what,
            format!("{} bytes, more than {MAX_RECORD}", bytes.len()),
        ));
    }
    // serde_json's errors quote no input, only positions.
    let r: RecordText = serde_json::from_slice(bytes).map_err(|e| malformed(&what, e))?;
    if r.v != V {
        return Err(malformed(&what, format!("format version {}, not {V}", r.v)));
    }
    if r.member != member {
        return Err(malformed(&what, format!("it names member {:?}", r.member)));
    }
    let decode = |field: &str, s: &str| {
        b64()
            .decode(s)
            .map_err(|_| malformed(&what, format!("{field} is not base64")))
    };
    Ok(Record {
        member: r.member,
        public_key: public_key(&what, &r.public_key)?,
        endorsed_by: r.endorsed_by,
        endorsement: decode("endorsement", &r.endorsement)?,
        sealed: decode("ring", &r.ring)?,
    })
}

/// Whether `record`'s public key is endorsed by a key of `ring`.
pub fn check_endorsed(record: &Record, ring: &Ring) -> Result<(), KeyringError> {
    let ok = ring.key(&record.endorsed_by).is_some_and(|k| {
        let want = endorsement(k, &record.member, &record.public_key);
        subtle_eq(&want, &record.endorsement)
    });
    if ok {
        Ok(())
    } else {
        Err(KeyringError::NotEndorsed {
            member: record.member.clone(),
        })
    }
}

/// Constant-time equality of two MACs.
fn subtle_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Open `member`'s record with `identity`: the ring, whose own keys endorse the record.
pub fn unwrap(bytes: &[u8], member: &str, identity: &Identity) -> Result<Ring, KeyringError> {
    let rec = parse_record(bytes, member)?;
    let mine = identity.public();
    if rec.public_key != mine {
        return Err(KeyringError::OtherIdentity {
            member: member.into(),
            wrapped_for: fingerprint(&rec.public_key),
            mine: fingerprint(&mine),
        });
    }
    let plain = identity
        .secret
        .unseal(&rec.sealed)
        .map_err(|_| KeyringError::DoesNotOpen {
            member: member.into(),
        })?;
    let what = format!("the keyring wrapped for {member}");
    let p: Payload = serde_json::from_slice(&plain).map_err(|e| malformed(&what, e))?;
    if p.v != V || p.member != member {
        return Err(malformed(&what, "it is not for this member"));
    }
    if p.keys.len() > MAX_RING_KEYS {
        return Err(malformed(&what, format!("more than {MAX_RING_KEYS} keys")));
    }
    let mut keys = Vec::with_capacity(p.keys.len());
    for k in p.keys {
        let secret: [u8; 32] = b64()
            .decode(&k.secret)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| malformed(&what, format!("key {:?} is not 32 bytes", k.name)))?;
        keys.push(RawKey {
            name: k.name,
            secret,
        });
    }
    check_keys(&keys).map_err(|e| malformed(&what, format!("{e:#}")))?;
    let ring = Ring {
        generation: p.generation,
        keys,
    };
    check_endorsed(&rec, &ring)?;
    Ok(ring)
}

/// A join request's stored bytes.
pub fn request(member: &str, pk: &PublicKey) -> Vec<u8> {
    serde_json::to_vec(&RequestText {
        v: V,
        member: member.into(),
        public_key: b64().encode(pk.as_bytes()),
    })
    .expect("serializable")
}

/// The public key `member`'s join request holds (bounded, checked).
pub fn parse_request(bytes: &[u8], member: &str) -> Result<PublicKey, KeyringError> {
    let what = format!("the join request of {member}");
    if bytes.len() > MAX_REQUEST {
        return Err(malformed(
            &what,
            format!("{} bytes, more than {MAX_REQUEST}", bytes.len()),
        ));
    }
    let r: RequestText = serde_json::from_slice(bytes).map_err(|e| malformed(&what, e))?;
    if r.v != V || r.member != member {
        return Err(malformed(&what, format!("it names member {:?}", r.member)));
    }
    public_key(&what, &r.public_key)
}

/// What an appliance remembers of the last ring it accepted: its generation and a
/// commitment of each key (no key bytes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pin {
    pub generation: u64,
    pub keys: Vec<String>,
}

fn commitment(k: &RawKey) -> String {
    let mut h = Sha256::new();
    h.update(PIN_LABEL);
    h.update(k.name.as_bytes());
    h.update([0]);
    h.update(k.secret);
    hex_of(&h.finalize())
}

impl Pin {
    pub fn of(ring: &Ring) -> Pin {
        Pin {
            generation: ring.generation,
            keys: ring.keys.iter().map(commitment).collect(),
        }
    }

    /// Whether `ring` may replace the ring this pin is of (see the module doc).
    pub fn admits(&self, member: &str, ring: &Ring) -> Result<(), KeyringError> {
        if ring.generation < self.generation {
            return Err(KeyringError::Rollback {
                member: member.into(),
                held: self.generation,
                got: ring.generation,
            });
        }
        let next = Pin::of(ring);
        let shares = next.keys.iter().any(|c| self.keys.contains(c));
        if !shares || (ring.generation == self.generation && next != *self) {
            return Err(KeyringError::Unrelated {
                member: member.into(),
                held: self.generation,
            });
        }
        Ok(())
    }

    /// The pin file, `None` when absent.
    pub fn read(path: &Path) -> anyhow::Result<Option<Pin>> {
        if std::fs::symlink_metadata(path).is_err() {
            return Ok(None);
        }
        let (text, _) = read_private(path, "keyring pin file", MAX_FILE)?;
        let pin: Pin = serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("keyring pin file {}: {e}", path.display()))?;
        Ok(Some(pin))
    }

    /// Write the pin file (0600, replaced whole).
    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let tmp = path.with_extension("pin.tmp");
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .with_context(|| format!("writing keyring pin file {}", tmp.display()))?;
        f.write_all(&serde_json::to_vec(self).expect("serializable"))
            .and_then(|()| f.sync_all())
            .with_context(|| format!("writing keyring pin file {}", tmp.display()))?;
        std::fs::rename(&tmp, path)
            .with_context(|| format!("writing keyring pin file {}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring() -> Ring {
        Ring::first(vec![]).unwrap()
    }

    #[test]
    fn a_wrapping_opens_with_its_identity_only() {
        let (a, b) = (Identity::random(), Identity::random());
        let r = ring().rotated().unwrap();
        let w = wrap(&r, "a", &a.public());
        // No key byte in the stored record.
        let text = String::from_utf8(w.clone()).unwrap();
        for k in &r.keys {
            assert!(!text.contains(&b64().encode(k.secret)), "{text}");
        }
        assert_eq!(unwrap(&w, "a", &a).unwrap(), r);
        assert_eq!(r.primary(), "key2");
        // Another identity: named by fingerprint, not opened.
        let e = unwrap(&w, "a", &b).unwrap_err();
        assert!(
            matches!(e, KeyringError::OtherIdentity { ref wrapped_for, .. } if *wrapped_for == a.fingerprint()),
            "{e}"
        );
        // A record copied under another member's name.
        assert!(matches!(
            unwrap(&w, "b", &a).unwrap_err(),
            KeyringError::Malformed { .. }
        ));
        // The identity's public key swapped in the record: it still does not open.
        let mut forged: serde_json::Value = serde_json::from_slice(&w).unwrap();
        forged["public_key"] = b64().encode(b.public().as_bytes()).into();
        let e = unwrap(&serde_json::to_vec(&forged).unwrap(), "a", &b).unwrap_err();
        assert!(matches!(e, KeyringError::DoesNotOpen { .. }), "{e}");
    }

    #[test]
    fn a_tampered_or_forged_wrapping_is_refused_without_panics() {
        let a = Identity::random();
        let r = ring();
        let w = wrap(&r, "a", &a.public());
        let mut rec: serde_json::Value = serde_json::from_slice(&w).unwrap();
        // A flipped bit in the sealed ring.
        let mut sealed = b64().decode(rec["ring"].as_str().unwrap()).unwrap();
        let last = sealed.len() - 1;
        sealed[last] ^= 1;
        rec["ring"] = b64().encode(&sealed).into();
        let e = unwrap(&serde_json::to_vec(&rec).unwrap(), "a", &a).unwrap_err();
        assert!(matches!(e, KeyringError::DoesNotOpen { .. }), "{e}");
        // A record whose endorsement was not made by a key of the ring it holds.
        let mut other = wrap(&ring(), "a", &a.public());
        let mut o: serde_json::Value = serde_json::from_slice(&other).unwrap();
        o["endorsement"] = rec["endorsement"].clone();
        other = serde_json::to_vec(&o).unwrap();
        assert!(matches!(
            unwrap(&other, "a", &a).unwrap_err(),
            KeyringError::NotEndorsed { .. }
        ));
        // Garbage, oversized, wrong types: errors, never panics.
        for bad in [
            &b""[..],
            b"{",
            b"null",
            b"{\"v\":1}",
            b"{\"v\":2,\"member\":\"a\",\"public_key\":\"\",\"endorsed_by\":\"k\",\"endorsement\":\"\",\"ring\":\"\"}",
            b"{\"v\":1,\"member\":\"a\",\"public_key\":\"AAAA\",\"endorsed_by\":\"k\",\"endorsement\":\"\",\"ring\":\"\"}",
        ] {
            let e = unwrap(bad, "a", &a).unwrap_err();
            assert!(matches!(e, KeyringError::Malformed { .. }), "{e}");
        }
        let big = vec![b' '; MAX_RECORD + 1];
        assert!(unwrap(&big, "a", &a)
            .unwrap_err()
            .to_string()
            .contains("more than"));
        // A sealed payload that is not a ring.
        let mut junk = rec.clone();
        junk["ring"] = b64()
            .encode(a.public().seal(&mut rand::rngs::OsRng, b"[1,2]").unwrap())
            .into();
        assert!(matches!(
            unwrap(&serde_json::to_vec(&junk).unwrap(), "a", &a).unwrap_err(),
            KeyringError::Malformed { .. }
        ));
    }

    #[test]
    fn requests_and_fingerprints() {
        let a = Identity::random();
        let req = request("b", &a.public());
        assert_eq!(parse_request(&req, "b").unwrap(), a.public());
        assert!(parse_request(&req, "c").is_err());
        assert!(parse_request(&vec![b'x'; MAX_REQUEST + 1], "b").is_err());
        assert!(parse_request(b"{\"v\":1}", "b").is_err());
        let fp = a.fingerprint();
        assert_eq!(fp.len(), 39, "{fp}");
        assert!(same_fingerprint(&fp, &fp.to_uppercase().replace('-', ":")));
        assert!(!same_fingerprint(&fp, &Identity::random().fingerprint()));
        check_fingerprint("b", &a.public(), &fp.to_uppercase()).unwrap();
        let other = Identity::random().fingerprint();
        let e = check_fingerprint("b", &a.public(), &other).unwrap_err();
        assert_eq!(
            e,
            KeyringError::FingerprintMismatch {
                member: "b".into(),
                requested: fp.clone(),
                given: other.clone()
            }
        );
        assert!(e.to_string().contains("nothing was changed"), "{e}");
        assert!(!format!("{a:?}").contains(&b64().encode(a.secret.to_bytes())));
    }

    #[test]
    fn the_pin_admits_newer_rings_that_share_a_key_only() {
        let r1 = ring();
        let pin = Pin::of(&r1);
        pin.admits("a", &r1).unwrap();
        let r2 = r1.rotated().unwrap();
        pin.admits("a", &r2).unwrap();
        let r3 = r2.without_old();
        Pin::of(&r2).admits("a", &r3).unwrap();
        // An older ring put back.
        let e = Pin::of(&r2).admits("a", &r1).unwrap_err();
        assert!(
            matches!(
                e,
                KeyringError::Rollback {
                    held: 2,
                    got: 1,
                    ..
                }
            ),
            "{e}"
        );
        // A ring made by someone who does not know the keys, whatever its generation.
        let mut forged = ring();
        forged.generation = 9;
        assert!(matches!(
            pin.admits("a", &forged).unwrap_err(),
            KeyringError::Unrelated { .. }
        ));
        // Same generation, other keys.
        let mut same = r2.clone();
        same.keys.pop();
        assert!(Pin::of(&r2).admits("a", &same).is_err());
        // Round trip through the file, 0600.
        use std::os::unix::fs::PermissionsExt as _;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join(PIN_FILE);
        assert!(Pin::read(&p).unwrap().is_none());
        Pin::of(&r2).write(&p).unwrap();
        assert_eq!(Pin::read(&p).unwrap(), Some(Pin::of(&r2)));
        let mode = std::fs::metadata(&p).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn the_identity_file_is_private_and_stable() {
        use std::os::unix::fs::PermissionsExt as _;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join(IDENTITY_FILE);
        let (a, created) = Identity::load_or_create(&p).unwrap();
        assert!(created);
        let mode = std::fs::metadata(&p).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let (again, created) = Identity::load_or_create(&p).unwrap();
        assert!(!created);
        assert_eq!(again.public(), a.public());
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = format!("{:#}", Identity::load(&p).unwrap_err());
        assert!(e.contains(IDENTITY_FILE) && e.contains("0640"), "{e}");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&p, "something else\n").unwrap();
        let e = format!("{:#}", Identity::load(&p).unwrap_err());
        assert!(e.contains("not one bootplane wrote"), "{e}");
    }

    #[test]
    fn rotation_names_new_keys_apart_from_adopted_ones() {
        let adopted = vec![random_key("key2"), random_key("key1")];
        let r = Ring::first(adopted).unwrap();
        let r2 = r.rotated().unwrap();
        assert_eq!(r2.names(), ["key3", "key2", "key1"]);
        assert_eq!(r2.generation, 2);
        assert_eq!(r2.without_old().names(), ["key3"]);
    }
}
