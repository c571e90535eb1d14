//! Picks the source for a spec: a local path, `http(s)://` or `nfs://`. The one place that
//! knows every kind: [`super::source`] has the [`Source`] trait and the local and HTTP
//! kinds, [`super::nfs`] the NFS kind, and neither knows the other.

use std::fs::File;
use std::io::Read;
use std::sync::Arc;

use super::error::{PResult, ProvisionError};
use super::nfs::NfsSource;
use super::source::{HttpSource, LocalSource, Source};

/// Open a source by its spec (path or URL).
pub(crate) fn open(spec: &str) -> PResult<Arc<dyn Source>> {
    if spec.starts_with("http://") || spec.starts_with("https://") {
        Ok(Arc::new(HttpSource::open(spec)?))
    } else if spec.starts_with("nfs://") {
        Ok(Arc::new(NfsSource::open(spec)?))
    } else {
        Ok(Arc::new(LocalSource::open(spec)?))
    }
}

/// Read a small object (a manifest) at `spec`; `Ok(None)` when it does not exist.
pub(crate) fn fetch_small(spec: &str, max: u64) -> PResult<Option<Vec<u8>>> {
    if spec.starts_with("http://") || spec.starts_with("https://") {
        return HttpSource::fetch_small(spec, max);
    }
    let src: Arc<dyn Source> = if spec.starts_with("nfs://") {
        match NfsSource::open(spec) {
            Ok(s) => Arc::new(s),
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
