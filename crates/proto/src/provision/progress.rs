//! Tolerant parser for the JSON progress lines `bootplane provision` writes on stderr.
//!
//! The contract with the streamer (`crate::image`) is deliberately loose, so either side can
//! add fields without breaking the other:
//!
//! - one JSON object per line; lines that are not JSON objects (log lines, a TTY
//!   progress bar) are kept only as the "last message" for failure reasons;
//! - `bytes` (alias `written`, `bytes_written`, `done`): bytes written so far;
//! - `total` (alias `total_bytes`, `size`): bytes expected, when known;
//! - `rate` (alias `rate_bps`, `bytes_per_sec`): bytes per second;
//! - `stage` (alias `phase`, `state`): free text such as `read`, `write`, `verify`,
//!   `done`, `error`;
//! - `error` / `reason` / `message` (string): kept as the failure reason when the line
//!   has `stage: "error"`, `level: "error"`, or an `error` field;
//! - numbers may be integers, floats or numeric strings; anything else (`null`), and
//!   every unknown field (`eta`, `elapsed`, `code`, `class`, `sha256`, ...), is ignored.
//!
//! The streamer's own schema (`image::progress`: `stage` open/resume/copy/
//! finalize/done/error, `bytes`, `total` or null, `rate`, `eta`, `elapsed`, and on error
//! `code`/`class`/`error`) is a subset of this; see the `streamer_lines` test.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Latest progress of a job.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    pub bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total: Option<u64>,
    /// Bytes per second, as last reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
}

/// What one stderr line contributed.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    /// A progress object (fields not present are `None`).
    Progress {
        bytes: Option<u64>,
        total: Option<u64>,
        rate: Option<f64>,
        stage: Option<String>,
        error: Option<String>,
    },
    /// Anything else (trimmed, non-empty).
    Text(String),
    Empty,
}

fn num(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn first<'a>(o: &'a serde_json::Map<String, Value>, keys: &[&str]) -> Option<&'a Value> {
    keys.iter().find_map(|k| o.get(*k))
}

fn count(v: Option<&Value>) -> Option<u64> {
    v.and_then(num)
        .filter(|f| f.is_finite() && *f >= 0.0)
        .map(|f| f as u64)
}

/// Parse one line (never fails).
pub fn parse_line(line: &str) -> Line {
    let t = line.trim();
    if t.is_empty() {
        return Line::Empty;
    }
    if !t.starts_with('{') {
        return Line::Text(t.to_string());
    }
    let Ok(Value::Object(o)) = serde_json::from_str::<Value>(t) else {
        return Line::Text(t.to_string());
    };
    let stage = first(&o, &["stage", "phase", "state"])
        .and_then(Value::as_str)
        .map(String::from);
    let is_error = stage
        .as_deref()
        .is_some_and(|s| s.eq_ignore_ascii_case("error") || s.eq_ignore_ascii_case("failed"))
        || o.get("level")
            .and_then(Value::as_str)
            .is_some_and(|l| l.eq_ignore_ascii_case("error"))
        || o.get("error").is_some_and(|e| e.is_string());
    let error = if is_error {
        first(&o, &["error", "reason", "message", "msg"])
            .and_then(Value::as_str)
            .map(String::from)
    } else {
        None
    };
    Line::Progress {
        bytes: count(first(&o, &["bytes", "written", "bytes_written", "done"])),
        total: count(first(&o, &["total", "total_bytes", "size"])),
        rate: first(&o, &["rate", "rate_bps", "bytes_per_sec"])
            .and_then(num)
            .filter(|f| f.is_finite() && *f >= 0.0),
        stage,
        error,
    }
}

