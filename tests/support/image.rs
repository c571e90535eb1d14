//! Image test helpers: deterministic mixed images, `bootplane provision` and `pack`
//! runs, loop devices and mounts released on drop, a minimal HTTP image source, and the
//! boot image catalogs the boot tests serve ([`write_catalog`], [`tiny_ipxe_image`]).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::bootplane::bin;
use super::process::{run_cmd, tool};

/// Deterministic mixed image: random-looking, text and zero runs, `size` bytes.
pub fn mixed(size: usize, seed: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(size);
    let mut x = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    let text = b"bootplane streams verified images to bare metal disks; ";
    let mut kind = 0;
    while v.len() < size {
        let run = (300_000 + (x % 700_000) as usize).min(size - v.len());
        match kind % 3 {
            0 => {
                for _ in 0..run {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    v.push(x as u8);
                }
            }
            1 => v.extend(text.iter().cycle().take(run)),
            _ => v.extend(std::iter::repeat_n(0u8, run)),
        }
        kind += 1;
    }
    v
}

/// `bootplane provision ARGS`; returns (exit code, JSON progress lines).
pub fn provision(args: &[&str]) -> (i32, Vec<serde_json::Value>) {
    let o = run_cmd(Command::new(bin()).arg("provision").args(args), 120);
    let err = String::from_utf8_lossy(&o.stderr);
    let lines: Vec<serde_json::Value> = err
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad progress line {l:?}: {e}")))
        .collect();
    for l in &lines {
        for k in ["stage", "bytes", "total", "rate", "eta", "elapsed"] {
            assert!(l.get(k).is_some(), "progress line lacks {k}: {l}");
        }
    }
    (o.status.code().unwrap_or(-1), lines)
}

pub fn last_stage(lines: &[serde_json::Value]) -> &serde_json::Value {
    lines.last().expect("at least one progress line")
}

pub fn pack(raw: &Path, out: &Path, frame_mib: u64) {
    let o = run_cmd(
        Command::new(bin())
            .args(["image", "pack"])
            .arg(raw)
            .arg("-o")
            .arg(out)
            .args(["--frame-mib", &frame_mib.to_string()]),
        120,
    );
    assert!(
        o.status.success(),
        "pack failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Write `data` to `DIR/raw` and pack it into `DIR/img.bpz` with `frame_mib` MiB frames;
/// returns (raw, packed image).
pub fn write_and_pack(dir: &Path, data: &[u8], frame_mib: u64) -> (PathBuf, PathBuf) {
    let raw = dir.join("raw");
    std::fs::write(&raw, data).unwrap();
    let img = dir.join("img.bpz");
    pack(&raw, &img, frame_mib);
    (raw, img)
}

pub fn head_is_zero(path: &Path, n: usize) -> bool {
    let mut f = std::fs::File::open(path).unwrap();
    let mut b = vec![0u8; n];
    let mut got = 0;
    while got < n {
        let k = f.read(&mut b[got..]).unwrap();
        if k == 0 {
            break;
        }
        got += k;
    }
    b[..got].iter().all(|&x| x == 0)
}

/// A loop device over a backing file, detached on drop.
pub struct Loop {
    pub dev: PathBuf,
}

impl Loop {
    pub fn new(backing: &Path) -> Loop {
        let o = tool("losetup", &["-f", "--show", backing.to_str().unwrap()]);
        Loop {
            dev: PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()),
        }
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
    }
}

/// A mount, unmounted on drop.
pub struct Mount {
    pub dir: PathBuf,
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
    }
}

/// A minimal HTTP/1.1 file server on 127.0.0.1 with HEAD and `Range: bytes=N-`.
pub struct HttpServer {
    pub base: String,
}

pub fn http_server(root: PathBuf) -> HttpServer {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", l.local_addr().unwrap());
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let root = root.clone();
            std::thread::spawn(move || serve_conn(s, &root));
        }
    });
    HttpServer { base }
}

fn serve_conn(mut s: std::net::TcpStream, root: &Path) {
    s.set_read_timeout(Some(Duration::from_secs(30))).ok();
    let mut buf = Vec::new();
    let mut one = [0u8; 1];
    loop {
        buf.clear();
        while !buf.ends_with(b"\r\n\r\n") {
            match s.read(&mut one) {
                Ok(1) => buf.push(one[0]),
                _ => return,
            }
            if buf.len() > 16384 {
                return;
            }
        }
        let req = String::from_utf8_lossy(&buf).to_string();
        let mut lines = req.lines();
        let first: Vec<&str> = lines.next().unwrap_or("").split(' ').collect();
        if first.len() < 2 {
            return;
        }
        let range: Option<u64> = lines
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.eq_ignore_ascii_case("range"))
            .and_then(|(_, v)| {
                v.trim()
                    .strip_prefix("bytes=")?
                    .strip_suffix('-')?
                    .parse()
                    .ok()
            });
        let path = root.join(first[1].trim_start_matches('/'));
        let Ok(data) = std::fs::read(&path) else {
            let _ = s.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n");
            continue;
        };
        let start = range.unwrap_or(0).min(data.len() as u64) as usize;
        let status = if range.is_some() {
            "206 Partial Content"
        } else {
            "200 OK"
        };
        let hdr = format!(
            "HTTP/1.1 {status}\r\ncontent-length: {}\r\naccept-ranges: bytes\r\n\r\n",
            data.len() - start
        );
        if s.write_all(hdr.as_bytes()).is_err() {
            return;
        }
        if first[0] == "GET" && s.write_all(&data[start..]).is_err() {
            return;
        }
    }
}

/// An image catalog `dir/catalog.toml` with one image `image` whose kernel and initrd
/// are the given bytes (written under `dir/os/`, with their SHA-256).
pub fn write_catalog(dir: &Path, image: &str, kernel: &[u8], initrd: &[u8], cmdline: &str) {
    use sha2::{Digest, Sha256};
    std::fs::create_dir_all(dir.join("os")).unwrap();
    let mut entries = String::new();
    for (role, body) in [("kernel", kernel), ("initrd", initrd)] {
        std::fs::write(dir.join("os").join(role), body).unwrap();
        entries.push_str(&format!(
            "{role} = {{ path = \"os/{role}\", sha256 = \"{}\" }}\n",
            hex::encode(Sha256::digest(body))
        ));
    }
    std::fs::write(
        dir.join("catalog.toml"),
        format!("[[image]]\nref = \"{image}\"\ncmdline = \"{cmdline}\"\n{entries}"),
    )
    .unwrap();
}

/// The boot tests' `os-image:latest`: its "kernel" is an iPXE script that echoes
/// `marker` and idles, so a console showing the marker proves kernel and initrd were
/// fetched over HTTP and booted.
pub fn tiny_ipxe_image(dir: &Path, marker: &str) {
    let kernel = format!("#!ipxe\necho {marker}\nsleep 600\n");
    write_catalog(
        dir,
        "os-image:latest",
        kernel.as_bytes(),
        b"bootplane-e2e initrd\n",
        "quiet",
    );
}
