//! The command-line client (`apply`, `get`, `delete`) that talks to the REST API.

use clap::Args;

#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// File, directory or `-` for stdin (repeatable).
    #[arg(short = 'f', long = "filename", required = true)]
    pub files: Vec<String>,
}

#[derive(Debug, Args)]
pub struct GetArgs {
    pub kind: String,
    pub name: Option<String>,
}

#[derive(Debug, Args)]
pub struct DeleteArgs {
    pub kind: String,
    pub name: String,
}

pub fn apply(_a: ApplyArgs) -> anyhow::Result<u8> {
    anyhow::bail!("not built yet")
}
pub fn get(_a: GetArgs) -> anyhow::Result<u8> {
    anyhow::bail!("not built yet")
}
pub fn delete(_a: DeleteArgs) -> anyhow::Result<u8> {
    anyhow::bail!("not built yet")
}
