//! Static files under `/assets/`: safe path mapping, RFC 9110 conditional and range
//! evaluation (pure), and a response body that streams a file without buffering it.
//!
//! Path safety: the raw, still percent-encoded path is checked before and after one
//! decode: encoded separators (`%2f`, `%5c`), backslashes, NUL, leftover `%` after the
//! decode (double encoding), empty segments (absolute paths, `//`), `.`/`..` and dot
//! files are all refused; the opened file's canonical path must still lie inside the
//! canonical root (symlinks cannot escape). Directories are never listed.
//!
//! Body: [`FileBody`] describes a response as fixed byte parts and file ranges without
//! reading anything. The boot listener's own connection loop ([`super::conn`]) sends
//! file ranges with `sendfile(2)` (the default, [`FileIo::Sendfile`]): the kernel moves
//! page cache pages into the socket, no user-space copy and no mapping, and a file
//! truncated while being sent only ends the response short. As an [`http_body::Body`]
//! (and in the `read` mode) a range is produced as `Bytes` chunks read with `pread` into
//! fresh buffers (one more copy). The chunk size adapts to the number of concurrent
//! streams (a fixed memory budget divided among them, 8 KiB..1 MiB) so resident memory
//! stays bounded.
//!
//! Nothing here maps a file (issue 32): the `mmap` mode mapped a window per chunk, and
//! a file truncated in place under it raised SIGBUS, which kills the whole process,
//! as soon as a chunk was copied in user space (the connection loop batches chunks up
//! to 64 KiB into its output buffer, which many concurrent streams or a small
//! `stream_budget_bytes` make every chunk). `http.file_io = "mmap"` is still accepted
//! and now reads like `read`; a truncated file, in every mode, ends its response short
//! (the connection closes, as the promised length was not met) and the next request
//! is served. `sendfile` remains the default and the fast path.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("path is not allowed")]
    Forbidden,
    #[error("path is not valid utf-8")]
    NotUtf8,
}

/// Map the raw (percent-encoded) path below a route prefix to a safe relative path.
pub fn sanitize(raw: &str) -> Result<String, PathError> {
    let lower = raw.to_ascii_lowercase();
    if raw.is_empty()
        || raw.contains('\\')
        || lower.contains("%2f")
        || lower.contains("%5c")
        || lower.contains("%00")
        || lower.contains("%25")
    {
        return Err(PathError::Forbidden);
    }
    let decoded = percent_encoding::percent_decode_str(raw)
        .decode_utf8()
        .map_err(|_| PathError::NotUtf8)?;
    if decoded.contains(['%', '\\', '\0']) || decoded.chars().any(|c| c.is_control()) {
        return Err(PathError::Forbidden);
    }
    for seg in decoded.split('/') {
        if seg.is_empty() || seg.starts_with('.') {
            return Err(PathError::Forbidden);
        }
    }
    Ok(decoded.into_owned())
}

/// A served root directory, canonicalized once.
#[derive(Debug, Clone)]
pub(crate) struct Root {
    canonical: PathBuf,
}

/// An opened regular file with what the headers need.
#[derive(Debug)]
pub struct OpenFile {
    pub file: File,
    pub meta: FileMeta,
    pub path: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileMeta {
    pub len: u64,
    pub mtime: SystemTime,
    /// Strong validator: `"<mtime secs>-<mtime nanos>-<len>"` in hex.
    pub etag: String,
}

impl FileMeta {
    pub fn new(len: u64, mtime: SystemTime) -> FileMeta {
        let d = mtime.duration_since(UNIX_EPOCH).unwrap_or_default();
        FileMeta {
            len,
            mtime,
            etag: format!("\"{:x}-{:x}-{:x}\"", d.as_secs(), d.subsec_nanos(), len),
        }
    }
    /// `Last-Modified` value (seconds resolution).
    pub fn last_modified(&self) -> String {
        httpdate::fmt_http_date(self.mtime)
    }
}

impl Root {
    pub(crate) fn new(dir: &Path) -> io::Result<Root> {
        Ok(Root {
            canonical: std::fs::canonicalize(dir)?,
        })
    }

