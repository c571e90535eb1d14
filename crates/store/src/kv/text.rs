//! The text a put stores, made on the caller's thread before the transaction is
//! queued: the writer thread is the one place every commit waits on, so it only
//! splices the commit's revision into a slot left for `metadata.resourceVersion`.

use std::sync::Arc;

use serde_json::Value;

use super::{Action, KvError, Op, Rev, MAX_VALUE_BYTES};
use crate::seal::{is_sealed, Binding, Sealer};

/// A value's compact JSON text, serialized before commit with an empty slot where
/// `metadata.resourceVersion`'s digits go (the revision is only known at commit).
/// Splicing the revision in at `slot` gives exactly the text of the value after
/// [`stamp`]: `resourceVersion` keeps its place in `metadata`, or comes last when it
/// was absent, as `serde_json::Map::insert` does.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub(crate) text: String,
    /// Byte offset of the revision's digits (between the quotes), when the value is
    /// a map with a `metadata` map.
    slot: Option<usize>,
    /// For a sealed type ([`crate::seal`]): `text` (with an empty
    /// `resourceVersion`) encrypted, and the key's name. What the engine stores.
    pub(crate) sealed: Option<(Vec<u8>, Arc<str>)>,
}

impl Prepared {
    fn new(v: &Value) -> Prepared {
        let mut out = Vec::with_capacity(512);
        let top = match v {
            Value::Object(m) if m.get("metadata").is_some_and(Value::is_object) => m,
            _ => {
                ser(&mut out, v);
                return Prepared {
                    text: utf8(out),
                    slot: None,
                    sealed: None,
                };
            }
        };
        let mut slot = 0;
        out.push(b'{');
        for (i, (k, val)) in top.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            ser(&mut out, k);
            out.push(b':');
            match val {
                Value::Object(md) if k == "metadata" => {
                    out.push(b'{');
                    let mut placed = false;
                    for (j, (mk, mv)) in md.iter().enumerate() {
                        if j > 0 {
                            out.push(b',');
                        }
                        ser(&mut out, mk);
                        out.push(b':');
                        if mk == "resourceVersion" {
                            out.push(b'"');
                            slot = out.len();
                            out.push(b'"');
                            placed = true;
                        } else {
                            ser(&mut out, mv);
                        }
                    }
                    if !placed {
                        if !md.is_empty() {
                            out.push(b',');
                        }
                        out.extend_from_slice(b"\"resourceVersion\":\"");
                        slot = out.len();
                        out.push(b'"');
                    }
                    out.push(b'}');
                }
                _ => ser(&mut out, val),
            }
        }
        out.push(b'}');
        Prepared {
            text: utf8(out),
            slot: Some(slot),
            sealed: None,
        }
    }

    /// The bytes the engine stores: the sealed text, else the text.
    pub(crate) fn stored(&self) -> &[u8] {
        match &self.sealed {
            Some((b, _)) => b,
            None => self.text.as_bytes(),
        }
    }

    /// The text with `rev` in its slot.
    pub(crate) fn stamped(&self, rev: Rev) -> Arc<str> {
        match self.slot {
            None => Arc::from(self.text.as_str()),
            Some(at) => {
                let digits = rev.to_string();
                let mut s = String::with_capacity(self.text.len() + digits.len());
                s.push_str(&self.text[..at]);
                s.push_str(&digits);
                s.push_str(&self.text[at..]);
                Arc::from(s)
            }
        }
    }
}

/// `serde_json` only writes UTF-8.
fn utf8(b: Vec<u8>) -> String {
    String::from_utf8(b).expect("serde_json writes utf-8")
}

/// Append `v`'s compact JSON to `out`.
fn ser<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, v: &T) {
    serde_json::to_writer(out, v).expect("serializing json cannot fail")
}
/// The text of each put in `ops`, serialized on the caller's thread: the writer thread
/// is the one place every commit waits on, so it only splices in the revision.
/// Values of sealed types are encrypted here too, with `sealer`'s first key, bound to
/// what `binding` says for the op at that index (etcd: the key's version after the
/// write; `None`: the store key only). `TooLarge` when a text is over
/// [`MAX_VALUE_BYTES`].
pub(crate) fn prepare(
    ops: &[Op],
    sealer: &Sealer,
    binding: impl Fn(usize) -> Option<Binding>,
) -> Result<Vec<Option<Prepared>>, KvError> {
    ops.iter()
        .enumerate()
        .map(|(i, op)| match &op.action {
            Action::Put(v) => {
                let mut p = Prepared::new(v);
                if is_sealed(&op.key) {
                    let b = binding(i);
                    p.sealed = Some(sealer.seal(&op.key, b.as_ref(), p.text.as_bytes()));
                }
                let size = p.stored().len();
                if size > MAX_VALUE_BYTES {
                    return Err(KvError::TooLarge {
                        key: op.key.clone(),
                        size,
                        limit: MAX_VALUE_BYTES,
                    });
                }
                Ok(Some(p))
            }
            Action::Delete => Ok(None),
        })
        .collect()
}

/// Objects (JSON maps with a `metadata` map) carry their `mod_rev` as
/// `metadata.resourceVersion`, set here at commit like kube's etcd3 versioner.
pub(crate) fn stamp(v: &mut Value, rev: Rev) {
    if let Some(Value::Object(meta)) = v.get_mut("metadata") {
        meta.insert("resourceVersion".into(), Value::String(rev.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn prepared_text_is_the_stamped_value_serialized() {
        let cases = [
            json!({"metadata": {"name": "x"}, "spec": {"a": [1, 2.5, "t\"q\\"], "b": null}}),
            json!({"kind": "K", "metadata": {"resourceVersion": "7", "name": "x"}, "z": {}}),
            json!({"metadata": {}, "status": {"phase": "Bound"}}),
            json!({"m\u{e9}ta\n": 1, "metadata": {"labels": {"a\"b": "\u{1f600}"}}}),
            json!({"metadata": "not a map", "n": 1}),
            json!({"no": "metadata"}),
            json!([1, {"metadata": {}}]),
            json!("text"),
            json!({}),
        ];
        for v in cases {
            let p = Prepared::new(&v);
            for rev in [1, 42, u64::MAX] {
                let mut stamped = v.clone();
                stamp(&mut stamped, rev);
                assert_eq!(&*p.stamped(rev), stamped.to_string(), "{v}");
                let back: Value = serde_json::from_str(&p.stamped(rev)).unwrap();
                assert_eq!(back, stamped);
            }
        }
    }
}
