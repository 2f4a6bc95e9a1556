//! Where a run starts: its experiment folder (new, or after a launcher restart the folder the
//! first attempt made, resumed from its newest checkpoint), the checkpoint to start from, and
//! the state restored from it ([`restore`]: the policy; [`rank_rng`]: each rank's generator).
//! Under DDP rank 0 decides the folder and checkpoint and the other ranks learn them from it
//! ([`for_rank`]), so a restarted group writes into one folder and every rank resumes from
//! the same state.

use std::path::{Path, PathBuf};

use drill_comm::{ProcessGroup, Store};
use drill_config::Config;
use drill_exp::{Checkpoint, Experiment};

use crate::checkpoint::parse_rng_state;
use crate::error::TrainError;
use crate::policy::Policy;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// Store key (shared by every attempt of a launched job) holding the experiment folder.
const EXP_DIR_KEY: &str = "drill-train/exp_dir";

/// What the user asked for (`drill train`'s `--exp-dir`, `--resume`, `--quiet`).
#[derive(Clone, Debug, Default)]
pub struct StartOptions {
    /// Experiment folder (default: the config's `exp_name`).
    pub exp_dir: Option<PathBuf>,
    /// Checkpoint file to start from, or an experiment folder to continue in (unless a
    /// restart resumes from a newer checkpoint).
    pub resume: Option<PathBuf>,
    /// No progress bar.
    pub quiet: bool,
}

impl StartOptions {
    /// The folder a new run writes: `exp_dir`, or the config's `exp_name`.
    pub fn exp_dir(&self, config: &Config) -> PathBuf {
        self.exp_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(&config.exp_name))
    }
}

