//! The discovery agent (`bootplane probe`, the metalprobe role): what a machine booted
//! into bootplane's discovery image reports about itself, and how it reads and posts it.
//!
//! [`Inventory`] is the contract between the agent and the boot listener's
//! `POST /discovery/inventory` route; the main crate checks and maps it onto the
//! Server's status. Everything here is std + serde + libc (and the image streamer, which adds zstd,
//! sha2 and a plain-HTTP client) so the agent links statically.
//!
//! - [`smbios`]: the DMI table parser (system, BIOS, processors, memory devices);
//! - [`collect`]: the sysfs/procfs collectors, reading from a root directory;
//! - [`lldp`]: the LLDP frame parser and listener;
//! - [`http`]: the bounded HTTP POST with retries;
//! - [`cli`]: the `bootplane probe` command;
//! - [`wipe`]: `bootplane probe wipe`, erasing disks by policy and reading them back
//!   ([`parttable`]: the partition-table reader and range planner, [`blockdev`]: the
//!   devices and their I/O, [`nvme`]: Format NVM; [`WipeReport`]: what it reports);
//! - [`install`]: `bootplane probe install`, streaming an OS image to the disk chosen by
//!   [`hints`] with `bootplane-image`'s streamer and writing the Ignition config into its
//!   boot partition ([`bootpart`]); [`InstallReport`]: what it reports.

pub mod blockdev;
pub mod bootpart;
pub mod cli;
pub mod collect;
pub mod hints;
pub mod http;
pub mod install;
pub mod install_report;
pub mod inventory;
pub mod lldp;
pub mod nvme;
pub mod parttable;
pub mod smbios;
pub mod sys;
pub mod wipe;
pub mod wipe_report;

pub use install_report::{IgnitionWritten, InstallReport};
pub use inventory::{Cpu, Disk, Inventory, Neighbor, Nic, SystemInfo};
pub use wipe_report::{DiskWipe, Method, Policy, WipeReport};
