//! Which appliance answers which client when several serve one segment from leases
//! shared in etcd ([`super::cluster`]): the live members, and the client's owner among
//! them by the hash of its MAC.
//!
//! Without this every appliance answered every DISCOVER: a client took whichever OFFER
//! came first, two appliances raced for the pool, and a machine whose chosen appliance
//! died went unanswered (RFC 2131: no server answers a REQUEST naming another) until
//! its REQUEST retransmissions ran out, about a minute. Now (as Kea's load balancing
//! does by hash, but over any number of appliances and without splitting the pool):
//!
//! - **One answer per DISCOVER**: the client's *owner* is the live member with the
//!   highest rendezvous weight for its MAC ([`weight`]: FNV-1a over the member's name
//!   and the MAC, then a 64-bit finaliser; the same on every appliance and every
//!   build). Only the owner OFFERs; an INIT-REBOOT REQUEST (no server identifier, no
//!   `ciaddr`) is answered by the owner too. When a member dies only its clients move,
//!   each to the member next in its own order.
//! - **A REQUEST naming a dead member is answered**: a client that chose an appliance
//!   which died since repeats its REQUEST with that appliance's server identifier; the
//!   owner among the live answers it *on the dead member's behalf*: an ACK from the
//!   shared ledger (the usual compare-and-swap), or a NAK, either with the dead member's
//!   identifier, because clients take an answer only from the server they chose (iPXE
//!   drops any other ACK, busybox udhcpc any other NAK). Its `siaddr` and boot
//!   URLs are the answering appliance's own, so the boot goes on there. A REQUEST naming
//!   a live member, or an address that never was a member (another DHCP server on the
//!   segment), is left to that server, as before.
//! - Renewals and rebinds (`ciaddr` set) are answered by whoever hears them: a unicast
//!   renewal reaches only the appliance it names, a rebind is broadcast, and the ledger
//!   makes every answer the same.
//!
//! Membership comes from etcd (`members/etcd.rs`): each appliance keeps a key on a
//! lease of `dhcp.member_ttl_secs` (default 3 s, renewed every third of it) and a
//! permanent record of its server address; a member whose lease lapsed is dead, and its
//! address is known as a member's. So a killed appliance's clients are answered by the
//! others within the TTL, before a client's first retransmission (RFC 2131: 4 s), and a
//! stopped appliance revokes its lease on the way out, so the others take over at once.
//! An appliance counts itself live always: it needs etcd to grant anything anyway.

use std::collections::{BTreeSet, HashSet};
use std::net::Ipv4Addr;

use crate::model::ident::Mac;

#[cfg(feature = "etcd")]
pub mod etcd;

/// The members of a scope as one appliance sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    me: String,
    my_ip: Ipv4Addr,
    /// Live members' names, this appliance's among them.
    live: BTreeSet<String>,
    /// Server addresses of members whose lease lapsed (and that no live member uses).
    dead: HashSet<Ipv4Addr>,
}

/// A member's rendezvous weight for `mac`: FNV-1a 64 over the name, a separator and the
/// MAC, finalised (splitmix64) so that names differing in one byte spread well. Part of
/// the protocol between appliances: every version must compute the same.
pub fn weight(name: &str, mac: &Mac) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes().chain([0xff]).chain(mac.iter().copied()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// The member of `names` that owns `mac` (highest weight; ties by name), `None` when
/// `names` is empty.
pub fn owner<'a, I: IntoIterator<Item = &'a str>>(names: I, mac: &Mac) -> Option<&'a str> {
    names
        .into_iter()
        .max_by_key(|n| (weight(n, mac), std::cmp::Reverse(*n)))
}

impl View {
    /// This appliance alone (before the first listing, and in tests).
    pub fn solo(me: &str, my_ip: Ipv4Addr) -> View {
        View::new(me, my_ip, [], [])
    }

    /// From the live members' names and every member's (name, server address) record.
    pub fn new<'a>(
        me: &str,
        my_ip: Ipv4Addr,
        live: impl IntoIterator<Item = &'a str>,
        records: impl IntoIterator<Item = (&'a str, Ipv4Addr)>,
    ) -> View {
        let mut alive: BTreeSet<String> = live.into_iter().map(str::to_string).collect();
        alive.insert(me.to_string());
        let records: Vec<(&str, Ipv4Addr)> = records.into_iter().collect();
        let live_ips: HashSet<Ipv4Addr> = records
            .iter()
            .filter(|(n, _)| alive.contains(*n))
            .map(|(_, ip)| *ip)
            .chain([my_ip])
            .collect();
        let dead = records
            .iter()
            .map(|(_, ip)| *ip)
            .filter(|ip| !live_ips.contains(ip))
            .collect();
        View {
            me: me.to_string(),
            my_ip,
            live: alive,
            dead,
        }
    }

