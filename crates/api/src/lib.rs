//! The kube-style REST API served on the operator listener (the `bootplane-api` crate,
//! the fifth layer: re-exported by the `bootplane` package as `bootplane::api`). The
//! resource types it serves (registry, schema validation, selectors) are in
//! [`crate::model`]; it builds on the model, the store and the protocol crate's TLS and
//! listener, and knows nothing of the CLI, config or serve above it.

pub mod admission;
pub mod apply;
pub mod audit;
pub mod auth;
pub mod authz;
pub mod bodies;
pub mod discovery;
pub mod error;
pub mod guard;
pub mod kubepb;
pub mod openapi;
pub mod openapi_v2;
pub mod paging;
pub mod preview;
pub mod rest;
pub mod reviews;
pub mod settings;
pub mod state;
pub mod table;
pub mod tokens;
pub mod ui;
pub mod watch;

pub use settings::ApiConfig;

// The layers below, under the module names the API's files have always used
// (`crate::model::...`, `crate::store::...`, `crate::tls::...`).
use bootplane_model as model;
use bootplane_proto::{decode, http, listen, power, shutdown, tls};
use bootplane_store as store;
