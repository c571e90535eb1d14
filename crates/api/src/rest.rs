//! The kube-style REST API on the operator listener:
//!
//! ```text
//! /api/v1/namespaces/{ns}/{plural}[/{name}[/status]]        core group (Secret)
//! /apis/{group}/{version}/{plural}[/{name}[/status]]        cluster-scoped, or list across namespaces
//! /apis/{group}/{version}/namespaces/{ns}/{plural}[/{name}[/status]]
//! ```
//!
//! Discovery (`/version`, `/api`, `/apis`, each group and group version) is
//! [`super::discovery`]'s, `/openapi/v3` [`super::openapi`]'s, `/openapi/v2` [`super::openapi_v2`]'s; server-side printing (`as=Table`, `as=PartialObjectMetadata`)
//! [`super::table`]'s.
//!
//! GET (one or list, `labelSelector=`, `fieldSelector=`), POST, PUT, PATCH (JSON merge patch, JSON patch, or
//! server-side apply: [`super::apply`]), DELETE,
//! and `?watch=true` ([`super::watch`]).
//! Bodies are YAML when the `Content-Type` names YAML (`application/yaml`), JSON
//! when it names JSON or is absent (kube's default, and nothing guesses); any other
//! type is refused (415, [`super::guard::check_media`]); they are
//! bounded ([`crate::decode`]: size, nesting depth, alias expansion), and all but
//! small JSON ones are decoded on a blocking thread. Responses are
//! JSON unless `Accept` asks for YAML; JSON GET, list and watch bodies are written
//! around the objects' stored text, without parsing it. Every failure is a `Status` object with the
//! HTTP code kube would use. Every route but `/healthz`, `/readyz` and the dashboard's
//! static files (`/ui/`, [`super::ui`]) passes
//! [`super::auth::middleware`] (authentication, authorization, audit).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::Router;
use serde_json::{json, Value};

use super::bodies::{decode_any, decode_body};
use super::error::ApiError;
use super::state::ApiState;
use crate::model::meta;
use crate::model::registry::ResourceType;
use crate::model::selector::{FieldSelector, Selector};
use crate::store::kv::Rev;
use crate::store::{Part, Store};

type ApiResult<T> = Result<T, ApiError>;

/// The router for the API listener.
/// `extra` routes (e.g. the job runner's) are mounted behind the same authentication,
/// authorization and audit ([`super::auth::middleware`]).
pub fn router(state: Arc<ApiState>, extra: Option<Router>) -> Router {
    let mut authed: Router = Router::new()
        .route("/api/{*rest}", any(dispatch))
        .route(super::ui::WHOAMI_PATH, get(super::ui::whoami))
        .route("/version", get(discover))
        .route("/api", get(discover))
        .route("/apis", get(discover))
        .route("/openapi/{*rest}", get(discover))
        .route("/metrics", get(metrics))
        .with_state(state.clone());
    authed = authed.merge(super::reviews::router(state.clone()));
    if let Some(x) = extra {
        authed = authed.merge(x);
    }
    // Everything under /apis that no extra router claimed goes to the resource API.
    let authed = authed
        .fallback(any(dispatch_fallback).with_state(state.clone()))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            super::auth::middleware,
        ));
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz).with_state(state.clone()))
        // The dashboard's static files (no data, no authentication; see api::ui).
        .merge(super::ui::router())
        .merge(authed)
}

/// `/readyz`: 200 once every service has started, 503 before (`/healthz` answers as
/// soon as the API listens).
async fn readyz(State(st): State<Arc<ApiState>>) -> Response {
    if st.ready.load(std::sync::atomic::Ordering::Acquire) {
        "ok".into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting").into_response()
    }
}

async fn dispatch_fallback(
    st: State<Arc<ApiState>>,
    method: Method,
    headers: HeaderMap,
    req: Request,
) -> Response {
    if req.uri().path().starts_with("/apis/") {
        dispatch(st, method, headers, req).await
    } else {
        ApiError::not_found("the server could not find the requested resource").into_response()
    }
}

/// `/metrics` alone, without authentication: the separate plain listener of
/// `[api] metrics_listen`.
pub fn metrics_router(state: Arc<ApiState>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .with_state(state)
}

