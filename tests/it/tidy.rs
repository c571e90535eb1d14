//! Checks that span the repository rather than one module: what the docs say about the
//! running program must match what it exports, the workspace's crates depend only on
//! the layers below them, and the top-level modules of `src/` and of the layer crates
//! that still hold several layers (`crates/proto/src/`: L0 and L3) must import each other
//! without a cycle and only down ARCHITECTURE.md's layers, with `serve` imported by
//! `src/main.rs` only.

use std::path::{Path, PathBuf};

use prometheus_client::registry::Registry;

/// Every metric family the API's `/metrics` exports: `bootplane::metrics::register`,
/// the list `serve` registers, with every optional family on, and the audit log's; with
/// the sample names their type adds.
fn exported_names() -> Vec<String> {
    // (an empty label family is not encoded at all: give each one a sample)
    let mut reg = Registry::default();
    let dhcp = bootplane::dhcp::Metrics::default();
    dhcp.init_drop_reasons();
    let subnet = bootplane::dhcp::metrics::SubnetLabels {
        subnet: "10.0.0.0/24".into(),
    };
    dhcp.pool_used.get_or_create(&subnet).set(1);
    dhcp.pool_size.get_or_create(&subnet).set(2);
    let tftp = bootplane::tftp::Metrics::default();
    tftp.error(bootplane::tftp::metrics::ErrorKind::Busy);
    let redfish = bootplane::power::redfish::metrics::Metrics::default();
    let attempt = bootplane::power::redfish::metrics::AttemptLabels {
        action: "On".into(),
        result: "ok".into(),
    };
    redfish.attempts.get_or_create(&attempt).inc();
    let sealed = bootplane::store::rotate::Metrics::default();
    let key = bootplane::store::rotate::KeyLabel { key: "key1".into() };
    sealed.by_key.get_or_create(&key).set(1);
    // Families without a sample are not encoded: one of each.
    let store = bootplane::store::metrics::global();
    store.observe(
        Ok::<(), &bootplane::store::backend::KvError>(()),
        std::time::Duration::ZERO,
    );
    let ctl = bootplane::controller::runtime::metrics::global();
    ctl.observe("tidy", "done", std::time::Duration::ZERO);
    let jobs = bootplane::provision::metrics::global();
    let runner = bootplane::provision::metrics::RunnerLabel { runner: "tidy" };
    jobs.started.get_or_create(&runner).inc();
    jobs.attempts.get_or_create(&runner).inc();
    let finished = bootplane::provision::metrics::FinishedLabels {
        runner: "tidy",
        state: "Failed",
    };
    jobs.finished.get_or_create(&finished).inc();
    let power = bootplane::power::metrics::Metrics::default();
    let req = bootplane::power::metrics::RequestLabels {
        driver: "test",
        action: "on",
        outcome: "done",
    };
    power.requests.get_or_create(&req).inc();
    bootplane::metrics::register(
        &mut reg,
        bootplane::metrics::Families {
            http: &bootplane::http::Metrics::new(),
            dhcp: &dhcp,
            tftp: &tftp,
            power: &power,
            seal: &sealed,
            management: Some((&dhcp, &Default::default())),
            redfish: Some(&redfish),
            #[cfg(feature = "etcd")]
            leader: Some((&Default::default(), &["metal"][..])),
        },
    );
    let audit_dir = tempfile::tempdir().unwrap();
    let _audit = bootplane::api::audit::Audit::start(
        bootplane::api::audit::AuditSettings {
            path: audit_dir.path().join("audit.log"),
            max_bytes: 1 << 20,
            keep: 1,
            unauthenticated_interval: std::time::Duration::from_secs(10),
        },
        reg.sub_registry_with_prefix(bootplane::metrics::API_PREFIX),
    )
    .unwrap();
    let mut s = String::new();
    prometheus_client::encoding::text::encode(&mut s, &reg).unwrap();
    let mut names = Vec::new();
    for l in s.lines() {
        let Some(rest) = l.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = rest.split_once(' ').unwrap();
        names.push(name.to_string());
        match kind {
            "counter" => names.push(format!("{name}_total")),
            "histogram" => {
                for sfx in ["bucket", "sum", "count"] {
                    names.push(format!("{name}_{sfx}"));
                }
            }
            _ => {}
        }
    }
    names
}

/// The metric names a doc mentions in `code` spans: lowercase spans starting with
/// `bootplane_` or ending in `_*` (a prefix). `{a,b}` alternatives are expanded
/// (`...` dropped) and a trailing `{label}` is the label set, not part of the name.
fn mentioned(doc: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, span) in doc.split('`').enumerate() {
        let metric_chars =
            |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "_{},.*".contains(c);
        if i % 2 == 0 || !span.chars().all(metric_chars) {
            continue;
        }
        if !(span.starts_with("bootplane_") || span.ends_with("_*")) {
            continue;
        }
        let mut names = vec![String::new()];
        let mut rest = span;
        while let Some(open) = rest.find('{') {
            let close = rest[open..].find('}').map(|c| open + c).unwrap();
            let (head, group) = (&rest[..open], &rest[open + 1..close]);
            names.iter_mut().for_each(|n| n.push_str(head));
            if group.contains(',') {
                let alts: Vec<&str> = group.split(',').filter(|a| *a != "...").collect();
                names = names
                    .iter()
                    .flat_map(|n| alts.iter().map(move |a| format!("{n}{a}")))
                    .collect();
            }
            rest = &rest[close + 1..];
        }
        names.iter_mut().for_each(|n| n.push_str(rest));
        out.extend(names);
    }
    out
}

/// README.md, ARCHITECTURE.md and every `docs/*.md`.
fn docs() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    let mut more: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    more.sort();
    files.extend(more);
    files
}

#[test]
fn doc_metric_name_parser() {
    assert_eq!(
        mentioned("`bootplane_x_{a,b,...}_total{reason}` and `y_*`, not `z_q` or `Y_*`"),
        ["bootplane_x_a_total", "bootplane_x_b_total", "y_*"]
    );
}

