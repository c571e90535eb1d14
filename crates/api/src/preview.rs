//! Operator preview of what a machine is served, on the (authenticated) API listener:
//!
//! ```text
//! GET /apis/boot.bootplane.dev/v1alpha1/render/ignition/{server}   the Ignition JSON
//! GET /apis/boot.bootplane.dev/v1alpha1/render/ipxe/{server}       the iPXE script
//! ```
//!
//! Both answer from the boot listener's own index and renderer, so the bytes are the
//! ones the machine gets (the script includes a freshly signed Ignition URL when
//! `http.sign_ignition_urls` is on; it is an operator-only endpoint). Fetching a
//! preview records no boot progress. `bootplane render ignition|ipxe --server NAME`
//! prints them.

use std::sync::{Arc, OnceLock};

use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::error::ApiError;
use crate::http::{BootHttp, BootState, MachineId};

pub use crate::model::wire::PREVIEW_PATH;

/// The boot listener's application, set once it is built (the API listener starts
/// first).
pub type BootSlot = Arc<OnceLock<Arc<BootHttp>>>;

/// The preview routes; mount them behind the API's bearer auth.
pub fn router(slot: BootSlot) -> Router {
    let s2 = slot.clone();
    Router::new()
        .route(
            &format!("{PREVIEW_PATH}/ignition/{{server}}"),
            get(move |Path(server): Path<String>| {
                let slot = slot.clone();
                async move { ignition(&slot, &server) }
            }),
        )
        .route(
            &format!("{PREVIEW_PATH}/ipxe/{{server}}"),
            get(move |Path(server): Path<String>| {
                let slot = s2.clone();
                async move { ipxe(&slot, &server) }
            }),
        )
}

fn app(slot: &BootSlot) -> Result<&Arc<BootHttp>, ApiError> {
    slot.get().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            "the boot listener is not running",
        )
    })
}

fn unknown(server: &str) -> ApiError {
    ApiError::not_found(format!(
        "server {server:?} is not known to the boot listener"
    ))
}

fn ignition(slot: &BootSlot, server: &str) -> Response {
    let app = match app(slot) {
        Ok(a) => a,
        Err(e) => return e.into_response(),
    };
    let Some(m) = app.index().lookup(&MachineId::Server(server.to_string())) else {
        return unknown(server).into_response();
    };
    match (&m.state, &m.ignition) {
        (BootState::Ready | BootState::Install(_), Some(ign)) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, ign.content_type.clone())],
            ign.data.clone(),
        )
            .into_response(),
        (BootState::LocalBoot, _) => ApiError::new(
            StatusCode::CONFLICT,
            "Installed",
            format!("server {server} boots its installed disk image from disk: it read its Ignition at install"),
        )
        .into_response(),
        (BootState::Ready | BootState::Install(_), None) => ApiError::new(
            StatusCode::NOT_FOUND,
            "NoIgnition",
            format!("server {server} has neither an ignition template nor an ignition secret"),
        )
        .into_response(),
        (BootState::Discovery, _) => ApiError::new(
            StatusCode::CONFLICT,
            "InDiscovery",
            format!("server {server} is in Discovery: it boots the discovery image, no Ignition"),
        )
        .into_response(),
        (BootState::Cleanup(_), _) => ApiError::new(
            StatusCode::CONFLICT,
            "InCleanup",
            format!(
                "server {server} is in Cleanup: it boots the agent to wipe its disks, no Ignition"
            ),
        )
        .into_response(),
        (BootState::NotClaimed, _) => ApiError::new(
            StatusCode::CONFLICT,
            "NotClaimed",
            format!("server {server} has no ready boot configuration (not claimed)"),
        )
        .into_response(),
        (BootState::Error(why), _) => ApiError::new(
            StatusCode::CONFLICT,
            "BootConfigurationError",
            format!("boot configuration of {server} is in Error: {why}"),
        )
        .into_response(),
    }
}

fn ipxe(slot: &BootSlot, server: &str) -> Response {
    let app = match app(slot) {
        Ok(a) => a,
        Err(e) => return e.into_response(),
    };
    match app.preview_script(server) {
        Some(body) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            body,
        )
            .into_response(),
        None => unknown(server).into_response(),
    }
}
