//! The inventory document the agent posts (JSON, camelCase), one per boot.

use serde::{Deserialize, Serialize};

/// What the agent found on the machine. Sizes are bytes; absent facts are empty or
/// `None`, never guessed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Inventory {
    /// SMBIOS system UUID (type 1), lowercase canonical form.
    #[serde(rename = "systemUUID")]
    pub system_uuid: String,
    #[serde(default)]
    pub system: SystemInfo,
    #[serde(default)]
    pub nics: Vec<Nic>,
    #[serde(default)]
    pub disks: Vec<Disk>,
    #[serde(default)]
    pub cpus: Vec<Cpu>,
    /// Installed memory: the sum of the SMBIOS memory devices (type 17), not what the
    /// kernel has left after its reservations.
    pub memory_bytes: u64,
}

/// SMBIOS type 0/1 facts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SystemInfo {
    pub manufacturer: Option<String>,
    pub product: Option<String>,
    pub serial_number: Option<String>,
    pub sku: Option<String>,
    pub bios_version: Option<String>,
}

/// A physical network interface (no loopback, no virtual devices).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Nic {
    /// Kernel name (`eth0`, `enp1s0`).
    pub name: String,
    /// `aa:bb:cc:dd:ee:ff`, lowercase.
    pub mac_address: String,
    /// Link carrier: true when the kernel reports carrier up.
    pub carrier: bool,
    #[serde(default)]
    pub speed_mbps: Option<u32>,
    /// IPv4/IPv6 addresses configured on it (without prefix length).
    #[serde(default)]
    pub ips: Vec<String>,
    /// LLDP neighbours heard on it during the listen window.
    #[serde(default)]
    pub neighbors: Vec<Neighbor>,
}

/// One LLDP neighbour (chassis/port TLVs, as text).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Neighbor {
    /// Chassis ID when it is a MAC address (subtype 4), `aa:bb:..`.
    pub mac_address: Option<String>,
    pub chassis_id: Option<String>,
    pub port_id: Option<String>,
    pub port_description: Option<String>,
    pub system_name: Option<String>,
    pub system_description: Option<String>,
}

/// A whole disk (no partitions, no loop/ram/dm devices).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Disk {
    /// Kernel name (`sda`, `vda`, `nvme0n1`).
    pub name: String,
    pub size_bytes: u64,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub vendor: Option<String>,
    #[serde(default)]
    pub serial: Option<String>,
    /// Rotational (HDD) as the kernel reports it.
    #[serde(default)]
    pub rotational: bool,
    /// `scsi`, `ata`, `nvme`, `virtio`, or what the kernel's device path says.
    #[serde(default)]
    pub transport: Option<String>,
}

/// One processor socket (SMBIOS type 4), or one `/proc/cpuinfo` package when the table
/// has none.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Cpu {
    /// Socket designation (`CPU 0`).
    pub id: String,
    #[serde(default)]
    pub manufacturer: Option<String>,
    #[serde(default)]
    pub model: Option<String>,
    /// `x86_64`, `aarch64`, ...
    #[serde(default)]
    pub architecture: Option<String>,
    #[serde(default)]
    pub cores: u32,
    #[serde(default)]
    pub threads: u32,
    #[serde(default)]
    pub max_speed_mhz: Option<u32>,
}
