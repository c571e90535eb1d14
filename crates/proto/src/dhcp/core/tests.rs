//! Core tests with packets shaped like real firmware sends them (option sets and
//! values as captured from SeaBIOS + iPXE ROM, an Intel-style BIOS PXE ROM, OVMF's
//! PXE and HTTP Boot stacks, and chained iPXE), checking every reply field.

use std::net::{Ipv4Addr, SocketAddrV4};

use dhcproto::v4::{
    Architecture, DhcpOption, Flags, HType, Message, MessageType, Opcode, OptionCode, UnknownOption,
};

use super::*;
use crate::dhcp::leases::{self, LeaseState};
use crate::dhcp::settings::section_from_toml;

const SERVER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const MAC: [u8; 6] = [0x52, 0x54, 0x00, 0xaa, 0xbb, 0xcc];
const UUID: [u8; 16] = [
    0x8a, 0x3b, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0x00, 0xaa, 0xbb, 0xcc, 0xdd,
];

fn settings(mode: &str) -> DhcpSettings {
    let text = format!(
        "[dhcp]\nenabled = true\ninterface = \"veth0\"\nmode = \"{mode}\"\nrange = \"10.0.0.100-10.0.0.199\"\nrouter = \"10.0.0.1\"\ndns = [\"10.0.0.53\"]\nlease_time_secs = 600\n[[dhcp.subnets]]\nnetwork = \"10.9.0.0/24\"\nranges = [\"10.9.0.10-10.9.0.20\"]\nrouter = \"10.9.0.1\"\n"
    );
    DhcpSettings::from_config(&section_from_toml(&text).unwrap(), "http://10.0.0.1:8080").unwrap()
}

fn server(mode: &str) -> Server {
    Server::new(settings(mode), SERVER)
}

fn meta(port: u16) -> Meta {
    Meta {
        now: 1_000_000,
        src: SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 68),
        local_port: port,
    }
}

fn base(t: MessageType) -> Message {
    let mut m = Message::new_with_id(
        0x1234_5678,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        &MAC,
    );
    m.set_opcode(Opcode::BootRequest).set_htype(HType::Eth);
    m.opts_mut().insert(DhcpOption::MessageType(t));
    m
}

/// dhclient-like plain client.
fn plain(t: MessageType) -> Message {
    let mut m = base(t);
    let o = m.opts_mut();
    o.insert(DhcpOption::Hostname("node-a".into()));
    o.insert(DhcpOption::ParameterRequestList(vec![
        OptionCode::SubnetMask,
        OptionCode::Router,
        OptionCode::DomainNameServer,
    ]));
    m
}

/// A PXE-family firmware request: max message size (57), architecture (93), UNDI
/// version (94), machine id (97, the UUID), class id (60) and the parameter request
/// list (55), as each firmware below sends them.
fn firmware(
    t: MessageType,
    broadcast: bool,
    max_size: u16,
    arch: Architecture,
    undi: (u8, u8, u8),
    class: &[u8],
    prl: &[u8],
) -> Message {
    let mut m = base(t);
    if broadcast {
        m.set_flags(Flags::default().set_broadcast());
    }
    let o = m.opts_mut();
    o.insert(DhcpOption::MaxMessageSize(max_size));
    o.insert(DhcpOption::ClientSystemArchitecture(arch));
    o.insert(DhcpOption::ClientNetworkInterface(undi.0, undi.1, undi.2));
    let mut id = vec![0u8];
    id.extend_from_slice(&UUID);
    o.insert(DhcpOption::ClientMachineIdentifier(id));
    o.insert(DhcpOption::ClassIdentifier(class.to_vec()));
    o.insert(DhcpOption::ParameterRequestList(
        prl.iter().map(|&c| OptionCode::from(c)).collect(),
    ));
    m
}

/// iPXE (QEMU's NIC ROM under SeaBIOS, or chained undionly.kpxe): arch 0, UNDI 2.1,
/// user class "iPXE", option 175 with its feature list.
fn ipxe_bios(t: MessageType) -> Message {
    let mut m = firmware(
        t,
        false,
        1472,
        Architecture::X86_Bios,
        (1, 2, 1),
        b"PXEClient:Arch:00000:UNDI:002001",
        &[
            1, 3, 6, 7, 12, 15, 17, 26, 43, 60, 66, 67, 119, 128, 129, 130, 131, 132, 133, 134,
            135, 175, 203,
        ],
    );
    let o = m.opts_mut();
    o.insert(DhcpOption::UserClass(b"iPXE".to_vec()));
    o.insert(DhcpOption::Unknown(UnknownOption::new(
        OptionCode::Unknown(175),
        vec![
            0xb1, 0x05, 0x01, 0x80, 0x86, 0x10, 0x0e, 0xeb, 0x03, 0x01, 0x00, 0x00, 0x17, 0x01,
            0x01, 0x13, 0x01, 0x01, 0x11, 0x01, 0x01, 0x27, 0x01, 0x01,
        ],
    )));
    m
}

