//! Bounded decoding of JSON and YAML documents from outside: REST API request bodies,
//! the CLI's `apply -f` manifests, and the Butane/YAML text of Ignition secrets and
//! templates. It sits below every layer that reads such text (it imports nothing of
//! the crate).
//!
//! Parsers are not trusted with hostile input: libyaml (under `serde_norway`) spends
//! time quadratic in the nesting depth of flow collections (100,000 levels, a 200 KB
//! body, took 21 s; 2 M levels, minutes), and expands every alias into a copy of its
//! anchor (a 400 KB body of aliases to a 1 MB string grew the process by 470 MB). So
//! each format's nesting (and YAML's aliases) is bounded:
//!
//! - JSON: serde_json refuses more than 128 levels itself, in linear time, so the
//!   document is parsed and then its value checked against [`MAX_DEPTH`] (no second
//!   pass over the bytes on the common path). A refused document is scanned once more
//!   (counting `[`/`{` outside strings) to name the line and column where it goes too
//!   deep.
//! - YAML: libyaml's own event stream (the same lexer `serde_norway` uses, so the two
//!   cannot disagree about structure), without building anything. Nesting is refused as
//!   soon as it passes [`MAX_DEPTH`], which libyaml reaches after reading a bounded
//!   prefix (it looks at most 1024 characters ahead); every node's size is summed, an
//!   alias counting as the size and depth of the node it names (aliases inside anchors
//!   included, so "billion laughs" nesting is counted in full), and the aliases of a
//!   stream may not add more than [`Limits::max_alias_bytes`] to it.
//!
//! Only a YAML document that passes is decoded (with `serde_norway`), so the
//! amplification is never allocated. The scans are linear; the REST API runs large
//! bodies on a blocking thread (see `api::bodies::decode_body`).

use std::ffi::CStr;
use std::mem::MaybeUninit;

use serde::Deserialize;
use serde_json::Value;
use unsafe_libyaml_norway as unsafe_libyaml;

/// The deepest nesting accepted (a top-level mapping is depth 1). Kubernetes objects
/// stay near 10; serde_json's own limit is 128.
pub(crate) const MAX_DEPTH: usize = 64;

/// What a document may cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Deepest nesting of sequences and mappings (through aliases too).
    pub max_depth: usize,
    /// Most bytes aliases may add to a YAML document when expanded (each alias costs
    /// the scalar bytes and nodes of what it names).
    pub max_alias_bytes: usize,
}

impl Limits {
    /// [`MAX_DEPTH`], and aliases adding at most `max_alias_bytes`.
    pub fn new(max_alias_bytes: usize) -> Limits {
        Limits {
            max_depth: MAX_DEPTH,
            max_alias_bytes,
        }
    }
}

/// A body's syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Yaml,
}

impl Format {
    fn name(self) -> &'static str {
        match self {
            Format::Json => "JSON",
            Format::Yaml => "YAML",
        }
    }
}

/// Why a document was refused. `AliasExpansion` is a size problem (HTTP 413); the
/// others are malformed input (400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("request body is not valid UTF-8")]
    NotUtf8,
    #[error("request body is empty")]
    Empty,
    #[error(
        "malformed {format}: nesting deeper than {limit} levels at line {line} column {column}"
    )]
    TooDeep {
        format: &'static str,
        limit: usize,
        line: usize,
        column: usize,
    },
    #[error("malformed YAML: aliases expand the document by more than {limit} bytes (line {line} column {column})")]
    AliasExpansion {
        limit: usize,
        line: usize,
        column: usize,
    },
    #[error("malformed {format}: {message}")]
    Syntax {
        format: &'static str,
        message: String,
    },
    #[error("request body must be an object")]
    NotObject,
}

/// Decode one document, which must be a mapping.
pub fn decode(format: Format, body: &[u8], limits: Limits) -> Result<Value, DecodeError> {
    let v = decode_value(format, body, limits)?;
    if !v.is_object() {
        return Err(DecodeError::NotObject);
    }
    Ok(v)
}