#[test]
fn every_metric_name_the_docs_mention_is_exported() {
    let exported = exported_names();
    let mut checked = 0;
    for file in docs() {
        let doc = std::fs::read_to_string(&file).unwrap();
        for name in mentioned(&doc) {
            let found = match name.strip_suffix('*') {
                Some(prefix) => exported.iter().any(|e| e.starts_with(prefix)),
                None => exported.contains(&name),
            };
            assert!(
                found,
                "{} names the metric `{name}`, which /metrics does not export",
                file.display()
            );
            checked += 1;
        }
    }
    assert!(
        checked >= 5,
        "only {checked} metric names found in the docs"
    );
}

/// The README stays an overview (what it is, the toolchain, set-up, the walk-through, the
/// reference list); the reference detail lives in docs/ (issue 33).
#[test]
fn readme_is_at_most_250_lines() {
    const MAX_README_LINES: usize = 250;
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"));
    let lines = readme.unwrap().lines().count();
    assert!(
        lines <= MAX_README_LINES,
        "README.md has {lines} lines (at most {MAX_README_LINES}): move reference detail into docs/"
    );
}

// ---------------------------------------------------------------------------------------
// Layering (issue 18): the `crate::` edges between the top-level modules of `src/` form no
// cycle, and nothing but `src/main.rs` names `serve` (the composition root).
// ---------------------------------------------------------------------------------------

/// Edges that other issue-18 branches remove, allowed until those branches are merged
/// (the lead empties this list then): `(from, to, why)`. An entry whose edge no longer
/// exists fails the test, so the list only shrinks.
const ALLOWED_UNTIL_MERGED: &[(&str, &str, &str)] = &[];

