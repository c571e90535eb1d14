//! kubectl-style aligned tables, with columns from the CRD's printer columns (their
//! JSONPath subset is `model::printer`'s, which the API's server-side tables share).

use serde_json::Value;

use crate::model::registry::ResourceType;

pub(crate) struct Table {
    headers: Vec<String>,
    cols: Vec<Col>,
    namespaced: bool,
    widths: Vec<usize>,
    printed_header: bool,
    /// Printed before each name (`get all`'s `server.metal.ironcore.dev/`).
    name_prefix: String,
    /// No header line (`--no-headers`).
    no_headers: bool,
}

/// What a column shows.
enum Col {
    Name,
    Path(String),
    Age,
    Labels,
}

use crate::model::printer::jsonpath;

/// `s` made safe for a terminal: every control character (ESC, BEL, CR, DEL, the C1
/// range) shown as `?`, so text a machine, a BMC or another API client wrote cannot move
/// the cursor, set the window title or hide lines. `keep_lines` keeps `\n` and `\t`
/// (multi-line output); table cells keep neither.
pub(crate) fn printable(s: &str, keep_lines: bool) -> std::borrow::Cow<'_, str> {
    let bad = |c: char| c.is_control() && !(keep_lines && matches!(c, '\n' | '\t'));
    if !s.chars().any(bad) {
        return std::borrow::Cow::Borrowed(s);
    }
    s.chars()
        .map(|c| if bad(c) { '?' } else { c })
        .collect::<String>()
        .into()
}

/// A value as kubectl prints it: strings raw, everything else as JSON.
pub(crate) fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `k=v,k2=v2` (sorted), or `<none>`: the `--show-labels` column.
pub(crate) fn labels_cell(o: &Value) -> String {
    match o.pointer("/metadata/labels").and_then(Value::as_object) {
        Some(m) if !m.is_empty() => {
            let mut kv: Vec<String> = m.iter().map(|(k, v)| format!("{k}={}", text(v))).collect();
            kv.sort();
            kv.join(",")
        }
        _ => "<none>".into(),
    }
}

fn cell(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => "<none>".into(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

/// `5m`, `3h`, `2d` as kubectl prints ages.
pub(crate) fn age(ts: Option<&str>) -> String {
    let Some(t) = ts.and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok()) else {
        return "<unknown>".into();
    };
    let s = (chrono::Utc::now() - t.with_timezone(&chrono::Utc))
        .num_seconds()
        .max(0);
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        7200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

impl Table {
    pub(crate) fn new(rt: &ResourceType, wide: bool, all_namespaces: bool) -> Table {
        let mut headers = Vec::new();
        let mut cols = Vec::new();
        let namespaced = rt.namespaced && all_namespaces;
        if namespaced {
            headers.push("NAMESPACE".to_string());
            cols.push(Col::Path(".metadata.namespace".to_string()));
        }
        headers.push("NAME".into());
        cols.push(Col::Name);
        for (h, p) in rt.cli_columns(wide) {
            headers.push(h);
            cols.push(Col::Path(p.to_string()));
        }
        headers.push("AGE".into());
        cols.push(Col::Age);
        let widths = headers.iter().map(|h| h.len()).collect();
        Table {
            headers,
            cols,
            namespaced,
            widths,
            printed_header: false,
            name_prefix: String::new(),
            no_headers: false,
        }
    }

    /// A LABELS column (`--show-labels`), last as kubectl's.
    pub(crate) fn show_labels(mut self) -> Table {
        self.headers.push("LABELS".into());
        self.cols.push(Col::Labels);
        self.widths.push("LABELS".len());
        self
    }

    /// Names printed as `PREFIX/name` (`get all`).
    pub(crate) fn name_prefix(mut self, p: &str) -> Table {
        self.name_prefix = format!("{p}/");
        self
    }

    /// No header line (`--no-headers`).
    pub(crate) fn no_headers(mut self, yes: bool) -> Table {
        self.no_headers = yes;
        self.printed_header = yes;
        self
    }

    fn cells(&self, o: &Value) -> Vec<String> {
        self.cols
            .iter()
            .map(|c| match c {
                Col::Name => format!(
                    "{}{}",
                    self.name_prefix,
                    cell(jsonpath(o, ".metadata.name"))
                ),
                Col::Path(p) => cell(jsonpath(o, p)),
                Col::Age => age(o
                    .pointer("/metadata/creationTimestamp")
                    .and_then(Value::as_str)),
                Col::Labels => labels_cell(o),
            })
            .map(|c| printable(&c, false).into_owned())
            .collect()
    }

    /// All rows, aligned, header first.
    pub(crate) fn render(&self, items: &[Value]) -> String {
        let header = (!self.no_headers).then(|| self.headers.clone());
        let rows: Vec<Vec<String>> = header
            .into_iter()
            .chain(items.iter().map(|o| self.cells(o)))
            .collect();
        let _ = self.namespaced;
        format_rows(&rows)
    }

    /// One row for a watch stream (header before the first).
    pub(crate) fn row_line(&mut self, o: &Value, deleted: bool) -> String {
        let mut cells = self.cells(o);
        if deleted {
            if let Some(i) = self.cols.iter().position(|c| matches!(c, Col::Age)) {
                cells[i] = format!("{} (deleted)", cells[i]);
            }
        }
        for (i, c) in cells.iter().enumerate() {
            self.widths[i] = self.widths[i].max(c.len() + 2);
        }
        let mut out = String::new();
        if !self.printed_header {
            self.printed_header = true;
            out.push_str(&line(&self.headers, &self.widths));
            out.push('\n');
        }
        out.push_str(&line(&cells, &self.widths));
        out
    }
}

/// Rows (header first) aligned in columns, one line each; cells through [`printable`].
pub(crate) fn format_rows(rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.iter().map(|c| printable(c, false).into_owned()).collect())
        .collect();
    let mut widths: Vec<usize> = Vec::new();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            if widths.len() <= i {
                widths.push(0);
            }
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in &rows {
        out.push_str(&line(r, &widths));
        out.push('\n');
    }
    out
}

fn line(cells: &[String], widths: &[usize]) -> String {
    let mut s = String::new();
    for (i, c) in cells.iter().enumerate() {
        if i + 1 == cells.len() {
            s.push_str(c);
        } else {
            s.push_str(&format!("{:<w$}   ", c, w = widths[i]));
        }
    }
    s.trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_never_carry_control_characters() {
        let rows = vec![
            vec!["HOSTNAME".to_string(), "X".to_string()],
            vec!["\u{1b}]0;owned\u{7}".to_string(), "a\nb\u{9b}".to_string()],
        ];
        let t = format_rows(&rows);
        assert!(!t.chars().any(|c| c.is_control() && c != '\n'), "{t:?}");
        assert!(t.contains("?]0;owned?"), "{t:?}");
        assert_eq!(t.lines().count(), 2, "{t:?}");
        assert_eq!(printable("a\tb\nc\u{1b}", true), "a\tb\nc?");
        assert!(matches!(
            printable("plain", false),
            std::borrow::Cow::Borrowed(_)
        ));
    }
}
