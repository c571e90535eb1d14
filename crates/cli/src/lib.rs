//! The command-line client (`apply`, `get`, `delete`, `patch`, `label`, `annotate`,
//! `edit`) that talks to the REST API, with kubectl's habits (the `bootplane-cli` crate,
//! the fifth layer beside the API: re-exported by the `bootplane` package as
//! `bootplane::cli`; it builds on the model and the protocol crate only, and speaks to
//! the API over HTTP, never through its code).
//!
//! It finds the API and its credentials from the flags, the client config's context
//! ([`config`], kubeconfig-like) or the local state dir (`api-token`, `tls/ca.crt`): the
//! connection options are [`Conn`]; it trusts only the CA it is given. Resource names
//! resolve as kubectl's do (plural, singular, kind or short name). [`apply`] does
//! kubectl's three-way merge with the last-applied annotation; [`patch`] is `patch`,
//! `label`, `annotate` and `edit`; [`output`] is `get -o name|jsonpath|custom-columns`,
//! `--sort-by` and `--show-labels`; `delete` takes several names, `-l` or `-f`.
//! [`render`] is `bootplane render ignition|ipxe`, [`token`] `bootplane token
//! create|list|revoke`.

pub mod apply;
pub mod cert;
pub mod complete;
pub mod config;
pub mod describe;
pub mod jobs;
pub mod output;
pub mod patch;
pub mod render;
pub mod table;
pub mod token;

pub use apply::{apply, apply_one, ApplyArgs};
pub use patch::{annotate, edit, label, patch, AnnotateArgs, EditArgs, LabelArgs, PatchArgs};

use std::io::{BufRead, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::Value;

use crate::model::registry::{Registry, ResourceType};

/// How a command reaches the API: each flag wins over the client config's context
/// ([`config::resolve`]); with neither, the local appliance (its default URL, the state
/// dir's CA and token).
#[derive(Debug, Args, Clone)]
pub struct Conn {
    /// API server URL (default: the context's, else `https://127.0.0.1:9090`).
    #[arg(long, env = "BOOTPLANE_SERVER", global = true)]
    pub server: Option<String>,
    /// Bearer token (default: the context's user, else the local state dir's api-token).
    #[arg(long, env = "BOOTPLANE_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// State dir of the local appliance (its token and CA when no context names them).
    #[arg(
        long = "state-dir",
        env = "BOOTPLANE_STATE_DIR",
        default_value = "./var/bootplane",
        global = true
    )]
    pub state_dir: PathBuf,
    /// CA certificate(s) (PEM) the API's certificate must chain to (default: the
    /// context's, else the state dir's tls/ca.crt). No other CA is trusted.
    #[arg(long = "ca-file", env = "BOOTPLANE_CA_FILE", global = true)]
    pub ca_file: Option<PathBuf>,
    /// Client certificate (PEM) to present, with --key-file (`bootplane cert issue`).
    #[arg(long = "cert-file", env = "BOOTPLANE_CERT_FILE", global = true)]
    pub cert_file: Option<PathBuf>,
    /// Private key (PEM) of --cert-file.
    #[arg(long = "key-file", env = "BOOTPLANE_KEY_FILE", global = true)]
    pub key_file: Option<PathBuf>,
    /// Context of the client config to use (default: its current-context).
    #[arg(long, env = "BOOTPLANE_CONTEXT", global = true)]
    pub context: Option<String>,
    /// Client config file (default `$XDG_CONFIG_HOME/bootplane/config`).
    #[arg(long = "client-config", env = "BOOTPLANE_CLIENT_CONFIG", global = true)]
    pub client_config: Option<PathBuf>,
}

impl Conn {
    /// The connection flags for [`config::resolve`].
    pub(crate) fn flags(&self) -> config::Flags {
        config::Flags {
            server: self.server.clone(),
            token: self.token.clone(),
            ca_file: self.ca_file.clone(),
            cert_file: self.cert_file.clone(),
            key_file: self.key_file.clone(),
            context: self.context.clone(),
            client_config: self.client_config.clone(),
            state_dir: self.state_dir.clone(),
        }
    }
}

