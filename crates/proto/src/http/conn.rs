//! One boot-listener connection: a small HTTP/1.1 server loop of our own (request heads
//! parsed by `httparse`, the parser hyper uses), so that file bodies can go out with
//! `sendfile(2)` straight from the page cache to the socket.
//!
//! Why not hyper here: hyper owns the socket and only accepts bodies as a stream of
//! buffers, so every byte of a 1 GiB image would be copied from the page cache into the
//! socket by `write` (from a mapping or a buffer), costing about 2.7x nginx's CPU per
//! GiB. hyper can hand the socket back only for protocol upgrades. The boot listener
//! needs a small part of HTTP/1.1 (GET and HEAD, no request bodies, no chunked
//! responses, no trailers), so the loop is short; in return it also answers small
//! responses (iPXE scripts) with one `write` of head and body together, and batches
//! pipelined responses into one write.
//!
//! What it does, bounded throughout:
//! - request heads up to `max_header_bytes` (431 beyond), at most [`MAX_HEADERS`]
//!   header fields (431), malformed heads get 400; each of these closes the connection;
//! - a request's first byte must arrive within `idle_timeout` of the accept or of the
//!   previous response, and its head must be complete within `header_read_timeout` of
//!   that first byte: idle and slow clients are closed. (Two bounds, because a client
//!   that is busy, e.g. still reading a large response that our last `sendfile` only
//!   queued, or one that has many connections to open, may start its next request late
//!   without being slow once it has started; nginx waits 60 s for that first byte);
//!   the timer is the listener's shared [`crate::listen::Watchdog`], which also ends a
//!   connection evicted (while idle) to make room for another client;
//! - requests that carry a body (`Content-Length` > 0 or `Transfer-Encoding`) are
//!   answered (the handler refuses every method but GET and HEAD) and the connection
//!   is closed, so a body is never mistaken for the next request; the one exception is
//!   the discovery agent's inventory post ([`super::discovery`]): its body is read when
//!   it has a `Content-Length` of at most [`super::discovery::MAX_INVENTORY_BYTES`]
//!   (413 beyond, 411 for a chunked one), the post passes the checks that need no body
//!   (the Server, its address or token, its state: else it is refused unread) and
//!   the body arrives within [`super::discovery::BODY_TIMEOUT`];
//! - keep-alive per RFC 9112 §9.3 (HTTP/1.1 unless `Connection: close`; HTTP/1.0 only
//!   with `Connection: keep-alive`);
//! - a write that makes no progress for [`WRITE_STALL`] closes the connection, and so
//!   does a response whose average rate, counted after `send_rate_grace`, falls below
//!   `min_send_rate` (as TFTP's `min_rate_bytes_per_sec`; checked only when the socket
//!   is full, from the response's start and bytes sent: O(1), nothing per chunk but an
//!   add and a relaxed store of the count on the slot, where the listener's evictor
//!   reads it to close a response below `slow_send_rate` for a new client);
//! - on shutdown, idle connections close at once and a response being written finishes
//!   (the caller bounds that by the drain timeout).

use std::io;
use std::mem::MaybeUninit;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::time::{Duration, SystemTime};

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, StatusCode, Uri, Version};
use tokio::io::{AsyncReadExt, Interest};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::files::{FileBody, RawPart};
use super::settings::Limits;
use super::BootHttp;
use crate::listen::{Expiry, Slot, SlowRate, Watchdog};
use crate::shutdown::Shutdown;

/// More header fields than this get 431 (hyper's default too).
pub(crate) const MAX_HEADERS: usize = 100;
/// A response write that makes no progress for this long closes the connection.
pub(crate) const WRITE_STALL: Duration = Duration::from_secs(60);
/// Largest `sendfile` call; the task yields to others between calls when its budget
/// is spent, so one fast download cannot starve the worker.
const SENDFILE_MAX: usize = 8 << 20;
/// Responses are collected in the output buffer up to this size before writing, so a
/// pipelined batch of script requests costs one `write`.
const OUT_BATCH: usize = 64 << 10;

/// Why a connection ended early.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnError {
    #[error("request head not completed within the header read timeout")]
    HeaderTimeout,
    #[error("no request within the idle timeout")]
    IdleTimeout,
    #[error("malformed request head ({0})")]
    Malformed(StatusCode),
    #[error("client stopped reading for {WRITE_STALL:?}")]
    WriteStall,
    #[error("response sent below the minimum rate")]
    TooSlow,
    #[error("slow response closed to make room for a new connection")]
    Evicted,
    #[error("file shrank while being served")]
    FileShrank,
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// A parsed request plus what the loop needs to know about the connection.
pub struct Head {
    pub req: Request<()>,
    pub keep_alive: bool,
    pub has_body: bool,
    /// The `Content-Length`, when given.
    pub content_length: Option<u64>,
    /// A `Transfer-Encoding` was given.
    pub chunked: bool,
}

