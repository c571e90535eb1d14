//! The static discovery agent: `bootplane-probe probe [...]` (installed as
//! `/bin/bootplane` in the discovery initramfs, so it runs as `bootplane probe`).

fn main() {
    eprintln!("bootplane probe: not built yet");
    std::process::exit(2);
}