/// Rust source with comments and the contents of string and character literals blanked
/// (newlines kept, so line numbers stay), so that only code is searched for paths.
pub(super) fn strip_code(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let blank = |ch: char| if ch == '\n' { '\n' } else { ' ' };
    let is_ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < c.len() {
        let next = c.get(i + 1).copied();
        if c[i] == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c[i] == '/' && next == Some('*') {
            // Block comments nest in Rust.
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(c[i]));
                    i += 1;
                }
            }
        } else if (c[i] == 'r' || (c[i] == 'b' && next == Some('r')))
            && (i == 0 || !is_ident(c[i - 1]))
            && {
                let mut j = i + if c[i] == 'b' { 2 } else { 1 };
                while c.get(j) == Some(&'#') {
                    j += 1;
                }
                c.get(j) == Some(&'"')
            }
        {
            // Raw string: r"..", r#".."#, br".."; ends at a quote followed by as many #.
            while c[i] != '"' {
                out.push(c[i]);
                i += 1;
            }
            let hashes = out.chars().rev().take_while(|&h| h == '#').count();
            out.push('"');
            i += 1;
            while i < c.len() {
                if c[i] == '"' && (1..=hashes).all(|k| c.get(i + k) == Some(&'#')) {
                    out.push('"');
                    i += 1;
                    break;
                }
                out.push(blank(c[i]));
                i += 1;
            }
        } else if c[i] == '"' {
            out.push('"');
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < c.len() {
                    out.push(blank(c[i]));
                    i += 1;
                }
            }
            out.push('"');
            i += 1;
        } else if c[i] == '\'' && (next == Some('\\') || c.get(i + 2) == Some(&'\'')) {
            // A character literal ('x', '\n', '\'', '\u{..}'); otherwise a lifetime.
            out.push('\'');
            i += 1;
            if c[i] == '\\' {
                out.push_str("  ");
                i += 2;
            }
            while i < c.len() && c[i] != '\'' {
                out.push(blank(c[i]));
                i += 1;
            }
            out.push('\'');
            i += 1;
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// A path in stripped code: its segments from the root on (`crate`, `super`, `self` or a
/// crate's name), where it starts, and its 1-based line.
pub(super) struct PathRef {
    pub(super) segs: Vec<String>,
    pub(super) at: usize,
    pub(super) line: usize,
}

/// Every path starting with one of `roots` in stripped code. A chain (`super::super::x`)
/// is one path; a group (`root::{a, b::c, d::{..}, self}`) gives one path per member at
/// depth 1, the prefix included: `[root, a]`, `[root, b, c]`, `[root, d]`, `[root]`.
pub(super) fn path_refs(code: &str, roots: &[&str]) -> Vec<PathRef> {
    let b = code.as_bytes();
    let ident = |ch: u8| ch.is_ascii_alphanumeric() || ch == b'_';
    let line = |at: usize| 1 + b[..at].iter().filter(|&&ch| ch == b'\n').count();
    // Identifiers joined by `::` from `p`: (segments, end, whether a `{` follows).
    let read_path = |mut p: usize| {
        let mut segs = Vec::new();
        loop {
            while p < b.len() && b[p].is_ascii_whitespace() {
                p += 1;
            }
            if b.get(p) == Some(&b'{') {
                return (segs, p, true);
            }
            let s = p;
            while p < b.len() && ident(b[p]) {
                p += 1;
            }
            if s == p {
                return (segs, p, false);
            }
            segs.push(code[s..p].to_string());
            if !code[p..].starts_with("::") {
                return (segs, p, false);
            }
            p += 2;
        }
    };
    let mut out = Vec::new();
    let mut at = 0;
    while at < b.len() {
        // A root starts a path when no identifier or `::` runs into it.
        let starts = (at == 0 || !(ident(b[at - 1]) || b[at - 1] == b':'))
            && roots
                .iter()
                .any(|r| code[at..].starts_with(r) && code[at + r.len()..].starts_with("::"));
        if !starts {
            at += 1;
            continue;
        }
        let (prefix, end, group) = read_path(at);
        if !group {
            out.push(PathRef {
                segs: prefix,
                at,
                line: line(at),
            });
            at = end;
            continue;
        }
        // The members at depth 1: each starts right after the `{` or a comma.
        let close = brace_end(b, end);
        let mut p = end + 1;
        while p < close {
            let (member, e, nested) = read_path(p);
            if !member.is_empty() {
                let mut segs = prefix.clone();
                if member[0] != "self" {
                    segs.extend(member);
                }
                let at = p
                    + (b[p..]
                        .iter()
                        .take_while(|c| c.is_ascii_whitespace())
                        .count());
                out.push(PathRef {
                    segs,
                    at,
                    line: line(at),
                });
            }
            // On to the comma after this member (past a nested group).
            p = if nested {
                brace_end(b, e) + 1
            } else {
                e.max(p + 1)
            };
            while p < close && b[p] != b',' {
                p += 1;
            }
            p += 1;
        }
        at = close.max(at + 1);
    }
    out
}

/// The index of the `}` closing the `{` at `open` (the end of the code when none does).
pub(super) fn brace_end(b: &[u8], open: usize) -> usize {
    let mut depth = 0;
    for (i, &ch) in b.iter().enumerate().skip(open) {
        match ch {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
    }
    b.len()
}

/// The names following `ROOT::` in stripped code, with their 1-based lines: the first
/// segment of every `ROOT::x::...` path and each top-level member of a
/// `ROOT::{x, y::z, w::{..}}` group.
fn root_refs(code: &str, root: &str) -> Vec<(String, usize)> {
    path_refs(code, &[root])
        .into_iter()
        .filter_map(|r| Some((r.segs.get(1)?.clone(), r.line)))
        .collect()
}

/// The source trees whose top-level modules are layered by [`LAYERS`]: the `bootplane`
/// package's and those of the layer crates that hold more than one layer (`bootplane-proto`:
/// the L0 helpers and the L3 protocol modules, re-exported by `src/lib.rs` under their
/// module names). A crate of one layer (model, store) needs no table: the compiler keeps it.
const LAYERED_DIRS: [&str; 2] = ["src", "crates/proto/src"];

/// The top-level module a file under one of [`LAYERED_DIRS`] belongs to (`None` for the
/// crate roots).
fn top_module(rel: &str) -> Option<String> {
    let rest = LAYERED_DIRS
        .iter()
        .find_map(|d| rel.strip_prefix(d)?.strip_prefix('/'))?;
    match rest.split_once('/') {
        Some((dir, _)) => Some(dir.to_string()),
        None if rest == "lib.rs" || rest == "main.rs" => None,
        None => Some(rest.trim_end_matches(".rs").to_string()),
    }
}

/// `(from, to) → every file:line where from names to`, over the files given as
/// (repository-relative path, text), for the top-level `modules`.
pub(super) type Edges = std::collections::BTreeMap<(String, String), Vec<String>>;

fn module_edges(files: &[(String, String)], modules: &std::collections::BTreeSet<String>) -> Edges {
    let mut edges = Edges::new();
    for (rel, text) in files {
        let Some(from) = top_module(rel) else {
            continue;
        };
        for (to, line) in root_refs(&strip_code(text), "crate") {
            if to != from && modules.contains(&to) {
                edges
                    .entry((from.clone(), to))
                    .or_default()
                    .push(format!("{rel}:{line}"));
            }
        }
    }
    edges
}

/// One cycle per strongly connected component of more than one module, each as
/// `a → b (file:line) → ... → a`, shortest through the component's first module.
pub(super) fn cycles(edges: &Edges) -> Vec<String> {
    use std::collections::{BTreeMap, BTreeSet, VecDeque};
    let mut next: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        next.entry(from).or_default().insert(to);
        next.entry(to).or_default();
    }
    let reach = |start: &str| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![start];
        while let Some(n) = todo.pop() {
            for &m in &next[n] {
                if seen.insert(m) {
                    todo.push(m);
                }
            }
        }
        seen
    };
    let reach: BTreeMap<&str, BTreeSet<&str>> = next.keys().map(|&n| (n, reach(n))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for &start in next.keys() {
        if done.contains(start) || !reach[start].contains(start) {
            continue;
        }
        let scc: BTreeSet<&str> = reach[start]
            .iter()
            .copied()
            .filter(|m| reach[m].contains(start))
            .collect();
        done.extend(scc.iter().copied());
        // Shortest path start → ... → start inside the component (BFS).
        let mut prev: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = VecDeque::from([start]);
        'bfs: while let Some(n) = queue.pop_front() {
            for &m in &next[n] {
                if !scc.contains(m) || prev.contains_key(m) {
                    continue;
                }
                prev.insert(m, n);
                if m == start {
                    break 'bfs;
                }
                queue.push_back(m);
            }
        }
        let mut path = vec![start];
        let mut cur = prev[start];
        while cur != start {
            path.push(cur);
            cur = prev[cur];
        }
        path.push(start);
        path.reverse();
        let mut s = format!("cycle of {} modules: {start}", scc.len());
        for w in path.windows(2) {
            let at = &edges[&(w[0].to_string(), w[1].to_string())];
            s.push_str(&format!("\n  → {} ({})", w[1], at.join(", ")));
        }
        s.push_str("\n  every edge inside it:");
        for ((from, to), at) in edges {
            if scc.contains(from.as_str()) && scc.contains(to.as_str()) {
                s.push_str(&format!("\n    {from} → {to} ({})", at.join(", ")));
            }
        }
        out.push(s);
    }
    out
}

/// Every `crate::serve` / `bootplane::serve` reference outside `src/main.rs` (and
/// `src/serve.rs` itself), as `file:line`.
fn serve_refs(files: &[(String, String)]) -> Vec<String> {
    let mut out = Vec::new();
    for (rel, text) in files {
        if rel == "src/main.rs" || rel == "src/serve.rs" {
            continue;
        }
        let code = strip_code(text);
        for root in ["crate", "bootplane"] {
            for (name, line) in root_refs(&code, root) {
                if name == "serve" {
                    out.push(format!("{rel}:{line}"));
                }
            }
        }
    }
    out
}

/// Every `.rs` file under `dirs` (relative to the crate root), as (relative path, text).
pub(super) fn rust_files(dirs: &[&str]) -> Vec<(String, String)> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        let mut entries: Vec<PathBuf> = rd.map(|e| e.unwrap().path()).collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                if p.file_name().is_some_and(|n| n == "target") {
                    continue;
                }
                walk(root, &p, out);
            } else if p.extension().is_some_and(|e| e == "rs") {
                let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                out.push((rel, std::fs::read_to_string(&p).unwrap()));
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    for d in dirs {
        walk(root, &root.join(d), &mut out);
    }
    out
}