async fn metrics(State(st): State<Arc<ApiState>>) -> Response {
    let mut out = format!(
        "# TYPE bootplane_store_revision gauge\nbootplane_store_revision {}\n",
        st.store.revision()
    );
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &st.metrics) {
        return ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            format!("encoding metrics: {e}"),
        )
        .into_response();
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}

/// `/version`, `/api`, `/apis` ([`super::discovery`]; the group and group-version
/// documents come through [`dispatch`]) and `/openapi/...` ([`super::openapi`]).
async fn discover(State(st): State<Arc<ApiState>>, headers: HeaderMap, req: Request) -> Response {
    discovery_answer(&st, &headers, req.uri().path()).unwrap_or_else(|| {
        ApiError::not_found("the server could not find the requested resource").into_response()
    })
}

fn discovery_answer(st: &ApiState, h: &HeaderMap, path: &str) -> Option<Response> {
    let text = |n| h.get(n).and_then(|v: &header::HeaderValue| v.to_str().ok());
    let accept = text(header::ACCEPT).unwrap_or_default();
    let reg = st.store.registry();
    super::discovery::answer(reg, path, accept, text(header::HOST))
        .or_else(|| super::openapi_v2::answer(reg, path, accept))
        .or_else(|| super::openapi::answer(reg, path))
}

/// A parsed resource path.
#[derive(Debug)]
struct Target {
    rt: Arc<ResourceType>,
    ns: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

fn parse_path(store: &Store, path: &str) -> ApiResult<Target> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => {
            return Err(ApiError::not_found(
                "the server could not find the requested resource",
            ))
        }
    };
    let (ns, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
        _ => (None, rest),
    };
    let (plural, name, sub) = match rest {
        [p] => (*p, None, None),
        [p, n] => (*p, Some(n.to_string()), None),
        [p, n, s] => (*p, Some(n.to_string()), Some(s.to_string())),
        _ => {
            return Err(ApiError::not_found(format!(
                "the server could not find the requested resource ({path})"
            )))
        }
    };
    let rt = store.registry().by_plural(group, version, plural).ok_or_else(|| {
        let gv = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
        ApiError::not_found(format!("the server could not find the requested resource: unknown resource \"{plural}\" in {gv}"))
    })?;
    if !rt.namespaced && ns.is_some() {
        return Err(ApiError::not_found(format!(
            "{} is cluster-scoped; use /apis/{}/{}",
            rt.kind,
            rt.api_version(),
            rt.plural
        )));
    }
    if let Some(s) = &sub {
        if s != "status" || !rt.status_subresource {
            return Err(ApiError::not_found(format!(
                "{} has no subresource \"{s}\"",
                rt.kind
            )));
        }
    }
    Ok(Target { rt, ns, name, sub })
}

fn accept(h: &HeaderMap) -> &str {
    (h.get(header::ACCEPT).and_then(|v| v.to_str().ok())).unwrap_or_default()
}

fn wants_yaml(h: &HeaderMap) -> bool {
    accept(h).contains("yaml")
}

fn json_response(code: StatusCode, body: Vec<u8>) -> Response {
    (code, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// A `<Kind>List` body written around the items' stored texts: the same bytes as
/// serializing the `json!` list of the parsed items, without parsing them.
fn list_text(rt: &ResourceType, rev: Rev, items: &[Arc<str>]) -> Vec<u8> {
    let len: usize = items.iter().map(|i| i.len() + 1).sum();
    let mut out = Vec::with_capacity(len + 128);
    out.extend_from_slice(b"{\"apiVersion\":");
    serde_json::to_writer(&mut out, &rt.api_version()).expect("json string");
    out.extend_from_slice(b",\"kind\":");
    serde_json::to_writer(&mut out, &format!("{}List", rt.kind)).expect("json string");
    out.extend_from_slice(b",\"metadata\":{\"resourceVersion\":\"");
    out.extend_from_slice(rev.to_string().as_bytes());
    out.extend_from_slice(b"\"},\"items\":[");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(item.as_bytes());
    }
    out.extend_from_slice(b"]}");
    out
}

fn respond(h: &HeaderMap, code: StatusCode, v: &Value) -> Response {
    if wants_yaml(h) {
        let text = serde_norway::to_string(v).unwrap_or_default();
        (code, [(header::CONTENT_TYPE, "application/yaml")], text).into_response()
    } else {
        (
            code,
            [(header::CONTENT_TYPE, "application/json")],
            serde_json::to_vec(v).unwrap_or_default(),
        )
            .into_response()
    }
}

/// 413 naming the body limit.
fn too_large(limit: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "RequestEntityTooLarge",
        format!("request body too large: limit is {limit} bytes"),
    )
}