/// A BIOS PXE ROM that is not iPXE (Intel Boot Agent style): arch 0, no 77/175.
fn bios_pxe(t: MessageType) -> Message {
    firmware(
        t,
        true,
        1260,
        Architecture::X86_Bios,
        (1, 2, 1),
        b"PXEClient:Arch:00000:UNDI:002001",
        &[
            1, 2, 3, 5, 6, 11, 12, 13, 15, 16, 17, 18, 43, 54, 60, 67, 128, 129, 130, 131, 132,
            133, 134, 135,
        ],
    )
}

/// OVMF's PXE (PxeBcDxe): arch 7, UNDI 3.0.
fn ovmf_pxe(t: MessageType) -> Message {
    firmware(
        t,
        true,
        1472,
        Architecture::X64,
        (1, 3, 0),
        b"PXEClient:Arch:00007:UNDI:003000",
        &[
            1, 2, 3, 4, 5, 6, 12, 13, 15, 17, 18, 22, 23, 28, 40, 41, 42, 43, 50, 51, 54, 58, 59,
            60, 66, 67, 97, 128, 129, 130, 131, 132, 133, 134, 135,
        ],
    )
}

/// OVMF native UEFI HTTP Boot (HttpBootDxe): arch 16, class HTTPClient.
fn ovmf_http(t: MessageType) -> Message {
    firmware(
        t,
        true,
        1472,
        Architecture(16),
        (1, 3, 0),
        b"HTTPClient:Arch:00016:UNDI:003000",
        &[1, 3, 6, 15, 43, 60, 66, 67],
    )
}

/// Chained iPXE (ipxe.efi / snponly.efi) on UEFI: arch 7 with 77 + 175.
fn ipxe_efi(t: MessageType) -> Message {
    let mut m = ovmf_pxe(t);
    let o = m.opts_mut();
    o.insert(DhcpOption::ClassIdentifier(
        b"PXEClient:Arch:00007:UNDI:003010".to_vec(),
    ));
    o.insert(DhcpOption::UserClass(b"iPXE".to_vec()));
    o.insert(DhcpOption::Unknown(UnknownOption::new(
        OptionCode::Unknown(175),
        vec![0x13, 0x01, 0x01, 0x24, 0x01, 0x01],
    )));
    m
}

fn roundtrip(m: &Message) -> Message {
    decode(&encode(m).unwrap()).unwrap()
}

fn reply(s: &mut Server, req: &Message, port: u16) -> Reply {
    // go through the wire format both ways, as the socket loop does
    let req = roundtrip(req);
    match s.handle(&req, &meta(port)) {
        Outcome::Reply(r) => {
            let msg = roundtrip(&r.msg);
            Reply { msg, ..r }
        }
        other => panic!("expected a reply, got {other:?}"),
    }
}

/// The `file` field as firmware reads it (C string).
fn fname(m: &Message) -> String {
    let b = m.fname().unwrap_or_default();
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8(b[..end].to_vec()).unwrap()
}

fn opt(m: &Message, c: OptionCode) -> Option<&DhcpOption> {
    m.opts().get(c)
}

fn bytes_opt(m: &Message, c: OptionCode) -> Option<Vec<u8>> {
    match opt(m, c)? {
        DhcpOption::ClassIdentifier(v)
        | DhcpOption::BootfileName(v)
        | DhcpOption::TFTPServerName(v)
        | DhcpOption::VendorExtensions(v)
        | DhcpOption::ClientMachineIdentifier(v) => Some(v.clone()),
        DhcpOption::Unknown(u) => Some(u.data().to_vec()),
        _ => None,
    }
}

fn assert_common(r: &Reply, t: MessageType) {
    assert_eq!(r.msg.opcode(), Opcode::BootReply);
    assert_eq!(r.msg.xid(), 0x1234_5678);
    assert_eq!(r.msg.chaddr(), &MAC);
    assert_eq!(r.msg.opts().msg_type(), Some(t));
    assert_eq!(
        opt(&r.msg, OptionCode::ServerIdentifier),
        Some(&DhcpOption::ServerIdentifier(SERVER))
    );
}

fn echoed_97(r: &Reply) {
    let mut id = vec![0u8];
    id.extend_from_slice(&UUID);
    assert_eq!(
        bytes_opt(&r.msg, OptionCode::ClientMachineIdentifier),
        Some(id)
    );
}

// ---- proxy mode -------------------------------------------------------------

