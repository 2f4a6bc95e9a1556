//! A run's data-parallel setup: joining the job the launcher started ([`join`]), the ranks a
//! pipeline starts with ([`setup`]), the config's DDP options and per-rank batch split.

use super::Ranks;
use crate::optim::DdpOptions;

use crate::error::TrainError;
use drill_comm::{BackendKind, InitInfo, InitOptions, ProcessGroup};
use drill_config::Config;

/// Join the data-parallel job the environment describes (RANK/WORLD_SIZE/..., Slurm or
/// OpenMPI variables), on the backend the config asks for: NCCL when `policy.cuda` on CUDA (a
/// Vulkan GPU's gradients go through the embedded backend), MPI when started by mpirun or
/// `srun --mpi=pmix|pmi2` in a build with MPI (unless `DRILL_BACKEND` says otherwise), else
/// the embedded one. `None` alone; a config without `policy.multi_gpu` started as several
/// ranks is refused, naming the key.
pub(crate) fn join(config: &Config) -> Result<Option<ProcessGroup>, TrainError> {
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
    let backend = if on_cuda(config) {
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

/// Whether gradients go through NCCL: the config's GPU is CUDA's. A Vulkan GPU's gradients
/// are on the host when they are exchanged (one copy per bucket, see `optim`), so the
/// embedded backend carries them.
fn on_cuda(config: &Config) -> bool {
    config.policy.cuda() && (cfg!(feature = "cuda") || !cfg!(feature = "gpu"))
}

/// The learners' data-parallel group of a split run whose `[task.roles]` give the learner
/// role to several workers (`policy.multi_gpu`): rank = this worker's place among the
/// learners (the lead is 0), on the run's own store (the launcher's, or node 0's under
/// Slurm) under a prefix of its own; `rank` of `world`. The embedded backend (NCCL for
/// `policy.cuda` on CUDA): MPI's world would be every worker of the run. A collective may
/// wait `wait` longer than others: a learner in it may be waiting that long for its
/// collectors (a dead learner is still noticed at once, by the heartbeats).
pub(crate) fn learner_group(
    config: &Config,
    (rank, world): (usize, usize),
    wait: std::time::Duration,
) -> Result<ProcessGroup, TrainError> {
    let mut info = InitInfo::from_env()?;
    info.run_id = format!("{}/learners", info.run_id);
    info.timeout += wait;
    (info.rank, info.world_size, info.agent_store) = (rank, world, true);
    (info.local_rank, info.local_world_size) = (rank, world);
    let backend = if on_cuda(config) {
        BackendKind::Nccl
    } else {
        BackendKind::Embedded
    };
    let pg = ProcessGroup::init(InitOptions {
        backend: Some(backend),
        info: Some(info),
        ..InitOptions::default()
    })?;
    tracing::info!(
        "learner {rank} of {world}: one data-parallel group, {} backend",
        pg.backend_name()
    );
    Ok(pg)
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

/// The start of every pipeline: the DDP ranks of `run`, with the device seeded with
/// `config.seed` (the same initial weights everywhere).
pub(crate) fn setup(cfg: &Config, run: &crate::context::RunContext<'_>) -> Ranks {
    run.device.seed(cfg.seed);
    Ranks::new(run.dist.clone())
}

/// `n` per rank: divided by the world size (rounded up) when `policy.ddp_split_batch` is set
/// (DI-engine's `to_ddp_config`), else `n`.
pub(crate) fn split(cfg: &Config, ranks: &Ranks, n: usize) -> usize {
    if cfg.policy.common().ddp_split_batch {
        n.div_ceil(ranks.world())
    } else {
        n
    }
}

/// DDP options from the config (`policy.ddp_bucket_cap_mb`, `policy.ddp_check_every`).
pub(crate) fn options(cfg: &Config) -> DdpOptions {
    let keys = cfg.policy.common();
    DdpOptions {
        bucket_cap_mb: keys.ddp_bucket_cap_mb,
        check_every: keys.ddp_check_every,
        ..DdpOptions::default()
    }
}
