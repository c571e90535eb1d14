//! Process figures the benchmarks print, read from `/proc`: one reader for every bench.
#![allow(dead_code)]

/// Clock ticks per second (the unit of `/proc/PID/stat`'s CPU times).
pub fn clk_tck() -> f64 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).max(1) as f64
}

/// utime + stime (all threads) of process `pid` in clock ticks; `None` if it is gone.
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the `(comm)`: state is field 3, utime 14, stime 15.
    let rest = text.rsplit_once(')')?.1;
    let mut f = rest.split_whitespace().skip(11);
    Some(f.next()?.parse::<u64>().ok()? + f.next()?.parse::<u64>().ok()?)
}

/// (utime, stime) of process `pid` (all threads) in seconds; `None` if it is gone.
pub fn cpu_split(pid: u32) -> Option<(f64, f64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = text.rsplit_once(')')?.1;
    let mut f = rest.split_whitespace().skip(11);
    let u = f.next()?.parse::<u64>().ok()? as f64 / clk_tck();
    let s = f.next()?.parse::<u64>().ok()? as f64 / clk_tck();
    Some((u, s))
}

/// CPU seconds (utime + stime, all threads) of process `pid`; 0 if it is gone.
pub fn proc_cpu(pid: u32) -> f64 {
    cpu_ticks(pid).unwrap_or(0) as f64 / clk_tck()
}

/// A `/proc/PID/status` figure in KiB (`key` with its colon, e.g. `"VmRSS:"`).
pub fn status_kib(pid: u32, key: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// The children of `pid`'s main thread (nginx's workers).
pub fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .map(|c| {
            c.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}
