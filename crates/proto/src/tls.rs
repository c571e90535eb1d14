//! TLS material for the API listener and its clients: the appliance's own CA and server
//! certificate, the client certificates it issues, their revocation, the rustls server
//! config the listener ([`crate::listen::router`]) runs the handshake with, and the
//! client config the CLI and the tests connect with. A base module: the API (which
//! sets it up from `[api]`, `bootplane::api::ApiConfig::tls_settings`) and the CLI
//! (`bootplane cert`, its connection) both build on it.
//!
//! - **Files** (`<state_dir>/tls/`, every file 0600): `ca.crt`/`ca.key`, the CA created
//!   on first start (ECDSA P-256, 10 years); `server.crt`/`server.key`, a server
//!   certificate it signs for localhost, 127.0.0.1, ::1, the hostname, the listen
//!   address (every interface address when it is unspecified) and `[api] tls_names`,
//!   issued again at start when those names changed or less than 30 days remain;
//!   `issued` (`serial name role notAfter` lines, by `bootplane cert issue`) and
//!   `revoked` (one serial per line, by `bootplane cert revoke`). With `[api]
//!   cert_file`/`key_file` the listener presents those instead (the CA is still made:
//!   it signs client certificates).
//! - **Reload**: a task polls the certificate, key and `revoked` files every
//!   [`RELOAD_EVERY`] (mtime, size, inode); a changed pair is loaded and presented from
//!   the next handshake on, through a [`ResolvesServerCert`] holding the current
//!   [`CertifiedKey`]. A pair that does not load (bad PEM, key not matching the
//!   certificate, e.g. while an operator has replaced only one of the two) is logged
//!   and the old one kept.
//! - **Protocols**: TLS 1.2 and 1.3 only, with rustls' default suites of the `ring`
//!   provider (AEAD only, forward secret); ALPN h2 and http/1.1.
//! - **Client certificates** are asked for but not required (bearer tokens still work):
//!   one chaining to the client CA (`[api] client_ca_file`, default `ca.crt`) and in its
//!   validity period is accepted, anything else ends the handshake. Its CN, O values and
//!   serial reach every request of the connection as the [`PeerCert`] extension.
//! - **Revocation** is a serial list checked after webpki accepted the chain
//!   ([`Revocable`]) rather than a CRL: a CRL must be signed by the CA's key, which the
//!   appliance does not have when the client CA is the operator's own
//!   (`client_ca_file`), and must be re-signed before its nextUpdate even when nothing
//!   changes; a serial list works for any CA and takes effect at the next handshake
//!   (connections already open keep going; they are closed by the idle timeout).

use std::collections::{BTreeSet, HashSet};
use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use rcgen::{
    BasicConstraints, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    SanType, SerialNumber,
};
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, ServerConfig, SignatureScheme};

use crate::shutdown::Shutdown;

/// What the listener's TLS is made from: `[api]`'s `tls`, `listen`, `tls_names`,
/// `cert_file`, `key_file` and `client_ca_file` (`bootplane::api::ApiConfig::tls_settings`).
#[derive(Debug, Clone)]
pub struct Settings {
    /// False: plain HTTP ([`setup`] gives `None`).
    pub enabled: bool,
    /// The listen address (its IP, or every interface's when unspecified, is a name of
    /// the generated server certificate).
    pub listen: SocketAddr,
    /// More names for the generated server certificate.
    pub names: Vec<String>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub client_ca_file: Option<PathBuf>,
}

/// The directory under the state dir that holds the TLS files.
pub(crate) const DIR: &str = "tls";
pub(crate) const CA_CRT: &str = "ca.crt";
pub(crate) const CA_KEY: &str = "ca.key";
pub(crate) const SERVER_CRT: &str = "server.crt";
pub(crate) const SERVER_KEY: &str = "server.key";
pub(crate) const ISSUED: &str = "issued";
pub(crate) const REVOKED: &str = "revoked";

