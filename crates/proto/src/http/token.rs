//! Signed, expiring per-boot tokens (HMAC-SHA256) minted into a machine's script, so a
//! machine whose source address is not registered (NAT, relay, a lease not yet known)
//! can still fetch its own Ignition, and nobody else can.
//!
//! Format: `<expiry unix seconds>.<base64url(HMAC(key, "bootplane-v2|purpose|server|boot|expiry"))>`.
//! The MAC binds the server name, the purpose and the boot the token was minted for
//! ([`crate::http::MachineBoot::boot_id`]: the ServerBootConfiguration's UID and
//! generation and the Server's boot generation), so a token for one machine or one route
//! is worthless for another, and a token dies with the boot it was minted for: once the
//! claim is deleted, the configuration changed or the machine power-cycled by bootplane,
//! the index holds another boot id and the old token no longer verifies. Verification is constant time
//! (the expected tag's text against the given, by `subtle`).

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use std::net::IpAddr;

use hmac::{Hmac, Mac};
use subtle::ConstantTimeEq as _;

use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// The prefix of a token bound to an address ([`TokenSigner::mint_for`]).
const BOUND: &str = "a";

/// What a token grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    Script,
    Ignition,
    /// The per-machine boot ISO (`/ipxe/boot.iso`), for a BMC's virtual media or HTTP boot.
    BootIso,
    /// The iPXE EFI binary behind a machine's UEFI HTTP boot URI (`/ipxe/boot.efi`).
    BootEfi,
    /// The discovery agent's inventory post (`/discovery/inventory/<server>/<token>`).
    Inventory,
    /// The cleanup agent's wipe report (`/discovery/wipe/<server>/<token>`).
    Wipe,
    /// The install agent's report (`/discovery/install/<server>/<token>`).
    Install,
}

