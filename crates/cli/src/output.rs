//! `get`'s kubectl output forms: `-o name`, `-o jsonpath=TEMPLATE`,
//! `-o custom-columns=HEADER:PATH,...`, `--sort-by=PATH`, `--show-labels`,
//! `--no-headers`.
//!
//! The JSONPath here is kubectl's template dialect (not RFC 9535, which the
//! JSONPath crates implement): text between `{...}` expressions is printed as is,
//! `{range EXPR}...{end}` iterates, `{"\n"}` is a literal, and an expression is a path
//! of `.field`, `['field']`, `[N]` (negative from the end), `[*]`, `.*` and
//! `[?(@.path==VALUE)]` (`==`, `!=`), from `@`/the current object or `$`/the root.
//! Missing fields print nothing, as `kubectl get` does. Templates are bounded (length,
//! `range` nesting).

use std::cmp::Ordering;

use anyhow::{bail, Result};
use serde_json::Value;

use super::table::text;

/// Longest template accepted (bytes).
const MAX_TEMPLATE: usize = 4096;
/// Deepest `{range}` nesting accepted.
const MAX_DEPTH: usize = 8;

/// One step of a path.
#[derive(Debug, Clone, PartialEq)]
enum Step {
    Field(String),
    Index(i64),
    Wildcard,
    Filter {
        path: Vec<Step>,
        negate: bool,
        want: Value,
    },
}

/// A path: from the root (`$`) or the current object.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Path {
    root: bool,
    steps: Vec<Step>,
}

#[derive(Debug, Clone, PartialEq)]
enum Node {
    Text(String),
    Expr(Path),
    Range(Path, Vec<Node>),
}

/// A parsed `-o jsonpath=` template.
#[derive(Debug, Clone, PartialEq)]
pub struct Template(Vec<Node>);

impl Template {
    /// Parse a kubectl JSONPath template (`{.items[*].metadata.name}`, `{range
    /// .items[*]}{.metadata.name}{"\n"}{end}`). A template without `{` is taken as one
    /// expression, as kubectl's `--sort-by` and custom columns take theirs.
    pub fn parse(t: &str) -> Result<Template> {
        if t.len() > MAX_TEMPLATE {
            bail!("jsonpath template is longer than {MAX_TEMPLATE} bytes");
        }
        let mut toks = Vec::new();
        let mut rest = t;
        if !t.contains('{') {
            toks.push(Tok::Expr(t.trim().to_string()));
            rest = "";
        }
        while !rest.is_empty() {
            match rest.find('{') {
                None => {
                    toks.push(Tok::Text(rest.to_string()));
                    break;
                }
                Some(i) => {
                    if i > 0 {
                        toks.push(Tok::Text(rest[..i].to_string()));
                    }
                    let body = &rest[i + 1..];
                    let end = close_brace(body).ok_or_else(|| {
                        anyhow::anyhow!("jsonpath template: unclosed '{{' at byte {i} of {t:?}")
                    })?;
                    toks.push(Tok::Expr(body[..end].trim().to_string()));
                    rest = &body[end + 1..];
                }
            }
        }
        let mut it = toks.into_iter();
        let nodes = build(&mut it, 0)?;
        Ok(Template(nodes))
    }

    /// Render against `v` (the object, or the List `get` returned).
    pub fn render(&self, v: &Value) -> String {
        let mut out = String::new();
        render_nodes(&self.0, v, v, &mut out);
        out
    }

    /// Every value the template's single expression selects (for `--sort-by` and
    /// custom columns, whose templates are one expression).
    pub fn select<'a>(&self, v: &'a Value) -> Vec<&'a Value> {
        let mut all = Vec::new();
        for n in &self.0 {
            if let Node::Expr(p) = n {
                all.extend(eval(p, v, v));
            }
        }
        all
    }
}

enum Tok {
    Text(String),
    Expr(String),
}

/// The index of the `}` closing an expression, skipping quoted strings.
fn close_brace(s: &str) -> Option<usize> {
    let mut quote: Option<char> = None;
    let mut esc = false;
    for (i, c) in s.char_indices() {
        if esc {
            esc = false;
            continue;
        }
        match (quote, c) {
            (Some(_), '\\') => esc = true,
            (Some(q), c) if c == q => quote = None,
            (None, '"' | '\'') => quote = Some(c),
            (None, '}') => return Some(i),
            _ => {}
        }
    }
    None
}

