//! `bootplane probe`: the command (hand-parsed arguments, no clap, so the static agent
//! stays small). Collects the inventory, adds the runtime facts (IP addresses, the
//! architecture, LLDP neighbours), then prints it (`--print`) or posts it to the URL from
//! `--url` or the kernel command line (`bootplane.inventory=`), and with `--poweroff`
//! powers the machine off once bootplane has accepted it.
//!
//! `bootplane probe wipe ...` is [`crate::wipe::run`] and `bootplane probe install ...`
//! [`crate::install::run`] (their own arguments and exit status).
//!
//! Exit status: 0 accepted (or printed, or `--help`), 1 refused (4xx) or deadline passed,
//! 2 usage.

use std::path::PathBuf;
use std::time::Duration;

use crate::http::{self, Outcome};
use crate::inventory::Inventory;
pub use crate::sys::{cmdline_value, read_cmdline};

/// Usage text.
pub const USAGE: &str = "usage: bootplane probe [--url URL] [--root DIR] [--lldp-wait SECS] \
[--deadline SECS] [--print] [--poweroff]\n       bootplane probe wipe --help\n       \
bootplane probe install --help";

/// Default LLDP listen window.
pub const DEFAULT_LLDP_WAIT: u64 = 10;
/// Default time to keep retrying the post.
pub const DEFAULT_DEADLINE: u64 = http::DEFAULT_DEADLINE;

/// Parsed arguments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Args {
    pub url: Option<String>,
    pub root: Option<PathBuf>,
    pub lldp_wait: Option<u64>,
    pub deadline: Option<u64>,
    pub print: bool,
    pub poweroff: bool,
}

