//! The static discovery agent: `bootplane-probe probe [...]` (installed as
//! `/bin/bootplane` in the discovery initramfs, so it runs as `bootplane probe`).

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = bootplane_probe::cli::run(&args);
    if code != 0 && std::process::id() == 1 {
        // PID 1 of the discovery image: its exit panics the kernel at once, and the
        // panic's messages would cut the reason just written to the console mid-line
        // (seen: "...; not retry[ 12.116870] Kernel panic ...ing"). The console sends it
        // first.
        bootplane_probe::sys::drain_console();
    }
    std::process::exit(code);
}
