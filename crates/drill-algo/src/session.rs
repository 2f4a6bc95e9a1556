//! The setup every algorithm's pipeline shares: seeding (rank-aware under DDP: each rank
//! seeds its own environments `seed + rank * collector_env_num + i` and generator), the
//! collector's environments, the replay buffer (restored on resume), the evaluator, the
//! model-shape check, DDP options and batch splitting. The loop itself is the middleware
//! pipeline above this module, which also builds the run's result
//! (`middleware::run_result`).

use crate::checkpoint::{Checkpoint, parse_rng_state};
use crate::data::ReplayBuffer;
use crate::ddp::{DdpOptions, Ranks};
use crate::error::TrainError;
use crate::eval::Evaluator;
use crate::policy::Policy;
use drill_comm::{BackendKind, InitInfo, InitOptions, ProcessGroup};
use drill_config::{Config, ReplayBufferConfig};
use drill_env::atari::AtariOptions;
use drill_env::{DynVecEnv, make_vec_with};
use drill_task::{OnlineRLContext, Task};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// This rank's generator: restored from `resume` (`rng.{rank}`) or seeded
/// `seed + 0x5eed + rank`.
pub(crate) fn rank_rng(cfg: &Config, resume: Option<&Checkpoint>, rank: usize) -> ChaCha8Rng {
    resume
        .and_then(|ck| ck.meta.get(&format!("rng.{rank}")))
        .and_then(|s| parse_rng_state(s))
        .unwrap_or_else(|| {
            ChaCha8Rng::seed_from_u64(cfg.seed.wrapping_add(0x5eed).wrapping_add(rank as u64))
        })
}

/// Where a learner starts: `resume`'s state restored into `policy` (its env-step count
/// returned; 0 without a checkpoint). Every algorithm's setup calls it before distributing.
pub fn resume<P: Policy>(policy: &mut P, resume: Option<&Checkpoint>) -> Result<u64, TrainError> {
    match resume {
        Some(ck) => {
            policy.load_state_dict(ck)?;
            Ok(ck.counter("env_steps")?)
        }
        None => Ok(0),
    }
}

/// The start of every pipeline: the DDP ranks of `run`, with the device seeded with
/// `config.seed` (the same initial weights everywhere).
pub(crate) fn setup(cfg: &Config, run: &crate::run::RunContext<'_>) -> Ranks {
    run.device.seed(cfg.seed);
    Ranks::new(run.dist.clone())
}

/// `n` per rank: divided by the world size (rounded up) when `policy.ddp_split_batch` is set
/// (DI-engine's `to_ddp_config`), else `n`.
pub fn split(cfg: &Config, ranks: &Ranks, n: usize) -> usize {
    if cfg.policy.ddp().split_batch {
        n.div_ceil(ranks.world())
    } else {
        n
    }
}

/// Check `policy.model.obs_shape` / `action_shape` (when given) against the environment's
/// (`env`: observation shape, action count or dimension).
pub(crate) fn check_model_shapes(
    cfg: &Config,
    given: (Option<&drill_config::Shape>, Option<usize>),
    env: (&[usize], usize),
) -> Result<(), TrainError> {
    let show = |d: &[usize]| match d {
        [n] => n.to_string(),
        d => format!("{d:?}"),
    };
    if let Some(g) = given.0.map(|s| s.dims()).filter(|g| g != env.0) {
        return Err(cfg
            .error(
                "policy.model.obs_shape",
                format!("is {} but {} has {}", show(&g), cfg.env.id, show(env.0)),
            )
            .into());
    }
    if let Some(g) = given.1.filter(|&g| g != env.1) {
        return Err(cfg
            .error(
                "policy.model.action_shape",
                format!("is {g} but {} has {}", cfg.env.id, env.1),
            )
            .into());
    }
    Ok(())
}