/// Parse the arguments after `probe` (a leading `probe` is accepted and skipped).
pub fn parse_args(args: &[String]) -> Result<Args, String> {
    let mut a = Args::default();
    let mut it = args.iter().peekable();
    if it.peek().map(|s| s.as_str()) == Some("probe") {
        it.next();
    }
    while let Some(arg) = it.next() {
        let (key, inline) = match arg.split_once('=') {
            Some((k, v)) if k.starts_with("--") => (k, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        let mut value = |name: &str| -> Result<String, String> {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        let secs = |name: &str, v: String| {
            v.parse::<u64>()
                .map_err(|_| format!("{name}: not a number of seconds: {v:?}"))
        };
        match key {
            "--url" => a.url = Some(value("--url")?),
            "--root" => a.root = Some(PathBuf::from(value("--root")?)),
            "--lldp-wait" => a.lldp_wait = Some(secs("--lldp-wait", value("--lldp-wait")?)?),
            "--deadline" => a.deadline = Some(secs("--deadline", value("--deadline")?)?),
            "--print" if inline.is_none() => a.print = true,
            "--poweroff" if inline.is_none() => a.poweroff = true,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(a)
}

/// Run the command; returns the exit status.
pub fn run(args: &[String]) -> i32 {
    let rest = match args.first().map(String::as_str) {
        Some("probe") => &args[1..],
        _ => args,
    };
    if rest.first().map(String::as_str) == Some("wipe") {
        return crate::wipe::run(&rest[1..]);
    }
    if rest.first().map(String::as_str) == Some("install") {
        return crate::install::run(&rest[1..]);
    }
    let a = match parse_args(args) {
        Ok(a) => a,
        Err(e) if e.is_empty() => {
            println!("{USAGE}");
            return 0;
        }
        Err(e) => {
            eprintln!("bootplane probe: {e}\n{USAGE}");
            return 2;
        }
    };
    let cmdline = read_cmdline();
    let url = a
        .url
        .clone()
        .or_else(|| cmdline_value(&cmdline, "bootplane.inventory"));
    let url = match (&url, a.print) {
        (_, true) => None,
        (Some(u), false) => match http::parse_url(u) {
            Ok(u) => Some(u),
            Err(e) => {
                eprintln!("bootplane probe: {e}");
                return 2;
            }
        },
        (None, false) => {
            eprintln!("bootplane probe: no url: pass --url or boot with bootplane.inventory=URL (or use --print)");
            return 2;
        }
    };
    let lldp_wait = a
        .lldp_wait
        .or_else(|| cmdline_value(&cmdline, "bootplane.lldp_wait").and_then(|v| v.parse().ok()))
        .unwrap_or(DEFAULT_LLDP_WAIT);
    let root = a.root.clone().unwrap_or_else(|| PathBuf::from("/"));
    let inv = gather(&root, Duration::from_secs(lldp_wait));
    let body = serde_json::to_vec(&inv).expect("an inventory always serializes");
    let Some(url) = url else {
        println!(
            "{}",
            serde_json::to_string_pretty(&inv).expect("an inventory always serializes")
        );
        return 0;
    };
    eprintln!(
        "bootplane probe: posting the inventory of {} ({} nics, {} disks) to {}:{}",
        inv.system_uuid,
        inv.nics.len(),
        inv.disks.len(),
        url.host,
        url.port
    );
    let deadline = Duration::from_secs(a.deadline.unwrap_or(DEFAULT_DEADLINE));
    match http::post(&url, &body, deadline, |m| eprintln!("bootplane probe: {m}")) {
        Outcome::Accepted(code) => {
            eprintln!("bootplane probe: inventory accepted ({code})");
            if a.poweroff {
                power_off();
            }
            0
        }
        Outcome::Refused(code, reason) => {
            eprintln!("bootplane probe: inventory refused ({code}): {reason}; not retrying");
            1
        }
        Outcome::GaveUp(why) => {
            eprintln!(
                "bootplane probe: gave up after {}s: {why}",
                deadline.as_secs()
            );
            1
        }
    }
}

/// The inventory of `root` plus the runtime facts of this machine.
pub fn gather(root: &std::path::Path, lldp_wait: Duration) -> Inventory {
    let mut inv = crate::collect::inventory(root);
    let arch = crate::sys::architecture();
    for c in &mut inv.cpus {
        c.architecture = arch.clone();
    }
    let addrs = crate::sys::interface_addresses();
    for n in &mut inv.nics {
        n.ips = addrs.get(&n.name).cloned().unwrap_or_default();
    }
    let ifaces: Vec<(i32, String)> = inv
        .nics
        .iter()
        .filter_map(|n| Some((crate::sys::ifindex(&n.name)?, n.name.clone())))
        .collect();
    match crate::lldp::listen(&ifaces, lldp_wait) {
        Ok(mut heard) => {
            for n in &mut inv.nics {
                n.neighbors = heard.remove(&n.name).unwrap_or_default();
            }
        }
        Err(e) => eprintln!("bootplane probe: lldp: not listening: {e}"),
    }
    inv
}

fn power_off() {
    eprintln!("bootplane probe: powering off");
    crate::sys::power_off();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn arguments() {
        let a = parse_args(&s(&[
            "probe",
            "--url",
            "http://h/x",
            "--lldp-wait=3",
            "--deadline",
            "9",
            "--poweroff",
        ]))
        .unwrap();
        assert_eq!(a.url.as_deref(), Some("http://h/x"));
        assert_eq!(
            (a.lldp_wait, a.deadline, a.print, a.poweroff),
            (Some(3), Some(9), false, true)
        );
        let a = parse_args(&s(&["--print", "--root", "/tmp/r"])).unwrap();
        assert!(a.print);
        assert_eq!(a.root, Some(PathBuf::from("/tmp/r")));
        for bad in [
            &["--url"][..],
            &["--deadline", "soon"],
            &["--bogus"],
            &["--print=1"],
            &["extra"],
        ] {
            assert!(parse_args(&s(bad)).is_err(), "{bad:?}");
        }
        assert_eq!(run(&s(&["--nope"])), 2);
        assert_eq!(run(&s(&["probe", "--help"])), 0);
        // `wipe` goes to the wipe command, as `bootplane probe wipe ...` calls it.
        assert_eq!(run(&s(&["probe", "wipe", "--bogus"])), 2);
        assert_eq!(run(&s(&["wipe", "--help"])), 0);
    }

    #[test]
    fn cmdline() {
        let c = "BOOT_IMAGE=/vmlinuz console=ttyS0 bootplane.inventory=http://10.0.2.2:8/d?server=x&token=y \
                 bootplane.lldp_wait=2 xbootplane.inventory=no\n";
        assert_eq!(
            cmdline_value(c, "bootplane.inventory").as_deref(),
            Some("http://10.0.2.2:8/d?server=x&token=y")
        );
        assert_eq!(
            cmdline_value(c, "bootplane.lldp_wait").as_deref(),
            Some("2")
        );
        assert_eq!(cmdline_value(c, "bootplane.lldp"), None);
        assert_eq!(cmdline_value("a=1 a=2", "a").as_deref(), Some("2"));
        assert_eq!(cmdline_value("", "a"), None);
    }
}
