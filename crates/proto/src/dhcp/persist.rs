//! Crash-safe lease storage: an append-only, fdatasync'd text log
//! (`<state_dir>/dhcp-leases.log`), one record per line, compacted on start.
//!
//! Why not redb: the DHCP loop already batches every packet that arrived together
//! and makes the batch's changes durable with one `write` + one `fdatasync` before
//! sending any reply (group commit). An append log gives exactly that with one
//! syscall pair per batch and no B-tree copy-on-write pages, and a torn tail (crash
//! mid-write) is detected by the missing newline and cut off at load.
//!
//! Record format (space separated, one per line):
//! `P <ip> <mac> <expires-unix> <B|R|D> <hostname|->` or `F <ip>` (forget).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::leases::{Change, Lease, LeaseState};
use crate::model::ident::{parse_mac, MacFmt};

pub(crate) struct LeaseLog {
    file: File,
    path: PathBuf,
    /// Records appended since the last compaction.
    appended: usize,
}

fn clean_hostname(h: &str) -> Option<String> {
    let s: String = h
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
        .take(63)
        .collect();
    if s.is_empty() {
        None
    } else {
        Some(s)
    }
}

fn encode(c: &Change, out: &mut String) {
    use std::fmt::Write as _;
    match c {
        Change::Put(l) => {
            let st = match l.state {
                LeaseState::Bound | LeaseState::Offered => 'B',
                LeaseState::Released => 'R',
                LeaseState::Declined => 'D',
            };
            // Written piece by piece: this runs for every lease of every commit, and
            // `format!` of the MAC and the hostname was visible in profiles.
            let _ = write!(out, "P {} {} {} {} ", l.ip, MacFmt(&l.mac), l.expires, st);
            match l.hostname.as_deref().and_then(clean_hostname) {
                Some(h) => out.push_str(&h),
                None => out.push('-'),
            }
            out.push('\n');
        }
        Change::Forget(ip) => {
            let _ = writeln!(out, "F {ip}");
        }
    }
}

fn decode(line: &str) -> Option<Change> {
    let mut it = line.split(' ');
    match it.next()? {
        "P" => {
            let ip: Ipv4Addr = it.next()?.parse().ok()?;
            let mac = parse_mac(it.next()?).ok()?;
            let expires: u64 = it.next()?.parse().ok()?;
            let state = match it.next()? {
                "B" => LeaseState::Bound,
                "R" => LeaseState::Released,
                "D" => LeaseState::Declined,
                _ => return None,
            };
            let hostname = match it.next()? {
                "-" => None,
                h => Some(h.to_string()),
            };
            Some(Change::Put(Lease {
                ip,
                mac,
                hostname,
                expires,
                state,
            }))
        }
        "F" => Some(Change::Forget(it.next()?.parse().ok()?)),
        _ => None,
    }
}

/// Replace the log at `path` with just `live` (temp file, fsync, rename, directory
/// fsync) and open it for appending.
fn rewrite(path: &Path, live: &[Lease]) -> Result<File> {
    let tmp = path.with_extension("log.tmp");
    let mut text = String::new();
    for l in live {
        encode(&Change::Put(l.clone()), &mut text);
    }
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        let mut t = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .with_context(|| format!("writing {}", tmp.display()))?;
        t.write_all(text.as_bytes())
            .with_context(|| format!("writing {}", tmp.display()))?;
        t.sync_all()
            .with_context(|| format!("syncing {}", tmp.display()))?;
    }
    std::fs::rename(&tmp, path)
        .with_context(|| format!("replacing lease log {}", path.display()))?;
    sync_dir(path.parent().unwrap_or(Path::new(".")))?;
    OpenOptions::new()
        .append(true)
        .open(path)
        .with_context(|| format!("opening lease log {}", path.display()))
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing directory {}", dir.display()))
}