fn query_map(q: Option<&str>) -> std::collections::HashMap<String, String> {
    q.map(|q| url_pairs(q).collect()).unwrap_or_default()
}

fn url_pairs(q: &str) -> impl Iterator<Item = (String, String)> + '_ {
    q.split('&').filter(|p| !p.is_empty()).map(|p| {
        let (k, v) = p.split_once('=').unwrap_or((p, ""));
        let dec = |s: &str| {
            percent_encoding::percent_decode_str(&s.replace('+', " "))
                .decode_utf8_lossy()
                .into_owned()
        };
        (dec(k), dec(v))
    })
}

async fn dispatch(
    State(st): State<Arc<ApiState>>,
    method: Method,
    headers: HeaderMap,
    req: Request,
) -> Response {
    let uri = req.uri().clone();
    if matches!(method, Method::GET | Method::HEAD) {
        if let Some(r) = discovery_answer(&st, &headers, uri.path()) {
            return r;
        }
    }
    let id = req.extensions().get::<super::authz::Identity>().cloned();
    let conn = req.extensions().get::<super::guard::ConnId>().map(|c| c.0);
    // A declared length over the limit is refused before any of the body is read;
    // an undeclared one (chunked) stops being read at the limit.
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > st.max_body_bytes as u64) {
        return too_large(st.max_body_bytes).into_response();
    }
    let read = axum::body::to_bytes(req.into_body(), st.max_body_bytes);
    let body = match tokio::time::timeout(st.body_read_timeout, read).await {
        Err(_) => {
            return ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "Timeout",
                format!(
                    "request body not received within {} ms",
                    st.body_read_timeout.as_millis()
                ),
            )
            .into_response()
        }
        Ok(Ok(b)) => b,
        Ok(Err(e)) => {
            let mut err = too_large(st.max_body_bytes);
            if !is_length_limit(&e) {
                err = ApiError::bad_request(format!("reading request body: {e}"));
            }
            return err.into_response();
        }
    };
    match handle(
        &st,
        &method,
        &headers,
        (uri.path(), uri.query()),
        body,
        (id.as_ref(), conn),
    )
    .await
    {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// Whether reading a body failed on the size limit (not the connection).
/// `dryRun`: absent, or `All` (kube's one value; it may be given more than once).
fn dry_run(query: Option<&str>) -> ApiResult<bool> {
    let mut dry = false;
    for (k, v) in url_pairs(query.unwrap_or_default()) {
        if k == "dryRun" {
            if v != "All" {
                return Err(ApiError::bad_request(format!(
                    "dryRun: unsupported value {v:?}: the one supported value is \"All\""
                )));
            }
            dry = true;
        }
    }
    Ok(dry)
}

fn is_length_limit(e: &axum::Error) -> bool {
    let mut src: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(x) = src {
        if x.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        src = x.source();
    }
    false
}

/// `watcher`: who asks and on which connection (the watch caps).
async fn handle(
    st: &ApiState,
    method: &Method,
    h: &HeaderMap,
    (path, query): (&str, Option<&str>),
    body: Bytes,
    (id, conn): (Option<&super::authz::Identity>, Option<u64>),
) -> ApiResult<Response> {
    let t = parse_path(&st.store, path)?;
    let q = query_map(query);
    let rt = &t.rt;
    let part = if t.sub.is_some() {
        Part::Status
    } else {
        Part::Main
    };
    // Credentials go only where they belong (see `admission`).
    let admit =
        |name: Option<&str>, w| super::admission::admit(st, id, rt, t.ns.as_deref(), name, w, part);
    let dry = dry_run(query)?;
    let dry_store;
    let store = if dry {
        dry_store = st.store.dry_run();
        &dry_store
    } else {
        &st.store
    };
    match (method.clone(), &t.name) {
        (Method::GET, None) => list_or_watch(st, h, (&t, &q), (id, conn)),
        (Method::GET, Some(name)) => {
            if let Some(form) = super::table::wanted(accept(h)) {
                let o = st.store.get(rt, t.ns.as_deref(), name)?;
                let include = q.get("includeObject").map(String::as_str);
                let v = super::table::render(rt, form, (&[o], false), json!({}), include)?;
                return Ok(respond(h, StatusCode::OK, &v));
            }
            if !wants_yaml(h) {
                let text = st.store.get_text(rt, t.ns.as_deref(), name)?;
                return Ok(json_response(StatusCode::OK, text.as_bytes().to_vec()));
            }
            let o = st.store.get(rt, t.ns.as_deref(), name)?;
            Ok(respond(h, StatusCode::OK, &o))
        }
        (Method::POST, None)
            if rt.group == super::tokens::GROUP && rt.plural == super::tokens::TOKENS =>
        {
            // The secret is made by the server and shown once (`auth::issue`).
            if dry {
                return Err(ApiError::bad_request(
                    "dryRun: a token is issued or not: it cannot be tried",
                ));
            }
            let obj = decode_body(st, h, body).await?;
            super::auth::issue(st, &obj).await
        }
        (Method::POST, None) => {
            let mut obj = decode_body(st, h, body).await?;
            set_namespace(rt, &mut obj, t.ns.as_deref())?;
            super::apply::record(rt, None, &mut obj, part, &super::apply::manager(&q, h)?);
            admit(None, super::admission::Write::Create(&obj))?;
            let o = store.create(rt, obj).await?;
            Ok(respond(h, StatusCode::CREATED, &o))
        }
        (Method::PUT, Some(name)) => {
            let mut obj = decode_body(st, h, body).await?;
            set_namespace(rt, &mut obj, t.ns.as_deref())?;
            match obj.pointer("/metadata/name").and_then(Value::as_str) {
                Some(n) if n != name => {
                    return Err(ApiError::bad_request(format!(
                        "the name of the object ({n}) does not match the name on the URL ({name})"
                    )))
                }
                Some(_) => {}
                None => obj["metadata"]["name"] = Value::String(name.clone()),
            }
            admit(Some(name), super::admission::Write::Replace(&obj))?;
            let manager = super::apply::manager(&q, h)?;
            let ns = t.ns.as_deref();
            // Without a resourceVersion a replace applies to whatever is stored; the
            // managers are recorded against the version it replaces.
            let pinned = meta::resource_version(&obj).is_some();
            let o = patch_with(
                store,
                (rt, ns, name),
                part,
                &manager,
                |o| {
                    let keep = o["metadata"]["resourceVersion"].take();
                    *o = obj.clone();
                    if !pinned {
                        o["metadata"]["resourceVersion"] = keep;
                    }
                    Ok(())
                },
                |_| Ok(()),
            )
            .await?;
            Ok(respond(h, StatusCode::OK, &o))
        }
        (Method::PATCH, Some(name)) => {
            let ct = h
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            // Strategic merge patches only for the core kinds (no custom kind has a
            // strategy: kube answers 415 for them too, and kubectl then sends a merge
            // patch).
            let smp = ct.contains("strategic-merge-patch");
            if (smp && !rt.group.is_empty()) || (ct.contains("apply-patch") && t.sub.is_some()) {
                return Err(ApiError::new(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "UnsupportedMediaType",
                    format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (not on status) (got {ct})"),
                ));
            }
            if ct.contains("apply-patch") {
                let target = (&**rt, t.ns.as_deref(), name.as_str());
                let (o, created) =
                    super::apply::server_side_apply((st, store), (h, body), target, &q, id).await?;
                let code = if created {
                    StatusCode::CREATED
                } else {
                    StatusCode::OK
                };
                return Ok(respond(h, code, &o));
            }
            let ns = t.ns.as_deref();
            let o = patch(st, store, (h, body, smp), (rt, ns, name), part, (&q, id)).await?;
            Ok(respond(h, StatusCode::OK, &o))
        }
        (Method::DELETE, Some(name)) => {
            let o = delete(st, (store, dry), (h, body), (rt, t.ns.as_deref(), name)).await?;
            Ok(respond(h, StatusCode::OK, &o))
        }
        (m, _) => Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            format!("method {m} is not supported on {path}"),
        )),
    }
}