/// Times the launcher restarted this group (`DRILL_RESTART_COUNT`, 0 when not launched).
pub fn restart_count() -> u32 {
    std::env::var("DRILL_RESTART_COUNT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The run's experiment folder and the checkpoint to start from: `previous` (a folder this
/// run already owns) is reopened — after restart `restarts` > 0 resuming from its newest
/// checkpoint; `resume` naming a folder continues that run in it; else a new folder is made
/// at [`StartOptions::exp_dir`], starting from `resume`'s checkpoint file if any. A start
/// from a checkpoint is marked in the folder's metrics ([`Experiment::mark_resume`]).
pub fn open(
    config: &Config,
    opts: &StartOptions,
    previous: Option<&Path>,
    restarts: u32,
) -> Result<(Experiment, Option<Checkpoint>), TrainError> {
    let (mut exp, resume) = folder_and_checkpoint(config, opts, previous, restarts)?;
    if let Some(ck) = &resume {
        exp.mark_resume(
            ck.counter("env_steps").unwrap_or(0),
            ck.counter("train_iters").unwrap_or(0),
            ck.train_seconds(),
        );
    }
    Ok((exp, resume))
}

/// [`open`]'s choice of folder and checkpoint.
fn folder_and_checkpoint(
    config: &Config,
    opts: &StartOptions,
    previous: Option<&Path>,
    restarts: u32,
) -> Result<(Experiment, Option<Checkpoint>), TrainError> {
    let mut resume = None;
    let exp = match previous {
        Some(dir) => {
            if restarts > 0 {
                resume = resume_after_restart(dir, restarts)?;
            } else if opts.resume.as_deref().is_some_and(|r| r == dir) {
                // `--resume EXP_DIR` of a split run: the parent passed that folder on.
                return continue_in(dir, config, opts);
            }
            Experiment::reopen(dir, config, opts.quiet)
                .map_err(|e| TrainError::io(format!("cannot reopen {}", dir.display()), e))?
        }
        None => {
            if let Some(dir) = opts.resume.as_deref().filter(|p| p.is_dir()) {
                return continue_in(dir, config, opts);
            }
            // Loaded before the folder is made: a bad checkpoint leaves nothing behind.
            resume = opts.resume.as_deref().map(Checkpoint::load).transpose()?;
            let dir = opts.exp_dir(config);
            Experiment::create(&dir, config, opts.quiet).map_err(|e| {
                TrainError::io(
                    format!("cannot create experiment folder {}", dir.display()),
                    e,
                )
            })?
        }
    };
    if resume.is_none() {
        // A folder to continue in was handled above; only a checkpoint file is left to load.
        let file = opts.resume.as_deref().filter(|r| !r.is_dir());
        resume = file.map(Checkpoint::load).transpose()?;
    }
    Ok((exp, resume))
}

/// `--resume EXP_DIR`: the run goes on in `dir` from its newest checkpoint (config.toml is
/// rewritten with the config in use, overrides included; metrics are appended).
fn continue_in(
    dir: &Path,
    config: &Config,
    opts: &StartOptions,
) -> Result<(Experiment, Option<Checkpoint>), TrainError> {
    if drill_plant::planted(drill_plant::Bug::ResumeHangs) {
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
    let ck = Checkpoint::newest_in(dir)?.ok_or_else(|| {
        TrainError::io(
            format!("--resume {}", dir.display()),
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no checkpoint in its ckpt/ folder (the run saved none)",
            ),
        )
    })?;
    tracing::info!(
        "continuing {} from {} (train iteration {}, env step {})",
        dir.display(),
        ck.path.display(),
        ck.counter("train_iters").unwrap_or(0),
        ck.counter("env_steps").unwrap_or(0)
    );
    let exp = Experiment::reopen(dir, config, opts.quiet)
        .map_err(|e| TrainError::io(format!("cannot reopen {}", dir.display()), e))?;
    Ok((exp, Some(ck)))
}

/// Where one rank starts.
pub(crate) struct RankStart {
    /// The experiment folder, on rank 0 (which alone writes it).
    pub exp: Option<Experiment>,
    /// The folder, on every rank (for its log file).
    pub dir: PathBuf,
    /// The checkpoint every rank starts from.
    pub resume: Option<Checkpoint>,
}

/// Rank 0 opens the folder (after a restart, the one the previous attempt left in the
/// launcher's store) and picks the checkpoint; every other rank receives both from it.
/// Without `dist` this is [`open`] with no previous folder.
pub(crate) fn for_rank(
    config: &Config,
    opts: &StartOptions,
    dist: Option<&ProcessGroup>,
    restarts: u32,
) -> Result<RankStart, TrainError> {
    let Some(pg) = dist else {
        let (exp, resume) = open(config, opts, None, restarts)?;
        let dir = exp.dir().to_path_buf();
        return Ok(RankStart {
            exp: Some(exp),
            dir,
            resume,
        });
    };
    let store: Option<Store> = pg.store().map(|s| s.unprefixed());
    let mut exp = None;
    let mut resume = None;
    if pg.rank() == 0 {
        let previous = match &store {
            Some(s) if restarts > 0 && s.check(&[EXP_DIR_KEY])? => Some(PathBuf::from(
                String::from_utf8_lossy(&s.get(EXP_DIR_KEY)?).into_owned(),
            )),
            _ => None,
        };
        let (e, r) = open(config, opts, previous.as_deref(), restarts)?;
        if let Some(s) = &store {
            s.set(EXP_DIR_KEY, e.dir().display().to_string().as_bytes())?;
        }
        (exp, resume) = (Some(e), r);
    }
    let dir = PathBuf::from(
        pg.broadcast_object(
            exp.as_ref()
                .map(|e: &Experiment| e.dir().display().to_string())
                .as_ref(),
            0,
        )?,
    );
    let bytes = pg.broadcast_object(
        (pg.rank() == 0)
            .then(|| resume.as_ref().map(|ck| (ck.path.clone(), ck.to_bytes())))
            .as_ref(),
        0,
    )?;
    if pg.rank() != 0 {
        resume = bytes
            .map(|(path, b)| Checkpoint::from_bytes(&b, &path))
            .transpose()?;
    }
    Ok(RankStart { exp, dir, resume })
}

/// After restart `restarts` of a group: the newest checkpoint in `dir`, said in the log.
fn resume_after_restart(dir: &Path, restarts: u32) -> Result<Option<Checkpoint>, TrainError> {
    // Checkpoint files that are all unreadable stop the restart: starting over would send
    // the counters back.
    let resume = Checkpoint::newest_in(dir)?
        .filter(|_| !drill_plant::planted(drill_plant::Bug::RestartIgnoresCheckpoint));
    match &resume {
        Some(ck) => tracing::info!(
            "restart {restarts}: resuming from {} (train iteration {}, env step {})",
            ck.path.display(),
            ck.counter("train_iters")?,
            ck.counter("env_steps")?
        ),
        None => tracing::info!(
            "restart {restarts}: no checkpoint in {} yet, starting over",
            dir.display()
        ),
    }
    Ok(resume)
}

/// Where a learner starts: `resume`'s state restored into `policy` (its env-step count
/// returned; 0 without a checkpoint). Every algorithm's setup calls it before distributing.
pub(crate) fn restore<P: Policy>(
    policy: &mut P,
    resume: Option<&Checkpoint>,
) -> Result<u64, TrainError> {
    match resume {
        Some(ck) => {
            policy.load_state_dict(ck)?;
            Ok(ck.counter("env_steps")?)
        }
        None => Ok(0),
    }
}

/// A split run's learners' group (`ranks`): the lead's checkpoint (`ck`, which only the lead
/// opened: the folder is its) on every learner, so that all restore the same parameters,
/// optimizer state and counters. One broadcast from rank 0, even with nothing to resume.
pub(crate) fn shared(
    ck: Option<&Checkpoint>,
    ranks: &crate::ddp::Ranks,
) -> Result<Option<Checkpoint>, TrainError> {
    let Some(pg) = ranks.group() else {
        return Ok(ck.cloned());
    };
    let bytes = ck.map(Checkpoint::to_bytes);
    let lead = (pg.rank() == 0).then_some(&bytes);
    let got: Option<Vec<u8>> = pg.broadcast_object(lead, 0)?;
    let from = Path::new("the lead learner's checkpoint");
    Ok(got.map(|b| Checkpoint::from_bytes(&b, from)).transpose()?)
}

/// This rank's generator: restored from `resume` (`rng.{rank}`) or seeded
/// `streams + 0x5eed + rank` (`streams`: [`stream_seed`]; also a rank the checkpoint's world
/// did not have).
pub(crate) fn rank_rng(streams: u64, resume: Option<&Checkpoint>, rank: usize) -> ChaCha8Rng {
    resume
        .and_then(|ck| ck.meta.get(&format!("rng.{rank}")))
        .and_then(|s| parse_rng_state(s))
        .unwrap_or_else(|| {
            ChaCha8Rng::seed_from_u64(streams.wrapping_add(0x5eed).wrapping_add(rank as u64))
        })
}

/// The seed this start's collection streams derive from (the collector copies' env seeds,
/// a new rank's generator): `seed` at a run's first start; from a checkpoint at env step S
/// or after restart K, a seed mixed from all three, so that a restarted or resumed group (of
/// any world size) does not collect the streams an earlier start collected.
pub(crate) fn stream_seed(cfg: &Config, resume: Option<&Checkpoint>, restarts: u32) -> u64 {
    let at = resume
        .and_then(|ck| ck.counter("env_steps").ok())
        .unwrap_or(0);
    if at == 0 && restarts == 0 {
        return cfg.seed;
    }
    let mix = |mut z: u64| {
        // splitmix64's finaliser: nearby inputs give unrelated outputs.
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    mix(cfg.seed ^ mix(at ^ mix(u64::from(restarts).wrapping_add(0x9e37_79b9_7f4a_7c15))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// A checkpoint at `env_steps`.
    fn at(env_steps: u64) -> Checkpoint {
        let mut ck = Checkpoint::default();
        ck.meta.insert("env_steps".into(), env_steps.to_string());
        ck
    }

    #[test]
    fn no_two_starts_of_any_world_size_collect_the_same_env_streams() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../configs/cartpole_dqn_ddp.toml"
        ))
        .unwrap();
        let cfg = Config::parse(&text, "cartpole_dqn_ddp.toml", &[]).unwrap();
        assert_eq!(
            stream_seed(&cfg, None, 0),
            cfg.seed,
            "a first start keeps its seeds"
        );
        let n = cfg.env.collector_env_num as u64;
        // An elastic job's starts: first (3 ranks), a host lost (2), one back (3), a plain
        // restart from the same checkpoint (3), then --resume of it (3).
        let starts = [
            (None, 0, 3),
            (Some(at(8000)), 1, 2),
            (Some(at(12000)), 2, 3),
            (Some(at(12000)), 3, 3),
            (Some(at(12000)), 0, 3),
        ];
        let mut seen = HashSet::new();
        for (ck, restarts, world) in &starts {
            let s = stream_seed(&cfg, ck.as_ref(), *restarts);
            for rank in 0..*world {
                for i in 0..n {
                    let env = s.wrapping_add(rank * n + i);
                    assert!(
                        seen.insert(env),
                        "env seed {env} again (restart {restarts}, rank {rank}, copy {i})"
                    );
                }
                // A rank the checkpoint has no generator for gets a new one too.
                let rng = rank_rng(s, ck.as_ref(), rank as usize);
                assert!(
                    seen.insert(
                        rng.get_seed()[..8]
                            .iter()
                            .fold(0, |a, b| a << 8 | *b as u64)
                    ),
                    "generator of rank {rank} again (restart {restarts})"
                );
            }
        }
    }
}
