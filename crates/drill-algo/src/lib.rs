//! drill's reinforcement-learning algorithms and the data plumbing around them.
//!
//! - [`dqn`], [`ppo`], [`sac`]: each algorithm in one file, read top to bottom: its
//!   networks' use, exploration, update and pipeline. Each implements [`policy::Policy`].
//! - [`policy`]: the one abstraction every middleware takes (collect, eval, learn, state).
//! - [`middleware`]: the built-in, generic middlewares the pipelines are composed of.
//! - [`nets`]: the networks; [`optim`]: flat parameters and Adam; [`compute`]: the device a
//!   run uses and drill's own CPU kernels for convolution and dense layers.
//! - [`data`]: replay buffer, n-step returns, rollouts, GAE; [`explore`]: epsilon schedules.
//! - [`eval`]: the evaluator; [`checkpoint`]: safetensors checkpoints; [`session`]: the
//!   setup every pipeline shares; [`start`]: the experiment folder and checkpoint a run (or
//!   a restarted rank) starts from.
//! - [`ddp`]: data-parallel training (gradient averaging, the ranks as the pipeline sees
//!   them, distributed sampler).
//! - [`error`]: [`TrainError`] and [`checkpoint::CheckpointError`], below everything else;
//!   [`interrupt`]: Ctrl-C / SIGTERM asking a run to stop after its step; [`memory`]: what a
//!   config will allocate, checked against the machine before anything is built.
//! - [`inference`]: a trained policy loaded for inference (Python's `drill.load`).
//! - [`entry`]: a whole run from a config file, as `drill train` and Python's `drill.train`
//!   start it (load and check, train here or launch ranks, close the folder).
//! - [`run`]: what a run reports ([`run::Reporter`]) and returns ([`run::TrainResult`]);
//!   [`train()`] picks the algorithm from the config.
//!
//! Modules call down only: algorithms → middleware → policy, data, eval, ddp → optim, nets →
//! compute → error (a test in drill-cli checks that no two sibling modules import each other).

pub mod checkpoint;
pub mod compute;
pub mod data;
pub mod ddp;
pub mod dqn;
pub mod entry;
pub mod error;
pub mod eval;
pub mod explore;
pub mod export;
pub mod inference;
pub mod interrupt;
pub mod memory;
pub mod middleware;
pub mod nets;
pub mod optim;
pub mod policy;
pub mod ppo;
pub mod run;
pub mod sac;
pub mod session;
pub mod start;

pub use error::TrainError;
pub use run::{NullReporter, Progress, Reporter, RunContext, TrainResult};

/// Check what only the environment can tell: that the model fits the spaces of the
/// environment `spec` describes (`policy.model.obs_shape`, discrete vs continuous actions;
/// [`session::env_spec`] already named an unknown `env.id`). Cheap; call it before creating
/// anything on disk.
pub fn validate(
    config: &drill_config::Config,
    spec: &drill_env::EnvSpec,
) -> Result<(), TrainError> {
    let device = burn::tensor::Device::flex();
    match &config.policy {
        drill_config::Policy::Dqn(p) => dqn::build_qnet(config, p, spec, &device).map(drop),
        drill_config::Policy::Ppo(p) => ppo::build_agent(config, p, spec, &device).map(drop),
        drill_config::Policy::Sac(p) => {
            sac::Sac::from_spec(config, p, spec, &device, ddp::Ranks::alone()).map(drop)
        }
    }
}

/// Train the algorithm `config.policy.type` names.
pub fn train(
    config: &drill_config::Config,
    ctx: &mut RunContext<'_>,
) -> Result<TrainResult, TrainError> {
    validate(config, &ctx.spec)?;
    match &config.policy {
        drill_config::Policy::Dqn(p) => dqn::train(config, p, ctx),
        drill_config::Policy::Ppo(p) => ppo::train(config, p, ctx),
        drill_config::Policy::Sac(p) => sac::train(config, p, ctx),
    }
}

