//! Watches on the REST API (`GET ...?watch=true`): newline-delimited JSON events, as
//! kube's. Where a watch starts: without a `resourceVersion` (or `0`) the current
//! objects come first as ADDED events; from a version, the changes after it (410 Gone
//! when the store no longer keeps it: the client lists again); `sendInitialEvents` (the
//! streaming list of client-go and kube-rs) as kube's. Bookmarks with
//! `allowWatchBookmarks`; `timeoutSeconds`; label and field selectors; server-side
//! tables for kubectl's `get -w`. Each watch holds a permit ([`super::guard::Watches`]:
//! capped per identity and per connection) while it streams, and ends on shutdown.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::Response;
use serde_json::{json, Value};

use super::error::ApiError;
use super::state::ApiState;
use crate::model::meta;
use crate::model::registry::ResourceType;
use crate::model::selector::{FieldSelector, Selector};

type ApiResult<T> = Result<T, ApiError>;

/// What a watch asked for besides its selectors (see [`watch`]).
pub(crate) struct WatchAsk {
    rv: Option<String>,
    timeout_secs: Option<u64>,
    bookmarks: bool,
    /// `sendInitialEvents`: `None` when not given.
    initial: Option<bool>,
}

impl WatchAsk {
    pub(crate) fn from_query(q: &std::collections::HashMap<String, String>) -> ApiResult<WatchAsk> {
        let flag = |k: &str| -> ApiResult<Option<bool>> {
            match q.get(k).map(String::as_str) {
                None => Ok(None),
                Some("true" | "1") => Ok(Some(true)),
                Some("false" | "0" | "") => Ok(Some(false)),
                Some(v) => Err(ApiError::bad_request(format!("{k}: not a boolean: {v:?}"))),
            }
        };
        let timeout_secs = match q.get("timeoutSeconds") {
            Some(s) => Some(s.parse::<u64>().map_err(|_| {
                ApiError::bad_request(format!("timeoutSeconds: not a number of seconds: {s:?}"))
            })?),
            None => None,
        };
        let ask = WatchAsk {
            rv: q.get("resourceVersion").cloned(),
            timeout_secs,
            bookmarks: flag("allowWatchBookmarks")?.unwrap_or(false),
            initial: flag("sendInitialEvents")?,
        };
        // As kube's validation of a watch's ListOptions.
        if ask.initial.is_some() {
            let invalid = |m: &str| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", m);
            if q.get("resourceVersionMatch").map(String::as_str) != Some("NotOlderThan") {
                return Err(invalid("sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless resourceVersionMatch is set to NotOlderThan"));
            }
            if !ask.bookmarks && ask.initial == Some(true) {
                return Err(invalid("allowWatchBookmarks: Forbidden: allowWatchBookmarks must be true when sendInitialEvents is true"));
            }
        }
        Ok(ask)
    }
}