/// PATCH other than an apply: a JSON patch (RFC 6902), a strategic merge patch (`smp`:
/// the core kinds) or a merge patch (RFC 7386), through [`patch_with`].
async fn patch(
    st: &ApiState,
    store: &Store,
    (h, body, smp): (&HeaderMap, Bytes, bool),
    (rt, ns, name): (&ResourceType, Option<&str>, &str),
    part: Part,
    (q, id): (
        &std::collections::HashMap<String, String>,
        Option<&super::authz::Identity>,
    ),
) -> ApiResult<Arc<Value>> {
    enum Kind {
        Json(Vec<Value>),
        Strategic(Value),
        Merge(Value),
    }
    let json_patch = (h.get(header::CONTENT_TYPE))
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.contains("json-patch"));
    let patch = if json_patch {
        let doc = decode_any(st, h, body).await?;
        Kind::Json(crate::model::jsonpatch::check_ops(&doc).map_err(ApiError::bad_request)?)
    } else if smp {
        Kind::Strategic(decode_any(st, h, body).await?)
    } else {
        let doc = decode_body(st, h, body).await?;
        if !doc.is_object() {
            return Err(ApiError::bad_request("merge patch must be a JSON object"));
        }
        Kind::Merge(doc)
    };
    let change = |o: &mut Value| match &patch {
        Kind::Json(ops) => crate::model::jsonpatch::apply(o, ops),
        Kind::Strategic(doc) => crate::model::smp::apply(o, doc),
        Kind::Merge(doc) => {
            crate::store::merge_patch(o, doc);
            Ok(())
        }
    };
    let manager = super::apply::manager(q, h)?;
    patch_with(store, (rt, ns, name), part, &manager, change, |new| {
        let w = super::admission::Write::Replace(new);
        super::admission::admit(st, id, rt, ns, Some(name), w, part)
    })
    .await
}