/// An agent for `ep`: TLS trusting only its CA (with its client certificate when it has
/// one) for `https://`, plain for `http://` (a loopback API with `[api] tls = false`).
pub(crate) fn agent(ep: &config::Endpoint) -> Result<ureq::Agent> {
    // Connecting is bounded; reads are not (a watch waits for events).
    let b = ureq::AgentBuilder::new().timeout_connect(std::time::Duration::from_secs(30));
    if ep.server.starts_with("http://") {
        if ep.client_cert.is_some() {
            bail!(
                "a client certificate needs an https:// server, not {}",
                ep.server
            );
        }
        return Ok(b.build());
    }
    let ca = ep.ca.as_ref().ok_or_else(|| {
        anyhow::anyhow!(
            "no CA for {} from {}: pass --ca-file, set the context's certificate-authority, \
             or --state-dir of the local appliance",
            ep.server,
            ep.origin
        )
    })?;
    let pem = ca
        .bytes()
        .with_context(|| format!("reading the API's CA certificate ({})", ep.origin))?;
    let client = match (&ep.client_cert, &ep.client_key) {
        (Some(c), Some(k)) => Some((c.bytes()?, k.bytes()?, c.name(), k.name())),
        _ => None,
    };
    let cfg = crate::tls::client_config_pem(
        &pem,
        client
            .as_ref()
            .map(|(c, k, cn, kn)| (c.as_slice(), k.as_slice(), cn.as_str(), kn.as_str())),
    )
    .with_context(|| format!("tls setup for {} ({})", ep.server, ep.origin))?;
    Ok(b.tls_config(Arc::new(cfg)).build())
}

#[derive(Debug, Args)]
pub struct GetArgs {
    /// Resource type(s), comma-separated (`servers`, `scl`, `images,storagevolumes`),
    /// or `all` (servers, claims, boot configurations, BMCs, actions, images, volumes).
    pub kind: String,
    /// The object's name (default: every object of the type).
    pub name: Option<String>,
    /// Only objects whose labels match (`role=worker,zone!=b`, `!gpu`).
    #[arg(short = 'l', long = "selector")]
    pub selector: Option<String>,
    /// Output: wide, yaml, json, name, `jsonpath=TEMPLATE` (kubectl's:
    /// `{.items[*].metadata.name}`, `{range .items[*]}...{end}`) or
    /// `custom-columns=HEADER:JSONPATH,...`.
    #[arg(short = 'o', long = "output")]
    pub output: Option<String>,
    /// Namespace of namespaced types.
    #[arg(short = 'n', long = "namespace", default_value = "default")]
    pub namespace: String,
    /// List namespaced types across every namespace.
    #[arg(short = 'A', long = "all-namespaces")]
    pub all_namespaces: bool,
    /// Keep watching for changes.
    #[arg(short = 'w', long = "watch")]
    pub watch: bool,
    /// With `get events`: only the events of this object (`KIND/NAME`, e.g.
    /// `serverclaim/web-1`).
    #[arg(long = "for", value_name = "KIND/NAME")]
    pub for_object: Option<String>,
    /// Add a LABELS column to the table.
    #[arg(long = "show-labels")]
    pub show_labels: bool,
    /// Sort the list by the value at this JSONPath (`.metadata.name`,
    /// `{.status.state}`).
    #[arg(long = "sort-by", value_name = "JSONPATH")]
    pub sort_by: Option<String>,
    /// Print tables (and custom columns) without their header line.
    #[arg(long = "no-headers")]
    pub no_headers: bool,
    /// Keep `metadata.managedFields` (who wrote which field) in json, yaml and
    /// jsonpath output; left out otherwise, as kubectl does.
    #[arg(long = "show-managed-fields")]
    pub show_managed_fields: bool,
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(Debug, Args)]
pub struct DeleteArgs {
    /// Resource type (`servers`, `scl`, ...); none with -f.
    pub kind: Option<String>,
    /// Names of the objects to delete.
    pub names: Vec<String>,
    /// Delete every object of the type whose labels match (`role=worker`).
    #[arg(short = 'l', long = "selector")]
    pub selector: Option<String>,
    /// Delete the objects these manifests name: file, directory or `-` (repeatable).
    #[arg(short = 'f', long = "filename")]
    pub files: Vec<String>,
    /// An object that does not exist is not an error.
    #[arg(long = "ignore-not-found")]
    pub ignore_not_found: bool,
    /// Namespace of namespaced types (for -f: where a manifest names none).
    #[arg(short = 'n', long = "namespace", default_value = "default")]
    pub namespace: String,
    #[command(flatten)]
    pub conn: Conn,
}