fn build(it: &mut impl Iterator<Item = Tok>, depth: usize) -> Result<Vec<Node>> {
    let mut nodes = Vec::new();
    while let Some(t) = it.next() {
        match t {
            Tok::Text(s) => nodes.push(Node::Text(s)),
            Tok::Expr(e) if e == "end" => {
                if depth == 0 {
                    bail!("jsonpath template: {{end}} without {{range}}");
                }
                return Ok(nodes);
            }
            Tok::Expr(e) => {
                if let Some(p) = e.strip_prefix("range ") {
                    if depth + 1 > MAX_DEPTH {
                        bail!("jsonpath template: range nested deeper than {MAX_DEPTH}");
                    }
                    let path = parse_path(p.trim())?;
                    let body = build(it, depth + 1)?;
                    nodes.push(Node::Range(path, body));
                } else if let Some(lit) = literal(&e)? {
                    nodes.push(Node::Text(lit));
                } else {
                    nodes.push(Node::Expr(parse_path(&e)?));
                }
            }
        }
    }
    if depth > 0 {
        bail!("jsonpath template: {{range}} without {{end}}");
    }
    Ok(nodes)
}

/// A quoted literal (`"\n"`, `'\t'`), unescaped.
fn literal(e: &str) -> Result<Option<String>> {
    let q = match e.chars().next() {
        Some(q @ ('"' | '\'')) => q,
        _ => return Ok(None),
    };
    if e.len() < 2 || !e.ends_with(q) {
        bail!("jsonpath template: unterminated string {e:?}");
    }
    Ok(Some(unescape(&e[1..e.len() - 1])))
}

fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some(o) => out.push(o),
            None => out.push('\\'),
        }
    }
    out
}

/// Parse one path expression (`.a.b[0]`, `$.items[*]`, `@`, `.a['b.c']`).
pub(crate) fn parse_path(e: &str) -> Result<Path> {
    let bad = |why: &str| anyhow::anyhow!("jsonpath expression {e:?}: {why}");
    let mut s = e.trim();
    let mut root = false;
    if let Some(r) = s.strip_prefix('$') {
        root = true;
        s = r;
    } else if let Some(r) = s.strip_prefix('@') {
        s = r;
    }
    let mut steps = Vec::new();
    while !s.is_empty() {
        if let Some(r) = s.strip_prefix('.') {
            if r.starts_with('.') {
                return Err(bad("recursive descent (..) is not supported"));
            }
            if let Some(r) = r.strip_prefix('*') {
                steps.push(Step::Wildcard);
                s = r;
                continue;
            }
            let end = r.find(['.', '[']).unwrap_or(r.len());
            let name = &r[..end];
            if name.is_empty() {
                if r.is_empty() {
                    break; // a trailing `.`, as `{.}`
                }
            } else {
                if !name
                    .chars()
                    .all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '/'))
                {
                    return Err(bad(&format!("bad field name {name:?}")));
                }
                steps.push(Step::Field(name.to_string()));
            }
            s = &r[end..];
        } else if let Some(r) = s.strip_prefix('[') {
            let end = close_bracket(r).ok_or_else(|| bad("unclosed '['"))?;
            let inner = r[..end].trim();
            s = &r[end + 1..];
            if inner == "*" {
                steps.push(Step::Wildcard);
            } else if let Some(f) = inner.strip_prefix("?(").and_then(|f| f.strip_suffix(')')) {
                let (lhs, negate, rhs) = if let Some((l, r)) = f.split_once("!=") {
                    (l, true, r)
                } else if let Some((l, r)) = f.split_once("==") {
                    (l, false, r)
                } else {
                    return Err(bad("a filter needs == or !="));
                };
                let lhs = lhs.trim();
                if !lhs.starts_with('@') {
                    return Err(bad("a filter's left side starts with @"));
                }
                let rhs = rhs.trim();
                let want = match literal(rhs)? {
                    Some(s) => Value::String(s),
                    None => serde_json::from_str(rhs)
                        .map_err(|_| bad(&format!("bad filter value {rhs:?}")))?,
                };
                let path = parse_path(lhs)?.steps;
                steps.push(Step::Filter { path, negate, want });
            } else if let Some(name) = literal(inner)? {
                steps.push(Step::Field(name));
            } else {
                let n: i64 = inner
                    .parse()
                    .map_err(|_| bad(&format!("bad index [{inner}]")))?;
                steps.push(Step::Index(n));
            }
        } else {
            return Err(bad(&format!("unexpected {:?}", s.chars().next().unwrap())));
        }
    }
    Ok(Path { root, steps })
}

