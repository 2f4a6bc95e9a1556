//! `drill env`: what drill's environments are and what an agent sees. `list` prints every id;
//! `rollout` records one episode segment to a `.npz` numpy reads; `show` draws the
//! observation after some steps (stacked frames side by side) to a PNG. Both take the
//! wrapper options of a config's `[env]` table (`--config`) and `--set env.KEY=VALUE`.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use drill_config::Config;
use drill_env::atari::AtariOptions;
use drill_env::record::{Segment, record};
use drill_env::{ActionBuf, ActionSpace, ObsBuf, make_vec_with};
use npyz::WriterBuilder;
use rand::{Rng, SeedableRng};

/// Arguments of `drill env`.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand)]
enum What {
    /// Print every environment id drill knows, one per line.
    List,
    /// Record one episode segment: obs (exact dtype and shape), actions, rewards,
    /// terminated, truncated, into FILE.npz.
    Rollout {
        #[command(flatten)]
        run: Run,
        /// Output file (numpy's `np.load` reads it).
        #[arg(long)]
        out: PathBuf,
    },
    /// Draw the observation after --steps steps (stacked frames side by side) as a PNG.
    Show {
        #[command(flatten)]
        run: Run,
        /// Output PNG.
        #[arg(short, long)]
        out: PathBuf,
    },
}

/// Which env, seed and actions.
#[derive(clap::Args)]
struct Run {
    /// Environment id, e.g. PongNoFrameskip-v4.
    id: String,
    /// Seed of the reset (and of the random actions).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Actions: comma-separated indices (or, continuous, `;`-separated vectors of
    /// comma-separated values), or a file of them; default uniformly random.
    #[arg(long)]
    actions: Option<String>,
    /// Steps at most (default: as many as --actions lists, else 100). An episode's end stops
    /// the segment early.
    #[arg(long)]
    steps: Option<usize>,
    /// The evaluator's Atari chain (whole games, raw rewards) instead of training's.
    #[arg(long)]
    eval: bool,
    /// Take the wrapper options (`noop_max`, `episode_life`, `fire_reset`, ...) from this
    /// config's `[env]` table instead of drill's defaults (the id stays ID).
    #[arg(long)]
    config: Option<String>,
    /// Override a key, e.g. `--set env.noop_max=0 --set env.episode_life=false` to compare
    /// frames with another library's chain (repeatable; over --config or drill's defaults).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
}

/// Run `drill env`.
pub fn run(args: Args) -> anyhow::Result<()> {
    match args.what {
        What::List => {
            for id in drill_env::ids() {
                println!("{id}");
            }
            Ok(())
        }
        What::Rollout { run, out } => {
            let seg = segment(&run)?;
            write_npz(&seg, &out).with_context(|| format!("cannot write {}", out.display()))?;
            eprintln!(
                "{}: {} steps of {}, return {}",
                out.display(),
                seg.steps(),
                run.id,
                seg.rewards.iter().sum::<f32>()
            );
            Ok(())
        }
        What::Show { run, out } => {
            let seg = segment(&run)?;
            draw(&seg, &run.id, &out)?;
            eprintln!("{}: {} after {} steps", out.display(), run.id, seg.steps());
            Ok(())
        }
    }
}

/// The wrapper options `run` asks for: `[env]` of its config (or the defaults) with its
/// `--set` overrides, the evaluator's chain on top with `--eval`.
fn options(run: &Run) -> anyhow::Result<AtariOptions> {
    let cfg = match &run.config {
        Some(path) => Config::load(path, &run.set)?,
        None => {
            let id = toml::Value::String(run.id.clone());
            Config::parse(&format!("[env]\nid = {id}\n"), "drill env", &run.set)?
        }
    };
    let opts = cfg.env.atari;
    Ok(if run.eval { opts.eval() } else { opts })
}

