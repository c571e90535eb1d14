//! Copy-throughput benchmark for `bootplane provision` against its peers, side by side
//! in one run (`cargo bench --bench image_copy -- [--size 1G] [--runs 3] [--dir DIR]`).
//!
//! Generates a mixed raw image (random, compressible text, zero runs), packs it with
//! `bootplane image pack`, then times on the same page-cached input and a file target:
//! bootplane provision (default and with per-frame SHA-256), `zstd -dc | dd oflag=direct`,
//! `zstd -dc | tee >(openssl dgst -sha256) | dd oflag=direct`, `bmaptool copy` and the
//! single-core `openssl dgst -sha256` rate. Prints median MB/s, ratios, CPU seconds
//! (user+sys of the whole process tree), peak RSS, and bootplane's CPU per stage.
//! The peers are required tools (zstd, openssl, coreutils dd, bmap-tools).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

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
            "--runs" => a.runs = it.next().expect("--runs N").parse().expect("--runs N"),
            "--dir" => a.dir = PathBuf::from(it.next().expect("--dir DIR")),
            "--bench" => {}
            "-h" | "--help" => {
                eprintln!("image_copy [--size 1G|256M] [--runs 3] [--dir target/image-bench]");
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

fn median(mut v: Vec<Sample>) -> Sample {
    v.sort_by(|a, b| a.secs.partial_cmp(&b.secs).unwrap());
    v[v.len() / 2].clone()
}

fn sh(script: &str) -> Command {
    let mut c = Command::new("bash");
    c.args(["-c", script]);
    c
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
        "image_copy: {} MiB mixed image, {} runs each, dir {}",
        a.size >> 20,
        a.runs,
        dir.display()
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
    let mut results = Vec::new();
    let mut stage_cpu = String::new();
    for (name, mk) in &methods {
        let mut v = Vec::new();
        for _ in 0..a.runs {
            let _ = std::fs::remove_file(&out);
            let s = timed(&mut mk());
            v.push(s);
        }
        let m = median(v);
        if name.starts_with("bootplane") {
            let done = m
                .stderr
                .lines()
                .rfind(|l| l.contains("\"stage\":\"done\""))
                .unwrap_or("")
                .to_string();
            assert!(
                done.contains(&sha),
                "bootplane did not report the image sha256: {}",
                m.stderr
            );
            let j: serde_json::Value = serde_json::from_str(&done).unwrap_or_default();
            stage_cpu.push_str(&format!(
                "  {name}: cpu per stage {} direct={} frame_sha256={}\n",
                j["cpu"], j["direct"], j["frame_sha256"]
            ));
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
        results.push((name.to_string(), m));
    }
    let mut hv = Vec::new();
    for _ in 0..a.runs {
        hv.push(timed(
            Command::new("openssl").args(["dgst", "-sha256"]).arg(&raw),
        ));
    }
    let h = median(hv);
    let sha_rate = mb / h.secs;
    let base = mb / results[0].1.secs;
    println!();
    println!(
        "{:<52} {:>9} {:>10} {:>9} {:>9}",
        "method", "MB/s", "vs boot", "cpu s", "rss MiB"
    );
    for (name, s) in &results {
        let r = mb / s.secs;
        println!(
            "{:<52} {:>9.0} {:>9.2}x {:>9.2} {:>9.1}",
            name,
            r,
            base / r,
            s.cpu,
            s.rss_kib as f64 / 1024.0
        );
    }
    println!(
        "{:<52} {:>9.0} {:>10} {:>9.2} {:>9.1}",
        "openssl dgst -sha256 (single core, hash only)",
        sha_rate,
        "",
        h.cpu,
        h.rss_kib as f64 / 1024.0
    );
    println!();
    print!("{stage_cpu}");
    println!(
        "bootplane: {:.0} MB/s = {:.0}% of single-core sha256; {:.2}x zstd|tee(openssl)|dd; {:.2}x bmaptool; peak RSS {:.0} MiB",
        base,
        base * 100.0 / sha_rate,
        base / (mb / results[3].1.secs),
        base / (mb / results[4].1.secs),
        results[0].1.rss_kib as f64 / 1024.0
    );
    println!(
        "goals: >= 800 MB/s verified+O_DIRECT: {}; >= 85% of sha256 rate: {}; RSS <= 256 MiB: {}",
        if base >= 800.0 { "met" } else { "NOT met" },
        if base >= 0.85 * sha_rate {
            "met"
        } else {
            "NOT met"
        },
        if results[0].1.rss_kib <= 256 * 1024 {
            "met"
        } else {
            "NOT met"
        }
    );
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "machine: {cores} cores, loadavg {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let _ = std::io::stdout().lock().flush();
}
