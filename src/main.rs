//! The `bootplane` binary: command-line parsing and dispatch only.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};

use bootplane::config::{Config, Overrides};

#[derive(Parser)]
#[command(
    name = "bootplane",
    version,
    about = "Boot and image-serving appliance for bare-metal fleets"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the appliance (API, boot HTTP, controllers; DHCP/TFTP when configured).
    Serve(ServeArgs),
    /// Validate a config file (and flags) and print the effective config (secrets as
    /// `<redacted>`).
    CheckConfig(CheckArgs),
    /// Create or update objects from YAML/JSON files (multi-document), a directory or `-`
    /// (three-way merge with the last-applied configuration, as kubectl's).
    Apply(bootplane::cli::ApplyArgs),
    /// List or show objects.
    Get(bootplane::cli::GetArgs),
    /// Delete objects: by name (several), `-l SELECTOR` or `-f FILE`.
    Delete(bootplane::cli::DeleteArgs),
    /// Show one object in detail: summary, conditions, references, owners, events.
    Describe(bootplane::cli::describe::DescribeArgs),
    /// Change an object with a merge patch or a JSON patch (`--type json`).
    Patch(bootplane::cli::PatchArgs),
    /// Set (`KEY=VALUE`) or remove (`KEY-`) an object's labels.
    Label(bootplane::cli::LabelArgs),
    /// Set (`KEY=VALUE`) or remove (`KEY-`) an object's annotations.
    Annotate(bootplane::cli::AnnotateArgs),
    /// Edit an object as YAML in `$EDITOR` (then `$VISUAL`, else `vi`).
    Edit(bootplane::cli::EditArgs),
    /// Confirm a power change made by hand (manual power driver).
    Power(bootplane::cli::PowerArgs),
    /// Image tools.
    #[command(subcommand)]
    Image(bootplane::image::cli::ImageCmd),
    /// Stream an image onto a disk or file, verified.
    Provision(bootplane::image::cli::ProvisionArgs),
    /// Print what a machine would be served (Ignition config).
    #[command(subcommand)]
    Render(bootplane::cli::render::RenderCmd),
    /// Named API tokens: `bootplane token create NAME --role ROLE [--ttl 24h]`, `list`,
    /// `revoke NAME`.
    #[command(subcommand)]
    Token(bootplane::cli::token::TokenCmd),
    /// Client certificates for the API (`issue NAME --role ROLE`, `revoke`, `list`); run
    /// on the appliance (it reads the CA in the state dir).
    #[command(subcommand)]
    Cert(bootplane::cli::cert::CertCmd),
    /// The client config: clusters, users, contexts (`bootplane config use-context NAME`).
    #[command(subcommand)]
    Config(bootplane::cli::config::ConfigCmd),
    /// The store itself (`bootplane store migrate --to etcd|embedded`; on etcd, the
    /// cluster's secrets keyring: `keygen`, `join`, `admit`, `rotate`, `keys`, `remove`).
    #[command(subcommand)]
    Store(StoreCmd),
    /// The discovery agent: print or post this machine's inventory (see docs/discovery.md;
    /// `bootplane probe --help`).
    #[command(disable_help_flag = true)]
    Probe {
        /// Passed to the agent: [--url URL] [--root DIR] [--lldp-wait S] [--deadline S]
        /// [--print] [--poweroff]; or `wipe (--device DEV ... | --all) --policy
        /// metadata|full [--report URL] [--deadline S] [--poweroff]` (docs/wipe.md).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Print the CustomResourceDefinitions of the kinds bootplane serves from CRDs
    /// (metal-operator's for metal.ironcore.dev, bootplane's own for
    /// provisioning.bootplane.dev), as one YAML stream: the same manifests a real
    /// cluster takes (`bootplane crds | kubectl apply -f -`).
    Crds,
    /// Print a shell completion script: `source <(bootplane completion bash)`, or save it
    /// as /usr/share/bash-completion/completions/bootplane (zsh: `_bootplane` on
    /// $fpath; fish: ~/.config/fish/completions/bootplane.fish).
    Completion {
        /// The shell to complete for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (bootplane.1) generated from this CLI, or with `--dir` write
    /// one page per command into a directory.
    Man {
        /// Write bootplane.1, bootplane-get.1, ... into this directory.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

/// The config file and every config key that has a flag ([`Overrides`]). Each flag
/// also reads a BOOTPLANE_* env var.
#[derive(Args, Default, Clone)]
struct ConfigFlags {
    /// TOML config file.
    #[arg(long, env = "BOOTPLANE_CONFIG")]
    config: Option<PathBuf>,
    #[command(flatten)]
    overrides: Overrides,
}

impl ConfigFlags {
    fn resolve(self) -> Result<Config> {
        Config::resolve(self.config.as_deref(), self.overrides)
    }
}

#[derive(Subcommand)]
enum StoreCmd {
    /// Copy every object from the configured embedded store (the state dir) into etcd
    /// (`[store.etcd]`), or back; the destination must be empty. Stop every appliance
    /// first (docs/cluster.md).
    Migrate(MigrateArgs),
    /// On the first appliance of a cluster on etcd: make this appliance's identity and
    /// the cluster's secrets keyring in etcd (adopting the key file's keys when it
    /// exists), wrapped for this appliance. Refused when the cluster has a keyring.
    Keygen(KeyringArgs),
    /// On a new appliance: make its identity and ask to join the cluster's keyring;
    /// prints the `admit` command to run on an appliance of the cluster.
    Join(KeyringArgs),
    /// On an appliance of the cluster: wrap the keyring for appliance NAME, whose join
    /// request must have the fingerprint `store join` printed there.
    Admit(AdmitArgs),
    /// On an appliance of the cluster: put a new key first in the keyring, for every
    /// appliance; each re-seals the Secrets in the background.
    Rotate(RotateArgs),
    /// List the keyring's members and pending join requests (with fingerprints).
    Keys(KeyringArgs),
    /// Take appliance NAME out of the keyring (its wrapping and join request): later
    /// rotations no longer wrap the keys for it. Rotate after removing one.
    Remove(RemoveArgs),
}

#[derive(Args)]
struct RemoveArgs {
    /// The appliance's name (its `store.etcd.name`).
    name: String,
    #[command(flatten)]
    flags: ConfigFlags,
}

#[derive(Args)]
struct KeyringArgs {
    #[command(flatten)]
    flags: ConfigFlags,
}

#[derive(Args)]
struct AdmitArgs {
    /// The joining appliance's name (its `store.etcd.name`).
    name: String,
    /// The fingerprint `bootplane store join` printed on that appliance.
    #[arg(long)]
    fingerprint: String,
    #[command(flatten)]
    flags: ConfigFlags,
}

#[derive(Args)]
struct RotateArgs {
    /// Instead of adding a key: keep only the first one (refused while any sealed
    /// object is still under an older key).
    #[arg(long)]
    drop_old: bool,
    #[command(flatten)]
    flags: ConfigFlags,
}

#[derive(Args)]
struct MigrateArgs {
    /// The engine to copy into: `etcd` (from the state dir's store) or `embedded`
    /// (from etcd into the state dir's store).
    #[arg(long, value_enum)]
    to: MigrateTo,
    #[command(flatten)]
    flags: ConfigFlags,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum MigrateTo {
    Etcd,
    Embedded,
}

#[derive(Args)]
struct ServeArgs {
    #[command(flatten)]
    flags: ConfigFlags,
}

#[derive(Args)]
struct CheckArgs {
    /// Config file to check.
    file: Option<PathBuf>,
    /// Print only "config ok" (or the error), not the effective config.
    #[arg(short, long)]
    quiet: bool,
    #[command(flatten)]
    flags: ConfigFlags,
}

fn init_logging(cfg: &Config) -> bootplane::logging::FilterHandle {
    bootplane::logging::init(bootplane::logging::Setup {
        filter: &cfg.log.filter,
        json: cfg.log.format == "json",
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(cli: Cli) -> Result<u8> {
    match cli.cmd {
        Command::Serve(a) => {
            let flags = a.flags.clone();
            let cfg = a.flags.resolve()?;
            let log_filter = init_logging(&cfg);
            let reload = bootplane::serve::Reload {
                config: std::sync::Arc::new(move || flags.clone().resolve()),
                log_filter,
            };
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            rt.block_on(bootplane::serve::run(cfg, reload))?;
            Ok(0)
        }
        Command::Completion { shell } => {
            use clap::CommandFactory;
            let mut out = std::io::stdout().lock();
            bootplane::cli::complete::completion(shell, Cli::command(), &mut out);
            Ok(0)
        }
        Command::Crds => {
            use std::io::Write as _;
            let mut out = std::io::stdout().lock();
            out.write_all(bootplane::model::registry::crds_yaml().as_bytes())?;
            Ok(0)
        }
        Command::Man { dir } => {
            use clap::CommandFactory;
            let mut out = std::io::stdout().lock();
            bootplane::cli::complete::man(Cli::command(), dir.as_deref(), &mut out)?;
            Ok(0)
        }
        Command::CheckConfig(mut a) => {
            if a.file.is_some() {
                a.flags.config = a.file.take();
            }
            let cfg = a.flags.resolve()?;
            if !a.quiet {
                // Secrets never printed: this may go to a terminal, a file or a journal.
                print!("{}", toml::to_string_pretty(&cfg.redacted())?);
            }
            eprintln!("config ok");
            Ok(0)
        }
        Command::Config(c) => bootplane::cli::config::run(c),
        Command::Apply(a) => bootplane::cli::apply(a),
        Command::Get(a) => bootplane::cli::get(a),
        Command::Delete(a) => bootplane::cli::delete(a),
        Command::Describe(a) => bootplane::cli::describe::describe(a),
        Command::Patch(a) => bootplane::cli::patch(a),
        Command::Label(a) => bootplane::cli::label(a),
        Command::Annotate(a) => bootplane::cli::annotate(a),
        Command::Edit(a) => bootplane::cli::edit(a),
        Command::Power(a) => bootplane::cli::power(a),
        Command::Image(c) => bootplane::image::cli::run_image(c).map(|_| 0),
        Command::Provision(a) => bootplane::image::cli::run_provision(a).map(|c| c as u8),
        Command::Render(c) => bootplane::cli::render::run(c),
        Command::Token(c) => bootplane::cli::token::run(c),
        Command::Cert(c) => bootplane::cli::cert::run(c),
        #[cfg(feature = "etcd")]
        Command::Store(StoreCmd::Migrate(a)) => {
            let cfg = a.flags.resolve()?;
            init_logging(&cfg);
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            rt.block_on(async {
                use bootplane::store::{etcd::EtcdKv, seal::Sealer, Backend, Store};
                // Objects are decrypted as read and encrypted again as written: the
                // embedded store with the key file's keys, etcd with the cluster's
                // keyring when it has one (else the same key file).
                let sealer = Sealer::load(&cfg.store.key_file(&cfg.state_dir))?;
                let embedded = Store::open_with(&cfg.state_dir, sealer)?;
                let (keys, _) =
                    bootplane::store::etcd::keyring::sealer_for(&cfg.store, &cfg.state_dir).await?;
                let etcd = EtcdKv::open(&cfg.store.etcd, keys).await?;
                let etcd = Store::with_backend(Backend::Etcd(etcd));
                let (from, to, what) = match a.to {
                    MigrateTo::Etcd => (&embedded, &etcd, "into etcd"),
                    MigrateTo::Embedded => (&etcd, &embedded, "into the embedded store"),
                };
                let n = bootplane::store::migrate::migrate(from, to).await;
                for s in [embedded.clone(), etcd.clone()] {
                    tokio::task::spawn_blocking(move || s.close()).await?;
                }
                eprintln!("copied {} objects {what}", n?);
                anyhow::Ok(())
            })?;
            Ok(0)
        }
        #[cfg(feature = "etcd")]
        Command::Store(c) => keyring(c),
        #[cfg(not(feature = "etcd"))]
        Command::Store(_) => {
            anyhow::bail!("store: this bootplane was built without the etcd feature")
        }
        Command::Probe { args } => Ok(bootplane_probe::cli::run(&args).clamp(0, 255) as u8),
    }
}

/// The keyring's subcommands (`bootplane store keygen|join|admit|rotate|keys`).
#[cfg(feature = "etcd")]
fn keyring(c: StoreCmd) -> Result<u8> {
    use bootplane::store::etcd::keyring as k;
    let flags = match &c {
        StoreCmd::Migrate(_) => unreachable!("dispatched before"),
        StoreCmd::Keygen(a) | StoreCmd::Join(a) | StoreCmd::Keys(a) => a.flags.clone(),
        StoreCmd::Admit(a) => a.flags.clone(),
        StoreCmd::Rotate(a) => a.flags.clone(),
        StoreCmd::Remove(a) => a.flags.clone(),
    };
    let cfg = flags.resolve()?;
    init_logging(&cfg);
    if cfg.store.backend != bootplane::store::settings::BackendKind::Etcd {
        anyhow::bail!(
            "the secrets keyring is for appliances on etcd: this config has store.backend = \"embedded\" (its key file is {})",
            cfg.store.key_file(&cfg.state_dir).display()
        );
    }
    let (store, dir) = (&cfg.store, cfg.state_dir.as_path());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        match c {
            StoreCmd::Migrate(_) => unreachable!("dispatched before"),
            StoreCmd::Keygen(_) => {
                bootplane::statedir::prepare(dir, &[])?;
                let r = k::keygen(store, dir).await?;
                match &r.adopted {
                    Some(p) => println!(
                        "the cluster's keyring holds the keys of {} ({}); this appliance ({}) is its first member",
                        p.display(),
                        r.keys.join(", "),
                        r.member
                    ),
                    None => println!(
                        "the cluster's keyring holds a new key ({}); this appliance ({}) is its first member",
                        r.keys.join(", "),
                        r.member
                    ),
                }
                println!("fingerprint: {}", r.fingerprint);
                println!("add an appliance: `bootplane store join` on it, then the `admit` it prints here");
            }
            StoreCmd::Join(_) => {
                bootplane::statedir::prepare(dir, &[])?;
                let r = k::join(store, dir).await?;
                println!("fingerprint: {}", r.fingerprint);
                if r.already {
                    println!("{} is a member of the cluster's keyring already", r.member);
                } else {
                    println!("asked to join the cluster's keyring as {}; on an appliance of the cluster, run:", r.member);
                    println!("  {}", r.admit_command());
                }
            }
            StoreCmd::Admit(a) => {
                let r = k::admit(store, dir, &a.name, &a.fingerprint).await?;
                println!(
                    "admitted {} (keyring generation {}): it may start now",
                    r.member, r.generation
                );
            }
            StoreCmd::Rotate(a) => {
                let r = k::rotate(store, dir, a.drop_old).await?;
                println!(
                    "keyring generation {}: keys {}; wrapped for {}; each appliance re-seals in the background",
                    r.generation,
                    r.keys.join(", "),
                    r.members.join(", ")
                );
            }
            StoreCmd::Remove(a) => {
                if k::remove(store, &a.name).await? {
                    println!("removed {} from the cluster's keyring; run `bootplane store rotate` so that new writes use a key it never had", a.name);
                } else {
                    println!("{} has no wrapping or join request in the cluster's keyring", a.name);
                }
            }
            StoreCmd::Keys(_) => {
                let r = k::keys(store).await?;
                if r.members.is_empty() && r.requests.is_empty() {
                    println!("the cluster has no keyring: each appliance reads its key file (`bootplane store keygen` makes one)");
                    return anyhow::Ok(());
                }
                println!("MEMBER\tFINGERPRINT\tENDORSED BY");
                for (n, fp, by) in &r.members {
                    println!("{n}\t{fp}\t{by}");
                }
                for (n, fp) in &r.requests {
                    println!("{n}\t{fp}\t(join requested: bootplane store admit {n} --fingerprint {fp})");
                }
            }
        }
        anyhow::Ok(())
    })?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }

    /// Every argument and flag of every command (and the commands themselves) has a
    /// help line, so `--help`, the man page and completions describe all of them.
    #[test]
    fn every_argument_has_help() {
        use clap::CommandFactory;
        fn walk(c: &clap::Command, path: &str, missing: &mut Vec<String>, seen: &mut usize) {
            *seen += 1;
            for a in c.get_arguments() {
                if a.get_help().is_none() && a.get_long_help().is_none() {
                    missing.push(format!("{path} {}", a.get_id()));
                }
            }
            for s in c.get_subcommands() {
                if s.get_about().is_none() && s.get_long_about().is_none() {
                    missing.push(format!("{path} {} (the command)", s.get_name()));
                }
                walk(s, &format!("{path} {}", s.get_name()), missing, seen);
            }
        }
        let mut cmd = super::Cli::command();
        cmd.build();
        let (mut missing, mut seen) = (Vec::new(), 0);
        walk(&cmd, "bootplane", &mut missing, &mut seen);
        assert!(seen > 20, "only {seen} commands walked");
        assert!(missing.is_empty(), "without help:\n{}", missing.join("\n"));
    }
}
