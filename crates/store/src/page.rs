//! Lists in pages (`limit`/`continue`, as kubectl and client-go's pagers ask): objects in
//! key order after the last key of the page before, parsed only when a filter must see
//! them or they go on the page. A page of 500 of 10,000 Servers parses 500 objects, not
//! 10,000 (`kubectl get` on a big fleet asks for 20 such pages).

use std::sync::Arc;

use serde_json::Value;

use super::backend::{KvBackend, Rev};
use super::Store;
use bootplane_model::meta;
use bootplane_model::registry::ResourceType;
use bootplane_model::selector::Selector;

/// One page of [`Store::list_page`].
#[derive(Debug)]
pub struct Page {
    pub items: Vec<Arc<Value>>,
    /// Where the next page starts (after this key, relative to the type's prefix), when
    /// there are more objects.
    pub next: Option<String>,
    /// How many objects of the type come after this page; `None` with a filter (they
    /// are not parsed to count them, and kube leaves the count out then too).
    pub remaining: Option<usize>,
    /// The revision the page was read at.
    pub rev: Rev,
}

impl<B: KvBackend> Store<B> {
    /// Up to `limit` objects of `rt` (in `ns`, or every namespace) that pass `sel` and
    /// `keep`, in key order, after `after` (an earlier page's [`Page::next`]; any text:
    /// the page starts at the first key above it, within the type).
    pub fn list_page(
        &self,
        rt: &ResourceType,
        (ns, sel): (Option<&str>, Option<&Selector>),
        (after, limit): (Option<&str>, usize),
        keep: Option<&dyn Fn(&Value) -> bool>,
    ) -> Page {
        let ns = if rt.namespaced { ns } else { None };
        let limit = limit.max(1);
        let base = rt.prefix(None);
        let (kvs, rev) = self.kv.range(&rt.prefix(ns));
        let start = match after {
            Some(a) => {
                let from = format!("{base}{a}");
                kvs.partition_point(|kv| *kv.key <= *from)
            }
            None => 0,
        };
        let filtered = sel.is_some() || keep.is_some();
        let mut items = Vec::new();
        let mut next = None;
        let mut remaining = None;
        let mut last = start;
        for (i, kv) in kvs.iter().enumerate().skip(start) {
            let v = if filtered {
                let v = kv.value();
                let passes =
                    sel.is_none_or(|s| s.matches(meta::labels(&v))) && keep.is_none_or(|k| k(&v));
                if !passes {
                    continue;
                }
                Some(v)
            } else {
                None
            };
            if items.len() == limit {
                next = kvs[last].key.strip_prefix(base.as_str()).map(String::from);
                remaining = (!filtered).then(|| kvs.len() - i);
                break;
            }
            items.push(v.unwrap_or_else(|| kv.value()));
            last = i;
        }
        Page {
            items,
            next,
            remaining,
            rev,
        }
    }
}