    /// Open a sanitized relative path; `Ok(None)` when absent, a directory, or outside the
    /// root after resolving symlinks. Blocking (call from `spawn_blocking`).
    pub(crate) fn open(&self, rel: &str) -> io::Result<Option<OpenFile>> {
        let joined = self.canonical.join(rel);
        let canonical = match std::fs::canonicalize(&joined) {
            Ok(p) => p,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                ) =>
            {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        if !canonical.starts_with(&self.canonical) {
            return Ok(None);
        }
        open_file(canonical)
    }
}

/// Open a trusted path (no root check; for fixed names such as the system iPXE
/// binaries, which Debian ships as symlinks into /boot). `Ok(None)` when absent or not
/// a regular file.
pub(crate) fn open_file(canonical: PathBuf) -> io::Result<Option<OpenFile>> {
    use std::os::unix::fs::OpenOptionsExt as _;
    // O_NONBLOCK: opening a FIFO planted in the tree must not hang; no effect on files.
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&canonical)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let m = file.metadata()?;
    if !m.is_file() {
        return Ok(None);
    }
    Ok(Some(OpenFile {
        file,
        meta: FileMeta::new(m.len(), m.modified().unwrap_or(UNIX_EPOCH)),
        path: canonical,
    }))
}

/// Content type by file extension.
pub(crate) fn content_type(path: &str) -> &'static str {
    let ext = path
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    match ext.as_str() {
        "efi" => "application/efi",
        "ipxe" | "txt" | "cfg" => "text/plain; charset=utf-8",
        "json" | "ign" => "application/json",
        "iso" => "application/x-iso9660-image",
        "html" | "htm" => "text/html; charset=utf-8",
        "sha256" | "sum" => "text/plain; charset=utf-8",
        "gz" => "application/gzip",
        "zst" => "application/zstd",
        "xz" => "application/x-xz",
        _ => "application/octet-stream",
    }
}

/// The request headers that decide the outcome.
#[derive(Debug, Clone, Copy, Default)]
pub struct Conditions<'a> {
    pub if_match: Option<&'a str>,
    pub if_none_match: Option<&'a str>,
    pub if_modified_since: Option<&'a str>,
    pub if_unmodified_since: Option<&'a str>,
    pub range: Option<&'a str>,
    pub if_range: Option<&'a str>,
}

impl<'a> Conditions<'a> {
    /// The conditional and range headers of a request.
    pub(crate) fn of(h: &'a http::HeaderMap) -> Conditions<'a> {
        let get = |n: http::header::HeaderName| h.get(n).and_then(|v| v.to_str().ok());
        Conditions {
            if_match: get(http::header::IF_MATCH),
            if_none_match: get(http::header::IF_NONE_MATCH),
            if_modified_since: get(http::header::IF_MODIFIED_SINCE),
            if_unmodified_since: get(http::header::IF_UNMODIFIED_SINCE),
            range: get(http::header::RANGE),
            if_range: get(http::header::IF_RANGE),
        }
    }
}

/// What to send (inclusive byte ranges).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    Full,
    NotModified,
    PreconditionFailed,
    Partial(Vec<(u64, u64)>),
    Unsatisfiable,
}

/// More ranges than this and the Range header is ignored (full response), which RFC 9110
/// allows and which stops many-tiny-ranges amplification.
pub const MAX_RANGES: usize = 32;

