//! Request checks of the API listener that are not roles: which body media types are
//! accepted (JSON, YAML and kube's protobuf only: 415 for `text/plain`, forms and the rest, the types a
//! cross-site HTML form or a `no-cors` fetch can send), whether a request authenticated
//! by nothing but its TLS client certificate comes from another site (`Origin`,
//! `Sec-Fetch-Site`; refused, as the browser attaches the certificate on its own), and
//! the caps on open watches per identity and per connection ([`Watches`], 429 beyond).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::http::{header, HeaderMap, StatusCode, Uri};

use super::error::ApiError;

/// A request body's declared syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Media {
    Json,
    Yaml,
    /// kube's protobuf (`application/vnd.kubernetes.protobuf`, [`super::kubepb`]).
    Protobuf,
    /// Anything else (`text/plain`, `application/x-www-form-urlencoded`, ...).
    Other,
}

/// The media type of a `Content-Type` value: `application/json` and any
/// `application/*+json` (merge-patch, json-patch, ...) are JSON; `application/yaml`,
/// `application/x-yaml`, `text/yaml`, `text/x-yaml` and `application/*+yaml` are YAML;
/// parameters (`; charset=utf-8`) are ignored.
pub(crate) fn media(content_type: &str) -> Media {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let Some((top, sub)) = essence.split_once('/') else {
        return Media::Other;
    };
    match (top, sub) {
        ("application", "json") => Media::Json,
        ("application", "vnd.kubernetes.protobuf") => Media::Protobuf,
        ("application", s) if s.ends_with("+json") && s.len() > 5 => Media::Json,
        ("application", "yaml" | "x-yaml") | ("text", "yaml" | "x-yaml") => Media::Yaml,
        ("application", s) if s.ends_with("+yaml") && s.len() > 5 => Media::Yaml,
        _ => Media::Other,
    }
}

/// 415 for a request that has a body whose `Content-Type` is neither JSON, YAML nor
/// kube's protobuf (no `Content-Type` at all is JSON, as kube has it).
pub(crate) fn check_media(h: &HeaderMap, has_body: bool) -> Result<(), ApiError> {
    let Some(ct) = h.get(header::CONTENT_TYPE) else {
        return Ok(());
    };
    let ct = ct.to_str().unwrap_or("");
    if !has_body || media(ct) != Media::Other {
        return Ok(());
    }
    let mut shown: String = ct.chars().take(64).filter(|c| !c.is_control()).collect();
    if shown.is_empty() {
        shown = "?".into();
    }
    Err(ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "UnsupportedMediaType",
        format!(
            "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/merge-patch+json, application/vnd.kubernetes.protobuf (got {shown})"
        ),
    ))
}

/// Whether a browser says this request comes from another site: `Sec-Fetch-Site` is
/// `cross-site` or `same-site`, or `Origin` is present and is not this listener's own
/// origin (`https://` + the request's host; `null`, an opaque origin, is never ours).
/// Requests without either header (curl, the CLI, controllers) are not cross-site.
pub(crate) fn cross_site(h: &HeaderMap, uri: &Uri) -> bool {
    let fetch_site = h
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_ascii_lowercase());
    if matches!(fetch_site.as_deref(), Some("cross-site" | "same-site")) {
        return true;
    }
    let Some(origin) = h.get(header::ORIGIN) else {
        return false;
    };
    let origin = origin.to_str().unwrap_or("").trim().to_ascii_lowercase();
    // HTTP/2 carries the host in `:authority` (the URI), HTTP/1.1 in `Host`.
    let host = uri
        .authority()
        .map(|a| a.as_str().to_string())
        .or_else(|| {
            h.get(header::HOST)
                .and_then(|v| v.to_str().ok())
                .map(String::from)
        })
        .unwrap_or_default()
        .to_ascii_lowercase();
    let strip = |s: &str| s.strip_suffix(":443").map(String::from).unwrap_or(s.into());
    let Some(o) = origin.strip_prefix("https://") else {
        return true;
    };
    host.is_empty() || strip(o) != strip(&host)
}

/// 403 for a request authenticated only by a client certificate that a browser sent
/// from another site ([`cross_site`]).
pub(crate) fn cross_site_refusal(user: &str) -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "Forbidden",
        format!(
            "cross-site request refused: User {user:?} is authenticated by a client certificate only, and the request comes from another site (Origin or Sec-Fetch-Site); send a bearer token, or make the request from this origin"
        ),
    )
}

/// A connection of the API listener, as `listen::router` tags its requests.
pub type ConnId = crate::listen::router::ConnId;

/// Open watches per identity (user name) and per connection, each capped.
#[derive(Debug)]
pub struct Watches {
    per_user: usize,
    per_conn: usize,
    open: Mutex<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    users: HashMap<String, usize>,
    conns: HashMap<u64, usize>,
}

/// An open watch; its counts go down when it is dropped (the stream ended or the
/// client went away).
#[derive(Debug)]
pub(crate) struct WatchPermit {
    owner: Arc<Watches>,
    user: String,
    conn: Option<u64>,
}

impl Watches {
    /// Caps of `per_user` watches per identity and `per_conn` per connection (0: 1).
    pub fn new(per_user: usize, per_conn: usize) -> Arc<Watches> {
        Arc::new(Watches {
            per_user: per_user.max(1),
            per_conn: per_conn.max(1),
            open: Mutex::new(Counts::default()),
        })
    }