impl Purpose {
    fn tag(self) -> &'static str {
        match self {
            Purpose::Script => "script",
            Purpose::Ignition => "ignition",
            Purpose::BootIso => "boot-iso",
            Purpose::BootEfi => "boot-efi",
            Purpose::Inventory => "inventory",
            Purpose::Wipe => "wipe",
            Purpose::Install => "install",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TokenError {
    #[error("malformed token")]
    Malformed,
    #[error("token expired")]
    Expired,
    #[error("bad token signature")]
    BadSignature,
}

/// Holds the key, as an HMAC already keyed (its inner and outer pads hashed once, not on
/// every token: two of the SHA-256 blocks a check would cost); cheap to share.
#[derive(Clone)]
pub struct TokenSigner {
    keyed: HmacSha256,
}

impl TokenSigner {
    /// `key` should be at least 32 random bytes.
    pub fn new(key: &[u8]) -> TokenSigner {
        TokenSigner {
            keyed: HmacSha256::new_from_slice(key).expect("hmac accepts any key length"),
        }
    }

    /// A signer with a fresh random key (tokens die with the process).
    pub fn random() -> TokenSigner {
        use rand::RngCore;
        let mut key = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut key);
        TokenSigner::new(&key)
    }

    fn mac(
        &self,
        purpose: Purpose,
        (server, boot): (&str, &str),
        addr: Option<IpAddr>,
        expiry: u64,
    ) -> HmacSha256 {
        // Every request to the script route checks a token: the MAC's input is gathered
        // on the stack (numbers and the address formatted there, no allocation) and
        // handed to the MAC in one piece, not a dozen small updates.
        let mut input = MacInput::new(self.keyed.clone());
        input.push(b"bootplane-v2|");
        input.push(purpose.tag().as_bytes());
        // Length-prefixed: no choice of server and boot id can collide with another.
        input.field(b"|", server.as_bytes());
        input.field(b"|", boot.as_bytes());
        if let Some(a) = addr {
            match a.to_canonical() {
                // Dotted quad by hand: core::fmt costs more than the rest of the check.
                IpAddr::V4(v4) => {
                    let [a, b, c, d] = v4.octets();
                    let len = [a, b, c, d]
                        .iter()
                        .map(|&o| 1 + usize::from(o >= 10) + usize::from(o >= 100))
                        .sum::<usize>()
                        + 3;
                    input.push(b"|addr|");
                    input.decimal(len as u64);
                    input.push(b":");
                    input.decimal(a.into());
                    for o in [b, c, d] {
                        input.push(b".");
                        input.decimal(o.into());
                    }
                }
                v6 => {
                    use std::io::Write as _;
                    let mut buf = [0u8; 64];
                    let mut w = &mut buf[..];
                    // An IPv6 address in text is at most 45 bytes: always fits.
                    let _ = write!(w, "{v6}");
                    let n = 64 - w.len();
                    input.field(b"|addr|", &buf[..n]);
                }
            }
        }
        input.push(b"|");
        input.decimal(expiry);
        input.finish()
    }

    /// Mint a token for `server`'s boot `boot` (its [`crate::http::MachineBoot::boot_id`]),
    /// valid until `now + ttl_secs` (unix seconds).
    pub fn mint(
        &self,
        purpose: Purpose,
        server: &str,
        boot: &str,
        now: u64,
        ttl_secs: u64,
    ) -> String {
        self.mint_for(purpose, (server, boot), None, now, ttl_secs)
    }

    /// [`TokenSigner::mint`], bound to source address `addr` when given: the token then
    /// verifies only through [`TokenSigner::verify_from`] from that address.
    pub fn mint_for(
        &self,
        purpose: Purpose,
        (server, boot): (&str, &str),
        addr: Option<IpAddr>,
        now: u64,
        ttl_secs: u64,
    ) -> String {
        let expiry = now.saturating_add(ttl_secs);
        let tag = (self.mac(purpose, (server, boot), addr, expiry))
            .finalize()
            .into_bytes();
        let bound = if addr.is_some() { BOUND } else { "" };
        format!("{bound}{expiry}.{}", URL_SAFE_NO_PAD.encode(tag))
    }

    /// Check a token for `server`, its current boot `boot` and `purpose` at time `now`
    /// (unix seconds). A token minted for another boot of the same server fails as a bad
    /// signature.
    pub(crate) fn verify(
        &self,
        token: &str,
        purpose: Purpose,
        server: &str,
        boot: &str,
        now: u64,
    ) -> Result<(), TokenError> {
        self.check(token, purpose, (server, boot), None, now)
    }

    /// [`TokenSigner::verify`] for a request from `client`: a token bound to an address
    /// ([`TokenSigner::mint_for`]) verifies only from that address, an unbound one from
    /// any.
    pub(crate) fn verify_from(
        &self,
        token: &str,
        purpose: Purpose,
        (server, boot): (&str, &str),
        client: IpAddr,
        now: u64,
    ) -> Result<(), TokenError> {
        match token.strip_prefix(BOUND) {
            Some(t) => self.check(t, purpose, (server, boot), Some(client), now),
            None => self.check(token, purpose, (server, boot), None, now),
        }
    }

    fn check(
        &self,
        token: &str,
        purpose: Purpose,
        fields: (&str, &str),
        addr: Option<IpAddr>,
        now: u64,
    ) -> Result<(), TokenError> {
        let (exp, sig) = token.split_once('.').ok_or(TokenError::Malformed)?;
        if exp.is_empty() || exp.len() > 20 || !exp.bytes().all(|b| b.is_ascii_digit()) {
            return Err(TokenError::Malformed);
        }
        let expiry: u64 = exp.parse().map_err(|_| TokenError::Malformed)?;
        // A SHA-256 tag is 32 bytes: 43 characters, nothing else is a token.
        let sig: &[u8; TAG_CHARS] = sig
            .as_bytes()
            .try_into()
            .map_err(|_| TokenError::Malformed)?;
        // Check the signature first so an attacker learns nothing from the expiry path.
        // The expected tag is encoded and compared as text, in constant time (eight bytes
        // at a time; encoding 32 bytes costs less than decoding 43 characters, and only
        // the canonical encoding of the right tag matches).
        let expected = self
            .mac(purpose, fields, addr, expiry)
            .finalize()
            .into_bytes();
        let mut encoded = [0u8; 48];
        encoded[..TAG_CHARS].copy_from_slice(&encode_tag(&expected.into()));
        let mut given = [0u8; 48];
        given[..TAG_CHARS].copy_from_slice(sig);
        if !bool::from(words(&given).ct_eq(&words(&encoded))) {
            return Err(TokenError::BadSignature);
        }
        if now > expiry {
            return Err(TokenError::Expired);
        }
        Ok(())
    }
}

/// The length of a token's tag: 32 bytes in unpadded base64url.
const TAG_CHARS: usize = 43;

/// A 32-byte tag in unpadded base64url, as `URL_SAFE_NO_PAD` writes it (by hand: the
/// general engine costs more than the comparison it feeds, on every script request).
fn encode_tag(tag: &[u8; 32]) -> [u8; TAG_CHARS] {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = [0u8; TAG_CHARS];
    let sextet = |n: u32, shift: u32| ALPHABET[((n >> shift) & 63) as usize];
    // Ten groups of three bytes make forty characters; the last two bytes make three.
    for (group, chars) in tag.chunks_exact(3).zip(out.chunks_exact_mut(4)) {
        let n = u32::from(group[0]) << 16 | u32::from(group[1]) << 8 | u32::from(group[2]);
        chars.copy_from_slice(&[sextet(n, 18), sextet(n, 12), sextet(n, 6), sextet(n, 0)]);
    }
    let n = u32::from(tag[30]) << 16 | u32::from(tag[31]) << 8;
    out[40..].copy_from_slice(&[sextet(n, 18), sextet(n, 12), sextet(n, 6)]);
    out
}

/// 48 bytes as six words, for a constant-time comparison a word at a time.
fn words(b: &[u8; 48]) -> [u64; 6] {
    std::array::from_fn(|i| u64::from_ne_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes")))
}

/// A MAC's input gathered in a stack buffer and handed over when full or finished.
struct MacInput {
    mac: HmacSha256,
    buf: [u8; 256],
    len: usize,
}

impl MacInput {
    fn new(mac: HmacSha256) -> MacInput {
        MacInput {
            mac,
            buf: [0; 256],
            len: 0,
        }
    }

    #[inline(always)]
    fn push(&mut self, bytes: &[u8]) {
        match self.buf.get_mut(self.len..self.len + bytes.len()) {
            Some(room) => {
                room.copy_from_slice(bytes);
                self.len += bytes.len();
            }
            None => self.spill(bytes),
        }
    }

    #[cold]
    fn spill(&mut self, bytes: &[u8]) {
        self.mac.update(&self.buf[..self.len]);
        self.len = 0;
        if bytes.len() > self.buf.len() {
            self.mac.update(bytes);
        } else {
            self.push(bytes);
        }
    }

    /// `n` in decimal, written in place.
    #[inline(always)]
    fn decimal(&mut self, mut n: u64) {
        let mut digits = 1;
        let mut rest = n / 10;
        while rest > 0 {
            digits += 1;
            rest /= 10;
        }
        if self.len + digits > self.buf.len() {
            self.spill(&[]);
        }
        for i in (0..digits).rev() {
            self.buf[self.len + i] = b'0' + (n % 10) as u8;
            n /= 10;
        }
        self.len += digits;
    }

    /// `name`, the length of `value` in decimal, `:` and `value`.
    fn field(&mut self, name: &[u8], value: &[u8]) {
        self.push(name);
        self.decimal(value.len() as u64);
        self.push(b":");
        self.push(value);
    }

    fn finish(mut self) -> HmacSha256 {
        self.mac.update(&self.buf[..self.len]);
        self.mac
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The MAC's input, pinned (computed apart with Python's hmac): tokens minted by an
    /// appliance of another version verify here.
    #[test]
    fn known_answers() {
        let s = TokenSigner::new(b"0123456789abcdef0123456789abcdef");
        assert_eq!(
            s.mint(Purpose::Ignition, "server-a", "uid-1/1", 1000, 60),
            "1060.qCq1mByUvdnnj5y3CGaTOI6BJnFIFWZBo0XYDebd4_o"
        );
        let at = "10.0.0.5".parse().ok();
        assert_eq!(
            s.mint_for(Purpose::Script, ("server-a", "u/1"), at, 1000, 60),
            "a1060.dD4DWEPwkemjtOHpp9Ta0VJhOYIJiOtQxRG75B2toco"
        );
        // A tag of another length is malformed or a bad signature, never a panic.
        let t = "1060.qCq1mByUvdnnj5y3CGaTOI6BJnFIFWZBo0XYDebd4_o";
        for bad in [
            format!("{t}AAAA"),
            format!("{t}A"),
            t[..t.len() - 2].to_string(),
        ] {
            assert!(
                s.verify(&bad, Purpose::Ignition, "server-a", "uid-1/1", 1000)
                    .is_err(),
                "{bad}"
            );
        }
        assert_eq!(
            s.verify(
                &format!("{t}AAAA"),
                Purpose::Ignition,
                "server-a",
                "uid-1/1",
                1000
            ),
            Err(TokenError::Malformed)
        );
    }

    /// The hand-written tag encoding is the base64 crate's, for any tag.
    #[test]
    fn tags_encode_as_the_base64_crate_does() {
        use rand::RngCore as _;
        let mut rng = rand::thread_rng();
        for i in 0..2000 {
            let mut tag = [0u8; 32];
            match i {
                0 => {}
                1 => tag = [0xff; 32],
                _ => rng.fill_bytes(&mut tag),
            }
            assert_eq!(
                encode_tag(&tag).as_slice(),
                URL_SAFE_NO_PAD.encode(tag).as_bytes(),
                "{tag:?}"
            );
        }
    }

    /// The stack-gathered input (split when a name outgrows the buffer, the dotted quad
    /// written by hand) is the same MAC as the plain concatenation, for every length and
    /// both address families.
    #[test]
    fn gathered_input_is_the_plain_input() {
        let s = TokenSigner::new(b"0123456789abcdef0123456789abcdef");
        let addrs: [Option<IpAddr>; 5] = [
            None,
            "0.0.0.0".parse().ok(),
            "255.10.0.199".parse().ok(),
            "fd00::1:2".parse().ok(),
            "::ffff:10.1.2.3".parse().ok(),
        ];
        for len in [0, 1, 63, 200, 231, 232, 255, 256, 257, 600] {
            let server = "s".repeat(len);
            for addr in addrs {
                let mut plain = format!("bootplane-v2|script|{}:{server}|3:b/1", server.len());
                if let Some(a) = addr {
                    let text = a.to_canonical().to_string();
                    plain.push_str(&format!("|addr|{}:{text}", text.len()));
                }
                plain.push_str("|1060");
                let mut want = s.keyed.clone();
                want.update(plain.as_bytes());
                let got = s.mac(Purpose::Script, (&server, "b/1"), addr, 1060);
                assert_eq!(
                    got.finalize().into_bytes(),
                    want.finalize().into_bytes(),
                    "{len} {addr:?}"
                );
            }
        }
    }

    #[test]
    fn roundtrip_and_binding() {
        let s = TokenSigner::new(b"0123456789abcdef0123456789abcdef");
        let t = s.mint(Purpose::Ignition, "server-a", "uid-1/1", 1000, 60);
        assert!(t.starts_with("1060."));
        assert_eq!(
            s.verify(&t, Purpose::Ignition, "server-a", "uid-1/1", 1059),
            Ok(())
        );
        assert_eq!(
            s.verify(&t, Purpose::Ignition, "server-a", "uid-1/1", 1061),
            Err(TokenError::Expired)
        );
        assert_eq!(
            s.verify(&t, Purpose::Ignition, "server-b", "uid-1/1", 1000),
            Err(TokenError::BadSignature)
        );
        assert_eq!(
            s.verify(&t, Purpose::Script, "server-a", "uid-1/1", 1000),
            Err(TokenError::BadSignature)
        );
        // Another boot of the same server (a new claim, a changed configuration, none).
        for boot in ["uid-2/1", "uid-1/2", ""] {
            assert_eq!(
                s.verify(&t, Purpose::Ignition, "server-a", boot, 1000),
                Err(TokenError::BadSignature),
                "{boot}"
            );
        }
        // Fields are length-prefixed: moving bytes between them changes the MAC.
        let a = s.mint(Purpose::Ignition, "ab", "c", 1000, 60);
        assert_eq!(
            s.verify(&a, Purpose::Ignition, "a", "bc", 1000),
            Err(TokenError::BadSignature)
        );
        let other = TokenSigner::new(b"another key another key another!");
        assert_eq!(
            other.verify(&t, Purpose::Ignition, "server-a", "uid-1/1", 1000),
            Err(TokenError::BadSignature)
        );
        // Extending the expiry invalidates the signature.
        let forged = t.replacen("1060", "9999", 1);
        assert_eq!(
            s.verify(&forged, Purpose::Ignition, "server-a", "uid-1/1", 1000),
            Err(TokenError::BadSignature)
        );
        // Bound to an address: only from that address, and only through verify_from.
        let at = |a: &str| a.parse::<IpAddr>().unwrap();
        let b = s.mint_for(
            Purpose::Script,
            ("server-a", "u/1"),
            Some(at("10.0.0.5")),
            1000,
            60,
        );
        assert!(b.starts_with("a1060."), "{b}");
        let from =
            |t: &str, a: &str| s.verify_from(t, Purpose::Script, ("server-a", "u/1"), at(a), 1000);
        assert_eq!(from(&b, "10.0.0.5"), Ok(()));
        assert_eq!(
            from(&b, "::ffff:10.0.0.5"),
            Ok(()),
            "an IPv4-mapped source is the same"
        );
        assert_eq!(from(&b, "10.0.0.6"), Err(TokenError::BadSignature));
        assert_eq!(
            from(&b.replacen('a', "", 1), "10.0.0.5"),
            Err(TokenError::BadSignature)
        );
        assert_eq!(
            s.verify(&b, Purpose::Script, "server-a", "u/1", 1000),
            Err(TokenError::Malformed)
        );
        // An unbound token verifies from any address.
        let u = s.mint(Purpose::Script, "server-a", "u/1", 1000, 60);
        assert_eq!(from(&u, "192.0.2.1"), Ok(()));
        for bad in [
            "",
            ".",
            "abc",
            "12.!!",
            "x1.abc",
            "99999999999999999999999.aa",
        ] {
            assert!(
                s.verify(bad, Purpose::Ignition, "server-a", "", 0).is_err(),
                "{bad}"
            );
        }
    }
}
