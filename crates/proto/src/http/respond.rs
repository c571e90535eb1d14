//! The responses the boot listener's routes share (`handler`'s scripts, Ignition and
//! assets, `bootiso`'s images, `discovery`'s inventory posts): the route names metrics
//! and logs use, plain-text and 400 answers, the ranged file-like response (validators,
//! conditionals, `Range`, `HEAD`), the `/ipxe/script` query and the object-name check.

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode};

use super::files::{self, Conditions, FileBody, Plan};

/// Where discovered machines post their inventory: `INVENTORY_PREFIX<server>/<token>`
/// ([`super::discovery`]).
pub const INVENTORY_PREFIX: &str = "/discovery/inventory/";
/// Where machines in `Cleanup` post their wipe report: `WIPE_PREFIX<server>/<token>`
/// ([`super::wipe`]).
pub const WIPE_PREFIX: &str = "/discovery/wipe/";
/// Where machines installing a disk image post their report: `INSTALL_PREFIX<server>/<token>`
/// ([`super::install`]).
pub const INSTALL_PREFIX: &str = "/discovery/install/";

/// Route names used in metrics and logs.
pub mod route {
    pub(crate) const BOOT: &str = "boot_ipxe";
    pub(crate) const SCRIPT: &str = "script";
    pub(crate) const IGNITION: &str = "ignition";
    pub(crate) const ASSETS: &str = "assets";
    pub(crate) const ISO: &str = "boot_iso";
    pub(crate) const EFI: &str = "boot_efi";
    pub(crate) const INVENTORY: &str = "inventory";
    pub(crate) const WIPE: &str = "wipe";
    pub(crate) const INSTALL: &str = "install";
    pub(crate) const OTHER: &str = "other";
}

pub(super) type Resp = Response<FileBody>;

/// Where a ranged response's bytes come from.
pub(super) enum Source {
    /// An open file, streamed under the listener's budget.
    File(std::fs::File, Arc<files::StreamBudget>),
    /// A body held in memory (several ranges get the whole body).
    Bytes(Bytes),
}

/// The response for a file-like body: validators (ETag, Last-Modified), the
/// conditionals and `Range` planned by [`files::plan`], `HEAD` without a body: the one
/// builder for assets and boot ISOs.
pub(super) fn ranged_response<B>(
    req: &Request<B>,
    meta: &files::FileMeta,
    ctype: &'static str,
    source: Source,
) -> Resp {
    let cond = Conditions::of(req.headers());
    let plan = files::plan(req.method() == Method::GET, &cond, meta);
    let head = req.method() == Method::HEAD;
    let mut hm = HeaderMap::new();
    hm.insert(header::ETAG, header_value(&meta.etag, "\"0\""));
    hm.insert(
        header::LAST_MODIFIED,
        header_value(&meta.last_modified(), "Thu, 01 Jan 1970 00:00:00 GMT"),
    );
    hm.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    let len = meta.len;
    let full = |hm: &mut HeaderMap, source: Source| {
        hm.insert(header::CONTENT_TYPE, HeaderValue::from_static(ctype));
        hm.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
        let body = match source {
            _ if len == 0 || head => FileBody::empty(),
            Source::File(f, budget) => FileBody::range(f, 0, len - 1, budget),
            Source::Bytes(b) => FileBody::bytes(b),
        };
        (StatusCode::OK, body)
    };
    let (status, body) = match (plan, source) {
        (Plan::NotModified, _) => (StatusCode::NOT_MODIFIED, FileBody::empty()),
        (Plan::PreconditionFailed, _) => {
            hm.insert(header::CONTENT_LENGTH, HeaderValue::from(0u64));
            (StatusCode::PRECONDITION_FAILED, FileBody::empty())
        }
        (Plan::Unsatisfiable, _) => {
            hm.insert(
                header::CONTENT_RANGE,
                header_value(&format!("bytes */{len}"), "bytes */0"),
            );
            hm.insert(header::CONTENT_LENGTH, HeaderValue::from(0u64));
            (StatusCode::RANGE_NOT_SATISFIABLE, FileBody::empty())
        }
        (Plan::Full, source) => full(&mut hm, source),
        (Plan::Partial(ranges), source) if ranges.len() == 1 => {
            let (s, e) = ranges[0];
            hm.insert(header::CONTENT_TYPE, HeaderValue::from_static(ctype));
            hm.insert(
                header::CONTENT_RANGE,
                header_value(&format!("bytes {s}-{e}/{len}"), "bytes */0"),
            );
            hm.insert(header::CONTENT_LENGTH, HeaderValue::from(e - s + 1));
            let body = match source {
                Source::File(f, budget) => FileBody::range(f, s, e, budget),
                Source::Bytes(b) => FileBody::bytes(b.slice(s as usize..=e as usize)),
            };
            (StatusCode::PARTIAL_CONTENT, body)
        }
        (Plan::Partial(ranges), Source::File(f, budget)) => {
            let (body, boundary) = FileBody::multipart(f, &ranges, len, ctype, budget);
            let n = http_body::Body::size_hint(&body).exact().unwrap_or(0);
            hm.insert(
                header::CONTENT_TYPE,
                header_value(
                    &format!("multipart/byteranges; boundary={boundary}"),
                    "multipart/byteranges",
                ),
            );
            hm.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
            (StatusCode::PARTIAL_CONTENT, body)
        }
        (Plan::Partial(_), source) => full(&mut hm, source),
    };
    let mut r = Response::new(body);
    *r.status_mut() = status;
    *r.headers_mut() = hm;
    r
}

