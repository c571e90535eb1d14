//! [`ApiError`]: every failure of the API, rendered as a kube `Status` object with the
//! HTTP code kube would use (a [`StoreError`] maps to its kube reason here).

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::store::StoreError;

/// An API failure, rendered as a kube `Status`.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub code: StatusCode,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

impl ApiError {
    pub(crate) fn new(
        code: StatusCode,
        reason: &'static str,
        message: impl Into<String>,
    ) -> ApiError {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }
    pub(crate) fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "BadRequest", message)
    }
    pub(crate) fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "NotFound", message)
    }
    pub(crate) fn status_body(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code.as_u16(),
        });
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        let message = e.to_string();
        match e {
            StoreError::NotFound { name, .. } => {
                let mut a = ApiError::new(StatusCode::NOT_FOUND, "NotFound", message);
                a.details = Some(json!({"name": name}));
                a
            }
            StoreError::AlreadyExists { name, .. } => {
                let mut a = ApiError::new(StatusCode::CONFLICT, "AlreadyExists", message);
                a.details = Some(json!({"name": name}));
                a
            }
            StoreError::Conflict { name, .. } => {
                let mut a = ApiError::new(StatusCode::CONFLICT, "Conflict", message);
                a.details = Some(json!({"name": name}));
                a
            }
            StoreError::Invalid { kind, name, causes } => {
                let mut a = ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", message);
                a.details = Some(json!({
                    "name": name,
                    "kind": kind,
                    "causes": causes.iter().map(|c| json!({"reason": c.reason.as_str(), "message": c.message, "field": c.field})).collect::<Vec<_>>(),
                }));
                a
            }
            StoreError::BadRequest(_) => {
                ApiError::new(StatusCode::BAD_REQUEST, "BadRequest", message)
            }
            StoreError::Gone(_) => ApiError::new(StatusCode::GONE, "Expired", message),
            // A write that reached etcd and got no answer: it may apply yet. kube's
            // 504 `Timeout` ("may still be processing the request"), not a 503, so a
            // client reads again instead of taking it for "nothing happened".
            StoreError::OutcomeUnknown(_) => {
                let mut a = ApiError::new(StatusCode::GATEWAY_TIMEOUT, "Timeout", message);
                a.details = Some(json!({"retryAfterSeconds": 1}));
                a
            }
            // etcd unreachable, or this appliance fenced: nothing was written; reads go
            // on from the mirror.
            StoreError::Unavailable(_) => {
                let mut a = ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "ServiceUnavailable",
                    message,
                );
                a.details = Some(json!({"retryAfterSeconds": 1}));
                a
            }
            // As kube's watch cache answers a resourceVersion it has not seen yet
            // (after waiting for it): 504 Timeout, cause ResourceVersionTooLarge.
            StoreError::TooLargeResourceVersion { .. } => {
                let mut a = ApiError::new(
                    StatusCode::GATEWAY_TIMEOUT,
                    "Timeout",
                    format!("Timeout: {message}"),
                );
                a.details = Some(json!({
                    "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                    "retryAfterSeconds": 1,
                }));
                a
            }
            StoreError::TooLarge { name, .. } => {
                let mut a = ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "RequestEntityTooLarge",
                    message,
                );
                a.details = Some(json!({"name": name}));
                a
            }
            StoreError::Internal(_) => {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", message)
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&self.status_body()).unwrap_or_default();
        (
            self.code,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response()
    }
}
