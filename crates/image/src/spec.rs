//! Picks the source for a spec: a local path, `http(s)://`, or a scheme the caller adds
//! ([`Scheme`]: `bootplane-proto`'s `nfs://`). The one place that picks a kind:
//! [`super::source`] has the [`Source`] trait and the local and HTTP kinds, an added
//! scheme its own, and neither knows the other.

use std::fs::File;
use std::io::Read;
use std::sync::Arc;

use super::error::{PResult, ProvisionError};
use super::source::{HttpSource, LocalSource, Source};

/// A source kind added by the caller: specs starting with `prefix` (`"nfs://"`) are
/// opened by `open`, whose `Source` error containing "not found" means there is none.
#[derive(Debug, Clone, Copy)]
pub struct Scheme {
    pub prefix: &'static str,
    pub open: fn(&str) -> PResult<Arc<dyn Source>>,
}

fn added<'a>(spec: &str, schemes: &'a [Scheme]) -> Option<&'a Scheme> {
    schemes.iter().find(|s| spec.starts_with(s.prefix))
}

/// Open a source by its spec (path or URL).
pub(crate) fn open(spec: &str, schemes: &[Scheme]) -> PResult<Arc<dyn Source>> {
    if spec.starts_with("http://") || spec.starts_with("https://") {
        Ok(Arc::new(HttpSource::open(spec)?))
    } else if let Some(s) = added(spec, schemes) {
        (s.open)(spec)
    } else {
        Ok(Arc::new(LocalSource::open(spec)?))
    }
}

/// Read a small object (a manifest, an Ignition config) at `spec`; `Ok(None)` when it
/// does not exist.
pub fn fetch_small(spec: &str, max: u64, schemes: &[Scheme]) -> PResult<Option<Vec<u8>>> {
    if spec.starts_with("http://") || spec.starts_with("https://") {
        return HttpSource::fetch_small(spec, max);
    }
    let src: Arc<dyn Source> = if let Some(s) = added(spec, schemes) {
        match (s.open)(spec) {
            Ok(s) => s,
            Err(ProvisionError::Source(m)) if m.contains("not found") => return Ok(None),
            Err(e) => return Err(e),
        }
    } else {
        match File::open(spec) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            _ => Arc::new(LocalSource::open(spec)?),
        }
    };
    if src.len().is_some_and(|l| l > max) {
        return Err(ProvisionError::Manifest(format!(
            "{spec} is larger than {max} bytes"
        )));
    }
    let mut v = Vec::new();
    src.open_at(0)?
        .take(max + 1)
        .read_to_end(&mut v)
        .map_err(|e| ProvisionError::Source(format!("reading {spec}: {e}")))?;
    Ok(Some(v))
}
