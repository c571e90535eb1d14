//! Runs the README's walk-through exactly as written, on a fresh state dir.
//!
//! Conventions in README.md (keep them when editing the walk-through):
//! - A fenced block whose info string is `sh walkthrough` is executed; other `sh`
//!   blocks (the build, the toolchain) are not. The marked blocks are concatenated in
//!   order into one script run by `bash -euo pipefail`, so state carries over between
//!   them (the server started in the background, shell variables) and any failing
//!   command fails the test.
//! - A line `# expect: WORD WORD ...` inside a marked block is a line that block's
//!   standard output must contain: some output line has those whitespace-separated
//!   words in that order (other words may sit between them, so columns such as AGE
//!   can be left out). Within a block the expected lines must appear in order.
//! - Commands say `bootplane ...`: the test puts the directory of the binary it built
//!   first on `PATH` (the README puts `target/release` there in an unmarked block).
//!
//! The script runs in a temporary directory holding a copy of the files a fresh clone
//! provides that the walk-through uses at run time (`scripts/`, `images/catalog.toml`,
//! `ipxe/`, `ignition/`, `examples/`), so `./var/bootplane` starts empty and the demo
//! image is written there, not into the worktree. The README's commands use the
//! default listeners; the test moves them to free loopback ports through the
//! environment (`BOOTPLANE_API_LISTEN`, `BOOTPLANE_HTTP_LISTEN` for `serve`,
//! `BOOTPLANE_SERVER` for the CLI), so nothing binds a wildcard address or a fixed
//! port and all traffic stays on loopback. bash runs in its own process group, which
//! is killed (with the server the walk-through started) when the test ends, however
//! it ends.

use crate::support;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MARK: &str = "```sh walkthrough";
const SEP: &str = "@@readme-walkthrough-block@@";

struct Block {
    /// 1-based line of the opening fence in README.md.
    line: usize,
    text: String,
    expects: Vec<Vec<String>>,
}

fn blocks(readme: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut cur: Option<Block> = None;
    for (i, l) in readme.lines().enumerate() {
        match cur.as_mut() {
            None if l.trim_end() == MARK => {
                cur = Some(Block {
                    line: i + 1,
                    text: String::new(),
                    expects: Vec::new(),
                })
            }
            None => {}
            Some(_) if l.trim_end() == "```" => out.push(cur.take().unwrap()),
            Some(b) => {
                if let Some(e) = l.trim_start().strip_prefix("# expect:") {
                    b.expects
                        .push(e.split_whitespace().map(str::to_string).collect());
                }
                b.text.push_str(l);
                b.text.push('\n');
            }
        }
    }
    assert!(cur.is_none(), "unterminated walkthrough block in README.md");
    out
}

/// `want`'s words appear in `line` in order.
fn matches(line: &str, want: &[String]) -> bool {
    let mut words = line.split_whitespace();
    want.iter().all(|w| words.any(|x| x == w))
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), &dst).unwrap();
        }
    }
}

/// Kills bash's process group (and so the background server) on every exit path.
struct Group(u32);

impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: kill(2) with a negative pid signals the process group this test
        // created for bash (process_group(0) below); no memory is involved.
        unsafe { libc::kill(-(self.0 as i32), libc::SIGKILL) };
    }
}

#[test]
fn readme_walkthrough_runs_as_written() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let blocks = blocks(&readme);
    assert!(
        blocks.len() >= 3,
        "README.md has {} `{MARK}` blocks",
        blocks.len()
    );

    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path();
    for d in ["scripts", "ipxe", "ignition", "examples"] {
        copy_dir(&root.join(d), &work.join(d));
    }
    std::fs::create_dir_all(work.join("images")).unwrap();
    std::fs::copy(
        root.join("images/catalog.toml"),
        work.join("images/catalog.toml"),
    )
    .unwrap();

    let mut script = String::new();
    for b in &blocks {
        script.push_str(&format!("echo '{SEP}'\n{}", b.text));
    }

    let bin_dir = Path::new(support::bootplane::bin()).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let (api_port, http_port) = support::bootplane::two_free_ports();
    let mut cmd = Command::new("bash");
    cmd.args(["-euo", "pipefail", "-c", &script])
        .current_dir(work)
        .env("PATH", path)
        .env("RUST_LOG", "info");
    for (k, _) in std::env::vars() {
        if k.starts_with("BOOTPLANE_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("BOOTPLANE_API_LISTEN", format!("127.0.0.1:{api_port}"))
        .env("BOOTPLANE_HTTP_LISTEN", format!("127.0.0.1:{http_port}"))
        .env("BOOTPLANE_SERVER", format!("https://127.0.0.1:{api_port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd.spawn().expect("bash");
    let group = Group(child.id());
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });

    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // A background server still holds the pipes: end the group before reading to EOF.
    drop(group);
    let _ = child.wait();
    let out = out_reader.join().unwrap();
    let err = err_reader.join().unwrap();
    let log = std::fs::read_to_string(work.join("bootplane.log")).unwrap_or_default();
    let report = format!(
        "--- stdout\n{out}\n--- stderr\n{err}\n--- bootplane.log (last 40 lines)\n{}",
        support::bootplane::tail(&log, 40)
    );
    match status {
        None => panic!("the walk-through did not finish within 120 s\n{report}"),
        Some(st) => assert!(st.success(), "the walk-through failed ({st})\n{report}"),
    }

    // Output of block i is what follows the i-th separator.
    let outputs: Vec<&str> = out.split(&format!("{SEP}\n")).skip(1).collect();
    assert_eq!(outputs.len(), blocks.len(), "{report}");
    for (b, o) in blocks.iter().zip(outputs) {
        let mut lines = o.lines();
        for want in &b.expects {
            assert!(
                lines.any(|l| matches(l, want)),
                "README.md block at line {}: no output line (after the previous expected \
                 one) has `{}`; the block printed:\n{o}\n{report}",
                b.line,
                want.join(" ")
            );
        }
    }
}

#[test]
fn expect_lines_match_words_in_order() {
    let w = |s: &str| s.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    assert!(matches(
        "rack1-01   abc   <none>   On   Reserved   3s",
        &w("rack1-01 On Reserved")
    ));
    assert!(!matches(
        "rack1-01   Reserved   On",
        &w("rack1-01 On Reserved")
    ));
    assert!(!matches("rack1-011   On   Reserved", &w("rack1-01 On")));
    let b = blocks("x\n```sh walkthrough\necho hi\n# expect: hi\n```\n```sh\nnot run\n```\n");
    assert_eq!(b.len(), 1);
    assert_eq!(b[0].text, "echo hi\n# expect: hi\n");
    assert_eq!(b[0].expects, vec![w("hi")]);
}

/// The operator's steps the issue-23 review found missing stay in the executed part:
/// the demo image, Released → Available through the status subresource, and a SIGHUP
/// reload the appliance survives.
#[test]
fn walkthrough_covers_demo_image_recovery_and_reload() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let script: String = blocks(&readme).iter().map(|b| b.text.clone()).collect();
    for step in [
        "scripts/make-demo-image.sh",
        "reclaimPolicy: Retain",
        "grep -q Released",
        "bootplane apply --subresource=status",
        "kill -HUP %1",
    ] {
        assert!(script.contains(step), "the walk-through lost {step:?}");
    }
}
