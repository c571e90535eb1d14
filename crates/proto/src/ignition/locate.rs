//! Field path → line/column index of a YAML document, for error messages only.
//!
//! serde gives us typed structs but forgets where each field was; yaml-rust2's event
//! parser reports a marker for every key and value. This is only run when there is an
//! error to report, so the happy path pays nothing for it.

use std::collections::HashMap;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;

enum Frame {
    Map {
        key: Option<String>,
        expecting_key: bool,
    },
    Seq {
        index: usize,
    },
}

struct Indexer {
    stack: Vec<Frame>,
    segs: Vec<String>,
    out: HashMap<String, (usize, usize)>,
    done: bool,
}

impl Indexer {
    fn path_with(&self, last: &str) -> String {
        let mut p = String::new();
        for s in self
            .segs
            .iter()
            .map(String::as_str)
            .chain(std::iter::once(last))
        {
            if !s.starts_with('[') && !p.is_empty() {
                p.push('.');
            }
            p.push_str(s);
        }
        p
    }

    /// A value (scalar, alias, or start of a collection) begins at `mark`. Returns the
    /// segment it lives under, or None when it was a mapping key.
    fn begin_value(&mut self, ev: &Event, mark: Marker) -> Option<String> {
        let pos = (mark.line(), mark.col() + 1);
        match self.stack.last_mut() {
            Some(Frame::Map { key, expecting_key }) if *expecting_key => {
                let k = match ev {
                    Event::Scalar(s, ..) => s.clone(),
                    _ => "?".to_string(),
                };
                *key = Some(k.clone());
                *expecting_key = false;
                let p = self.path_with(&k);
                self.out.entry(p).or_insert(pos);
                None
            }
            Some(Frame::Map { key, .. }) => Some(key.clone().unwrap_or_default()),
            Some(Frame::Seq { index }) => {
                let seg = format!("[{index}]");
                let p = self.path_with(&seg);
                self.out.entry(p).or_insert(pos);
                Some(seg)
            }
            None => Some(String::new()),
        }
    }

    fn end_value(&mut self) {
        match self.stack.last_mut() {
            Some(Frame::Map { expecting_key, .. }) => *expecting_key = true,
            Some(Frame::Seq { index }) => *index += 1,
            None => self.done = true,
        }
    }
}

impl MarkedEventReceiver for Indexer {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        if self.done {
            return;
        }
        match &ev {
            Event::Scalar(..) | Event::Alias(..) if self.begin_value(&ev, mark).is_some() => {
                self.end_value();
            }
            Event::MappingStart(..) | Event::SequenceStart(..) => {
                let seg = self
                    .begin_value(&ev, mark)
                    .unwrap_or_else(|| "?".to_string());
                self.segs.push(seg);
                self.stack.push(if matches!(ev, Event::MappingStart(..)) {
                    Frame::Map {
                        key: None,
                        expecting_key: true,
                    }
                } else {
                    Frame::Seq { index: 0 }
                });
            }
            Event::MappingEnd | Event::SequenceEnd => {
                self.stack.pop();
                self.segs.pop();
                self.end_value();
            }
            _ => {}
        }
    }
}

/// Line/column (1-based) of every key and sequence item of the first document in `src`,
/// keyed by path (`storage.files[0].path`). Unparseable documents give a partial index.
pub(crate) fn index(src: &str) -> HashMap<String, (usize, usize)> {
    let mut ix = Indexer {
        stack: Vec::new(),
        segs: Vec::new(),
        out: HashMap::new(),
        done: false,
    };
    let mut parser = Parser::new_from_str(src);
    let _ = parser.load(&mut ix, false);
    ix.out
}

/// Fills in the line of each issue from `src`, using the longest indexed prefix of its path.
pub(crate) fn annotate(src: &str, issues: &mut [super::Issue]) {
    if issues.iter().all(|i| i.line.is_some()) {
        return;
    }
    let ix = index(src);
    for i in issues.iter_mut().filter(|i| i.line.is_none()) {
        let mut p = i.path.as_str();
        loop {
            if let Some(pos) = ix.get(p) {
                i.line = Some(*pos);
                break;
            }
            match p.rfind(['.', '[']) {
                Some(n) => p = &p[..n],
                None => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexes_keys_and_items() {
        let y =
            "variant: fcos\nstorage:\n  files:\n    - path: /a\n      mode: 0644\n    - path: b\n";
        let ix = index(y);
        assert_eq!(ix.get("variant"), Some(&(1, 1)));
        assert_eq!(ix.get("storage.files"), Some(&(3, 3)));
        assert_eq!(ix.get("storage.files[0].mode"), Some(&(5, 7)));
        assert_eq!(ix.get("storage.files[1].path"), Some(&(6, 7)));
    }

    #[test]
    fn broken_yaml_is_partial_not_panic() {
        let ix = index("a: [\n  b: {");
        assert_eq!(ix.get("a"), Some(&(1, 1)));
    }
}
