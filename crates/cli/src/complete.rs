//! `bootplane completion bash|zsh|fish` and `bootplane man`: shell completion scripts
//! and man pages generated from the CLI definition (clap_complete, clap_mangen), so
//! they cannot drift from the flags. The resource-type arguments (`get KIND`,
//! `delete KIND`, ...) are free strings to the parser (comma lists, short names); for
//! completion they are given the registry's names as possible values.

use std::io::Write;
use std::path::Path;

use anyhow::{Context as _, Result};
use clap::builder::PossibleValuesParser;

use crate::model::registry::Registry;

/// Names `get` takes besides the registry's types (served by their own endpoints).
const EXTRA_KINDS: [&str; 4] = ["leases", "jobs", "events", "all"];

/// Every resource name the CLI accepts: plurals, singulars, short names, plus
/// [`EXTRA_KINDS`], sorted.
pub(crate) fn resource_names() -> Vec<String> {
    let mut out: Vec<String> = EXTRA_KINDS.iter().map(|s| s.to_string()).collect();
    for t in &Registry::global().types {
        out.push(t.plural.clone());
        out.push(t.singular.clone());
        out.extend(t.short_names.iter().cloned());
    }
    out.sort();
    out.dedup();
    out
}

/// `cmd` with the resource names as possible values of every subcommand's `kind`
/// argument (for completion only: the parser keeps accepting anything).
pub(crate) fn with_resource_values(mut cmd: clap::Command) -> clap::Command {
    // clap keeps `&'static str` names (without its `string` feature): a few dozen short
    // strings, leaked once by a command that prints and exits.
    let names: Vec<&'static str> = resource_names()
        .into_iter()
        .map(|n| &*Box::leak(n.into_boxed_str()))
        .collect();
    let subs: Vec<String> = cmd
        .get_subcommands()
        .filter(|s| s.get_arguments().any(|a| a.get_id() == "kind"))
        .map(|s| s.get_name().to_string())
        .collect();
    for sub in subs {
        let names = names.clone();
        // `mut_args` keeps the arguments' order (`mut_arg` would move `kind` after
        // `name`, making a required positional follow an optional one).
        cmd = cmd.mut_subcommand(sub, move |s| {
            s.mut_args(move |a| {
                if a.get_id() == "kind" {
                    a.value_parser(PossibleValuesParser::new(names.clone()))
                } else {
                    a
                }
            })
        });
    }
    cmd
}

/// Write `shell`'s completion script for `cmd` to `out`.
pub fn completion(shell: clap_complete::Shell, cmd: clap::Command, out: &mut dyn Write) {
    let mut cmd = with_resource_values(cmd);
    let name = cmd.get_name().to_string();
    clap_complete::generate(shell, &mut cmd, name, out);
}

/// Man pages: with `dir`, one page per command and subcommand written into it
/// (`bootplane.1`, `bootplane-get.1`, ...); without, the top page on `out`.
pub fn man(cmd: clap::Command, dir: Option<&Path>, out: &mut dyn Write) -> Result<()> {
    let cmd = with_resource_values(cmd);
    match dir {
        Some(d) => {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
            clap_mangen::generate_to(cmd, d)
                .with_context(|| format!("writing man pages into {}", d.display()))?;
        }
        None => clap_mangen::Man::new(cmd)
            .render(out)
            .context("writing the man page")?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_cover_the_registry() {
        let n = super::resource_names();
        for want in ["servers", "server", "serverclaims", "jobs", "leases"] {
            assert!(n.iter().any(|x| x == want), "{want} missing from {n:?}");
        }
    }
}
