//! The one support module of the integration tests (`mod support;` in each
//! `tests/*.rs`), by concern:
//!
//! - [`netns`]: network namespaces with unique names per test, veth pairs, bridges,
//!   and cleanup on drop (processes killed, namespace deleted), also on panic;
//! - [`require`]: fail, never skip, when a tool is missing, naming its Debian package;
//! - [`process`]: running programs with time limits, children killed on drop, polling;
//! - [`bootplane`]: the real binary (`serve` until `/readyz` answers, the CLI, the
//!   state dir), and [`api`]: the objects and paths the API tests use;
//! - [`http`], [`tftp`], [`dhcp`], [`image`], [`nfs`], [`provisioning`]: per-area
//!   fixtures;
//! - [`libvirt`]: a private libvirt daemon in a test's namespace and sushy-emulator
//!   (libvirt driver) in front of it;
//! - [`data`]: deterministic test bytes, their hashes, the fixtures directory;
//! - [`fakebmc`]: an in-process fake Redfish BMC with scripted faults and counters;
//! - [`sushy`]: sushy-tools' `sushy-emulator` (from the test venv) as a Redfish peer;
//! - [`mgmt`]: the management-network lab (simulated BMCs leasing from bootplane);
//! - [`kube`]: real kubectls (this machine's v1.32, Debian's v1.20) with a kubeconfig
//!   for a served bootplane;
//! - [`etcd`]: a real etcd cluster on loopback (members killed and restarted on their
//!   data dirs, all killed on drop) for the store on etcd, also inside a namespace;
//! - [`etcd_solo`]: a single-member etcd inside a network namespace (the DHCP cluster lab);
//! - [`webdriver`]: Debian's headless `chromium` driven through `chromedriver` (W3C
//!   WebDriver over HTTP), for the dashboard tests and bench;
//! - [`qemu`]: the QEMU firmware lab of the end-to-end tests (a namespace with a bridge,
//!   bootplane's `qemu` power driver, the scenario runner, a Debian kernel and an
//!   initramfs running `ignition`).
//!
//! Benches that need namespaces include this module too (`#[path]`).

// Each test binary compiles this whole module but uses only part of it, so unused
// helpers are expected in every binary: allow dead code here, once, for all of them.
#![allow(dead_code)]

pub mod api;
pub mod bootplane;
pub mod data;
pub mod dhcp;
pub mod etcd;
pub mod etcd_solo;
pub mod fakebmc;
pub mod http;
pub mod image;
pub mod kube;
pub mod libvirt;
pub mod mgmt;
pub mod netns;
pub mod nfs;
pub mod process;
pub mod provisioning;
pub mod qemu;
pub mod require;
pub mod sushy;
pub mod tftp;
pub mod webdriver;

pub use self::bootplane::api_agent;
