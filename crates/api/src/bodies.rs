//! Request bodies of the API: their syntax by `Content-Type` and their bounded decoding
//! (size, nesting depth, alias expansion: `decode`), small JSON ones on the runtime, the
//! rest on a few blocking threads. Below every route that reads a body (`rest`,
//! `apply`, `reviews`).

use axum::body::Bytes;
use axum::http::{header, HeaderMap, StatusCode};
use serde_json::Value;

use super::error::ApiError;
use super::state::ApiState;
use crate::decode::{self as body, DecodeError, Format};

type ApiResult<T> = Result<T, ApiError>;

/// A body's syntax by its `Content-Type`: YAML when it names YAML, JSON otherwise
/// (also without one, as kube; the text is never sniffed).
pub fn body_format(h: &HeaderMap) -> Format {
    let ct = h
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if ct.to_ascii_lowercase().contains("yaml") {
        Format::Yaml
    } else {
        Format::Json
    }
}

/// JSON bodies up to this size are decoded on the runtime: a fraction of a
/// millisecond (16 KiB of JSON took serde_json 0.2 to 0.5 ms here). Larger ones, and
/// all YAML (libyaml takes 10 to 50 times as long per byte: 64 KiB nested to the depth
/// limit took 45 ms), go to a blocking thread, a few at a time ([`DECODE_SLOTS`]).
const INLINE_JSON_BYTES: usize = 8 << 10;
/// Bodies decoded on blocking threads at once; more wait (asynchronously) for a slot.
static DECODE_SLOTS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(4);

/// Decode a request body as JSON or YAML (see [`body_format`]), bounded: nesting
/// deeper than [`body::MAX_DEPTH`] is refused, and YAML aliases adding more than the
/// body limit are refused before anything is built. Malformed input is 400, too much alias
/// expansion 413.
/// kube's protobuf is read for the kinds [`super::kubepb`] knows (a v1 Secret).
pub(crate) async fn decode_body(st: &ApiState, h: &HeaderMap, body: Bytes) -> ApiResult<Value> {
    if super::kubepb::is_protobuf(h) {
        return Ok(super::kubepb::decode_object(&body)?);
    }
    decode_shaped(st, h, body, body::decode).await
}

/// [`decode_body`] of a body of any shape (a JSON patch is a list); never protobuf.
pub(crate) async fn decode_any(st: &ApiState, h: &HeaderMap, body: Bytes) -> ApiResult<Value> {
    if super::kubepb::is_protobuf(h) {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            "a patch is JSON or YAML, not protobuf",
        ));
    }
    decode_shaped(st, h, body, body::decode_value).await
}

type Decoder = fn(Format, &[u8], body::Limits) -> Result<Value, DecodeError>;

async fn decode_shaped(
    st: &ApiState,
    h: &HeaderMap,
    body: Bytes,
    decode: Decoder,
) -> ApiResult<Value> {
    let format = body_format(h);
    let limits = body::Limits::new(st.max_body_bytes);
    let res = if format == Format::Json && body.len() <= INLINE_JSON_BYTES {
        decode(format, &body, limits)
    } else {
        let _slot = DECODE_SLOTS.acquire().await.map_err(|_| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                "decoder closed",
            )
        })?;
        tokio::task::spawn_blocking(move || decode(format, &body, limits))
            .await
            .map_err(|e| {
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "InternalError",
                    format!("decoding the request body: {e}"),
                )
            })?
    };
    res.map_err(|e| match e {
        DecodeError::AliasExpansion { .. } => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "RequestEntityTooLarge",
            e.to_string(),
        ),
        DecodeError::Syntax { format: "JSON", .. } => ApiError::bad_request(format!(
            "{e} (YAML bodies need Content-Type: application/yaml)"
        )),
        e => ApiError::bad_request(e.to_string()),
    })
}