/// A small blocking client for the REST API.
pub struct Client {
    base: String,
    /// None: authenticated by the client certificate alone.
    token: Option<String>,
    agent: ureq::Agent,
}

/// An API failure as the server described it.
#[derive(Debug)]
pub(crate) struct ApiFailure {
    pub code: u16,
    pub reason: String,
    pub message: String,
    /// The request was a write (not GET): a 503 or 504 says what became of it.
    pub write: bool,
}

impl std::fmt::Display for ApiFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Error from server ({}): {}", self.reason, self.message)?;
        match (self.write, self.code) {
            // kube's 504 Timeout: the write reached the store and got no answer.
            (true, 504) => write!(
                f,
                "\nthe change may have been applied, or may still be: read the object again \
                 (bootplane get) before retrying it"
            ),
            (true, 503) => write!(f, "\nnothing was changed: retry once the store is back"),
            _ => Ok(()),
        }
    }
}
impl std::error::Error for ApiFailure {}

impl Client {
    /// A client for the API `conn` names.
    pub(crate) fn new(conn: &Conn) -> Result<Client> {
        let ep = config::resolve(&conn.flags())?;
        let token = match &ep.token {
            Some(t) => Some(t.read()?),
            None => None,
        };
        Ok(Client {
            base: ep.server.trim_end_matches('/').to_string(),
            token,
            agent: agent(&ep)?,
        })
    }

    fn authorize(&self, r: ureq::Request) -> ureq::Request {
        match &self.token {
            Some(t) => r.set("Authorization", &format!("Bearer {t}")),
            None => r,
        }
    }

    pub(crate) fn path(rt: &ResourceType, ns: Option<&str>, name: Option<&str>) -> String {
        let mut p = if rt.group.is_empty() {
            format!("/api/{}", rt.version)
        } else {
            format!("/apis/{}/{}", rt.group, rt.version)
        };
        if rt.namespaced {
            if let Some(ns) = ns {
                p.push_str(&format!("/namespaces/{ns}"));
            }
        }
        p.push('/');
        p.push_str(&rt.plural);
        if let Some(n) = name {
            p.push('/');
            p.push_str(n);
        }
        p
    }

    pub(crate) fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<(&str, &Value)>,
    ) -> Result<Value> {
        let text = self.request_text(method, path, body)?;
        serde_json::from_str(&text).context("decoding response")
    }

    /// [`Client::request`] without decoding: the response body as text.
    pub(crate) fn request_text(
        &self,
        method: &str,
        path: &str,
        body: Option<(&str, &Value)>,
    ) -> Result<String> {
        let url = format!("{}{}", self.base, path);
        let req = self.authorize(self.agent.request(method, &url));
        let res = match body {
            Some((ct, b)) => req.set("Content-Type", ct).send_string(&b.to_string()),
            None => req.call(),
        };
        match res {
            Ok(r) => r.into_string().context("reading response"),
            Err(ureq::Error::Status(code, r)) => {
                let text = r.into_string().unwrap_or_default();
                let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                Err(ApiFailure {
                    code,
                    write: method != "GET",
                    reason: v
                        .get("reason")
                        .and_then(Value::as_str)
                        .unwrap_or("Unknown")
                        .to_string(),
                    message: v
                        .get("message")
                        .and_then(Value::as_str)
                        .map(String::from)
                        .unwrap_or(text),
                }
                .into())
            }
            Err(e) => Err(anyhow::anyhow!("connecting to {}: {e}", self.base)),
        }
    }

    /// Open a watch stream; yields one event per line.
    pub(crate) fn watch(
        &self,
        path: &str,
        query: &str,
    ) -> Result<impl Iterator<Item = Result<Value>>> {
        let url = format!("{}{}?watch=true{}", self.base, path, query);
        let r = self
            .authorize(self.agent.get(&url))
            .call()
            .map_err(|e| anyhow::anyhow!("watching {url}: {e}"))?;
        let reader = std::io::BufReader::new(r.into_reader());
        Ok(reader.lines().map(|l| {
            let l = l.context("reading watch stream")?;
            serde_json::from_str(&l).context("decoding watch event")
        }))
    }
}