/// Serve requests on `stream` until the client closes, an error, eviction or shutdown.
/// `admitted` is the connection's place in the listener's table: its watchdog bounds
/// the wait for a request (idle and header read timeouts) and ends the connection when
/// it is evicted, and the connection reports on it when a head starts and while a
/// request is being answered.
pub(crate) async fn serve(
    mut stream: TcpStream,
    client: IpAddr,
    app: &BootHttp,
    limits: &Limits,
    shutdown: &mut Shutdown,
    admitted: &crate::listen::Conn,
) -> Result<(), ConnError> {
    let mut rbuf = BytesMut::with_capacity(4096);
    let mut out = BytesMut::with_capacity(4096);
    let slot = admitted.slot();
    // Waiting for a request: up to `idle_timeout` for its first byte (after the accept
    // and between keep-alive requests), then up to `header_read_timeout` for the rest
    // of the head; one lazily moved timer per connection. While a response is written
    // it reports an eviction.
    let mut pace = Pace {
        watchdog: admitted.watchdog(),
        slot: slot.clone(),
        min: limits.min_rate(),
        t0: Instant::now(),
        sent: 0,
    };
    let mut head_started = false;
    let stop = shutdown.recv();
    tokio::pin!(stop);
    loop {
        let head = match parse(&mut rbuf) {
            Ok(Some(h)) => h,
            Ok(None) => {
                if rbuf.len() >= limits.max_header_bytes {
                    return fail(
                        &stream,
                        &mut out,
                        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                        &mut pace,
                    )
                    .await;
                }
                flush(&stream, &mut out, false, &mut pace).await?;
                if rbuf.capacity() - rbuf.len() < 1024 {
                    rbuf.reserve(4096);
                }
                if !head_started && !rbuf.is_empty() {
                    slot.head_started();
                    head_started = true;
                }
                tokio::select! {
                    biased;
                    r = stream.read_buf(&mut rbuf) => {
                        if r? == 0 {
                            return Ok(());
                        }
                    }
                    why = &mut pace.watchdog => return match why {
                        Expiry::Header => Err(ConnError::HeaderTimeout),
                        Expiry::Idle => Err(ConnError::IdleTimeout),
                        Expiry::Evicted => Ok(()),
                    },
                    _ = &mut stop => return Ok(()),
                }
                continue;
            }
            Err(status) => return fail(&stream, &mut out, status, &mut pace).await,
        };
        if !slot.begin() {
            // Evicted while the head arrived: the slot is someone else's now.
            return Ok(());
        }
        pace.start();
        let Head {
            req,
            keep_alive,
            mut has_body,
            content_length,
            chunked,
        } = head;
        let is_head = req.method() == Method::HEAD;
        let mut body = Bytes::new();
        if has_body && super::discovery::takes_body(req.method(), req.uri().path()) {
            let len = content_length.unwrap_or(0) as usize;
            if chunked || len > super::discovery::MAX_INVENTORY_BYTES {
                let path = req.uri().path();
                let family = if path.starts_with(super::respond::WIPE_PREFIX) {
                    &app.metrics().wipe
                } else if path.starts_with(super::respond::INSTALL_PREFIX) {
                    &app.metrics().install
                } else {
                    &app.metrics().inventory
                };
                family
                    .get_or_create(&super::metrics::ResultLabels {
                        result: "too_large",
                    })
                    .inc();
                let status = if chunked {
                    StatusCode::LENGTH_REQUIRED
                } else {
                    StatusCode::PAYLOAD_TOO_LARGE
                };
                return fail(&stream, &mut out, status, &mut pace).await;
            }
            // Who may post is known from the head: anyone else is answered without the
            // body being read (it stays `has_body`, so the connection then closes).
            if app.agent_may_post(req.uri().path(), client) {
                body = read_body(&mut stream, &mut rbuf, len).await?;
                has_body = false;
            }
        }
        let close = !keep_alive || has_body;
        let resp = app.handle_with_body(req, body, client).await;
        let (parts, mut body) = resp.into_parts();
        // A HEAD is answered with the length its GET would have (RFC 9110, 9.3.2).
        write_head(&mut out, &parts, body.remaining(), close);
        if !is_head {
            write_body(&stream, &mut out, &mut body, &mut pace).await?;
        }
        drop(body);
        if close {
            flush(&stream, &mut out, false, &mut pace).await?;
            if has_body {
                linger(&stream).await;
            }
            return Ok(());
        }
        if out.len() >= OUT_BATCH {
            flush(&stream, &mut out, false, &mut pace).await?;
        }
        slot.end();
        head_started = false;
    }
}