/// Idle time after which a watch that allows bookmarks gets one (kube: about a minute).
const BOOKMARK_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// Stream watch events as newline-delimited JSON. Without a resourceVersion (or "0")
/// the current objects come first as ADDED events, then changes, as kube does; with
/// `sendInitialEvents=true` (the streaming list of client-go and kube-rs) they come
/// from any resourceVersion and end with a BOOKMARK annotated
/// `k8s.io/initial-events-end`, and with `sendInitialEvents=false` never. With
/// `allowWatchBookmarks` a BOOKMARK carrying the last revision the watch has passed
/// (delivered or filtered out) comes after a minute without events and before the
/// stream ends, so the client resumes from there instead of an older version.
/// With `form` (kubectl's `get -w` asks for tables) each event's object is a one-row
/// `Table` ([`super::table`]) instead. The stream ends after `timeoutSeconds` (as
/// kube's; the client then watches again from the last version it saw).
pub(crate) fn watch(
    st: &ApiState,
    permit: super::guard::WatchPermit,
    (rt, ns): (Arc<ResourceType>, Option<String>),
    (sel, fields): (Option<Selector>, Option<FieldSelector>),
    ask: WatchAsk,
    form: Option<super::table::Form>,
) -> ApiResult<Response> {
    // A day at most: far beyond any client's, and within what Instant can add.
    let ends = (ask.timeout_secs)
        .map(|s| tokio::time::Instant::now() + std::time::Duration::from_secs(s.min(86_400)));
    let given = match ask.rv.as_deref() {
        None | Some("") | Some("0") => None,
        Some(r) => Some(
            r.parse::<crate::store::backend::Rev>()
                .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {r:?}")))?,
        ),
    };
    let wants_initial = ask.initial.unwrap_or(given.is_none());
    let mut initial = Vec::new();
    let from = if wants_initial {
        if let Some(r) = given.filter(|r| *r > st.store.revision()) {
            return Err(crate::store::StoreError::TooLargeResourceVersion {
                requested: r,
                current: st.store.revision(),
            }
            .into());
        }
        let (mut items, rev) = st.store.list_text(&rt, ns.as_deref(), sel.as_ref());
        if let Some(f) = &fields {
            items.retain(|t| text_matches(f, t));
        }
        initial = items;
        rev
    } else {
        given.unwrap_or_else(|| st.store.revision())
    };
    let w = st.store.watch(&rt, ns.as_deref(), from)?;
    let sd = st.shutdown.child();
    let printed = {
        let rt = rt.clone();
        move |kind: &str, o: &Value| -> Option<Bytes> {
            let f = form?;
            let t = super::table::render(&rt, f, (std::slice::from_ref(o), false), json!({}), None);
            Some(line(kind, &t.unwrap_or_else(|e| e.status_body())))
        }
    };
    let head_printed = printed.clone();
    let mut head: Vec<Bytes> = (initial.into_iter())
        .map(|o| {
            let table = serde_json::from_str(&o)
                .ok()
                .and_then(|v| head_printed("ADDED", &v));
            table.unwrap_or_else(|| line_text("ADDED", &o))
        })
        .collect();
    let bookmark = {
        let rt = rt.clone();
        move |rev: crate::store::backend::Rev, end_of_initial: bool| {
            let mut m = json!({"resourceVersion": rev.to_string()});
            if end_of_initial {
                m["annotations"] = json!({"k8s.io/initial-events-end": "true"});
            }
            line(
                "BOOKMARK",
                &json!({"apiVersion": rt.api_version(), "kind": rt.kind, "metadata": m}),
            )
        }
    };
    if ask.initial == Some(true) {
        head.push(bookmark(from, true));
    }
    let head = futures::stream::iter(head.into_iter().map(Ok::<_, std::io::Error>));
    // The permit lives as long as the stream: the watch counts until it ends or the
    // client goes.
    let tail = Tail {
        w,
        sel,
        fields,
        sd,
        done: false,
        _permit: permit,
        passed: from,
        marked: from,
        bookmarks: ask.bookmarks,
    };
    let tail = futures::stream::unfold(tail, move |mut t| {
        let printed = printed.clone();
        let bookmark = bookmark.clone();
        async move {
            if t.done {
                return None;
            }
            loop {
                let idle = tokio::time::sleep(BOOKMARK_EVERY);
                let next = tokio::select! {
                    ev = t.w.next() => ev,
                    _ = t.sd.recv() => return None,
                    _ = sleep_until(ends) => {
                        // The last word: where to resume.
                        t.done = true;
                        if t.bookmarks && t.passed > t.marked {
                            return Some((Ok(bookmark(t.passed, false)), t));
                        }
                        return None;
                    }
                    _ = idle, if t.bookmarks => {
                        if t.passed > t.marked {
                            t.marked = t.passed;
                            return Some((Ok(bookmark(t.passed, false)), t));
                        }
                        continue;
                    }
                };
                match next {
                    Ok(ev) => {
                        t.passed = t.passed.max(ev.rev);
                        if t.sel
                            .as_ref()
                            .is_some_and(|s| !s.matches(meta::labels(&ev.object)))
                            || t.fields.as_ref().is_some_and(|f| !f.matches(&ev.object))
                        {
                            continue;
                        }
                        t.marked = t.passed;
                        let l = match (printed(ev.kind, &ev.object), &ev.text) {
                            (Some(table), _) => table,
                            (None, Some(text)) => line_text(ev.kind, text),
                            (None, None) => line(ev.kind, &ev.object),
                        };
                        return Some((Ok(l), t));
                    }
                    Err(e) => {
                        let status = ApiError::from(e).status_body();
                        t.done = true;
                        return Some((Ok(line("ERROR", &status)), t));
                    }
                }
            }
        }
    });
    let stream = futures::StreamExt::chain(head, tail);
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .header("transfer-encoding", "chunked")
        .body(Body::from_stream(stream))
        .expect("valid response"))
}

/// A watch's state between events.
struct Tail<W> {
    w: W,
    sel: Option<Selector>,
    fields: Option<FieldSelector>,
    sd: crate::shutdown::Shutdown,
    done: bool,
    _permit: super::guard::WatchPermit,
    /// The last revision the watch has passed (delivered or filtered out).
    passed: crate::store::backend::Rev,
    /// The last revision the client was told of (an event or a bookmark).
    marked: crate::store::backend::Rev,
    bookmarks: bool,
}

/// Whether a stored object's text passes a field selector (parsed here: only lists
/// with a `fieldSelector` pay for it).
pub(crate) fn text_matches(f: &FieldSelector, text: &str) -> bool {
    serde_json::from_str::<Value>(text).is_ok_and(|o| f.matches(&o))
}

/// A watch event line around an object's stored text: the same bytes as [`line`]
/// with the parsed object, without parsing or copying it into a `json!` value.
/// Until `at`, or never.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

pub(crate) fn line_text(kind: &str, text: &str) -> Bytes {
    let mut v = Vec::with_capacity(text.len() + 32);
    v.extend_from_slice(b"{\"type\":");
    serde_json::to_writer(&mut v, kind).expect("json string");
    v.extend_from_slice(b",\"object\":");
    v.extend_from_slice(text.as_bytes());
    v.extend_from_slice(b"}\n");
    Bytes::from(v)
}

pub(crate) fn line(kind: &str, obj: &Value) -> Bytes {
    let mut v = serde_json::to_vec(&json!({"type": kind, "object": obj})).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}