/// Query parameters of `/ipxe/script`. Empty values count as absent (iPXE expands an
/// unset setting to nothing). Values borrow from the request unless percent-decoded.
#[derive(Debug, Default)]
pub(super) struct Query<'a> {
    pub(super) uuid: Option<Cow<'a, str>>,
    pub(super) mac: Option<Cow<'a, str>>,
    pub(super) server: Option<Cow<'a, str>>,
    pub(super) token: Option<Cow<'a, str>>,
}

impl<'a> Query<'a> {
    pub(super) fn parse(q: &'a str) -> Result<Query<'a>, String> {
        if q.len() > 2048 {
            return Err("query too long".into());
        }
        let mut out = Query::default();
        for pair in q.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let slot = match k {
                "uuid" => &mut out.uuid,
                "mac" => &mut out.mac,
                "server" => &mut out.server,
                "token" => &mut out.token,
                _ => continue, // buildarch, platform: informational, not decoded
            };
            // The query is already text: only a value with an escape in it is decoded
            // (every script request parses one; iPXE's values rarely need escapes).
            let v = match v.contains('%') {
                false => Cow::Borrowed(v.trim()),
                true => match percent_encoding::percent_decode_str(v).decode_utf8() {
                    Ok(d) => Cow::Owned(d.trim().to_string()),
                    Err(_) => return Err(format!("query parameter {k} is not valid utf-8")),
                },
            };
            if !v.is_empty() {
                *slot = Some(v);
            }
        }
        Ok(out)
    }
}

pub(super) fn header_value(s: &str, fallback: &'static str) -> HeaderValue {
    HeaderValue::from_str(s).unwrap_or_else(|_| HeaderValue::from_static(fallback))
}

pub(super) fn text(status: StatusCode, msg: &str) -> Resp {
    let mut r = Response::new(FileBody::bytes(Bytes::copy_from_slice(msg.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r.headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from(msg.len() as u64));
    r
}

pub(super) fn bad_request(msg: &str) -> Resp {
    let m: String = msg.chars().filter(|c| !c.is_control()).take(200).collect();
    text(StatusCode::BAD_REQUEST, &format!("bad request: {m}\n"))
}

/// HEAD: same headers, no body.
pub(super) fn strip_body(r: Resp) -> Resp {
    let (parts, _) = r.into_parts();
    Response::from_parts(parts, FileBody::empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_fields_are_trimmed_decoded_only_when_escaped_and_last_wins() {
        let q =
            Query::parse("uuid=%20AbC%2d1%20&mac=52-54&&token=a1.x&mac=%3a&platform=%ff").unwrap();
        assert_eq!(q.uuid.as_deref(), Some("AbC-1"));
        assert!(matches!(q.mac, Some(Cow::Owned(ref m)) if m == ":"));
        assert!(matches!(q.token, Some(Cow::Borrowed("a1.x"))));
        assert_eq!(q.server, None);
        // An empty value is no value; a key without `=` too.
        let q = Query::parse("server=&uuid&mac=%20").unwrap();
        assert_eq!((q.server, q.uuid, q.mac), (None, None, None));
    }

    #[test]
    fn query_refuses_bad_escapes_in_fields_it_reads_and_long_queries() {
        let e = Query::parse("buildarch=x86_64&uuid=%ff%fe").unwrap_err();
        assert_eq!(e, "query parameter uuid is not valid utf-8");
        assert_eq!(
            Query::parse(&"a".repeat(2049)).unwrap_err(),
            "query too long"
        );
    }
}