/// How often the certificate, key and revocation files are checked for changes.
pub(crate) const RELOAD_EVERY: Duration = Duration::from_secs(2);
/// Validity of the generated CA.
const CA_DAYS: i64 = 3650;
/// Validity of a generated server certificate (the most browsers accept).
const SERVER_DAYS: i64 = 397;
/// A generated server certificate is issued again at start when it ends sooner.
const RENEW_DAYS: i64 = 30;
/// Largest certificate or key file read (a chain of a few certificates is ~10 KiB).
const MAX_PEM_BYTES: u64 = 1 << 20;
/// Largest `issued`/`revoked` file read.
const MAX_LIST_BYTES: u64 = 16 << 20;
const DAY: i64 = 86_400;

/// The verified client certificate of a connection, on each of its requests (an axum
/// request extension). CN → user, each O → a group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerCert {
    pub cn: String,
    pub orgs: Vec<String>,
    /// Lowercase hex, no leading zero bytes ([`normalize_serial`]).
    pub serial_hex: String,
}

impl PeerCert {
    /// The fields of a DER certificate; None when it does not parse.
    pub(crate) fn from_der(der: &[u8]) -> Option<PeerCert> {
        let (_, c) = x509_parser::parse_x509_certificate(der).ok()?;
        let subject = c.subject();
        let cn = subject
            .iter_common_name()
            .next()
            .and_then(|a| a.as_str().ok())
            .unwrap_or_default()
            .to_string();
        let orgs = subject
            .iter_organization()
            .filter_map(|a| a.as_str().ok().map(String::from))
            .collect();
        Some(PeerCert {
            cn,
            orgs,
            serial_hex: serial_hex(c.raw_serial()),
        })
    }
}

/// What a verified client certificate chain adds to each request of its connection
/// (the listener's hook): a [`PeerCert`] when the leaf parses.
pub fn peer_extensions(chain: &[CertificateDer<'static>]) -> http::Extensions {
    let mut e = http::Extensions::new();
    if let Some(p) = chain.first().and_then(|c| PeerCert::from_der(c)) {
        e.insert(p);
    }
    e
}

/// A serial as bootplane writes it: lowercase hex, no leading zero bytes.
fn serial_hex(raw: &[u8]) -> String {
    let start = raw.iter().position(|&b| b != 0).unwrap_or(raw.len());
    let s = hex::encode(&raw[start..]);
    if s.is_empty() {
        "00".into()
    } else {
        s
    }
}

/// A serial as an operator may type it (`0A:1B:...`, `0a1b...`, any case) in the form
/// of [`PeerCert::serial_hex`]; None when it is not hex.
pub fn normalize_serial(s: &str) -> Option<String> {
    let h: String = s.trim().chars().filter(|c| *c != ':').collect();
    if h.is_empty() || h.len() > 128 || !h.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let h = if h.len() % 2 == 1 { format!("0{h}") } else { h };
    Some(serial_hex(&hex::decode(h.to_ascii_lowercase()).ok()?))
}

/// `<state_dir>/tls`.
pub fn dir(state_dir: &Path) -> PathBuf {
    state_dir.join(DIR)
}

pub use crate::statedir::write_private;

/// Append `line` to the 0600 file `path` (created when absent).
fn append_private(path: &Path, line: &str) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    f.write_all(line.as_bytes())
        .and_then(|_| f.sync_all())
        .with_context(|| format!("writing {}", path.display()))
}

use crate::statedir::read_bounded;

/// `<state_dir>/tls`, created 0700 when absent.
fn ensure_dir(state_dir: &Path) -> Result<PathBuf> {
    let d = dir(state_dir);
    match std::fs::DirBuilder::new().mode(0o700).create(&d) {
        Ok(()) => Ok(d),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(d),
        Err(e) => Err(e).with_context(|| format!("creating {}", d.display())),
    }
}

fn unix_to_time(secs: i64) -> Result<time::OffsetDateTime> {
    time::OffsetDateTime::from_unix_timestamp(secs).context("certificate time out of range")
}

/// 16 random bytes, positive and without a leading zero byte, so its hex is the same
/// read back from the certificate.
fn new_serial() -> SerialNumber {
    use rand::RngCore as _;
    let mut b = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut b);
    b[0] = (b[0] & 0x7f).max(1);
    SerialNumber::from_slice(&b)
}