/// Read a request body of `len` bytes (part may already be in `rbuf`), within
/// [`super::discovery::BODY_TIMEOUT`].
async fn read_body(
    stream: &mut TcpStream,
    rbuf: &mut BytesMut,
    len: usize,
) -> Result<Bytes, ConnError> {
    let read = async {
        while rbuf.len() < len {
            rbuf.reserve(len - rbuf.len());
            if stream.read_buf(rbuf).await? == 0 {
                return Err(ConnError::Io(io::ErrorKind::UnexpectedEof.into()));
            }
        }
        Ok(rbuf.split_to(len).freeze())
    };
    match tokio::time::timeout(super::discovery::BODY_TIMEOUT, read).await {
        Ok(r) => r,
        Err(_) => Err(ConnError::HeaderTimeout),
    }
}

/// Parse one request head from the front of `buf` (consumed); `Ok(None)` when
/// incomplete, `Err` with the status to answer when malformed.
pub fn parse(buf: &mut BytesMut) -> Result<Option<Head>, StatusCode> {
    if buf.is_empty() {
        return Ok(None);
    }
    let len = {
        let mut hdrs = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
        let mut r = httparse::Request::new(&mut []);
        match r.parse_with_uninit_headers(buf, &mut hdrs) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => {
                return Err(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE)
            }
            Err(_) => return Err(StatusCode::BAD_REQUEST),
        }
    };
    // Parse again over the frozen head so the URI and header values can share its
    // memory instead of being copied (a second pass over a few hundred bytes is cheaper
    // than the allocations).
    let bytes = buf.split_to(len).freeze();
    let mut hdrs = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut r = httparse::Request::new(&mut []);
    if !matches!(
        r.parse_with_uninit_headers(&bytes, &mut hdrs),
        Ok(httparse::Status::Complete(_))
    ) {
        return Err(StatusCode::BAD_REQUEST);
    }
    let bad = StatusCode::BAD_REQUEST;
    let method = Method::from_bytes(r.method.unwrap_or("").as_bytes()).map_err(|_| bad)?;
    let target = r.path.unwrap_or("");
    let uri = Uri::from_maybe_shared(bytes.slice_ref(target.as_bytes())).map_err(|_| bad)?;
    let version = match r.version {
        Some(0) => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    let mut headers = HeaderMap::with_capacity(r.headers.len());
    let (mut close, mut ka, mut has_body, mut chunked) = (false, false, false, false);
    let mut content_length: Option<u64> = None;
    for h in r.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes()).map_err(|_| bad)?;
        let value = HeaderValue::from_maybe_shared(bytes.slice_ref(h.value)).map_err(|_| bad)?;
        if name == header::CONNECTION {
            for t in h.value.split(|b| *b == b',') {
                let t = t.trim_ascii();
                close |= t.eq_ignore_ascii_case(b"close");
                ka |= t.eq_ignore_ascii_case(b"keep-alive");
            }
        } else if name == header::CONTENT_LENGTH {
            let n = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or(bad)?;
            if content_length.is_some_and(|c| c != n) {
                return Err(bad);
            }
            content_length = Some(n);
            has_body |= n > 0;
        } else if name == header::TRANSFER_ENCODING {
            has_body = true;
            chunked = true;
        }
        headers.append(name, value);
    }
    let keep_alive = match version {
        Version::HTTP_10 => ka && !close,
        _ => !close,
    };
    let mut req = Request::new(());
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    *req.version_mut() = version;
    *req.headers_mut() = headers;
    Ok(Some(Head {
        req,
        keep_alive,
        has_body,
        content_length,
        chunked,
    }))
}