/// RFC 9110 §13.2.2 order of evaluation, then §14 Range. `is_get` false means HEAD
/// (ranges are defined for GET only).
pub fn plan(is_get: bool, c: &Conditions<'_>, meta: &FileMeta) -> Plan {
    // 1. If-Match, else 2. If-Unmodified-Since.
    if let Some(im) = c.if_match {
        if !etag_list_matches(im, &meta.etag, true) {
            return Plan::PreconditionFailed;
        }
    } else if let Some(ius) = c
        .if_unmodified_since
        .and_then(|v| httpdate::parse_http_date(v).ok())
    {
        if secs(meta.mtime) > secs(ius) {
            return Plan::PreconditionFailed;
        }
    }
    // 3. If-None-Match, else 4. If-Modified-Since.
    if let Some(inm) = c.if_none_match {
        if etag_list_matches(inm, &meta.etag, false) {
            return Plan::NotModified;
        }
    } else if let Some(ims) = c
        .if_modified_since
        .and_then(|v| httpdate::parse_http_date(v).ok())
    {
        if secs(meta.mtime) <= secs(ims) {
            return Plan::NotModified;
        }
    }
    // 5. If-Range + Range.
    let Some(range) = c.range.filter(|_| is_get) else {
        return Plan::Full;
    };
    if let Some(ir) = c.if_range {
        let ir = ir.trim();
        let fresh = if ir.starts_with('"') || ir.starts_with("W/") {
            // Strong comparison: a weak tag never matches.
            !ir.starts_with("W/") && ir == meta.etag
        } else {
            httpdate::parse_http_date(ir)
                .map(|d| secs(d) == secs(meta.mtime))
                .unwrap_or(false)
        };
        if !fresh {
            return Plan::Full;
        }
    }
    match parse_range(range, meta.len) {
        RangeSpec::Ignore => Plan::Full,
        RangeSpec::Unsatisfiable => Plan::Unsatisfiable,
        RangeSpec::Ranges(r) => Plan::Partial(r),
    }
}

fn secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn etag_list_matches(list: &str, etag: &str, strong: bool) -> bool {
    let list = list.trim();
    if list == "*" {
        return true;
    }
    let bare = |t: &str| t.trim().trim_start_matches("W/").to_string();
    list.split(',').any(|t| {
        let t = t.trim();
        if strong && t.starts_with("W/") {
            return false;
        }
        bare(t) == bare(etag)
    })
}

#[derive(Debug, PartialEq, Eq)]
enum RangeSpec {
    Ignore,
    Unsatisfiable,
    Ranges(Vec<(u64, u64)>),
}

/// Parse `bytes=a-b, c-, -n` against `len`. Syntax errors and other units are ignored
/// (full response); satisfiable ranges are kept in request order.
fn parse_range(h: &str, len: u64) -> RangeSpec {
    let h = h.trim();
    let Some(set) = h.strip_prefix("bytes=").or_else(|| {
        h.get(..6)
            .filter(|p| p.eq_ignore_ascii_case("bytes="))
            .map(|_| &h[6..])
    }) else {
        return RangeSpec::Ignore;
    };
    let specs: Vec<&str> = set
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if specs.is_empty() || specs.len() > MAX_RANGES {
        return RangeSpec::Ignore;
    }
    let mut out = Vec::new();
    for s in specs {
        let Some((a, b)) = s.split_once('-') else {
            return RangeSpec::Ignore;
        };
        let (a, b) = (a.trim(), b.trim());
        let num = |x: &str| -> Option<u64> {
            if x.is_empty() || x.len() > 19 || !x.bytes().all(|c| c.is_ascii_digit()) {
                None
            } else {
                x.parse().ok()
            }
        };
        if a.is_empty() {
            let Some(n) = num(b) else {
                return RangeSpec::Ignore;
            };
            if n > 0 && len > 0 {
                out.push((len.saturating_sub(n), len - 1));
            }
        } else {
            let Some(first) = num(a) else {
                return RangeSpec::Ignore;
            };
            let last = if b.is_empty() {
                u64::MAX
            } else {
                match num(b) {
                    Some(l) if l >= first => l,
                    _ => return RangeSpec::Ignore,
                }
            };
            if first < len {
                out.push((first, last.min(len - 1)));
            }
        }
    }
    if out.is_empty() {
        RangeSpec::Unsatisfiable
    } else {
        RangeSpec::Ranges(out)
    }
}

