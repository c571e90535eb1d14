//! `bootplane image ...` and `bootplane provision` command-line entry points.
//!
//! `run_provision` returns the process exit code; the codes are listed in
//! [`super::error`] (0 success, 2 usage, 10-14 source/image problems, 20-23 target
//! problems, 1 internal).

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::stream::FrameSha;

/// `--frame-sha256`: the streamer's [`FrameSha`] as a clap value (the image crate has no clap).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum FrameShaArg {
    /// On when the machine has at least 4 cores.
    #[default]
    Auto,
    On,
    Off,
}

impl From<FrameShaArg> for FrameSha {
    fn from(a: FrameShaArg) -> FrameSha {
        match a {
            FrameShaArg::Auto => FrameSha::Auto,
            FrameShaArg::On => FrameSha::On,
            FrameShaArg::Off => FrameSha::Off,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum ImageCmd {
    /// Pack a raw image into bootplane's framed zstd format with a manifest.
    Pack(PackArgs),
}

#[derive(Debug, Args)]
pub struct PackArgs {
    /// Raw input image.
    pub input: PathBuf,
    /// Output file (a multi-frame .zst with a seek table).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Manifest path (default: OUTPUT.manifest.json).
    #[arg(long)]
    pub manifest: Option<PathBuf>,
    /// Raw bytes per frame, in MiB (1-64).
    #[arg(long, default_value_t = 4)]
    pub frame_mib: u64,
    /// zstd compression level.
    #[arg(long, default_value_t = 3)]
    pub level: i32,
    /// Compression threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
}

#[derive(Debug, Args)]
pub struct ProvisionArgs {
    /// Image source: a path, nfs://host[:port]/export/path or http://...
    #[arg(long)]
    pub source: String,
    /// Target block device or file.
    #[arg(long)]
    pub target: PathBuf,
    /// Manifest (path or URL); default: SOURCE.manifest.json when it exists.
    #[arg(long)]
    pub manifest: Option<String>,
    /// Expected SHA-256 of the raw image (required without a manifest; must match it otherwise).
    #[arg(long)]
    pub sha256: Option<String>,
    /// Check each frame's SHA-256 from the manifest in parallel (auto: with 4+ cores).
    #[arg(long, value_enum, default_value_t = FrameShaArg::Auto)]
    pub frame_sha256: FrameShaArg,
    /// Skip writing all-zero ranges where the target reads back zeros (new file, BLKZEROOUT).
    #[arg(long)]
    pub zero_skip: bool,
    /// Ignore any checkpoint and start from the beginning.
    #[arg(long)]
    pub no_resume: bool,
    /// Ignored (kept so existing job definitions still run): a resume always re-reads
    /// what the checkpoint covers and checks it against the checkpoint's hash, since
    /// trusting it let a target changed between the kill and the resume end up with a
    /// wrong image and exit 0.
    #[arg(long, hide = true)]
    pub trust_checkpoint: bool,
    /// Checkpoint file (default: TARGET.bootplane-checkpoint, or /var/tmp/bootplane-DEV.checkpoint for devices).
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    /// Keep the checkpoint on the target, in a block of its held first MiB, instead of a
    /// file (survives a reset of a machine with no persistent state; what the agent's
    /// `bootplane probe install` does).
    #[arg(long, conflicts_with = "checkpoint")]
    pub checkpoint_on_target: bool,
    /// Limit the copy to this many bytes per second (spare a shared source).
    #[arg(long)]
    pub max_rate: Option<u64>,
    /// Decoder threads (default: all cores).
    #[arg(long)]
    pub decoders: Option<usize>,
    /// Writes in flight.
    #[arg(long, default_value_t = 3)]
    pub writers: usize,
    /// Leave every stage where the kernel puts it, instead of giving the whole-image
    /// SHA-256 (the one serial stage) a CPU of its own and the other stages the rest
    /// (done when the job may use two or more CPUs).
    #[arg(long)]
    pub no_pin: bool,
    /// No progress output.
    #[arg(long, short)]
    pub quiet: bool,
    /// Refuse a target that is a symbolic link (the appliance's job runner passes the
    /// path it resolved and checked against `[provision.jobs]`).
    #[arg(long)]
    pub no_follow_target: bool,
}

pub fn run_image(cmd: ImageCmd) -> anyhow::Result<()> {
    match cmd {
        ImageCmd::Pack(a) => {
            let manifest = a
                .manifest
                .clone()
                .unwrap_or_else(|| super::pack::manifest_path(&a.output));
            let mut opts = super::pack::PackOptions {
                frame_size: a.frame_mib << 20,
                level: a.level,
                ..Default::default()
            };
            if let Some(t) = a.threads {
                opts.threads = t;
            }
            let m = super::pack::pack(&a.input, &a.output, &manifest, &opts)?;
            eprintln!(
                "packed {} raw bytes into {} bytes, {} frames, sha256 {}; manifest {}",
                m.raw_size,
                m.compressed_size,
                m.frames.len(),
                m.sha256,
                manifest.display()
            );
            Ok(())
        }
    }
}

pub fn run_provision(a: ProvisionArgs) -> anyhow::Result<i32> {
    if a.trust_checkpoint {
        eprintln!("warning: --trust-checkpoint is ignored: a checkpoint is always checked against the target before resuming");
    }
    let opts = super::stream::Options {
        source: a.source,
        target: a.target,
        manifest: a.manifest,
        sha256: a.sha256,
        frame_sha256: a.frame_sha256.into(),
        zero_skip: a.zero_skip,
        resume: !a.no_resume,
        checkpoint: a.checkpoint,
        checkpoint_on_target: a.checkpoint_on_target,
        max_rate: a.max_rate,
        decoders: a.decoders,
        writers: a.writers,
        pin_hash: !a.no_pin,
        quiet: a.quiet,
        no_follow_target: a.no_follow_target,
        schemes: vec![super::nfs::SCHEME],
    };
    match super::stream::provision(&opts) {
        Ok(_) => Ok(0),
        Err(e) => {
            if a.quiet {
                eprintln!("error: {e}");
            }
            Ok(e.exit_code())
        }
    }
}