/// DELETE of one object, with the DeleteOptions in `body`: a `preconditions`
/// resourceVersion, `propagationPolicy`, and `dryRun` (kubectl sends it here rather
/// than on the query).
async fn delete(
    st: &ApiState,
    (store, dry): (&crate::store::Store, bool),
    (h, body): (&HeaderMap, Bytes),
    (rt, ns, name): (&ResourceType, Option<&str>, &str),
) -> ApiResult<Arc<Value>> {
    let opts = if body.is_empty() {
        Value::Null
    } else {
        decode_body(st, h, body).await?
    };
    let pre = (opts.pointer("/preconditions/resourceVersion"))
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok());
    // Dependents go with their owner, in the same transaction: what Background and
    // Foreground come to once done. Orphaning them is refused rather than ignored.
    let policy = opts.get("propagationPolicy").and_then(Value::as_str);
    if !matches!(policy, None | Some("Background" | "Foreground" | "Orphan")) {
        return Err(ApiError::bad_request(format!(
            "propagationPolicy: unsupported value {:?}: \"Background\", \"Foreground\" or \"Orphan\"",
            policy.unwrap_or_default()
        )));
    }
    if policy == Some("Orphan") || opts.get("orphanDependents") == Some(&Value::Bool(true)) {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            "propagationPolicy: Unsupported value: \"Orphan\": bootplane removes an object's dependents with it (Background, Foreground)",
        ));
    }
    let in_body = match opts.get("dryRun") {
        None | Some(Value::Null) => false,
        Some(Value::Array(v)) if v.iter().all(|x| x == "All") => !v.is_empty(),
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "dryRun: unsupported value {other}: the one supported value is \"All\""
            )))
        }
    };
    Ok(if in_body && !dry {
        st.store.dry_run().delete(rt, ns, name, pre).await?
    } else {
        store.delete(rt, ns, name, pre).await?
    })
}