/// Read every document from a file, a directory (its .yaml/.yml/.json files, sorted)
/// or stdin (`-`).
pub(crate) fn read_documents(spec: &str) -> Result<Vec<(String, Value)>> {
    let mut out = Vec::new();
    let mut sources: Vec<(String, String)> = Vec::new();
    if spec == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("reading stdin")?;
        sources.push(("<stdin>".into(), s));
    } else {
        let p = Path::new(spec);
        if p.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(p)
                .with_context(|| format!("reading directory {spec}"))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| {
                    f.extension()
                        .is_some_and(|x| x == "yaml" || x == "yml" || x == "json")
                })
                .collect();
            files.sort();
            for f in files {
                let s = std::fs::read_to_string(&f)
                    .with_context(|| format!("reading {}", f.display()))?;
                sources.push((f.display().to_string(), s));
            }
        } else {
            let s = std::fs::read_to_string(p).with_context(|| format!("reading {spec}"))?;
            sources.push((spec.to_string(), s));
        }
    }
    for (name, text) in sources {
        for doc in parse_documents(&text).with_context(|| format!("parsing {name}"))? {
            out.push((name.clone(), doc));
        }
    }
    Ok(out)
}

/// Most bytes YAML aliases may add to a manifest (the server takes 3 MiB bodies).
const MAX_ALIAS_BYTES: usize = 8 << 20;

/// Split multi-document YAML (or one JSON document) into values; empty documents are
/// skipped. Bounded as API bodies are ([`crate::decode`]): nesting and alias
/// expansion are checked before anything is built.
pub(crate) fn parse_documents(text: &str) -> Result<Vec<Value>> {
    let limits = crate::decode::Limits::new(MAX_ALIAS_BYTES);
    let docs = crate::decode::decode_yaml_documents(text, limits)?;
    if docs.iter().any(|v| !v.is_object()) {
        bail!("document is not a mapping");
    }
    Ok(docs)
}

fn resolve(reg: &Registry, kind: &str) -> Result<Arc<ResourceType>> {
    reg.resolve(kind)
        .ok_or_else(|| anyhow::anyhow!("the server doesn't have a resource type \"{kind}\""))
}

/// The types `get all` lists.
pub(crate) const ALL_KINDS: &[&str] = &[
    "servers",
    "serverclaims",
    "serverbootconfigurations",
    "bmcs",
    "serveractions",
    "images",
    "storagevolumes",
];

/// `type.group/name`, as kubectl names an object (`server.metal.ironcore.dev/s1`).
pub(crate) fn obj_ref(rt: &ResourceType, name: &str) -> String {
    if rt.group.is_empty() {
        format!("{}/{name}", rt.singular)
    } else {
        format!("{}.{}/{name}", rt.singular, rt.group)
    }
}

fn selector_query(sel: Option<&str>) -> Result<String> {
    Ok(match sel {
        Some(s) => {
            if s.len() > 4096 {
                bail!("label selector is longer than 4096 bytes");
            }
            format!(
                "labelSelector={}",
                percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC)
            )
        }
        None => String::new(),
    })
}