#[test]
fn proxy_bios_pxe_gets_undionly_with_discovery_control() {
    let mut s = server("proxy");
    let r = reply(&mut s, &bios_pxe(MessageType::Discover), 67);
    assert_common(&r, MessageType::Offer);
    assert_eq!(r.kind, ReplyKind::ProxyOffer);
    assert_eq!(
        r.msg.yiaddr(),
        Ipv4Addr::UNSPECIFIED,
        "proxy never gives an address"
    );
    assert_eq!(r.msg.siaddr(), SERVER);
    assert_eq!(fname(&r.msg), "undionly.kpxe");
    assert_eq!(
        bytes_opt(&r.msg, OptionCode::BootfileName).unwrap(),
        b"undionly.kpxe"
    );
    assert_eq!(
        bytes_opt(&r.msg, OptionCode::TFTPServerName).unwrap(),
        b"10.0.0.1"
    );
    assert_eq!(
        bytes_opt(&r.msg, OptionCode::ClassIdentifier).unwrap(),
        b"PXEClient"
    );
    assert_eq!(
        bytes_opt(&r.msg, OptionCode::VendorExtensions).unwrap(),
        vec![6, 1, 8, 255]
    );
    assert!(opt(&r.msg, OptionCode::AddressLeaseTime).is_none());
    assert!(opt(&r.msg, OptionCode::Unknown(175)).is_none());
    echoed_97(&r);
    assert!(r.broadcast);
    assert_eq!(r.dest, SocketAddrV4::new(Ipv4Addr::BROADCAST, 68));
    assert!(
        s.table.take_journal().is_empty(),
        "proxy mode keeps no leases"
    );
}

#[test]
fn proxy_seabios_ipxe_rom_gets_script_url() {
    let mut s = server("proxy");
    let r = reply(&mut s, &ipxe_bios(MessageType::Discover), 67);
    assert_common(&r, MessageType::Offer);
    assert_eq!(r.msg.yiaddr(), Ipv4Addr::UNSPECIFIED);
    assert_eq!(fname(&r.msg), "http://10.0.0.1:8080/boot.ipxe");
    assert_eq!(
        bytes_opt(&r.msg, OptionCode::BootfileName).unwrap(),
        b"http://10.0.0.1:8080/boot.ipxe"
    );
    assert_eq!(
        bytes_opt(&r.msg, OptionCode::ClassIdentifier).unwrap(),
        b"PXEClient"
    );
    assert!(
        opt(&r.msg, OptionCode::VendorExtensions).is_none(),
        "no PXE menu control for iPXE"
    );
    assert!(opt(&r.msg, OptionCode::TFTPServerName).is_none());
    echoed_97(&r);
    // iPXE then asks the proxy on port 4011
    let mut req = ipxe_bios(MessageType::Request);
    req.set_ciaddr(Ipv4Addr::new(10, 0, 0, 150));
    let mut m = meta(4011);
    m.src = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 150), 68);
    let out = s.handle(&roundtrip(&req), &m).reply().unwrap();
    assert_eq!(out.kind, ReplyKind::ProxyAck);
    assert_eq!(out.dest, m.src);
    assert_eq!(out.msg.opts().msg_type(), Some(MessageType::Ack));
    assert_eq!(out.msg.yiaddr(), Ipv4Addr::UNSPECIFIED);
    assert_eq!(out.msg.ciaddr(), Ipv4Addr::new(10, 0, 0, 150));
    assert_eq!(fname(&out.msg), "http://10.0.0.1:8080/boot.ipxe");
}

#[test]
fn proxy_ovmf_pxe_offer_then_port_4011_ack() {
    let mut s = server("proxy");
    let r = reply(&mut s, &ovmf_pxe(MessageType::Discover), 67);
    assert_common(&r, MessageType::Offer);
    assert_eq!(r.msg.yiaddr(), Ipv4Addr::UNSPECIFIED);
    assert_eq!(r.msg.siaddr(), SERVER);
    assert_eq!(fname(&r.msg), "ipxe.efi");
    assert_eq!(
        bytes_opt(&r.msg, OptionCode::ClassIdentifier).unwrap(),
        b"PXEClient"
    );
    assert!(
        opt(&r.msg, OptionCode::VendorExtensions).is_none(),
        "UEFI asks on 4011 instead"
    );
    echoed_97(&r);
    // the REQUEST to the other server on port 67 is not ours
    let mut req67 = ovmf_pxe(MessageType::Request);
    req67
        .opts_mut()
        .insert(DhcpOption::ServerIdentifier(Ipv4Addr::new(10, 0, 0, 2)));
    req67
        .opts_mut()
        .insert(DhcpOption::RequestedIpAddress(Ipv4Addr::new(10, 0, 0, 120)));
    assert!(matches!(
        s.handle(&roundtrip(&req67), &meta(67)),
        Outcome::Drop(DropReason::Ignored)
    ));
    // then the boot-server request to port 4011, from its new address
    let mut req = ovmf_pxe(MessageType::Request);
    req.set_ciaddr(Ipv4Addr::new(10, 0, 0, 120));
    let mut m = meta(4011);
    m.src = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 120), 4011);
    let out = s.handle(&roundtrip(&req), &m).reply().unwrap();
    assert_eq!(out.kind, ReplyKind::ProxyAck);
    assert_eq!(
        out.dest,
        SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 120), 4011)
    );
    assert!(!out.broadcast);
    assert_eq!(out.msg.siaddr(), SERVER);
    assert_eq!(fname(&out.msg), "ipxe.efi");
    assert_eq!(
        bytes_opt(&out.msg, OptionCode::BootfileName).unwrap(),
        b"ipxe.efi"
    );
    assert_eq!(
        bytes_opt(&out.msg, OptionCode::TFTPServerName).unwrap(),
        b"10.0.0.1"
    );
}