/// A write onto the stored object (`change`: a merge, JSON (RFC 6902) or strategic merge
/// patch, or a replace), recorded as `manager`'s in `managedFields`, written back as a
/// compare-and-swap against the version it was applied to, and applied again to the
/// newer version when another write came between (as kube does), a few times at most;
/// not when the write names a resourceVersion other than the stored one (a stale
/// client: 409 at once). A patch that fails (a `test`, a missing path, an unknown
/// directive) is 422 and changes nothing.
async fn patch_with(
    store: &crate::store::Store,
    (rt, ns, name): (&ResourceType, Option<&str>, &str),
    part: Part,
    manager: &str,
    change: impl Fn(&mut Value) -> Result<(), String>,
    admit: impl Fn(&Value) -> ApiResult<()>,
) -> ApiResult<Arc<Value>> {
    const TRIES: usize = 5;
    let mut tries = 0;
    loop {
        let cur = store.get(rt, ns, name)?;
        let mut new = Value::clone(&cur);
        change(&mut new).map_err(|e| {
            // kubectl prints the causes: `The servers "a" is invalid: patch: ...`.
            let mut err = ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", e.clone());
            err.details = Some(json!({"name": name, "group": rt.group, "kind": rt.plural,
                "causes": [{"reason": "FieldValueInvalid", "message": e, "field": "patch"}]}));
            err
        })?;
        if meta::name(&new) != name {
            return Err(ApiError::bad_request(
                "a patch may not change metadata.name",
            ));
        }
        admit(&new)?;
        let stale = meta::resource_version(&new) != meta::resource_version(&cur);
        super::apply::record(rt, Some(&cur), &mut new, part, manager);
        match store.update_from(rt, cur, new, part).await {
            Err(crate::store::StoreError::Conflict { .. }) if !stale && tries + 1 < TRIES => {
                tries += 1
            }
            r => return Ok(r?),
        }
    }
}

/// GET on a collection: a list (JSON written around the stored texts, YAML, or a
/// server-side table) or, with `watch`, a watch.
fn list_or_watch(
    st: &ApiState,
    h: &HeaderMap,
    (t, q): (&Target, &std::collections::HashMap<String, String>),
    (id, conn): (Option<&super::authz::Identity>, Option<u64>),
) -> ApiResult<Response> {
    let rt = &t.rt;
    let sel = match q.get("labelSelector") {
        Some(s) => Some(Selector::parse(s).map_err(ApiError::bad_request)?),
        None => None,
    };
    let fields = match q.get("fieldSelector") {
        Some(s) => {
            Some(FieldSelector::parse(s).map_err(ApiError::bad_request)?).filter(|f| !f.is_empty())
        }
        None => None,
    };
    if q.get("watch").is_some_and(|w| w == "true" || w == "1") {
        let user = id.map(|i| i.user.as_str()).unwrap_or_default();
        let ask = super::watch::WatchAsk::from_query(q)?;
        let permit = st.watches.open(user, conn)?;
        return super::watch::watch(
            st,
            permit,
            (rt.clone(), t.ns.clone()),
            (sel, fields),
            ask,
            super::table::wanted(accept(h)),
        );
    }
    super::paging::check_version(q, st.store.revision())?;
    let paging = super::paging::Paging::from_query(q)?;
    let form = super::table::wanted(accept(h));
    if paging.is_some() || form.is_some() {
        let (limit, after) = paging.map_or((None, None), |p| (p.limit, p.after));
        let keep = fields.as_ref().map(|f| move |o: &Value| f.matches(o));
        let page = st.store.list_page(
            rt,
            (t.ns.as_deref(), sel.as_ref()),
            (after.as_deref(), limit.unwrap_or(usize::MAX)),
            keep.as_ref().map(|k| k as &dyn Fn(&Value) -> bool),
        );
        let mut meta = json!({"resourceVersion": page.rev.to_string()});
        if let Some(next) = &page.next {
            meta["continue"] = json!(super::paging::token(next));
            if let Some(n) = page.remaining {
                meta["remainingItemCount"] = json!(n);
            }
        }
        let v = match form {
            Some(form) => {
                let include = q.get("includeObject").map(String::as_str);
                super::table::render(rt, form, (&page.items, true), meta, include)?
            }
            None => json!({
                "apiVersion": rt.api_version(),
                "kind": format!("{}List", rt.kind),
                "metadata": meta,
                "items": page.items.iter().map(|o| Value::clone(o)).collect::<Vec<_>>(),
            }),
        };
        return Ok(respond(h, StatusCode::OK, &v));
    }
    if !wants_yaml(h) {
        let (mut items, rev) = st.store.list_text(rt, t.ns.as_deref(), sel.as_ref());
        if let Some(f) = &fields {
            items.retain(|t| super::watch::text_matches(f, t));
        }
        return Ok(json_response(StatusCode::OK, list_text(rt, rev, &items)));
    }
    let (items, rev) = st.store.list(rt, t.ns.as_deref(), sel.as_ref());
    let list = json!({
        "apiVersion": rt.api_version(),
        "kind": format!("{}List", rt.kind),
        "metadata": {"resourceVersion": rev.to_string()},
        "items": items
            .filter(|o| fields.as_ref().is_none_or(|f| f.matches(o)))
            .map(Arc::unwrap_or_clone)
            .collect::<Vec<_>>(),
    });
    Ok(respond(h, StatusCode::OK, &list))
}

