//! The client config: where the CLI finds the API and how it proves who it is, kept like a
//! kubeconfig (clusters, users, contexts, a current context) so `bootplane get servers` works
//! from a laptop with no flags.
//!
//! The file is `--client-config` / `BOOTPLANE_CLIENT_CONFIG`, else
//! `$XDG_CONFIG_HOME/bootplane/config` (`~/.config/bootplane/config`). It is YAML:
//!
//! ```yaml
//! apiVersion: v1
//! kind: Config
//! current-context: lab
//! clusters:
//! - name: lab
//!   cluster: {server: "https://10.0.0.1:9090", certificate-authority: /etc/bootplane/ca.crt}
//! users:
//! - name: alice
//!   user: {token: "bp1.alice.…"}          # or client-certificate + client-key (paths or -data)
//! contexts:
//! - name: lab
//!   context: {cluster: lab, user: alice}
//! ```
//!
//! [`resolve`] picks what one command uses: each flag (`--server`, `--token`, `--ca-file`,
//! `--cert-file`, `--key-file`) wins over the chosen context (`--context`, else
//! `current-context`); with no context at all the CLI talks to the local appliance: its
//! default URL, the state dir's CA and `api-token`. `bootplane config …` edits the file
//! (written 0600 through a rename, as it may hold tokens and keys); `view` redacts them.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context as _, Result};
use base64::Engine as _;
use serde::{Deserialize, Serialize};

/// The API URL when nothing names one: the local appliance's default listener.
pub(crate) const DEFAULT_SERVER: &str = "https://127.0.0.1:9090";
/// A client config bigger than this is refused (a real one is a few KiB).
const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// A CA, certificate, key or token file bigger than this is refused.
const MAX_CREDENTIAL_BYTES: u64 = 256 << 10;

/// The client config file, kubeconfig-shaped.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub(crate) struct ClientConfig {
    #[serde(rename = "apiVersion", default = "v1")]
    pub api_version: String,
    #[serde(default = "config_kind")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub current_context: String,
    #[serde(default)]
    pub clusters: Vec<NamedCluster>,
    #[serde(default)]
    pub users: Vec<NamedUser>,
    #[serde(default)]
    pub contexts: Vec<NamedContext>,
}

fn v1() -> String {
    "v1".into()
}
fn config_kind() -> String {
    "Config".into()
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct NamedCluster {
    pub name: String,
    pub cluster: Cluster,
}

/// Where an appliance's API is and which CA its certificate chains to.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub(crate) struct Cluster {
    pub server: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_authority: Option<PathBuf>,
    /// The CA's PEM, base64 (as a kubeconfig embeds it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_authority_data: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct NamedUser {
    pub name: String,
    pub user: User,
}

/// How a user proves who it is: a bearer token, or a client certificate and key.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub(crate) struct User {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    #[serde(default, alias = "tokenFile", skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate_data: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_key: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_key_data: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct NamedContext {
    pub name: String,
    pub context: ContextRef,
}

/// A context: one cluster with one user.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct ContextRef {
    pub cluster: String,
    pub user: String,
}

/// Where the CLI reads its client config: `explicit`, else the XDG config dir.
pub(crate) fn config_path(explicit: Option<&Path>) -> Option<PathBuf> {
    if let Some(p) = explicit {
        return Some(p.to_path_buf());
    }
    if let Some(x) = std::env::var_os("XDG_CONFIG_HOME").filter(|x| !x.is_empty()) {
        return Some(PathBuf::from(x).join("bootplane/config"));
    }
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| PathBuf::from(h).join(".config/bootplane/config"))
}

impl ClientConfig {
    /// An empty config (what a missing default file reads as).
    pub(crate) fn empty() -> ClientConfig {
        ClientConfig {
            api_version: v1(),
            kind: config_kind(),
            ..Default::default()
        }
    }

    /// Parse a config's text; `origin` names it in errors.
    pub(crate) fn parse(text: &str, origin: &str) -> Result<ClientConfig> {
        let limits = crate::decode::Limits::new(MAX_CONFIG_BYTES as usize);
        crate::decode::scan_yaml(text, limits).with_context(|| format!("parsing {origin}"))?;
        let c: ClientConfig = if text.trim().is_empty() {
            ClientConfig::empty()
        } else {
            serde_norway::from_str(text).with_context(|| format!("parsing {origin}"))?
        };
        c.check().with_context(|| format!("in {origin}"))?;
        Ok(c)
    }