#[test]
fn proxy_ovmf_http_boot_gets_url_and_httpclient() {
    let mut s = server("proxy");
    let r = reply(&mut s, &ovmf_http(MessageType::Discover), 67);
    assert_common(&r, MessageType::Offer);
    assert_eq!(r.msg.yiaddr(), Ipv4Addr::UNSPECIFIED);
    assert_eq!(
        bytes_opt(&r.msg, OptionCode::ClassIdentifier).unwrap(),
        b"HTTPClient"
    );
    assert_eq!(
        bytes_opt(&r.msg, OptionCode::BootfileName).unwrap(),
        b"http://10.0.0.1:8080/assets/ipxe.efi"
    );
    assert_eq!(fname(&r.msg), "http://10.0.0.1:8080/assets/ipxe.efi");
    assert!(opt(&r.msg, OptionCode::TFTPServerName).is_none());
    echoed_97(&r);
}

#[test]
fn proxy_ignores_plain_clients_and_requests_on_67() {
    let mut s = server("proxy");
    assert!(matches!(
        s.handle(&plain(MessageType::Discover), &meta(67)),
        Outcome::Drop(DropReason::Ignored)
    ));
    assert!(matches!(
        s.handle(&plain(MessageType::Request), &meta(4011)),
        Outcome::Drop(DropReason::Ignored)
    ));
    assert!(matches!(
        s.handle(&bios_pxe(MessageType::Request), &meta(67)),
        Outcome::Drop(DropReason::Ignored)
    ));
}

#[test]
fn unknown_arch_gets_nothing_but_configured_arm64_does() {
    let mut s = server("proxy");
    let mut req = ovmf_pxe(MessageType::Discover);
    req.opts_mut()
        .insert(DhcpOption::ClientSystemArchitecture(Architecture(11)));
    assert!(matches!(
        s.handle(&req, &meta(67)),
        Outcome::Drop(DropReason::Ignored)
    ));
    s.settings
        .boot
        .by_arch
        .insert(11, BootTarget::Tftp("ipxe-arm64.efi".into()));
    let r = s.handle(&req, &meta(67)).reply().unwrap();
    assert_eq!(fname(&r.msg), "ipxe-arm64.efi");
}

// ---- authoritative mode -----------------------------------------------------