pub fn get(a: GetArgs) -> Result<u8> {
    use output::Output;
    // Bad output options fail before any request.
    let out = Output::parse(a.output.as_deref())?;
    if let Some(s) = &a.sort_by {
        output::Template::parse(s).context("--sort-by")?;
    }
    let client = Client::new(&a.conn)?;
    if matches!(a.kind.as_str(), "lease" | "leases") {
        return get_leases(&client, a.output.as_deref());
    }
    if matches!(a.kind.as_str(), "job" | "jobs") {
        return jobs::get(&client, a.name.as_deref(), a.output.as_deref());
    }
    let reg = Registry::global();
    let all = a.kind == "all";
    let kinds: Vec<Arc<ResourceType>> = if all {
        ALL_KINDS
            .iter()
            .map(|k| resolve(reg, k))
            .collect::<Result<_>>()?
    } else {
        a.kind
            .split(',')
            .map(|k| resolve(reg, k.trim()))
            .collect::<Result<_>>()?
    };
    if all && a.name.is_some() {
        bail!("`get all` lists every object: it takes no name");
    }
    let ns = if a.all_namespaces {
        None
    } else {
        Some(a.namespace.as_str())
    };
    let mut q = selector_query(a.selector.as_deref())?;
    if let Some(f) = &a.for_object {
        if kinds.len() != 1 || kinds[0].kind != "Event" {
            bail!("--for works with `get events` only");
        }
        let (rt, name) = describe::parse_for(reg, f)?;
        let fq = describe::events_query(&rt, Some(&a.namespace), &name);
        q = if q.is_empty() {
            fq
        } else {
            format!("{q}&{fq}")
        };
    }
    let table = |rt: &ResourceType, wide: bool| {
        let mut t = table::Table::new(rt, wide, a.all_namespaces).no_headers(a.no_headers);
        if a.show_labels {
            t = t.show_labels();
        }
        if all {
            t = t.name_prefix(obj_ref(rt, "").trim_end_matches('/'));
        }
        t
    };
    let mut first = true;
    let mut printed = false;
    for rt in kinds {
        let path = Client::path(&rt, ns, a.name.as_deref());
        if a.watch {
            let t = table(&rt, matches!(out, Output::Table { wide: true }));
            let show = a.show_managed_fields;
            return watch(&client, &rt, ns, &q, (a.name.as_deref(), show), &out, t);
        }
        let full = if q.is_empty() || a.name.is_some() {
            path
        } else {
            format!("{path}?{q}")
        };
        let mut v = client.request("GET", &full, None)?;
        if !a.show_managed_fields {
            output::hide_managed_fields(&mut v);
        }
        let single = a.name.is_some();
        let mut items: Vec<Value> = match v.get("items").and_then(Value::as_array) {
            Some(items) => items.clone(),
            None => vec![v.clone()],
        };
        if let Some(s) = &a.sort_by {
            output::sort_by(&mut items, s)?;
            if !single {
                v["items"] = Value::Array(items.clone());
            }
        }
        match &out {
            Output::Json => println!("{}", serde_json::to_string_pretty(&v)?),
            Output::Yaml => print!("{}", serde_norway::to_string(&v)?),
            Output::Name => {
                for it in &items {
                    let n = it
                        .pointer("/metadata/name")
                        .and_then(Value::as_str)
                        .unwrap_or("");
                    println!("{}", obj_ref(&rt, n));
                }
            }
            Output::JsonPath(t) => print!("{}", t.render(&v)),
            Output::Columns(c) => {
                if !items.is_empty() {
                    print!("{}", c.render(&items, a.no_headers));
                }
            }
            Output::Table { wide } => {
                if items.is_empty() {
                    if first && !all {
                        eprintln!(
                            "No resources found{}.",
                            ns.map(|n| format!(" in {n} namespace")).unwrap_or_default()
                        );
                    }
                    first = false;
                    continue;
                }
                if printed {
                    println!();
                }
                print!("{}", table(&rt, *wide).render(&items));
                printed = true;
            }
        }
        first = false;
    }
    if all && !printed && matches!(out, Output::Table { .. }) {
        eprintln!(
            "No resources found{}.",
            ns.map(|n| format!(" in {n} namespace")).unwrap_or_default()
        );
    }
    Ok(0)
}

