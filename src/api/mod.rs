//! Resource types (registry, schema validation, selectors) and the kube-style REST
//! API served on the operator listener.

pub mod labels;
pub mod resource;
pub mod rest;
pub mod schema;
pub mod selector;