/// The appliance's CA: signs the server certificate and client certificates.
pub struct Ca {
    cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate issued by the [`Ca`] with its new key.
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
    pub serial_hex: String,
    /// Unix seconds.
    pub not_after: i64,
}

impl Ca {
    /// The CA in `<state_dir>/tls/` (for `bootplane cert issue`).
    pub fn load(state_dir: &Path) -> Result<Ca> {
        let d = dir(state_dir);
        let cert_pem = String::from_utf8(read_bounded(&d.join(CA_CRT), MAX_PEM_BYTES)?)
            .context("ca.crt is not text")?;
        let key_pem = String::from_utf8(read_bounded(&d.join(CA_KEY), MAX_PEM_BYTES)?)
            .context("ca.key is not text")?;
        let key = KeyPair::from_pem(&key_pem)
            .with_context(|| format!("reading {}", d.join(CA_KEY).display()))?;
        let issuer = Issuer::from_ca_cert_pem(&cert_pem, key)
            .with_context(|| format!("reading {}", d.join(CA_CRT).display()))?;
        Ok(Ca { cert_pem, issuer })
    }

    /// The CA in `<state_dir>/tls/`, created there first when absent.
    pub fn load_or_create(state_dir: &Path) -> Result<Ca> {
        let d = ensure_dir(state_dir)?;
        if d.join(CA_CRT).exists() || d.join(CA_KEY).exists() {
            return Ca::load(state_dir);
        }
        let key = KeyPair::generate().context("generating the CA key")?;
        let mut p = rcgen::CertificateParams::default();
        let host = hostname();
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name
            .push(DnType::CommonName, format!("bootplane CA {host}"));
        p.distinguished_name
            .push(DnType::OrganizationName, "bootplane");
        p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        p.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let now = unix_now();
        p.not_before = unix_to_time(now - DAY)?;
        p.not_after = unix_to_time(now + CA_DAYS * DAY)?;
        p.serial_number = Some(new_serial());
        let cert = p.self_signed(&key).context("signing the CA certificate")?;
        // The key first: a crt without its key would be read as a broken CA.
        write_private(&d.join(CA_KEY), key.serialize_pem().as_bytes())?;
        write_private(&d.join(CA_CRT), cert.pem().as_bytes())?;
        tracing::info!(path = %d.join(CA_CRT).display(), "created the API's CA");
        let issuer = Issuer::new(p, key);
        Ok(Ca {
            cert_pem: cert.pem(),
            issuer,
        })
    }

    /// The CA certificate (PEM).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A client certificate: CN `name`, O `role`, valid from `not_before` to `not_after`
    /// (Unix seconds; a period in the past makes an expired certificate).
    pub fn issue_client(
        &self,
        name: &str,
        role: &str,
        not_before: i64,
        not_after: i64,
    ) -> Result<Issued> {
        let mut p = rcgen::CertificateParams::default();
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(DnType::CommonName, name);
        p.distinguished_name.push(DnType::OrganizationName, role);
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(p, not_before, not_after)
    }

    /// A server certificate for `names` (DNS names and IP addresses) with CN `cn`,
    /// valid for `days` from now (e.g. one an operator then gives as `[api] cert_file`).
    pub fn issue_server_for(&self, names: &[&str], cn: &str, days: i64) -> Result<Issued> {
        let names = names.iter().map(|n| n.to_string()).collect();
        self.issue_server(&names, cn, days)
    }

    /// A server certificate for `names` (DNS names and IP addresses) valid from now.
    fn issue_server(&self, names: &BTreeSet<String>, cn: &str, days: i64) -> Result<Issued> {
        let mut p = rcgen::CertificateParams::default();
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(DnType::CommonName, cn);
        p.distinguished_name
            .push(DnType::OrganizationName, "bootplane");
        p.subject_alt_names = names
            .iter()
            .map(|n| match n.parse::<IpAddr>() {
                Ok(ip) => Ok(SanType::IpAddress(ip)),
                Err(_) => Ok(SanType::DnsName(n.as_str().try_into().with_context(
                    || format!("{n:?} is not a DNS name for a certificate"),
                )?)),
            })
            .collect::<Result<_>>()?;
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let now = unix_now();
        self.sign(p, now - DAY, now + days * DAY)
    }