    /// Count a new watch of `user` on `conn`, or 429 when either is at its cap.
    pub(crate) fn open(
        self: &Arc<Self>,
        user: &str,
        conn: Option<u64>,
    ) -> Result<WatchPermit, ApiError> {
        let mut c = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let u = c.users.get(user).copied().unwrap_or(0);
        let k = conn.map(|k| c.conns.get(&k).copied().unwrap_or(0));
        let over = if u >= self.per_user {
            Some(format!(
                "user {user:?} has {u} watches open (api.max_watches_per_user)"
            ))
        } else if k.is_some_and(|k| k >= self.per_conn) {
            Some(format!(
                "this connection has {} watches open (api.max_watches_per_connection)",
                k.unwrap_or(0)
            ))
        } else {
            None
        };
        if let Some(why) = over {
            let mut e = ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "TooManyRequests",
                format!("too many watches: {why}; close one first"),
            );
            e.details = Some(serde_json::json!({"retryAfterSeconds": 1}));
            return Err(e);
        }
        *c.users.entry(user.to_string()).or_insert(0) += 1;
        if let Some(k) = conn {
            *c.conns.entry(k).or_insert(0) += 1;
        }
        Ok(WatchPermit {
            owner: self.clone(),
            user: user.to_string(),
            conn,
        })
    }

    /// Watches open now (all identities).
    pub fn total(&self) -> usize {
        let c = self.open.lock().unwrap_or_else(|e| e.into_inner());
        c.users.values().sum()
    }
}

impl Drop for WatchPermit {
    fn drop(&mut self) {
        let mut c = self.owner.open.lock().unwrap_or_else(|e| e.into_inner());
        decrement(&mut c.users, &self.user);
        if let Some(k) = self.conn {
            decrement(&mut c.conns, &k);
        }
    }
}

/// One fewer under `k`; the entry goes at zero (the maps hold open watches only).
fn decrement<K: std::hash::Hash + Eq>(m: &mut HashMap<K, usize>, k: &K) {
    if let Some(n) = m.get_mut(k) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            m.remove(k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn media_types() {
        for ct in [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON",
            "application/merge-patch+json",
            "application/strategic-merge-patch+json",
        ] {
            assert_eq!(media(ct), Media::Json, "{ct}");
        }
        for ct in [
            "application/yaml",
            "application/x-yaml",
            "text/yaml",
            "application/apply-patch+yaml",
        ] {
            assert_eq!(media(ct), Media::Yaml, "{ct}");
        }
        for ct in [
            "text/plain",
            "text/plain; charset=utf-8",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "",
            "json",
            "application/+json",
            "text/json",
        ] {
            assert_eq!(media(ct), Media::Other, "{ct}");
        }
        let mut h = HeaderMap::new();
        assert!(check_media(&h, true).is_ok(), "no content type: JSON");
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        assert_eq!(
            check_media(&h, true).unwrap_err().code,
            StatusCode::UNSUPPORTED_MEDIA_TYPE
        );
        assert!(check_media(&h, false).is_ok(), "no body: nothing to refuse");
    }

    #[test]
    fn cross_site_by_origin_and_fetch_metadata() {
        let uri: Uri = "/apis".parse().unwrap();
        let h2: Uri = "https://bp.example:9090/apis".parse().unwrap();
        let hm = |pairs: &[(&'static str, &'static str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.insert(*k, HeaderValue::from_static(v));
            }
            h
        };
        let host = ("host", "bp.example:9090");
        assert!(!cross_site(&hm(&[host]), &uri));
        assert!(!cross_site(
            &hm(&[host, ("origin", "https://bp.example:9090")]),
            &uri
        ));
        assert!(!cross_site(
            &hm(&[("origin", "https://BP.example:9090")]),
            &h2
        ));
        assert!(!cross_site(
            &hm(&[("host", "bp.example"), ("origin", "https://bp.example:443")]),
            &uri
        ));
        assert!(!cross_site(
            &hm(&[host, ("sec-fetch-site", "same-origin")]),
            &uri
        ));
        assert!(!cross_site(&hm(&[host, ("sec-fetch-site", "none")]), &uri));
        for bad in [
            vec![host, ("origin", "https://evil.example")],
            vec![host, ("origin", "null")],
            vec![host, ("origin", "http://bp.example:9090")],
            vec![host, ("origin", "https://bp.example:9091")],
            vec![("origin", "https://bp.example:9090")],
            vec![host, ("sec-fetch-site", "cross-site")],
            vec![host, ("sec-fetch-site", "same-site")],
        ] {
            assert!(cross_site(&hm(&bad), &uri), "{bad:?}");
        }
    }

    #[test]
    fn watches_are_capped_per_user_and_per_connection() {
        let w = Watches::new(3, 2);
        let a1 = w.open("a", Some(1)).unwrap();
        let _a2 = w.open("a", Some(1)).unwrap();
        let e = w.open("a", Some(1)).unwrap_err();
        assert_eq!(e.code, StatusCode::TOO_MANY_REQUESTS);
        assert!(e.message.contains("connection"), "{}", e.message);
        let _b = w.open("b", Some(1)).map(|_| ()).unwrap_err();
        let _a3 = w.open("a", Some(2)).unwrap();
        let e = w.open("a", Some(3)).unwrap_err();
        assert!(e.message.contains("user \"a\""), "{}", e.message);
        let _b1 = w.open("b", Some(3)).unwrap();
        drop(a1);
        let _a4 = w.open("a", Some(1)).unwrap();
        assert_eq!(w.total(), 4);
    }
}