/// `get -w`: one line (or document) per change of `rt`'s objects, until the stream ends.
fn watch(
    client: &Client,
    rt: &ResourceType,
    ns: Option<&str>,
    q: &str,
    (name, show_managed_fields): (Option<&str>, bool),
    out: &output::Output,
    mut t: table::Table,
) -> Result<u8> {
    use output::Output;
    let path = Client::path(rt, ns, None);
    let query = if q.is_empty() {
        String::new()
    } else {
        format!("&{q}")
    };
    for ev in client.watch(&path, &query)? {
        let mut ev = ev?;
        if !show_managed_fields {
            if let Some(o) = ev.get_mut("object") {
                output::hide_managed_fields(o);
            }
        }
        let obj = ev.get("object").cloned().unwrap_or(Value::Null);
        let obj_name = obj.pointer("/metadata/name").and_then(Value::as_str);
        if name.is_some() && obj_name != name {
            continue;
        }
        match out {
            Output::Json => println!("{}", serde_json::to_string(&ev)?),
            Output::Yaml => println!("---\n{}", serde_norway::to_string(&ev)?.trim_end()),
            Output::Name => println!("{}", obj_ref(rt, obj_name.unwrap_or(""))),
            Output::JsonPath(t) => print!("{}", t.render(&obj)),
            Output::Columns(c) => print!("{}", c.render(std::slice::from_ref(&obj), true)),
            Output::Table { .. } => {
                let deleted = ev.get("type").and_then(Value::as_str) == Some("DELETED");
                println!("{}", t.row_line(&obj, deleted));
            }
        }
    }
    Ok(0)
}

#[derive(Debug, Args)]
pub struct PowerArgs {
    /// `confirm`: record that a server's power state was changed by hand; `reset`:
    /// restart it through its power driver (with its one-time network boot).
    pub action: String,
    /// The Server's name.
    #[arg(value_name = "SERVER")]
    pub target: String,
    /// `On` or `Off` (for `confirm`).
    pub state: Option<String>,
    #[command(flatten)]
    pub conn: Conn,
}

/// `bootplane power confirm SERVER On|Off`: the manual power driver's confirmation;
/// `bootplane power reset SERVER`: a restart through the Server's power driver.
pub fn power(a: PowerArgs) -> Result<u8> {
    let rt = resolve(Registry::global(), "server")?;
    if a.action == "reset" {
        let client = Client::new(&a.conn)?;
        let key = crate::model::wire::RESET_ANNOTATION;
        client.request(
            "PATCH",
            &Client::path(&rt, None, Some(&a.target)),
            Some((
                "application/merge-patch+json",
                &serde_json::json!({"metadata": {"annotations": {key: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)}}}),
            )),
        )?;
        println!("server.metal.ironcore.dev/{} reset requested", a.target);
        return Ok(0);
    }
    if a.action != "confirm" {
        bail!(
            "unknown power action {:?} (expected confirm or reset)",
            a.action
        );
    }
    let state = a.state.as_deref().unwrap_or("");
    if state != "On" && state != "Off" {
        bail!("power state must be On or Off, not {state:?}");
    }
    let client = Client::new(&a.conn)?;
    let path = format!("{}/status", Client::path(&rt, None, Some(&a.target)));
    client.request(
        "PATCH",
        &path,
        Some((
            "application/merge-patch+json",
            &serde_json::json!({"status": {"powerState": state}}),
        )),
    )?;
    println!(
        "server.metal.ironcore.dev/{} power {state} confirmed",
        a.target
    );
    Ok(0)
}

/// `bootplane get leases`: the DHCP server's leases as a table (or JSON/YAML).
fn get_leases(client: &Client, output: Option<&str>) -> Result<u8> {
    let v = client.request("GET", crate::model::wire::LEASES_PATH, None)?;
    match output {
        Some("json") => println!("{}", serde_json::to_string_pretty(&v)?),
        Some("yaml") => print!("{}", serde_norway::to_string(&v)?),
        _ => {
            let items = v
                .get("items")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            if items.is_empty() {
                eprintln!("No leases found.");
                return Ok(0);
            }
            let mut rows = vec![["IP", "MAC", "HOSTNAME", "STATE", "EXPIRES"]
                .map(String::from)
                .to_vec()];
            for l in &items {
                let s = |k: &str| {
                    l.get(k)
                        .and_then(Value::as_str)
                        .unwrap_or("<none>")
                        .to_string()
                };
                let exp = l
                    .get("expires")
                    .and_then(Value::as_u64)
                    .and_then(|e| chrono::DateTime::from_timestamp(e as i64, 0))
                    .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                    .unwrap_or_default();
                rows.push(vec![s("ip"), s("mac"), s("hostname"), s("state"), exp]);
            }
            // Hostnames are whatever a DHCP client sent: cells go through `printable`.
            print!("{}", table::format_rows(&rows));
        }
    }
    Ok(0)
}

