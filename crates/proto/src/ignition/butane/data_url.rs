//! Data URLs for file contents, encoded as butane encodes them: the shortest of a
//! percent-encoded `data:,` URL, a `data:;base64,` URL and (when allowed) gzip + base64,
//! with a bounded cache of the URLs of contents seen on more than one machine.

use base64::Engine;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC};

/// Bytes a percent-encoded data URL leaves as they are: RFC 2396 unreserved characters
/// (`A-Za-z0-9-_.!~*'()`), the same set the Go `dataurl` package butane and Ignition use.
const DATA_URL_KEEP: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'!')
    .remove(b'~')
    .remove(b'*')
    .remove(b'\'')
    .remove(b'(')
    .remove(b')');

/// gzip: inputs up to [`super::super::deflate::MAX_INPUT`] bytes go through the small-input
/// deflate in [`super::super::deflate`] (its cost scales with the input; a general-purpose
/// compressor clears over 128 KiB of tables per call), larger ones through a
/// per-thread reused miniz_oxide state at level 1. The bytes differ from butane's Go
/// gzip at any level; gzip is still kept only when it gives the shorter URL.
/// Header: mtime 0, XFL 4 (fastest), OS 255.
pub(super) fn gzip(data: &[u8]) -> Vec<u8> {
    use flate2::{Compress, Compression, Crc, FlushCompress, Status};
    thread_local! {
        static DEFLATE: std::cell::RefCell<Compress> = std::cell::RefCell::new(Compress::new(Compression::fast(), false));
    }
    let mut out = Vec::with_capacity(data.len() / 2 + 64);
    out.extend_from_slice(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 4, 0xff]);
    if let Some(z) = super::super::deflate::deflate(data) {
        out.extend_from_slice(&z);
    } else {
        DEFLATE.with(|c| {
            let mut c = c.borrow_mut();
            c.reset();
            loop {
                out.reserve(data.len() / 2 + 64);
                let consumed = usize::try_from(c.total_in())
                    .unwrap_or(data.len())
                    .min(data.len());
                match c.compress_vec(&data[consumed..], &mut out, FlushCompress::Finish) {
                    Ok(Status::StreamEnd) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        });
    }
    let mut crc = Crc::new();
    crc.update(data);
    out.extend_from_slice(&crc.sum().to_le_bytes());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out
}

/// Data URLs of file contents encoded before, by SHA-256 of the contents. A template's
/// static files and its `files/` tree are the same on every machine, and a gzip attempt
/// costs a compressor reset (~160 KB of hash tables cleared) even for a short file, so a
/// cold render of a machine re-encodes only what differs from machines rendered before.
/// Bounded two ways: two generations of at most [`URL_CACHE_ENTRIES`] entries and
/// [`URL_CACHE_BYTES`] of URLs each (an approximate LRU: a new generation starts when the
/// current one is full, the older one is dropped, and a hit in the older one is moved
/// to the current one); URLs longer than a quarter of the byte bound are not kept.
/// A URL is kept only when its contents are seen a second time: contents unique to
/// one machine (most templated files) cost a hash and a key, not a copy of the URL
/// (copying every URL made a cold render of 2,000 distinct machines slower).
pub(super) struct UrlCache {
    pub(super) cur: std::collections::HashMap<[u8; 33], (String, &'static str)>,
    pub(super) old: std::collections::HashMap<[u8; 33], (String, &'static str)>,
    pub(super) cur_bytes: usize,
    /// Keys seen once; cleared when it holds [`URL_SEEN_KEYS`].
    pub(super) seen: std::collections::HashSet<[u8; 33]>,
}

pub(super) const URL_SEEN_KEYS: usize = 1 << 16;

pub(super) const URL_CACHE_ENTRIES: usize = 4096;
pub(super) const URL_CACHE_BYTES: usize = 16 << 20;

pub(super) fn url_cache() -> &'static std::sync::Mutex<UrlCache> {
    static C: std::sync::OnceLock<std::sync::Mutex<UrlCache>> = std::sync::OnceLock::new();
    C.get_or_init(|| {
        std::sync::Mutex::new(UrlCache {
            cur: std::collections::HashMap::new(),
            old: std::collections::HashMap::new(),
            cur_bytes: 0,
            seen: std::collections::HashSet::new(),
        })
    })
}

/// `encode(data)` through the [`UrlCache`]; `mode` tells encodings of the same bytes
/// apart (auto gzip / forced gzip).
pub(super) fn cached_url(
    data: &[u8],
    mode: u8,
    encode: impl FnOnce(&[u8]) -> (String, &'static str),
) -> (String, &'static str) {
    use sha2::Digest;
    let mut key = [mode; 33];
    key[..32].copy_from_slice(&sha2::Sha256::digest(data));
    {
        let mut c = url_cache().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = c.cur.get(&key) {
            return v.clone();
        }
        if let Some(v) = c.old.remove(&key) {
            c.cur_bytes += v.0.len();
            c.cur.insert(key, v.clone());
            return v;
        }
    }
    let v = encode(data);
    if v.0.len() <= URL_CACHE_BYTES / 4 {
        let mut c = url_cache().lock().unwrap_or_else(|e| e.into_inner());
        if !c.seen.remove(&key) {
            if c.seen.len() >= URL_SEEN_KEYS {
                c.seen.clear();
            }
            c.seen.insert(key);
            return v;
        }
        if c.cur.len() >= URL_CACHE_ENTRIES || c.cur_bytes + v.0.len() > URL_CACHE_BYTES {
            c.old = std::mem::take(&mut c.cur);
            c.cur_bytes = 0;
        }
        c.cur_bytes += v.0.len();
        c.cur.insert(key, v.clone());
    }
    v
}

/// Encodes contents as a data URL the way butane does: the shortest of percent-encoded
/// and base64, and (when `auto_gzip`) gzip+base64 if that is shorter even after paying
/// for the `gzip` compression value. Returns (url, compression). Contents long enough
/// to need a gzip attempt go through the [`UrlCache`].
pub fn data_url(data: &[u8], auto_gzip: bool) -> (String, &'static str) {
    if auto_gzip && data.len() >= MIN_GZIP_ATTEMPT {
        cached_url(data, 1, |d| encode_data_url(d, true))
    } else {
        encode_data_url(data, auto_gzip)
    }
}

/// Contents shorter than this never get a gzip attempt: their percent-encoded URL is at
/// most 6 + 3 * 13 = 45 bytes long (see [`encode_data_url`]), so they skip the cache.
const MIN_GZIP_ATTEMPT: usize = 14;

pub(super) fn encode_data_url(data: &[u8], auto_gzip: bool) -> (String, &'static str) {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut best = (
        format!(
            "data:,{}",
            percent_encoding::percent_encode(data, DATA_URL_KEEP)
        ),
        "",
    );
    // base64 is 4/3 of the input: only worth computing if it can win.
    if data.len().div_ceil(3) * 4 + 8 < best.0.len() {
        let u = format!("data:;base64,{}", b64.encode(data));
        if u.len() < best.0.len() {
            best = (u, "");
        }
    }
    // The smallest gzip stream is 20 bytes (41 URL characters): skip hopeless cases.
    if auto_gzip && best.0.len() > 45 {
        let gz = gzip(data);
        let len = "data:;base64,".len() + gz.len().div_ceil(3) * 4;
        if len + "gzip".len() < best.0.len() {
            best = (format!("data:;base64,{}", b64.encode(&gz)), "gzip");
        }
    }
    best
}