    /// Read `path`; a missing file reads as empty when `must_exist` is false.
    pub(crate) fn load(path: &Path, must_exist: bool) -> Result<ClientConfig> {
        let text = match read_bounded(path, MAX_CONFIG_BYTES) {
            Ok(t) => t,
            Err(e) if !must_exist && is_not_found(&e) => return Ok(ClientConfig::empty()),
            Err(e) => return Err(e),
        };
        let text = String::from_utf8(text)
            .map_err(|_| anyhow!("client config {} is not UTF-8", path.display()))?;
        ClientConfig::parse(&text, &format!("client config {}", path.display()))
    }

    /// Write to `path` (0600, parent 0700 when created) through a rename.
    pub(crate) fn save(&self, path: &Path) -> Result<()> {
        use std::os::unix::fs::DirBuilderExt as _;
        self.check()?;
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
        let text = serde_norway::to_string(self).context("encoding client config")?;
        crate::statedir::write_private(path, text.as_bytes())
    }

    /// Names unique per list, contexts naming what exists, the current context existing.
    fn check(&self) -> Result<()> {
        fn unique<'a>(what: &str, names: impl Iterator<Item = &'a str>) -> Result<()> {
            let mut seen = std::collections::BTreeSet::new();
            for n in names {
                if n.is_empty() {
                    bail!("a {what} has an empty name");
                }
                if !seen.insert(n) {
                    bail!("{what} {n:?} is defined twice");
                }
            }
            Ok(())
        }
        if self.api_version != "v1" || self.kind != "Config" {
            bail!(
                "expected apiVersion v1, kind Config (got {:?}, {:?})",
                self.api_version,
                self.kind
            );
        }
        unique("cluster", self.clusters.iter().map(|c| c.name.as_str()))?;
        unique("user", self.users.iter().map(|u| u.name.as_str()))?;
        unique("context", self.contexts.iter().map(|c| c.name.as_str()))?;
        for c in &self.clusters {
            check_server(&c.cluster.server).with_context(|| format!("cluster {:?}", c.name))?;
        }
        for c in &self.contexts {
            if self.cluster(&c.context.cluster).is_none() {
                bail!(
                    "context {:?} names cluster {:?}, which is not defined",
                    c.name,
                    c.context.cluster
                );
            }
            if self.user(&c.context.user).is_none() {
                bail!(
                    "context {:?} names user {:?}, which is not defined",
                    c.name,
                    c.context.user
                );
            }
        }
        if !self.current_context.is_empty() && self.context(&self.current_context).is_none() {
            bail!("current-context {:?} is not defined", self.current_context);
        }
        Ok(())
    }

    pub(crate) fn cluster(&self, name: &str) -> Option<&Cluster> {
        self.clusters
            .iter()
            .find(|c| c.name == name)
            .map(|c| &c.cluster)
    }
    pub(crate) fn user(&self, name: &str) -> Option<&User> {
        self.users.iter().find(|u| u.name == name).map(|u| &u.user)
    }
    pub(crate) fn context(&self, name: &str) -> Option<&ContextRef> {
        self.contexts
            .iter()
            .find(|c| c.name == name)
            .map(|c| &c.context)
    }

    /// Add or replace the cluster `name`.
    pub(crate) fn set_cluster(&mut self, name: &str, cluster: Cluster) {
        match self.clusters.iter_mut().find(|c| c.name == name) {
            Some(c) => c.cluster = cluster,
            None => self.clusters.push(NamedCluster {
                name: name.into(),
                cluster,
            }),
        }
    }
    /// Add or replace the user `name`.
    pub(crate) fn set_user(&mut self, name: &str, user: User) {
        match self.users.iter_mut().find(|u| u.name == name) {
            Some(u) => u.user = user,
            None => self.users.push(NamedUser {
                name: name.into(),
                user,
            }),
        }
    }
    /// Add or replace the context `name`.
    pub(crate) fn set_context(&mut self, name: &str, context: ContextRef) {
        match self.contexts.iter_mut().find(|c| c.name == name) {
            Some(c) => c.context = context,
            None => self.contexts.push(NamedContext {
                name: name.into(),
                context,
            }),
        }
    }

    /// A copy safe to print: tokens, keys and embedded data replaced.
    pub(crate) fn redacted(&self) -> ClientConfig {
        let mut c = self.clone();
        for u in &mut c.users {
            if u.user.token.is_some() {
                u.user.token = Some("REDACTED".into());
            }
            if u.user.client_key_data.is_some() {
                u.user.client_key_data = Some("REDACTED".into());
            }
            if u.user.client_certificate_data.is_some() {
                u.user.client_certificate_data = Some("DATA+OMITTED".into());
            }
        }
        for cl in &mut c.clusters {
            if cl.cluster.certificate_authority_data.is_some() {
                cl.cluster.certificate_authority_data = Some("DATA+OMITTED".into());
            }
        }
        c
    }
}

