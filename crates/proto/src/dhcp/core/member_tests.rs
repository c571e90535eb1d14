//! The core with several appliances sharing the scope ([`super::super::members`]):
//! who answers a DISCOVER, an INIT-REBOOT, a renewal, and a REQUEST naming a member
//! that died, and with which server identifier.

use std::net::{Ipv4Addr, SocketAddrV4};

use dhcproto::v4::{DhcpOption, HType, Message, MessageType, Opcode, OptionCode};

use super::*;
use crate::dhcp::members::{owner, View};
use crate::dhcp::settings::section_from_toml;

const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 3);

fn server(me: &str, ip: Ipv4Addr, live: &[&str]) -> Server {
    let text = "[dhcp]\nenabled = true\ninterface = \"veth0\"\nmode = \"authoritative\"\n\
                range = \"10.0.0.100-10.0.0.199\"\nlease_time_secs = 600\n";
    let settings =
        DhcpSettings::from_config(&section_from_toml(text).unwrap(), "http://10.0.0.1:8080")
            .unwrap();
    let mut s = Server::new(settings, ip);
    s.set_members(View::new(
        me,
        ip,
        live.iter().copied(),
        [("a", A), ("b", B)],
    ));
    s
}

fn meta() -> Meta {
    Meta {
        now: 1_000_000,
        src: SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 68),
        local_port: 67,
    }
}

fn msg(t: MessageType, mac: &[u8; 6]) -> Message {
    let mut m = Message::new_with_id(
        7,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        mac,
    );
    m.set_opcode(Opcode::BootRequest).set_htype(HType::Eth);
    m.opts_mut().insert(DhcpOption::MessageType(t));
    m
}

/// A SELECTING REQUEST of iPXE: `ip` from the server `sid`.
fn select(mac: &[u8; 6], ip: Ipv4Addr, sid: Ipv4Addr) -> Message {
    let mut m = msg(MessageType::Request, mac);
    m.opts_mut().insert(DhcpOption::UserClass(b"iPXE".to_vec()));
    m.opts_mut().insert(DhcpOption::RequestedIpAddress(ip));
    m.opts_mut().insert(DhcpOption::ServerIdentifier(sid));
    m
}

fn sid(r: &Reply) -> Option<Ipv4Addr> {
    match r.msg.opts().get(OptionCode::ServerIdentifier) {
        Some(DhcpOption::ServerIdentifier(s)) => Some(*s),
        _ => None,
    }
}

/// A MAC owned by `who` when both are live.
fn mac_of(who: &str) -> [u8; 6] {
    (0u8..=255)
        .map(|i| [2, 0, 0, 0, 1, i])
        .find(|m| owner(["a", "b"], m) == Some(who))
        .expect("some mac")
}

#[test]
fn one_member_offers_to_each_client() {
    let (mut a, mut b) = (server("a", A, &["a", "b"]), server("b", B, &["a", "b"]));
    for i in 0u8..64 {
        let mac = [2, 0, 0, 0, 2, i];
        let d = msg(MessageType::Discover, &mac);
        let (ra, rb) = (a.handle(&d, &meta()), b.handle(&d, &meta()));
        let answered = [&ra, &rb]
            .iter()
            .filter(|o| matches!(o, Outcome::Reply(_)))
            .count();
        assert_eq!(answered, 1, "mac {i}: {ra:?} / {rb:?}");
        let quiet = if matches!(ra, Outcome::Reply(_)) {
            rb
        } else {
            ra
        };
        assert!(matches!(quiet, Outcome::Drop(DropReason::OtherMember)));
    }
}

#[test]
fn a_request_naming_a_dead_member_is_acked_by_the_owner_as_that_member() {
    // a offered, then died: b (alone live) gets the client's REQUEST naming a
    let mac = mac_of("a");
    let mut a = server("a", A, &["a", "b"]);
    let Outcome::Reply(offer) = a.handle(&msg(MessageType::Discover, &mac), &meta()) else {
        panic!("a owns the mac")
    };
    let ip = offer.msg.yiaddr();
    let req = select(&mac, ip, A);

    // while a is live, b leaves it to a
    let mut b = server("b", B, &["a", "b"]);
    assert!(matches!(
        b.handle(&req, &meta()),
        Outcome::Drop(DropReason::Ignored)
    ));

    let mut b = server("b", B, &["b"]);
    let Outcome::Reply(ack) = b.handle(&req, &meta()) else {
        panic!("b stands in for a")
    };
    assert_eq!(ack.kind, ReplyKind::Ack);
    assert_eq!(ack.msg.yiaddr(), ip);
    assert_eq!(sid(&ack), Some(A), "the identifier the client chose");
    assert_eq!(ack.msg.siaddr(), B, "the boot goes on at b");
    assert_eq!(
        ack.msg.opts().get(OptionCode::BootfileName),
        Some(&DhcpOption::BootfileName(
            b"http://10.0.0.1:8080/boot.ipxe".to_vec()
        )),
        "b's own script url"
    );
    // had the ledger refused, the NAK carries a's identifier too (udhcpc checks it)
    assert_eq!(sid(&b.nak_for(&ack)), Some(A));

    // an address b's table gives to another MAC: a NAK as a, so the client starts over
    let mut other = msg(MessageType::Discover, &[2, 0, 0, 0, 3, 3]);
    other.set_chaddr(&[2, 0, 0, 0, 3, 3]);
    let taken = match b.handle(&other, &meta()) {
        Outcome::Reply(r) => r.msg.yiaddr(),
        o => panic!("{o:?}"),
    };
    let mut b2 = server("b", B, &["b"]);
    b2.table.bind(taken, [2, 0, 0, 0, 3, 3], None, 2_000_000);
    let Outcome::Reply(nak) = b2.handle(&select(&mac, taken, A), &meta()) else {
        panic!("answered")
    };
    assert_eq!(nak.kind, ReplyKind::Nak);
    assert_eq!(sid(&nak), Some(A));

    // never for an address that was not a member (another DHCP server on the segment)
    assert!(matches!(
        b.handle(&select(&mac, ip, Ipv4Addr::new(10, 0, 0, 77)), &meta()),
        Outcome::Drop(DropReason::Ignored)
    ));
}

#[test]
fn init_reboot_goes_to_the_owner_and_renewals_to_whoever_hears_them() {
    let mac = mac_of("b");
    let (mut a, mut b) = (server("a", A, &["a", "b"]), server("b", B, &["a", "b"]));
    let mut reboot = msg(MessageType::Request, &mac);
    reboot
        .opts_mut()
        .insert(DhcpOption::RequestedIpAddress(Ipv4Addr::new(10, 0, 0, 150)));
    assert!(matches!(
        a.handle(&reboot, &meta()),
        Outcome::Drop(DropReason::OtherMember)
    ));
    let Outcome::Reply(ack) = b.handle(&reboot, &meta()) else {
        panic!("the owner answers")
    };
    assert_eq!((ack.kind, sid(&ack)), (ReplyKind::Ack, Some(B)));

    // a rebind (ciaddr, broadcast) reaches both: both answer, from the shared ledger
    a.table
        .bind(Ipv4Addr::new(10, 0, 0, 150), mac, None, 2_000_000);
    let mut rebind = msg(MessageType::Request, &mac);
    rebind.set_ciaddr(Ipv4Addr::new(10, 0, 0, 150));
    for s in [&mut a, &mut b] {
        match s.handle(&rebind, &meta()) {
            Outcome::Reply(r) => assert_eq!(r.kind, ReplyKind::Ack),
            o => panic!("{o:?}"),
        }
    }
}
