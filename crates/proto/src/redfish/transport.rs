//! One HTTP attempt against a BMC: the concurrency permits and counters around it,
//! the credentials header, the per-request timeout, the bounded body, and what a
//! failure means (its [`Error`], whether it is worth another attempt). Also the
//! backoff schedule and the scrubbing of secrets from error text.

use std::time::Duration;

use bytes::Bytes;
use rand::Rng as _;
use reqwest::header::{HeaderMap, ACCEPT, AUTHORIZATION, CONTENT_TYPE, IF_MATCH};
use reqwest::Method;
use serde_json::Value;

use super::parse;
use super::types::{Error, Password, Settings};

/// Requests sent to one BMC and how many are in flight.
#[derive(Default)]
pub(super) struct Counters {
    pub(super) requests: u64,
    pub(super) in_flight: u64,
    pub(super) max_in_flight: u64,
}

/// What one attempt on a BMC needs: the HTTP client for its certificate policy, the
/// request timeout, its address, the permits (per BMC, then global) and its counters.
pub(super) struct Line<'a> {
    pub(super) client: &'a reqwest::Client,
    pub(super) timeout: Duration,
    pub(super) base_url: &'a str,
    pub(super) bmc_limit: &'a tokio::sync::Semaphore,
    pub(super) global: &'a tokio::sync::Semaphore,
    pub(super) counters: &'a std::sync::Mutex<Counters>,
}

/// The largest response body read; a bigger one is [`Error::Malformed`].
pub(super) const MAX_BODY: usize = 1 << 20;

/// What one request sends.
pub(super) struct Req<'a> {
    pub(super) method: Method,
    /// A path on the BMC (`/redfish/v1/...`) or an absolute URL on the same BMC.
    pub(super) path: &'a str,
    pub(super) body: Option<&'a Value>,
    pub(super) if_match: Option<&'a str>,
}

/// A successful (< 400) answer.
pub(super) struct Resp {
    pub(super) status: u16,
    pub(super) etag: Option<String>,
    pub(super) location: Option<String>,
    pub(super) token: Option<String>,
    pub(super) retry_after: Option<Duration>,
    pub(super) body: Bytes,
}

/// A failed attempt.
pub(super) struct Failure {
    pub(super) error: Error,
    pub(super) retryable: bool,
    pub(super) retry_after: Option<Duration>,
}

/// How requests prove who they are. The password is kept to notice a changed one.
#[derive(Clone, PartialEq, Eq)]
pub(super) enum Auth {
    None,
    Basic { header: String, password: Password },
    Token { token: String, password: Password },
}

impl Auth {
    pub(super) fn basic(user: &str, password: &Password) -> Auth {
        use base64::Engine as _;
        let b64 =
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{}", password.0));
        Auth::Basic {
            header: format!("Basic {b64}"),
            password: password.clone(),
        }
    }
    pub(super) fn token(token: String, password: &Password) -> Auth {
        Auth::Token {
            token,
            password: password.clone(),
        }
    }
    pub(super) fn is_token(&self) -> bool {
        matches!(self, Auth::Token { .. })
    }
    pub(super) fn password_is(&self, p: &Password) -> bool {
        match self {
            Auth::None => false,
            Auth::Basic { password, .. } | Auth::Token { password, .. } => password == p,
        }
    }
    /// The secret this carries besides the password (scrubbed from errors).
    pub(super) fn secret(&self) -> &str {
        match self {
            Auth::None => "",
            Auth::Basic { header, .. } => header.trim_start_matches("Basic "),
            Auth::Token { token, .. } => token,
        }
    }
}

/// Counts a request in flight for its BMC while alive.
struct InFlight<'a>(&'a std::sync::Mutex<Counters>);

