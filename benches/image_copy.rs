//! Copy-throughput benchmark for `bootplane provision` against its peers, side by side
//! in one run (`cargo bench --bench image_copy -- [--size 1G] [--runs 3] [--dir DIR]`).
//!
//! Generates a mixed raw image (random, compressible text, zero runs), packs it with
//! `bootplane image pack`, then, round by round (every method once per round, in turn,
//! so load drift lands on all of them alike), times on the same page-cached input and a
//! file target written with O_DIRECT: bootplane provision (default and with per-frame
//! SHA-256), `zstd -dc | dd oflag=direct`, `zstd -dc | tee >(openssl dgst -sha256) | dd
//! oflag=direct` and `bmaptool copy`. The SHA-256 limit (the whole-image digest is
//! serial) is measured in every round as the in-memory hash rate, twice: `openssl speed
//! -evp sha256 -bytes 1048576` and the sha2 crate (the one bootplane uses) hashing a
//! buffer in this process. Prints median and spread (min-max) of MB/s, of the per-round
//! ratios, CPU seconds (user+sys of the whole process tree), peak RSS, bootplane's CPU
//! per stage, and every goal, met or not. The peers are required tools (zstd, openssl,
//! coreutils dd, bmap-tools).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

#[path = "support/rounds.rs"]
mod rounds;

use rounds::{goal, Pair, Stat};

struct Args {
    size: u64,
    runs: usize,
    dir: PathBuf,
}

fn parse_size(s: &str) -> u64 {
    let s = s.trim();
    let (num, mul) = match s.chars().last() {
        Some('G') | Some('g') => (&s[..s.len() - 1], 1u64 << 30),
        Some('M') | Some('m') => (&s[..s.len() - 1], 1 << 20),
        Some('K') | Some('k') => (&s[..s.len() - 1], 1 << 10),
        _ => (s, 1),
    };
    (num.parse::<f64>()
        .unwrap_or_else(|_| panic!("bad size {s:?}"))
        * mul as f64) as u64
}

fn args() -> Args {
    let mut a = Args {
        size: 1 << 30,
        runs: 3,
        dir: PathBuf::from("target/image-bench"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        match k.as_str() {
            "--size" => a.size = parse_size(&it.next().expect("--size VALUE")),
            "--runs" | "--rounds" => {
                a.runs = it.next().expect("--rounds N").parse().expect("--rounds N")
            }
            "--dir" => a.dir = PathBuf::from(it.next().expect("--dir DIR")),
            "--bench" => {}
            "-h" | "--help" => {
                eprintln!("image_copy [--size 1G|256M] [--rounds 3] [--dir target/image-bench]");
                std::process::exit(0);
            }
            _ => {}
        }
    }
    a
}

/// Write a mixed image: ~1/3 random, ~1/3 text, ~1/3 zeros, in runs of 0.5-4 MiB.
fn generate(path: &Path, size: u64) {
    let mut f = std::io::BufWriter::with_capacity(8 << 20, std::fs::File::create(path).unwrap());
    let mut x: u64 = 0x243F6A8885A308D3;
    let text = b"Lorem ipsum dolor sit amet, bare metal provisioning streams verified images. ";
    let mut left = size;
    let mut kind = 0u32;
    let mut buf = vec![0u8; 4 << 20];
    while left > 0 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let run = ((512 << 10) + x % (3584 << 10)).min(left) as usize;
        let b = &mut buf[..run];
        match kind % 3 {
            0 => {
                for w in b.chunks_mut(8) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let bytes = x.to_le_bytes();
                    w.copy_from_slice(&bytes[..w.len()]);
                }
            }
            1 => {
                for (i, c) in b.iter_mut().enumerate() {
                    *c = text[i % text.len()];
                }
            }
            _ => b.fill(0),
        }
        f.write_all(b).unwrap();
        left -= run as u64;
        kind += 1;
    }
    f.flush().unwrap();
}

#[derive(Default, Clone)]
struct Sample {
    secs: f64,
    cpu: f64,
    rss_kib: i64,
    stderr: String,
}

