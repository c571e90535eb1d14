//! The static discovery agent: `bootplane-probe probe [...]` (installed as
//! `/bin/bootplane` in the discovery initramfs, so it runs as `bootplane probe`).

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(bootplane_probe::cli::run(&args));
}
