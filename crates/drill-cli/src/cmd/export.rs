//! `drill export`: a checkpoint's policy for PyTorch and DI-engine (safetensors in PyTorch's
//! layout under DI-engine's names), with an optional probe to check it against.

use anyhow::{Context, bail};
use drill_algo::checkpoint::Checkpoint;
use drill_algo::compute::select_device;
use drill_config::Config;
use std::path::PathBuf;

/// Arguments of `drill export`.
#[derive(clap::Args)]
pub struct Args {
    /// A checkpoint written by `drill train` (`EXP/ckpt/*.safetensors`).
    pub checkpoint: PathBuf,
    /// Target format: `torch` (safetensors for `load_state_dict`, DI-engine's names).
    #[arg(long, default_value = "torch")]
    pub format: String,
    /// Output file.
    #[arg(short, long)]
    pub out: PathBuf,
    /// The config it was trained with (default: `config.toml` of the checkpoint's experiment
    /// folder).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Also write `OUT.probe.safetensors`: N observations of the env and drill's outputs for
    /// them (Q-values; or logits / mean and std, and values), for `scripts/check_export.py`.
    #[arg(long, value_name = "N")]
    pub probe: Option<usize>,
}

/// Export, and probe if asked.
pub fn run(args: Args) -> anyhow::Result<()> {
    match args.format.as_str() {
        "torch" => {}
        "onnx" => bail!(
            "--format onnx: drill does not write ONNX (the Rust crates that write it are 0.1 releases for linear and tree models, or raw protobuf); export --format torch and convert with torch.onnx.export (README, \"Exporting to PyTorch and DI-engine\")"
        ),
        other => bail!("--format {other:?}: expected torch"),
    }
    let config_path = match &args.config {
        Some(c) => c.clone(),
        None => drill_algo::inference::config_beside(&args.checkpoint).with_context(|| {
            format!(
                "{}: no config.toml in its experiment folder; give --config",
                args.checkpoint.display()
            )
        })?,
    };
    let config = Config::load(&config_path.display().to_string(), &[])?;
    let ck = Checkpoint::load(&args.checkpoint)?;
    let state = drill_algo::export::to_torch(&config, &ck)?;
    let mut out = Checkpoint::default();
    out.meta.insert("format".into(), "pt".into());
    // VAC's aliases (`actor.0.…` for `actor_encoder.…`) hold no parameters of their own.
    let params: usize = state
        .iter()
        .filter(|(k, _)| !k.starts_with("actor.") && !k.starts_with("critic."))
        .map(|(_, (_, v))| v.len())
        .sum();
    let names = state.len();
    out.tensors = state;
    out.save(&args.out)?;
    println!(
        "{}: {names} tensors, {params} parameters, PyTorch layout, DI-engine's names",
        args.out.display()
    );
    if let Some(n) = args.probe {
        let device = select_device(&config)?;
        let p = drill_algo::export::probe(&config, &ck, n.max(1), config.seed, &device)?;
        let mut probe = Checkpoint::default();
        probe.tensors.insert("obs".into(), p.obs);
        probe.tensors.extend(p.outputs);
        let path = args.out.with_extension("probe.safetensors");
        probe.save(&path)?;
        println!("{}: {n} observations and drill's outputs", path.display());
    }
    Ok(())
}
