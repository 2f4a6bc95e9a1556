//! `drill plot`.

/// Arguments of `drill plot`.
#[derive(clap::Args)]
pub struct Args {}

/// Not yet.
pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("not built yet")
}