/// Run this process's share of a parallel run (`drill train --parallel-workers N`): the
/// `roles` on `task`'s bus, exchanging data with the processes that run the others. Returns
/// the result in the learner's process.
pub fn train_roles(
    config: &drill_config::Config,
    run: &mut RunContext<'_>,
    task: drill_task::TaskHandle,
    roles: &middleware::Roles,
) -> Result<Option<TrainResult>, TrainError> {
    validate(config, &run.spec)?;
    check_splittable(config)?;
    let drill_config::Policy::Dqn(p) = &config.policy else {
        return Err(not_splittable(config));
    };
    dqn::train_roles(config, p, run, task, roles)
}

/// Whether `config`'s pipeline can be split over processes (`--parallel-workers`): DQN's
/// off-policy pipeline can; PPO's on-policy one is refused, naming `policy.type`.
pub fn check_splittable(config: &drill_config::Config) -> Result<(), TrainError> {
    if config.policy.multi_gpu() {
        return Err(config
            .error(
                "policy.multi_gpu",
                "is true, but --parallel-workers splits the pipeline over processes and does not combine with data-parallel training: set `multi_gpu = false` or train with --nproc-per-node",
            )
            .into());
    }
    match &config.policy {
        drill_config::Policy::Dqn(_) => Ok(()),
        drill_config::Policy::Ppo(_) | drill_config::Policy::Sac(_) => Err(not_splittable(config)),
    }
}

fn not_splittable(config: &drill_config::Config) -> TrainError {
    let why = match config.policy {
        drill_config::Policy::Ppo(_) => {
            "--parallel-workers splits DQN's off-policy pipeline; PPO is on-policy (each rollout must be trained on by the weights that collected it): train it in one process, or data-parallel with --nproc-per-node"
        }
        _ => {
            "--parallel-workers splits DQN's pipeline only so far (SAC's is not wired to the exchangers): train it in one process, or data-parallel with --nproc-per-node"
        }
    };
    config.error("policy.type", why).into()
}

/// Evaluate the model in checkpoint `ck` (trained with `config`, on the environment `spec`
/// describes) over `episodes` episodes with deterministic actions (the policy's eval side).
pub fn evaluate(
    config: &drill_config::Config,
    spec: &drill_env::EnvSpec,
    ck: &checkpoint::Checkpoint,
    episodes: usize,
    seed: u64,
    device: &burn::tensor::Device,
) -> Result<eval::EvalResult, TrainError> {
    fn run<P: policy::Policy>(
        mut policy: P,
        ck: &checkpoint::Checkpoint,
        evaluator: &mut eval::Evaluator,
    ) -> Result<eval::EvalResult, TrainError> {
        policy.load_state_dict(ck)?;
        Ok(evaluator.run(|obs, out| policy.eval(obs, out))?)
    }
    let num_envs = config.env.evaluator_env_num.min(episodes.max(1));
    session::register_env(config);
    let venv = drill_env::make_vec_with(
        &config.env.id,
        num_envs,
        seed,
        config.env.env_threads,
        &session::atari_options(config).eval(),
    )?;
    let mut evaluator = eval::Evaluator::with_envs(venv, episodes.max(1), seed);
    let alone = ddp::Ranks::alone();
    match &config.policy {
        drill_config::Policy::Dqn(p) => {
            let policy = dqn::Dqn::from_spec(config, p, spec, device)?;
            run(policy, ck, &mut evaluator)
        }
        drill_config::Policy::Ppo(p) => {
            let policy = ppo::Ppo::from_spec(config, p, spec, device, alone)?;
            run(policy, ck, &mut evaluator)
        }
        drill_config::Policy::Sac(p) => {
            let policy = sac::Sac::from_spec(config, p, spec, device, alone)?;
            run(policy, ck, &mut evaluator)
        }
    }
}

/// Notes the largest allocation of each fuzzed input (see `drill_fuzz`).
#[cfg(test)]
#[global_allocator]
static ALLOC: drill_fuzz::CountingAlloc = drill_fuzz::CountingAlloc;
