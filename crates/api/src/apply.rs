//! Server-side apply on the REST API: `PATCH .../NAME?fieldManager=M[&force=true]` with
//! `Content-Type: application/apply-patch+yaml` (`kubectl apply --server-side`, Flux,
//! Argo CD). The fields and conflicts are [`crate::model::apply`]'s; here the request is
//! checked, the object read, applied to and written back (created when there is none), as
//! a compare-and-swap tried again when another write came between. Conflicts are 409
//! with kube's message and one cause per field, so kubectl prints them as it does
//! against a real apiserver.

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use serde_json::{json, Value};

use super::error::ApiError;
use super::state::ApiState;
use crate::model::apply::{self, Request};
use crate::model::registry::ResourceType;
use crate::store::{Part, StoreError};

/// Writes tried before giving up on a busy object.
const TRIES: usize = 5;

/// Apply the configuration in `body` to `rt` `name` (in `ns`): the stored object, and
/// whether it was created.
/// `store` is `st`'s or its dry-run clone (`dryRun=All`).
pub(crate) async fn server_side_apply(
    (st, store): (&ApiState, &crate::store::Store),
    (h, body): (&HeaderMap, Bytes),
    (rt, ns, name): (&ResourceType, Option<&str>, &str),
    q: &std::collections::HashMap<String, String>,
    id: Option<&super::authz::Identity>,
) -> Result<(Value, bool), ApiError> {
    let invalid = |msg: String| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", msg);
    let manager = q
        .get("fieldManager")
        .map(String::as_str)
        .unwrap_or_default();
    if manager.is_empty() || manager.len() > 128 {
        return Err(invalid(
            "fieldManager: Required value: is required for apply patch (at most 128 characters)"
                .into(),
        ));
    }
    let force = match q.get("force").map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "force: invalid value {other:?}"
            )))
        }
    };
    let mut config = super::bodies::decode_body(st, h, body).await?;
    if config.get("metadata").is_some_and(|m| !m.is_object()) {
        return Err(invalid("metadata: must be a mapping".into()));
    }
    let api_version = config["apiVersion"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if api_version != rt.api_version() || config["kind"] != rt.kind.as_str() {
        return Err(invalid(format!(
            "apiVersion and kind must be {} {} (got {:?} {})",
            rt.api_version(),
            rt.kind,
            api_version,
            config["kind"]
        )));
    }
    match config.pointer("/metadata/name").and_then(Value::as_str) {
        Some(n) if n != name => {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({name})"
            )))
        }
        _ => config["metadata"]["name"] = json!(name),
    }
    if let Some(ns) = ns.filter(|_| rt.namespaced) {
        config["metadata"]["namespace"] = json!(ns);
    }
    let now = crate::store::now();
    let req = Request {
        manager,
        force,
        api_version: &api_version,
        now: &now,
        status_subresource: rt.status_subresource,
    };
    for _ in 0..TRIES {
        let live = match store.get(rt, ns, name) {
            Ok(o) => Some(o),
            Err(StoreError::NotFound { .. }) => None,
            Err(e) => return Err(e.into()),
        };
        let new =
            apply::apply(live.as_deref(), &config, &req).map_err(|c| conflicts(rt, name, &c))?;
        let w = match live {
            None => super::admission::Write::Create(&new),
            Some(_) => super::admission::Write::Replace(&new),
        };
        super::admission::admit(st, id, rt, ns, Some(name), w, Part::Main)?;
        let written = match live {
            None => store.create(rt, new).await.map(|o| (o, true)),
            Some(cur) => store
                .update_from(rt, cur, new, Part::Main)
                .await
                .map(|o| (o, false)),
        };
        match written {
            Err(StoreError::AlreadyExists { .. } | StoreError::Conflict { .. }) => continue,
            Err(e) => return Err(e.into()),
            Ok((o, created)) => return Ok((Value::clone(&o), created)),
        }
    }
    Err(ApiError::new(
        StatusCode::CONFLICT,
        "Conflict",
        format!("{} {name:?} kept changing: apply again", rt.qualified()),
    ))
}

/// The manager of a write other than an apply: `fieldManager` (1 to 128 printable
/// characters) or, as kube, the client's user agent up to its first `/` (`kubectl`,
/// `python`), at most 128 characters.
pub(crate) fn manager(
    q: &std::collections::HashMap<String, String>,
    h: &HeaderMap,
) -> Result<String, ApiError> {
    if let Some(m) = q.get("fieldManager") {
        if m.is_empty() || m.chars().count() > 128 || m.chars().any(char::is_control) {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Invalid",
                "fieldManager: Invalid value: must be 1 to 128 printable characters",
            ));
        }
        return Ok(m.clone());
    }
    let agent = (h.get(axum::http::header::USER_AGENT))
        .and_then(|v| v.to_str().ok())
        .and_then(|a| a.split('/').next())
        .map(|a| {
            a.chars()
                .filter(|c| !c.is_control())
                .take(128)
                .collect::<String>()
        })
        .filter(|a| !a.is_empty());
    Ok(agent.unwrap_or_else(|| "unknown".into()))
}

/// Record a write other than an apply in `new`'s `managedFields`
/// ([`apply::record_update`]), with `new` as the store will keep it: a write of the main
/// part keeps the stored status (where the kind has the subresource), a status write the
/// stored rest.
pub(crate) fn record(
    rt: &ResourceType,
    cur: Option<&Value>,
    new: &mut Value,
    part: Part,
    manager: &str,
) {
    let status = part == Part::Status;
    let mut full = match (part, cur) {
        (Part::Status, Some(cur)) => {
            let mut f = cur.clone();
            if let Some(m) = f.as_object_mut() {
                match new.get("status") {
                    Some(s) => m.insert("status".into(), s.clone()),
                    None => m.shift_remove("status"),
                };
            }
            if let Some(m) = new.pointer("/metadata/managedFields") {
                f["metadata"]["managedFields"] = m.clone();
            }
            f
        }
        _ => new.clone(),
    };
    if !status && rt.status_subresource {
        if let Some(m) = full.as_object_mut() {
            match cur.and_then(|c| c.get("status")) {
                Some(s) => m.insert("status".into(), s.clone()),
                None => m.shift_remove("status"),
            };
        }
    }
    let now = crate::store::now();
    let api_version = rt.api_version();
    let u = apply::Update {
        manager,
        api_version: &api_version,
        now: &now,
        status_subresource: rt.status_subresource,
        status,
    };
    apply::record_update(cur, &mut full, &u);
    let Some(meta) = new.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    match full.pointer("/metadata/managedFields") {
        Some(m) => meta.insert("managedFields".into(), m.clone()),
        None => meta.shift_remove("managedFields"),
    };
}

/// 409 naming each conflicting field and its manager, as kube's.
fn conflicts(rt: &ResourceType, name: &str, c: &[apply::Conflict]) -> ApiError {
    let mut e = ApiError::new(StatusCode::CONFLICT, "Conflict", apply::conflict_message(c));
    let causes: Vec<Value> = (c.iter())
        .map(|c| {
            json!({"reason": "FieldManagerConflict", "message": format!("conflict with {:?}", c.manager),
                   "field": c.field})
        })
        .collect();
    e.details = Some(json!({"name": name, "group": rt.group, "kind": rt.plural, "causes": causes}));
    e
}
