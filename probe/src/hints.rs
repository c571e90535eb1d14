//! Root device hints (Ironic's and Metal3's `rootDeviceHints`): which whole disk
//! `bootplane probe install` writes the image to. Pure: [`Hints::parse`] reads the
//! untrusted JSON (at most [`MAX_HINTS`] bytes, known keys only), [`check`] compares one
//! disk's facts ([`DiskFacts`], read by the caller from sysfs) with the hints, and
//! [`choose`] wants exactly one disk to match every given hint.
//!
//! Keys: `name` (`/dev/sda`, or a `/dev/disk/by-path/...` link), `wwn`, `serial`,
//! `vendor`, `model`, `size` (GiB, the disk's size rounded down, as Ironic does: a plain
//! integer, or a string with one of Ironic's operators `==`, `!=`, `>=`, `<=`, `>`, `<`
//! before an integer), `rotational` (bool) and `by_path`. `wwn` is compared without its
//! `0x`/`naa.`/`eui.` prefix and case; `vendor` and `model` match a case-insensitive
//! substring of the disk's (sysfs pads them with spaces); the others must be equal.

use serde::{Deserialize, Serialize};

/// Longest hints document accepted.
pub const MAX_HINTS: usize = 4096;
/// Longest string value accepted.
const MAX_VALUE: usize = 255;

/// A `size` hint: an operator and a number of GiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SizeHint {
    pub op: Op,
    pub gib: u64,
}

/// Ironic's numeric operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Op {
    #[serde(rename = "==")]
    Eq,
    #[serde(rename = "!=")]
    Ne,
    #[serde(rename = ">=")]
    Ge,
    #[serde(rename = "<=")]
    Le,
    #[serde(rename = ">")]
    Gt,
    #[serde(rename = "<")]
    Lt,
}

impl Op {
    fn holds(self, have: u64, want: u64) -> bool {
        match self {
            Op::Eq => have == want,
            Op::Ne => have != want,
            Op::Ge => have >= want,
            Op::Le => have <= want,
            Op::Gt => have > want,
            Op::Lt => have < want,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Op::Eq => "==",
            Op::Ne => "!=",
            Op::Ge => ">=",
            Op::Le => "<=",
            Op::Gt => ">",
            Op::Lt => "<",
        }
    }
}

/// A `size` value as written: an integer or a string with an operator.
#[derive(Deserialize)]
#[serde(untagged)]
enum SizeValue {
    Int(u64),
    Text(String),
}

/// The hints as given (every one optional; at least one is required).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    wwn: Option<String>,
    #[serde(default)]
    serial: Option<String>,
    #[serde(default)]
    vendor: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    size: Option<serde_json::Value>,
    #[serde(default)]
    rotational: Option<bool>,
    #[serde(default)]
    by_path: Option<String>,
}

/// Parsed root device hints.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Hints {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wwn: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vendor: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<SizeHint>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rotational: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by_path: Option<String>,
}

/// Parse a `size` string: `"10"`, `"== 10"`, `">=10"`, ...
fn parse_size(s: &str) -> Result<SizeHint, String> {
    let t = s.trim();
    let ops = [
        ("==", Op::Eq),
        ("!=", Op::Ne),
        (">=", Op::Ge),
        ("<=", Op::Le),
        (">", Op::Gt),
        ("<", Op::Lt),
    ];
    let (op, rest) = ops
        .iter()
        .find_map(|(p, op)| t.strip_prefix(p).map(|r| (*op, r)))
        .unwrap_or((Op::Eq, t));
    let n = rest.trim();
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) || n.len() > 12 {
        return Err(format!(
            "size hint {s:?}: want a number of GiB, optionally after one of == != >= <= > <"
        ));
    }
    Ok(SizeHint {
        op,
        gib: n
            .parse()
            .map_err(|_| format!("size hint {s:?}: not a number"))?,
    })
}

impl Hints {
    /// Parse a hints document (untrusted: bounded, unknown keys refused).
    pub fn parse(bytes: &[u8]) -> Result<Hints, String> {
        if bytes.len() > MAX_HINTS {
            return Err(format!(
                "root device hints are {} bytes, at most {MAX_HINTS} are accepted",
                bytes.len()
            ));
        }
        let raw: Raw =
            serde_json::from_slice(bytes).map_err(|e| format!("root device hints: {e}"))?;
        let size = match raw.size {
            None => None,
            Some(v) => match serde_json::from_value::<SizeValue>(v) {
                Ok(SizeValue::Int(n)) => Some(SizeHint { op: Op::Eq, gib: n }),
                Ok(SizeValue::Text(s)) => Some(parse_size(&s)?),
                Err(_) => {
                    return Err(
                        "size hint: want a non-negative integer or a string such as \">= 10\""
                            .into(),
                    )
                }
            },
        };
        let h = Hints {
            name: raw.name,
            wwn: raw.wwn,
            serial: raw.serial,
            vendor: raw.vendor,
            model: raw.model,
            size,
            rotational: raw.rotational,
            by_path: raw.by_path,
        };
        for (k, v) in h.strings() {
            if v.is_empty() || v.len() > MAX_VALUE || v.chars().any(char::is_control) {
                return Err(format!(
                    "{k} hint: want 1 to {MAX_VALUE} printable characters"
                ));
            }
        }
        if h == Hints::default() {
            return Err("root device hints: no hint given".into());
        }
        Ok(h)
    }

    fn strings(&self) -> Vec<(&'static str, &str)> {
        [
            ("name", &self.name),
            ("wwn", &self.wwn),
            ("serial", &self.serial),
            ("vendor", &self.vendor),
            ("model", &self.model),
            ("by_path", &self.by_path),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.as_deref().map(|v| (k, v)))
        .collect()
    }
}