    pub fn live(&self) -> impl Iterator<Item = &str> {
        self.live.iter().map(String::as_str)
    }

    /// This appliance owns `mac`: it answers the client's DISCOVER and INIT-REBOOT.
    pub fn mine(&self, mac: &Mac) -> bool {
        owner(self.live(), mac) == Some(self.me.as_str())
    }

    /// A REQUEST from `mac` naming `server` (not this appliance) is this appliance's to
    /// answer on that server's behalf: `server` was a member, is dead, and `mac` is ours.
    pub fn stands_in_for(&self, server: Ipv4Addr, mac: &Mac) -> bool {
        server != self.my_ip && self.dead.contains(&server) && self.mine(mac)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mac(i: u32) -> Mac {
        let b = i.to_be_bytes();
        [0x02, 0x00, b[0], b[1], b[2], b[3]]
    }

    const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
    const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 3);
    const C: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 4);

    #[test]
    fn weights_are_fixed_across_builds() {
        // The appliances of one cluster must agree: a change here is a protocol change
        // (the figure was checked against the same arithmetic written in Python).
        assert_eq!(weight("a", &mac(1)), weight("a", &mac(1)));
        assert_eq!(
            weight("a", &mac(1)),
            0x71a9_3ff4_3f20_e3bd,
            "{:#x}",
            weight("a", &mac(1))
        );
        assert_ne!(weight("a", &mac(1)), weight("b", &mac(1)));
    }

    #[test]
    fn every_mac_has_exactly_one_owner_and_shares_are_even() {
        let records = [("a", A), ("b", B), ("c", C)];
        let views: Vec<View> = records
            .iter()
            .map(|(n, ip)| View::new(n, *ip, ["a", "b", "c"], records))
            .collect();
        let mut counts = [0usize; 3];
        for i in 0..30_000 {
            let owners: Vec<usize> = (0..3).filter(|&k| views[k].mine(&mac(i))).collect();
            assert_eq!(owners.len(), 1, "mac {i}: {owners:?}");
            counts[owners[0]] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn a_dead_members_clients_move_and_no_other_client_does() {
        let records = [("a", A), ("b", B), ("c", C)];
        let all = View::new("b", B, ["a", "b", "c"], records);
        let without_a = View::new("b", B, ["b", "c"], records);
        let c_without_a = View::new("c", C, ["b", "c"], records);
        let mut moved = 0;
        for i in 0..10_000 {
            let m = mac(i);
            let was = owner(["a", "b", "c"], &m).unwrap();
            if was == "a" {
                moved += 1;
                assert!(without_a.mine(&m) != c_without_a.mine(&m));
                // a REQUEST naming a is answered by its new owner, on a's behalf
                assert_eq!(without_a.stands_in_for(A, &m), without_a.mine(&m));
                assert!(!all.stands_in_for(A, &m), "a is live");
            } else {
                assert_eq!(
                    without_a.mine(&m),
                    was == "b",
                    "mac {i} moved off a live member"
                );
            }
            // never for a live member, itself, or an address that was never a member
            assert!(!without_a.stands_in_for(C, &m));
            assert!(!without_a.stands_in_for(B, &m));
            assert!(!without_a.stands_in_for(Ipv4Addr::new(10, 0, 0, 99), &m));
        }
        assert!((2_800..3_900).contains(&moved), "{moved}");
    }

    #[test]
    fn an_appliance_counts_itself_live_and_an_address_reused_by_a_live_member_is_not_dead() {
        let solo = View::solo("a", A);
        assert!((0..100).all(|i| solo.mine(&mac(i))));
        // b restarted under a new name on the same address: its old record is not dead
        let v = View::new("a", A, ["a", "b2"], [("a", A), ("b", B), ("b2", B)]);
        assert!((0..100).all(|i| !v.stands_in_for(B, &mac(i))));
    }
}
