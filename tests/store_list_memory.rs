//! `Store::list` parses objects as its iterator advances. A watcher that falls behind
//! the event log re-lists its type; with a 10,000-machine fleet, holding every Server
//! parsed at once was a 60-90 MiB burst of resident memory in the boot storm (issue 9),
//! which pushed the appliance over its 256 MiB goal in a third of the runs.
//!
//! This binary counts the bytes its allocations hold (its own global allocator, so it
//! is a test binary of its own) and compares the peak while walking a listing with
//! what the same listing costs when every object is kept.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use bootplane::model::registry::Registry;
use bootplane::store::Store;
use serde_json::json;

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(n: usize) {
    let live = LIVE.fetch_add(n, Ordering::Relaxed) + n;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to `System` unchanged; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = System.alloc(l);
        if !p.is_null() {
            grew(l.size());
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l);
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        let q = System.realloc(p, l, new);
        if !q.is_null() {
            LIVE.fetch_sub(l.size(), Ordering::Relaxed);
            grew(new);
        }
        q
    }
}

#[global_allocator]
static A: Counting = Counting;

/// Bytes held at the highest point while `f` runs, above what was held before it.
fn peak_during<T>(f: impl FnOnce() -> T) -> (usize, T) {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let r = f();
    (PEAK.load(Ordering::Relaxed).saturating_sub(base), r)
}

#[tokio::test(flavor = "current_thread")]
async fn walking_a_listing_holds_one_parsed_object_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let servers = Registry::global().resolve("server").unwrap();
    // More than the store keeps parsed for its most recent writes, so most of the
    // listing is stored text only, as in a large fleet.
    let n = 3000;
    let creates = (0..n).map(|i| {
        let nics: Vec<_> = (0..4)
            .map(|k| json!({"name": format!("eth{k}"), "macAddress": format!("52:54:00:{:02x}:{:02x}:{k:02x}", i / 256, i % 256), "ip": format!("10.{k}.{}.{}", i / 256, i % 256)}))
            .collect();
        store.create(
            &servers,
            json!({
                "metadata": {"name": format!("server-{i}"),
                             "labels": {"rack": format!("r{}", i % 40), "zone": "a", "pool": "storm"}},
                "spec": {"systemUUID": format!("00000000-0000-4000-8000-{i:012}")},
                "status": {"state": "Available", "powerState": "Off", "networkInterfaces": nics},
            }),
        )
    });
    for r in futures::future::join_all(creates).await {
        r.unwrap();
    }

    let (walked, seen) = peak_during(|| {
        let (items, _) = store.list(&servers, None, None);
        items.filter(|o| o["metadata"]["name"].is_string()).count()
    });
    assert_eq!(seen, n);
    let (held, kept) = peak_during(|| store.list(&servers, None, None).0.collect::<Vec<_>>());
    assert_eq!(kept.len(), n);
    drop(kept);

    eprintln!("peak while walking {walked} bytes, holding every object {held} bytes");
    assert!(
        walked * 10 < held,
        "walking a listing of {n} objects peaked at {walked} bytes, against {held} bytes \
         to hold them all parsed: the objects are not parsed one at a time"
    );
}
