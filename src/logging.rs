//! The process's tracing set-up: the `[log] filter` (checked before use, replaceable
//! at run time through a reload layer, so SIGHUP can change it), text or JSON lines on
//! stderr, and ANSI colour only when stderr is a terminal (never in a file, a pipe,
//! the journal or JSON).

use std::io::IsTerminal;
use std::sync::Arc;

use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{reload, EnvFilter, Registry};

/// The levels a filter directive may name.
const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// Most bytes of a filter string (it is echoed in error messages).
const MAX_FILTER_BYTES: usize = 4096;

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
    Ok(f)
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
pub fn ansi_on_stderr() -> bool {
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
}
