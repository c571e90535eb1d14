//! The discovery agent (`bootplane probe`, the metalprobe role): what a machine booted
//! into bootplane's discovery image reports about itself, and how it reads and posts it.
//!
//! [`Inventory`] is the contract between the agent and the boot listener's
//! `POST /discovery/inventory` route; the main crate checks and maps it onto the
//! Server's status. Everything here is std + serde so the agent links statically.

pub mod inventory;

pub use inventory::{Cpu, Disk, Inventory, Neighbor, Nic, SystemInfo};