fn close_bracket(s: &str) -> Option<usize> {
    let mut quote: Option<char> = None;
    let mut depth = 0usize;
    for (i, c) in s.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '(' | '[') => depth += 1,
            (None, ')') => depth = depth.saturating_sub(1),
            (None, ']') if depth == 0 => return Some(i),
            (None, ']') => depth -= 1,
            _ => {}
        }
    }
    None
}

fn eval<'a>(p: &Path, root: &'a Value, cur: &'a Value) -> Vec<&'a Value> {
    let start = if p.root { root } else { cur };
    eval_steps(&p.steps, start)
}

fn eval_steps<'a>(steps: &[Step], start: &'a Value) -> Vec<&'a Value> {
    let mut vals = vec![start];
    for st in steps {
        let mut next = Vec::new();
        for v in vals {
            match st {
                Step::Field(f) => next.extend(v.get(f.as_str())),
                Step::Index(i) => {
                    if let Some(a) = v.as_array() {
                        let idx = if *i < 0 { a.len() as i64 + i } else { *i };
                        if idx >= 0 {
                            next.extend(a.get(idx as usize));
                        }
                    }
                }
                Step::Wildcard => match v {
                    Value::Array(a) => next.extend(a.iter()),
                    Value::Object(m) => next.extend(m.values()),
                    _ => {}
                },
                Step::Filter { path, negate, want } => {
                    if let Some(a) = v.as_array() {
                        next.extend(a.iter().filter(|e| {
                            let got = eval_steps(path, e);
                            let hit = got.first().is_some_and(|g| *g == want);
                            hit != *negate
                        }));
                    }
                }
            }
        }
        vals = next;
    }
    vals
}

fn render_nodes(nodes: &[Node], root: &Value, cur: &Value, out: &mut String) {
    for n in nodes {
        match n {
            Node::Text(t) => out.push_str(t),
            Node::Expr(p) => {
                // The template's own text is the operator's; values are not: no
                // control sequence from them (line breaks and tabs kept).
                let vals: Vec<String> = eval(p, root, cur)
                    .into_iter()
                    .map(|v| super::table::printable(&text(v), true).into_owned())
                    .collect();
                out.push_str(&vals.join(" "));
            }
            Node::Range(p, body) => {
                for v in eval(p, root, cur) {
                    render_nodes(body, root, v, out);
                }
            }
        }
    }
}

/// `-o custom-columns=NAME:.metadata.name,UUID:.spec.systemUUID`.
pub struct Columns(Vec<(String, Template)>);

impl Columns {
    pub fn parse(spec: &str) -> Result<Columns> {
        if spec.len() > MAX_TEMPLATE {
            bail!("custom-columns spec is longer than {MAX_TEMPLATE} bytes");
        }
        let mut cols = Vec::new();
        for part in spec.split(',') {
            let (h, p) = part.split_once(':').ok_or_else(|| {
                anyhow::anyhow!(
                    "custom-columns: {part:?} is not HEADER:JSONPATH \
                     (e.g. NAME:.metadata.name)"
                )
            })?;
            if h.is_empty() {
                bail!("custom-columns: {part:?} has an empty header");
            }
            cols.push((h.to_string(), Template::parse(p)?));
        }
        Ok(Columns(cols))
    }

    /// The table (header first unless `no_headers`).
    pub fn render(&self, items: &[Value], no_headers: bool) -> String {
        let mut rows = Vec::new();
        if !no_headers {
            rows.push(self.0.iter().map(|(h, _)| h.clone()).collect());
        }
        for it in items {
            rows.push(
                self.0
                    .iter()
                    .map(|(_, t)| {
                        let vals: Vec<String> = t.select(it).into_iter().map(text).collect();
                        if vals.is_empty() {
                            "<none>".to_string()
                        } else {
                            vals.join(",")
                        }
                    })
                    .collect(),
            );
        }
        super::table::format_rows(&rows)
    }
}