fn check_server(server: &str) -> Result<()> {
    let rest = server
        .strip_prefix("https://")
        .or_else(|| server.strip_prefix("http://"))
        .ok_or_else(|| anyhow!("server {server:?} must start with https:// or http://"))?;
    if rest.is_empty() || rest.starts_with('/') {
        bail!("server {server:?} has no host");
    }
    Ok(())
}

fn is_not_found(e: &anyhow::Error) -> bool {
    e.downcast_ref::<std::io::Error>()
        .is_some_and(|e| e.kind() == std::io::ErrorKind::NotFound)
}

use crate::statedir::read_bounded;

/// Base64 of embedded PEM data, decoded; `what` names it in errors (never the data).
fn embedded(data: &str, what: &str) -> Result<Vec<u8>> {
    base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .map_err(|_| anyhow!("{what} is not valid base64"))
}

/// What the command line said about the connection (absent = not given).
#[derive(Debug, Default, Clone)]
pub(crate) struct Flags {
    pub server: Option<String>,
    pub token: Option<String>,
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub context: Option<String>,
    /// `--client-config`: must exist when given.
    pub client_config: Option<PathBuf>,
    /// The local appliance's state dir (CA and token when no context names them).
    pub state_dir: PathBuf,
}

/// A credential or CA as the client will use it.
#[derive(Clone, PartialEq)]
pub(crate) enum Pem {
    File(PathBuf),
    Data(Vec<u8>),
}

impl std::fmt::Debug for Pem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pem::File(p) => write!(f, "File({})", p.display()),
            Pem::Data(d) => write!(f, "Data({} bytes)", d.len()),
        }
    }
}

impl Pem {
    /// How errors name it: the file, or that it is embedded in the client config.
    pub(crate) fn name(&self) -> String {
        match self {
            Pem::File(p) => p.display().to_string(),
            Pem::Data(_) => "the client config's embedded data".into(),
        }
    }

    /// The PEM bytes (a file is read now, bounded).
    pub(crate) fn bytes(&self) -> Result<Vec<u8>> {
        match self {
            Pem::File(p) => read_bounded(p, MAX_CREDENTIAL_BYTES),
            Pem::Data(d) => Ok(d.clone()),
        }
    }
}

/// Where the token comes from (read when the client is built).
#[derive(Clone, PartialEq)]
pub(crate) enum Token {
    Value(String),
    File(PathBuf),
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Token::Value(_) => f.write_str("Value(<redacted>)"),
            Token::File(p) => write!(f, "File({})", p.display()),
        }
    }
}

impl Token {
    pub(crate) fn read(&self) -> Result<String> {
        match self {
            Token::Value(v) => Ok(v.clone()),
            Token::File(p) => {
                let b = read_bounded(p, MAX_CREDENTIAL_BYTES)?;
                let s = String::from_utf8(b)
                    .map_err(|_| anyhow!("token file {} is not UTF-8", p.display()))?;
                let s = s.trim();
                if s.is_empty() {
                    bail!("token file {} is empty", p.display());
                }
                Ok(s.to_string())
            }
        }
    }
}

/// What one command connects with: the result of flags over context over defaults.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Endpoint {
    pub server: String,
    pub ca: Option<Pem>,
    pub token: Option<Token>,
    pub client_cert: Option<Pem>,
    pub client_key: Option<Pem>,
    /// Where it came from, for messages: `context "lab"` or `the local state dir`.
    pub origin: String,
}

/// Flags over the chosen context over the local appliance's defaults.
pub(crate) fn resolve(flags: &Flags) -> Result<Endpoint> {
    let path = config_path(flags.client_config.as_deref());
    let cfg = match &path {
        Some(p) => ClientConfig::load(p, flags.client_config.is_some())?,
        None => ClientConfig::empty(),
    };
    resolve_with(&cfg, flags)
}

