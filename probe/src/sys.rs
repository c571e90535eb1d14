//! The few system calls the agent needs beyond files: uname (architecture),
//! getifaddrs (IP addresses per interface), if_nametoindex, the power-off, draining
//! the console before PID 1 exits, and the kernel command line (`bootplane.*=` values).

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::net::{Ipv4Addr, Ipv6Addr};

/// Longest `/proc/cmdline` read.
const MAX_CMDLINE: usize = 64 * 1024;

/// Most addresses read from getifaddrs.
const MAX_ADDRS: usize = 4096;

/// `uname -m` (`x86_64`, `aarch64`).
pub fn architecture() -> Option<String> {
    // SAFETY: utsname is plain data; zeroed is a valid value.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: u is a valid utsname for uname to fill.
    if unsafe { libc::uname(&mut u) } != 0 {
        return None;
    }
    // SAFETY: uname NUL-terminates machine within its array.
    let m = unsafe { CStr::from_ptr(u.machine.as_ptr()) };
    Some(m.to_string_lossy().into_owned()).filter(|s| !s.is_empty())
}

/// Interface index of `name`.
pub fn ifindex(name: &str) -> Option<i32> {
    let c = CString::new(name).ok()?;
    // SAFETY: c is a valid NUL-terminated string.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (i != 0).then_some(i as i32)
}

/// IPv4 and IPv6 addresses per interface name (no prefix length).
pub fn interface_addresses() -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills head with a list we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut cur = head;
    let mut n = 0;
    while !cur.is_null() && n < MAX_ADDRS {
        n += 1;
        // SAFETY: cur is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: ifa_addr is non-null and points at a sockaddr of the family it names.
        let ip = unsafe {
            match (*ifa.ifa_addr).sa_family as i32 {
                libc::AF_INET => {
                    let sa = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    Some(Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr)).to_string())
                }
                libc::AF_INET6 => {
                    let sa = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                    Some(Ipv6Addr::from(sa.sin6_addr.s6_addr).to_string())
                }
                _ => None,
            }
        };
        if let Some(ip) = ip {
            out.entry(name).or_default().push(ip);
        }
    }
    // SAFETY: head came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// The longest wait for the console to send what was written to it.
const DRAIN_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Wait until what this process wrote to its standard output and error has left the
/// terminal they are (the serial console in the discovery image), for at most
/// [`DRAIN_LIMIT`]: a console held by flow control must not keep a machine from
/// rebooting. Nothing happens when they are not terminals.
pub fn drain_console() {
    let (done, wait) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for fd in [1, 2] {
            // SAFETY: tcdrain takes a descriptor only; on one that is not a terminal it
            // fails (ENOTTY, EBADF) and does nothing.
            unsafe { libc::tcdrain(fd) };
        }
        let _ = done.send(());
    });
    let _ = wait.recv_timeout(DRAIN_LIMIT);
}

/// Flush the file systems and power the machine off (PID 1 in the discovery image).
/// Returns only when the kernel refused (not privileged).
pub fn power_off() {
    // SAFETY: sync and reboot take no pointers; reboot needs CAP_SYS_BOOT and fails
    // cleanly (EPERM) without it.
    unsafe {
        libc::sync();
        if libc::reboot(libc::RB_POWER_OFF) != 0 {
            eprintln!(
                "bootplane probe: power off: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// Flush the file systems and reboot (after `bootplane probe install`). Returns only
/// when the kernel refused (not privileged).
pub fn reboot() {
    // SAFETY: sync and reboot take no pointers; reboot needs CAP_SYS_BOOT and fails
    // cleanly (EPERM) without it.
    unsafe {
        libc::sync();
        if libc::reboot(libc::RB_AUTOBOOT) != 0 {
            eprintln!(
                "bootplane probe: reboot: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// The value of `key=` on a kernel command line (the last one wins, as in the kernel).
pub fn cmdline_value(cmdline: &str, key: &str) -> Option<String> {
    cmdline
        .split_ascii_whitespace()
        .filter_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .next_back()
        .map(|v| v.trim_matches('"').to_string())
}

/// This boot's kernel command line (empty when unreadable).
pub fn read_cmdline() -> String {
    crate::collect::read_capped(std::path::Path::new("/proc/cmdline"), MAX_CMDLINE)
        .map(|v| String::from_utf8_lossy(&v).into_owned())
        .unwrap_or_default()
}