#[allow(clippy::zombie_processes)] // reaped with wait4 below, to get its rusage
/// Run a command, return wall time and the rusage of its whole (waited-for) tree.
fn timed(cmd: &mut Command) -> Sample {
    let t = Instant::now();
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let pid = child.id() as libc::pid_t;
    let mut err = child.stderr.unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut s);
        s
    });
    let mut status = 0;
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waiting for our own child with valid out-pointers.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    let secs = t.elapsed().as_secs_f64();
    let stderr = reader.join().unwrap();
    assert!(
        r == pid && libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{cmd:?} failed: {stderr}"
    );
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Sample {
        secs,
        cpu: tv(ru.ru_utime) + tv(ru.ru_stime),
        rss_kib: ru.ru_maxrss,
        stderr,
    }
}

fn sh(script: &str) -> Command {
    let mut c = Command::new("bash");
    c.args(["-c", script]);
    c
}

/// `openssl speed -evp sha256 -bytes 1048576` for 1 second: MB/s of SHA-256 over
/// 1 MiB buffers in memory (one core, OpenSSL's SHA-NI code), per second of its CPU
/// time (openssl speed's default timer).
fn openssl_speed() -> f64 {
    let o = Command::new("openssl")
        .args([
            "speed", "-evp", "sha256", "-bytes", "1048576", "-seconds", "1",
        ])
        .stderr(Stdio::null())
        .output()
        .expect("openssl speed");
    let text = String::from_utf8_lossy(&o.stdout);
    // The result line: `sha256   <rate>k` (1000s of bytes per second) after the header.
    let line = text
        .lines()
        .rfind(|l| l.trim_start().to_ascii_lowercase().starts_with("sha256"))
        .unwrap_or_else(|| panic!("openssl speed printed no sha256 line: {text}"));
    let k: f64 = line
        .split_whitespace()
        .last()
        .and_then(|v| v.trim_end_matches('k').parse().ok())
        .unwrap_or_else(|| panic!("openssl speed: {line:?}"));
    k * 1000.0 / 1e6
}

/// This thread's CPU time in seconds.
fn thread_cpu() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// The sha2 crate's SHA-256 (the code bootplane's whole-image digest calls) over a
/// 64 MiB buffer already in memory, repeated for at least `min_secs`: MB per second of
/// this thread's CPU time (the rate with a core of its own, as `openssl speed`
/// reports by default) and MB per second of wall time (what a loaded machine left it).
fn sha2_in_memory(buf: &[u8], min_secs: f64) -> (f64, f64) {
    use sha2::Digest;
    let t = Instant::now();
    let c0 = thread_cpu();
    let mut bytes = 0u64;
    let mut h = sha2::Sha256::new();
    while t.elapsed().as_secs_f64() < min_secs {
        for c in buf.chunks(1 << 20) {
            h.update(c);
        }
        bytes += buf.len() as u64;
    }
    std::hint::black_box(h.finalize());
    let mb = bytes as f64 / 1e6;
    (mb / (thread_cpu() - c0), mb / t.elapsed().as_secs_f64())
}

/// The target's own limit: `size` bytes written from memory to `path` with O_DIRECT,
/// 4 MiB aligned writes, three in flight (as bootplane's writers), then fsync. MB/s.
fn disk_rate(path: &Path, size: u64) -> f64 {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let _ = std::fs::remove_file(path);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .expect("opening the disk-rate file with O_DIRECT");
    const CH: usize = 4 << 20;
    let t = Instant::now();
    let next = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                // A 4096-aligned buffer of non-zero bytes (a zero page could be special-cased).
                let layout = std::alloc::Layout::from_size_align(CH, 4096).unwrap();
                // SAFETY: non-zero size; freed below with the same layout.
                let p = unsafe { std::alloc::alloc(layout) };
                assert!(!p.is_null());
                // SAFETY: p is valid for CH bytes.
                let buf = unsafe { std::slice::from_raw_parts_mut(p, CH) };
                buf.fill(0x5a);
                loop {
                    let off = next.fetch_add(CH as u64, std::sync::atomic::Ordering::Relaxed);
                    if off >= size {
                        break;
                    }
                    let n = ((size - off) as usize).min(CH) / 4096 * 4096;
                    if n == 0 {
                        break;
                    }
                    f.write_all_at(&buf[..n], off).expect("O_DIRECT write");
                }
                // SAFETY: allocated above with this layout.
                unsafe { std::alloc::dealloc(p, layout) };
            });
        }
    });
    f.sync_all().unwrap();
    let secs = t.elapsed().as_secs_f64();
    drop(f);
    let _ = std::fs::remove_file(path);
    size as f64 / 1e6 / secs
}

