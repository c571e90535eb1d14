//! The kube-style REST API served on the operator listener. The resource types it
//! serves (registry, schema validation, selectors) are in [`crate::model`].

pub mod admission;
pub mod audit;
pub mod auth;
pub mod authz;
pub mod error;
pub mod guard;
pub mod preview;
pub mod rest;
pub mod settings;
pub mod state;
pub mod tokens;
pub mod ui;

pub use settings::ApiConfig;