/// What the agent knows of one whole disk (from `/sys/block` and `/dev/disk/by-path`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiskFacts {
    /// `/dev/NAME`.
    pub path: String,
    pub size_bytes: u64,
    pub wwn: Option<String>,
    pub serial: Option<String>,
    pub vendor: Option<String>,
    pub model: Option<String>,
    pub rotational: Option<bool>,
    /// The `/dev/disk/by-path/...` links naming the disk (none without udev).
    #[serde(default)]
    pub by_path: Vec<String>,
}

/// `wwn` without its `0x`, `naa.`, `eui.` prefix, lowercased.
fn norm_wwn(s: &str) -> String {
    let s = s.trim().to_ascii_lowercase();
    ["0x", "naa.", "eui.", "t10."]
        .iter()
        .find_map(|p| s.strip_prefix(p))
        .unwrap_or(&s)
        .to_string()
}

/// The disk's size in whole GiB (rounded down, as Ironic's).
pub fn gib(bytes: u64) -> u64 {
    bytes >> 30
}

/// One hint against one disk: `Ok(why it matched)` or `Err(why not)`.
type Verdict = Result<String, String>;

fn text(key: &str, want: &str, have: Option<&str>, substring: bool) -> Verdict {
    let Some(have) = have else {
        return Err(format!("{key}: the disk has none (want {want:?})"));
    };
    let ok = if substring {
        have.to_ascii_lowercase()
            .contains(want.trim().to_ascii_lowercase().as_str())
    } else {
        have.trim() == want.trim()
    };
    match ok {
        true => Ok(format!("{key} {have:?}")),
        false => Err(format!("{key} is {have:?}, not {want:?}")),
    }
}

/// Every given hint against `d`: the reasons it matched, or every reason it did not.
pub fn check(d: &DiskFacts, h: &Hints) -> Result<Vec<String>, Vec<String>> {
    let mut verdicts: Vec<Verdict> = Vec::new();
    if let Some(n) = &h.name {
        let ok = *n == d.path || d.by_path.iter().any(|p| p == n);
        verdicts.push(match ok {
            true => Ok(format!("name {n:?}")),
            false => Err(format!("name is {:?}, not {n:?}", d.path)),
        });
    }
    if let Some(w) = &h.wwn {
        verdicts.push(match &d.wwn {
            Some(have) if norm_wwn(have) == norm_wwn(w) => Ok(format!("wwn {have:?}")),
            Some(have) => Err(format!("wwn is {have:?}, not {w:?}")),
            None => Err(format!("wwn: the disk has none (want {w:?})")),
        });
    }
    if let Some(s) = &h.serial {
        verdicts.push(text("serial", s, d.serial.as_deref(), false));
    }
    if let Some(v) = &h.vendor {
        verdicts.push(text("vendor", v, d.vendor.as_deref(), true));
    }
    if let Some(m) = &h.model {
        verdicts.push(text("model", m, d.model.as_deref(), true));
    }
    if let Some(s) = h.size {
        let have = gib(d.size_bytes);
        let what = format!("size {have} GiB {} {}", s.op.as_str(), s.gib);
        verdicts.push(match s.op.holds(have, s.gib) {
            true => Ok(what),
            false => Err(format!("{what} does not hold")),
        });
    }
    if let Some(r) = h.rotational {
        verdicts.push(match d.rotational {
            Some(have) if have == r => Ok(format!("rotational {r}")),
            Some(have) => Err(format!("rotational is {have}, not {r}")),
            None => Err("rotational: unknown for this disk".into()),
        });
    }
    if let Some(p) = &h.by_path {
        verdicts.push(match d.by_path.iter().any(|x| x == p) {
            true => Ok(format!("by_path {p:?}")),
            false if d.by_path.is_empty() => Err(format!(
                "by_path: the disk has no by-path link (want {p:?})"
            )),
            false => Err(format!("by_path is {:?}, not {p:?}", d.by_path)),
        });
    }
    let (ok, bad): (Vec<Verdict>, Vec<Verdict>) = verdicts.into_iter().partition(Result::is_ok);
    match bad.is_empty() {
        true => Ok(ok.into_iter().filter_map(Result::ok).collect()),
        false => Err(bad.into_iter().filter_map(Result::err).collect()),
    }
}

/// The one disk matching every hint: its index and why it matched; the error names
/// every candidate and why it did not match (none matched), or the ones that did (two
/// or more).
pub fn choose(disks: &[DiskFacts], h: &Hints) -> Result<(usize, Vec<String>), String> {
    let verdicts: Vec<_> = disks.iter().map(|d| check(d, h)).collect();
    let matched: Vec<usize> = (0..disks.len()).filter(|&i| verdicts[i].is_ok()).collect();
    match matched.as_slice() {
        [i] => Ok((*i, verdicts[*i].clone().unwrap_or_default())),
        [] if disks.is_empty() => Err("no candidate disk found".into()),
        [] => Err(format!(
            "no disk matches the root device hints: {}",
            disks
                .iter()
                .zip(&verdicts)
                .map(|(d, v)| format!(
                    "{} ({})",
                    d.path,
                    v.clone().err().unwrap_or_default().join(", ")
                ))
                .collect::<Vec<_>>()
                .join("; ")
        )),
        many => Err(format!(
            "{} disks match the root device hints, want exactly one: {}",
            many.len(),
            many.iter()
                .map(|&i| format!(
                    "{} ({})",
                    disks[i].path,
                    verdicts[i].clone().unwrap_or_default().join(", ")
                ))
                .collect::<Vec<_>>()
                .join("; ")
        )),
    }
}

#[cfg(test)]
#[path = "hints_tests.rs"]
mod tests;