/// How file data reaches the socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileIo {
    /// `sendfile(2)` from the page cache straight into the socket (the boot listener's
    /// connection loop); a plain [`Body`] consumer gets `pread` chunks instead.
    Sendfile,
    /// Formerly memory-mapped windows; now the same as [`FileIo::Read`] (a mapping of a
    /// file truncated under it faults the process, see the module doc).
    Mmap,
    /// `pread` into fresh buffers.
    Read,
}

/// Shared between all streams: adapts the chunk size to the number of streams.
#[derive(Debug)]
pub(crate) struct StreamBudget {
    active: AtomicUsize,
    budget: usize,
    io: FileIo,
    /// Body bytes handed to hyper, all streams.
    pub bytes_out: AtomicU64,
}

pub(crate) const MIN_CHUNK: usize = 8 << 10;
pub(crate) const MAX_CHUNK: usize = 1 << 20;

impl StreamBudget {
    pub(crate) fn new(budget_bytes: usize, io: FileIo) -> StreamBudget {
        StreamBudget {
            active: AtomicUsize::new(0),
            budget: budget_bytes,
            io,
            bytes_out: AtomicU64::new(0),
        }
    }
    pub(crate) fn active(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }
    fn chunk(&self) -> usize {
        let per = self.budget / self.active().max(1);
        per.clamp(MIN_CHUNK, MAX_CHUNK) & !4095
    }
}

enum Part {
    Data(Bytes),
    File { pos: u64, end: u64 },
}

/// A response body: fixed bytes and file ranges, streamed in order.
pub struct FileBody {
    parts: VecDeque<Part>,
    file: Option<Arc<File>>,
    remaining: u64,
    budget: Option<Arc<StreamBudget>>,
}

impl FileBody {
    pub(crate) fn empty() -> FileBody {
        FileBody {
            parts: VecDeque::new(),
            file: None,
            remaining: 0,
            budget: None,
        }
    }

    pub(crate) fn bytes(b: impl Into<Bytes>) -> FileBody {
        let b = b.into();
        let remaining = b.len() as u64;
        let mut parts = VecDeque::new();
        if !b.is_empty() {
            parts.push_back(Part::Data(b));
        }
        FileBody {
            parts,
            file: None,
            remaining,
            budget: None,
        }
    }

    /// One inclusive range of `file`.
    pub(crate) fn range(file: File, start: u64, end: u64, budget: Arc<StreamBudget>) -> FileBody {
        let mut parts = VecDeque::new();
        parts.push_back(Part::File {
            pos: start,
            end: end + 1,
        });
        FileBody::with_parts(parts, file, budget)
    }

    /// `multipart/byteranges` over inclusive `ranges`; returns the body and its boundary.
    pub(crate) fn multipart(
        file: File,
        ranges: &[(u64, u64)],
        len: u64,
        content_type: &str,
        budget: Arc<StreamBudget>,
    ) -> (FileBody, String) {
        let boundary = format!("bootplane-{:016x}", rand::random::<u64>());
        let mut parts = VecDeque::new();
        for &(s, e) in ranges {
            let head = format!("\r\n--{boundary}\r\nContent-Type: {content_type}\r\nContent-Range: bytes {s}-{e}/{len}\r\n\r\n");
            parts.push_back(Part::Data(Bytes::from(head)));
            parts.push_back(Part::File { pos: s, end: e + 1 });
        }
        parts.push_back(Part::Data(Bytes::from(format!("\r\n--{boundary}--\r\n"))));
        (FileBody::with_parts(parts, file, budget), boundary)
    }

    fn with_parts(parts: VecDeque<Part>, file: File, budget: Arc<StreamBudget>) -> FileBody {
        let remaining = parts
            .iter()
            .map(|p| match p {
                Part::Data(b) => b.len() as u64,
                Part::File { pos, end } => end - pos,
            })
            .sum();
        budget.active.fetch_add(1, Ordering::Relaxed);
        FileBody {
            parts,
            file: Some(Arc::new(file)),
            remaining,
            budget: Some(budget),
        }
    }

