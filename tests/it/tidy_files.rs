//! Tidy, file level: inside each crate of the workspace, no two source files import each
//! other, directly or round a loop. The crate graph keeps the layers apart (Cargo refuses
//! a cycle) and [`super::tidy`] the top-level modules of the crates that hold more than
//! one; this test sees the files inside a module (ARCHITECTURE.md's rooms), where the
//! compiler allows any tangle.
//!
//! A file's imports are the `crate::`, `super::` and `self::` paths in its code (comments
//! and strings stripped), each resolved to the deepest module file it names. Not counted:
//! paths into the crate root (`lib.rs`, `main.rs`: the facade that declares and
//! re-exports, and the alias of a lower crate such as `crate::model`), and `*_tests.rs`
//! files (a module's tests, declared by the file they test).

use std::collections::{BTreeMap, BTreeSet};

use super::tidy::{brace_end, cycles, path_refs, rust_files, strip_code, Edges};

/// The source roots of the workspace's crates.
const CRATE_ROOTS: [&str; 8] = [
    "src",
    "crates/model/src",
    "crates/store/src",
    "crates/proto/src",
    "crates/controller/src",
    "crates/api/src",
    "crates/cli/src",
    "probe/src",
];

/// The module path of `rel`, a file under `root`: `a/b.rs` → `a::b`, `a/mod.rs` → `a`,
/// the crate root → empty. A directory named with dots (`#[path]`, as
/// `provisioning.bootplane.dev/`) is the module named by its first part.
fn module_of(root: &str, rel: &str) -> Vec<String> {
    let rest = rel.strip_prefix(root).unwrap().trim_start_matches('/');
    let mut parts: Vec<String> = rest
        .split('/')
        .map(|p| p.split('.').next().unwrap().to_string())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// Every path after `crate::`, `super::` (repeated) or `self::` in stripped code, as the
/// module path it names from `here`, with its 1-based line (the lexing is tidy's
/// [`path_refs`]; here each path is resolved from the module it stands in, inline
/// `mod name { ... }` blocks included).
fn paths_from(code: &str, here: &[String]) -> Vec<(Vec<String>, usize)> {
    let b = code.as_bytes();
    let ident = |ch: u8| ch.is_ascii_alphanumeric() || ch == b'_';
    // Inline modules (`mod tests { ... }`): (where the body opens, where it closes, name).
    let mut inline: Vec<(usize, usize, String)> = Vec::new();
    let mut from = 0;
    while let Some(k) = code[from..].find("mod ") {
        let start = from + k;
        from = start + 4;
        if start > 0 && ident(b[start - 1]) {
            continue;
        }
        let name_end = from + b[from..].iter().take_while(|&&c| ident(c)).count();
        let open = name_end
            + b[name_end..]
                .iter()
                .take_while(|c| c.is_ascii_whitespace())
                .count();
        if name_end > from && b.get(open) == Some(&b'{') {
            inline.push((open, brace_end(b, open), code[from..name_end].to_string()));
        }
    }
    let module_at = |at: usize| -> Vec<String> {
        let mut m = here.to_vec();
        m.extend(
            (inline.iter())
                .filter(|(s, e, _)| *s < at && at < *e)
                .map(|(_, _, n)| n.clone()),
        );
        m
    };
    let mut out = Vec::new();
    for r in path_refs(code, &["crate", "super", "self"]) {
        let mut rest = r.segs.as_slice();
        let mut base = Vec::new();
        match rest[0].as_str() {
            "crate" => rest = &rest[1..],
            // `self` in `a.rs` and in `a/mod.rs` is module `a`.
            "self" => {
                base = module_at(r.at);
                rest = &rest[1..];
            }
            _ => {
                base = module_at(r.at);
                while rest.first().map(String::as_str) == Some("super") {
                    base.pop();
                    rest = &rest[1..];
                }
            }
        }
        base.extend(rest.iter().cloned());
        out.push((base, r.line));
    }
    out
}

/// The file edges of one crate: `from file → to file` with where, over its files.
fn file_edges(root: &str) -> Edges {
    let files: Vec<(String, String)> = rust_files(&[root])
        .into_iter()
        .filter(|(rel, _)| !rel.ends_with("_tests.rs"))
        .collect();
    let by_module: BTreeMap<Vec<String>, &str> = files
        .iter()
        .map(|(rel, _)| (module_of(root, rel), rel.as_str()))
        .collect();
    let mut edges = Edges::new();
    for (rel, text) in &files {
        let here = module_of(root, rel);
        for (path, line) in paths_from(&strip_code(text), &here) {
            // The deepest module file the path names.
            let Some(to) = (0..=path.len())
                .rev()
                .find_map(|n| by_module.get(&path[..n]).copied())
            else {
                continue;
            };
            let to_module = module_of(root, to);
            if to_module.is_empty() || to == rel {
                continue;
            }
            edges
                .entry((rel.clone(), to.to_string()))
                .or_default()
                .push(format!("{rel}:{line}"));
        }
    }
    edges
}

#[test]
fn module_paths_and_references_resolve() {
    assert_eq!(module_of("src", "src/lib.rs"), Vec::<String>::new());
    assert_eq!(module_of("src", "src/cli/mod.rs"), ["cli"]);
    assert_eq!(
        module_of(
            "crates/controller/src",
            "crates/controller/src/provisioning.bootplane.dev/image.rs"
        ),
        ["provisioning", "image"]
    );
    let here = ["dhcp".to_string(), "ledger".to_string()];
    let code = "use super::cluster::{self, MirrorMsg};\nuse crate::model::ident::Mac;\nuse super::{metrics::Metrics, persist};\nfn f() { super::super::x::y(); self::inner::z(); }\nmod tests {\n    use super::*;\n    use super::super::core::Reply;\n}";
    let got: Vec<(String, usize)> = paths_from(code, &here)
        .into_iter()
        .map(|(p, l)| (p.join("::"), l))
        .collect();
    assert_eq!(
        got,
        [
            ("dhcp::cluster".to_string(), 1),
            ("dhcp::cluster::MirrorMsg".to_string(), 1),
            ("model::ident::Mac".to_string(), 2),
            ("dhcp::metrics::Metrics".to_string(), 3),
            ("dhcp::persist".to_string(), 3),
            ("x::y".to_string(), 4),
            ("dhcp::ledger::inner::z".to_string(), 4),
            ("dhcp::ledger".to_string(), 6),
            ("dhcp::core::Reply".to_string(), 7),
        ]
    );
}

/// No file-level import cycle inside any crate (issue 33: the nine that were left, such
/// as `dhcp/{cluster,ledger}` and `redfish/{client,transport}`, were opened by moving the
/// shared names one room down).
#[test]
fn no_two_files_of_a_crate_import_each_other() {
    let mut problems = Vec::new();
    let mut counted = 0;
    for root in CRATE_ROOTS {
        let edges = file_edges(root);
        counted += edges.len();
        problems.extend(cycles(&edges));
    }
    // The check sees the imports at all: the workspace has hundreds of file edges.
    assert!(counted > 250, "only {counted} file edges found");
    let files: BTreeSet<String> = problems
        .iter()
        .map(|p| p.lines().next().unwrap_or("").to_string())
        .collect();
    assert!(
        problems.is_empty(),
        "{} cycle(s): {files:?}\n{}",
        problems.len(),
        problems.join("\n")
    );
}