/// [`decode`] of a document of any shape (a JSON patch is a list).
pub fn decode_value(format: Format, body: &[u8], limits: Limits) -> Result<Value, DecodeError> {
    let text = std::str::from_utf8(body).map_err(|_| DecodeError::NotUtf8)?;
    if text.trim().is_empty() {
        return Err(DecodeError::Empty);
    }
    let v: Value = match format {
        // serde_json bounds nesting itself (128 levels), so the document is parsed
        // first and its depth checked on the value, which is cheaper than a second
        // pass over the bytes; only a refused document is scanned, for the position.
        Format::Json => match serde_json::from_str::<Value>(text) {
            Ok(v) if !deeper_than(&v, limits.max_depth) => v,
            Ok(_) => {
                scan_json(text.as_bytes(), limits.max_depth)?;
                // Not reached: on valid JSON the scan counts the value's nesting.
                return Err(DecodeError::TooDeep {
                    format: format.name(),
                    limit: limits.max_depth,
                    line: 0,
                    column: 0,
                });
            }
            Err(e) => {
                scan_json(text.as_bytes(), limits.max_depth)?;
                return Err(syntax(format, e));
            }
        },
        Format::Yaml => {
            scan_yaml(text, limits)?;
            serde_norway::from_str(text).map_err(|e| syntax(format, e))?
        }
    };
    Ok(v)
}

/// Every document of a YAML stream (JSON is YAML), empty documents skipped.
pub fn decode_yaml_documents(text: &str, limits: Limits) -> Result<Vec<Value>, DecodeError> {
    scan_yaml(text, limits)?;
    let mut docs = Vec::new();
    for d in serde_norway::Deserializer::from_str(text) {
        let v = Value::deserialize(d).map_err(|e| syntax(Format::Yaml, e))?;
        if !v.is_null() {
            docs.push(v);
        }
    }
    Ok(docs)
}

fn syntax(format: Format, e: impl std::fmt::Display) -> DecodeError {
    DecodeError::Syntax {
        format: format.name(),
        message: e.to_string(),
    }
}

/// Whether `v` holds a sequence or mapping nested more than `limit` levels deep.
fn deeper_than(v: &Value, limit: usize) -> bool {
    match v {
        Value::Array(a) => limit == 0 || a.iter().any(|x| deeper_than(x, limit - 1)),
        Value::Object(o) => limit == 0 || o.values().any(|x| deeper_than(x, limit - 1)),
        _ => false,
    }
}

/// Refuse JSON nested deeper than `max_depth` (one pass, strings skipped; anything
/// else is left to the parser).
pub(crate) fn scan_json(b: &[u8], max_depth: usize) -> Result<(), DecodeError> {
    let (mut depth, mut in_str, mut esc) = (0usize, false, false);
    let (mut line, mut line_start) = (1usize, 0usize);
    for (i, &c) in b.iter().enumerate() {
        if in_str {
            match c {
                _ if esc => esc = false,
                b'\\' => esc = true,
                b'"' => in_str = false,
                _ => {}
            }
            continue;
        }
        match c {
            b'"' => in_str = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max_depth {
                    return Err(DecodeError::TooDeep {
                        format: "JSON",
                        limit: max_depth,
                        line,
                        column: i - line_start + 1,
                    });
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            b'\n' => {
                line += 1;
                line_start = i + 1;
            }
            _ => {}
        }
    }
    Ok(())
}

/// One event of libyaml's stream, as much of it as the scan needs.
#[derive(Debug, PartialEq, Eq)]
enum Ev {
    DocumentStart,
    StreamEnd,
    /// Scalar: its anchor and length in bytes.
    Scalar(Option<Vec<u8>>, usize),
    /// Sequence or mapping start, with its anchor.
    Start(Option<Vec<u8>>),
    End,
    Alias(Vec<u8>),
    Other,
}

/// libyaml's event parser over a string it borrows.
struct Events<'a> {
    /// Boxed: libyaml keeps a pointer to the parser in it (`read_handler_data`), so
    /// it must not move once the input is set.
    parser: Box<MaybeUninit<unsafe_libyaml::yaml_parser_t>>,
    _input: std::marker::PhantomData<&'a [u8]>,
}