#[test]
fn dora_renew_release_for_plain_client() {
    let mut s = server("authoritative");
    let off = reply(&mut s, &plain(MessageType::Discover), 67);
    assert_common(&off, MessageType::Offer);
    let ip = off.msg.yiaddr();
    assert_eq!(ip, Ipv4Addr::new(10, 0, 0, 100));
    assert_eq!(
        opt(&off.msg, OptionCode::SubnetMask),
        Some(&DhcpOption::SubnetMask(Ipv4Addr::new(255, 255, 255, 0)))
    );
    assert_eq!(
        opt(&off.msg, OptionCode::Router),
        Some(&DhcpOption::Router(vec![Ipv4Addr::new(10, 0, 0, 1)]))
    );
    assert_eq!(
        opt(&off.msg, OptionCode::DomainNameServer),
        Some(&DhcpOption::DomainNameServer(vec![Ipv4Addr::new(
            10, 0, 0, 53
        )]))
    );
    assert_eq!(
        opt(&off.msg, OptionCode::AddressLeaseTime),
        Some(&DhcpOption::AddressLeaseTime(600))
    );
    assert_eq!(
        opt(&off.msg, OptionCode::Renewal),
        Some(&DhcpOption::Renewal(300))
    );
    assert_eq!(
        opt(&off.msg, OptionCode::Rebinding),
        Some(&DhcpOption::Rebinding(525))
    );
    assert!(
        opt(&off.msg, OptionCode::BootfileName).is_none(),
        "no boot info for a plain client"
    );
    assert_eq!(off.msg.siaddr(), Ipv4Addr::UNSPECIFIED);
    assert!(off.broadcast);
    assert!(
        s.table.take_journal().is_empty(),
        "offers are not persisted"
    );

    // a second client gets another address while the offer is held
    let mut other = plain(MessageType::Discover);
    other.set_chaddr(&[2, 2, 2, 2, 2, 2]);
    assert_eq!(
        reply(&mut s, &other, 67).msg.yiaddr(),
        Ipv4Addr::new(10, 0, 0, 101)
    );

    let mut req = plain(MessageType::Request);
    req.opts_mut().insert(DhcpOption::ServerIdentifier(SERVER));
    req.opts_mut().insert(DhcpOption::RequestedIpAddress(ip));
    let ack = reply(&mut s, &req, 67);
    assert_common(&ack, MessageType::Ack);
    assert_eq!(ack.kind, ReplyKind::Ack);
    assert_eq!(ack.msg.yiaddr(), ip);
    let j = s.table.take_journal();
    assert_eq!(j.len(), 1, "the ACK's lease must be made durable");
    match &j[0] {
        leases::Change::Put(l) => {
            assert_eq!(
                (l.ip, l.mac, l.expires, l.state),
                (ip, MAC, 1_000_600, LeaseState::Bound)
            );
            assert_eq!(l.hostname.as_deref(), Some("node-a"));
        }
        c => panic!("{c:?}"),
    }

    // renew: unicast from ciaddr, no 50/54
    let mut renew = plain(MessageType::Request);
    renew.set_ciaddr(ip);
    let r = reply(&mut s, &renew, 67);
    assert_eq!(r.kind, ReplyKind::Ack);
    assert_eq!(r.msg.yiaddr(), ip);
    assert_eq!(r.msg.ciaddr(), ip);
    assert_eq!(r.dest, SocketAddrV4::new(ip, 68));
    assert!(!r.broadcast);

    // init-reboot asking for someone else's address: NAK, broadcast
    let mut reboot = plain(MessageType::Request);
    reboot.set_chaddr(&[3, 3, 3, 3, 3, 3]);
    reboot.opts_mut().insert(DhcpOption::RequestedIpAddress(ip));
    let nak = reply(&mut s, &reboot, 67);
    assert_eq!(nak.kind, ReplyKind::Nak);
    assert_eq!(nak.msg.yiaddr(), Ipv4Addr::UNSPECIFIED);
    assert!(nak.broadcast);
    assert!(opt(&nak.msg, OptionCode::AddressLeaseTime).is_none());

    // wrong network: NAK
    let mut wrong = plain(MessageType::Request);
    wrong
        .opts_mut()
        .insert(DhcpOption::RequestedIpAddress(Ipv4Addr::new(
            192, 168, 1, 5,
        )));
    assert_eq!(reply(&mut s, &wrong, 67).kind, ReplyKind::Nak);

    // release
    s.table.take_journal();
    let mut rel = plain(MessageType::Release);
    rel.set_ciaddr(ip);
    rel.opts_mut().insert(DhcpOption::ServerIdentifier(SERVER));
    assert!(matches!(
        s.handle(&roundtrip(&rel), &meta(67)),
        Outcome::Silent
    ));
    assert_eq!(s.table.get(ip).unwrap().state, LeaseState::Released);
    assert_eq!(s.table.take_journal().len(), 1);
    // and the same client gets the same address back
    assert_eq!(
        reply(&mut s, &plain(MessageType::Discover), 67)
            .msg
            .yiaddr(),
        ip
    );
}

#[test]
fn request_for_other_server_drops_our_offer() {
    let mut s = server("authoritative");
    let ip = reply(&mut s, &plain(MessageType::Discover), 67)
        .msg
        .yiaddr();
    let mut req = plain(MessageType::Request);
    req.opts_mut()
        .insert(DhcpOption::ServerIdentifier(Ipv4Addr::new(10, 0, 0, 2)));
    req.opts_mut()
        .insert(DhcpOption::RequestedIpAddress(Ipv4Addr::new(10, 0, 0, 222)));
    assert!(matches!(
        s.handle(&req, &meta(67)),
        Outcome::Drop(DropReason::Ignored)
    ));
    let mut other = plain(MessageType::Discover);
    other.set_chaddr(&[9; 6]);
    assert_eq!(
        reply(&mut s, &other, 67).msg.yiaddr(),
        ip,
        "offer released at once"
    );
}

#[test]
fn authoritative_ipxe_gets_script_and_no_proxy_wait() {
    let mut s = server("authoritative");
    for req in [
        ipxe_bios(MessageType::Discover),
        ipxe_efi(MessageType::Discover),
    ] {
        let r = reply(&mut s, &req, 67);
        assert_common(&r, MessageType::Offer);
        assert_ne!(r.msg.yiaddr(), Ipv4Addr::UNSPECIFIED);
        assert_eq!(fname(&r.msg), "http://10.0.0.1:8080/boot.ipxe");
        assert_eq!(
            bytes_opt(&r.msg, OptionCode::Unknown(175)).unwrap(),
            vec![176, 1, 1],
            "175.176 no-pxedhcp"
        );
        assert!(opt(&r.msg, OptionCode::VendorExtensions).is_none());
        echoed_97(&r);
    }
}