fn set_namespace(rt: &ResourceType, obj: &mut Value, ns: Option<&str>) -> ApiResult<()> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    if !rt.namespaced {
        return Ok(());
    }
    let body_ns = obj
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .map(String::from);
    match (ns, body_ns) {
        (Some(u), Some(b)) if u != b => Err(ApiError::bad_request(format!(
            "the namespace of the provided object ({b}) does not match the namespace sent on the request ({u})"
        ))),
        (Some(u), None) => {
            obj["metadata"]["namespace"] = Value::String(u.into());
            Ok(())
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::registry::Registry;

    #[test]
    fn text_bodies_are_the_bytes_of_the_json_forms() {
        let rt = Registry::global().resolve("serverclaim").unwrap();
        let items = [
            json!({"metadata": {"name": "b", "labels": {"é\"": "\n"}}, "spec": {"x": [1, 2.5]}}),
            json!({"z": null, "metadata": {"name": "a"}}),
        ];
        let texts: Vec<Arc<str>> = items.iter().map(|i| Arc::from(i.to_string())).collect();
        let list = json!({
            "apiVersion": rt.api_version(),
            "kind": format!("{}List", rt.kind),
            "metadata": {"resourceVersion": "42"},
            "items": items.to_vec(),
        });
        assert_eq!(
            list_text(&rt, 42, &texts),
            serde_json::to_vec(&list).unwrap()
        );
        let empty = json!({
            "apiVersion": rt.api_version(),
            "kind": format!("{}List", rt.kind),
            "metadata": {"resourceVersion": "7"},
            "items": [],
        });
        assert_eq!(list_text(&rt, 7, &[]), serde_json::to_vec(&empty).unwrap());
        for kind in ["ADDED", "MODIFIED"] {
            assert_eq!(
                super::super::watch::line_text(kind, &texts[0]),
                super::super::watch::line(kind, &items[0])
            );
        }
    }

    #[test]
    fn paths() {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(d.path()).unwrap();
        let t = parse_path(
            &s,
            "/apis/metal.ironcore.dev/v1alpha1/namespaces/default/serverclaims/x",
        )
        .unwrap();
        assert_eq!(
            (t.rt.kind.as_str(), t.ns.as_deref(), t.name.as_deref()),
            ("ServerClaim", Some("default"), Some("x"))
        );
        let t = parse_path(&s, "/apis/metal.ironcore.dev/v1alpha1/servers/a/status").unwrap();
        assert_eq!(t.sub.as_deref(), Some("status"));
        let t = parse_path(&s, "/api/v1/namespaces/default/secrets").unwrap();
        assert_eq!(t.rt.kind, "Secret");
        let e = parse_path(&s, "/apis/metal.ironcore.dev/v1alpha1/widgets").unwrap_err();
        assert_eq!(e.code, StatusCode::NOT_FOUND);
        assert!(e.message.contains("widgets"));
        assert!(parse_path(&s, "/apis/metal.ironcore.dev/v1alpha1/servers/a/scale").is_err());
    }
}
