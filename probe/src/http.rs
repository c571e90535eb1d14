//! Posting the inventory: one HTTP/1.1 `POST` over a std `TcpStream` (http:// only, no
//! chunked encoding), retried with exponential backoff and jitter on connect errors and
//! 5xx until a deadline; a 4xx stops at once (the identity or the document was refused,
//! and sending it again cannot help).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Longest response head read (status line and headers).
pub const MAX_HEAD: usize = 8192;
/// Longest response body kept (for a refusal's reason).
pub const MAX_BODY: usize = 1024;
/// Default time to keep retrying a post (the inventory's, the wipe report's).
pub const DEFAULT_DEADLINE: u64 = 600;
/// One attempt's connect/read/write timeout.
pub const IO_TIMEOUT: Duration = Duration::from_secs(15);

/// A parsed `http://host[:port]/path?query` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    /// Host as written (IPv6 keeps its brackets), used for the Host header.
    pub host: String,
    pub port: u16,
    /// Path and query, at least `/`.
    pub path: String,
}

/// Parse an inventory URL; only `http://` is supported (the initramfs has no TLS; the
/// URL carries a signed per-boot token instead).
pub fn parse_url(url: &str) -> Result<Url, String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("unsupported url {url:?}: only http:// is supported"))?;
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) if rest.as_bytes()[i] == b'/' => (&rest[..i], rest[i..].to_string()),
        Some(i) => (&rest[..i], format!("/{}", &rest[i..])),
        None => (rest, "/".to_string()),
    };
    let path = path.split('#').next().unwrap_or("/").to_string();
    if authority.contains('@') {
        return Err(format!(
            "url {url:?}: credentials in the url are not supported"
        ));
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("url {url:?}: unterminated ipv6 host"))?;
        (format!("[{h}]"), after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (authority.to_string(), None),
        }
    };
    if host.is_empty() || host == "[]" {
        return Err(format!("url {url:?}: no host"));
    }
    let port = match port {
        None => 80,
        Some(p) => p
            .parse::<u16>()
            .map_err(|_| format!("url {url:?}: bad port {p:?}"))?,
    };
    if path.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err(format!(
            "url {url:?}: spaces or control characters in the path"
        ));
    }
    Ok(Url { host, port, path })
}

/// What one attempt got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// 2xx.
    Accepted(u16),
    /// 4xx (or another final status): do not retry. Status and the start of the body.
    Refused(u16, String),
    /// Connect error, I/O error, malformed answer or 5xx: try again later.
    Retry(String),
}

/// One POST of `body` to `url`.
pub fn post_once(url: &Url, body: &[u8]) -> Attempt {
    let addrs: Vec<SocketAddr> =
        match (url.host.trim_matches(['[', ']']), url.port).to_socket_addrs() {
            Ok(a) => a.collect(),
            Err(e) => return Attempt::Retry(format!("resolving {}: {e}", url.host)),
        };
    let mut last = format!("{} resolves to no address", url.host);
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, IO_TIMEOUT) {
            Ok(s) => return exchange(s, url, body),
            Err(e) => last = format!("connecting to {addr}: {e}"),
        }
    }
    Attempt::Retry(last)
}

fn exchange(mut s: TcpStream, url: &Url, body: &[u8]) -> Attempt {
    let _ = s.set_read_timeout(Some(IO_TIMEOUT));
    let _ = s.set_write_timeout(Some(IO_TIMEOUT));
    let host = if url.port == 80 {
        url.host.clone()
    } else {
        format!("{}:{}", url.host, url.port)
    };
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: bootplane-probe\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        url.path,
        body.len()
    );
    if let Err(e) = s.write_all(head.as_bytes()).and_then(|_| s.write_all(body)) {
        return Attempt::Retry(format!("sending: {e}"));
    }
    // Read until the end of the head (bounded), then a little of the body.
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > MAX_HEAD {
            return Attempt::Retry("response head over 8192 bytes".into());
        }
        match s.read(&mut chunk) {
            Ok(0) if buf.is_empty() => {
                return Attempt::Retry("connection closed without a response".into())
            }
            Ok(0) => break buf.len(),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => return Attempt::Retry(format!("reading the response: {e}")),
        }
    };
    let Some(status) = status_code(&buf) else {
        let line = String::from_utf8_lossy(&buf[..buf.len().min(80)]).into_owned();
        return Attempt::Retry(format!("malformed status line {line:?}"));
    };
    match status {
        200..=299 => Attempt::Accepted(status),
        500..=599 => Attempt::Retry(format!("server answered {status}")),
        _ => {
            while buf.len() < head_end + MAX_BODY {
                match s.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let body = &buf[head_end.min(buf.len())..];
            let reason =
                crate::smbios::clean(&body[..body.len().min(MAX_BODY)]).unwrap_or_default();
            Attempt::Refused(status, reason)
        }
    }
}

/// The status code of `HTTP/1.x NNN ...`.
pub fn status_code(head: &[u8]) -> Option<u16> {
    let line = head.split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let mut parts = line.split_whitespace();
    if !parts.next()?.starts_with("HTTP/1.") {
        return None;
    }
    let code = parts.next()?;
    (code.len() == 3)
        .then(|| code.parse().ok())
        .flatten()
        .filter(|c| (100..600).contains(c))
}

/// How posting ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Accepted(u16),
    Refused(u16, String),
    /// The deadline passed; the last error.
    GaveUp(String),
}

/// Backoff before attempt `n` (0-based): 1 s doubling to 30 s, plus up to 50% jitter.
pub fn backoff(n: u32, seed: u64) -> Duration {
    let base = 1000u64.saturating_mul(1 << n.min(5)).min(30_000);
    let mut x = seed ^ (n as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    Duration::from_millis(base + x % (base / 2 + 1))
}

/// Post until accepted, refused, or `deadline` has passed; `log` hears each failure.
pub fn post(url: &Url, body: &[u8], deadline: Duration, mut log: impl FnMut(&str)) -> Outcome {
    let start = Instant::now();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
        ^ ((std::process::id() as u64) << 32);
    let mut n = 0;
    loop {
        let why = match post_once(url, body) {
            Attempt::Accepted(c) => return Outcome::Accepted(c),
            Attempt::Refused(c, r) => return Outcome::Refused(c, r),
            Attempt::Retry(why) => why,
        };
        let wait = backoff(n, seed);
        let left = deadline.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Outcome::GaveUp(why);
        }
        log(&format!(
            "{why}; retrying in {:.1}s",
            wait.min(left).as_secs_f32()
        ));
        std::thread::sleep(wait.min(left));
        n += 1;
    }
}

#[cfg(test)]
#[path = "http_tests.rs"]
mod tests;