/// [`resolve`] on a config already read.
pub(crate) fn resolve_with(cfg: &ClientConfig, flags: &Flags) -> Result<Endpoint> {
    let chosen = flags
        .context
        .clone()
        .or_else(|| (!cfg.current_context.is_empty()).then(|| cfg.current_context.clone()));
    let mut ep = match chosen {
        Some(name) => {
            let ctx = cfg.context(&name).ok_or_else(|| {
                let known: Vec<&str> = cfg.contexts.iter().map(|c| c.name.as_str()).collect();
                anyhow!(
                    "context {name:?} is not in the client config (known: {})",
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                )
            })?;
            // check() guarantees both exist.
            let cl = cfg.cluster(&ctx.cluster).expect("checked");
            let u = cfg.user(&ctx.user).expect("checked");
            let what = |field: &str| format!("context {name:?}: {field}");
            let ca = match (&cl.certificate_authority, &cl.certificate_authority_data) {
                (Some(_), Some(_)) => bail!(
                    "{}",
                    what("cluster has both certificate-authority and certificate-authority-data")
                ),
                (Some(p), None) => Some(Pem::File(p.clone())),
                (None, Some(d)) => {
                    Some(Pem::Data(embedded(d, &what("certificate-authority-data"))?))
                }
                (None, None) => None,
            };
            let token = match (&u.token, &u.token_file) {
                (Some(_), Some(_)) => bail!("{}", what("user has both token and token-file")),
                (Some(t), None) => Some(Token::Value(t.clone())),
                (None, Some(p)) => Some(Token::File(p.clone())),
                (None, None) => None,
            };
            let pem = |file: &Option<PathBuf>, data: &Option<String>, field: &str| {
                Ok::<_, anyhow::Error>(match (file, data) {
                    (Some(_), Some(_)) => bail!(
                        "{}",
                        what(&format!("user has both {field} and {field}-data"))
                    ),
                    (Some(p), None) => Some(Pem::File(p.clone())),
                    (None, Some(d)) => {
                        Some(Pem::Data(embedded(d, &what(&format!("{field}-data")))?))
                    }
                    (None, None) => None,
                })
            };
            Endpoint {
                server: cl.server.clone(),
                ca,
                token,
                client_cert: pem(
                    &u.client_certificate,
                    &u.client_certificate_data,
                    "client-certificate",
                )?,
                client_key: pem(&u.client_key, &u.client_key_data, "client-key")?,
                origin: format!("context {name:?}"),
            }
        }
        None => {
            let ca = flags.state_dir.join("tls/ca.crt");
            let token = flags.state_dir.join("api-token");
            Endpoint {
                server: DEFAULT_SERVER.into(),
                ca: ca.exists().then_some(Pem::File(ca)),
                // Only when no certificate is given instead.
                token: (flags.cert_file.is_none() && token.exists()).then_some(Token::File(token)),
                client_cert: None,
                client_key: None,
                origin: format!("the local state dir {}", flags.state_dir.display()),
            }
        }
    };
    if let Some(s) = &flags.server {
        check_server(s).context("--server")?;
        ep.server = s.clone();
    }
    if let Some(t) = &flags.token {
        ep.token = Some(Token::Value(t.clone()));
    }
    if let Some(p) = &flags.ca_file {
        ep.ca = Some(Pem::File(p.clone()));
    }
    if let Some(p) = &flags.cert_file {
        ep.client_cert = Some(Pem::File(p.clone()));
    }
    if let Some(p) = &flags.key_file {
        ep.client_key = Some(Pem::File(p.clone()));
    }
    if ep.client_cert.is_some() != ep.client_key.is_some() {
        bail!(
            "{}: a client certificate needs its key and a key its certificate",
            ep.origin
        );
    }
    if ep.token.is_none() && ep.client_cert.is_none() {
        bail!(
            "no credentials for {} from {}: pass --token or --cert-file/--key-file, \
             use a context with a user (bootplane config set-credentials), or --state-dir \
             of the local appliance",
            ep.server,
            ep.origin
        );
    }
    Ok(ep)
}

