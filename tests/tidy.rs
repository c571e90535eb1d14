//! Checks that span the repository rather than one module: what the docs say about the
//! running program must match what it exports.

use std::path::{Path, PathBuf};

use prometheus_client::registry::Registry;

/// Every metric family the API's `/metrics` exports (boot HTTP, DHCP and TFTP as `serve`
/// registers them, and the API listener's connection metrics), with the sample names
/// their type adds.
fn exported_names() -> Vec<String> {
    // (an empty label family is not encoded at all: give each one a sample)
    let mut reg = Registry::default();
    bootplane::http::Metrics::new().register(&mut reg);
    let dhcp = bootplane::dhcp::Metrics::default();
    dhcp.init_drop_reasons();
    let subnet = bootplane::dhcp::metrics::SubnetLabels {
        subnet: "10.0.0.0/24".into(),
    };
    dhcp.pool_used.get_or_create(&subnet).set(1);
    dhcp.pool_size.get_or_create(&subnet).set(2);
    dhcp.register(&mut reg);
    let tftp = bootplane::tftp::Metrics::default();
    tftp.error(bootplane::tftp::metrics::ErrorKind::Busy);
    tftp.register(&mut reg);
    bootplane::listen::ConnMetrics::default()
        .register(reg.sub_registry_with_prefix("bootplane_api"));
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