impl<'a> Events<'a> {
    fn new(input: &'a str) -> Events<'a> {
        let mut parser = Box::new(MaybeUninit::<unsafe_libyaml::yaml_parser_t>::uninit());
        let p = parser.as_mut_ptr();
        // SAFETY: `yaml_parser_initialize` initializes the whole struct (it zeroes it
        // before filling it in); the box is never moved out of, so the self-pointer
        // that `set_input_string` stores stays valid, and `input` outlives the parser
        // (`'a`). libyaml only reads the input.
        unsafe {
            if unsafe_libyaml::yaml_parser_initialize(p).fail {
                panic!("libyaml could not allocate its parser");
            }
            unsafe_libyaml::yaml_parser_set_encoding(p, unsafe_libyaml::YAML_UTF8_ENCODING);
            unsafe_libyaml::yaml_parser_set_input_string(p, input.as_ptr(), input.len() as u64);
        }
        Events {
            parser,
            _input: std::marker::PhantomData,
        }
    }

    /// The next event and the (1-based) line and column it starts at.
    fn next(&mut self) -> Result<(Ev, usize, usize), DecodeError> {
        let p = self.parser.as_mut_ptr();
        let mut event = MaybeUninit::<unsafe_libyaml::yaml_event_t>::uninit();
        // SAFETY: the parser was initialized in `new`. `yaml_parser_parse` fills
        // `event` when it succeeds; only then is it read, through the union member
        // that its `type_` names, and deleted once (which frees what libyaml
        // allocated for it). Anchor pointers are NUL-terminated strings libyaml owns
        // until the delete; they are copied before it.
        unsafe {
            if (&*p).error != unsafe_libyaml::YAML_NO_ERROR
                || unsafe_libyaml::yaml_parser_parse(p, event.as_mut_ptr()).fail
            {
                return Err(self.error());
            }
            let e = &*event.as_ptr();
            let anchor =
                |a: *mut u8| (!a.is_null()).then(|| CStr::from_ptr(a.cast()).to_bytes().to_vec());
            let ev = match e.type_ {
                unsafe_libyaml::YAML_DOCUMENT_START_EVENT => Ev::DocumentStart,
                unsafe_libyaml::YAML_STREAM_END_EVENT => Ev::StreamEnd,
                unsafe_libyaml::YAML_SCALAR_EVENT => {
                    Ev::Scalar(anchor(e.data.scalar.anchor), e.data.scalar.length as usize)
                }
                unsafe_libyaml::YAML_SEQUENCE_START_EVENT => {
                    Ev::Start(anchor(e.data.sequence_start.anchor))
                }
                unsafe_libyaml::YAML_MAPPING_START_EVENT => {
                    Ev::Start(anchor(e.data.mapping_start.anchor))
                }
                unsafe_libyaml::YAML_SEQUENCE_END_EVENT
                | unsafe_libyaml::YAML_MAPPING_END_EVENT => Ev::End,
                unsafe_libyaml::YAML_ALIAS_EVENT => {
                    Ev::Alias(anchor(e.data.alias.anchor).unwrap_or_default())
                }
                _ => Ev::Other,
            };
            let (line, column) = (
                e.start_mark.line as usize + 1,
                e.start_mark.column as usize + 1,
            );
            unsafe_libyaml::yaml_event_delete(event.as_mut_ptr());
            Ok((ev, line, column))
        }
    }

    /// libyaml's description of the error it stopped at.
    fn error(&self) -> DecodeError {
        let p = self.parser.as_ptr();
        // SAFETY: the parser is initialized; `problem` and `context` are null or
        // static NUL-terminated strings.
        let (problem, context, mark) = unsafe {
            let text = |s: *const std::ffi::c_char| {
                (!s.is_null()).then(|| CStr::from_ptr(s).to_string_lossy().into_owned())
            };
            let parser = &*p;
            (
                text(parser.problem),
                text(parser.context),
                parser.problem_mark,
            )
        };
        let mut message = problem.unwrap_or_else(|| "unknown error".into());
        message.push_str(&format!(
            " at line {} column {}",
            mark.line + 1,
            mark.column + 1
        ));
        if let Some(c) = context {
            message.push_str(&format!(", {c}"));
        }
        DecodeError::Syntax {
            format: "YAML",
            message,
        }
    }
}

impl Drop for Events<'_> {
    fn drop(&mut self) {
        // SAFETY: initialized in `new`, deleted once here.
        unsafe { unsafe_libyaml::yaml_parser_delete(self.parser.as_mut_ptr()) }
    }
}

/// What a node costs when expanded: bytes (scalar bytes + 2 per node) and height
/// (levels of collections it holds, itself included).
#[derive(Debug, Clone, Copy, Default)]
struct Cost {
    bytes: usize,
    height: usize,
}