    fn sign(
        &self,
        mut p: rcgen::CertificateParams,
        not_before: i64,
        not_after: i64,
    ) -> Result<Issued> {
        let key = KeyPair::generate().context("generating a key")?;
        p.not_before = unix_to_time(not_before)?;
        p.not_after = unix_to_time(not_after)?;
        let serial = new_serial();
        let serial_hex = serial_hex(&serial.to_bytes());
        p.serial_number = Some(serial);
        p.use_authority_key_identifier_extension = true;
        let cert = p
            .signed_by(&key, &self.issuer)
            .context("signing a certificate")?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            serial_hex,
            not_after,
        })
    }
}

fn unix_now() -> i64 {
    crate::sys::unix_now() as i64
}

fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// The names and addresses the generated server certificate is for.
pub(crate) fn server_names(cfg: &Settings) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = ["localhost", "127.0.0.1", "::1"]
        .into_iter()
        .map(String::from)
        .collect();
    let host = hostname();
    if host
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
    {
        names.insert(host.to_ascii_lowercase());
    }
    let ip = cfg.listen.ip();
    if ip.is_unspecified() {
        // Every address of this host's interfaces: any of them reaches the listener.
        if let Ok(addrs) = nix::ifaddrs::getifaddrs() {
            for a in addrs {
                let Some(sa) = a.address else { continue };
                let ip = if let Some(v4) = sa.as_sockaddr_in() {
                    IpAddr::V4(v4.ip())
                } else if let Some(v6) = sa.as_sockaddr_in6() {
                    IpAddr::V6(v6.ip())
                } else {
                    continue;
                };
                // Link-local v6 needs a scope id a certificate cannot carry.
                if matches!(ip, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80) {
                    continue;
                }
                names.insert(ip.to_string());
            }
        }
    } else {
        names.insert(ip.to_string());
    }
    names.extend(cfg.names.iter().map(|n| n.to_ascii_lowercase()));
    names
}

/// The DNS names and IP addresses in a certificate's SAN extension, and its notAfter.
fn cert_names(der: &[u8]) -> Option<(BTreeSet<String>, i64)> {
    use x509_parser::extensions::GeneralName;
    let (_, c) = x509_parser::parse_x509_certificate(der).ok()?;
    let mut out = BTreeSet::new();
    if let Ok(Some(san)) = c.subject_alternative_name() {
        for n in &san.value.general_names {
            match n {
                GeneralName::DNSName(d) => {
                    out.insert(d.to_ascii_lowercase());
                }
                GeneralName::IPAddress(b) => {
                    let ip = match b.len() {
                        4 => IpAddr::from(<[u8; 4]>::try_from(*b).ok()?),
                        16 => IpAddr::from(<[u8; 16]>::try_from(*b).ok()?),
                        _ => continue,
                    };
                    out.insert(ip.to_string());
                }
                _ => {}
            }
        }
    }
    Some((out, c.validity().not_after.timestamp()))
}

/// The certificate chain and key in two PEM files as rustls presents them; the key
/// must be the certificate's.
pub(crate) fn load_certified_key(cert: &Path, key: &Path) -> Result<CertifiedKey> {
    let cert_pem = read_bounded(cert, MAX_PEM_BYTES)?;
    let key_pem = read_bounded(key, MAX_PEM_BYTES)?;
    certified_key(
        &cert_pem,
        &key_pem,
        &cert.display().to_string(),
        &key.display().to_string(),
    )
}

/// [`load_certified_key`] on PEM text; `cert_name`/`key_name` name them in errors.
pub(crate) fn certified_key(
    cert_pem: &[u8],
    key_pem: &[u8],
    cert_name: &str,
    key_name: &str,
) -> Result<CertifiedKey> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("{cert_name}: {e}"))?;
    if chain.is_empty() {
        bail!("{cert_name}: no certificate in it");
    }
    // The key's own parse error could quote it: say only which file failed.
    let der = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|_| anyhow::anyhow!("{key_name}: no PEM private key in it"))?;
    let signer = rustls::crypto::ring::default_provider()
        .key_provider
        .load_private_key(der)
        .map_err(|e| anyhow::anyhow!("{key_name}: unusable private key: {e}"))?;
    let ck = CertifiedKey::new(chain, signer);
    match ck.keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => Ok(ck),
        Err(e) => bail!("{cert_name} and {key_name} do not belong together: {e}"),
    }
}