/// Sort `items` by the value `--sort-by` selects (numbers numerically, strings as
/// text; objects lacking it first), stably.
pub fn sort_by(items: &mut [Value], spec: &str) -> Result<()> {
    let t = Template::parse(spec)?;
    let key = |v: &Value| t.select(v).first().map(|x| (*x).clone());
    let mut keyed: Vec<(Option<Value>, Value)> =
        items.iter().map(|v| (key(v), v.clone())).collect();
    keyed.sort_by(|a, b| cmp_values(a.0.as_ref(), b.0.as_ref()));
    for (slot, (_, v)) in items.iter_mut().zip(keyed) {
        *slot = v;
    }
    Ok(())
}

/// A total order (`sort_by` panics on one that is not, e.g. when numbers compared as
/// numbers and numbers compared with strings as text disagree): absent first, then
/// numbers by value, then everything else by its text.
fn cmp_values(a: Option<&Value>, b: Option<&Value>) -> Ordering {
    fn class(v: Option<&Value>) -> u8 {
        match v {
            None => 0,
            Some(Value::Number(_)) => 1,
            Some(_) => 2,
        }
    }
    match (a, b) {
        (Some(Value::Number(x)), Some(Value::Number(y))) => {
            let f = |n: &serde_json::Number| n.as_f64().unwrap_or(0.0);
            f(x).total_cmp(&f(y))
        }
        (Some(x), Some(y)) if class(a) == class(b) => text(x).cmp(&text(y)),
        _ => class(a).cmp(&class(b)),
    }
}

/// Leave out `metadata.managedFields` of an object or of a list's items (kubectl's
/// default; `--show-managed-fields` keeps them).
pub(crate) fn hide_managed_fields(v: &mut Value) {
    let drop = |o: &mut Value| {
        if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
            m.shift_remove("managedFields");
        }
    };
    match v.get_mut("items").and_then(Value::as_array_mut) {
        Some(items) => items.iter_mut().for_each(drop),
        None => drop(v),
    }
}

/// How `get` prints, from `-o`.
pub(crate) enum Output {
    Table { wide: bool },
    Json,
    Yaml,
    Name,
    JsonPath(Template),
    Columns(Columns),
}