/// Check a YAML stream's nesting and alias expansion (see the module doc) without
/// building it.
pub fn scan_yaml(text: &str, limits: Limits) -> Result<(), DecodeError> {
    let mut events = Events::new(text);
    // Open collections: their anchor and the cost of what they hold so far.
    let mut open: Vec<(Option<Vec<u8>>, Cost)> = Vec::new();
    let mut anchors: std::collections::HashMap<Vec<u8>, Cost> = Default::default();
    let mut alias_bytes = 0usize;
    loop {
        let (ev, line, column) = events.next()?;
        let too_deep = || DecodeError::TooDeep {
            format: "YAML",
            limit: limits.max_depth,
            line,
            column,
        };
        // The finished node this event makes, if any: (anchor, cost).
        let done = match ev {
            Ev::StreamEnd => return Ok(()),
            // Anchors are per document; the alias budget is the whole stream's.
            Ev::DocumentStart => {
                anchors.clear();
                None
            }
            Ev::Other => None,
            Ev::Start(anchor) => {
                if open.len() >= limits.max_depth {
                    return Err(too_deep());
                }
                open.push((anchor, Cost::default()));
                None
            }
            Ev::End => open.pop().map(|(a, c)| {
                (
                    a,
                    Cost {
                        bytes: c.bytes + 2,
                        height: c.height + 1,
                    },
                )
            }),
            Ev::Scalar(anchor, len) => Some((
                anchor,
                Cost {
                    bytes: len + 2,
                    height: 0,
                },
            )),
            Ev::Alias(name) => {
                // An unknown anchor is libyaml's to report (serde_norway refuses it).
                let c = anchors.get(&name).copied().unwrap_or_default();
                if open.len() + c.height > limits.max_depth {
                    return Err(too_deep());
                }
                alias_bytes = alias_bytes.saturating_add(c.bytes);
                if alias_bytes > limits.max_alias_bytes {
                    return Err(DecodeError::AliasExpansion {
                        limit: limits.max_alias_bytes,
                        line,
                        column,
                    });
                }
                Some((None, c))
            }
        };
        if let Some((anchor, cost)) = done {
            if let Some(a) = anchor {
                anchors.insert(a, cost);
            }
            if let Some((_, parent)) = open.last_mut() {
                parent.bytes = parent.bytes.saturating_add(cost.bytes);
                parent.height = parent.height.max(cost.height);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    const L: Limits = Limits {
        max_depth: MAX_DEPTH,
        max_alias_bytes: 1 << 20,
    };

    fn nested(open: &str, close: &str, n: usize) -> String {
        let mut s = open.repeat(n);
        s.push_str(&close.repeat(n));
        s
    }

    #[test]
    fn json_depth_is_counted_outside_strings() {
        assert!(scan_json(nested("[", "]", 64).as_bytes(), 64).is_ok());
        let e = scan_json(nested("[", "]", 65).as_bytes(), 64).unwrap_err();
        assert!(matches!(e, DecodeError::TooDeep { column: 65, .. }), "{e}");
        let s = format!("{{\"a\": \"{}\\\"{}\"}}", "[".repeat(100), "{".repeat(100));
        assert!(scan_json(s.as_bytes(), 2).is_ok(), "brackets in strings");
        let e = scan_json(b"{\"a\":\n [[[1]]]}", 3).unwrap_err();
        assert_eq!(
            e.to_string(),
            "malformed JSON: nesting deeper than 3 levels at line 2 column 4"
        );
        // Closing brackets in strings do not hide depth.
        let s = format!("[{}]", "\"]]]\",[".repeat(100));
        assert!(scan_json(s.as_bytes(), 64).is_err());
        // `decode` checks the parsed value, and names the position when it refuses,
        // past serde_json's own limit (128) too.
        let wrap = |n| format!("{{\"a\": {}}}", nested("[", "]", n));
        assert!(decode(Format::Json, wrap(63).as_bytes(), L).is_ok());
        for n in [64, 127, 200, 100_000] {
            let e = decode(Format::Json, wrap(n).as_bytes(), L).unwrap_err();
            assert_eq!(
                e,
                DecodeError::TooDeep {
                    format: "JSON",
                    limit: 64,
                    line: 1,
                    column: 70
                },
                "{n} levels"
            );
        }
    }

    #[test]
    fn yaml_depth_is_bounded_in_flow_and_block_styles() {
        assert!(scan_yaml(&nested("[", "]", 64), L).is_ok());
        for deep in [
            nested("[", "]", 65),
            nested("{a: ", "}", 65),
            "- ".repeat(65) + "x\n",
            (0..65)
                .map(|i| format!("{}k:\n", " ".repeat(i)))
                .collect::<String>()
                + &" ".repeat(65)
                + "v\n",
        ] {
            let e = scan_yaml(&deep, L).unwrap_err();
            assert!(matches!(e, DecodeError::TooDeep { limit: 64, .. }), "{e}");
        }
        // Brackets inside quoted and block scalars are text.
        let ok = format!("a: \"{0}\"\nb: '{0}'\nc: |\n  {0}\n", "[".repeat(200));
        assert!(scan_yaml(&ok, L).is_ok());
        let e = scan_yaml("a: [1, 2\n", L).unwrap_err();
        assert!(e.to_string().starts_with("malformed YAML: "), "{e}");
    }

    #[test]
    fn millions_of_levels_are_refused_in_milliseconds() {
        for (head, open, close) in [
            ("", "[", "]"),
            ("", "{", "}"),
            ("", "- ", ""),
            ("a: ", "[", ""),
            ("", "{a: ", "}"),
            ("", "{a: ", ""),
            ("a:\n", "- ", ""),
        ] {
            let s = format!("{head}{}", nested(open, close, 2_000_000));
            let t = Instant::now();
            assert!(matches!(scan_yaml(&s, L), Err(DecodeError::TooDeep { .. })));
            assert!(matches!(
                decode(Format::Yaml, s.as_bytes(), L),
                Err(DecodeError::TooDeep { .. })
            ));
            assert!(matches!(
                decode(Format::Json, s.as_bytes(), L),
                Err(DecodeError::TooDeep { .. } | DecodeError::Syntax { .. })
            ));
            let took = t.elapsed();
            assert!(took < Duration::from_secs(1), "{open}: {took:?}");
        }
    }

    #[test]
    fn alias_expansion_is_bounded() {
        // Aliases to a big scalar.
        let mut s = format!("a: &a \"{}\"\nb: [", "x".repeat(100_000));
        s.push_str(&["*a"; 11].join(","));
        s.push_str("]\n");
        let e = scan_yaml(&s, L).unwrap_err();
        assert!(
            matches!(e, DecodeError::AliasExpansion { limit, .. } if limit == 1 << 20),
            "{e}"
        );
        assert!(e.to_string().contains("aliases"), "{e}");
        // Billion laughs: each level doubles, counted through the anchors.
        let mut s = String::from("l0: &l0 [x, x]\n");
        for i in 1..40 {
            s.push_str(&format!("l{i}: &l{i} [*l{}, *l{}]\n", i - 1, i - 1));
        }
        let t = Instant::now();
        assert!(matches!(
            decode(Format::Yaml, s.as_bytes(), L),
            Err(DecodeError::AliasExpansion { .. })
        ));
        assert!(t.elapsed() < Duration::from_secs(1));
        // Depth through an alias counts.
        let deep = format!(
            "a: &a {}\nb: {}*a{}\n",
            nested("[", "]", 40),
            "[".repeat(30),
            "]".repeat(30)
        );
        assert!(matches!(
            scan_yaml(&deep, L),
            Err(DecodeError::TooDeep { .. })
        ));
        // A few small aliases are fine, and decode as copies.
        let v = decode(
            Format::Yaml,
            b"labels: &l {rack: r1}\nannotations: *l\nx: *l\n",
            L,
        )
        .unwrap();
        assert_eq!(v["annotations"]["rack"], "r1");
        assert_eq!(v["x"], v["labels"]);
        // Anchors are per document.
        let docs = decode_yaml_documents("a: &a [1]\n---\nb: &a [2]\nc: *a\n", L).unwrap();
        assert_eq!(docs[1]["c"], serde_json::json!([2]));
    }

    #[test]
    fn decode_refuses_what_is_not_an_object() {
        assert_eq!(decode(Format::Json, b"  \n", L), Err(DecodeError::Empty));
        assert_eq!(decode(Format::Json, b"[1]", L), Err(DecodeError::NotObject));
        assert_eq!(
            decode(Format::Yaml, b"- 1\n", L),
            Err(DecodeError::NotObject)
        );
        assert_eq!(
            decode(Format::Json, &[0xff, b'{'], L),
            Err(DecodeError::NotUtf8)
        );
        let e = decode(Format::Json, b"a: b\n", L).unwrap_err();
        assert!(e.to_string().starts_with("malformed JSON: "), "{e}");
        let v = decode(Format::Yaml, b"a: {b: [1, \"2\"]}\n", L).unwrap();
        assert_eq!(v, serde_json::json!({"a": {"b": [1, "2"]}}));
        let docs = decode_yaml_documents("---\na: 1\n---\n---\n{\"b\": 2}\n", L).unwrap();
        assert_eq!(
            docs,
            vec![serde_json::json!({"a": 1}), serde_json::json!({"b": 2})]
        );
    }
}
