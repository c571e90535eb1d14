//! The web dashboard (`/ui/`) served on the API listener: plain HTML, vanilla
//! JavaScript modules and CSS embedded in the binary (no framework, no CDN, no build
//! step), and [`whoami`], the small endpoint the page asks what its caller may do.
//!
//! The static files carry no data, so [`router`] serves them without authentication
//! (mounted beside `/healthz`, outside [`super::auth::middleware`]); every piece of data
//! the page shows comes from the REST API with the caller's own credentials: a bearer
//! token typed into the sign-in form (kept in `sessionStorage`), or the client
//! certificate the browser presents during the TLS handshake. Every response carries a
//! strict `Content-Security-Policy` (scripts and styles from this origin only, nothing
//! inline, no framing) and a content ETag; `Cache-Control: no-cache` makes the browser
//! revalidate (a 304 when nothing changed), so an upgraded binary is picked up at once.
//! See docs/dashboard.md.

use std::sync::{Arc, OnceLock};

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::{Extension, Router};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use super::authz::{Attrs, Identity, VERBS};
use super::state::ApiState;

/// Where the dashboard lives.
pub(crate) const PREFIX: &str = "/ui/";

/// `GET /api/whoami`: the caller's user, groups and allowed verbs per resource. Every
/// authenticated caller may ask about itself (the auth middleware lets this path past
/// authorization, as kube lets every user create a SelfSubjectRulesReview).
pub(crate) const WHOAMI_PATH: &str = "/api/whoami";

/// The content security policy of every dashboard response.
pub(crate) const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
img-src 'self' data:; connect-src 'self'; font-src 'self'; manifest-src 'self'; \
base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// One embedded file.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

const ASSETS: &[Asset] = &[
    Asset {
        name: "index.html",
        content_type: "text/html; charset=utf-8",
        body: include_bytes!("assets/index.html"),
    },
    Asset {
        name: "style.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("assets/style.css"),
    },
    Asset {
        name: "api.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("assets/api.js"),
    },
    Asset {
        name: "dom.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("assets/dom.js"),
    },
    Asset {
        name: "app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("assets/app.js"),
    },
    Asset {
        name: "pages.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("assets/pages.js"),
    },
    Asset {
        name: "fleet.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("assets/fleet.js"),
    },
    Asset {
        name: "favicon.svg",
        content_type: "image/svg+xml",
        body: include_bytes!("assets/favicon.svg"),
    },
];

/// The embedded file names (for tests and docs).
pub fn asset_names() -> impl Iterator<Item = &'static str> {
    ASSETS.iter().map(|a| a.name)
}

/// Strong ETags of the assets, computed once.
fn etags() -> &'static Vec<String> {
    static E: OnceLock<Vec<String>> = OnceLock::new();
    E.get_or_init(|| {
        ASSETS
            .iter()
            .map(|a| format!("\"{}\"", &hex::encode(Sha256::digest(a.body))[..32]))
            .collect()
    })
}

/// The dashboard's routes (no authentication: see the module doc).
pub(crate) fn router() -> Router {
    Router::new()
        .route("/ui", get(|| async { Redirect::permanent(PREFIX) }))
        .route(
            "/ui/",
            get(|h: HeaderMap| async move { serve("index.html", &h) }),
        )
        .route(
            "/ui/{file}",
            get(|Path(f): Path<String>, h: HeaderMap| async move { serve(&f, &h) }),
        )
}

fn security_headers(resp: &mut Response) {
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
}

fn serve(name: &str, req: &HeaderMap) -> Response {
    let Some(i) = ASSETS.iter().position(|a| a.name == name) else {
        let mut r = (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "not found",
        )
            .into_response();
        security_headers(&mut r);
        return r;
    };
    let a = &ASSETS[i];
    let etag = &etags()[i];
    let fresh = req
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag));
    let mut r = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        ([(header::CONTENT_TYPE, a.content_type)], a.body).into_response()
    };
    let h = r.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(v) = HeaderValue::from_str(etag) {
        h.insert(header::ETAG, v);
    }
    security_headers(&mut r);
    r
}

/// The resources the dashboard shows or acts on, as (group, plural, subresource).
fn resources(st: &ApiState) -> Vec<(String, String, Option<String>)> {
    let mut out: Vec<(String, String, Option<String>)> = st
        .store
        .registry()
        .types
        .iter()
        .flat_map(|t| {
            [
                (t.group.clone(), t.plural.clone(), None),
                (
                    t.group.clone(),
                    t.plural.clone(),
                    Some("status".to_string()),
                ),
            ]
        })
        .collect();
    for (name, group) in super::authz::NON_RESOURCES {
        out.push((group.to_string(), name.to_string(), None));
    }
    out
}

/// `GET /api/whoami`: `{user, groups, resources: {"servers": ["get", ...],
/// "servers/status": [...], ...}}` with the verbs the caller's roles allow on each
/// resource (any namespace, any name). The page shows action buttons only for what is
/// allowed; the API decides again on every call.
pub(crate) async fn whoami(
    State(st): State<Arc<ApiState>>,
    Extension(id): Extension<Identity>,
) -> Response {
    let mut res = Map::new();
    for (group, plural, sub) in resources(&st) {
        let verbs: Vec<Value> = VERBS
            .iter()
            .filter(|v| {
                let a = Attrs {
                    verb: v.to_string(),
                    group: group.clone(),
                    resource: plural.clone(),
                    sub: sub.clone(),
                    namespace: None,
                    name: None,
                };
                st.roles.allows(&id, &a)
            })
            .map(|v| Value::String(v.to_string()))
            .collect();
        let key = match &sub {
            Some(s) => format!("{plural}/{s}"),
            None => plural,
        };
        res.insert(key, Value::Array(verbs));
    }
    axum::Json(json!({
        "kind": "WhoAmI",
        "apiVersion": "ui.bootplane.dev/v1alpha1",
        "user": id.user,
        "groups": id.groups,
        "resources": res,
    }))
    .into_response()
}
