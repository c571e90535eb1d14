//! `bootplane image ...` and `bootplane provision` command-line entry points.

use clap::{Args, Subcommand};

#[derive(Debug, Subcommand)]
pub enum ImageCmd {
    /// Pack a raw image into bootplane's framed zstd format with a manifest.
    Pack(PackArgs),
}

#[derive(Debug, Args)]
pub struct PackArgs {
    /// Raw input image.
    pub input: std::path::PathBuf,
    /// Output file.
    #[arg(short, long)]
    pub output: std::path::PathBuf,
}

#[derive(Debug, Args)]
pub struct ProvisionArgs {
    /// Image source: a path, nfs://host/export/path or http(s)://...
    #[arg(long)]
    pub source: String,
    /// Target block device or file.
    #[arg(long)]
    pub target: std::path::PathBuf,
    #[arg(long)]
    pub manifest: Option<String>,
    #[arg(long)]
    pub sha256: Option<String>,
}

pub fn run_image(_cmd: ImageCmd) -> anyhow::Result<()> {
    anyhow::bail!("image packing is not built yet")
}

pub fn run_provision(_args: ProvisionArgs) -> anyhow::Result<i32> {
    anyhow::bail!("provisioning is not built yet")
}