impl<'a> InFlight<'a> {
    fn enter(m: &'a std::sync::Mutex<Counters>) -> InFlight<'a> {
        let mut c = m.lock().unwrap_or_else(|p| p.into_inner());
        c.requests += 1;
        c.in_flight += 1;
        c.max_in_flight = c.max_in_flight.max(c.in_flight);
        InFlight(m)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut c = self.0.lock().unwrap_or_else(|p| p.into_inner());
        c.in_flight -= 1;
    }
}

fn fail(error: Error, retryable: bool) -> Failure {
    Failure {
        error,
        retryable,
        retry_after: None,
    }
}

/// The URL of `path` on the BMC; an absolute URL (a task monitor's `Location`) must
/// point at the same BMC, credentials never go elsewhere.
fn url_of(base: &str, path: &str) -> Result<String, Failure> {
    if path.starts_with("http://") || path.starts_with("https://") {
        let same = path
            .strip_prefix(base)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'));
        if !same {
            return Err(fail(
                Error::Malformed(format!("link to another host: {path}")),
                false,
            ));
        }
        return Ok(path.to_owned());
    }
    if !path.starts_with('/') {
        return Err(fail(
            Error::Malformed(format!("relative link: {path}")),
            false,
        ));
    }
    Ok(format!("{base}{path}"))
}

/// One attempt: permits (per BMC first, then global), counters, the request, the
/// bounded body; a status >= 400 becomes a [`Failure`].
pub(super) async fn send(line: Line<'_>, req: &Req<'_>, auth: &Auth) -> Result<Resp, Failure> {
    let url = url_of(line.base_url, req.path)?;
    let closed = |_| fail(Error::Unreachable("client shut down".into()), false);
    let _bmc_permit = line.bmc_limit.acquire().await.map_err(closed)?;
    let _global_permit = line.global.acquire().await.map_err(closed)?;
    let _in_flight = InFlight::enter(line.counters);

    let client = line.client;
    let mut rb = client
        .request(req.method.clone(), url)
        .timeout(line.timeout)
        .header(ACCEPT, "application/json");
    match auth {
        Auth::None => {}
        Auth::Basic { header, .. } => rb = rb.header(AUTHORIZATION, header.as_str()),
        Auth::Token { token, .. } => rb = rb.header("X-Auth-Token", token.as_str()),
    }
    if let Some(tag) = req.if_match {
        rb = rb.header(IF_MATCH, tag);
    }
    if let Some(body) = req.body {
        rb = rb
            .header(CONTENT_TYPE, "application/json")
            .body(body.to_string());
    }
    let resp = rb
        .send()
        .await
        .map_err(|e| transport_failure(&e, line.timeout))?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = read_bounded(resp, line.timeout).await?;
    if status < 400 {
        return Ok(Resp {
            status,
            etag: header(&headers, "etag"),
            location: header(&headers, "location"),
            token: header(&headers, "x-auth-token"),
            retry_after: retry_after(&headers),
            body,
        });
    }
    Err(status_failure(status, &headers, &body))
}

fn header(h: &HeaderMap, name: &str) -> Option<String> {
    h.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
}

/// `Retry-After` in seconds (the HTTP-date form is not used by BMCs we know; ignored).
fn retry_after(h: &HeaderMap) -> Option<Duration> {
    header(h, "retry-after")?
        .trim()
        .parse::<u64>()
        .ok()
        .map(Duration::from_secs)
}

fn status_failure(status: u16, headers: &HeaderMap, body: &[u8]) -> Failure {
    match status {
        401 | 403 => fail(Error::Unauthorized(status), false),
        // 501: the BMC does not implement it; waiting will not change that.
        429 | 500 | 502..=599 => Failure {
            error: Error::Status {
                status,
                message: parse::error_message(body),
            },
            retryable: true,
            retry_after: retry_after(headers),
        },
        _ => fail(
            Error::Status {
                status,
                message: parse::error_message(body),
            },
            false,
        ),
    }
}

/// The body, at most [`MAX_BODY`] bytes.
async fn read_bounded(mut resp: reqwest::Response, timeout: Duration) -> Result<Bytes, Failure> {
    if resp.content_length().is_some_and(|n| n > MAX_BODY as u64) {
        return Err(fail(
            Error::Malformed(format!("response over {MAX_BODY} bytes")),
            false,
        ));
    }
    let mut buf = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| transport_failure(&e, timeout))?
    {
        if buf.len() + chunk.len() > MAX_BODY {
            return Err(fail(
                Error::Malformed(format!("response over {MAX_BODY} bytes")),
                false,
            ));
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(buf))
}

/// A transport error: timeout, TLS (found in the source chain: never retried, waiting
/// does not fix a certificate), else unreachable.
fn transport_failure(e: &reqwest::Error, timeout: Duration) -> Failure {
    if let Some(tls) = tls_cause(e) {
        return fail(Error::Tls(tls), false);
    }
    if e.is_timeout() {
        return fail(Error::Timeout(timeout), true);
    }
    fail(Error::Unreachable(chain(e)), true)
}

/// The rustls error somewhere in `e`'s causes (an `io::Error` hides its inner error
/// from `source()`, so each is opened with `get_ref`).
fn tls_cause(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(t) = err.downcast_ref::<rustls::Error>() {
            return Some(t.to_string());
        }
        if let Some(inner) = err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            if let Some(t) = tls_cause(inner) {
                return Some(t);
            }
        }
        cur = err.source();
    }
    None
}

/// `e` and its causes, `: `-joined (reqwest's own text is often just "error sending
/// request").
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(err) = cur {
        let s = err.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        cur = err.source();
    }
    out
}

/// Full-jitter exponential backoff before attempt `attempt + 1`: uniform in
/// `[0, min(backoff_max, backoff_base * 2^(attempt-1))]`.
pub(super) fn backoff(s: &Settings, attempt: u32) -> Duration {
    let exp = s
        .backoff_base
        .saturating_mul(1u32 << (attempt.saturating_sub(1)).min(20));
    let cap = exp.min(s.backoff_max);
    let nanos = cap.as_nanos().min(u64::MAX as u128) as u64;
    Duration::from_nanos(rand::thread_rng().gen_range(0..=nanos))
}

/// `s` with every non-empty secret replaced by `<redacted>`.
pub(super) fn scrub(s: &str, secrets: &[&str]) -> String {
    let mut out = s.to_owned();
    for secret in secrets.iter().filter(|x| !x.is_empty()) {
        out = out.replace(secret, "<redacted>");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_bounded() {
        let s = Settings {
            backoff_base: Duration::from_millis(100),
            backoff_max: Duration::from_millis(300),
            ..Settings::default()
        };
        for attempt in 1..40 {
            let cap = Duration::from_millis([100, 200, 300][(attempt as usize - 1).min(2)]);
            assert!(backoff(&s, attempt) <= cap, "attempt {attempt}");
        }
    }

    #[test]
    fn links_stay_on_the_bmc() {
        let base = "https://10.0.0.5:443";
        assert_eq!(
            url_of(base, "/redfish/v1/").ok().unwrap(),
            "https://10.0.0.5:443/redfish/v1/"
        );
        assert!(url_of(base, "https://10.0.0.5:443/redfish/v1/TaskMonitors/1").is_ok());
        assert!(url_of(base, "https://10.0.0.5:4430/x").is_err());
        assert!(url_of(base, "https://evil.example/x").is_err());
        assert!(url_of(base, "redfish/v1").is_err());
    }

    #[test]
    fn scrub_hides_secrets() {
        assert_eq!(scrub("a hunter2 b", &["hunter2", ""]), "a <redacted> b");
    }
}
