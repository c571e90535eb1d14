//! The process's tracing set-up: the `[log] filter` (checked before use, replaceable
//! at run time through a reload layer, so SIGHUP can change it), text or JSON lines on
//! stderr, and ANSI colour only when stderr is a terminal (never in a file, a pipe,
//! the journal or JSON).
//!
//! A log line's target is the module path of the code that wrote it, and the modules
//! extracted into layer crates log under their crate's name (`bootplane_proto::dhcp`,
//! `bootplane_store::kv`): a directive naming a module by its old path
//! (`bootplane::dhcp=trace`) is given a twin naming the new one ([`MOVED_TARGETS`]), so a
//! filter means what it meant before the split. `bootplane=debug` needs no twin: a
//! directive's target matches by prefix, and `bootplane` is a prefix of `bootplane_proto`.

use std::io::IsTerminal;
use std::sync::Arc;

use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{reload, EnvFilter, Registry};

/// The levels a filter directive may name.
const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// Most bytes of a filter string (it is echoed in error messages).
const MAX_FILTER_BYTES: usize = 4096;

/// Where the `bootplane` package's modules log since they moved into layer crates:
/// `(old target prefix, new target prefix)`; see the module doc. `tests/it/tidy.rs` checks
/// that every module `src/lib.rs` re-exports from a crate is here.
pub const MOVED_TARGETS: &[(&str, &str)] = &[
    ("bootplane::model", "bootplane_model"),
    ("bootplane::store", "bootplane_store"),
    ("bootplane::decode", "bootplane_proto::decode"),
    ("bootplane::dhcp", "bootplane_proto::dhcp"),
    ("bootplane::http", "bootplane_proto::http"),
    ("bootplane::ignition", "bootplane_proto::ignition"),
    ("bootplane::image", "bootplane_proto::image"),
    ("bootplane::ipxe", "bootplane_proto::ipxe"),
    ("bootplane::listen", "bootplane_proto::listen"),
    ("bootplane::logging", "bootplane_proto::logging"),
    ("bootplane::net", "bootplane_proto::net"),
    ("bootplane::nfs", "bootplane_proto::nfs"),
    ("bootplane::power", "bootplane_proto::power"),
    ("bootplane::provision", "bootplane_proto::provision"),
    ("bootplane::redfish", "bootplane_proto::redfish"),
    ("bootplane::shutdown", "bootplane_proto::shutdown"),
    ("bootplane::statedir", "bootplane_proto::statedir"),
    ("bootplane::sys", "bootplane_proto::sys"),
    ("bootplane::tftp", "bootplane_proto::tftp"),
    ("bootplane::tls", "bootplane_proto::tls"),
    ("bootplane::controller", "bootplane_controller"),
    ("bootplane::api", "bootplane_api"),
    ("bootplane::cli", "bootplane_cli"),
];

/// The directives of a filter: split at the commas outside `[...]` and `{...}` (a span's
/// field list has commas of its own), trimmed, empty ones left out.
fn directives(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut from) = (Vec::new(), 0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '[' | '{' => depth += 1,
            ']' | '}' => depth -= 1,
            ',' if depth <= 0 => {
                out.push(s[from..i].trim());
                from = i + 1;
            }
            _ => {}
        }
    }
    out.push(s[from..].trim());
    out.retain(|d| !d.is_empty());
    out
}

/// The twins of the directives naming a module by the path it had before it moved into a
/// layer crate (`bootplane::dhcp::leases=debug` → `bootplane_proto::dhcp::leases=debug`).
fn moved_twins(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    for d in directives(s) {
        for (old, new) in MOVED_TARGETS {
            let Some(rest) = d.strip_prefix(old) else {
                continue;
            };
            if rest.is_empty() || ["::", "=", "["].iter().any(|p| rest.starts_with(p)) {
                out.push(format!("{new}{rest}"));
            }
        }
    }
    out
}

/// Parse a filter strictly (an unknown level or a malformed directive is an error, not
/// a directive quietly dropped). A filter made only of bare words naming no level and
/// no `bootplane` module would switch every bootplane log off (`verbose` reads as "the
/// module `verbose`, at trace"): that is refused too.
pub fn parse_filter(s: &str) -> Result<EnvFilter, String> {
    if s.len() > MAX_FILTER_BYTES {
        return Err(format!("longer than {MAX_FILTER_BYTES} bytes"));
    }
    let f = EnvFilter::builder()
        .with_regex(false)
        .parse(s)
        .map_err(|e| format!("{s:?}: {e}"))?;
    let directives: Vec<&str> = s
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .collect();
    let bare = |d: &&str| !d.contains('=') && !d.contains('[');
    let level = |d: &str| LEVELS.contains(&d.to_ascii_lowercase().as_str());
    if directives.is_empty() {
        return Err(format!(
            "{s:?} names no level (expected e.g. info or info,bootplane=debug)"
        ));
    }
    if directives.iter().all(bare)
        && !directives
            .iter()
            .any(|d| level(d) || *d == "bootplane" || d.starts_with("bootplane::"))
    {
        return Err(format!(
            "{s:?} would turn bootplane's logs off: a bare word is a module name; levels are {}",
            LEVELS.join(", ")
        ));
    }
    let twins = moved_twins(s);
    if twins.is_empty() {
        return Ok(f);
    }
    let with_twins = format!("{s},{}", twins.join(","));
    EnvFilter::builder()
        .with_regex(false)
        .parse(&with_twins)
        .map_err(|e| format!("{s:?}: {e}"))
}

