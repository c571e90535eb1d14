//! Process figures the benchmarks print, read from `/proc`.

/// CPU seconds (utime + stime, all threads) of process `pid`; 0 if it is gone.
pub fn proc_cpu(pid: i32) -> f64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the `(comm)`: state is field 3, utime 14, stime 15.
    let rest = text.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let ticks: u64 = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse::<u64>().ok())
        .sum();
    // SAFETY: sysconf has no preconditions.
    ticks as f64 / (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).max(1) as f64
}