fn segment(run: &Run) -> anyhow::Result<Segment> {
    let opts = options(run)?;
    let mut venv = make_vec_with(&run.id, 1, run.seed, 1, &opts)?;
    let space = venv.spec().action_space.clone();
    let given = run
        .actions
        .as_deref()
        .map(|a| parse_actions(a, &space))
        .transpose()?;
    let steps = run.steps.or(given.as_ref().map(Vec::len)).unwrap_or(100);
    if let Some(g) = &given
        && g.len() < steps
    {
        bail!(
            "--actions lists {} actions, fewer than --steps {steps}",
            g.len()
        );
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(run.seed);
    Ok(record(venv.as_mut(), run.seed, steps, |t| match &given {
        Some(g) => g[t].clone(),
        None => random_action(&space, &mut rng),
    })?)
}

fn random_action(space: &ActionSpace, rng: &mut impl Rng) -> ActionBuf {
    match space {
        ActionSpace::Discrete(n) => ActionBuf::Discrete(vec![rng.random_range(0..*n as u32)]),
        ActionSpace::Continuous { low, high } => ActionBuf::Continuous {
            dim: low.len(),
            values: low
                .iter()
                .zip(high)
                .map(|(l, h)| rng.random_range(*l..=*h))
                .collect(),
        },
    }
}

/// `--actions`: a file's contents or the text itself.
fn parse_actions(arg: &str, space: &ActionSpace) -> anyhow::Result<Vec<ActionBuf>> {
    let text = if Path::new(arg).is_file() {
        std::fs::read_to_string(arg).with_context(|| format!("cannot read --actions {arg}"))?
    } else {
        arg.to_string()
    };
    match space {
        ActionSpace::Discrete(n) => text
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|s| !s.is_empty())
            .map(|s| {
                let a: u32 = s
                    .parse()
                    .with_context(|| format!("--actions: {s:?} is not an action index"))?;
                if a as usize >= *n {
                    bail!("--actions: {a} is not one of the {n} actions (0..{n})");
                }
                Ok(ActionBuf::Discrete(vec![a]))
            })
            .collect(),
        ActionSpace::Continuous { low, .. } => text
            .split([';', '\n'])
            .filter(|s| !s.trim().is_empty())
            .map(|v| {
                let values = v
                    .split(',')
                    .map(|x| {
                        x.trim()
                            .parse::<f32>()
                            .with_context(|| format!("--actions: {x:?} is not a number"))
                    })
                    .collect::<anyhow::Result<Vec<f32>>>()?;
                if values.len() != low.len() {
                    bail!(
                        "--actions: {v:?} has {} values; the action has {}",
                        values.len(),
                        low.len()
                    );
                }
                Ok(ActionBuf::Continuous {
                    dim: low.len(),
                    values,
                })
            })
            .collect(),
    }
}

/// One array `name` of `shape` into the archive.
fn put<T: npyz::AutoSerialize>(
    npz: &mut npyz::npz::NpzWriter<std::io::BufWriter<std::fs::File>>,
    name: &str,
    shape: &[u64],
    values: impl IntoIterator<Item = T>,
) -> std::io::Result<()> {
    let mut w = npz
        .array::<T>(name, Default::default())?
        .default_dtype()
        .shape(shape)
        .begin_nd()?;
    w.extend(values)?;
    w.finish()
}

fn write_npz(seg: &Segment, path: &Path) -> std::io::Result<()> {
    let mut npz = npyz::npz::NpzWriter::create(path)?;
    let t = seg.steps() as u64;
    let mut shape = vec![t + 1];
    shape.extend(seg.shape.iter().map(|&s| s as u64));
    match &seg.obs {
        ObsBuf::U8(v) => put(&mut npz, "obs", &shape, v.iter().copied())?,
        ObsBuf::F32(v) => put(&mut npz, "obs", &shape, v.iter().copied())?,
    }
    match &seg.actions {
        ActionBuf::Discrete(a) => put(&mut npz, "actions", &[t], a.iter().map(|&x| i64::from(x)))?,
        ActionBuf::Continuous { dim, values } => put(
            &mut npz,
            "actions",
            &[t, *dim as u64],
            values.iter().copied(),
        )?,
    }
    put(&mut npz, "rewards", &[t], seg.rewards.iter().copied())?;
    put(&mut npz, "terminated", &[t], seg.terminated.iter().copied())?;
    put(&mut npz, "truncated", &[t], seg.truncated.iter().copied())
}

/// The last observation's frames side by side (oldest left), each pixel drawn 3x3, 4 pixels
/// apart.
fn draw(seg: &Segment, id: &str, out: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let ObsBuf::U8(v) = &seg.obs else {
        bail!(
            "drill env show draws image observations; {id} observes vectors (use `drill env rollout`)"
        );
    };
    let [k, h, w] = seg.shape[..] else {
        bail!(
            "{id} observes shape {:?}, not [frames, height, width]",
            seg.shape
        );
    };
    let last = &v[v.len() - k * h * w..];
    const SCALE: usize = 3;
    const GAP: usize = 4;
    let width = k * (w * SCALE + GAP) - GAP;
    let height = h * SCALE;
    let fail = |e: &dyn std::fmt::Display| anyhow::anyhow!("cannot write {}: {e}", out.display());
    let root = BitMapBackend::new(out, (width as u32, height as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    for f in 0..k {
        let x0 = f * (w * SCALE + GAP);
        for y in 0..h {
            for x in 0..w {
                let g = last[f * h * w + y * w + x];
                let (px, py) = ((x0 + x * SCALE) as i32, (y * SCALE) as i32);
                root.draw(&Rectangle::new(
                    [(px, py), (px + SCALE as i32, py + SCALE as i32)],
                    RGBColor(g, g, g).filled(),
                ))
                .map_err(|e| fail(&e))?;
            }
        }
    }
    root.present().map_err(|e| fail(&e))
}
