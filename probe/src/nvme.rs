//! The NVMe path of `bootplane probe wipe --policy full`: a Format NVM with Secure Erase
//! Settings = 1 (user data erase) through `NVME_IOCTL_ADMIN_CMD`, used when the
//! controller's Identify data says Format NVM is supported (OACS bit 1). The command
//! encoding and the Identify fields are pure functions, unit-tested here; the one
//! function that issues ioctls is [`format_user_data_erase`]. Sanitize (SANICAP) is read
//! and reported but not issued: it runs in the background and needs the sanitize status
//! log polled, which is left for when QEMU's emulated NVMe tests this path.

use std::fs::File;
use std::os::unix::io::AsRawFd;

/// `NVME_IOCTL_ID`: the namespace ID of an open namespace.
const NVME_IOCTL_ID: libc::c_ulong = 0x4e40;
/// `NVME_IOCTL_ADMIN_CMD`: `_IOWR('N', 0x41, struct nvme_admin_cmd)` (72 bytes).
const NVME_IOCTL_ADMIN_CMD: libc::c_ulong = 0xC048_4E41;

/// Admin opcodes.
pub const OP_IDENTIFY: u8 = 0x06;
pub const OP_FORMAT_NVM: u8 = 0x80;
/// Identify CNS values.
pub const CNS_NAMESPACE: u32 = 0;
pub const CNS_CONTROLLER: u32 = 1;
/// NSID meaning "every namespace".
pub const NSID_ALL: u32 = 0xFFFF_FFFF;

/// `struct nvme_admin_cmd` (`linux/nvme_ioctl.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AdminCmd {
    pub opcode: u8,
    pub flags: u8,
    pub rsvd1: u16,
    pub nsid: u32,
    pub cdw2: u32,
    pub cdw3: u32,
    pub metadata: u64,
    pub addr: u64,
    pub metadata_len: u32,
    pub data_len: u32,
    pub cdw10: u32,
    pub cdw11: u32,
    pub cdw12: u32,
    pub cdw13: u32,
    pub cdw14: u32,
    pub cdw15: u32,
    pub timeout_ms: u32,
    pub result: u32,
}

/// What the Identify Controller data says about erasing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Caps {
    /// OACS bit 1: Format NVM is supported (and with it SES=1, user data erase).
    pub format: bool,
    /// FNA bit 0: a format applies to every namespace.
    pub format_all_namespaces: bool,
    /// FNA bit 2: cryptographic erase is supported.
    pub crypto_erase: bool,
    /// SANICAP bit 1: Sanitize block erase is supported.
    pub sanitize_block_erase: bool,
}

/// An Identify command for `cns` (controller or namespace `nsid`) into a 4 KiB buffer
/// at `addr`.
pub fn identify(cns: u32, nsid: u32, addr: u64) -> AdminCmd {
    AdminCmd {
        opcode: OP_IDENTIFY,
        nsid,
        addr,
        data_len: 4096,
        cdw10: cns,
        ..AdminCmd::default()
    }
}

/// A Format NVM of `nsid` keeping LBA format `lbaf` (0..=63), with Secure Erase
/// Settings 1 (user data erase), no protection information, metadata settings kept 0.
pub fn format_nvm(nsid: u32, lbaf: u8, timeout_ms: u32) -> AdminCmd {
    let lbaf = lbaf as u32 & 0x3f;
    AdminCmd {
        opcode: OP_FORMAT_NVM,
        nsid,
        // LBAF bits 3:0, SES bits 11:9 = 1, LBAF upper bits 13:12.
        cdw10: (lbaf & 0xf) | (1 << 9) | ((lbaf >> 4) << 12),
        timeout_ms,
        ..AdminCmd::default()
    }
}

/// The erase capabilities in Identify Controller data (at least 4 KiB).
pub fn controller_caps(id: &[u8]) -> Caps {
    let at = |i: usize| id.get(i).copied().unwrap_or(0);
    let oacs = u16::from_le_bytes([at(256), at(257)]);
    let fna = at(524);
    let sanicap = at(328);
    Caps {
        format: oacs & 0b10 != 0,
        format_all_namespaces: fna & 0b1 != 0,
        crypto_erase: fna & 0b100 != 0,
        sanitize_block_erase: sanicap & 0b10 != 0,
    }
}

/// The LBA format in use, from Identify Namespace data (FLBAS: bits 3:0, upper bits 6:5).
pub fn current_lbaf(ns: &[u8]) -> u8 {
    let f = ns.get(26).copied().unwrap_or(0);
    (f & 0xf) | (((f >> 5) & 0b11) << 4)
}