/// Status line, the handler's headers (title case, as firmware HTTP stacks expect
/// from nginx and others), `Content-Length` when the handler gave none, `Date`.
fn write_head(out: &mut BytesMut, parts: &http::response::Parts, body_len: u64, close: bool) {
    out.put_slice(b"HTTP/1.1 ");
    out.put_slice(parts.status.as_str().as_bytes());
    out.put_u8(b' ');
    out.put_slice(
        parts
            .status
            .canonical_reason()
            .unwrap_or("Unknown")
            .as_bytes(),
    );
    out.put_slice(b"\r\n");
    for (name, value) in parts.headers.iter() {
        put_title_case(out, name.as_str().as_bytes());
        out.put_slice(b": ");
        out.put_slice(value.as_bytes());
        out.put_slice(b"\r\n");
    }
    let bodiless = parts.status.is_informational()
        || parts.status == StatusCode::NO_CONTENT
        || parts.status == StatusCode::NOT_MODIFIED;
    if !bodiless && !parts.headers.contains_key(header::CONTENT_LENGTH) {
        out.put_slice(b"Content-Length: ");
        out.put_slice(itoa(body_len, &mut [0u8; 20]));
        out.put_slice(b"\r\n");
    }
    out.put_slice(b"Date: ");
    DATE.with(|d| out.put_slice(&d.borrow_mut().now()));
    out.put_slice(b"\r\n");
    if close {
        out.put_slice(b"Connection: close\r\n");
    }
    out.put_slice(b"\r\n");
}

fn put_title_case(out: &mut BytesMut, name: &[u8]) {
    let mut upper = true;
    for &b in name {
        out.put_u8(if upper { b.to_ascii_uppercase() } else { b });
        upper = b == b'-';
    }
}

/// `n` in decimal, written into `buf` (no allocation: every response head uses it).
fn itoa(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}

/// The `Date` value, formatted once per second per thread.
struct DateCache {
    secs: u64,
    text: [u8; 29],
}

impl DateCache {
    fn now(&mut self) -> [u8; 29] {
        let now = SystemTime::now();
        let secs = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        if secs != self.secs {
            let s = httpdate::fmt_http_date(now);
            if s.len() == 29 {
                self.text.copy_from_slice(s.as_bytes());
                self.secs = secs;
            }
        }
        self.text
    }
}

thread_local! {
    static DATE: std::cell::RefCell<DateCache> = const {
        std::cell::RefCell::new(DateCache { secs: 0, text: *b"Thu, 01 Jan 1970 00:00:00 GMT" })
    };
}

/// Append data parts to `out` (written in one go with the head); file parts go by
/// `sendfile` after the head, or by chunks in `mmap`/`read` mode.
async fn write_body(
    stream: &TcpStream,
    out: &mut BytesMut,
    body: &mut FileBody,
    pace: &mut Pace,
) -> Result<(), ConnError> {
    if !body.wants_sendfile() {
        while let Some(chunk) = body.next_data() {
            let chunk = chunk.map_err(|e| {
                if e.kind() == io::ErrorKind::UnexpectedEof {
                    ConnError::FileShrank
                } else {
                    ConnError::Io(e)
                }
            })?;
            put_or_write(stream, out, chunk, pace).await?;
        }
        return Ok(());
    }
    while let Some(part) = body.pop_part() {
        match part {
            RawPart::Data(b) => {
                body.sent(b.len() as u64);
                put_or_write(stream, out, b, pace).await?;
            }
            RawPart::File { pos, end } => {
                // The head (or multipart header) first, marked as more to come so the
                // kernel packs it with the file's first bytes.
                flush(stream, out, true, pace).await?;
                let Some(file) = body.file().cloned() else {
                    return Err(io::Error::other("file part without a file").into());
                };
                send_file(stream, &file, pos, end, body, pace).await?;
            }
        }
    }
    Ok(())
}

async fn put_or_write(
    stream: &TcpStream,
    out: &mut BytesMut,
    b: Bytes,
    pace: &mut Pace,
) -> Result<(), ConnError> {
    if out.len() + b.len() <= OUT_BATCH {
        out.put_slice(&b);
        Ok(())
    } else {
        flush(stream, out, false, pace).await?;
        write_all(stream, &b, false, pace).await
    }
}

async fn flush(
    stream: &TcpStream,
    out: &mut BytesMut,
    more: bool,
    pace: &mut Pace,
) -> Result<(), ConnError> {
    if out.is_empty() {
        return Ok(());
    }
    let r = write_all(stream, out, more, pace).await;
    out.clear();
    r
}

