//! `bootplane render ignition`: print the Ignition JSON a Butane file, an Ignition
//! file, or a template + machine facts + ignition secret translate to; with `--server
//! NAME`, what that machine is served, asked from the running server's API (the store
//! is locked by `serve`). `bootplane render ipxe --server NAME` likewise prints the
//! machine's iPXE script. All file reads happen here; the library it calls is pure.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};

use crate::ignition::{FilesDir, IgnitionSecret, MachineFacts, Renderer, Template};

#[derive(Subcommand)]
pub enum RenderCmd {
    /// Print the Ignition JSON for a Butane file, an Ignition file, a template + facts +
    /// secret, or what server NAME is served (`--server`, through the API).
    Ignition(IgnitionArgs),
    /// Print the iPXE script server NAME is served (through the API).
    Ipxe(IpxeArgs),
}

/// How to reach the running server's API (`--server` names the machine here, so the
/// API URL is `--api`).
#[derive(Args, Clone)]
pub struct ApiConn {
    /// API URL of the running bootplane (default: the client config's current context,
    /// else `https://127.0.0.1:9090`).
    #[arg(long, env = "BOOTPLANE_API_URL")]
    pub api: Option<String>,
    /// Bearer token (default: the state dir's api-token).
    #[arg(long, env = "BOOTPLANE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// State dir to read the token from.
    #[arg(
        long = "state-dir",
        env = "BOOTPLANE_STATE_DIR",
        default_value = "./var/bootplane"
    )]
    pub state_dir: PathBuf,
    /// CA certificate(s) the API's certificate must chain to (default: the state dir's
    /// tls/ca.crt).
    #[arg(long = "ca-file", env = "BOOTPLANE_CA_FILE")]
    pub ca_file: Option<PathBuf>,
    /// Client certificate to present, with --key-file.
    #[arg(long = "cert-file", env = "BOOTPLANE_CERT_FILE")]
    pub cert_file: Option<PathBuf>,
    /// Private key of --cert-file.
    #[arg(long = "key-file", env = "BOOTPLANE_KEY_FILE")]
    pub key_file: Option<PathBuf>,
}

impl ApiConn {
    /// The same options as the other commands' [`super::Conn`].
    pub(crate) fn conn(&self) -> super::Conn {
        super::Conn {
            server: self.api.clone(),
            token: self.token.clone(),
            state_dir: self.state_dir.clone(),
            ca_file: self.ca_file.clone(),
            cert_file: self.cert_file.clone(),
            key_file: self.key_file.clone(),
            context: None,
            client_config: None,
        }
    }
}

#[derive(Args)]
pub struct IpxeArgs {
    /// The Server whose script to print.
    #[arg(long)]
    pub server: String,
    #[command(flatten)]
    pub conn: ApiConn,
}

#[derive(Args)]
pub struct IgnitionArgs {
    /// Butane (YAML) file to translate (`-` = stdin).
    #[arg(long, conflicts_with_all = ["ignition", "template", "server"])]
    pub butane: Option<PathBuf>,
    /// Ignition JSON file to validate and print.
    #[arg(long, conflicts_with_all = ["template", "server"])]
    pub ignition: Option<PathBuf>,
    /// Template file (Butane `.bu`/`.yaml` or Ignition `.ign`/`.json`) to render.
    #[arg(long, conflicts_with = "server")]
    pub template: Option<PathBuf>,
    /// Machine facts (JSON or YAML: name, uuid, hostname, macs, ips, labels, claim_name, claim_namespace).
    #[arg(long, requires = "template")]
    pub facts: Option<PathBuf>,
    /// Kubernetes Secret manifest with the claim's `ignition` (and optional `format`) keys.
    #[arg(long)]
    pub secret: Option<PathBuf>,
    /// Directory that Butane `local` references (contents.local, trees, ...) are resolved in.
    #[arg(long)]
    pub files_dir: Option<PathBuf>,
    /// Print what server NAME is served (asks the running bootplane's API).
    #[arg(long)]
    pub server: Option<String>,
    /// Pretty-print the JSON.
    #[arg(long)]
    pub pretty: bool,
    #[command(flatten)]
    pub conn: ApiConn,
}

/// GET `path` on the API; the body, or the server's `Status` message as the error.
fn api_get(conn: &ApiConn, path: &str) -> Result<String> {
    super::Client::new(&conn.conn())?.request_text("GET", path, None)
}

fn server_path(kind: &str, server: &str) -> Result<String> {
    if server.is_empty()
        || !server
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
    {
        bail!("invalid server name {server:?}");
    }
    Ok(format!(
        "{}/{kind}/{server}",
        crate::model::wire::PREVIEW_PATH
    ))
}

fn read(p: &PathBuf) -> Result<String> {
    if p.as_os_str() == "-" {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).context("reading stdin")?;
        return Ok(s);
    }
    std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
}

/// Runs `bootplane render ...`; returns the exit code.
pub fn run(cmd: RenderCmd) -> Result<u8> {
    let a = match cmd {
        RenderCmd::Ignition(a) => a,
        RenderCmd::Ipxe(a) => {
            let body = api_get(&a.conn, &server_path("ipxe", &a.server)?)?;
            print!("{body}");
            return Ok(0);
        }
    };
    if let Some(server) = &a.server {
        let body = api_get(&a.conn, &server_path("ignition", server)?)?;
        if a.pretty {
            let v: serde_json::Value =
                serde_json::from_str(&body).context("decoding the served ignition")?;
            println!("{}", serde_json::to_string_pretty(&v)?);
        } else {
            println!("{body}");
        }
        return Ok(0);
    }
    let files = match &a.files_dir {
        Some(d) => {
            FilesDir::read_dir(d).with_context(|| format!("reading files dir {}", d.display()))?
        }
        None => FilesDir::new(),
    };
    let config = if let Some(p) = &a.butane {
        crate::ignition::translate_with(&read(p)?, &files)
            .with_context(|| format!("translating {}", p.display()))?
            .config
    } else if let Some(p) = &a.ignition {
        let v = crate::ignition::validate::parse_json(&read(p)?)
            .with_context(|| format!("parsing {}", p.display()))?;
        crate::ignition::validate(&v).with_context(|| format!("validating {}", p.display()))?;
        v
    } else if a.template.is_some() || a.secret.is_some() {
        let mut r = Renderer::new();
        r.set_files(files);
        let mut name = None;
        if let Some(p) = &a.template {
            let n = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "template".into());
            r.add_template(Template::new(&n, read(p)?))?;
            name = Some(n);
        }
        let facts: MachineFacts = match &a.facts {
            Some(p) => serde_norway::from_str(&read(p)?)
                .with_context(|| format!("parsing facts {}", p.display()))?,
            None => MachineFacts::default(),
        };
        let secret = match &a.secret {
            Some(p) => Some(
                IgnitionSecret::from_manifest(&read(p)?)
                    .with_context(|| format!("reading secret {}", p.display()))?,
            ),
            None => None,
        };
        r.render(name.as_deref(), &facts, secret.as_ref())?.config
    } else {
        bail!("give --butane FILE, --ignition FILE, or --template FILE [--facts FILE] [--secret FILE]");
    };
    let out = if a.pretty {
        serde_json::to_string_pretty(&config)?
    } else {
        serde_json::to_string(&config)?
    };
    println!("{out}");
    Ok(0)
}