/// `bootplane delete`: objects by name (several), by `-l SELECTOR` or by the
/// manifests in `-f` files; every one is tried, the exit code is 1 if any failed.
pub fn delete(a: DeleteArgs) -> Result<u8> {
    let reg = Registry::global();
    // (type, namespace, name) of every object to delete, worked out before any request.
    let mut targets: Vec<(Arc<ResourceType>, Option<String>, String)> = Vec::new();
    let client;
    if !a.files.is_empty() {
        if a.kind.is_some() || a.selector.is_some() {
            bail!("with -f, name no type, object or -l selector: the manifests name the objects");
        }
        for f in &a.files {
            for (src, doc) in read_documents(f)? {
                let (rt, ns, name) = apply::locate(reg, &doc).with_context(|| src.clone())?;
                let ns = ns.map(|n| {
                    if doc.pointer("/metadata/namespace").is_some() {
                        n.to_string()
                    } else {
                        a.namespace.clone()
                    }
                });
                targets.push((rt, ns, name.to_string()));
            }
        }
        client = Client::new(&a.conn)?;
    } else {
        let kind = a
            .kind
            .as_deref()
            .ok_or_else(|| anyhow::anyhow!("name a resource type and objects, or pass -f FILE"))?;
        let rt = resolve(reg, kind)?;
        let ns = rt.namespaced.then(|| a.namespace.clone());
        match (&a.selector, a.names.is_empty()) {
            (Some(_), false) => bail!("pass object names or -l SELECTOR, not both"),
            (None, true) => bail!(
                "no object named: pass {} names, -l SELECTOR or -f FILE",
                rt.plural
            ),
            (None, false) => {
                for n in &a.names {
                    targets.push((rt.clone(), ns.clone(), n.clone()));
                }
                client = Client::new(&a.conn)?;
            }
            (Some(sel), true) => {
                client = Client::new(&a.conn)?;
                let q = selector_query(Some(sel))?;
                let v = client.request(
                    "GET",
                    &format!("{}?{q}", Client::path(&rt, ns.as_deref(), None)),
                    None,
                )?;
                for it in v
                    .get("items")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let n = it.pointer("/metadata/name").and_then(Value::as_str);
                    let ins = it.pointer("/metadata/namespace").and_then(Value::as_str);
                    if let Some(n) = n {
                        targets.push((rt.clone(), ins.map(String::from).or(ns.clone()), n.into()));
                    }
                }
                if targets.is_empty() {
                    eprintln!("No resources found");
                }
            }
        }
    }
    let mut failed = 0;
    for (rt, ns, name) in targets {
        match client.request(
            "DELETE",
            &Client::path(&rt, ns.as_deref(), Some(&name)),
            None,
        ) {
            Ok(_) => println!("{} \"{}\" deleted", rt.qualified(), name),
            Err(e)
                if a.ignore_not_found
                    && e.downcast_ref::<ApiFailure>()
                        .is_some_and(|f| f.code == 404) => {}
            Err(e) => {
                failed += 1;
                eprintln!("error: {e:#}");
            }
        }
    }
    Ok(if failed > 0 { 1 } else { 0 })
}

// The layers below, under the module names the CLI's files have always used.
use bootplane_model as model;
use bootplane_proto::{decode, ignition, provision, statedir, sys, tls};

#[cfg(test)]
mod tests {
    use super::ApiFailure;

    fn failure(code: u16, reason: &str, write: bool) -> String {
        let f = ApiFailure {
            code,
            reason: reason.into(),
            message: "m".into(),
            write,
        };
        f.to_string()
    }

    #[test]
    fn a_failed_write_says_whether_it_may_still_apply() {
        let unknown = failure(504, "Timeout", true);
        assert!(
            unknown.starts_with("Error from server (Timeout): m\n"),
            "{unknown}"
        );
        assert!(unknown.contains("read the object again"), "{unknown}");
        let refused = failure(503, "ServiceUnavailable", true);
        assert!(
            refused.ends_with("nothing was changed: retry once the store is back"),
            "{refused}"
        );
        // A read has nothing to re-read.
        assert_eq!(
            failure(504, "Timeout", false),
            "Error from server (Timeout): m"
        );
        assert_eq!(
            failure(409, "Conflict", true),
            "Error from server (Conflict): m"
        );
    }
}