/// `bootplane config …`: read and edit the client config (kubectl's verbs).
#[derive(Debug, clap::Subcommand)]
pub enum ConfigCmd {
    /// Print the client config (tokens, keys and embedded data redacted unless --raw).
    View {
        /// Print tokens, keys and embedded data as they are.
        #[arg(long)]
        raw: bool,
        #[command(flatten)]
        file: FileArg,
    },
    /// List the contexts (the current one marked `*`).
    GetContexts {
        #[command(flatten)]
        file: FileArg,
    },
    /// Print the current context's name.
    CurrentContext {
        #[command(flatten)]
        file: FileArg,
    },
    /// Make NAME the current context.
    UseContext {
        /// The context to make current.
        name: String,
        #[command(flatten)]
        file: FileArg,
    },
    /// Add or change a cluster: where an appliance's API is and the CA it chains to.
    SetCluster {
        /// The cluster's name.
        name: String,
        /// The API's URL (`https://bootplane.example:9090`).
        #[arg(long)]
        server: Option<String>,
        /// CA certificate file (PEM).
        #[arg(long = "certificate-authority")]
        certificate_authority: Option<PathBuf>,
        /// Store the files' contents in the config instead of their paths.
        #[arg(long)]
        embed_certs: bool,
        #[command(flatten)]
        file: FileArg,
    },
    /// Add or replace a user: a bearer token, or a client certificate and key.
    SetCredentials {
        /// The user's name.
        name: String,
        /// A bearer token, stored in the config.
        #[arg(long, conflicts_with_all = ["token_file", "client_certificate"])]
        token: Option<String>,
        /// A file holding the bearer token (read at each use).
        #[arg(long = "token-file", conflicts_with = "client_certificate")]
        token_file: Option<PathBuf>,
        /// Client certificate (PEM), with --client-key.
        #[arg(long = "client-certificate", requires = "client_key")]
        client_certificate: Option<PathBuf>,
        /// Private key (PEM) of --client-certificate.
        #[arg(long = "client-key", requires = "client_certificate")]
        client_key: Option<PathBuf>,
        /// Store the files' contents in the config instead of their paths.
        #[arg(long)]
        embed_certs: bool,
        #[command(flatten)]
        file: FileArg,
    },
    /// Add or change a context: a cluster with a user.
    SetContext {
        /// The context's name.
        name: String,
        /// The cluster it uses.
        #[arg(long)]
        cluster: Option<String>,
        /// The user it uses.
        #[arg(long)]
        user: Option<String>,
        #[command(flatten)]
        file: FileArg,
    },
    /// Remove a context (its cluster and user stay).
    DeleteContext {
        /// The context to remove.
        name: String,
        #[command(flatten)]
        file: FileArg,
    },
}

/// The client config file a `config` command reads and writes.
#[derive(Debug, clap::Args)]
pub struct FileArg {
    /// Client config file (default `$XDG_CONFIG_HOME/bootplane/config`,
    /// `~/.config/bootplane/config`).
    #[arg(long = "client-config", env = "BOOTPLANE_CLIENT_CONFIG")]
    pub client_config: Option<PathBuf>,
}

impl FileArg {
    fn path(&self) -> Result<PathBuf> {
        config_path(self.client_config.as_deref())
            .ok_or_else(|| anyhow!("no client config path: set --client-config or HOME"))
    }
}

/// Read a PEM file for embedding: bounded, and it must look like PEM.
fn embed_file(p: &Path) -> Result<String> {
    let b = read_bounded(p, MAX_CREDENTIAL_BYTES)?;
    if !b.starts_with(b"-----BEGIN") && !String::from_utf8_lossy(&b).contains("-----BEGIN ") {
        bail!("{} is not a PEM file", p.display());
    }
    Ok(base64::engine::general_purpose::STANDARD.encode(b))
}

/// A user from `set-credentials`' flags (paths made absolute, or contents embedded).
fn user_from(
    token: Option<String>,
    token_file: Option<PathBuf>,
    cert_and_key: Option<(PathBuf, PathBuf)>,
    embed: bool,
) -> Result<User> {
    let abs =
        |f: PathBuf| std::path::absolute(&f).with_context(|| format!("resolving {}", f.display()));
    let mut u = User {
        token,
        token_file: token_file.map(abs).transpose()?,
        ..Default::default()
    };
    if let Some((cert, key)) = cert_and_key {
        if embed {
            u.client_certificate_data = Some(embed_file(&cert)?);
            u.client_key_data = Some(embed_file(&key)?);
        } else {
            u.client_certificate = Some(abs(cert)?);
            u.client_key = Some(abs(key)?);
        }
    }
    if u == User::default() {
        bail!("needs --token, --token-file or --client-certificate with --client-key");
    }
    Ok(u)
}

