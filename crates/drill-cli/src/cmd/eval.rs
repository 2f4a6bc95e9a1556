//! `drill eval`.

/// Arguments of `drill eval`.
#[derive(clap::Args)]
pub struct Args {}

/// Not yet.
pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("not built yet")
}
