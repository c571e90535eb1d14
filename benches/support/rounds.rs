//! Interleaved rounds, medians, spreads and goal lines: one implementation for every
//! bench that compares bootplane with a peer.
//!
//! A figure taken on a shared machine drifts with the load, so a bench runs its sides
//! alternately (A B A B ..., [`interleave`]) and quotes, for each side and for the
//! per-round ratio, the median and the spread (min-max) ([`Stat`], [`Pair`]). Every goal
//! the bench has is printed with [`goal`], met or not, and [`load`] is printed beside
//! every figure.
#![allow(dead_code)]

use std::fmt;

/// Median and spread of a set of samples.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Stat {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

impl Stat {
    /// The median (the mean of the middle two for an even count), min and max of `v`;
    /// all zero when `v` is empty.
    pub fn of(v: &[f64]) -> Stat {
        if v.is_empty() {
            return Stat::default();
        }
        let mut s = v.to_vec();
        s.sort_by(|a, b| a.total_cmp(b));
        let n = s.len();
        let median = if n % 2 == 1 {
            s[n / 2]
        } else {
            (s[n / 2 - 1] + s[n / 2]) / 2.0
        };
        Stat {
            median,
            min: s[0],
            max: s[n - 1],
            n,
        }
    }

    /// `median (min-max)` with `prec` decimals.
    pub fn fmt(&self, prec: usize) -> String {
        format!(
            "{:.p$} ({:.p$}-{:.p$})",
            self.median,
            self.min,
            self.max,
            p = prec
        )
    }
}

impl fmt::Display for Stat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let prec = if self.median.abs() >= 100.0 {
            0
        } else if self.median.abs() >= 1.0 {
            2
        } else {
            4
        };
        write!(f, "{}", Stat::fmt(self, prec))
    }
}

/// Run `rounds` rounds of A then B (A B A B ...), returning each side's results in
/// round order: load that drifts during the run lands on both sides alike.
pub fn interleave<A, B>(
    rounds: usize,
    mut a: impl FnMut(usize) -> A,
    mut b: impl FnMut(usize) -> B,
) -> (Vec<A>, Vec<B>) {
    let mut ra = Vec::with_capacity(rounds);
    let mut rb = Vec::with_capacity(rounds);
    for r in 0..rounds {
        ra.push(a(r));
        rb.push(b(r));
    }
    (ra, rb)
}

/// One figure measured on both sides in the same rounds.
#[derive(Debug, Clone)]
pub struct Pair {
    pub what: String,
    pub unit: String,
    pub a_name: String,
    pub b_name: String,
    pub a: Vec<f64>,
    pub b: Vec<f64>,
}

impl Pair {
    pub fn new(what: &str, unit: &str, a_name: &str, b_name: &str) -> Pair {
        Pair {
            what: what.into(),
            unit: unit.into(),
            a_name: a_name.into(),
            b_name: b_name.into(),
            a: Vec::new(),
            b: Vec::new(),
        }
    }

    /// The per-round ratios A/B (rounds where B is 0 are left out).
    pub fn ratios(&self) -> Vec<f64> {
        self.a
            .iter()
            .zip(&self.b)
            .filter(|(_, b)| **b != 0.0)
            .map(|(a, b)| a / b)
            .collect()
    }

    pub fn a_stat(&self) -> Stat {
        Stat::of(&self.a)
    }

    pub fn b_stat(&self) -> Stat {
        Stat::of(&self.b)
    }

    /// Median and spread of the per-round ratio A/B.
    pub fn ratio(&self) -> Stat {
        Stat::of(&self.ratios())
    }

    /// `what: A median (min-max) unit | B median (min-max) | A/B median (min-max), n rounds`
    pub fn line(&self) -> String {
        format!(
            "{}: {} {} {} | {} {} {} | {}/{} {} per round, {} rounds",
            self.what,
            self.a_name,
            self.a_stat(),
            self.unit,
            self.b_name,
            self.b_stat(),
            self.unit,
            self.a_name,
            self.b_name,
            self.ratio().fmt(2),
            self.a.len().min(self.b.len())
        )
    }

    pub fn print(&self) {
        println!("{}", self.line());
    }

    /// A row for docs/benchmarks.md's table: bench, bootplane median, peer median,
    /// ratio and spread, date, load, command.
    pub fn table_row(&self, command: &str) -> String {
        format!(
            "| {} | {} {} | {}: {} {} | {} | {} | {} | `{}` |",
            self.what,
            self.a_stat(),
            self.unit,
            self.b_name,
            self.b_stat(),
            self.unit,
            self.ratio().fmt(2),
            now_utc(),
            load(),
            command
        )
    }
}

/// Print `goal WHAT: met` or `goal WHAT: NOT met (DETAIL)`; returns `met`.
pub fn goal(what: &str, met: bool, detail: &str) -> bool {
    if met {
        println!("goal {what}: met ({detail})");
    } else {
        println!("goal {what}: NOT met ({detail})");
    }
    met
}

/// The load average (1, 5, 15 minutes) as printed by `uptime`.
pub fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// `YYYY-MM-DD HH:MM` UTC, from the system clock.
pub fn now_utc() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}",
        rem / 3600,
        (rem % 3600) / 60
    )
}

/// Print the machine line every bench ends with: cores and load average.
pub fn print_machine() {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    println!(
        "machine: {cores} cores, load average {}, {} UTC",
        load(),
        now_utc()
    );
}
