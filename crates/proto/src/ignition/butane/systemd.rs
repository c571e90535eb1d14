//! The `systemd` section (units, drop-ins, `contents_local`) and systemd's path
//! escaping, which the mount units of `storage` use too.

use super::*;

impl Tx<'_> {
    pub(super) fn systemd(&mut self, s: &Systemd) -> Vec<Value> {
        let mut out = Vec::new();
        for (i, u) in s.units.iter().flatten().enumerate() {
            let at = format!("systemd.units[{i}]");
            let mut m = Map::new();
            m.insert("name".into(), json!(u.name));
            put(&mut m, "enabled", u.enabled.map(Value::Bool));
            put(&mut m, "mask", u.mask.map(Value::Bool));
            let contents = self.text(&u.contents, &u.contents_local, &at);
            put(&mut m, "contents", contents.map(Value::String));
            if let Some(d) = &u.dropins {
                let mut v = Vec::new();
                for (j, x) in d.iter().enumerate() {
                    let dat = format!("{at}.dropins[{j}]");
                    let mut dm = Map::new();
                    dm.insert("name".into(), json!(x.name));
                    let c = self.text(&x.contents, &x.contents_local, &dat);
                    put(&mut dm, "contents", c.map(Value::String));
                    v.push(Value::Object(dm));
                }
                m.insert("dropins".into(), Value::Array(v));
            }
            out.push(Value::Object(m));
        }
        out
    }

    /// Unit/drop-in text from `contents` or `contents_local` (fcos 1.6+).
    fn text(
        &mut self,
        inline: &Option<String>,
        local: &Option<String>,
        at: &str,
    ) -> Option<String> {
        match (inline, local) {
            (Some(_), Some(_)) => {
                self.issue(at, "only one of contents and contents_local may be given");
                None
            }
            (Some(c), None) => Some(c.clone()),
            (None, Some(l)) => {
                let p = format!("{at}.contents_local");
                self.need(true, &p, IgnVersion::V3_5);
                let data = self.local(l, &p)?;
                match String::from_utf8(data) {
                    Ok(s) => Some(s),
                    Err(_) => {
                        self.issue(p, "unit file is not utf-8");
                        None
                    }
                }
            }
            (None, None) => None,
        }
    }
}

/// `systemd-escape --path`: `/var/lib/x-y` → `var-lib-x\x2dy`.
pub fn systemd_escape_path(p: &str) -> String {
    let t = p.trim_matches('/');
    if t.is_empty() {
        return "-".to_string();
    }
    let mut out = String::new();
    for (i, seg) in t.split('/').filter(|s| !s.is_empty()).enumerate() {
        if i > 0 {
            out.push('-');
        }
        for (j, b) in seg.bytes().enumerate() {
            let keep = b.is_ascii_alphanumeric()
                || b == b'_'
                || b == b':'
                || (b == b'.' && !(i == 0 && j == 0));
            if keep {
                out.push(b as char);
            } else {
                out.push_str(&format!("\\x{b:02x}"));
            }
        }
    }
    out
}
