//! Image sources: what a source is ([`Source`]), a local path and `http://` (Range
//! requests); `nfs://host/export/path` is [`super::nfs`], and [`super::spec`] picks one for
//! a spec.
//!
//! Every source is read sequentially from an offset (resume starts mid-file), so the
//! interface is "length, and a reader from offset N".

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::time::Duration;

use super::error::{PResult, ProvisionError};

#[allow(clippy::len_without_is_empty)]
pub trait Source: Send + Sync {
    fn describe(&self) -> String;
    /// Total length in bytes when the source knows it.
    fn len(&self) -> Option<u64>;
    /// A sequential reader starting at `offset`.
    fn open_at(&self, offset: u64) -> PResult<Box<dyn Read + Send>>;
}

/// A source spec as it may appear in messages: an `http(s)://` URL loses its
/// `user:password@` and its query (a signed URL's signature), which are credentials;
/// paths and `nfs://` specs carry none and are shown as they are.
pub fn shown(spec: &str) -> String {
    let Some(scheme_end) = spec.find("://") else {
        return spec.to_string();
    };
    if !spec.starts_with("http") {
        return spec.to_string();
    }
    let (head, rest) = spec.split_at(scheme_end + 3);
    let (rest, query) = match rest.split_once('?') {
        Some((r, _)) => (r, "?..."),
        None => (rest, ""),
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    format!("{head}{host}{path}{query}")
}

pub(crate) struct LocalSource {
    path: String,
    len: u64,
}

impl LocalSource {
    pub(crate) fn open(path: &str) -> PResult<Self> {
        let md = std::fs::metadata(path)
            .map_err(|e| ProvisionError::Source(format!("opening {path}: {e}")))?;
        let len = if md.file_type().is_file() {
            md.len()
        } else {
            // A block device as source: its size comes from seeking to the end.
            let mut f = File::open(path)
                .map_err(|e| ProvisionError::Source(format!("opening {path}: {e}")))?;
            f.seek(SeekFrom::End(0))
                .map_err(|e| ProvisionError::Source(format!("sizing {path}: {e}")))?
        };
        Ok(LocalSource {
            path: path.to_string(),
            len,
        })
    }
}

impl Source for LocalSource {
    fn describe(&self) -> String {
        self.path.clone()
    }
    fn len(&self) -> Option<u64> {
        Some(self.len)
    }
    fn open_at(&self, offset: u64) -> PResult<Box<dyn Read + Send>> {
        let mut f = File::open(&self.path)
            .map_err(|e| ProvisionError::Source(format!("opening {}: {e}", self.path)))?;
        f.seek(SeekFrom::Start(offset))
            .map_err(|e| ProvisionError::Source(format!("seeking {}: {e}", self.path)))?;
        Ok(Box::new(f))
    }
}

pub(crate) struct HttpSource {
    url: String,
    /// `url` without credentials, for messages ([`shown`]).
    shown: String,
    agent: ureq::Agent,
    len: Option<u64>,
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(10))
        .timeout_read(Duration::from_secs(60))
        .build()
}

/// `url` is already [`shown`]; a transport error's own text is left out because it
/// repeats the full URL.
fn http_err(url: &str, e: ureq::Error) -> ProvisionError {
    match e {
        ureq::Error::Status(code, _) => {
            ProvisionError::Source(format!("GET {url}: http status {code}"))
        }
        ureq::Error::Transport(t) => {
            let detail = t.message().map(|m| format!(": {m}")).unwrap_or_default();
            ProvisionError::Source(format!("GET {url}: {}{detail}", t.kind()))
        }
    }
}

impl HttpSource {
    pub(crate) fn open(url: &str) -> PResult<Self> {
        let shown = shown(url);
        if url.starts_with("https://") {
            return Err(ProvisionError::Usage(format!(
                "{shown}: this build has no TLS client; serve the image over http:// on the provisioning network or mount it"
            )));
        }
        let agent = agent();
        let resp = agent.head(url).call().map_err(|e| http_err(&shown, e))?;
        let len = resp
            .header("content-length")
            .and_then(|v| v.trim().parse().ok());
        Ok(HttpSource {
            url: url.to_string(),
            shown,
            agent,
            len,
        })
    }

    pub(super) fn fetch_small(url: &str, max: u64) -> PResult<Option<Vec<u8>>> {
        let shown = shown(url);
        match agent().get(url).call() {
            Ok(r) => {
                let mut v = Vec::new();
                r.into_reader()
                    .take(max + 1)
                    .read_to_end(&mut v)
                    .map_err(|e| ProvisionError::Source(format!("reading {shown}: {e}")))?;
                Ok(Some(v))
            }
            Err(ureq::Error::Status(404, _)) => Ok(None),
            Err(e) => Err(http_err(&shown, e)),
        }
    }
}

impl Source for HttpSource {
    fn describe(&self) -> String {
        self.shown.clone()
    }
    fn len(&self) -> Option<u64> {
        self.len
    }
    fn open_at(&self, offset: u64) -> PResult<Box<dyn Read + Send>> {
        let mut req = self.agent.get(&self.url);
        if offset > 0 {
            req = req.set("Range", &format!("bytes={offset}-"));
        }
        let resp = req.call().map_err(|e| http_err(&self.shown, e))?;
        if offset > 0 && resp.status() != 206 {
            return Err(ProvisionError::Source(format!(
                "GET {}: server ignored the range request (status {})",
                self.shown,
                resp.status()
            )));
        }
        Ok(Box::new(resp.into_reader()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_urls_lose_their_credentials() {
        for (spec, want) in [
            (
                "http://u:secret@h:8080/i/disk.img",
                "http://h:8080/i/disk.img",
            ),
            (
                "http://h/i/disk.img?sig=secret&exp=1",
                "http://h/i/disk.img?...",
            ),
            ("https://u@h?sig=secret", "https://h?..."),
            ("http://h/a@b/disk.img", "http://h/a@b/disk.img"),
            (
                "nfs://10.0.0.1/images/disk.img",
                "nfs://10.0.0.1/images/disk.img",
            ),
            ("/var/lib/images/disk.img", "/var/lib/images/disk.img"),
        ] {
            assert_eq!(shown(spec), want, "{spec}");
        }
    }

    #[test]
    fn http_errors_do_not_carry_credentials() {
        // A loopback port nobody listens on: the connection is refused.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("http://user:hunter2@127.0.0.1:{port}/disk.img?sig=s3cr3t");
        let e = HttpSource::open(&url).err().expect("nothing listens there");
        let msg = e.to_string();
        assert!(msg.contains(&format!("127.0.0.1:{port}/disk.img")), "{msg}");
        assert!(!msg.contains("hunter2") && !msg.contains("s3cr3t"), "{msg}");
        let e = HttpSource::fetch_small(&url, 1024).expect_err("nothing listens there");
        let msg = e.to_string();
        assert!(!msg.contains("hunter2") && !msg.contains("s3cr3t"), "{msg}");
    }
}
