//! Socket tuning shared by the UDP servers (and the benches' clients): a boot storm
//! arrives as a burst, and a socket must be able to queue it while its reader works.

use std::os::fd::AsFd;

/// Raise a socket's receive buffer to `bytes`: past `net.core.rmem_max` when allowed
/// (`SO_RCVBUFFORCE`, needs CAP_NET_ADMIN), else as far as the limit lets
/// (`SO_RCVBUF`). The error is the second attempt's; a caller that cannot get the
/// room only loses burst capacity, so most log it and go on.
pub fn raise_rcvbuf<F: AsFd>(sock: &F, bytes: usize) -> nix::Result<()> {
    use nix::sys::socket::{setsockopt, sockopt};
    setsockopt(sock, sockopt::RcvBufForce, &bytes)
        .or_else(|_| setsockopt(sock, sockopt::RcvBuf, &bytes))
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
}
