//! The benches' command-line options: `--name VALUE`, one reader for every bench.
#![allow(dead_code)]

/// The value after `name` on the command line, or `default` when the option is absent;
/// a value that does not parse stops the bench with a message (never a silent default).
pub fn arg<T: std::str::FromStr>(name: &str, default: T) -> T {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == name) {
        None => default,
        Some(i) => {
            let v = args
                .get(i + 1)
                .unwrap_or_else(|| panic!("{name} needs a value"));
            v.parse()
                .unwrap_or_else(|_| panic!("{name} {v:?}: not a valid value"))
        }
    }
}