/// `send` until done; waits (bounded by [`WRITE_STALL`] and the minimum rate) only
/// when the socket is full.
async fn write_all(
    stream: &TcpStream,
    mut buf: &[u8],
    more: bool,
    pace: &mut Pace,
) -> Result<(), ConnError> {
    let fd = stream.as_raw_fd();
    let flags = libc::MSG_NOSIGNAL | if more { libc::MSG_MORE } else { 0 };
    while !buf.is_empty() {
        let r = stream.try_io(Interest::WRITABLE, || {
            // SAFETY: `buf` is a live slice; `fd` is the stream's open socket.
            let n = unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), flags) };
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        });
        match r {
            Ok(n) => {
                buf = &buf[n..];
                pace.sent(n as u64);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_writable(stream, pace).await?,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// `sendfile(2)` bytes `pos..end` of `file` to the socket.
async fn send_file(
    stream: &TcpStream,
    file: &std::fs::File,
    mut pos: u64,
    end: u64,
    body: &mut FileBody,
    pace: &mut Pace,
) -> Result<(), ConnError> {
    let (sock, fd) = (stream.as_raw_fd(), file.as_raw_fd());
    while pos < end {
        let count = ((end - pos) as usize).min(SENDFILE_MAX);
        let r = stream.try_io(Interest::WRITABLE, || {
            let mut off = pos as libc::off_t;
            // SAFETY: both descriptors are open for the duration of the call; the kernel
            // copies page cache pages into the socket and updates `off`.
            let n = unsafe { libc::sendfile(sock, fd, &mut off, count) };
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        });
        match r {
            // The file ended before `end`: it was truncated while being served. The
            // head promised more bytes, so the connection must close.
            Ok(0) => return Err(ConnError::FileShrank),
            Ok(n) => {
                pos += n as u64;
                body.sent(n as u64);
                pace.sent(n as u64);
                tokio::task::consume_budget().await;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_writable(stream, pace).await?,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// The send side of the connection's current response: when it started and the bytes
/// sent since (mirrored on the slot for the evictor), the minimum rate it must keep,
/// and the watchdog, which reports an eviction while the response waits.
struct Pace {
    watchdog: Watchdog,
    slot: std::sync::Arc<Slot>,
    min: Option<SlowRate>,
    t0: Instant,
    sent: u64,
}

impl Pace {
    /// A response starts (its head is complete and the slot busy).
    fn start(&mut self) {
        self.t0 = Instant::now();
        self.sent = 0;
        self.slot.pace_start();
    }

    fn sent(&mut self, n: u64) {
        self.sent += n;
        self.slot.pace_sent(self.sent);
    }

    /// When the response falls below the minimum rate if nothing more is sent: past
    /// the grace plus the time its bytes pay for (see [`SlowRate::behind`]).
    fn too_slow_at(&self) -> Option<Instant> {
        let m = self.min?;
        let paid = Duration::from_millis(self.sent.saturating_mul(1000) / m.bytes_per_sec);
        Some(self.t0 + m.grace + paid)
    }
}

/// Wait until the socket takes more, for at most [`WRITE_STALL`] and not past the
/// point where the response falls below its minimum rate; an eviction ends the wait.
async fn wait_writable(stream: &TcpStream, pace: &mut Pace) -> Result<(), ConnError> {
    let stall = Instant::now() + WRITE_STALL;
    let slow = pace.too_slow_at();
    let deadline = slow.map_or(stall, |s| s.min(stall));
    tokio::select! {
        biased;
        r = stream.writable() => Ok(r?),
        why = &mut pace.watchdog => Err(match why {
            Expiry::Evicted => ConnError::Evicted,
            // Only while pipelined replies are flushed between requests.
            Expiry::Idle => ConnError::IdleTimeout,
            Expiry::Header => ConnError::HeaderTimeout,
        }),
        _ = tokio::time::sleep_until(deadline) => Err(if slow.is_some_and(|s| deadline >= s) {
            ConnError::TooSlow
        } else {
            ConnError::WriteStall
        }),
    }
}

/// Answer a bad head with `status` and close. Unread input is drained briefly first so
/// the close does not turn into a reset that destroys the reply in flight.
async fn fail(
    stream: &TcpStream,
    out: &mut BytesMut,
    status: StatusCode,
    pace: &mut Pace,
) -> Result<(), ConnError> {
    let msg: &[u8] = match status {
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => b"request header fields too large\n",
        _ => b"bad request\n",
    };
    let mut r = http::Response::new(());
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    let (parts, ()) = r.into_parts();
    write_head(out, &parts, msg.len() as u64, true);
    out.put_slice(msg);
    flush(stream, out, false, pace).await?;
    linger(stream).await;
    Err(ConnError::Malformed(status))
}

/// Half-close, then read and drop what the client still sends (bounded in time and
/// bytes), so that closing with unread data does not reset the connection before the
/// client has read the reply.
async fn linger(stream: &TcpStream) {
    // SAFETY: plain shutdown(2) on the stream's socket.
    unsafe { libc::shutdown(stream.as_raw_fd(), libc::SHUT_WR) };
    let drain = async {
        let mut buf = [0u8; 4096];
        let mut total = 0usize;
        while total < (1 << 20) {
            if stream.readable().await.is_err() {
                return;
            }
            match stream.try_read(&mut buf) {
                Ok(0) => return,
                Ok(n) => total += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => return,
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_millis(500), drain).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(s: &str) -> Result<Option<Head>, StatusCode> {
        let mut b = BytesMut::from(s.as_bytes());
        parse(&mut b)
    }

    #[test]
    fn parses_heads_and_keep_alive() {
        let h = parse_str("GET /boot.ipxe?x=1 HTTP/1.1\r\nHost: a\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.req.uri().path(), "/boot.ipxe");
        assert_eq!(h.req.uri().query(), Some("x=1"));
        assert!(h.keep_alive && !h.has_body);
        let h = parse_str("GET / HTTP/1.1\r\nConnection: Keep-Alive, close\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(!h.keep_alive);
        let h = parse_str("GET / HTTP/1.0\r\n\r\n").unwrap().unwrap();
        assert!(!h.keep_alive);
        let h = parse_str("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(h.keep_alive);
        let h = parse_str("POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc")
            .unwrap()
            .unwrap();
        assert!(h.has_body);
        let h = parse_str("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(h.has_body);
        assert!(parse_str("GET / HTTP/1.1\r\nHost: a\r\n")
            .unwrap()
            .is_none());
        assert!(parse_str("").unwrap().is_none());
    }

    #[test]
    fn pipelined_heads_parse_one_at_a_time() {
        let mut b = BytesMut::from(&b"GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\nGET /c"[..]);
        assert_eq!(parse(&mut b).unwrap().unwrap().req.uri().path(), "/a");
        assert_eq!(parse(&mut b).unwrap().unwrap().req.uri().path(), "/b");
        assert!(parse(&mut b).unwrap().is_none());
        assert_eq!(&b[..], b"GET /c");
    }

    #[test]
    fn bad_heads_are_refused() {
        for bad in [
            "GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n",
            "GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            "GET / HTTP/1.1\r\nBad Name: x\r\n\r\n",
            "GET / HTTP/9\r\n\r\n",
            "\x00\x01\x02 / HTTP/1.1\r\n\r\n",
        ] {
            assert_eq!(
                parse_str(bad).err(),
                Some(StatusCode::BAD_REQUEST),
                "{bad:?}"
            );
        }
        let many: String = (0..MAX_HEADERS + 1)
            .map(|i| format!("X-{i}: v\r\n"))
            .collect();
        assert_eq!(
            parse_str(&format!("GET / HTTP/1.1\r\n{many}\r\n")).err(),
            Some(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE)
        );
    }

    #[test]
    fn heads_are_written_in_title_case_with_length_and_date() {
        let mut r = http::Response::new(());
        r.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        r.headers_mut()
            .insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
        let (parts, ()) = r.into_parts();
        let mut out = BytesMut::new();
        write_head(&mut out, &parts, 1234, true);
        let s = String::from_utf8(out.to_vec()).unwrap();
        assert!(s.starts_with("HTTP/1.1 200 OK\r\n"), "{s}");
        assert!(s.contains("\r\nContent-Type: text/plain\r\n"), "{s}");
        assert!(s.contains("\r\nAccept-Ranges: bytes\r\n"), "{s}");
        assert!(s.contains("\r\nContent-Length: 1234\r\n"), "{s}");
        assert!(s.contains("\r\nConnection: close\r\n"), "{s}");
        let date = s
            .split("Date: ")
            .nth(1)
            .unwrap()
            .split("\r\n")
            .next()
            .unwrap();
        assert!(httpdate::parse_http_date(date).is_ok(), "{date}");
        assert!(s.ends_with("\r\n\r\n"));
        assert_eq!(itoa(0, &mut [0; 20]), b"0");
        assert_eq!(itoa(u64::MAX, &mut [0; 20]), b"18446744073709551615");
        for v in [0, 1, 9, 10, 99, 100, 1_732_000_000, u64::MAX] {
            assert_eq!(itoa(v, &mut [0; 20]), v.to_string().as_bytes(), "{v}");
        }
    }
}