/// Replaces the running filter (SIGHUP); cheap to clone.
#[derive(Clone)]
pub struct FilterHandle {
    inner: Option<Arc<reload::Handle<EnvFilter, Registry>>>,
}

impl FilterHandle {
    /// A handle that changes nothing (when tracing was set up elsewhere).
    pub fn none() -> FilterHandle {
        FilterHandle { inner: None }
    }

    /// Install `filter` (checked with [`parse_filter`]) in place of the running one.
    pub fn set(&self, filter: &str) -> Result<(), String> {
        let f = parse_filter(filter)?;
        match &self.inner {
            Some(h) => h.reload(f).map_err(|e| e.to_string()),
            None => Err("no reloadable log filter installed".into()),
        }
    }
}

/// How the process logs.
pub struct Setup<'a> {
    /// The configured filter (`[log] filter`); `RUST_LOG`, when set and valid, wins.
    pub filter: &'a str,
    /// JSON lines instead of text.
    pub json: bool,
}

/// Install the global subscriber on stderr. `RUST_LOG` that does not parse is
/// reported and the configured filter used instead.
pub fn init(s: Setup<'_>) -> FilterHandle {
    let (filter, env_err) = match std::env::var("RUST_LOG") {
        Ok(v) if !v.trim().is_empty() => match parse_filter(&v) {
            Ok(f) => (f, None),
            Err(e) => (fallback(s.filter), Some(e)),
        },
        _ => (fallback(s.filter), None),
    };
    let (filter, handle) = reload::Layer::new(filter);
    let ansi = ansi_on_stderr();
    let registry = tracing_subscriber::registry().with(filter);
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let installed = if s.json {
        registry
            .with(fmt.json().with_ansi(false))
            .try_init()
            .is_ok()
    } else {
        registry.with(fmt.with_ansi(ansi)).try_init().is_ok()
    };
    if let Some(e) = env_err {
        tracing::warn!(error = %e, "RUST_LOG ignored; using log.filter");
    }
    FilterHandle {
        inner: installed.then(|| Arc::new(handle)),
    }
}

/// The configured filter; `info` if it does not parse (`Config::validate` refuses such
/// a config first, so this only guards callers that skipped it).
fn fallback(filter: &str) -> EnvFilter {
    parse_filter(filter).unwrap_or_else(|_| EnvFilter::new("info"))
}

/// Colour when stderr is a terminal and `NO_COLOR` is not set.
pub(crate) fn ansi_on_stderr() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters() {
        for ok in [
            "info",
            "warn,bootplane=debug",
            "bootplane",
            "bootplane::dhcp=trace",
            "off",
            "hyper=debug,info",
        ] {
            assert!(parse_filter(ok).is_ok(), "{ok}");
        }
        for bad in ["verbose", "bootplane=loud", "info,foo=[", "", " , "] {
            assert!(parse_filter(bad).is_err(), "{bad:?}");
        }
        assert!(parse_filter(&"a".repeat(5000)).is_err());
    }

    #[test]
    fn old_module_paths_get_twins() {
        assert_eq!(
            moved_twins("warn,bootplane::dhcp=info, bootplane::tftp::engine=trace,bootplane=debug"),
            [
                "bootplane_proto::dhcp=info",
                "bootplane_proto::tftp::engine=trace"
            ]
        );
        assert_eq!(
            moved_twins("bootplane::store[commit{a=1,b=2}]=debug,bootplane::dhcpx=info"),
            ["bootplane_store[commit{a=1,b=2}]=debug"]
        );
        assert_eq!(moved_twins("bootplane::http"), ["bootplane_proto::http"]);
        assert!(moved_twins("info,bootplane::serve=debug").is_empty());
        assert_eq!(
            moved_twins("bootplane::api::audit=debug"),
            ["bootplane_api::audit=debug"]
        );
        assert_eq!(
            moved_twins("bootplane::controller::bmc=debug"),
            ["bootplane_controller::bmc=debug"]
        );
        assert_eq!(
            directives(" a , b[s{x=1,y=2}]=info,,c "),
            ["a", "b[s{x=1,y=2}]=info", "c"]
        );
        // The filter built with the twins is the one installed: it enables the new target.
        let f = parse_filter("warn,bootplane::dhcp=debug").unwrap();
        let shown = f.to_string();
        assert!(shown.contains("bootplane_proto::dhcp=debug"), "{shown}");
        assert!(shown.contains("bootplane::dhcp=debug"), "{shown}");
    }
}