    fn next_chunk(&mut self) -> Option<io::Result<Bytes>> {
        loop {
            let part = self.parts.front_mut()?;
            match part {
                Part::Data(_) => {
                    let Some(Part::Data(b)) = self.parts.pop_front() else {
                        unreachable!()
                    };
                    return Some(Ok(b));
                }
                Part::File { pos, end } => {
                    if *pos >= *end {
                        self.parts.pop_front();
                        continue;
                    }
                    let (Some(file), Some(budget)) = (&self.file, &self.budget) else {
                        return Some(Err(io::Error::other("file part without a file")));
                    };
                    let want = ((*end - *pos) as usize).min(budget.chunk());
                    let res = read_window(file, *pos, want);
                    return Some(res.and_then(|b| {
                        if b.is_empty() {
                            // The file shrank under us: end the body short (hyper then
                            // closes the connection since Content-Length was not met).
                            Err(io::Error::new(
                                io::ErrorKind::UnexpectedEof,
                                "file shrank while being served",
                            ))
                        } else {
                            *pos += b.len() as u64;
                            Ok(b)
                        }
                    }));
                }
            }
        }
    }
}

/// A body piece for writers that bypass [`Body`] (see [`super::conn`]).
pub enum RawPart {
    Data(Bytes),
    /// Bytes `pos..end` of [`FileBody::file`].
    File {
        pos: u64,
        end: u64,
    },
}

impl FileBody {
    /// True when file parts should go out by `sendfile(2)` ([`FileIo::Sendfile`]).
    pub(crate) fn wants_sendfile(&self) -> bool {
        self.budget
            .as_ref()
            .is_some_and(|b| b.io == FileIo::Sendfile)
    }

    /// The file that [`RawPart::File`] pieces refer to.
    pub fn file(&self) -> Option<&Arc<File>> {
        self.file.as_ref()
    }

    /// Take the next piece without reading file data (for a `sendfile` writer).
    pub fn pop_part(&mut self) -> Option<RawPart> {
        let p = match self.parts.pop_front()? {
            Part::Data(b) => RawPart::Data(b),
            Part::File { pos, end } => RawPart::File { pos, end },
        };
        Some(p)
    }

    /// Next chunk of data (file parts read or mapped per [`FileIo`]); `None` at the end.
    pub(crate) fn next_data(&mut self) -> Option<io::Result<Bytes>> {
        let r = self.next_chunk();
        if let Some(Ok(b)) = &r {
            self.sent(b.len() as u64);
        }
        r
    }

