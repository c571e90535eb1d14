//! LLDP (IEEE 802.1AB): a pure frame parser and a bounded listener that hears the
//! neighbours on each NIC through one `AF_PACKET` socket for ethertype 0x88cc.
//!
//! Bounds: frames over [`MAX_FRAME`] bytes are dropped, at most [`MAX_TLVS`] TLVs are
//! read per frame, at most [`MAX_NEIGHBORS`] neighbours are kept per NIC, and the
//! listener stops at the end of its window.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::inventory::Neighbor;

/// LLDP's ethertype.
pub const ETHERTYPE: u16 = 0x88cc;
/// Largest frame accepted (an LLDPDU fits a standard Ethernet frame).
pub const MAX_FRAME: usize = 1522;
/// Most TLVs read from one frame.
pub const MAX_TLVS: usize = 64;
/// Most neighbours kept per NIC.
pub const MAX_NEIGHBORS: usize = 16;

fn mac_text(b: &[u8]) -> String {
    b.iter()
        .map(|x| format!("{x:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn text(b: &[u8]) -> Option<String> {
    crate::smbios::clean(b)
}

/// An ID TLV's value (chassis or port): MAC subtypes as `aa:bb:..`, network addresses
/// (subtype 5) as IPv4/IPv6 text, anything else as text.
fn id_value(subtype: u8, v: &[u8], mac_subtype: u8) -> Option<String> {
    if subtype == mac_subtype && v.len() == 6 {
        return Some(mac_text(v));
    }
    if subtype == 5 {
        match (v.first(), v.len()) {
            (Some(1), 5) => {
                return Some(std::net::Ipv4Addr::new(v[1], v[2], v[3], v[4]).to_string())
            }
            (Some(2), 17) => {
                let mut a = [0u8; 16];
                a.copy_from_slice(&v[1..]);
                return Some(std::net::Ipv6Addr::from(a).to_string());
            }
            _ => {}
        }
    }
    text(v)
}

/// Parse one Ethernet frame carrying an LLDPDU (with or without one 802.1Q tag).
/// `None` when it is not LLDP or lacks the mandatory chassis ID.
pub fn parse_frame(frame: &[u8]) -> Option<Neighbor> {
    if frame.len() > MAX_FRAME || frame.len() < 14 {
        return None;
    }
    let mut off = 12;
    let mut ethertype = u16::from_be_bytes([frame[12], frame[13]]);
    if ethertype == 0x8100 {
        ethertype = u16::from_be_bytes([*frame.get(16)?, *frame.get(17)?]);
        off = 16;
    }
    if ethertype != ETHERTYPE {
        return None;
    }
    parse_lldpdu(&frame[off + 2..])
}

/// Parse the TLVs of an LLDPDU.
pub fn parse_lldpdu(mut p: &[u8]) -> Option<Neighbor> {
    let mut n = Neighbor::default();
    let mut have_chassis = false;
    for _ in 0..MAX_TLVS {
        if p.len() < 2 {
            break;
        }
        let head = u16::from_be_bytes([p[0], p[1]]);
        let (kind, len) = ((head >> 9) as u8, (head & 0x1ff) as usize);
        let v = p.get(2..2 + len)?;
        p = &p[2 + len..];
        match kind {
            0 => break,
            // One chassis ID per LLDPDU (IEEE 802.1AB: the first TLV); a repeated one is
            // ignored, so the MAC and the ID always come from the same TLV.
            1 if !v.is_empty() && !have_chassis => {
                have_chassis = true;
                n.chassis_id = id_value(v[0], &v[1..], 4);
                if v[0] == 4 && v.len() == 7 {
                    n.mac_address = n.chassis_id.clone();
                }
            }
            2 if !v.is_empty() => n.port_id = id_value(v[0], &v[1..], 3),
            4 => n.port_description = text(v),
            5 => n.system_name = text(v),
            6 => n.system_description = text(v),
            _ => {}
        }
    }
    have_chassis.then_some(n)
}

/// Add `n` to a NIC's list: a neighbour already heard (same chassis and port) is
/// replaced, a new one is kept while there are fewer than [`MAX_NEIGHBORS`].
pub fn add_neighbor(list: &mut Vec<Neighbor>, n: Neighbor) {
    if let Some(old) = list
        .iter_mut()
        .find(|o| o.chassis_id == n.chassis_id && o.port_id == n.port_id)
    {
        *old = n;
    } else if list.len() < MAX_NEIGHBORS {
        list.push(n);
    }
}

/// Listen on the interfaces (`(ifindex, name)`) for `window`; neighbours by NIC name.
/// An error opening the socket (no CAP_NET_RAW) is returned; nothing heard is empty.
pub fn listen(
    ifaces: &[(i32, String)],
    window: Duration,
) -> std::io::Result<BTreeMap<String, Vec<Neighbor>>> {
    let mut out = BTreeMap::new();
    if ifaces.is_empty() || window.is_zero() {
        return Ok(out);
    }
    let sock = raw::Socket::open()?;
    for (idx, _) in ifaces {
        // Best effort: a NIC that refuses the multicast filter may still be promiscuous.
        let _ = sock.join_lldp_multicast(*idx);
    }
    let end = Instant::now() + window;
    let mut buf = vec![0u8; MAX_FRAME + 1];
    while let Some(left) = end
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
    {
        let Some((len, ifindex)) = sock.recv(&mut buf, left)? else {
            continue;
        };
        let Some((_, name)) = ifaces.iter().find(|(i, _)| *i == ifindex) else {
            continue;
        };
        if let Some(n) = parse_frame(&buf[..len]) {
            add_neighbor(out.entry(name.clone()).or_default(), n);
        }
    }
    Ok(out)
}

mod raw {
    //! The `AF_PACKET` socket behind [`super::listen`].
    use std::io;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::time::Duration;

    pub struct Socket(OwnedFd);

    impl Socket {
        pub fn open() -> io::Result<Socket> {
            let proto = (super::ETHERTYPE).to_be() as i32;
            // SAFETY: plain socket(2) call; the fd is owned right after.
            let fd = unsafe {
                libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, proto)
            };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: fd is a fresh descriptor nobody else owns.
            Ok(Socket(unsafe { OwnedFd::from_raw_fd(fd) }))
        }

        /// Receive LLDP's multicast group (01:80:c2:00:00:0e) on one interface.
        pub fn join_lldp_multicast(&self, ifindex: i32) -> io::Result<()> {
            // SAFETY: packet_mreq is plain data; zeroed is a valid value.
            let mut mr: libc::packet_mreq = unsafe { std::mem::zeroed() };
            mr.mr_ifindex = ifindex;
            mr.mr_type = libc::PACKET_MR_MULTICAST as u16;
            mr.mr_alen = 6;
            mr.mr_address[..6].copy_from_slice(&[0x01, 0x80, 0xc2, 0x00, 0x00, 0x0e]);
            // SAFETY: mr lives across the call and its size is passed.
            let rc = unsafe {
                libc::setsockopt(
                    self.0.as_raw_fd(),
                    libc::SOL_PACKET,
                    libc::PACKET_ADD_MEMBERSHIP,
                    &mr as *const _ as *const libc::c_void,
                    std::mem::size_of::<libc::packet_mreq>() as libc::socklen_t,
                )
            };
            if rc < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        }

        /// One frame within `wait`: `(length, ifindex)`, `None` on timeout or interrupt.
        pub fn recv(&self, buf: &mut [u8], wait: Duration) -> io::Result<Option<(usize, i32)>> {
            let mut pfd = libc::pollfd {
                fd: self.0.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = wait.as_millis().clamp(1, i32::MAX as u128) as i32;
            // SAFETY: one valid pollfd for the duration of the call.
            let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
            if rc < 0 {
                let e = io::Error::last_os_error();
                return if e.kind() == io::ErrorKind::Interrupted {
                    Ok(None)
                } else {
                    Err(e)
                };
            }
            if rc == 0 {
                return Ok(None);
            }
            // SAFETY: sockaddr_ll is plain data; zeroed is a valid value.
            let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut sl = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
            // SAFETY: buf and sa are valid for the lengths given.
            let n = unsafe {
                libc::recvfrom(
                    self.0.as_raw_fd(),
                    buf.as_mut_ptr() as *mut libc::c_void,
                    buf.len(),
                    libc::MSG_DONTWAIT | libc::MSG_TRUNC,
                    &mut sa as *mut _ as *mut libc::sockaddr,
                    &mut sl,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                return match e.kind() {
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
                    _ => Err(e),
                };
            }
            // MSG_TRUNC: n is the real length; an oversized frame is dropped by the parser.
            let n = (n as usize).min(buf.len());
            Ok(Some((n, sa.sll_ifindex)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tlv(kind: u8, v: &[u8]) -> Vec<u8> {
        let head = ((kind as u16) << 9) | v.len() as u16;
        let mut o = head.to_be_bytes().to_vec();
        o.extend_from_slice(v);
        o
    }

    pub(crate) fn frame(tlvs: &[Vec<u8>]) -> Vec<u8> {
        let mut f = vec![
            0x01, 0x80, 0xc2, 0, 0, 0x0e, 0x02, 0x11, 0x22, 0x33, 0x44, 0x55, 0x88, 0xcc,
        ];
        for t in tlvs {
            f.extend_from_slice(t);
        }
        f.extend_from_slice(&[0, 0]);
        f
    }

    fn switch_frame() -> Vec<u8> {
        frame(&[
            tlv(1, &[4, 0x02, 0x11, 0x22, 0x33, 0x44, 0x55]),
            tlv(2, b"\x05Ethernet1/7"),
            tlv(3, &[0, 120]),
            tlv(4, b"uplink to rack 9"),
            tlv(5, b"leaf-01"),
            tlv(6, b"Switch OS 4.2"),
        ])
    }

    #[test]
    fn parses_a_switch_frame() {
        let n = parse_frame(&switch_frame()).unwrap();
        assert_eq!(
            n,
            Neighbor {
                mac_address: Some("02:11:22:33:44:55".into()),
                chassis_id: Some("02:11:22:33:44:55".into()),
                port_id: Some("Ethernet1/7".into()),
                port_description: Some("uplink to rack 9".into()),
                system_name: Some("leaf-01".into()),
                system_description: Some("Switch OS 4.2".into()),
            }
        );
    }

    /// Found by the `probe_parsers` fuzz target: a second chassis TLV whose ID cannot be
    /// read left the first one's MAC without its chassis ID.
    #[test]
    fn a_repeated_chassis_tlv_is_ignored() {
        let f = frame(&[
            tlv(1, &[4, 0x02, 0x11, 0x22, 0x33, 0x44, 0x55]),
            tlv(1, &[4, 0x01]),
            tlv(2, b"\x05Ethernet1/7"),
        ]);
        let n = parse_frame(&f).unwrap();
        assert_eq!(n.chassis_id.as_deref(), Some("02:11:22:33:44:55"));
        assert_eq!(n.mac_address, n.chassis_id);
    }

    #[test]
    fn chassis_subtypes_and_vlan_tag() {
        let f = frame(&[tlv(1, b"\x07leaf-02"), tlv(2, &[3, 1, 2, 3, 4, 5, 6])]);
        let n = parse_frame(&f).unwrap();
        assert_eq!(n.chassis_id.as_deref(), Some("leaf-02"));
        assert_eq!(n.mac_address, None);
        assert_eq!(n.port_id.as_deref(), Some("01:02:03:04:05:06"));
        let f = frame(&[tlv(1, &[5, 1, 10, 0, 0, 1])]);
        assert_eq!(
            parse_frame(&f).unwrap().chassis_id.as_deref(),
            Some("10.0.0.1")
        );
        // 802.1Q tagged.
        let mut t = switch_frame();
        t.splice(12..12, [0x81, 0x00, 0x00, 0x0a]);
        assert_eq!(
            parse_frame(&t).unwrap().system_name.as_deref(),
            Some("leaf-01")
        );
    }

    #[test]
    fn rejects_non_lldp_truncated_and_oversized() {
        let mut f = switch_frame();
        f[12] = 0x08;
        f[13] = 0x00;
        assert_eq!(parse_frame(&f), None);
        // No chassis ID.
        assert_eq!(parse_frame(&frame(&[tlv(5, b"x")])), None);
        // A TLV claiming more than the frame holds.
        let f = switch_frame();
        for cut in 0..f.len() - 2 {
            let _ = parse_frame(&f[..cut]);
        }
        let mut big = switch_frame();
        big.resize(MAX_FRAME + 1, 0);
        assert_eq!(parse_frame(&big), None);
        // Endless empty TLVs stop at MAX_TLVS (chassis at the end is never reached).
        let mut tl: Vec<Vec<u8>> = (0..MAX_TLVS).map(|_| tlv(127, &[])).collect();
        tl.push(tlv(1, b"\x07late"));
        assert_eq!(parse_frame(&frame(&tl)), None);
    }

    #[test]
    fn neighbors_per_nic_are_capped_and_deduplicated() {
        let mut list = Vec::new();
        for i in 0..40u8 {
            let n = Neighbor {
                chassis_id: Some(format!("c{}", i % 20)),
                ..Neighbor::default()
            };
            add_neighbor(&mut list, n);
        }
        assert_eq!(list.len(), MAX_NEIGHBORS);
    }
}