/// The top-level modules `src/lib.rs` declares.
fn lib_modules() -> std::collections::BTreeSet<String> {
    let lib =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    lib_rs_modules(&lib)
}

/// The module names a crate root declares or re-exports: `mod x;`, a layer crate named as a
/// module again (`pub use bootplane_x as x;`), and the modules of a layer crate re-exported
/// under their own names (`pub use bootplane_x::{a, b};`, over several lines).
fn lib_rs_modules(lib: &str) -> std::collections::BTreeSet<String> {
    let code = strip_code(lib);
    let mut out = std::collections::BTreeSet::new();
    for item in code.split(';') {
        let item = item.split_whitespace().collect::<Vec<_>>().join(" ");
        let item = item.strip_prefix("pub ").unwrap_or(&item);
        if let Some(m) = item.strip_prefix("mod ") {
            out.insert(m.trim().to_string());
        } else if let Some(u) = item.strip_prefix("use ") {
            if let Some((_, name)) = u.split_once(" as ") {
                out.insert(name.trim().to_string());
            } else if let Some((_, group)) = u.split_once("::{") {
                let group = group.trim_end().strip_suffix('}').unwrap_or(group);
                out.extend(
                    group
                        .split(',')
                        .map(str::trim)
                        .filter(|m| !m.is_empty())
                        .map(str::to_string),
                );
            }
        }
    }
    out
}

#[test]
fn layering_parser_reads_paths_and_groups() {
    let src = "use crate::{a, b::{c, d}, e::f as g};\n// crate::h in a comment\n\
               let s = \"crate::i in a string\"; let r = r#\"crate::j\"#;\n\
               fn f<'a>(x: &'a str) -> char { crate::k::run(); '\\'' }\n\
               /* crate::l /* nested */ crate::m */ $crate::n!(); notcrate::o::p();\n\
               use bootplane::{serve, config};\n";
    let code = strip_code(src);
    assert_eq!(code.lines().count(), src.lines().count());
    let names = |root| -> Vec<(String, usize)> { root_refs(&code, root) };
    let want = |v: &[(&str, usize)]| -> Vec<(String, usize)> {
        v.iter().map(|(n, l)| (n.to_string(), *l)).collect()
    };
    assert_eq!(
        names("crate"),
        want(&[("a", 1), ("b", 1), ("e", 1), ("k", 4), ("n", 5)])
    );
    assert_eq!(names("bootplane"), want(&[("serve", 6), ("config", 6)]));
    assert_eq!(
        top_module("src/dhcp/core/tests.rs").as_deref(),
        Some("dhcp")
    );
    assert_eq!(top_module("src/config.rs").as_deref(), Some("config"));
    assert_eq!(top_module("src/lib.rs"), None);
    assert_eq!(
        top_module("crates/proto/src/tftp/engine.rs").as_deref(),
        Some("tftp")
    );
    assert_eq!(top_module("crates/proto/src/lib.rs"), None);
    assert_eq!(top_module("crates/store/src/kv/mod.rs"), None);
    let lib = "//! doc\npub mod api;\nmod cli; // crate::x\npub use bootplane_model as model;\n\
               pub use bootplane_proto::{\n    decode, dhcp,\n    tls,\n};\n";
    let names: Vec<String> = lib_rs_modules(lib).into_iter().collect();
    assert_eq!(names, ["api", "cli", "decode", "dhcp", "model", "tls"]);
}

#[test]
fn layering_check_finds_cycles_and_serve_imports() {
    let files: Vec<(String, String)> = [
        ("src/a/mod.rs", "use crate::b::X;\nuse crate::a::inner;\n"),
        ("src/b.rs", "//! doc\nfn f() { crate::c::g() }\n"),
        ("src/c/x.rs", "use crate::{a, d};\n"),
        ("src/d.rs", "use crate::serve::Context; // upward\n"),
        ("src/e.rs", "use crate::d::Y;\n"),
        ("src/main.rs", "fn main() { bootplane::serve::run() }\n"),
        ("tests/t.rs", "use bootplane::{config, serve};\n"),
    ]
    .iter()
    .map(|(p, t)| (p.to_string(), t.to_string()))
    .collect();
    let modules = ["a", "b", "c", "d", "e", "serve"]
        .iter()
        .map(|m| m.to_string())
        .collect();
    let edges = module_edges(&files, &modules);
    assert!(!edges.contains_key(&("a".into(), "a".into())));
    let found = cycles(&edges);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        found[0],
        "cycle of 3 modules: a\n  → b (src/a/mod.rs:1)\n  → c (src/b.rs:2)\n  → a (src/c/x.rs:1)\n  \
         every edge inside it:\n    a → b (src/a/mod.rs:1)\n    b → c (src/b.rs:2)\n    c → a (src/c/x.rs:1)"
    );
    assert_eq!(serve_refs(&files), ["src/d.rs:1", "tests/t.rs:1"]);
    // Without the edge back to `a` there is no cycle.
    let mut acyclic = edges.clone();
    acyclic.remove(&("c".into(), "a".into()));
    assert!(cycles(&acyclic).is_empty());
}

