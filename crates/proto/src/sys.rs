//! Small operating-system helpers shared by every layer: the wall clock as Unix
//! seconds, and child processes that die with bootplane.
//!
//! **Invariant:** every child bootplane starts and supervises (QEMU, NFS-Ganesha,
//! provisioning jobs) goes through [`die_with_parent`], so none outlives a bootplane
//! killed with SIGKILL.

use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds since the Unix epoch (0 if the clock is before it).
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Have the kernel SIGKILL the child `cmd` starts when the thread that spawned it
/// exits (`PR_SET_PDEATHSIG`). The death signal follows the spawning *thread*, so
/// spawn from a thread that lives as long as the child should (the runtime's worker
/// threads and bootplane's own launcher threads do).
pub fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs between fork and exec in the child, where only
    // async-signal-safe calls are allowed; prctl(2) and reading errno are.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_now_is_after_2020() {
        assert!(unix_now() > 1_577_836_800);
    }

    #[test]
    fn a_child_gets_sigkill_as_its_parent_death_signal() {
        // The spawning thread exits at once: the kernel must SIGKILL the child.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut cmd = Command::new("sleep");
            cmd.arg("30");
            die_with_parent(&mut cmd);
            let child = cmd.spawn().expect("spawn sleep");
            tx.send(child).unwrap();
            // the thread ends here: the kernel sends the child SIGKILL
        });
        let mut child = rx.recv().unwrap();
        let t0 = std::time::Instant::now();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                use std::os::unix::process::ExitStatusExt;
                assert_eq!(status.signal(), Some(libc::SIGKILL));
                break;
            }
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(10),
                "child outlived the thread that spawned it"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}