/// Presents the current certificate; the reload task swaps it.
#[derive(Debug)]
struct Resolver(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.read().unwrap_or_else(|e| e.into_inner()).clone())
    }
}

/// The webpki client verifier with a revocation list checked after it accepted.
#[derive(Debug)]
pub(crate) struct Revocable {
    inner: Arc<dyn ClientCertVerifier>,
    revoked: RwLock<Arc<HashSet<String>>>,
}

impl ClientCertVerifier for Revocable {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let ok = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        let serial = PeerCert::from_der(end_entity)
            .ok_or(rustls::Error::InvalidCertificate(
                rustls::CertificateError::BadEncoding,
            ))?
            .serial_hex;
        let revoked = self.revoked.read().unwrap_or_else(|e| e.into_inner());
        if revoked.contains(&serial) {
            tracing::info!(serial = %serial, "refused a revoked client certificate");
            return Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::Revoked,
            ));
        }
        Ok(ok)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// An `issued` line: a client certificate `bootplane cert issue` made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedCert {
    pub serial_hex: String,
    pub name: String,
    pub role: String,
    /// Unix seconds.
    pub not_after: i64,
}

/// Record a client certificate in `<state_dir>/tls/issued`.
pub fn record_issued(state_dir: &Path, c: &IssuedCert) -> Result<()> {
    let d = ensure_dir(state_dir)?;
    append_private(
        &d.join(ISSUED),
        &format!("{} {} {} {}\n", c.serial_hex, c.name, c.role, c.not_after),
    )
}

/// Complete lines of a list file (a line still being appended is skipped); an absent
/// file is empty.
fn list_lines(path: &Path) -> Result<Vec<String>> {
    let b = match read_bounded(path, MAX_LIST_BYTES) {
        Ok(b) => b,
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::NotFound) =>
        {
            return Ok(Vec::new())
        }
        Err(e) => return Err(e),
    };
    let text = String::from_utf8_lossy(&b);
    let complete = text.rfind('\n').map_or("", |i| &text[..i]);
    Ok(complete
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect())
}

/// The client certificates `bootplane cert issue` recorded (malformed lines skipped).
pub fn read_issued(state_dir: &Path) -> Result<Vec<IssuedCert>> {
    Ok(list_lines(&dir(state_dir).join(ISSUED))?
        .into_iter()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let [serial, name, role, not_after] = f[..] else {
                return None;
            };
            Some(IssuedCert {
                serial_hex: normalize_serial(serial)?,
                name: name.into(),
                role: role.into(),
                not_after: not_after.parse().ok()?,
            })
        })
        .collect())
}

/// The revoked serials in `path` (normalized; malformed lines skipped).
pub(crate) fn read_revoked_file(path: &Path) -> Result<HashSet<String>> {
    Ok(list_lines(path)?
        .iter()
        .filter_map(|l| normalize_serial(l.split_whitespace().next()?))
        .collect())
}

/// The revoked serials of `<state_dir>/tls/revoked`.
pub fn read_revoked(state_dir: &Path) -> Result<HashSet<String>> {
    read_revoked_file(&dir(state_dir).join(REVOKED))
}

/// Revoke `what`: a serial, or the name of issued certificates (all of that name).
/// Returns the serials newly revoked (empty when all were already).
pub fn revoke(state_dir: &Path, what: &str) -> Result<Vec<String>> {
    let issued = read_issued(state_dir)?;
    let by_name: Vec<String> = issued
        .iter()
        .filter(|c| c.name == what)
        .map(|c| c.serial_hex.clone())
        .collect();
    let serials = if !by_name.is_empty() {
        by_name
    } else if let Some(s) = normalize_serial(what) {
        vec![s]
    } else {
        bail!("{what:?} is neither the name of an issued certificate nor a serial number");
    };
    let already = read_revoked(state_dir)?;
    let new: Vec<String> = serials
        .into_iter()
        .filter(|s| !already.contains(s))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    if !new.is_empty() {
        let d = ensure_dir(state_dir)?;
        let mut text = String::new();
        for s in &new {
            text.push_str(s);
            text.push('\n');
        }
        append_private(&d.join(REVOKED), &text)?;
    }
    Ok(new)
}

