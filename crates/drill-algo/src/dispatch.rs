//! The algorithm a config names (`policy.type`): each entry point matches it once and calls
//! that algorithm's own function.

use crate::error::TrainError;
use crate::run::{RunContext, TrainResult};
use crate::{checkpoint, ddp, dqn, eval, middleware, policy, ppo, sac, session};

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
