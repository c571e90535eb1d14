//! Running programs from tests: to completion (`run`, `must`, `tool`), with a hard
//! time limit (`run_cmd`, `run_bounded`), as a child killed on drop ([`Proc`]), and
//! polling for a condition with a deadline (`wait_for`).

use std::io::Read as _;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Run `cmd ARGS` to completion (no time limit); panics only when it cannot start.
pub fn run(cmd: &str, args: &[&str]) -> Output {
    Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {cmd}: {e}"))
}

/// Run `cmd ARGS`; panics (with its output) unless it succeeds; returns its stdout.
pub fn must(cmd: &str, args: &[&str]) -> String {
    let out = run(cmd, args);
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A command's stdout and stderr, joined (for assertion messages).
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Run a command to completion within `secs` (stdin empty, output captured); panics
/// on timeout (showing the output so far) or when the program is missing.
pub fn run_cmd(cmd: &mut Command, secs: u64) -> Output {
    run_for(cmd, Duration::from_secs(secs))
}

/// [`run_cmd`] with any time limit.
pub fn run_for(cmd: &mut Command, limit: Duration) -> Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run {cmd:?} (install it: scripts/test-packages.txt): {e}")
        });
    wait_output(child, limit, &format!("{cmd:?}"))
}

/// Collect `child`'s piped stdout and stderr (read while it runs, so a full pipe
/// cannot stall it) and wait for it to exit within `limit`; on timeout it is killed
/// and the test panics, showing what it printed.
pub fn wait_output(mut child: Child, limit: Duration, what: &str) -> Output {
    let deadline = Instant::now() + limit;
    let drain = |r: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut v);
            }
            v
        })
    };
    let to = drain(child.stdout.take().map(|o| Box::new(o) as _));
    let te = drain(child.stderr.take().map(|e| Box::new(e) as _));
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return Output {
                status,
                stdout: to.join().unwrap(),
                stderr: te.join().unwrap(),
            };
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{what} did not finish within {limit:?}\nstdout: {}\nstderr: {}",
                String::from_utf8_lossy(&to.join().unwrap()),
                String::from_utf8_lossy(&te.join().unwrap())
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Run `name ARGS` within 120 s; panics unless it succeeds.
pub fn tool(name: &str, args: &[&str]) -> Output {
    let o = run_cmd(Command::new(name).args(args), 120);
    assert!(
        o.status.success(),
        "{name} {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// Run a command with a hard time limit (via coreutils `timeout -s KILL`): unlike
/// [`run_cmd`] a timeout does not panic, the output says the command was killed.
pub fn run_bounded(c: Command, secs: u32) -> Output {
    let mut t = Command::new("timeout");
    t.arg("-s")
        .arg("KILL")
        .arg(secs.to_string())
        .arg(c.get_program())
        .args(c.get_args());
    for (k, v) in c.get_envs() {
        match v {
            Some(v) => t.env(k, v),
            None => t.env_remove(k),
        };
    }
    if let Some(d) = c.get_current_dir() {
        t.current_dir(d);
    }
    t.output().expect("running bounded command")
}

/// A child process killed (SIGKILL) and reaped on drop.
pub struct Proc {
    pub child: Child,
}

impl Proc {
    pub fn spawn(mut c: Command) -> Proc {
        let child = c.spawn().expect("spawning process");
        Proc { child }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The contents of `p`, or "" when it cannot be read.
pub fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// Poll `cond` every 50 ms until it holds or `limit` passes (then panic with `msg()`).
pub fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool, msg: impl Fn() -> String) {
    let t = Instant::now();
    while t.elapsed() < limit {
        if cond() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out after {limit:?}: {}", msg());
}

/// Remove ANSI escape sequences (`ESC [ ... letter`, `ESC ( X`) and carriage returns (a
/// serial console as text).
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        match c {
            '\u{1b}' => match it.next() {
                Some('[') => {
                    for d in it.by_ref() {
                        if d.is_ascii_alphabetic() {
                            break;
                        }
                    }
                }
                Some(_) => {
                    it.next();
                }
                None => {}
            },
            '\r' => {}
            c => out.push(c),
        }
    }
    out
}
