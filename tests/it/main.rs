//! The one integration-test binary (matklad's layout: a binary per integration-test
//! file links the whole library again, 65 times; one binary links it once and compiles
//! `tests/support` once). Each former `tests/<name>.rs` is a module here, so one file's
//! tests are `cargo test --test it <name>::` or `cargo nextest run -E 'test(/^<name>::/)'`.
//!
//! Tests of one module share the process (threads) under `cargo test`, and every test is
//! its own process under `cargo nextest run` (what `scripts/test.sh` runs): state that
//! must be shared across tests (a build cached under `CARGO_TARGET_TMPDIR`) is guarded
//! by a file lock, never by a static alone (`support::data::cache_lock`).
//!
//! The modules that need the store on etcd (a cluster, the etcd engine, the DHCP ledger
//! on etcd) build only with the `etcd` feature (the default), so `cargo check
//! --no-default-features --all-targets` compiles without etcd's client.
//!
//! The one test that cannot live here: `tests/store_list_memory.rs` installs its own
//! global allocator to count bytes, so it is a binary of its own.

#[path = "../support/mod.rs"]
mod support;

mod api_auth;
mod api_bodies;
mod api_tls;
mod boot_iso;
mod boot_store;
mod cleanup_flow;
mod cli_config;
mod cli_kubectl;
mod cli_packaging;
#[cfg(feature = "etcd")]
mod cluster;
#[cfg(feature = "etcd")]
mod cluster_dhcp;
mod controller_api;
mod dhcp_boot_identity;
mod dhcp_clients;
#[cfg(feature = "etcd")]
mod dhcp_ledger;
mod dhcp_proxy;
mod dhcp_store;
mod discovery_flow;
mod discovery_image;
mod discovery_mgmt;
mod discovery_sushy;
#[cfg(feature = "etcd")]
mod e2e_cluster;
mod e2e_discovery;
mod e2e_firmware;
mod e2e_redfish;
mod events;
mod http_assets;
mod http_bad_input;
mod http_chain;
mod http_conn;
mod http_serve;
mod ignition_cli;
mod ignition_client;
mod ignition_errors;
mod ignition_golden;
mod ignition_serve;
mod image_nfs;
mod image_provision;
mod install_flow;
mod kube_kubectl;
mod kube_python;
mod kube_rs;
mod kube_secrets;
mod listener_limits;
mod nfs_ganesha;
mod nfs_ontap;
mod ops;
mod probe_install;
mod probe_wipe;
mod proptest_dhcp;
mod proptest_image;
mod proptest_merge_patch;
mod proptest_selector;
mod proptest_tftp;
mod provision_kubernetes;
mod provision_local;
mod provision_nfs_flow;
mod readme_walkthrough;
mod redfish_client;
mod redfish_power;
mod redfish_sushy;
mod s390x_api;
mod s390x_flow;
mod secrets_at_rest;
mod state_dir;
mod status_validation;
#[cfg(feature = "etcd")]
mod store_etcd;
#[cfg(feature = "etcd")]
mod store_keyring;
mod tftp_abuse;
mod tftp_bad_input;
mod tftp_clients;
mod tftp_loss;
mod tidy;
mod tidy_files;
mod ui_browser;