/// Tell drill-env what `[env]` says of a Gymnasium id (`env.kwargs`, `env.entry_point`,
/// `env.vectorization`); every function here that builds the env calls it first.
pub(crate) fn register_env(cfg: &Config) {
    let e = &cfg.env;
    if !e.id.starts_with(drill_env::GYMNASIUM) {
        return;
    }
    let opts = drill_env::gymnasium::PythonOptions {
        kwargs_json: serde_json::to_string(&e.kwargs).unwrap_or_else(|_| "{}".into()),
        entry_point: e.entry_point.clone(),
        vectorization: if e.vectorization == "async" {
            drill_env::gymnasium::Vectorization::Async
        } else {
            drill_env::gymnasium::Vectorization::Sync
        },
    };
    drill_env::gymnasium::register(&e.id, opts);
}

/// The environment's spec, an unknown `env.id` (or a missing Atari ROM) named.
pub fn env_spec(cfg: &Config) -> Result<drill_env::EnvSpec, TrainError> {
    register_env(cfg);
    drill_env::spec_with(&cfg.env.id, &atari_options(cfg))
        .map_err(|e| cfg.error("env.id", e.to_string()).into())
}

/// Intra-op threads for a run on the environment `spec` describes when the command line
/// names none: for frame observations (a convolutional trunk, whose products split well)
/// every core of this process's share of the machine (`available_parallelism / processes`),
/// for vectors (small MLPs, measured faster on one thread) one.
pub fn default_threads(spec: &drill_env::EnvSpec, processes: usize) -> usize {
    if spec.obs.shape.len() != 3 {
        return 1;
    }
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    (cores / processes.max(1)).max(1)
}

/// The Atari wrapper chain the `[env]` table asks for (training side; the evaluator uses
/// its [`AtariOptions::eval`]).
pub fn atari_options(cfg: &Config) -> AtariOptions {
    let e = &cfg.env;
    AtariOptions {
        noop_max: e.noop_max,
        frame_skip: e.frame_skip,
        episode_life: e.episode_life,
        fire_reset: e.fire_reset,
        clip_rewards: e.clip_rewards,
        screen_size: e.screen_size,
        full_action_space: e.full_action_space,
        frame_stack: e.frame_stack,
    }
}

/// This rank's collector environments (copy `i` seeded `seed + rank * n + i`), reset.
pub fn collector_envs(cfg: &Config, rank: usize) -> Result<Box<dyn DynVecEnv>, TrainError> {
    let n = cfg.env.collector_env_num;
    register_env(cfg);
    let mut venv = make_vec_with(
        &cfg.env.id,
        n,
        cfg.seed + (rank * n) as u64,
        cfg.env.env_threads,
        &atari_options(cfg),
    )?;
    venv.reset(None)?;
    Ok(venv)
}

/// The replay buffer of `rb` for these spaces; on resume, rank `rank`'s buffer saved beside
/// the checkpoint with it (`--save-replay`) is restored.
pub fn replay_buffer(
    rb: &ReplayBufferConfig,
    spec: &drill_env::EnvSpec,
    resume: Option<&Checkpoint>,
    rank: usize,
    world: usize,
) -> Result<ReplayBuffer, TrainError> {
    let (size, obs, actions) = (rb.replay_buffer_size, &spec.obs, &spec.action_space);
    let mut buffer = if rb.priority {
        ReplayBuffer::prioritized(size, obs, actions, rb.priority_alpha)
    } else {
        ReplayBuffer::new(size, obs, actions)
    };
    if let Some(ck) = resume {
        buffer.resume_from(ck, rank, world)?;
    }
    Ok(buffer)
}

/// This rank's share of the evaluator: of `env.evaluator_env_num` copies (seeded after the
/// collector copies of `seeded_ranks` ranks), the block of rank `rank` of `ranks`; `None` when
/// there are more ranks than copies and this one gets none. The shares together evaluate
/// exactly as one process would ([`Evaluator`]).
pub fn evaluator(
    cfg: &Config,
    seeded_ranks: usize,
    rank: usize,
    ranks: usize,
) -> Result<Option<Evaluator>, TrainError> {
    let total = cfg.env.evaluator_env_num;
    let (lo, hi) = (total * rank / ranks, total * (rank + 1) / ranks);
    if lo == hi {
        return Ok(None);
    }
    let seed = cfg.seed + (seeded_ranks * cfg.env.collector_env_num) as u64;
    register_env(cfg);
    let venv = make_vec_with(
        &cfg.env.id,
        hi - lo,
        seed + lo as u64,
        cfg.env.env_threads,
        &atari_options(cfg).eval(),
    )?;
    Ok(Some(Evaluator::share(
        venv,
        cfg.env.n_evaluator_episode,
        total,
        lo,
        seed,
    )))
}