impl Progress {
    /// Fold a parsed line in; returns an error message the line carried, if any.
    pub fn apply(&mut self, line: &Line) -> Option<String> {
        if let Line::Progress {
            bytes,
            total,
            rate,
            stage,
            error,
        } = line
        {
            if let Some(b) = bytes {
                self.bytes = *b;
            }
            if total.is_some() {
                self.total = *total;
            }
            if rate.is_some() {
                self.rate = *rate;
            }
            if stage.is_some() {
                self.stage = stage.clone();
            }
            return error.clone();
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_fields_and_aliases() {
        let mut p = Progress::default();
        p.apply(&parse_line(r#"{"stage":"write","bytes":1048576,"total":4194304,"rate":52428800.5,"eta":3.2,"frame":7}"#));
        assert_eq!(
            p,
            Progress {
                bytes: 1 << 20,
                total: Some(4 << 20),
                rate: Some(52428800.5),
                stage: Some("write".into())
            }
        );
        p.apply(&parse_line(r#"{"written":"2097152","size":4194304.0}"#));
        assert_eq!(p.bytes, 2 << 20);
        assert_eq!(p.stage.as_deref(), Some("write"));
        p.apply(&parse_line(r#"{"phase":"verify"}"#));
        assert_eq!(p.stage.as_deref(), Some("verify"));
        assert_eq!(p.bytes, 2 << 20);
    }

    #[test]
    fn streamer_lines() {
        let mut p = Progress::default();
        for l in [
            r#"{"stage":"open","bytes":0,"total":null,"rate":0.0,"eta":null,"elapsed":0.01}"#,
            r#"{"stage":"copy","bytes":123,"total":456,"rate":1.2e9,"eta":0.5,"elapsed":1.0}"#,
            r#"{"stage":"resume","bytes":200,"total":456,"rate":0.0,"eta":null,"elapsed":1.1}"#,
        ] {
            assert_eq!(p.apply(&parse_line(l)), None);
        }
        assert_eq!(
            p,
            Progress {
                bytes: 200,
                total: Some(456),
                rate: Some(0.0),
                stage: Some("resume".into())
            }
        );
        let e = p.apply(&parse_line(
            r#"{"stage":"error","bytes":300,"total":456,"rate":1e9,"eta":null,"elapsed":2.0,"code":13,"class":"integrity","error":"verification failed: frame 3 sha256 mismatch"}"#,
        ));
        assert_eq!(
            e.as_deref(),
            Some("verification failed: frame 3 sha256 mismatch")
        );
        assert_eq!(p.bytes, 300);
        let done = r#"{"stage":"done","bytes":456,"total":456,"rate":1e9,"eta":0,"elapsed":2.5,"sha256":"ab","cpu":{"read":0.1}}"#;
        assert_eq!(p.apply(&parse_line(done)), None);
        assert_eq!((p.bytes, p.stage.as_deref()), (456, Some("done")));
    }

    #[test]
    fn errors_and_noise() {
        let mut p = Progress::default();
        let e = p.apply(&parse_line(
            r#"{"stage":"error","message":"sha256 mismatch: expected ab, got cd"}"#,
        ));
        assert_eq!(e.as_deref(), Some("sha256 mismatch: expected ab, got cd"));
        assert_eq!(
            p.apply(&parse_line(
                r#"{"level":"info","message":"opening source"}"#
            )),
            None
        );
        assert_eq!(parse_line("   "), Line::Empty);
        assert_eq!(
            parse_line("Error: disk too small"),
            Line::Text("Error: disk too small".into())
        );
        assert_eq!(parse_line("{not json"), Line::Text("{not json".into()));
        assert_eq!(parse_line("[1,2]"), Line::Text("[1,2]".into()));
        // Bad values are ignored, not fatal.
        let l = parse_line(r#"{"bytes":-5,"total":"lots","rate":null,"stage":7}"#);
        assert_eq!(
            l,
            Line::Progress {
                bytes: None,
                total: None,
                rate: None,
                stage: None,
                error: None
            }
        );
        let l = parse_line(r#"{"error":"nfs: connection refused"}"#);
        assert!(
            matches!(l, Line::Progress { error: Some(ref e), .. } if e == "nfs: connection refused")
        );
    }
}
