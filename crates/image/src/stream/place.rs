//! Where the provisioning stages run: the whole-image SHA-256 (the one serial stage) on a
//! CPU of its own, the reader, decoders and writers on the others.

/// Where the stages run: the hash thread on a CPU of its own and every other stage on
/// the rest, when the process may use two or more CPUs. The hash thread's CPU is the
/// allowed one that has taken the fewest device interrupts (`/proc/interrupts`): on a
/// two-core VM the block device's completions all land on one CPU, and a hash thread
/// there was runnable but off its core for 7-11 % of its wall time, pinned or not.
/// The decoders, reader and writers share the rest, which they need only part of.
pub(super) struct Placement {
    /// CPUs the process may use.
    pub cpus: usize,
    pub hash: libc::cpu_set_t,
    pub helpers: libc::cpu_set_t,
    pub before: libc::cpu_set_t,
}

impl Placement {
    /// The placement for the calling thread's allowed CPUs, or `None` with fewer than
    /// two (or when the kernel will not say).
    pub(crate) fn plan() -> Option<Placement> {
        // SAFETY: cpu_set_t is plain old data; the calls get its exact size.
        unsafe {
            let mut before: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut before) != 0
            {
                return None;
            }
            let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| libc::CPU_ISSET(c, &before))
                .collect();
            if cpus.len() < 2 {
                return None;
            }
            let irqs = std::fs::read_to_string("/proc/interrupts").unwrap_or_default();
            let load = device_interrupts(&irqs);
            let last = *cpus
                .iter()
                .rev()
                .min_by_key(|&&c| load.get(c).copied().unwrap_or(0))?;
            let mut hash: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(last, &mut hash);
            let mut helpers = before;
            libc::CPU_CLR(last, &mut helpers);
            Some(Placement {
                cpus: cpus.len(),
                hash,
                helpers,
                before,
            })
        }
    }

    /// Confine the calling thread to `set`; best effort.
    pub(crate) fn set(set: &libc::cpu_set_t) {
        // SAFETY: `set` is a valid cpu_set_t of the size given; 0 is the calling thread.
        unsafe {
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set);
        }
    }
}

/// Device interrupts taken per CPU so far, from the text of `/proc/interrupts` (the
/// numbered lines; the per-CPU timer, IPI and other named lines are left out). Empty
/// when the text is not in that shape.
pub(super) fn device_interrupts(text: &str) -> Vec<u64> {
    let mut lines = text.lines();
    let cpus = lines.next().map_or(0, |h| h.split_whitespace().count());
    let mut sum = vec![0u64; cpus];
    for line in lines {
        let Some((irq, rest)) = line.split_once(':') else {
            continue;
        };
        if irq.trim().parse::<u32>().is_err() {
            continue;
        }
        for (c, n) in rest.split_whitespace().take(cpus).enumerate() {
            sum[c] += n.parse::<u64>().unwrap_or(0);
        }
    }
    sum
}