/// A pipeline's task: `task` (a new one, or one on a Parallel runner's bus) with
/// `[task] step_timer` applied and the counters a run starts from (a resumed checkpoint's)
/// set.
pub fn task<'a>(
    cfg: &Config,
    mut task: Task<'a, OnlineRLContext>,
    env_step: u64,
    train_iter: u64,
) -> Task<'a, OnlineRLContext> {
    if cfg.task.step_timer > 0 {
        task.step_timer(cfg.task.step_timer);
    }
    task.ctx_mut().env_step = env_step;
    task.ctx_mut().train_iter = train_iter;
    task
}

/// DDP options from the config (`policy.ddp_bucket_cap_mb`, `policy.ddp_check_every`).
pub(crate) fn ddp_options(cfg: &Config) -> DdpOptions {
    let keys = cfg.policy.ddp();
    DdpOptions {
        bucket_cap_mb: keys.bucket_cap_mb,
        check_every: keys.check_every,
        ..DdpOptions::default()
    }
}

/// Refuse to start data-parallel ranks (`how`: the flag or tool doing it) from a config
/// that does not train data-parallel (`policy.multi_gpu = false`).
pub(crate) fn check_data_parallel(config: &Config, how: &str) -> Result<(), TrainError> {
    if config.policy.multi_gpu() {
        return Ok(());
    }
    Err(config
        .error(
            "policy.multi_gpu",
            format!("is false, but {how} trains data-parallel: set `multi_gpu = true` in [policy] (or --set policy.multi_gpu=true)"),
        )
        .into())
}

/// Join the data-parallel job the environment describes (RANK/WORLD_SIZE/..., Slurm or
/// OpenMPI variables), on the backend the config asks for: NCCL when `policy.cuda` on CUDA (a
/// Vulkan GPU's gradients go through the embedded backend), MPI when started by mpirun or
/// `srun --mpi=pmix|pmi2` in a build with MPI (unless `DRILL_BACKEND` says otherwise), else
/// the embedded one. `None` alone; a config without `policy.multi_gpu` started as several
/// ranks is refused, naming the key.
pub fn join(config: &Config) -> Result<Option<ProcessGroup>, TrainError> {
    let info = InitInfo::from_env()?;
    if info.world_size == 1 {
        if config.policy.multi_gpu() {
            tracing::info!(
                "policy.multi_gpu = true without a launcher: training as world size 1 (start ranks with `drill train CONFIG --nproc-per-node N`)"
            );
        }
        return Ok(None);
    }
    if !config.policy.multi_gpu() {
        return Err(config
            .error(
                "policy.multi_gpu",
                format!(
                    "is false, but this process is rank {} of {} (from {}): every rank would train alone; set `multi_gpu = true` in [policy]",
                    info.rank, info.world_size, info.source
                ),
            )
            .into());
    }
    // NCCL when the GPU is CUDA's; a Vulkan GPU's gradients are on the host when they are
    // exchanged (one copy per bucket, see `optim`), so the embedded backend carries them.
    let backend = if config.policy.cuda() && (cfg!(feature = "cuda") || !cfg!(feature = "gpu")) {
        Some(BackendKind::Nccl)
    } else if std::env::var_os("DRILL_BACKEND").is_none() && BackendKind::Mpi.built() && info.mpi {
        Some(BackendKind::Mpi)
    } else {
        None
    };
    let pg = ProcessGroup::init(InitOptions {
        backend,
        ..InitOptions::default()
    })?;
    tracing::info!(
        "rank {} of {} (from {}), {} backend",
        info.rank,
        info.world_size,
        info.source,
        pg.backend_name()
    );
    Ok(Some(pg))
}