/// Issue 32: iPXE on a known machine's MAC gets a script token for that machine (minted
/// for the packet's time) next to the generic chain URL; every other client's reply
/// carries none, and PXE firmware gets its binary as before.
#[test]
fn ipxe_on_a_known_mac_gets_its_machines_script_token() {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let scripts = MachineScripts(std::sync::Arc::new(
        move |mac: Mac, addr: Option<Ipv4Addr>, now: u64| {
            log.lock().unwrap().push((addr, now));
            (mac == MAC).then(|| format!("{now}.tok"))
        },
    ));
    let token = OptionCode::Unknown(SCRIPT_TOKEN_OPTION);
    for mode in ["authoritative", "proxy"] {
        let mut s = server(mode).with_machine_scripts(scripts.clone());
        for req in [
            ipxe_bios(MessageType::Discover),
            ipxe_efi(MessageType::Discover),
        ] {
            let r = reply(&mut s, &req, 67);
            assert_eq!(fname(&r.msg), "http://10.0.0.1:8080/boot.ipxe", "{mode}");
            assert_eq!(bytes_opt(&r.msg, token).unwrap(), b"1000000.tok", "{mode}");
        }
        // Another MAC: no token.
        let mut other = ipxe_bios(MessageType::Discover);
        other.set_chaddr(&[2, 0, 0, 0, 0, 9]);
        let r = reply(&mut s, &other, 67);
        assert_eq!(fname(&r.msg), "http://10.0.0.1:8080/boot.ipxe", "{mode}");
        assert!(bytes_opt(&r.msg, token).is_none(), "{mode}");
        // PXE firmware on the known MAC: its iPXE binary, no token (iPXE asks again).
        let r = reply(&mut s, &bios_pxe(MessageType::Discover), 67);
        assert_eq!(fname(&r.msg), "undionly.kpxe", "{mode}");
        assert!(bytes_opt(&r.msg, token).is_none(), "{mode}");
    }
    // Minted for the packet's time, and bound to the address the reply leases (the
    // offer's yiaddr); a proxy offer leases none.
    let seen = seen.lock().unwrap();
    assert!(seen.iter().all(|(_, now)| *now == 1_000_000));
    assert!(
        seen.iter()
            .any(|(a, _)| a.is_some_and(|a| !a.is_unspecified())),
        "{seen:?}"
    );
    assert!(seen.iter().any(|(a, _)| a.is_none()), "{seen:?}");
    // Without the hook (the management scope): no token.
    let r = reply(
        &mut server("authoritative"),
        &ipxe_bios(MessageType::Discover),
        67,
    );
    assert!(bytes_opt(&r.msg, token).is_none());
}

#[test]
fn authoritative_firmware_gets_address_and_boot_file() {
    let mut s = server("authoritative");
    let r = reply(&mut s, &bios_pxe(MessageType::Discover), 67);
    assert_eq!(r.msg.yiaddr(), Ipv4Addr::new(10, 0, 0, 100));
    assert_eq!(fname(&r.msg), "undionly.kpxe");
    assert_eq!(r.msg.siaddr(), SERVER);
    assert_eq!(
        bytes_opt(&r.msg, OptionCode::VendorExtensions).unwrap(),
        vec![6, 1, 8, 255],
        "discovery control 8: boot from this offer"
    );
    assert!(opt(&r.msg, OptionCode::AddressLeaseTime).is_some());

    let mut req = ovmf_pxe(MessageType::Discover);
    req.set_chaddr(&[4; 6]);
    let r = reply(&mut s, &req, 67);
    assert_eq!(fname(&r.msg), "ipxe.efi");
    assert_eq!(
        bytes_opt(&r.msg, OptionCode::ClassIdentifier).unwrap(),
        b"PXEClient"
    );
    // Without 43, EDK2 takes this for a BINL offer and asks port 4011 (not open here).
    assert_eq!(
        bytes_opt(&r.msg, OptionCode::VendorExtensions).unwrap(),
        vec![6, 1, 8, 255]
    );
    let mut req = ovmf_http(MessageType::Discover);
    req.set_chaddr(&[5; 6]);
    let r = reply(&mut s, &req, 67);
    assert_eq!(
        bytes_opt(&r.msg, OptionCode::ClassIdentifier).unwrap(),
        b"HTTPClient"
    );
    assert_eq!(
        bytes_opt(&r.msg, OptionCode::BootfileName).unwrap(),
        b"http://10.0.0.1:8080/assets/ipxe.efi"
    );
    // full DORA for the HTTP client carries the same boot info in the ACK
    let mut rq = ovmf_http(MessageType::Request);
    rq.set_chaddr(&[5; 6]);
    rq.opts_mut().insert(DhcpOption::ServerIdentifier(SERVER));
    rq.opts_mut()
        .insert(DhcpOption::RequestedIpAddress(r.msg.yiaddr()));
    let ack = reply(&mut s, &rq, 67);
    assert_eq!(ack.kind, ReplyKind::Ack);
    assert_eq!(
        bytes_opt(&ack.msg, OptionCode::BootfileName).unwrap(),
        b"http://10.0.0.1:8080/assets/ipxe.efi"
    );
}

