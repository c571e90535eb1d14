//! proxyDHCP alongside a real authoritative server: dnsmasq (DHCP only, `--port=0`)
//! and `bootplane serve --dhcp-mode proxy` share the server namespace's interface.
//! A PXE client written here with dhcproto (it runs in the client namespace, so it
//! can send exactly what firmware sends) must get its address from dnsmasq and its
//! boot file from bootplane; then, as UEFI PXE does, ask bootplane on port 4011.

use crate::support;

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use dhcproto::v4::{
    Architecture, DhcpOption, Flags, HType, Message, MessageType, Opcode, OptionCode,
};
use dhcproto::{Decodable, Decoder, Encodable};

use support::dhcp::*;
use support::process::*;
use support::require::*;

/// Run `f` on a thread that has entered network namespace `ns` (sockets it opens stay there).
fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let fd = std::fs::File::open(&path).expect("opening netns");
        // SAFETY: setns on this thread only, with a valid namespace fd.
        let rc = unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .expect("netns thread")
}

fn client_socket(port: u16) -> UdpSocket {
    use nix::sys::socket::{setsockopt, sockopt};
    let s = UdpSocket::bind(("0.0.0.0", port)).expect("binding client port");
    s.set_broadcast(true).unwrap();
    setsockopt(&s, sockopt::BindToDevice, &std::ffi::OsString::from("vc"))
        .expect("SO_BINDTODEVICE");
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    s
}

fn pxe_packet(mac: [u8; 6], t: MessageType, arch: u16, class: &str) -> Message {
    let mut m = Message::new_with_id(
        0x5eed_0000 | u32::from(arch),
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        &mac,
    );
    m.set_opcode(Opcode::BootRequest)
        .set_htype(HType::Eth)
        .set_flags(Flags::default().set_broadcast());
    let o = m.opts_mut();
    o.insert(DhcpOption::MessageType(t));
    o.insert(DhcpOption::MaxMessageSize(1472));
    o.insert(DhcpOption::ClientSystemArchitecture(Architecture(arch)));
    o.insert(DhcpOption::ClientNetworkInterface(1, 2, 1));
    o.insert(DhcpOption::ClientMachineIdentifier(vec![
        0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
    ]));
    o.insert(DhcpOption::ClassIdentifier(class.as_bytes().to_vec()));
    o.insert(DhcpOption::ParameterRequestList(
        [1u8, 3, 43, 54, 60, 66, 67]
            .iter()
            .map(|&c| OptionCode::from(c))
            .collect(),
    ));
    m
}

/// Send `m` to `to` and collect decoded replies with our xid for `wait`.
fn exchange(s: &UdpSocket, m: &Message, to: SocketAddrV4, wait: Duration) -> Vec<Message> {
    s.send_to(&m.to_vec().unwrap(), to).expect("sending");
    let mut out = Vec::new();
    let mut buf = [0u8; 1500];
    let t = Instant::now();
    while t.elapsed() < wait {
        if let Ok((n, _)) = s.recv_from(&mut buf) {
            if let Ok(r) = Message::decode(&mut Decoder::new(&buf[..n])) {
                if r.xid() == m.xid() && r.opcode() == Opcode::BootReply {
                    out.push(r);
                }
            }
        }
    }
    out
}