impl Output {
    pub(crate) fn parse(o: Option<&str>) -> Result<Output> {
        Ok(match o {
            None => Output::Table { wide: false },
            Some("wide") => Output::Table { wide: true },
            Some("json") => Output::Json,
            Some("yaml") => Output::Yaml,
            Some("name") => Output::Name,
            Some(o) => {
                if let Some(t) = o.strip_prefix("jsonpath=") {
                    Output::JsonPath(Template::parse(t)?)
                } else if let Some(c) = o.strip_prefix("custom-columns=") {
                    Output::Columns(Columns::parse(c)?)
                } else {
                    bail!(
                        "unknown output format {o:?} (expected wide, yaml, json, name, \
                         jsonpath=TEMPLATE or custom-columns=SPEC)"
                    )
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn list() -> Value {
        json!({"kind": "ServerList", "items": [
            {"metadata": {"name": "b", "labels": {"z": "1", "a": "2"}}, "spec": {"n": 10}},
            {"metadata": {"name": "a"}, "spec": {"n": 9, "tags": ["x", "y"]}},
        ]})
    }

    fn r(t: &str, v: &Value) -> String {
        Template::parse(t).unwrap().render(v)
    }

    #[test]
    fn jsonpath_fields_wildcards_indexes_and_text() {
        let l = list();
        assert_eq!(r("{.items[*].metadata.name}", &l), "b a");
        assert_eq!(r("{.items[0].metadata.name}", &l), "b");
        assert_eq!(r("{.items[-1].metadata.name}", &l), "a");
        assert_eq!(r("names: {.items[*].metadata.name}!", &l), "names: b a!");
        assert_eq!(r("{.kind}", &l), "ServerList");
        assert_eq!(r("{$.kind}", &l), "ServerList");
        assert_eq!(r("{.items[1].spec.tags}", &l), r#"["x","y"]"#);
        assert_eq!(r("{.items[1].spec.n}", &l), "9");
        assert_eq!(r("{.items[0].metadata.labels['z']}", &l), "1");
        assert_eq!(r(".items[1].metadata.name", &l), "a");
        // Missing fields print nothing.
        assert_eq!(r("[{.items[5].metadata.name}{.nope.x}]", &l), "[]");
    }

    #[test]
    fn jsonpath_range_literals_and_filters() {
        let l = list();
        assert_eq!(
            r(
                r#"{range .items[*]}{.metadata.name}{"\t"}{.spec.n}{"\n"}{end}"#,
                &l
            ),
            "b\t10\na\t9\n"
        );
        assert_eq!(r(r#"{.items[?(@.metadata.name=="a")].spec.n}"#, &l), "9");
        assert_eq!(r(r#"{.items[?(@.metadata.name!="a")].spec.n}"#, &l), "10");
        assert_eq!(
            r("{range .items[*]}{range .spec.tags[*]}<{@}>{end}{end}", &l),
            "<x><y>"
        );
    }

    #[test]
    fn jsonpath_values_carry_no_control_sequence() {
        let v = json!({"h": "\u{1b}]0;owned\u{7}", "l": "a\nb\tc\r", "o": {"k": "\u{1b}"}});
        assert_eq!(r("{.h}", &v), "?]0;owned?");
        assert_eq!(r("{.l}", &v), "a\nb\tc?");
        // Non-strings print as JSON, which escapes them.
        assert_eq!(r("{.o}", &v), r#"{"k":"\u001b"}"#);
        // The operator's own template text and literals are theirs.
        assert_eq!(r("{\"\\r\"}{.h}\u{7}", &v), "\r?]0;owned?\u{7}");
    }

    #[test]
    fn sort_by_mixed_numbers_and_strings_is_a_total_order() {
        // Numbers as numbers but numbers against strings as text was no total order:
        // `sort_by` panicked ("does not correctly implement a total order").
        let mut x: u64 = 1;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..200 {
            let n = (rnd() % 40 + 2) as usize;
            let mut items: Vec<Value> = (0..n)
                .map(|_| match rnd() % 4 {
                    0 => json!({"n": rnd() % 20}),
                    1 => json!({"n": format!("{}", rnd() % 20)}),
                    2 => json!({"n": format!("{}a", rnd() % 20)}),
                    _ => json!({}),
                })
                .collect();
            sort_by(&mut items, ".n").unwrap();
            let class = |v: &Value| match v.get("n") {
                None => 0,
                Some(Value::Number(_)) => 1,
                Some(_) => 2,
            };
            assert!(items.windows(2).all(|w| class(&w[0]) <= class(&w[1])));
        }
    }

    #[test]
    fn jsonpath_errors_name_the_bad_piece() {
        let e = |t: &str| Template::parse(t).unwrap_err().to_string();
        assert!(e("{.a").contains("unclosed '{'"), "{}", e("{.a"));
        assert!(e("{range .items[*]}{.a}").contains("without {end}"));
        assert!(e("{end}").contains("without {range}"));
        assert!(e("{.a[x]}").contains("bad index [x]"));
        assert!(e("{.a..b}").contains("recursive descent"));
        assert!(e("{.a b}").contains("bad field name"));
        assert!(Template::parse(&"x".repeat(5000)).is_err());
        let deep = "{range @}".repeat(9) + &"{end}".repeat(9);
        assert!(e(&deep).contains("nested deeper"));
    }

    #[test]
    fn custom_columns_sort_and_labels() {
        let l = list();
        let mut items = l["items"].as_array().unwrap().clone();
        sort_by(&mut items, "{.metadata.name}").unwrap();
        assert_eq!(items[0]["metadata"]["name"], "a");
        sort_by(&mut items, ".spec.n").unwrap();
        assert_eq!(items[0]["metadata"]["name"], "a");
        let c = Columns::parse("NAME:.metadata.name,TAGS:.spec.tags[*]").unwrap();
        assert_eq!(
            c.render(&items, false),
            "NAME   TAGS\na      x,y\nb      <none>\n"
        );
        assert_eq!(c.render(&items, true), "a   x,y\nb   <none>\n");
        assert!(Columns::parse("NAME").is_err());
        assert_eq!(super::super::table::labels_cell(&items[1]), "a=2,z=1");
        assert_eq!(super::super::table::labels_cell(&items[0]), "<none>");
    }
}