#[test]
fn relay_selects_subnet_by_giaddr_and_replies_to_relay() {
    let mut s = server("authoritative");
    let mut req = plain(MessageType::Discover);
    req.set_giaddr(Ipv4Addr::new(10, 9, 0, 1));
    req.set_hops(1);
    let mut m = meta(67);
    m.src = SocketAddrV4::new(Ipv4Addr::new(10, 9, 0, 1), 67);
    let r = s.handle(&roundtrip(&req), &m).reply().unwrap();
    assert_eq!(r.msg.yiaddr(), Ipv4Addr::new(10, 9, 0, 10));
    assert_eq!(r.msg.giaddr(), Ipv4Addr::new(10, 9, 0, 1));
    assert_eq!(r.dest, SocketAddrV4::new(Ipv4Addr::new(10, 9, 0, 1), 67));
    assert!(!r.broadcast);
    assert_eq!(
        opt(&r.msg, OptionCode::Router),
        Some(&DhcpOption::Router(vec![Ipv4Addr::new(10, 9, 0, 1)]))
    );
    // unknown relay network: no subnet
    let mut req = plain(MessageType::Discover);
    req.set_giaddr(Ipv4Addr::new(172, 16, 0, 1));
    assert!(matches!(
        s.handle(&req, &meta(67)),
        Outcome::Drop(DropReason::NoSubnet)
    ));
}

#[test]
fn reservation_and_inform_and_decline() {
    let mut s = server("authoritative");
    s.set_reservations(vec![Reservation {
        mac: MAC,
        ip: Ipv4Addr::new(10, 0, 0, 42),
        hostname: Some("srv-1".into()),
    }]);
    let off = reply(&mut s, &plain(MessageType::Discover), 67);
    assert_eq!(off.msg.yiaddr(), Ipv4Addr::new(10, 0, 0, 42));
    // asking for a different address than the reserved one: NAK
    let mut req = plain(MessageType::Request);
    req.opts_mut()
        .insert(DhcpOption::RequestedIpAddress(Ipv4Addr::new(10, 0, 0, 150)));
    assert_eq!(reply(&mut s, &req, 67).kind, ReplyKind::Nak);
    let mut req = plain(MessageType::Request);
    req.opts_mut()
        .insert(DhcpOption::RequestedIpAddress(Ipv4Addr::new(10, 0, 0, 42)));
    assert_eq!(reply(&mut s, &req, 67).kind, ReplyKind::Ack);
    match &s.table.take_journal()[0] {
        leases::Change::Put(l) => assert_eq!(l.hostname.as_deref(), Some("srv-1")),
        c => panic!("{c:?}"),
    }

    let mut inf = plain(MessageType::Inform);
    inf.set_ciaddr(Ipv4Addr::new(10, 0, 0, 77));
    let r = reply(&mut s, &inf, 67);
    assert_eq!(r.kind, ReplyKind::Inform);
    assert_eq!(r.msg.yiaddr(), Ipv4Addr::UNSPECIFIED);
    assert!(opt(&r.msg, OptionCode::AddressLeaseTime).is_none());
    assert_eq!(r.dest, SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 77), 68));

    let mut other = plain(MessageType::Discover);
    other.set_chaddr(&[6; 6]);
    let ip = reply(&mut s, &other, 67).msg.yiaddr();
    let mut req = plain(MessageType::Request);
    req.set_chaddr(&[6; 6]);
    req.opts_mut().insert(DhcpOption::RequestedIpAddress(ip));
    reply(&mut s, &req, 67);
    let mut dec = plain(MessageType::Decline);
    dec.set_chaddr(&[6; 6]);
    dec.opts_mut().insert(DhcpOption::RequestedIpAddress(ip));
    assert!(matches!(s.handle(&dec, &meta(67)), Outcome::Silent));
    assert_ne!(
        reply(&mut s, &other, 67).msg.yiaddr(),
        ip,
        "declined address is parked"
    );
}

#[test]
fn malformed_input_never_panics() {
    let mut s = server("authoritative");
    let good = encode(&ipxe_bios(MessageType::Discover)).unwrap();
    // every truncation and single-byte corruption of a real packet
    for n in 0..good.len() {
        if let Some(m) = decode(&good[..n]) {
            let _ = s.handle(&m, &meta(67));
        }
    }
    for i in 0..good.len() {
        for v in [0u8, 1, 0x7f, 0xff] {
            let mut b = good.clone();
            b[i] = v;
            if let Some(m) = decode(&b) {
                let _ = s.handle(&m, &meta(67));
                let _ = s.handle(&m, &meta(4011));
            }
        }
    }
    // hlen larger than chaddr: dhcproto's chaddr() would panic; we refuse it
    let mut b = good.clone();
    b[2] = 200;
    assert!(decode(&b).is_none());
    // option 94 twice (fuzz finding): dhcproto joins repeats and asserts on the length
    let mut b = encode(&bios_pxe(MessageType::Discover)).unwrap();
    let end = b.len() - 1;
    assert_eq!(b[end], 255);
    b.splice(end..end, [94u8, 3, 1, 2, 1]);
    assert!(decode(&b).is_none());
    // a BOOTREPLY is not a request
    let mut m = ipxe_bios(MessageType::Discover);
    m.set_opcode(Opcode::BootReply);
    assert!(matches!(
        s.handle(&m, &meta(67)),
        Outcome::Drop(DropReason::NotRequest)
    ));
    // no message type
    let mut m = plain(MessageType::Discover);
    m.opts_mut().remove(OptionCode::MessageType);
    assert!(matches!(
        s.handle(&m, &meta(67)),
        Outcome::Drop(DropReason::Malformed)
    ));
}