    /// Account `n` body bytes as written.
    pub(crate) fn sent(&mut self, n: u64) {
        self.remaining = self.remaining.saturating_sub(n);
        if let Some(budget) = &self.budget {
            budget.bytes_out.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Body bytes not yet produced.
    pub fn remaining(&self) -> u64 {
        self.remaining
    }
}

fn read_window(file: &File, pos: u64, len: usize) -> io::Result<Bytes> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; len];
    let mut filled = 0;
    while filled < len {
        match file.read_at(&mut buf[filled..], pos + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(filled);
    Ok(Bytes::from(buf))
}

impl Drop for FileBody {
    fn drop(&mut self) {
        if let Some(b) = &self.budget {
            b.active.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Body for FileBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = self.get_mut();
        match this.next_chunk() {
            None => Poll::Ready(None),
            Some(Ok(b)) => {
                this.sent(b.len() as u64);
                Poll::Ready(Some(Ok(Frame::data(b))))
            }
            Some(Err(e)) => {
                this.parts.clear();
                Poll::Ready(Some(Err(e)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.parts.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> FileMeta {
        FileMeta::new(
            1000,
            UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000),
        )
    }

    #[test]
    fn traversal_in_every_encoding_is_refused() {
        for bad in [
            "../etc/passwd",
            "a/../../etc/passwd",
            "%2e%2e/etc/passwd",
            "%2E%2E/etc/passwd",
            ".%2e/x",
            "a%2f..%2fb",
            "a%2F..%2Fb",
            "..%5cwindows",
            "..\\x",
            "%252e%252e/x",
            "%25%32%65",
            "/etc/passwd",
            "a//b",
            "a/./b",
            ".hidden",
            "a/",
            "",
            "a%00b",
            "%c0%ae%c0%ae/x",
            "a%0ab",
        ] {
            assert!(sanitize(bad).is_err(), "{bad} accepted");
        }
        assert_eq!(
            sanitize("images/os-image/vmlinuz").unwrap(),
            "images/os-image/vmlinuz"
        );
        assert_eq!(sanitize("a%20b.efi").unwrap(), "a b.efi");
    }

    #[test]
    fn ranges_per_rfc9110() {
        let m = meta();
        let p = |r: &str| {
            plan(
                true,
                &Conditions {
                    range: Some(r),
                    ..Default::default()
                },
                &m,
            )
        };
        assert_eq!(p("bytes=0-99"), Plan::Partial(vec![(0, 99)]));
        assert_eq!(p("bytes=900-"), Plan::Partial(vec![(900, 999)]));
        assert_eq!(p("bytes=-100"), Plan::Partial(vec![(900, 999)]));
        assert_eq!(p("bytes=-5000"), Plan::Partial(vec![(0, 999)]));
        assert_eq!(p("bytes=990-2000"), Plan::Partial(vec![(990, 999)]));
        assert_eq!(p("bytes=0-0,-1"), Plan::Partial(vec![(0, 0), (999, 999)]));
        assert_eq!(p("bytes=1000-"), Plan::Unsatisfiable);
        assert_eq!(p("bytes=-0"), Plan::Unsatisfiable);
        assert_eq!(p("bytes=5-1"), Plan::Full);
        assert_eq!(p("items=0-1"), Plan::Full);
        assert_eq!(p("bytes=abc"), Plan::Full);
        let many = format!(
            "bytes={}",
            (0..40)
                .map(|i| format!("{i}-{i}"))
                .collect::<Vec<_>>()
                .join(",")
        );
        assert_eq!(p(&many), Plan::Full);
        // HEAD ignores Range.
        assert_eq!(
            plan(
                false,
                &Conditions {
                    range: Some("bytes=0-1"),
                    ..Default::default()
                },
                &m
            ),
            Plan::Full
        );
    }

    #[test]
    fn conditionals_per_rfc9110() {
        let m = meta();
        let lm = m.last_modified();
        let weak = format!("W/{}", m.etag);
        let d = Conditions::default;
        let c = |c: Conditions<'_>| plan(true, &c, &m);
        assert_eq!(
            c(Conditions {
                if_none_match: Some(&m.etag),
                ..d()
            }),
            Plan::NotModified
        );
        assert_eq!(
            c(Conditions {
                if_none_match: Some("\"x\", W/\"y\""),
                ..d()
            }),
            Plan::Full
        );
        assert_eq!(
            c(Conditions {
                if_none_match: Some(&weak),
                ..d()
            }),
            Plan::NotModified
        );
        assert_eq!(
            c(Conditions {
                if_none_match: Some("*"),
                ..d()
            }),
            Plan::NotModified
        );
        assert_eq!(
            c(Conditions {
                if_modified_since: Some(&lm),
                ..d()
            }),
            Plan::NotModified
        );
        assert_eq!(
            c(Conditions {
                if_modified_since: Some("Sun, 06 Nov 1994 08:49:37 GMT"),
                ..d()
            }),
            Plan::Full
        );
        // If-None-Match wins over If-Modified-Since.
        assert_eq!(
            c(Conditions {
                if_none_match: Some("\"other\""),
                if_modified_since: Some(&lm),
                ..d()
            }),
            Plan::Full
        );
        assert_eq!(
            c(Conditions {
                if_match: Some("\"other\""),
                ..d()
            }),
            Plan::PreconditionFailed
        );
        assert_eq!(
            c(Conditions {
                if_match: Some(&weak),
                ..d()
            }),
            Plan::PreconditionFailed
        );
        assert_eq!(
            c(Conditions {
                if_match: Some(&m.etag),
                ..d()
            }),
            Plan::Full
        );
        assert_eq!(
            c(Conditions {
                if_unmodified_since: Some("Sun, 06 Nov 1994 08:49:37 GMT"),
                ..d()
            }),
            Plan::PreconditionFailed
        );
        // If-Range: matching validator -> partial; stale or weak -> full.
        let r = Some("bytes=0-9");
        assert_eq!(
            c(Conditions {
                range: r,
                if_range: Some(&m.etag),
                ..d()
            }),
            Plan::Partial(vec![(0, 9)])
        );
        assert_eq!(
            c(Conditions {
                range: r,
                if_range: Some("\"stale\""),
                ..d()
            }),
            Plan::Full
        );
        assert_eq!(
            c(Conditions {
                range: r,
                if_range: Some(&lm),
                ..d()
            }),
            Plan::Partial(vec![(0, 9)])
        );
        assert_eq!(
            c(Conditions {
                range: r,
                if_range: Some(&weak),
                ..d()
            }),
            Plan::Full
        );
    }

    #[test]
    fn content_types() {
        assert_eq!(content_type("ipxe.efi"), "application/efi");
        assert_eq!(content_type("SNPONLY.EFI"), "application/efi");
        assert_eq!(content_type("undionly.kpxe"), "application/octet-stream");
        assert_eq!(content_type("vmlinuz"), "application/octet-stream");
    }

    async fn collect(mut b: FileBody) -> Vec<u8> {
        use http_body_util::BodyExt;
        let mut out = Vec::new();
        while let Some(f) = b.frame().await {
            out.extend_from_slice(f.unwrap().data_ref().unwrap());
        }
        out
    }

    #[tokio::test]
    async fn bodies_stream_exact_bytes_in_both_modes() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(dir.path().join("f"), &data).unwrap();
        for io in [FileIo::Mmap, FileIo::Read] {
            let budget = Arc::new(StreamBudget::new(1 << 20, io));
            let f = File::open(dir.path().join("f")).unwrap();
            let b = FileBody::range(f, 5, 2_999_990, budget.clone());
            assert_eq!(b.size_hint().exact(), Some(2_999_986));
            assert_eq!(budget.active(), 1);
            assert_eq!(collect(b).await, &data[5..=2_999_990]);
            assert_eq!(budget.active(), 0);
            let f = File::open(dir.path().join("f")).unwrap();
            let (b, boundary) =
                FileBody::multipart(f, &[(0, 1), (10, 12)], 3_000_000, "x/y", budget.clone());
            let n = b.size_hint().exact().unwrap();
            let out = collect(b).await;
            assert_eq!(out.len() as u64, n);
            let s = String::from_utf8_lossy(&out);
            assert!(s.contains(&format!("--{boundary}\r\nContent-Type: x/y\r\nContent-Range: bytes 10-12/3000000\r\n\r\n")), "{s}");
            assert!(s.ends_with(&format!("--{boundary}--\r\n")));
        }
    }

    #[test]
    fn root_refuses_symlink_escape_and_dirs() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(dir.path().join("secret"), b"s").unwrap();
        std::fs::write(root.join("ok"), b"ok").unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret"), root.join("link")).unwrap();
        let r = Root::new(&root).unwrap();
        assert!(r.open("ok").unwrap().is_some());
        assert!(r.open("link").unwrap().is_none());
        assert!(r.open("sub").unwrap().is_none());
        assert!(r.open("missing").unwrap().is_none());
    }
}