/// Where the listener's certificate, key and revocation list come from.
#[derive(Debug, Clone)]
struct Sources {
    cert: PathBuf,
    key: PathBuf,
    revoked: PathBuf,
}

/// The listener's TLS: the rustls config and the reload task's state.
pub struct Tls {
    pub config: Arc<ServerConfig>,
    sources: Sources,
    resolver: Arc<Resolver>,
    verifier: Arc<Revocable>,
}

/// Prepare the API listener's TLS from `[api]` (blocking file I/O: call before the
/// listener starts, off the runtime): the CA, the generated server certificate when no
/// `cert_file` is given, the client verifier. None when `tls = false`.
pub fn setup(cfg: &Settings, state_dir: &Path) -> Result<Option<Tls>> {
    if !cfg.enabled {
        return Ok(None);
    }
    let ca = Ca::load_or_create(state_dir)?;
    let d = dir(state_dir);
    let (cert, key) = match (&cfg.cert_file, &cfg.key_file) {
        (Some(c), Some(k)) => (c.clone(), k.clone()),
        _ => {
            let (cert, key) = (d.join(SERVER_CRT), d.join(SERVER_KEY));
            ensure_server_cert(&ca, cfg, &cert, &key)?;
            (cert, key)
        }
    };
    let ck = load_certified_key(&cert, &key)?;
    let client_ca = cfg.client_ca_file.clone().unwrap_or_else(|| d.join(CA_CRT));
    let mut roots = rustls::RootCertStore::empty();
    let pem = read_bounded(&client_ca, MAX_PEM_BYTES)?;
    for c in CertificateDer::pem_slice_iter(&pem) {
        let c = c.map_err(|e| anyhow::anyhow!("{}: {e}", client_ca.display()))?;
        roots
            .add(c)
            .with_context(|| format!("{}: not a usable CA certificate", client_ca.display()))?;
    }
    if roots.is_empty() {
        bail!("{}: no CA certificate in it", client_ca.display());
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let webpki = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()
        .context("building the client certificate verifier")?;
    let revoked = d.join(REVOKED);
    let verifier = Arc::new(Revocable {
        inner: webpki,
        revoked: RwLock::new(Arc::new(read_revoked_file(&revoked)?)),
    });
    let resolver = Arc::new(Resolver(RwLock::new(Arc::new(ck))));
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .context("tls protocol versions")?
        .with_client_cert_verifier(verifier.clone())
        .with_cert_resolver(resolver.clone());
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Some(Tls {
        config: Arc::new(config),
        sources: Sources { cert, key, revoked },
        resolver,
        verifier,
    }))
}

/// The generated server certificate: issued when absent, when its names are not
/// `server_names(cfg)` or when it ends within [`RENEW_DAYS`].
fn ensure_server_cert(ca: &Ca, cfg: &Settings, cert: &Path, key: &Path) -> Result<()> {
    let want = server_names(cfg);
    let current = std::fs::read(cert).ok().and_then(|pem| {
        let der = CertificateDer::pem_slice_iter(&pem).next()?.ok()?;
        cert_names(&der)
    });
    let why = match current {
        None => "none yet",
        Some((names, _)) if names != want => "its names changed",
        Some((_, end)) if end < unix_now() + RENEW_DAYS * DAY => "it expires soon",
        Some(_) if !key.exists() => "its key is missing",
        Some(_) => return Ok(()),
    };
    let issued = ca.issue_server(&want, &format!("bootplane {}", hostname()), SERVER_DAYS)?;
    write_private(key, issued.key_pem.as_bytes())?;
    write_private(cert, issued.cert_pem.as_bytes())?;
    tracing::info!(
        reason = why,
        names = ?want,
        serial = %issued.serial_hex,
        "issued the API's server certificate"
    );
    Ok(())
}