#[test]
fn long_replies_overload_file_and_sname_within_option_57() {
    // A long public URL makes the HTTP Boot reply outgrow the 312-octet options field.
    let long = format!("http://10.0.0.1:8080/{}", "p".repeat(150));
    let text = format!(
        "[dhcp]\nenabled = true\ninterface = \"veth0\"\nmode = \"authoritative\"\nrange = \"10.0.0.100-10.0.0.199\"\nrouter = \"10.0.0.1\"\ndns = [\"10.0.0.53\", \"10.0.0.54\"]\ndomain = \"{}.example\"\n",
        "d".repeat(40)
    );
    let mut s = Server::new(
        DhcpSettings::from_config(&section_from_toml(&text).unwrap(), &long).unwrap(),
        SERVER,
    );
    let url = format!("{long}/assets/ipxe.efi");
    // OVMF sends option 57 = 1472; a client without it gets the RFC minimum.
    let mut req = ovmf_http(MessageType::Discover);
    req.opts_mut().remove(OptionCode::MaxMessageSize);
    let r = s.handle(&roundtrip(&req), &meta(67)).reply().unwrap();
    assert_eq!(r.max_len, MIN_MESSAGE_LEN);
    let plain = encode(&r.msg).unwrap();
    assert!(plain.len() > MIN_MESSAGE_LEN, "{}", plain.len());
    let (wire, left_out) = encode_reply(&r).unwrap();
    let mut sizes = Vec::new();
    let mut i = 240;
    while i + 1 < plain.len() && plain[i] != 255 {
        sizes.push((plain[i], plain[i + 1]));
        i += 2 + usize::from(plain[i + 1]);
    }
    assert_eq!(left_out, 0, "{} bytes, options {sizes:?}", plain.len());
    assert!(wire.len() <= MIN_MESSAGE_LEN, "{}", wire.len());
    // option 52 is set in the options field, the client reads everything back
    let i = 240
        + wire[240..]
            .windows(3)
            .position(|w| w[0] == 52 && w[1] == 1)
            .unwrap();
    assert!(matches!(wire[i + 2], 1 | 3), "overload {}", wire[i + 2]);
    let seen = decode(&wire).unwrap();
    assert_eq!(
        bytes_opt(&seen, OptionCode::BootfileName).unwrap(),
        url.as_bytes()
    );
    assert_eq!(
        bytes_opt(&seen, OptionCode::ClassIdentifier).unwrap(),
        b"HTTPClient"
    );
    assert_eq!(seen.opts().msg_type(), Some(MessageType::Offer));
    assert_eq!(seen.yiaddr(), r.msg.yiaddr());
    assert!(matches!(
        opt(&seen, OptionCode::DomainNameServer),
        Some(DhcpOption::DomainNameServer(v)) if v.len() == 2
    ));
    assert!(opt(&seen, OptionCode::ClientMachineIdentifier).is_some());
    assert!(opt(&seen, OptionCode::Unknown(52)).is_none());

    // A client that accepts 1500 octets (option 57) gets the plain layout.
    let mut big = ovmf_http(MessageType::Discover);
    big.set_chaddr(&[2, 0, 0, 0, 0, 9]);
    big.opts_mut().insert(DhcpOption::MaxMessageSize(1500));
    let r = s.handle(&roundtrip(&big), &meta(67)).reply().unwrap();
    assert_eq!(r.max_len, 1472);
    let (wire, _) = encode_reply(&r).unwrap();
    assert_eq!(wire, encode(&r.msg).unwrap());
    assert!(wire.len() > MIN_MESSAGE_LEN);
    assert_eq!(
        bytes_opt(&decode(&wire).unwrap(), OptionCode::BootfileName).unwrap(),
        url.as_bytes()
    );
}

#[test]
fn hostname_loses_control_characters_at_intake() {
    let with = |h: &str| {
        let mut m = plain(MessageType::Discover);
        m.opts_mut().insert(DhcpOption::Hostname(h.into()));
        hostname(&m)
    };
    // An OSC sequence setting the terminal's title: only its printable part is kept.
    assert_eq!(with("\u{1b}]0;owned\u{7}").as_deref(), Some("]0;owned"));
    assert_eq!(with("a\u{9b}b\r\nc\u{7f}").as_deref(), Some("abc"));
    assert_eq!(with("\u{1b}\u{7}"), None);
    assert_eq!(with(&"x".repeat(100)).map(|h| h.len()), Some(63));
}
