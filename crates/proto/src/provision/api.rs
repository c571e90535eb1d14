//! REST endpoint of the job runner, mounted by the API listener (which applies bearer
//! auth in front of it):
//!
//! - `POST   /apis/bootplane.dev/v1alpha1/jobs` with a [`ProvisionRequest`] body →
//!   `201 Created` + the job's status; the appliance chooses the id (a body with `id` is
//!   refused, so no caller can take the id of a ServerAction's job), and the request
//!   must pass the `[provision.jobs]` allow-lists ([`super::policy`]);
//! - `GET    /apis/bootplane.dev/v1alpha1/jobs` → `{"kind": "JobList", "items": [...]}`,
//!   every job the runner knows, oldest first (at most [`super::MAX_LISTED`]);
//! - `GET    /apis/bootplane.dev/v1alpha1/jobs/{id}` → the [`JobStatus`];
//! - `DELETE /apis/bootplane.dev/v1alpha1/jobs/{id}` → cancel, then the final status.
//!
//! Errors are `{"error": "..."}` with 400 (bad request), 404 (unknown job), 422 (refused
//! by the allow-lists, or an `id` given), 429 (too many jobs) or 502 (backend failure).

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

use super::{JobError, JobRunner, ProvisionRequest};

pub const JOBS_PATH: &str = "/apis/bootplane.dev/v1alpha1/jobs";

type Runner = Arc<dyn JobRunner>;

fn error(code: StatusCode, msg: impl Into<String>) -> Response {
    (code, Json(json!({"error": msg.into()}))).into_response()
}

fn job_error(e: JobError) -> Response {
    let code = match &e {
        JobError::Invalid(_) => StatusCode::BAD_REQUEST,
        JobError::Forbidden(_) => StatusCode::UNPROCESSABLE_ENTITY,
        JobError::NotFound(_) => StatusCode::NOT_FOUND,
        JobError::Busy(_) => StatusCode::TOO_MANY_REQUESTS,
        JobError::Backend(_) => StatusCode::BAD_GATEWAY,
    };
    error(code, e.to_string())
}

async fn create(
    State(runner): State<Runner>,
    body: Result<Json<ProvisionRequest>, JsonRejection>,
) -> Response {
    let Json(req) = match body {
        Ok(b) => b,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("invalid provisioning request: {}", e.body_text()),
            )
        }
    };
    if req.id.is_some() {
        return job_error(JobError::Forbidden(
            "job ids are chosen by the appliance: leave id out".into(),
        ));
    }
    let id = match runner.start(req).await {
        Ok(id) => id,
        Err(e) => return job_error(e),
    };
    match runner.status(&id).await {
        Ok(s) => (StatusCode::CREATED, Json(s)).into_response(),
        Err(e) => job_error(e),
    }
}

async fn list(State(runner): State<Runner>) -> Response {
    match runner.list().await {
        Ok(items) => Json(json!({
            "apiVersion": "bootplane.dev/v1alpha1",
            "kind": "JobList",
            "metadata": {},
            "items": items,
        }))
        .into_response(),
        Err(e) => job_error(e),
    }
}

async fn read(State(runner): State<Runner>, Path(id): Path<String>) -> Response {
    match runner.status(&id).await {
        Ok(s) => Json(s).into_response(),
        Err(e) => job_error(e),
    }
}

async fn cancel(State(runner): State<Runner>, Path(id): Path<String>) -> Response {
    if let Err(e) = runner.cancel(&id).await {
        return job_error(e);
    }
    match runner.status(&id).await {
        Ok(s) => Json(s).into_response(),
        Err(e) => job_error(e),
    }
}

/// The job endpoints, ready to be merged into the API router.
pub fn router(runner: Arc<dyn JobRunner>) -> Router {
    Router::new()
        .route(JOBS_PATH, post(create).get(list))
        .route(&format!("{JOBS_PATH}/{{id}}"), get(read).delete(cancel))
        .with_state(runner)
}