fn main() {
    let a = args();
    let bin = env!("CARGO_BIN_EXE_bootplane");
    std::fs::create_dir_all(&a.dir).unwrap();
    let dir = a.dir.canonicalize().unwrap();
    let raw = dir.join("raw.img");
    let img = dir.join("image.zst");
    let out = dir.join("target.img");
    let mb = a.size as f64 / 1e6;
    println!(
        "image_copy: {} MiB mixed image, {} interleaved rounds, dir {}, load average {}",
        a.size >> 20,
        a.runs,
        dir.display(),
        rounds::load()
    );
    if std::fs::metadata(&raw).map(|m| m.len()).ok() != Some(a.size) {
        generate(&raw, a.size);
    }
    let p = timed(
        Command::new(bin)
            .args(["image", "pack"])
            .arg(&raw)
            .arg("-o")
            .arg(&img),
    );
    let packed = std::fs::metadata(&img).unwrap().len();
    println!(
        "pack: {:.0} MB/s ({:.2} s, cpu {:.2} s), {} -> {} bytes ({:.1}%)",
        mb / p.secs,
        p.secs,
        p.cpu,
        a.size,
        packed,
        packed as f64 * 100.0 / a.size as f64
    );
    let bmap = dir.join("raw.bmap");
    timed(
        Command::new("bmaptool")
            .args(["create", "-o"])
            .arg(&bmap)
            .arg(&raw),
    );
    // Warm the page cache for every input.
    for f in [&raw, &img] {
        let _ = timed(&mut sh(&format!("cat '{}' > /dev/null", f.display())));
    }
    let sha = {
        let o = Command::new("openssl")
            .args(["dgst", "-sha256", "-r"])
            .arg(&raw)
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    };
    let o = out.display().to_string();
    let i = img.display().to_string();
    type Method<'a> = (&'a str, Box<dyn Fn() -> Command + 'a>);
    let methods: Vec<Method> = vec![
        (
            "bootplane provision",
            Box::new(|| {
                let mut c = Command::new(bin);
                c.args(["provision", "--source", &i, "--target", &o, "--no-resume"]);
                c
            }),
        ),
        (
            "bootplane provision --frame-sha256 on",
            Box::new(|| {
                let mut c = Command::new(bin);
                c.args([
                    "provision",
                    "--source",
                    &i,
                    "--target",
                    &o,
                    "--no-resume",
                    "--frame-sha256",
                    "on",
                ]);
                c
            }),
        ),
        (
            "zstd -dc | dd oflag=direct",
            Box::new(|| {
                sh(&format!("set -o pipefail; zstd -q -dc '{i}' | dd of='{o}' bs=4M iflag=fullblock oflag=direct conv=fsync status=none"))
            }),
        ),
        (
            "zstd -dc | tee >(openssl sha256) | dd oflag=direct",
            Box::new(|| {
                sh(&format!(
                "set -o pipefail; zstd -q -dc '{i}' | tee >(openssl dgst -sha256 > '{o}.sha') | dd of='{o}' bs=4M iflag=fullblock oflag=direct conv=fsync status=none; wait"
            ))
            }),
        ),
        (
            "bmaptool copy",
            Box::new(|| {
                let mut c = Command::new("bmaptool");
                c.args(["-q", "copy", "--bmap", &bmap.display().to_string(), &i, &o]);
                c
            }),
        ),
    ];
    // 64 MiB of the image itself, in memory, for the sha2 reference.
    let mem: Vec<u8> = {
        let mut f = std::fs::File::open(&raw).unwrap();
        let mut v = vec![0u8; (64usize << 20).min(a.size as usize)];
        std::io::Read::read_exact(&mut f, &mut v).unwrap();
        v
    };
    // rate[m][round] in MB/s, and the samples for CPU / RSS / stage figures.
    let mut rate: Vec<Vec<f64>> = vec![Vec::new(); methods.len()];
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); methods.len()];
    let mut ossl = Vec::new();
    let mut crate_rate = Vec::new();
    let mut crate_wall = Vec::new();
    let mut disk = Vec::new();
    let mut hash_thread: Vec<serde_json::Value> = Vec::new();
    let mut loads = Vec::new();
    for round in 0..a.runs {
        loads.push(rounds::load());
        // The references first and last in the round, so they see the same machine.
        let o1 = openssl_speed();
        let c1 = sha2_in_memory(&mem, 0.5);
        for (m, (name, mk)) in methods.iter().enumerate() {
            let _ = std::fs::remove_file(&out);
            let s = timed(&mut mk());
            if name.starts_with("bootplane") {
                let done = s
                    .stderr
                    .lines()
                    .rfind(|l| l.contains("\"stage\":\"done\""))
                    .unwrap_or("");
                assert!(
                    done.contains(&sha),
                    "bootplane did not report the image sha256: {}",
                    s.stderr
                );
            }
            // Every method must have produced the image.
            let got = Command::new("openssl")
                .args(["dgst", "-sha256", "-r"])
                .arg(&out)
                .output()
                .unwrap();
            assert!(
                String::from_utf8_lossy(&got.stdout).starts_with(&sha),
                "{name} wrote a different image"
            );
            rate[m].push(mb / s.secs);
            samples[m].push(s);
        }
        let o2 = openssl_speed();
        let c2 = sha2_in_memory(&mem, 0.5);
        ossl.push((o1 + o2) / 2.0);
        crate_rate.push((c1.0 + c2.0) / 2.0);
        crate_wall.push((c1.1 + c2.1) / 2.0);
        disk.push(disk_rate(&out, a.size));
        let done = samples[0][round]
            .stderr
            .lines()
            .rfind(|l| l.contains("\"stage\":\"done\""))
            .unwrap_or("");
        let j: serde_json::Value = serde_json::from_str(done).unwrap_or_default();
        hash_thread.push(j["hash_thread"].clone());
        println!(
            "round {}: bootplane {:.0} MB/s, bmaptool {:.0}, tee {:.0}; in-memory sha256 per CPU second: openssl {:.0}, sha2 {:.0} (sha2 per wall second {:.0}); O_DIRECT write from memory {:.0}; load {}",
            round + 1,
            rate[0][round],
            rate[4][round],
            rate[3][round],
            ossl[round],
            crate_rate[round],
            crate_wall[round],
            disk[round],
            loads[round]
        );
        println!("  bootplane's hash thread (s): {}", hash_thread[round]);
    }
    println!();
    println!(
        "{:<52} {:>22} {:>18} {:>9} {:>9}",
        "method (median (min-max) over rounds)", "MB/s", "bootplane / it", "cpu s", "rss MiB"
    );
    for (m, (name, _)) in methods.iter().enumerate() {
        let r: Vec<f64> = rate[0].iter().zip(&rate[m]).map(|(b, x)| b / x).collect();
        let cpu: Vec<f64> = samples[m].iter().map(|s| s.cpu).collect();
        let rss: Vec<f64> = samples[m]
            .iter()
            .map(|s| s.rss_kib as f64 / 1024.0)
            .collect();
        println!(
            "{:<52} {:>22} {:>18} {:>9.2} {:>9.1}",
            name,
            Stat::of(&rate[m]).fmt(0),
            Stat::of(&r).fmt(2),
            Stat::of(&cpu).median,
            Stat::of(&rss).median
        );
    }
    println!(
        "{:<52} {:>22}",
        "in-memory sha256, openssl speed -evp sha256 -bytes 1048576 (per CPU s)",
        Stat::of(&ossl).fmt(0)
    );
    println!(
        "{:<52} {:>22}",
        "in-memory sha256, sha2 crate, 64 MiB buffer (per CPU s)",
        Stat::of(&crate_rate).fmt(0)
    );
    println!(
        "{:<52} {:>22}",
        "in-memory sha256, sha2 crate, 64 MiB buffer (per wall s)",
        Stat::of(&crate_wall).fmt(0)
    );
    println!(
        "{:<52} {:>22}",
        "O_DIRECT write from memory, 3 in flight (the target)",
        Stat::of(&disk).fmt(0)
    );
    // Where the hash thread's time went, as shares of its wall time (median of rounds).
    let share = |k: &str| {
        Stat::of(
            &hash_thread
                .iter()
                .filter_map(|h| Some(h[k].as_f64()? / h["wall"].as_f64()?))
                .collect::<Vec<_>>(),
        )
    };
    println!(
        "bootplane's hash thread, share of its wall time (median (min-max) of rounds): hashing {}, waiting for a frame {}, waiting for a writer {}, runnable but off its core {}",
        share("hashing").fmt(2),
        share("wait_input").fmt(2),
        share("wait_output").fmt(2),
        share("runqueue").fmt(2)
    );
    let hash_inside: Vec<f64> = hash_thread
        .iter()
        .filter_map(|h| Some(mb / h["hashing"].as_f64()?))
        .collect();
    println!(
        "{:<52} {:>22}",
        "sha256 inside bootplane, per wall s inside it",
        Stat::of(&hash_inside).fmt(0)
    );
    // Per second of the hash thread's CPU time: comparable with the in-memory rates
    // (which are per CPU second), whatever the load.
    let per_cpu: Vec<f64> = hash_thread
        .iter()
        .filter_map(|h| Some(mb / h["cpu"].as_f64()?))
        .collect();
    let mut vs_cpu = Pair::new(
        "hash thread per CPU second vs in-memory SHA-256",
        "MB/s",
        "bootplane",
        "sha256 in memory",
    );
    vs_cpu.a = per_cpu;
    vs_cpu.b = ossl
        .iter()
        .zip(&crate_rate)
        .map(|(o, c)| o.max(*c))
        .collect();
    vs_cpu.print();
    println!();
    for (m, (name, _)) in methods.iter().enumerate().take(2) {
        for s in &samples[m] {
            let done = s
                .stderr
                .lines()
                .rfind(|l| l.contains("\"stage\":\"done\""))
                .unwrap_or("");
            let j: serde_json::Value = serde_json::from_str(done).unwrap_or_default();
            println!(
                "  {name}: cpu per stage {} direct={} frame_sha256={}",
                j["cpu"], j["direct"], j["frame_sha256"]
            );
        }
    }
    // The SHA-256 limit: the faster of the two in-memory rates of the same round, per
    // second of CPU time (the rate of a thread with a core to itself).
    let limit: Vec<f64> = ossl
        .iter()
        .zip(&crate_rate)
        .map(|(o, c)| o.max(*c))
        .collect();
    let mut vs_limit = Pair::new(
        "image copy vs in-memory SHA-256",
        "MB/s",
        "bootplane",
        "sha256 in memory",
    );
    vs_limit.a = rate[0].clone();
    vs_limit.b = limit;
    let mut vs_bmap = Pair::new(
        "image copy, 1 GiB-class mixed image, verified, O_DIRECT",
        "MB/s",
        "bootplane",
        "bmaptool",
    );
    vs_bmap.a = rate[0].clone();
    vs_bmap.b = rate[4].clone();
    let mut vs_disk = Pair::new(
        "image copy vs O_DIRECT write from memory",
        "MB/s",
        "bootplane",
        "disk",
    );
    vs_disk.a = rate[0].clone();
    vs_disk.b = disk.clone();
    let mut vs_tee = Pair::new(
        "image copy vs zstd|tee(openssl)|dd",
        "MB/s",
        "bootplane",
        "zstd|tee|dd",
    );
    vs_tee.a = rate[0].clone();
    vs_tee.b = rate[3].clone();
    println!();
    for p in [&vs_limit, &vs_disk, &vs_bmap, &vs_tee] {
        p.print();
    }
    let base = Stat::of(&rate[0]).median;
    let rss = Stat::of(
        &samples[0]
            .iter()
            .map(|s| s.rss_kib as f64 / 1024.0)
            .collect::<Vec<_>>(),
    )
    .max;
    println!();
    goal(
        ">= 800 MB/s verified + O_DIRECT",
        base >= 800.0,
        &format!("median {base:.0} MB/s"),
    );
    goal(
        ">= 90% of the in-memory SHA-256 rate of the same round",
        vs_limit.ratio().median >= 0.9,
        &format!(
            "median {:.0}% per round, spread {:.0}-{:.0}%",
            vs_limit.ratio().median * 100.0,
            vs_limit.ratio().min * 100.0,
            vs_limit.ratio().max * 100.0
        ),
    );
    goal(
        ">= 2.3x bmaptool",
        vs_bmap.ratio().median >= 2.3,
        &format!("median {}x", vs_bmap.ratio().fmt(2)),
    );
    goal(
        "peak RSS <= 256 MiB",
        rss <= 256.0,
        &format!("max {rss:.0} MiB over rounds"),
    );
    println!();
    println!("table rows:");
    let cmd = format!(
        "cargo bench --bench image_copy -- --size {}M --rounds {}",
        a.size >> 20,
        a.runs
    );
    println!("{}", vs_bmap.table_row(&cmd));
    println!("{}", vs_limit.table_row(&cmd));
    rounds::print_machine();
    let _ = std::io::stdout().lock().flush();
}
