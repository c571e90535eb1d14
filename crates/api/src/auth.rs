//! Who is calling the API and what they may do: authentication (the bootstrap token,
//! named bearer tokens stored as `APIToken` objects, verified client certificates) and
//! authorization (roles as rules of verbs × resources, kube's RBAC without bindings: a
//! caller's groups that name a role grant it).
//!
//! Every route of the API listener but `/healthz` and `/readyz` goes through
//! [`middleware`]: authenticate (401), derive the request's [`Attrs`] (verb, API
//! group, resource, namespace, name), authorize against the caller's roles (403 with a
//! kube `Status` naming the verb and resource), then hand the request on with the
//! [`Identity`] as an extension; writes and denials are written to the audit log
//! ([`super::audit`]).
//!
//! Named tokens look like `bp1.NAME.SECRET`: NAME is the `APIToken` object
//! (`auth.bootplane.dev/v1alpha1`, cluster-scoped) holding the role, the expiry and the
//! SHA-256 of SECRET, so checking a token is one get from the store (in memory on both
//! engines) and one hash. SECRET is 256 random bits from the OS generator: nobody can
//! guess or brute-force a preimage of its hash, so a slow password KDF (bcrypt,
//! argon2) would add a per-request cost and no security; KDFs exist for low-entropy
//! human passwords. Hashes are compared in constant time. A token is revoked by deleting
//! its object: the next request with it is 401.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::authz::{Attrs, Identity};
use super::error::ApiError;
use super::state::ApiState;
use super::tokens::{
    ct_eq, secret_hash, valid_token_name, BOOTSTRAP_USER, DEFAULT_TTL_SECONDS, GROUP,
    MAX_TTL_SECONDS, TOKENS, TOKEN_PREFIX,
};
use crate::model::registry::Registry;
use crate::store::Store;
use crate::tls::PeerCert;

/// Why a request was not authenticated (the message of its 401).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum AuthnError {
    #[error("missing bearer token or client certificate")]
    Missing,
    #[error("invalid bearer token")]
    Invalid,
    #[error("bearer token expired")]
    Expired,
}

