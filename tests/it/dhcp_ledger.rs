//! The DHCP lease ledger on a real etcd (`crates/proto/src/dhcp/cluster.rs`): two appliances'
//! writers and ledgers on one scope. Asserted: on a 3-member cluster, two
//! compare-and-swaps on one address, for two MACs, at once, through different members:
//! exactly one wins, for each of 64 addresses, and the loser reads the winner's lease; the winner renews, the loser
//! cannot, anyone takes over an expired lease (past the skew margin); a stale revision
//! is retried on what the key holds; a forget deletes only the record it knew. Two
//! ledgers mirror each other (the other's lease is in the table and the index, an
//! ACK that lost becomes a NAK, the winner's ACK is sent; these and the tests below run
//! on a single member, which can be frozen). A watch compacted away is
//! listed again. With etcd frozen: the commit fails within the request timeout, no
//! OFFER, a renewing client is ACKed for what its lease has left, a new one is not
//! answered; etcd back: leases are granted again.

use crate::support;

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use bootplane::dhcp::cluster::{self, Intent, Keys, Known, MirrorMsg, Outcome, Writer};
use bootplane::dhcp::leases::Verdict;
use bootplane::dhcp::leases::{Lease, LeaseIndex, LeaseState, LeaseTable};
use bootplane::dhcp::settings::Subnet;
use bootplane::dhcp::{Metrics, Reply, ReplyKind};
use bootplane::shutdown::Coordinator;
use bootplane::store::settings::EtcdConfig;
use bootplane::sys::unix_now;
use support::etcd::EtcdCluster;
use support::etcd_solo::Etcd;

fn lease(ip: Ipv4Addr, mac: u8, expires: u64) -> Lease {
    Lease {
        ip,
        mac: [2, 0, 0, 0, 0, mac],
        hostname: Some(format!("host-{mac}")),
        expires,
        state: LeaseState::Bound,
    }
}

/// Every key of the scope and its value, as etcdctl reads them.
fn stored(cluster: &EtcdCluster) -> Vec<(String, String)> {
    let o = cluster.etcdctl(&["get", "--prefix", "/t/dhcp/boot/"]);
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    lines
        .chunks(2)
        .map(|c| (c[0].to_string(), c[1].to_string()))
        .collect()
}

fn ip(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, 0, last)
}

async fn client(e: &Etcd) -> etcd_client::Client {
    etcd_client::Client::connect([e.endpoint.as_str()], None)
        .await
        .unwrap()
}

fn config(e: &Etcd, name: &str, timeout_ms: u64) -> EtcdConfig {
    EtcdConfig {
        endpoints: vec![e.endpoint.clone()],
        prefix: "/t/".into(),
        name: Some(name.into()),
        request_timeout_ms: timeout_ms,
        dial_timeout_ms: 1000,
        ..EtcdConfig::default()
    }
}

fn table() -> LeaseTable {
    let mut t = LeaseTable::new(
        vec![Subnet {
            network: Ipv4Addr::new(10, 77, 0, 0),
            prefix_len: 24,
            ranges: vec![(ip(10), ip(250))],
            exclude: vec![],
            router: None,
            dns: vec![],
            domain: None,
            lease_time_secs: 600,
        }],
        vec![],
    );
    t.share(cluster::SKEW_MARGIN_SECS);
    t
}