/// Run one `bootplane config` command; returns the exit code.
pub fn run(cmd: ConfigCmd) -> Result<u8> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match cmd {
        ConfigCmd::View { raw, file } => {
            let c = ClientConfig::load(&file.path()?, file.client_config.is_some())?;
            let c = if raw { c } else { c.redacted() };
            write!(out, "{}", serde_norway::to_string(&c)?)?;
        }
        ConfigCmd::GetContexts { file } => {
            let c = ClientConfig::load(&file.path()?, file.client_config.is_some())?;
            let mut rows = vec![vec![
                "CURRENT".to_string(),
                "NAME".into(),
                "CLUSTER".into(),
                "USER".into(),
                "SERVER".into(),
            ]];
            for x in &c.contexts {
                rows.push(vec![
                    if x.name == c.current_context { "*" } else { "" }.into(),
                    x.name.clone(),
                    x.context.cluster.clone(),
                    x.context.user.clone(),
                    c.cluster(&x.context.cluster)
                        .map(|cl| cl.server.clone())
                        .unwrap_or_default(),
                ]);
            }
            write!(out, "{}", super::table::format_rows(&rows))?;
        }
        ConfigCmd::CurrentContext { file } => {
            let c = ClientConfig::load(&file.path()?, file.client_config.is_some())?;
            if c.current_context.is_empty() {
                bail!("current-context is not set");
            }
            writeln!(out, "{}", c.current_context)?;
        }
        ConfigCmd::UseContext { name, file } => {
            let p = file.path()?;
            let mut c = ClientConfig::load(&p, false)?;
            if c.context(&name).is_none() {
                bail!("no context exists with the name {name:?}");
            }
            c.current_context = name.clone();
            c.save(&p)?;
            writeln!(out, "Switched to context {name:?}.")?;
        }
        ConfigCmd::SetCluster {
            name,
            server,
            certificate_authority,
            embed_certs,
            file,
        } => {
            let p = file.path()?;
            let mut c = ClientConfig::load(&p, false)?;
            let mut cl = c.cluster(&name).cloned().unwrap_or_default();
            if let Some(s) = server {
                cl.server = s;
            }
            if cl.server.is_empty() {
                bail!("cluster {name:?} needs --server");
            }
            if let Some(ca) = certificate_authority {
                if embed_certs {
                    cl.certificate_authority_data = Some(embed_file(&ca)?);
                    cl.certificate_authority = None;
                } else {
                    let ca = std::path::absolute(&ca)
                        .with_context(|| format!("resolving {}", ca.display()))?;
                    cl.certificate_authority = Some(ca);
                    cl.certificate_authority_data = None;
                }
            }
            c.set_cluster(&name, cl);
            c.save(&p)?;
            writeln!(out, "Cluster {name:?} set.")?;
        }
        ConfigCmd::SetCredentials {
            name,
            token,
            token_file,
            client_certificate,
            client_key,
            embed_certs,
            file,
        } => {
            let p = file.path()?;
            let mut c = ClientConfig::load(&p, false)?;
            let cert = client_certificate.zip(client_key);
            let u = user_from(token, token_file, cert, embed_certs)
                .with_context(|| format!("user {name:?}"))?;
            c.set_user(&name, u);
            c.save(&p)?;
            writeln!(out, "User {name:?} set.")?;
        }
        ConfigCmd::SetContext {
            name,
            cluster,
            user,
            file,
        } => {
            let p = file.path()?;
            let mut c = ClientConfig::load(&p, false)?;
            let mut x = c.context(&name).cloned().unwrap_or_default();
            if let Some(cl) = cluster {
                x.cluster = cl;
            }
            if let Some(u) = user {
                x.user = u;
            }
            if x.cluster.is_empty() || x.user.is_empty() {
                bail!("context {name:?} needs --cluster and --user");
            }
            c.set_context(&name, x);
            c.save(&p)?;
            writeln!(out, "Context {name:?} set.")?;
        }
        ConfigCmd::DeleteContext { name, file } => {
            let p = file.path()?;
            let mut c = ClientConfig::load(&p, true)?;
            let before = c.contexts.len();
            c.contexts.retain(|x| x.name != name);
            if c.contexts.len() == before {
                bail!("no context exists with the name {name:?}");
            }
            if c.current_context == name {
                c.current_context.clear();
            }
            c.save(&p)?;
            writeln!(out, "Deleted context {name:?}.")?;
        }
    }
    Ok(0)
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