fn admin(f: &File, cmd: &mut AdminCmd) -> Result<(), String> {
    // SAFETY: cmd is a valid nvme_admin_cmd; any data buffer it names (addr, data_len)
    // is owned by the caller and outlives the call.
    let r = unsafe {
        libc::ioctl(
            f.as_raw_fd(),
            NVME_IOCTL_ADMIN_CMD as _,
            cmd as *mut AdminCmd,
        )
    };
    match r {
        0 => Ok(()),
        r if r < 0 => Err(format!(
            "nvme admin 0x{:02x}: {}",
            cmd.opcode,
            std::io::Error::last_os_error()
        )),
        status => Err(format!(
            "nvme admin 0x{:02x}: status 0x{status:x}",
            cmd.opcode
        )),
    }
}

/// Issue an Identify into a fresh 4 KiB buffer.
fn identify_data(f: &File, cns: u32, nsid: u32) -> Result<Vec<u8>, String> {
    let mut buf = crate::blockdev::Aligned::zeroed(4096);
    let mut cmd = identify(cns, nsid, buf.bytes_mut().as_mut_ptr() as u64);
    admin(f, &mut cmd)?;
    Ok(buf.bytes()[..4096].to_vec())
}

/// The erase capabilities of the controller of the namespace open as `f`, and the
/// namespace's ID; an error when it is not an NVMe namespace the driver answers for.
pub fn probe(f: &File) -> Result<(Caps, u32), String> {
    // SAFETY: NVME_IOCTL_ID takes no argument and returns the namespace ID.
    let nsid = unsafe { libc::ioctl(f.as_raw_fd(), NVME_IOCTL_ID as _) };
    if nsid <= 0 {
        return Err(format!(
            "nvme namespace id: {}",
            std::io::Error::last_os_error()
        ));
    }
    let id = identify_data(f, CNS_CONTROLLER, 0)?;
    Ok((controller_caps(&id), nsid as u32))
}

/// Format the namespace with user data erase, keeping its LBA format.
pub fn format_user_data_erase(
    f: &File,
    caps: Caps,
    nsid: u32,
    timeout_ms: u32,
) -> Result<(), String> {
    if !caps.format {
        return Err("the controller does not support format nvm".into());
    }
    let ns = identify_data(f, CNS_NAMESPACE, nsid)?;
    let target = if caps.format_all_namespaces {
        NSID_ALL
    } else {
        nsid
    };
    let mut cmd = format_nvm(target, current_lbaf(&ns), timeout_ms);
    admin(f, &mut cmd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_cmd_is_the_kernel_layout() {
        assert_eq!(std::mem::size_of::<AdminCmd>(), 72);
        // The ioctl number encodes that size: _IOWR('N', 0x41, 72 bytes).
        let dir_rw = 3u64 << 30;
        assert_eq!(
            NVME_IOCTL_ADMIN_CMD,
            dir_rw | (72 << 16) | (b'N' as u64) << 8 | 0x41
        );
        let c = AdminCmd::default();
        let base = &c as *const AdminCmd as usize;
        assert_eq!(&c.addr as *const u64 as usize - base, 24);
        assert_eq!(&c.data_len as *const u32 as usize - base, 36);
        assert_eq!(&c.cdw10 as *const u32 as usize - base, 40);
        assert_eq!(&c.timeout_ms as *const u32 as usize - base, 64);
    }

    #[test]
    fn format_encodes_ses_and_lbaf() {
        let c = format_nvm(1, 0, 0);
        assert_eq!((c.opcode, c.nsid, c.cdw10), (0x80, 1, 0x200));
        let c = format_nvm(3, 2, 60_000);
        assert_eq!(c.cdw10, 0x202);
        assert_eq!(c.timeout_ms, 60_000);
        // LBAF 0x15: low nibble 5 in bits 3:0, upper bits 01 in 13:12.
        assert_eq!(format_nvm(1, 0x15, 0).cdw10, 0x5 | 0x200 | 0x1000);
        // No PI, no MSET, SES exactly 1.
        assert_eq!((format_nvm(1, 0, 0).cdw10 >> 9) & 0b111, 1);
        assert_eq!(format_nvm(1, 0xff, 0).cdw10 & 0x1f0, 0);
    }

    #[test]
    fn identify_and_its_fields() {
        let c = identify(CNS_CONTROLLER, 0, 0x1000);
        assert_eq!(
            (c.opcode, c.cdw10, c.data_len, c.addr),
            (0x06, 1, 4096, 0x1000)
        );
        let mut id = vec![0u8; 4096];
        assert_eq!(controller_caps(&id), Caps::default());
        id[256] = 0b0000_0110; // OACS: format nvm, firmware
        id[524] = 0b101; // FNA: all namespaces, crypto erase
        id[328] = 0b110; // SANICAP: block erase, overwrite
        assert_eq!(
            controller_caps(&id),
            Caps {
                format: true,
                format_all_namespaces: true,
                crypto_erase: true,
                sanitize_block_erase: true
            }
        );
        assert_eq!(controller_caps(&[0u8; 10]), Caps::default());
        let mut ns = vec![0u8; 4096];
        ns[26] = 0b0010_0011; // FLBAS: index 3, upper bits 01 → 0x13
        assert_eq!(current_lbaf(&ns), 0x13);
        assert_eq!(current_lbaf(&[]), 0);
    }
}