fn file(m: &Message) -> String {
    let b = m.fname().unwrap_or_default();
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

fn class(m: &Message) -> Vec<u8> {
    match m.opts().get(OptionCode::ClassIdentifier) {
        Some(DhcpOption::ClassIdentifier(v)) => v.clone(),
        _ => vec![],
    }
}

#[test]
fn proxy_mode_alongside_dnsmasq() {
    require("dnsmasq");
    let lab = Lab::new(43);
    let _bp = lab.start_bootplane(
        "[http]\npublic_url = \"http://10.199.43.1:8080\"\n",
        &["--dhcp-interface", "vs", "--dhcp-mode", "proxy"],
        "bootplane.log",
    );
    let mut c = lab.server.cmd("dnsmasq");
    c.args([
        "--no-daemon",
        "--conf-file=/dev/null",
        "--port=0",
        "--interface=vs",
        "--bind-interfaces",
        "--dhcp-range=10.199.43.50,10.199.43.60,255.255.255.0,12h",
        &format!("--dhcp-leasefile={}", lab.path("dnsmasq.leases").display()),
        &format!("--pid-file={}", lab.path("dnsmasq.pid").display()),
        "--log-dhcp",
        "--no-ping",
    ]);
    c.stderr(std::fs::File::create(lab.path("dnsmasq.log")).unwrap());
    let _dnsmasq = Proc::spawn(c);
    wait_for(
        Duration::from_secs(10),
        || read(&lab.path("dnsmasq.log")).contains("DHCP, IP range"),
        || read(&lab.path("dnsmasq.log")),
    );

    let mac = [0x02, 0, 0, 0, 0x43, 0x01];
    let ns = lab.client.name.clone();
    let (offers, acks) = in_netns(&ns, move || {
        let s = client_socket(68);
        let bcast = SocketAddrV4::new(Ipv4Addr::BROADCAST, 67);
        let offers = exchange(
            &s,
            &pxe_packet(
                mac,
                MessageType::Discover,
                0,
                "PXEClient:Arch:00000:UNDI:002001",
            ),
            bcast,
            Duration::from_secs(3),
        );
        let lease = offers
            .iter()
            .find(|o| !o.yiaddr().is_unspecified())
            .map(|o| {
                (
                    o.yiaddr(),
                    o.opts().get(OptionCode::ServerIdentifier).cloned(),
                )
            });
        let mut acks = Vec::new();
        if let Some((ip, Some(sid))) = lease {
            let mut req = pxe_packet(
                mac,
                MessageType::Request,
                0,
                "PXEClient:Arch:00000:UNDI:002001",
            );
            req.opts_mut().insert(DhcpOption::RequestedIpAddress(ip));
            req.opts_mut().insert(sid);
            acks = exchange(&s, &req, bcast, Duration::from_secs(1));
        }
        (offers, acks)
    });

    // dnsmasq gives the address, without boot information
    let dns_offer = offers
        .iter()
        .find(|o| !o.yiaddr().is_unspecified())
        .unwrap_or_else(|| {
            panic!(
                "no offer from dnsmasq: {offers:?}\n{}",
                read(&lab.path("dnsmasq.log"))
            )
        });
    let ip = dns_offer.yiaddr();
    assert!((50..=60).contains(&ip.octets()[3]), "{ip}");
    assert_eq!(file(dns_offer), "");
    // bootplane gives the boot file, without an address
    let proxy = offers
        .iter()
        .find(|o| o.yiaddr().is_unspecified())
        .unwrap_or_else(|| {
            panic!(
                "no proxy offer: {offers:?}\n{}",
                read(&lab.path("bootplane.log"))
            )
        });
    assert_eq!(proxy.opts().msg_type(), Some(MessageType::Offer));
    assert_eq!(file(proxy), "undionly.kpxe");
    assert_eq!(proxy.siaddr(), Ipv4Addr::new(10, 199, 43, 1));
    assert_eq!(class(proxy), b"PXEClient");
    assert_eq!(
        proxy.opts().get(OptionCode::VendorExtensions),
        Some(&DhcpOption::VendorExtensions(vec![6, 1, 8, 255]))
    );
    assert_eq!(
        proxy.opts().get(OptionCode::ServerIdentifier),
        Some(&DhcpOption::ServerIdentifier(Ipv4Addr::new(10, 199, 43, 1)))
    );
    assert_eq!(
        offers.len(),
        2,
        "exactly one offer from each server: {offers:?}"
    );
    // the REQUEST is acknowledged by dnsmasq only
    assert_eq!(acks.len(), 1, "{acks:?}");
    assert_eq!(acks[0].opts().msg_type(), Some(MessageType::Ack));
    assert_eq!(acks[0].yiaddr(), ip);
    assert!(
        read(&lab.path("dnsmasq.leases")).contains("02:00:00:00:43:01"),
        "dnsmasq holds the lease"
    );

    // UEFI PXE (arch 7): with its address configured, it asks bootplane on port 4011
    lab.client
        .ip(&["addr", "add", &format!("{ip}/24"), "dev", "vc"]);
    let replies = in_netns(&ns, move || {
        let s = client_socket(4011);
        let mut req = pxe_packet(
            mac,
            MessageType::Request,
            7,
            "PXEClient:Arch:00007:UNDI:003000",
        );
        req.set_ciaddr(ip);
        req.set_flags(Flags::default());
        exchange(
            &s,
            &req,
            SocketAddrV4::new(Ipv4Addr::new(10, 199, 43, 1), 4011),
            Duration::from_millis(1500),
        )
    });
    assert_eq!(
        replies.len(),
        1,
        "{replies:?}\n{}",
        read(&lab.path("bootplane.log"))
    );
    let r = &replies[0];
    assert_eq!(r.opts().msg_type(), Some(MessageType::Ack));
    assert_eq!(r.yiaddr(), Ipv4Addr::UNSPECIFIED);
    assert_eq!(file(r), "ipxe.efi");
    assert_eq!(r.siaddr(), Ipv4Addr::new(10, 199, 43, 1));
    assert_eq!(class(r), b"PXEClient");
    assert_eq!(
        r.opts().get(OptionCode::ClientMachineIdentifier),
        Some(&DhcpOption::ClientMachineIdentifier(vec![
            0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16
        ]))
    );
}