/// What identifies a file's content for the reload poll.
type Stamp = Option<(i64, i64, u64, u64)>;

async fn stamp(p: &Path) -> Stamp {
    let m = tokio::fs::metadata(p).await.ok()?;
    Some((m.mtime(), m.mtime_nsec(), m.size(), m.ino()))
}

impl Tls {
    /// Reload the certificate pair and the revocation list when their files change,
    /// and both at once each time `reload` changes (SIGHUP), until shutdown.
    pub async fn watch(
        self,
        mut shutdown: Shutdown,
        mut reload: tokio::sync::watch::Receiver<u64>,
    ) {
        let s = self.sources.clone();
        let mut pair = (stamp(&s.cert).await, stamp(&s.key).await);
        let mut revoked = stamp(&s.revoked).await;
        loop {
            let forced = tokio::select! {
                _ = shutdown.recv() => return,
                _ = tokio::time::sleep(RELOAD_EVERY) => false,
                Ok(()) = reload.changed() => true,
            };
            let now = (stamp(&s.cert).await, stamp(&s.key).await);
            if forced || now != pair {
                pair = now;
                let (c, k) = (s.cert.clone(), s.key.clone());
                match tokio::task::spawn_blocking(move || load_certified_key(&c, &k)).await {
                    Ok(Ok(ck)) => {
                        let serial = ck
                            .end_entity_cert()
                            .ok()
                            .and_then(|c| PeerCert::from_der(c))
                            .map(|p| p.serial_hex)
                            .unwrap_or_default();
                        *self.resolver.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(ck);
                        tracing::info!(cert = %s.cert.display(), serial = %serial, "reloaded the API's server certificate");
                    }
                    Ok(Err(e)) => tracing::warn!(
                        error = format!("{e:#}"),
                        "new API server certificate not loaded; still presenting the previous one"
                    ),
                    Err(e) => tracing::warn!(error = %e, "reloading the API's certificate"),
                }
            }
            let now = stamp(&s.revoked).await;
            if forced || now != revoked {
                revoked = now;
                let p = s.revoked.clone();
                match tokio::task::spawn_blocking(move || read_revoked_file(&p)).await {
                    Ok(Ok(set)) => {
                        let n = set.len();
                        *self
                            .verifier
                            .revoked
                            .write()
                            .unwrap_or_else(|e| e.into_inner()) = Arc::new(set);
                        tracing::info!(revoked = n, "reloaded the revoked client certificates");
                    }
                    Ok(Err(e)) => tracing::warn!(
                        error = format!("{e:#}"),
                        "revoked client certificates not reloaded; keeping the previous list"
                    ),
                    Err(e) => tracing::warn!(error = %e, "reloading the revoked list"),
                }
            }
        }
    }
}

/// The rustls client config that trusts only `ca_pem` (PEM bundle), presenting
/// `client` (certificate and key PEM files) when given: the CLI's and the tests'.
pub fn client_config(
    ca_pem: &[u8],
    client: Option<(&Path, &Path)>,
) -> Result<rustls::ClientConfig> {
    match client {
        None => client_config_pem(ca_pem, None),
        Some((cert, key)) => {
            let (c, k) = (
                read_bounded(cert, MAX_PEM_BYTES)?,
                read_bounded(key, MAX_PEM_BYTES)?,
            );
            let names = (cert.display().to_string(), key.display().to_string());
            client_config_pem(ca_pem, Some((&c, &k, &names.0, &names.1)))
        }
    }
}

