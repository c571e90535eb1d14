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

/// Route names used in metrics and logs.
pub mod route {
    pub(crate) const BOOT: &str = "boot_ipxe";
    pub(crate) const SCRIPT: &str = "script";
    pub(crate) const IGNITION: &str = "ignition";
    pub(crate) const ASSETS: &str = "assets";
    pub(crate) const ISO: &str = "boot_iso";
    pub(crate) const EFI: &str = "boot_efi";
    pub(crate) const INVENTORY: &str = "inventory";
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
            let v = percent_encoding::percent_decode_str(v)
                .decode_utf8()
                .map_err(|_| format!("query parameter {k} is not valid utf-8"))?;
            let v = match v {
                Cow::Borrowed(b) => Cow::Borrowed(b.trim()),
                Cow::Owned(o) => Cow::Owned(o.trim().to_string()),
            };
            if v.is_empty() {
                continue;
            }
            match k {
                "uuid" => out.uuid = Some(v),
                "mac" => out.mac = Some(v),
                "server" => out.server = Some(v),
                "token" => out.token = Some(v),
                _ => {} // buildarch, platform: informational
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