impl LeaseLog {
    /// Open (creating) the log, replay it, cut a torn tail, compact, and return
    /// the live leases. Leases that ended more than `keep_expired_secs` before `now` are dropped.
    pub(crate) fn open(
        path: &Path,
        now: u64,
        keep_expired_secs: u64,
    ) -> Result<(LeaseLog, Vec<Lease>)> {
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut leases: HashMap<Ipv4Addr, Lease> = HashMap::new();
        let mut bad = 0usize;
        if path.exists() {
            let mut f = File::open(path)
                .with_context(|| format!("reading lease log {}", path.display()))?;
            let mut buf = Vec::new();
            f.read_to_end(&mut buf)
                .with_context(|| format!("reading lease log {}", path.display()))?;
            let end = buf
                .iter()
                .rposition(|&b| b == b'\n')
                .map(|p| p + 1)
                .unwrap_or(0);
            if end < buf.len() {
                tracing::warn!(
                    bytes = buf.len() - end,
                    "lease log ends in a torn record; dropping it"
                );
            }
            for line in buf[..end].split(|&b| b == b'\n') {
                if line.is_empty() {
                    continue;
                }
                match std::str::from_utf8(line).ok().and_then(decode) {
                    Some(Change::Put(l)) => {
                        leases.insert(l.ip, l);
                    }
                    Some(Change::Forget(ip)) => {
                        leases.remove(&ip);
                    }
                    None => bad += 1,
                }
            }
            if bad > 0 {
                tracing::warn!(bad, "lease log has unreadable records; skipped");
            }
        }
        leases.retain(|_, l| l.expires.saturating_add(keep_expired_secs) > now);
        let mut live: Vec<Lease> = leases.into_values().collect();
        live.sort_by_key(|l| u32::from(l.ip));

        let log = LeaseLog {
            file: rewrite(path, &live)?,
            path: path.to_path_buf(),
            appended: 0,
        };
        Ok((log, live))
    }

    /// Append `changes` and fdatasync. Returns after the data is on disk.
    pub(crate) fn append(&mut self, changes: &[Change]) -> std::io::Result<()> {
        if changes.is_empty() {
            return Ok(());
        }
        let mut text = String::with_capacity(changes.len() * 64);
        for c in changes {
            encode(c, &mut text);
        }
        self.file.write_all(text.as_bytes())?;
        self.file.sync_data()?;
        self.appended += changes.len();
        Ok(())
    }

    /// Whether the log has grown enough that a rewrite pays off; `live` (the number of
    /// records a rewrite keeps, a scan of the table) is only asked once the log is large.
    pub(crate) fn wants_compaction(&self, live: impl FnOnce() -> usize) -> bool {
        self.appended > 100_000 && self.appended > 4 * live()
    }

    /// Rewrite the log with just `live` (crash-safe: temp file + rename).
    pub(crate) fn compact(&mut self, live: &[Lease]) -> Result<()> {
        self.file = rewrite(&self.path, live)?;
        self.appended = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(last: u8, mac: u8, exp: u64) -> Lease {
        Lease {
            ip: Ipv4Addr::new(10, 0, 0, last),
            mac: [mac; 6],
            hostname: Some("h x".into()),
            expires: exp,
            state: LeaseState::Bound,
        }
    }

    #[test]
    fn records_match_mac_fmt_and_read_back() {
        let mut l = lease(7, 0xab, 99);
        l.mac = [0x00, 0x0c, 0xf1, 0x10, 0x9a, 0xff];
        let mut text = String::new();
        encode(&Change::Put(l.clone()), &mut text);
        let want = format!("P 10.0.0.7 {} 99 B hx\n", MacFmt(&l.mac));
        assert_eq!(text, want);
        l.hostname = Some("hx".into());
        assert_eq!(decode(text.trim_end()), Some(Change::Put(l)));
    }

    #[test]
    fn replay_cuts_torn_tail_and_compacts() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("dhcp-leases.log");
        let (mut log, live) = LeaseLog::open(&p, 100, 0).unwrap();
        assert!(live.is_empty());
        log.append(&[
            Change::Put(lease(1, 1, 1000)),
            Change::Put(lease(2, 2, 1000)),
            Change::Forget(Ipv4Addr::new(10, 0, 0, 2)),
        ])
        .unwrap();
        log.append(&[Change::Put(lease(3, 3, 50))]).unwrap();
        drop(log);
        // simulate a crash mid-write
        let mut f = OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(b"P 10.0.0.9 09:09:09:09").unwrap();
        drop(f);
        let (mut log, live) = LeaseLog::open(&p, 100, 0).unwrap();
        assert_eq!(live.len(), 1, "{live:?}");
        assert_eq!(live[0].ip, Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(live[0].hostname.as_deref(), Some("hx"));
        log.append(&[Change::Put(lease(4, 4, 1000))]).unwrap();
        drop(log);
        let (_, live) = LeaseLog::open(&p, 100, 0).unwrap();
        assert_eq!(live.len(), 2);
        let text = std::fs::read_to_string(&p).unwrap();
        assert_eq!(text.lines().count(), 2, "compacted: {text}");
    }
}