/// [`client_config`] with the client certificate and key as PEM text (and the names
/// errors give them: a file, or a context's embedded data).
pub fn client_config_pem(
    ca_pem: &[u8],
    client: Option<(&[u8], &[u8], &str, &str)>,
) -> Result<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem) {
        roots
            .add(c.map_err(|e| anyhow::anyhow!("CA bundle: {e}"))?)
            .context("CA bundle: not a usable CA certificate")?;
    }
    if roots.is_empty() {
        bail!("CA bundle: no certificate in it");
    }
    let b = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
    .context("tls protocol versions")?
    .with_root_certificates(roots);
    Ok(match client {
        None => b.with_no_client_auth(),
        Some((cert, key, cert_name, key_name)) => {
            // Checked as the server checks its own pair: the key must be the certificate's.
            let ck = certified_key(cert, key, cert_name, key_name)?;
            let der = PrivateKeyDer::from_pem_slice(key)
                .map_err(|_| anyhow::anyhow!("{key_name}: no PEM private key in it"))?;
            b.with_client_auth_cert(ck.cert.clone(), der)
                .context("client certificate")?
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serials_normalize() {
        assert_eq!(normalize_serial("0A:1b").as_deref(), Some("0a1b"));
        assert_eq!(normalize_serial("00:0A:1b").as_deref(), Some("0a1b"));
        assert_eq!(normalize_serial("a1b").as_deref(), Some("0a1b"));
        assert_eq!(normalize_serial("xyz"), None);
        assert_eq!(normalize_serial(""), None);
    }

    #[test]
    fn ca_issues_client_certs_with_their_fields_and_revocation_by_name() {
        let t = tempfile::tempdir().unwrap();
        let ca = Ca::load_or_create(t.path()).unwrap();
        let again = Ca::load_or_create(t.path()).unwrap();
        assert_eq!(ca.cert_pem(), again.cert_pem(), "the CA is made once");
        let now = unix_now();
        let i = ca.issue_client("alice", "viewer", now, now + DAY).unwrap();
        let der = CertificateDer::from_pem_slice(i.cert_pem.as_bytes()).unwrap();
        let p = PeerCert::from_der(&der).unwrap();
        assert_eq!(p.cn, "alice");
        assert_eq!(p.orgs, vec!["viewer".to_string()]);
        assert_eq!(p.serial_hex, i.serial_hex);
        for f in [CA_CRT, CA_KEY] {
            let m = std::fs::metadata(dir(t.path()).join(f)).unwrap();
            assert_eq!(
                std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777,
                0o600
            );
        }
        record_issued(
            t.path(),
            &IssuedCert {
                serial_hex: i.serial_hex.clone(),
                name: "alice".into(),
                role: "viewer".into(),
                not_after: i.not_after,
            },
        )
        .unwrap();
        assert_eq!(
            revoke(t.path(), "alice").unwrap(),
            vec![i.serial_hex.clone()]
        );
        assert!(revoke(t.path(), "alice").unwrap().is_empty(), "once");
        assert!(read_revoked(t.path()).unwrap().contains(&i.serial_hex));
        assert!(revoke(t.path(), "bob").is_err(), "no such name, not hex");
    }

    #[test]
    fn server_cert_is_reissued_when_names_change() {
        let t = tempfile::tempdir().unwrap();
        let ca = Ca::load_or_create(t.path()).unwrap();
        let (c, k) = (t.path().join("s.crt"), t.path().join("s.key"));
        let mut cfg = Settings {
            enabled: true,
            listen: "127.0.0.1:9090".parse().unwrap(),
            names: Vec::new(),
            cert_file: None,
            key_file: None,
            client_ca_file: None,
        };
        ensure_server_cert(&ca, &cfg, &c, &k).unwrap();
        let first = std::fs::read(&c).unwrap();
        ensure_server_cert(&ca, &cfg, &c, &k).unwrap();
        assert_eq!(first, std::fs::read(&c).unwrap(), "kept");
        cfg.names = vec!["boot.example.com".into()];
        ensure_server_cert(&ca, &cfg, &c, &k).unwrap();
        let der = CertificateDer::pem_slice_iter(&std::fs::read(&c).unwrap())
            .next()
            .unwrap()
            .unwrap();
        let (names, _) = cert_names(&der).unwrap();
        assert!(
            names.contains("boot.example.com") && names.contains("127.0.0.1"),
            "{names:?}"
        );
        load_certified_key(&c, &k).unwrap();
        // A key that is not the certificate's is refused.
        let other = ca.issue_client("x", "y", 0, unix_now() + DAY).unwrap();
        std::fs::write(&k, other.key_pem).unwrap();
        assert!(load_certified_key(&c, &k).is_err());
    }
}