/// The ACK the core would send for `l` (ciaddr set: a renewing client).
fn ack(l: &Lease, renewing: bool) -> Reply {
    let mut m = dhcproto::v4::Message::default();
    m.set_chaddr(&l.mac).set_yiaddr(l.ip);
    if renewing {
        m.set_ciaddr(l.ip);
    }
    Reply {
        msg: m,
        dest: SocketAddrV4::new(Ipv4Addr::BROADCAST, 68),
        broadcast: true,
        kind: ReplyKind::Ack,
        max_len: 576,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_writers_one_address_exactly_one_wins_and_the_rule_holds() {
    // three members; the two appliances talk to different ones
    let cluster = EtcdCluster::start(3);
    let ends = cluster.endpoints();
    let connect = |e: String| async move { etcd_client::Client::connect([e], None).await.unwrap() };
    let (ca, cb) = (
        connect(ends[0].clone()).await,
        connect(ends[1].clone()).await,
    );
    let keys = Keys::new("/t/", "boot");
    let t = Duration::from_secs(5);
    let (a, b) = (
        Writer::new(&ca, keys.clone(), "a", t),
        Writer::new(&cb, keys.clone(), "b", t),
    );
    // 64 addresses, each raced by a (MAC 1) and b (MAC 2) at once, from "absent"
    let race = |w: &Writer, mac: u8| {
        let w = w.clone();
        async move {
            let intents = (10..74)
                .map(|n| Intent {
                    ip: ip(n),
                    want: Some(lease(ip(n), mac, unix_now() + 600)),
                    known: Known::default(),
                })
                .collect();
            w.write(intents).await
        }
    };
    let (ra, rb) = tokio::join!(race(&a, 1), race(&b, 2));
    let mut wins = (0, 0);
    for (addr, oa) in &ra {
        let ob = &rb.iter().find(|(i, _)| i == addr).unwrap().1;
        match (oa, ob) {
            (Outcome::Written(w), Outcome::Lost(l)) | (Outcome::Lost(l), Outcome::Written(w)) => {
                assert_eq!(
                    w.lease, l.lease,
                    "{addr}: the loser read the winner's lease"
                );
                assert_eq!(w.rev, l.rev);
            }
            other => panic!("{addr}: not exactly one winner: {other:?}"),
        }
        if matches!(oa, Outcome::Written(_)) {
            wins.0 += 1;
        } else {
            wins.1 += 1;
        }
    }
    eprintln!("64 raced addresses: a won {}, b won {}", wins.0, wins.1);
    let records = stored(&cluster);
    assert_eq!(records.len(), 64);
    assert!(
        records[0].1.starts_with(r#"{"mac":"02:00:00:00:00:0"#),
        "{records:?}"
    );

    // the winner renews on what it knows; the loser may not replace it
    let (winner, w_known, loser_known) =
        match (&ra[0].1, &rb.iter().find(|x| x.0 == ra[0].0).unwrap().1) {
            (Outcome::Written(k), Outcome::Lost(l)) => (&a, k.clone(), l.clone()),
            (Outcome::Lost(l), Outcome::Written(k)) => (&b, k.clone(), l.clone()),
            other => panic!("{other:?}"),
        };
    let addr = ra[0].0;
    let mac = w_known.lease.as_ref().unwrap().mac[5];
    let renewed = winner
        .write_one(Intent {
            ip: addr,
            want: Some(lease(addr, mac, unix_now() + 900)),
            known: w_known.clone(),
        })
        .await;
    let Outcome::Written(renewed) = renewed else {
        panic!("renewal: {renewed:?}")
    };
    assert!(renewed.rev > w_known.rev);
    let other = if mac == 1 { 2 } else { 1 };
    let loser = if std::ptr::eq(winner, &a) { &b } else { &a };
    // its knowledge is stale: the CAS reads the key back and still loses
    // what it knows says no: no Txn, the answer is what it knows
    let lost = loser
        .write_one(Intent {
            ip: addr,
            want: Some(lease(addr, other, unix_now() + 600)),
            known: loser_known.clone(),
        })
        .await;
    assert_eq!(lost, Outcome::Lost(loser_known));
    // it knows nothing: the compare fails, the key is read back and still says no
    let lost = loser
        .write_one(Intent {
            ip: addr,
            want: Some(lease(addr, other, unix_now() + 600)),
            known: Known::default(),
        })
        .await;
    assert_eq!(lost, Outcome::Lost(renewed.clone()));

    // an expired lease (past the skew margin) is taken over, even from a stale revision
    let expired = lease(addr, mac, unix_now() - cluster::SKEW_MARGIN_SECS - 1);
    let Outcome::Written(exp) = winner
        .write_one(Intent {
            ip: addr,
            want: Some(expired),
            known: renewed,
        })
        .await
    else {
        panic!("expiring")
    };
    let taken = loser
        .write_one(Intent {
            ip: addr,
            want: Some(lease(addr, other, unix_now() + 600)),
            known: Known::default(),
        })
        .await;
    let Outcome::Written(taken) = taken else {
        panic!("takeover: {taken:?}")
    };
    assert_eq!(taken.lease.as_ref().unwrap().mac[5], other);

    // a forget deletes only the record it knew
    let forget = |known: Known| Intent {
        ip: addr,
        want: None,
        known,
    };
    assert!(matches!(
        winner.write_one(forget(exp)).await,
        Outcome::Lost(k) if k.lease.as_ref().unwrap().mac[5] == other
    ));
    let gone = loser.write_one(forget(taken)).await;
    assert!(
        matches!(gone, Outcome::Written(Known { exists: false, .. })),
        "{gone:?}"
    );
    assert_eq!(stored(&cluster).len(), 63);
}

/// One appliance's side: its ledger, table and index.
struct Side {
    ledger: cluster::Ledger,
    table: LeaseTable,
    index: LeaseIndex,
    metrics: Metrics,
}

impl Side {
    async fn start(cfg: &EtcdConfig, coord: &Coordinator) -> Side {
        let metrics = Metrics::default();
        let mut shutdown = coord.handle();
        let (mut ledger, first) = cluster::Ledger::start(cfg, "boot", &metrics, &mut shutdown)
            .await
            .unwrap()
            .unwrap();
        let (mut table, index) = (table(), LeaseIndex::default());
        ledger.observe(first, &mut table, &index);
        Side {
            ledger,
            table,
            index,
            metrics,
        }
    }

    /// Commit what the table journaled; the outcomes by address.
    async fn commit(&mut self) -> std::collections::HashMap<Ipv4Addr, Outcome> {
        let journal = self.table.take_journal();
        self.ledger.queued(&journal);
        let (w, intents) = self.ledger.begin(journal);
        let out = w.write(intents).await;
        self.ledger
            .finish(out, &mut self.table, &self.index, &self.metrics)
    }

    /// Apply mirror messages until `cond` holds (at most 10 s).
    async fn until(&mut self, cond: impl Fn(&Side) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !cond(self) {
            let msg = tokio::time::timeout_at(deadline, self.ledger.next_mirror())
                .await
                .expect("the mirror caught up in time");
            self.ledger.observe(msg, &mut self.table, &self.index);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_ledgers_mirror_each_other_and_the_loser_naks() {
    let e = Etcd::start();
    let coord = Coordinator::new();
    let mut a = Side::start(&config(&e, "a", 2000), &coord).await;
    let mut b = Side::start(&config(&e, "b", 2000), &coord).await;
    let now = unix_now();

    // a grants .20 to MAC 1; b's mirror learns it: held in b's table and index
    a.table.bind(ip(20), [2, 0, 0, 0, 0, 1], None, now + 600);
    let out = a.commit().await;
    let l1 = lease(ip(20), 1, now + 600);
    let l1 = Lease {
        hostname: None,
        ..l1
    };
    assert_eq!(a.ledger.verdict(&out, &ack(&l1, false), now), Verdict::Send);
    b.until(|s| s.index.by_ip(ip(20)).is_some()).await;
    assert_eq!(b.table.get(ip(20)), Some(&l1));
    let mac2 = [2, 0, 0, 0, 0, 2];
    assert_ne!(b.table.choose(0, &mac2, Some(ip(20)), now).unwrap(), ip(20));
    // MAC 1 rebinding through b is ACKed there
    b.table.bind(ip(20), l1.mac, None, now + 700);
    let out = b.commit().await;
    assert_eq!(b.ledger.verdict(&out, &ack(&l1, true), now), Verdict::Send);

    // both bind .30 before either mirror knows: exactly one ACK, the other a NAK
    a.table.bind(ip(30), [2, 0, 0, 0, 0, 3], None, now + 600);
    b.table.bind(ip(30), [2, 0, 0, 0, 0, 4], None, now + 600);
    let (oa, ob) = tokio::join!(a.commit(), b.commit());
    let (la, lb) = (
        Lease {
            hostname: None,
            ..lease(ip(30), 3, now + 600)
        },
        Lease {
            hostname: None,
            ..lease(ip(30), 4, now + 600)
        },
    );
    let va = a.ledger.verdict(&oa, &ack(&la, false), now);
    let vb = b.ledger.verdict(&ob, &ack(&lb, false), now);
    assert!(
        matches!(
            (va, vb),
            (Verdict::Send, Verdict::Nak) | (Verdict::Nak, Verdict::Send)
        ),
        "{va:?} {vb:?}"
    );
    // the loser's table and index learned the winner at once
    let winner = if va == Verdict::Send { &la } else { &lb };
    assert_eq!(a.table.get(ip(30)), Some(winner));
    assert_eq!(b.table.get(ip(30)), Some(winner));
    assert_eq!(b.index.by_ip(ip(30)).as_ref(), Some(winner));

    // a release through a frees the address in b once mirrored
    assert!(a.table.release(ip(20), &l1.mac, now));
    a.commit().await;
    b.until(|s| s.index.by_ip(ip(20)).is_none()).await;
    assert_eq!(b.table.get(ip(20)).unwrap().state, LeaseState::Released);
    coord.trigger();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_compacted_away_is_listed_again() {
    let e = Etcd::start();
    let mut c = client(&e).await;
    let keys = Keys::new("/t/", "boot");
    let (tx, mut rx) = tokio::sync::mpsc::channel(1);
    let relists = prometheus_client::metrics::counter::Counter::default();
    let coord = Coordinator::new();
    tokio::spawn(cluster::mirror(
        c.clone(),
        keys.clone(),
        tx,
        Duration::from_secs(5),
        relists.clone(),
        coord.handle(),
    ));
    let first = rx.recv().await.unwrap();
    assert!(matches!(first, MirrorMsg::Snapshot { ref records, .. } if records.is_empty()));
    // the loop does not read while 6 MB of lease records pass (more than the client's
    // HTTP/2 window of 2 MB and etcd's buffers: the watcher falls behind) and etcd
    // compacts them away
    let w = Writer::new(&c, keys.clone(), "a", Duration::from_secs(5));
    let big = "h".repeat(8 << 10);
    for round in 0..4u64 {
        let intents = (0..200u32)
            .map(|n| {
                let a = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 78, 0, 0)) + n);
                Intent {
                    ip: a,
                    want: Some(Lease {
                        ip: a,
                        mac: [2, 0, 0, 0, 0, 9],
                        hostname: Some(big.clone()),
                        expires: 1000 + round,
                        state: LeaseState::Bound,
                    }),
                    known: Known::default(),
                }
            })
            .collect();
        // each round writes the keys afresh
        let _ = c
            .delete(
                "/t/dhcp/boot/",
                Some(etcd_client::DeleteOptions::new().with_prefix()),
            )
            .await
            .unwrap();
        let out = w.write(intents).await;
        assert!(out.iter().all(|o| matches!(o.1, Outcome::Written(_))));
    }
    let head = c.get("x", None).await.unwrap().header().unwrap().revision();
    c.compact(head, None).await.unwrap();
    // reading again: the buffered events, then a new listing of what is there now
    let (got, events, downs) = tokio::time::timeout(Duration::from_secs(30), async {
        let (mut events, mut downs) = (0, 0);
        loop {
            match rx.recv().await.unwrap() {
                MirrorMsg::Snapshot { records, .. } => return (records, events, downs),
                MirrorMsg::Events(ev) => events += ev.len(),
                MirrorMsg::Down => downs += 1,
            }
        }
    })
    .await
    .expect("a second listing after the compaction");
    eprintln!("{events} of 1,600 events seen before the new listing");
    assert!(
        events < 1600 && downs == 0,
        "{events} events, {downs} downs"
    );
    assert_eq!(got.len(), 200);
    assert!(relists.get() >= 1, "{}", relists.get());
    coord.trigger();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_etcd_is_frozen_renewals_get_what_is_left_and_nothing_new_is_granted() {
    let e = Etcd::start();
    let coord = Coordinator::new();
    let mut a = Side::start(&config(&e, "a", 500), &coord).await;
    let now = unix_now();
    a.table.bind(ip(40), [2, 0, 0, 0, 0, 5], None, now + 300);
    a.table.bind(ip(41), [2, 0, 0, 0, 0, 6], None, now + 8);
    a.commit().await;
    assert!(a.ledger.available());

    e.pause();
    let t0 = std::time::Instant::now();
    let now = unix_now();
    a.table.bind(ip(40), [2, 0, 0, 0, 0, 5], None, now + 600);
    a.table.bind(ip(41), [2, 0, 0, 0, 0, 6], None, now + 600);
    a.table.bind(ip(42), [2, 0, 0, 0, 0, 7], None, now + 600);
    // and 200 more new leases: the commit still fails within one request timeout
    for n in 50..250u8 {
        a.table.bind(ip(n), [2, 0, 0, 0, 1, n], None, now + 600);
    }
    let out = a.commit().await;
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    assert!(out.values().all(|o| *o == Outcome::Failed), "{out:?}");
    assert!(!a.ledger.available());
    assert_eq!(a.metrics.cluster_commit_failures.get(), 203);
    let l = |n, mac| Lease {
        hostname: None,
        ..lease(ip(n), mac, 0)
    };
    // renewing with 300 s left: ACKed for those; at most 8 s left: not; a new lease: not
    match a.ledger.verdict(&out, &ack(&l(40, 5), true), now) {
        Verdict::Renewal(s) => assert!((290..=300).contains(&s), "{s}"),
        v => panic!("{v:?}"),
    }
    assert_eq!(
        a.ledger.verdict(&out, &ack(&l(40, 5), false), now),
        Verdict::Drop
    );
    assert_eq!(
        a.ledger.verdict(&out, &ack(&l(41, 6), true), now),
        Verdict::Drop
    );
    assert_eq!(
        a.ledger.verdict(&out, &ack(&l(42, 7), false), now),
        Verdict::Drop
    );
    // the table went back to what etcd holds: the old expiry, no lease for .42
    assert!(a.table.get(ip(40)).unwrap().expires <= now + 300);
    assert!(a.table.get(ip(42)).is_none());

    // etcd back: the client's next attempt is granted (the first may still meet the
    // connection the freeze broke)
    e.resume();
    let mut attempts = 0;
    loop {
        attempts += 1;
        a.table.bind(ip(42), [2, 0, 0, 0, 0, 7], None, now + 600);
        let out = a.commit().await;
        match a.ledger.verdict(&out, &ack(&l(42, 7), false), now) {
            Verdict::Send => break,
            v => assert!(attempts < 20, "{v:?} {out:?}"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!("granted again at attempt {attempts}");
    assert!(a.ledger.available());
    coord.trigger();
}
