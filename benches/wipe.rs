//! Wipe-rate benchmark: `bootplane probe wipe --policy full` (discard, samples, then the
//! whole device read back and checked) against what a competent operator runs by hand,
//! `blkdiscard DEV && cmp -n SIZE DEV /dev/zero` (discard, then a whole read-back),
//! on the same loop device (`cargo bench --bench wipe -- [--size 2G] [--rounds 3]
//! [--dir DIR]`).
//!
//! The loop device is backed by a file on the real disk (`--dir`, default
//! `target/wipe-bench`, never a tmpfs: its discard is not a disk's). Before every run the
//! backing file is filled with non-zero data and synced, and the page cache is dropped
//! (`echo 3 > /proc/sys/vm/drop_caches`), so each side discards real extents and its
//! read-back reads the device. Sides alternate (A B A B ...); the bench prints each
//! side's MiB/s (device size over wall time) as median and spread (min-max), the
//! per-round ratio, and the goal line "bootplane's full wipe+verify within 1.1x of
//! blkdiscard + read-back". Needs root, losetup, blkdiscard and cmp.

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

#[path = "support/rounds.rs"]
mod rounds;

use rounds::{goal, Pair};

struct Args {
    size: u64,
    rounds: usize,
    dir: PathBuf,
}

fn args() -> Args {
    let mut a = Args {
        size: 2 << 30,
        rounds: 3,
        dir: PathBuf::from("target/wipe-bench"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        match k.as_str() {
            "--size" => {
                let v = it.next().expect("--size VALUE");
                let (n, mul) = match v.strip_suffix(['G', 'g']) {
                    Some(n) => (n, 1u64 << 30),
                    None => (
                        v.strip_suffix(['M', 'm']).expect("--size NG or NM"),
                        1 << 20,
                    ),
                };
                a.size = n.parse::<u64>().expect("--size N[G|M]") * mul;
            }
            "--rounds" | "--runs" => {
                a.rounds = it.next().and_then(|v| v.parse().ok()).expect("--rounds N")
            }
            "--dir" => a.dir = PathBuf::from(it.next().expect("--dir DIR")),
            "--bench" => {}
            "-h" | "--help" => {
                eprintln!("wipe [--size 2G] [--rounds 3] [--dir target/wipe-bench]");
                std::process::exit(0);
            }
            _ => {}
        }
    }
    assert!(a.rounds >= 1, "--rounds must be at least 1");
    a
}

fn sh(cmd: &str) -> std::process::Output {
    let o = Command::new("sh").arg("-c").arg(cmd).output().expect("sh");
    assert!(
        o.status.success(),
        "{cmd}: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// Fill the backing file with non-zero data, sync it, drop the caches.
fn fill(file: &std::path::Path, size: u64) {
    let mut f = std::fs::OpenOptions::new().write(true).open(file).unwrap();
    let block: Vec<u8> = (0..(4 << 20))
        .map(|i: u32| (i % 251) as u8 | 0x80)
        .collect();
    let mut left = size;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        f.write_all(&block[..n]).unwrap();
        left -= n as u64;
    }
    f.sync_all().unwrap();
    drop_caches();
}

fn drop_caches() {
    sh("sync; echo 3 > /proc/sys/vm/drop_caches");
}

struct Loop(String);

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

fn main() {
    let a = args();
    std::fs::create_dir_all(&a.dir).unwrap();
    let file = a.dir.join(format!("wipe-bench-{}.img", std::process::id()));
    std::fs::File::create(&file)
        .unwrap()
        .set_len(a.size)
        .unwrap();
    let fs = sh(&format!("stat -f -c %T {}", a.dir.display()));
    let fs = String::from_utf8_lossy(&fs.stdout).trim().to_string();
    assert!(
        fs != "tmpfs",
        "--dir is on tmpfs: the backing file must be on a disk"
    );
    let o = sh(&format!("losetup --find --show {}", file.display()));
    let dev = Loop(String::from_utf8_lossy(&o.stdout).trim().to_string());
    let mib = a.size as f64 / (1 << 20) as f64;
    println!(
        "wipe bench: {} MiB loop device {} over {} ({fs}), {} rounds, load {}",
        mib,
        dev.0,
        file.display(),
        a.rounds,
        rounds::load()
    );
    let bin = env!("CARGO_BIN_EXE_bootplane");
    let mut pair = Pair::new(
        "full wipe + verify of a loop device",
        "MiB/s",
        "bootplane",
        "blkdiscard+cmp",
    );
    let mut methods = Vec::new();
    let (ra, rb) = rounds::interleave(
        a.rounds,
        |r| {
            fill(&file, a.size);
            let t = Instant::now();
            let o = Command::new(bin)
                .args(["probe", "wipe", "--policy", "full", "--device", &dev.0])
                .output()
                .unwrap();
            let secs = t.elapsed().as_secs_f64();
            assert!(
                o.status.success(),
                "bootplane: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            let out = String::from_utf8_lossy(&o.stdout);
            let last = out.lines().last().unwrap_or("").to_string();
            let v: serde_json::Value = serde_json::from_str(&last).unwrap();
            methods.push(v["disks"][0]["method"].as_str().unwrap_or("?").to_string());
            println!(
                "round {r}: bootplane {:.2}s ({:.0} MiB/s)",
                secs,
                mib / secs
            );
            mib / secs
        },
        |r| {
            fill(&file, a.size);
            let t = Instant::now();
            sh(&format!(
                "blkdiscard {d} && cmp -n {} {d} /dev/zero",
                a.size,
                d = dev.0
            ));
            let secs = t.elapsed().as_secs_f64();
            println!(
                "round {r}: blkdiscard+cmp {:.2}s ({:.0} MiB/s)",
                secs,
                mib / secs
            );
            mib / secs
        },
    );
    pair.a = ra;
    pair.b = rb;
    let _ = std::fs::remove_file(&file);
    println!("bootplane's method: {}", methods.join(", "));
    pair.print();
    let ratio = pair.ratio();
    goal(
        "bootplane's full wipe+verify within 1.1x of blkdiscard + read-back",
        ratio.median >= 1.0 / 1.1,
        &format!(
            "rate ratio bootplane/peer {} (time ratio {:.2})",
            ratio.fmt(2),
            1.0 / ratio.median
        ),
    );
    println!("{}", pair.table_row("cargo bench --bench wipe"));
    rounds::print_machine();
}