/// Who presents `bearer` (the text after `Bearer `): the bootstrap token, or a named
/// token found in the store, unexpired, whose secret hashes to the stored hash.
pub(crate) fn authenticate_token(
    store: &Store,
    bootstrap: &str,
    bearer: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<Identity, AuthnError> {
    let bearer = bearer.trim();
    if ct_eq(bearer.as_bytes(), bootstrap.as_bytes()) {
        return Ok(Identity {
            user: BOOTSTRAP_USER.into(),
            groups: vec!["admin".into()],
        });
    }
    let (name, secret) = bearer
        .strip_prefix(TOKEN_PREFIX)
        .and_then(|r| r.split_once('.'))
        .ok_or(AuthnError::Invalid)?;
    if !valid_token_name(name) {
        return Err(AuthnError::Invalid);
    }
    let rt = Registry::global()
        .by_plural(GROUP, "v1alpha1", TOKENS)
        .expect("APIToken is registered");
    let obj = store
        .get(&rt, None, name)
        .map_err(|_| AuthnError::Invalid)?;
    let stored = obj
        .pointer("/spec/secretHash")
        .and_then(Value::as_str)
        .unwrap_or("");
    if !ct_eq(secret_hash(secret).as_bytes(), stored.as_bytes()) {
        return Err(AuthnError::Invalid);
    }
    if let Some(exp) = obj.pointer("/spec/expiresAt").and_then(Value::as_str) {
        match chrono::DateTime::parse_from_rfc3339(exp) {
            Ok(t) if t > now => {}
            _ => return Err(AuthnError::Expired),
        }
    }
    let role = obj
        .pointer("/spec/role")
        .and_then(Value::as_str)
        .unwrap_or("");
    Ok(Identity {
        user: name.to_string(),
        groups: vec![role.to_string()],
    })
}

/// The identity of a request: its bearer token if it has one, else its verified
/// client certificate (CN → user, O → groups).
fn authenticate(st: &ApiState, req: &Request) -> Result<Identity, AuthnError> {
    if let Some(h) = req.headers().get(header::AUTHORIZATION) {
        let t = h
            .to_str()
            .ok()
            .and_then(|h| h.strip_prefix("Bearer "))
            .ok_or(AuthnError::Invalid)?;
        return authenticate_token(&st.store, &st.token, t, chrono::Utc::now());
    }
    match req.extensions().get::<PeerCert>() {
        Some(c) if !c.cn.is_empty() => Ok(Identity {
            user: c.cn.clone(),
            groups: c.orgs.clone(),
        }),
        _ => Err(AuthnError::Missing),
    }
}

/// Authenticate, authorize, run, audit: in front of every API route. Between
/// authentication and authorization, [`super::guard`]'s checks: a body that is neither
/// JSON nor YAML is 415, and a request authenticated only by a client certificate that a
/// browser sent from another site is 403 (a bearer token is not ambient: a page on
/// another site cannot attach it).
pub(crate) async fn middleware(
    State(st): State<Arc<ApiState>>,
    mut req: Request,
    next: Next,
) -> Response {
    use http_body::Body as _;
    let attrs = Attrs::derive(req.method(), req.uri().path(), req.uri().query());
    let source = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    let has_body = !req.body().is_end_stream() && req.body().size_hint().exact() != Some(0);
    let bearer = req.headers().get(header::AUTHORIZATION);
    // A named token (not the bootstrap one): its last use is recorded.
    let named = bearer.is_some_and(|h| h.as_bytes().starts_with(b"Bearer bp1."));
    let bearer = bearer.is_some();
    let (resp, id) = match authenticate(&st, &req) {
        Err(e) => {
            // Summed per source in the audit log; one line per request here would let
            // anyone who can connect flood the journal.
            tracing::debug!(path = %req.uri().path(), source = ?source, reason = %e, "api request not authenticated");
            let r = ApiError::new(StatusCode::UNAUTHORIZED, "Unauthorized", e.to_string());
            drain(req, has_body).await;
            (r.into_response(), None)
        }
        Ok(id) => {
            // kube's protobuf passes here for every route (the guard's `Media::Protobuf`);
            // what cannot read it answers 415 itself (`kubepb`).
            let media = super::guard::check_media(req.headers(), has_body);
            let refused = media.err().or_else(|| {
                (!bearer && super::guard::cross_site(req.headers(), req.uri()))
                    .then(|| super::guard::cross_site_refusal(&id.user))
            });
            if let Some(e) = refused {
                tracing::info!(user = %id.user, verb = %attrs.verb, resource = %attrs.resource_path(), code = e.code.as_u16(), "api request refused");
                drain(req, has_body).await;
                (e.into_response(), Some(id))
            } else if !st.roles.allows(&id, &attrs)
                && req.uri().path() != super::ui::WHOAMI_PATH
                && !super::reviews::is_self_review(req.uri().path())
            {
                // Every authenticated caller may ask what it may do (the dashboard's
                // whoami, kube's self reviews).
                tracing::info!(user = %id.user, verb = %attrs.verb, resource = %attrs.resource_path(), "api request forbidden");
                drain(req, has_body).await;
                (attrs.forbidden(&id.user).into_response(), Some(id))
            } else {
                if named {
                    st.token_use.note(&st.store, &id.user);
                }
                req.extensions_mut().insert(id.clone());
                (next.run(req).await, Some(id))
            }
        }
    };
    let code = resp.status().as_u16();
    if attrs.is_write() || code == 401 || code == 403 {
        let groups = id.as_ref().map(|i| i.groups.clone()).unwrap_or_default();
        let user = id
            .as_ref()
            .map(|i| i.user.as_str())
            .unwrap_or("system:anonymous");
        st.audit
            .record(&super::audit::Event {
                user,
                groups: &groups,
                source,
                attrs: &attrs,
                code,
            })
            .await;
    }
    resp
}

/// Most of a refused request's body read before answering, and how long it may take.
const DRAIN_BYTES: usize = 64 << 10;
const DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(1);

/// Read (and drop) a small body of a request refused before anything read it, so the
/// connection can carry the client's next request: a connection whose request body is
/// left unread is closed after the answer, and a client that sent its next request on
/// it meanwhile gets no answer (Go's `net/http` server drains the same way, up to 256
/// KiB). A body larger than [`DRAIN_BYTES`] or slower than [`DRAIN_TIME`] is left, and
/// that connection closes.
async fn drain(req: Request, has_body: bool) {
    if has_body {
        let body = axum::body::to_bytes(req.into_body(), DRAIN_BYTES);
        let _ = tokio::time::timeout(DRAIN_TIME, body).await;
    }
}

/// `POST /apis/auth.bootplane.dev/v1alpha1/apitokens`: make a token. The body names it
/// and its role (`{"metadata": {"name": N}, "spec": {"role": R, "ttlSeconds": S}}`;
/// without `ttlSeconds` it expires after [`DEFAULT_TTL_SECONDS`], `0` never);
/// the secret is generated here, only its hash is stored, and the answer (201) is the
/// stored object with the token in `status.token`, the only time it is shown.
pub(crate) async fn issue(st: &ApiState, body: &Value) -> Result<Response, ApiError> {
    let name = body
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    if !valid_token_name(name) {
        return Err(ApiError::bad_request(format!(
            "invalid token name {name:?}: a DNS label (lower case letters, digits, '-', at most 63)"
        )));
    }
    let role = body
        .pointer("/spec/role")
        .and_then(Value::as_str)
        .unwrap_or("");
    if !st.roles.exists(role) {
        return Err(ApiError::bad_request(format!("unknown role {role:?}")));
    }
    let ttl = match body.pointer("/spec/ttlSeconds") {
        None | Some(Value::Null) => Some(DEFAULT_TTL_SECONDS),
        Some(v) => match v.as_u64() {
            // Explicitly never expiring.
            Some(0) => None,
            Some(s) if s <= MAX_TTL_SECONDS => Some(s),
            _ => {
                return Err(ApiError::bad_request(format!(
                    "spec.ttlSeconds must be between 0 (no expiry) and {MAX_TTL_SECONDS}"
                )))
            }
        },
    };
    let secret = {
        use rand::RngCore;
        let mut b = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut b);
        hex::encode(b)
    };
    let mut spec = json!({"role": role, "secretHash": secret_hash(&secret)});
    if let Some(s) = ttl {
        let exp = chrono::Utc::now() + chrono::Duration::seconds(s as i64);
        spec["expiresAt"] = Value::String(exp.to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
    }
    let obj = json!({
        "apiVersion": format!("{GROUP}/v1alpha1"),
        "kind": "APIToken",
        "metadata": {"name": name},
        "spec": spec,
    });
    let rt = Registry::global()
        .by_plural(GROUP, "v1alpha1", TOKENS)
        .expect("APIToken is registered");
    let created = st.store.create(&rt, obj).await?;
    let mut out = Arc::unwrap_or_clone(created);
    out["status"] = json!({"token": format!("{TOKEN_PREFIX}{name}.{secret}")});
    Ok((
        StatusCode::CREATED,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_vec(&out).unwrap_or_default(),
    )
        .into_response())
}

#[cfg(test)]
mod tests;
