//! Socket tuning shared by the UDP servers (and the benches' clients): a boot storm
//! arrives as a burst, and a socket must be able to queue it while its reader works.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsFd, AsRawFd};

/// Raise a socket's receive buffer to `bytes`: past `net.core.rmem_max` when allowed
/// (`SO_RCVBUFFORCE`, needs CAP_NET_ADMIN), else as far as the limit lets
/// (`SO_RCVBUF`). The error is the second attempt's; a caller that cannot get the
/// room only loses burst capacity, so most log it and go on.
pub fn raise_rcvbuf<F: AsFd>(sock: &F, bytes: usize) -> nix::Result<()> {
    use nix::sys::socket::{setsockopt, sockopt};
    setsockopt(sock, sockopt::RcvBufForce, &bytes)
        .or_else(|_| setsockopt(sock, sockopt::RcvBuf, &bytes))
}

/// Datagrams taken off a socket with one `recvmmsg(2)`: a burst queued in the kernel is
/// drained with one system call per batch instead of one per datagram, so the reader
/// keeps up with a rack of machines sending their requests within a millisecond.
///
/// The buffers are allocated once (zeroed, so the kernel maps a page only when a
/// datagram lands on it); the kernel's headers are built on the stack of each call.
pub(crate) struct RecvBatch {
    bufs: Vec<u8>,
    slot: usize,
    addrs: Vec<libc::sockaddr_storage>,
    got: Vec<(usize, bool)>,
}

/// Largest batch one [`RecvBatch`] takes.
pub(crate) const RECV_BATCH_MAX: usize = 64;

impl RecvBatch {
    /// Room for `n` (at most [`RECV_BATCH_MAX`]) datagrams of up to `slot` bytes each.
    pub(crate) fn new(n: usize, slot: usize) -> RecvBatch {
        let n = n.clamp(1, RECV_BATCH_MAX);
        RecvBatch {
            bufs: vec![0; n * slot],
            slot,
            // SAFETY: sockaddr_storage is plain old data; zero is a valid bit pattern.
            addrs: vec![unsafe { std::mem::zeroed() }; n],
            got: Vec::with_capacity(n),
        }
    }

    /// One non-blocking `recvmmsg` on `sock`: how many datagrams arrived (at least one;
    /// `WouldBlock` when none was queued).
    pub(crate) fn recv<F: AsRawFd>(&mut self, sock: &F) -> io::Result<usize> {
        let n = self.addrs.len();
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; RECV_BATCH_MAX];
        // SAFETY: mmsghdr is plain old data; zero is a valid bit pattern.
        let mut msgs: [libc::mmsghdr; RECV_BATCH_MAX] = unsafe { std::mem::zeroed() };
        for (k, chunk) in self.bufs.chunks_exact_mut(self.slot).enumerate().take(n) {
            iov[k] = libc::iovec {
                iov_base: chunk.as_mut_ptr() as *mut _,
                iov_len: chunk.len(),
            };
            let h = &mut msgs[k].msg_hdr;
            h.msg_iov = &mut iov[k];
            h.msg_iovlen = 1;
            h.msg_name = &mut self.addrs[k] as *mut _ as *mut _;
            h.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        }
        // SAFETY: every header points at a buffer and an address owned by `self` (or the
        // iovec array on this stack), valid and not otherwise borrowed during the call.
        let r = unsafe {
            libc::recvmmsg(
                sock.as_raw_fd(),
                msgs.as_mut_ptr(),
                n as u32,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        self.got.clear();
        for m in &msgs[..r as usize] {
            let truncated = m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
            self.got.push((m.msg_len as usize, truncated));
        }
        Ok(r as usize)
    }

    /// The datagrams of the last [`recv`](Self::recv), in order: the bytes and the
    /// sender, or `None` for one cut short (larger than the slot) or from an address
    /// family that is not IP.
    pub(crate) fn datagrams(&self) -> impl Iterator<Item = Option<(&[u8], SocketAddr)>> + '_ {
        self.got.iter().enumerate().map(|(k, &(len, truncated))| {
            if truncated {
                return None;
            }
            let from = sockaddr(&self.addrs[k])?;
            let start = k * self.slot;
            Some((&self.bufs[start..start + len.min(self.slot)], from))
        })
    }
}

/// A socket address the kernel wrote, as a `SocketAddr` (IPv4 and IPv6 only).
fn sockaddr(s: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match s.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in, which it is
            // large enough and aligned for.
            let a = unsafe { &*(s as *const _ as *const libc::sockaddr_in) };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(a.sin_addr.s_addr.to_ne_bytes()),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for sockaddr_in6.
            let a = unsafe { &*(s as *const _ as *const libc::sockaddr_in6) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn raises_past_the_default() {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        super::raise_rcvbuf(&s, 4 << 20).unwrap();
        let got = nix::sys::socket::getsockopt(&s, nix::sys::socket::sockopt::RcvBuf).unwrap();
        // the kernel reports twice what was set; tests run as root (forcing allowed)
        assert!(got >= 4 << 20, "{got}");
    }

    #[test]
    fn a_batch_takes_every_queued_datagram_with_its_sender() {
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let a = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = std::net::UdpSocket::bind("[::1]:0").ok();
        for i in 0..5u8 {
            a.send_to(&[i; 3], rx.local_addr().unwrap()).unwrap();
        }
        let mut batch = super::RecvBatch::new(4, 4);
        assert_eq!(batch.recv(&rx).unwrap(), 4, "a batch of 4 takes 4 of the 5");
        let got: Vec<_> = batch.datagrams().map(|d| d.unwrap()).collect();
        for (i, (bytes, from)) in got.iter().enumerate() {
            assert_eq!(*bytes, &[i as u8; 3]);
            assert_eq!(*from, a.local_addr().unwrap());
        }
        assert_eq!(batch.recv(&rx).unwrap(), 1);
        // one larger than the slot is reported, not passed on cut short
        a.send_to(&[9; 10], rx.local_addr().unwrap()).unwrap();
        assert_eq!(batch.recv(&rx).unwrap(), 1);
        assert!(batch.datagrams().next().unwrap().is_none());
        rx.set_nonblocking(true).unwrap();
        let e = batch.recv(&rx).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
        if let Some(b) = b {
            let rx6 = std::net::UdpSocket::bind("[::1]:0").unwrap();
            b.send_to(b"v6", rx6.local_addr().unwrap()).unwrap();
            assert_eq!(batch.recv(&rx6).unwrap(), 1);
            let (bytes, from) = batch.datagrams().next().unwrap().unwrap();
            assert_eq!((bytes, from), (&b"v6"[..], b.local_addr().unwrap()));
        }
    }
}