/// Issue 18's acceptance: no import cycle between the top-level modules of `src/` (and
/// those of `crates/proto/src/`), and `serve` (the composition root) named only by
/// `src/main.rs`.
#[test]
fn top_level_modules_form_no_cycle_and_only_main_imports_serve() {
    let modules = lib_modules();
    assert!(modules.len() >= 10, "modules of src/lib.rs: {modules:?}");
    let mut edges = module_edges(&rust_files(&LAYERED_DIRS), &modules);
    let mut problems = Vec::new();
    for (from, to, why) in ALLOWED_UNTIL_MERGED {
        if edges.remove(&(from.to_string(), to.to_string())).is_none() {
            problems.push(format!(
                "ALLOWED_UNTIL_MERGED lists {from} → {to} ({why}), which no longer exists: remove it"
            ));
        }
    }
    problems.extend(cycles(&edges));
    for at in serve_refs(&rust_files(&[
        "src",
        "crates",
        "tests",
        "benches",
        "fuzz/fuzz_targets",
    ])) {
        problems.push(format!(
            "{at}: names `serve`, which only src/main.rs may import"
        ));
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------------------
// Layer order (issue 33): ARCHITECTURE.md's layers as a table, and every `crate::` path
// from a module to one of a higher layer (or, outside the peer layers, to another module
// of its own layer) is an offence, named by file:line.
// ---------------------------------------------------------------------------------------

/// Every top-level module of `src/` (and, re-exported by it, of the layer crates) with
/// its layer (ARCHITECTURE.md, "The layer rule"):
/// L0 base, L1 model, L2 store, L3 protocol cores and servers, L4 controllers, L5 the
/// API and the CLI, L6 config and serve. A new module has to be placed here.
const LAYERS: &[(&str, u8)] = &[
    ("decode", 0),
    ("listen", 0),
    ("logging", 0),
    ("net", 0),
    ("shutdown", 0),
    ("statedir", 0),
    ("sys", 0),
    ("tls", 0),
    ("model", 1),
    ("store", 2),
    ("dhcp", 3),
    ("http", 3),
    ("ignition", 3),
    ("image", 3),
    ("ipxe", 3),
    ("nfs", 3),
    ("power", 3),
    ("provision", 3),
    ("redfish", 3),
    ("tftp", 3),
    ("controller", 4),
    ("api", 5),
    ("cli", 5),
    ("config", 6),
    ("metrics", 6),
    ("serve", 6),
];

/// Layers whose modules may import one another (still without a cycle): the base
/// helpers, the protocol modules (`http` renders with `ipxe`, `power` drives `redfish`,
/// ...) and L6 (`serve` reads `config`; nothing but `main.rs` imports `serve`). In L5 the
/// API and the CLI are not peers: what both need lives below them (`tls`, `model::wire`).
const PEER_LAYERS: &[u8] = &[0, 3, 6];

/// Every edge that goes up the layers, or sideways outside [`PEER_LAYERS`], as
/// `file:line: from (Ln) imports to (Lm)`; a module missing from `layers` is an offence
/// of its own.
fn layer_offences(
    edges: &Edges,
    modules: &std::collections::BTreeSet<String>,
    layers: &[(&str, u8)],
    peers: &[u8],
) -> Vec<String> {
    let layer = |m: &str| layers.iter().find(|(n, _)| *n == m).map(|(_, l)| *l);
    let mut out: Vec<String> = modules
        .iter()
        .filter(|m| layer(m).is_none())
        .map(|m| format!("module `{m}` has no layer: add it to LAYERS in tests/tidy.rs"))
        .collect();
    for ((from, to), at) in edges {
        let (Some(lf), Some(lt)) = (layer(from), layer(to)) else {
            continue;
        };
        if lt > lf || (lt == lf && !peers.contains(&lf)) {
            let how = if lt > lf {
                "a higher layer"
            } else {
                "a module of its own layer"
            };
            for a in at {
                out.push(format!("{a}: {from} (L{lf}) imports {to} (L{lt}), {how}"));
            }
        }
    }
    out
}

#[test]
fn layer_check_finds_upward_and_sideways_imports() {
    let files: Vec<(String, String)> = [
        (
            "src/low/mod.rs",
            "use crate::high::X;\nuse crate::peer::Y;\n",
        ),
        ("src/peer.rs", "fn f() { crate::low::g() }\n"),
        ("src/high.rs", "use crate::{low, mid, other};\n"),
        ("src/other.rs", "use crate::high::Z;\n"),
        ("src/stray.rs", "use crate::low::W;\n"),
    ]
    .iter()
    .map(|(p, t)| (p.to_string(), t.to_string()))
    .collect();
    let modules = ["low", "peer", "high", "other", "stray", "mid"]
        .iter()
        .map(|m| m.to_string())
        .collect();
    let edges = module_edges(&files, &modules);
    let layers = [
        ("low", 0),
        ("peer", 0),
        ("mid", 1),
        ("high", 2),
        ("other", 2),
    ];
    assert_eq!(
        layer_offences(&edges, &modules, &layers, &[0]),
        [
            "module `stray` has no layer: add it to LAYERS in tests/tidy.rs",
            "src/high.rs:1: high (L2) imports other (L2), a module of its own layer",
            "src/low/mod.rs:1: low (L0) imports high (L2), a higher layer",
            "src/other.rs:1: other (L2) imports high (L2), a module of its own layer",
        ]
    );
}

/// Issue 33: a module imports only modules of lower layers (or its peers in a peer
/// layer), so the layers of ARCHITECTURE.md hold as a fact of the code. Between crates
/// the compiler keeps the rule; inside `bootplane-proto` (L0 and L3) and the `bootplane`
/// package (L4 to L6) this table does.
#[test]
fn top_level_modules_import_only_lower_layers() {
    let modules = lib_modules();
    let edges = module_edges(&rust_files(&LAYERED_DIRS), &modules);
    let problems = layer_offences(&edges, &modules, LAYERS, PEER_LAYERS);
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------------------
// Sizes (issue 18): no file under `src/` over `MAX_FILE_LINES` lines and no `fn` over
// `MAX_FN_LINES` lines. The convention for a file that must be longer (a generated table,
// say): a line of its `//!` module doc starting `Size:` says why, and then neither limit
// applies to it:
//
//     //! Size: one match arm per opcode of the spec, in the spec's order.
// ---------------------------------------------------------------------------------------

const MAX_FILE_LINES: usize = 1_000;

/// Where the crates' sources are: the `bootplane` package's and each layer crate's.
const SOURCE_DIRS: [&str; 2] = ["src", "crates"];
const MAX_FN_LINES: usize = 150;

/// Offenders allowed for now: `(path, fn name, why)`, with an empty fn name for the
/// file's own length. An entry whose offence is gone fails the test, so the list only
/// shrinks; it is empty, and new code has to fit the limits.
const EXEMPT_UNTIL_MERGED: &[(&str, &str, &str)] = &[];

/// Every `fn` with a body in stripped code (see [`strip_code`]): its name, the 1-based
/// line of the `fn` keyword and how many lines it spans, from that line to the line of
/// its closing brace. Nested functions are listed on their own as well; `fn` pointer
/// types (`fn(u8)`) and bodiless declarations (`fn f();`) are not functions here.
fn fn_lengths(code: &str) -> Vec<(String, usize, usize)> {
    let b = code.as_bytes();
    let ident = |ch: u8| ch.is_ascii_alphanumeric() || ch == b'_';
    let line = |at: usize| 1 + b[..at].iter().filter(|&&ch| ch == b'\n').count();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(k) = code[from..].find("fn") {
        let at = from + k;
        from = at + 2;
        if (at > 0 && ident(b[at - 1])) || !b.get(at + 2).is_some_and(|c| c.is_ascii_whitespace()) {
            continue;
        }
        let mut p = at + 2;
        while p < b.len() && b[p].is_ascii_whitespace() {
            p += 1;
        }
        let start = p;
        while p < b.len() && ident(b[p]) {
            p += 1;
        }
        if p == start {
            continue;
        }
        let name = code[start..p].to_string();
        // The body starts at the first `{` of the signature; a `;` first means none.
        let Some(open) = code[p..].find(['{', ';']).map(|o| p + o) else {
            break;
        };
        if b[open] == b';' {
            continue;
        }
        let close = brace_end(b, open);
        if close >= b.len() {
            break;
        }
        out.push((name, line(at), line(close) - line(at) + 1));
    }
    out
}

/// Whether the file's `//!` module doc has a line starting `Size:` with a reason after it.
fn size_exempt(text: &str) -> bool {
    text.lines()
        .filter_map(|l| l.trim_start().strip_prefix("//!"))
        .filter_map(|l| l.trim_start().strip_prefix("Size:"))
        .any(|why| !why.trim().is_empty())
}

/// Every file over `MAX_FILE_LINES` and every `fn` over `MAX_FN_LINES` lines, as
/// `(path, fn name or "", "path:line ...")`, leaving out files with a `Size:` doc line.
fn size_offences(files: &[(String, String)]) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for (rel, text) in files {
        if size_exempt(text) {
            continue;
        }
        let lines = text.lines().count();
        if lines > MAX_FILE_LINES {
            out.push((
                rel.clone(),
                String::new(),
                format!("{rel}:1: {lines} lines (at most {MAX_FILE_LINES})"),
            ));
        }
        for (name, line, len) in fn_lengths(&strip_code(text)) {
            if len > MAX_FN_LINES {
                out.push((
                    rel.clone(),
                    name.clone(),
                    format!("{rel}:{line}: fn {name} is {len} lines (at most {MAX_FN_LINES})"),
                ));
            }
        }
    }
    out
}

#[test]
fn size_counter_measures_fns() {
    let src = "fn one() {}\n\
               pub(crate) async fn two<T: Into<u8>>(x: T)\n    -> u8\nwhere T: Copy\n{\n    \
               let s = \"}}}\"; // }\n    let c = '}';\n    fn inner() -> fn(u8) { todo!() }\n    \
               x.into()\n}\n\
               trait T { fn decl(&self); fn with_default(&self) {\n} }\n\
               let p: fn (u8) = f; let q = Box::<dyn Fn()>::new(|| {});\n\
               fn\nspread\n()\n{}\n";
    let got = fn_lengths(&strip_code(src));
    let want: Vec<(String, usize, usize)> = [
        ("one", 1, 1),
        ("two", 2, 9),
        ("inner", 8, 1),
        ("with_default", 11, 2),
        ("spread", 14, 4),
    ]
    .iter()
    .map(|(n, l, c)| (n.to_string(), *l, *c))
    .collect();
    assert_eq!(got, want);
    assert!(size_exempt(
        "//! A table.\n//!\n//! Size: generated from the spec.\nfn f() {}\n"
    ));
    assert!(!size_exempt("//! Size:\n"));
    assert!(!size_exempt("// Size: not a module doc\n"));
    let long_fn = format!(
        "fn long() {{\n{}}}\n",
        "    x();\n".repeat(MAX_FN_LINES - 1)
    );
    let files = [("src/a.rs".to_string(), long_fn.clone())];
    let found = size_offences(&files);
    assert_eq!(found.len(), 1);
    assert_eq!(
        found[0].2,
        format!(
            "src/a.rs:1: fn long is {} lines (at most {MAX_FN_LINES})",
            MAX_FN_LINES + 1
        )
    );
    let exempt = [("src/a.rs".to_string(), format!("//! Size: why.\n{long_fn}"))];
    assert!(size_offences(&exempt).is_empty());
}

/// Issue 18's acceptance: no source file over ~1,000 lines and no function over ~150
/// lines, unless its module doc says why (a `Size:` line).
#[test]
fn no_source_file_or_fn_is_too_long() {
    let mut found = size_offences(&rust_files(&SOURCE_DIRS));
    let mut problems = Vec::new();
    for (path, name, why) in EXEMPT_UNTIL_MERGED {
        let before = found.len();
        found.retain(|(p, n, _)| !(p == path && n == name));
        if found.len() == before {
            let what = if name.is_empty() { "the file" } else { name };
            problems.push(format!(
                "EXEMPT_UNTIL_MERGED lists {path} {what} ({why}), which is no longer too long: remove it"
            ));
        }
    }
    problems.extend(found.into_iter().map(|(_, _, at)| at));
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

/// Every source file opens its module doc (`//!`) before any code: what it is for.
#[test]
fn every_source_file_has_a_module_doc() {
    let missing: Vec<String> = rust_files(&SOURCE_DIRS)
        .into_iter()
        .filter(|(_, text)| {
            let first = text.lines().map(str::trim).find(|l| !l.is_empty());
            !first.is_some_and(|l| l.starts_with("//!") || l.starts_with("#!["))
        })
        .map(|(rel, _)| rel)
        .collect();
    assert!(missing.is_empty(), "no `//!` module doc: {missing:?}");
}

// ---------------------------------------------------------------------------------------
// Crate layers (issue 33): the workspace's members, bottom up. A crate may depend only on
// crates of a lower layer, so an import of a higher layer does not compile (the crate is
// not a dependency); this test keeps the `Cargo.toml`s from adding the dependency. A new
// member must be given its layer here (and its place in ARCHITECTURE.md's crate map).
// ---------------------------------------------------------------------------------------

/// `(package, layer)`: 0 = depends on no other member.
const CRATE_LAYERS: &[(&str, u8)] = &[
    ("bootplane-model", 0),
    ("bootplane-image", 0),
    ("bootplane-probe", 1),
    ("bootplane-store", 1),
    ("bootplane-proto", 2),
    ("bootplane-controller", 3),
    ("bootplane-api", 4),
    ("bootplane-cli", 4),
    ("bootplane", 9),
];

/// The workspace's members as `(package name, its bootplane-* dependencies of every
/// kind)`, read from the root `Cargo.toml`'s `[workspace] members` and theirs.
fn workspace_members() -> Vec<(String, Vec<String>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |dir: &Path| -> toml::Table {
        let text = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        text.parse().unwrap()
    };
    let top = read(root);
    let members = top["workspace"]["members"]
        .as_array()
        .expect("[workspace] members");
    members
        .iter()
        .map(|m| {
            let manifest = read(&root.join(m.as_str().unwrap()));
            (
                manifest["package"]["name"].as_str().unwrap().to_string(),
                member_deps(&manifest),
            )
        })
        .collect()
}

/// The `bootplane*` dependencies a manifest names, in any dependency table.
fn member_deps(manifest: &toml::Table) -> Vec<String> {
    let mut deps = Vec::new();
    for table in ["dependencies", "dev-dependencies", "build-dependencies"] {
        if let Some(t) = manifest.get(table).and_then(|t| t.as_table()) {
            deps.extend(t.keys().filter(|k| k.starts_with("bootplane")).cloned());
        }
    }
    deps.sort();
    deps.dedup();
    deps
}

/// Every edge that does not point to a lower layer, and every member without a layer.
fn upward_edges(members: &[(String, Vec<String>)], layers: &[(&str, u8)]) -> Vec<String> {
    let layer = |name: &str| layers.iter().find(|(n, _)| *n == name).map(|(_, l)| *l);
    let mut problems = Vec::new();
    for (name, deps) in members {
        let Some(own) = layer(name) else {
            problems.push(format!(
                "{name}: a workspace member without a layer in CRATE_LAYERS"
            ));
            continue;
        };
        for d in deps {
            match layer(d) {
                Some(l) if l < own => {}
                Some(l) => problems.push(format!(
                    "{name} (layer {own}) depends on {d} (layer {l}): a crate depends only on lower layers"
                )),
                None => problems.push(format!("{name} depends on {d}, which has no layer")),
            }
        }
    }
    problems
}

/// Log targets are module paths, so a module moved into a layer crate logs under a new
/// one: every module `src/lib.rs` takes from a crate (not a `mod` of its own) has its old
/// path in `logging::MOVED_TARGETS`, mapped to the crate's file that is that module, so a
/// `[log] filter` naming `bootplane::<module>` keeps working.
#[test]
fn every_moved_module_keeps_its_log_target() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = std::fs::read_to_string(root.join("src/lib.rs")).unwrap();
    let own: Vec<String> = strip_code(&lib)
        .lines()
        .filter_map(|l| {
            let l = l.trim().strip_prefix("pub ").unwrap_or(l.trim());
            Some(
                l.strip_prefix("mod ")?
                    .strip_suffix(';')?
                    .trim()
                    .to_string(),
            )
        })
        .collect();
    let mut problems = Vec::new();
    for m in lib_rs_modules(&lib)
        .into_iter()
        .filter(|m| !own.contains(m))
    {
        let old = format!("bootplane::{m}");
        let Some((_, new)) = bootplane::logging::MOVED_TARGETS
            .iter()
            .find(|(o, _)| *o == old)
        else {
            problems.push(format!("{old}: not in logging::MOVED_TARGETS"));
            continue;
        };
        // `bootplane_x::a::b` is crates/x/src/a/b(.rs|/mod.rs); `bootplane_x` its lib.rs.
        let mut parts = new.split("::");
        let krate = parts.next().unwrap().trim_start_matches("bootplane_");
        let mut path = root.join("crates").join(krate).join("src");
        for p in parts {
            path.push(p);
        }
        let found = if path.ends_with("src") {
            path.join("lib.rs").is_file()
        } else {
            path.with_extension("rs").is_file() || path.join("mod.rs").is_file()
        };
        if !found {
            problems.push(format!("{old} → {new}: no such module under crates/"));
        }
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------------------
// The test layout (issue 33): the integration tests are modules of one binary,
// tests/it/main.rs, and `autotests = false` in Cargo.toml, so a file cargo does not find
// through a `[[test]]` entry or a `mod` line would silently never run. And nextest, the
// runner of scripts/test.sh, runs no doctests: the library has none.
// ---------------------------------------------------------------------------------------

/// Problems with the test layout in `files` (relative path, text) given the text of
/// Cargo.toml.
fn test_layout_problems(files: &[(String, String)], cargo_toml: &str) -> Vec<String> {
    let main = files
        .iter()
        .find(|(p, _)| p == "tests/it/main.rs")
        .map_or("", |(_, t)| t.as_str());
    let mut problems = Vec::new();
    for (path, text) in files {
        let parts: Vec<&str> = path.split('/').collect();
        match parts.as_slice() {
            ["tests", "it", file] if *file != "main.rs" => {
                let name = file.trim_end_matches(".rs");
                if !main.lines().any(|l| l.trim() == format!("mod {name};")) {
                    problems.push(format!("{path}: no `mod {name};` in tests/it/main.rs"));
                }
            }
            ["tests", _] if !cargo_toml.contains(&format!("path = \"{path}\"")) => {
                problems.push(format!(
                    "{path}: a test file outside tests/it/ and not a [[test]] of Cargo.toml \
                     (autotests = false): make it a module of tests/it/main.rs"
                ));
            }
            ["src", ..] | ["crates", _, "src", ..] => {
                let mut open = false;
                for (i, l) in text.lines().enumerate() {
                    let t = l.trim_start();
                    let Some(doc) = t.strip_prefix("///").or_else(|| t.strip_prefix("//!")) else {
                        continue;
                    };
                    let Some(lang) = doc.trim_start().strip_prefix("```") else {
                        continue;
                    };
                    if !open && (lang.is_empty() || lang.starts_with("rust")) {
                        problems.push(format!(
                            "{path}:{}: a doctest, which scripts/test.sh (nextest) never runs: \
                             mark the block `text`, or make it a unit test",
                            i + 1
                        ));
                    }
                    open = !open;
                }
            }
            _ => {}
        }
    }
    problems
}

#[test]
fn crate_layer_check_finds_upward_and_unplaced_crates() {
    let layers = [("m", 0), ("s", 1), ("top", 9)];
    let members = vec![
        ("m".to_string(), vec!["s".to_string()]),
        ("s".to_string(), vec!["m".to_string()]),
        (
            "top".to_string(),
            vec!["m".to_string(), "s".to_string(), "x".to_string()],
        ),
        ("new".to_string(), vec![]),
    ];
    assert_eq!(
        upward_edges(&members, &layers),
        [
            "m (layer 0) depends on s (layer 1): a crate depends only on lower layers",
            "top depends on x, which has no layer",
            "new: a workspace member without a layer in CRATE_LAYERS",
        ]
    );
    let manifest: toml::Table = "[dependencies]\nbootplane-model.workspace = true\nserde = \"1\"\n\
                                 [dev-dependencies]\nbootplane-store = { path = \"x\" }\n"
        .parse()
        .unwrap();
    assert_eq!(
        member_deps(&manifest),
        ["bootplane-model", "bootplane-store"]
    );
}

/// Issue 33's acceptance: the workspace's crates are layers, each depending only on the
/// ones below it.
#[test]
fn workspace_crates_depend_only_downward() {
    let members = workspace_members();
    assert!(members.len() >= 3, "workspace members: {members:?}");
    let problems = upward_edges(&members, CRATE_LAYERS);
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

#[test]
fn test_layout_checker_finds_strays() {
    let files = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(p, t)| (p.to_string(), t.to_string()))
            .collect()
    };
    let cargo = "[[test]]\nname = \"it\"\npath = \"tests/it/main.rs\"\n";
    let ok = files(&[
        ("tests/it/main.rs", "mod a;\n"),
        ("tests/it/a.rs", ""),
        (
            "src/x.rs",
            "//! ```text\n//! fn\n//! ```\n/// ```toml\n/// ```\n",
        ),
    ]);
    assert_eq!(test_layout_problems(&ok, cargo), Vec::<String>::new());
    let bad = files(&[
        ("tests/it/main.rs", "mod a;\n"),
        ("tests/it/b.rs", ""),
        ("tests/c.rs", ""),
        ("src/x.rs", "/// ```\n/// f();\n/// ```\n"),
    ]);
    let p = test_layout_problems(&bad, cargo);
    assert_eq!(p.len(), 3, "{p:#?}");
    assert!(p[0].starts_with("tests/it/b.rs: no `mod b;`"), "{p:#?}");
    assert!(
        p[1].starts_with("tests/c.rs: a test file outside"),
        "{p:#?}"
    );
    assert!(p[2].starts_with("src/x.rs:1: a doctest"), "{p:#?}");
}

#[test]
fn every_test_file_is_built_and_no_doctest_is_left_unrun() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cargo = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let p = test_layout_problems(&rust_files(&["src", "crates", "tests"]), &cargo);
    assert!(p.is_empty(), "\n{}", p.join("\n"));
}

/// Files under `crates/controller/src/` allowed to read objects through raw JSON pointers,
/// with why: only a truly generic walk (any kind, any field) belongs here. Empty: every
/// reconciler reads through `model::views`.
const POINTERS_ALLOWED: &[(&str, &str)] = &[];

/// `.pointer(` / `pointer_mut(` in code (not comments or strings) of `files`, outside
/// [`POINTERS_ALLOWED`], as `path:line: text`.
fn pointer_reads(files: &[(String, String)]) -> Vec<String> {
    let mut found = Vec::new();
    for (path, text) in files {
        if POINTERS_ALLOWED.iter().any(|(p, _)| p == path) {
            continue;
        }
        let code = strip_code(text);
        for ((i, line), src) in code.lines().enumerate().zip(text.lines()) {
            if line.contains(".pointer(") || line.contains("pointer_mut(") {
                found.push(format!("{path}:{}: {}", i + 1, src.trim()));
            }
        }
    }
    found
}

#[test]
fn pointer_scanner_skips_comments_and_strings() {
    let files = vec![(
        "crates/controller/src/x.rs".to_string(),
        "// s.pointer(\"/a\")\nlet m = \".pointer(\";\nlet v = s.pointer(\"/spec/ip\");\nv.pointer_mut(\"/a\");\n"
            .to_string(),
    )];
    assert_eq!(
        pointer_reads(&files),
        vec![
            "crates/controller/src/x.rs:3: let v = s.pointer(\"/spec/ip\");",
            "crates/controller/src/x.rs:4: v.pointer_mut(\"/a\");"
        ]
    );
}

/// Issue 33: the reconcilers read the objects through the typed views of
/// `model::views` (each field named once, states as enums), not raw JSON pointers.
#[test]
fn controllers_read_objects_through_typed_views() {
    let mut problems = pointer_reads(&rust_files(&["crates/controller/src"]));
    for (path, why) in POINTERS_ALLOWED {
        if !Path::new(env!("CARGO_MANIFEST_DIR")).join(path).exists() {
            problems.push(format!(
                "POINTERS_ALLOWED lists {path} ({why}), which is gone"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "raw JSON pointers in crates/controller/src (read the object through a view of crate::model::views):\n{}",
        problems.join("\n")
    );
}
