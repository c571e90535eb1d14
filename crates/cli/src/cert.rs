//! `bootplane cert issue|revoke|list`: client certificates for the API, made on the
//! appliance with the CA in `<state_dir>/tls/` ([`crate::tls`]). `issue` writes a
//! client bundle (certificate, key, CA) and records the certificate in `tls/issued`;
//! `revoke` appends serials to `tls/revoked`, which the listener re-reads within a few
//! seconds and refuses at the handshake from then on.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};
use clap::{Args, Subcommand};

use crate::tls;

#[derive(Subcommand)]
pub enum CertCmd {
    /// Issue a client certificate (CN NAME, O ROLE) and write NAME.crt, NAME.key and
    /// ca.crt into --out.
    Issue(IssueArgs),
    /// Revoke a client certificate by serial, or every one issued to NAME.
    Revoke(RevokeArgs),
    /// List the issued client certificates and whether they are revoked.
    List(StateDir),
}

/// The appliance's state dir (it holds the CA).
#[derive(Args)]
pub struct StateDir {
    /// The appliance's state dir (its CA, certificates and revocation list).
    #[arg(
        long = "state-dir",
        env = "BOOTPLANE_STATE_DIR",
        default_value = "./var/bootplane"
    )]
    pub state_dir: PathBuf,
}

#[derive(Args)]
pub struct IssueArgs {
    /// The user (the certificate's CN).
    pub name: String,
    /// The role (the certificate's O), e.g. admin, operator, viewer, agent.
    #[arg(long)]
    pub role: String,
    /// Days of validity.
    #[arg(long, default_value_t = 365)]
    pub days: u32,
    /// Directory to write the bundle into (created 0700 when absent).
    #[arg(long, default_value = ".")]
    pub out: PathBuf,
    #[command(flatten)]
    pub dir: StateDir,
}

#[derive(Args)]
pub struct RevokeArgs {
    /// A serial number (hex, colons allowed) or the NAME certificates were issued to.
    pub what: String,
    #[command(flatten)]
    pub dir: StateDir,
}

pub fn run(c: CertCmd) -> Result<u8> {
    match c {
        CertCmd::Issue(a) => issue(a),
        CertCmd::Revoke(a) => {
            let new = tls::revoke(&a.dir.state_dir, &a.what)?;
            if new.is_empty() {
                println!("{} already revoked", a.what);
            }
            for s in new {
                println!("revoked {s} (refused at the API's next handshakes, within seconds)");
            }
            Ok(0)
        }
        CertCmd::List(d) => list(&d.state_dir),
    }
}

/// What a user, role or file name may be: it goes into the CN/O, a file name and a
/// space-separated line.
fn check_word(what: &str, s: &str) -> Result<()> {
    if s.is_empty()
        || s.len() > 64
        || s.starts_with(['.', '-'])
        || !s
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '@'))
    {
        bail!("{what} {s:?} must be 1-64 letters, digits, '.', '-', '_' or '@', not starting with '.' or '-'");
    }
    Ok(())
}

fn issue(a: IssueArgs) -> Result<u8> {
    check_word("name", &a.name)?;
    check_word("role", &a.role)?;
    if !(1..=3650).contains(&a.days) {
        bail!("--days must be between 1 and 3650");
    }
    let ca = tls::Ca::load(&a.dir.state_dir).with_context(|| {
        format!(
            "loading the appliance's CA from {} (run on the appliance, or pass its --state-dir)",
            tls::dir(&a.dir.state_dir).display()
        )
    })?;
    let (crt, key, ca_out) = (
        a.out.join(format!("{}.crt", a.name)),
        a.out.join(format!("{}.key", a.name)),
        a.out.join("ca.crt"),
    );
    for p in [&crt, &key] {
        if p.exists() {
            bail!("{} exists; remove it or choose another --out", p.display());
        }
    }
    {
        use std::os::unix::fs::DirBuilderExt as _;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&a.out)
            .with_context(|| format!("creating {}", a.out.display()))?;
    }
    let now = crate::sys::unix_now() as i64;
    let issued = ca.issue_client(&a.name, &a.role, now - 300, now + a.days as i64 * 86_400)?;
    tls::write_private(&key, issued.key_pem.as_bytes())?;
    tls::write_private(&crt, issued.cert_pem.as_bytes())?;
    tls::write_private(&ca_out, ca.cert_pem().as_bytes())?;
    tls::record_issued(
        &a.dir.state_dir,
        &tls::IssuedCert {
            serial_hex: issued.serial_hex.clone(),
            name: a.name.clone(),
            role: a.role.clone(),
            not_after: issued.not_after,
        },
    )?;
    let (c, k, ca) = (crt.display(), key.display(), ca_out.display());
    println!(
        "issued client certificate {} (role {}, serial {}, valid until {})",
        a.name,
        a.role,
        issued.serial_hex,
        date(issued.not_after)
    );
    println!("wrote {c}, {k} (private) and {ca}");
    println!("use it with:");
    println!("  bootplane get servers --server https://APPLIANCE:9090 --ca-file {ca} --cert-file {c} --key-file {k}");
    println!("  curl --cacert {ca} --cert {c} --key {k} https://APPLIANCE:9090/apis/metal.ironcore.dev/v1alpha1/servers");
    println!(
        "revoke it with: bootplane cert revoke {}",
        issued.serial_hex
    );
    Ok(0)
}

fn date(unix: i64) -> String {
    chrono::DateTime::from_timestamp(unix, 0)
        .map(|d| d.format("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(|| unix.to_string())
}

fn list(state_dir: &Path) -> Result<u8> {
    let issued = tls::read_issued(state_dir)?;
    let revoked = tls::read_revoked(state_dir)?;
    let now = crate::sys::unix_now() as i64;
    let rows: Vec<Vec<String>> = issued
        .iter()
        .map(|c| {
            let state = if revoked.contains(&c.serial_hex) {
                "revoked"
            } else if c.not_after < now {
                "expired"
            } else {
                "valid"
            };
            vec![
                c.name.clone(),
                c.role.clone(),
                c.serial_hex.clone(),
                date(c.not_after),
                state.into(),
            ]
        })
        .collect();
    let head = ["NAME", "ROLE", "SERIAL", "NOT AFTER", "STATE"].map(String::from);
    let table: Vec<Vec<String>> = std::iter::once(head.to_vec()).chain(rows).collect();
    print!("{}", super::table::format_rows(&table));
    Ok(0)
}
