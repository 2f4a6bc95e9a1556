//! drill's reinforcement-learning algorithms and the data plumbing around them.
//!
//! - [`dqn`] and [`ppo`]: each algorithm in one file, read top to bottom.
//! - [`nets`]: the networks; [`optim`]: flat parameters and Adam.
//! - [`data`]: replay buffer, n-step returns, GAE; [`explore`]: epsilon schedules.
//! - [`eval`]: the evaluator; [`checkpoint`]: safetensors checkpoints; [`session`]: the
//!   plumbing every training loop shares.
//! - [`middleware`]: the built-in middlewares the training pipelines are composed of.
//! - [`ddp`]: data-parallel training (gradient averaging, distributed sampler).
//! - [`run`]: what a run reports ([`run::Reporter`]) and returns ([`run::TrainResult`]);
//!   [`train()`] picks the algorithm from the config.

pub mod checkpoint;
pub mod data;
pub mod ddp;
pub mod dqn;
pub mod eval;
pub mod explore;
pub mod middleware;
pub mod nets;
pub mod optim;
pub mod ppo;
pub mod run;
pub mod session;

pub use run::{NullReporter, Progress, Reporter, RunContext, TrainError, TrainResult};

/// Check what only the environment can tell: that `env.id` exists and the model fits its
/// spaces (`policy.model.obs_shape`, discrete vs continuous actions). Cheap; call it before
/// creating anything on disk.
pub fn validate(config: &drill_config::Config) -> Result<(), TrainError> {
    drill_env::spec(&config.env.id).map_err(|e| config.error("env.id", e.to_string()))?;
    let device = burn::tensor::Device::flex();
    match &config.policy {
        drill_config::Policy::Dqn(p) => dqn::build_qnet(config, p, &device).map(drop),
        drill_config::Policy::Ppo(p) => ppo::build_agent(config, p, &device).map(drop),
    }
}

/// Train the algorithm `config.policy.type` names.
pub fn train(
    config: &drill_config::Config,
    ctx: &mut RunContext<'_>,
) -> Result<TrainResult, TrainError> {
    validate(config)?;
    match &config.policy {
        drill_config::Policy::Dqn(p) => dqn::train(config, p, ctx),
        drill_config::Policy::Ppo(p) => ppo::train(config, p, ctx),
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
    validate(config)?;
    check_splittable(config)?;
    let drill_config::Policy::Dqn(p) = &config.policy else {
        return Err(not_splittable(config));
    };
    dqn::train_roles(config, p, run, task, roles)
}

/// Whether `config`'s pipeline can be split over processes (`--parallel-workers`): DQN's
/// off-policy pipeline can; PPO's on-policy one is refused, naming `policy.type`.
pub fn check_splittable(config: &drill_config::Config) -> Result<(), TrainError> {
    match &config.policy {
        drill_config::Policy::Dqn(_) => Ok(()),
        drill_config::Policy::Ppo(_) => Err(not_splittable(config)),
    }
}

fn not_splittable(config: &drill_config::Config) -> TrainError {
    config
        .error(
            "policy.type",
            "--parallel-workers splits DQN's off-policy pipeline; PPO is on-policy (each rollout must be trained on by the weights that collected it): train it in one process, or data-parallel with --nproc-per-node",
        )
        .into()
}

/// Evaluate the model in checkpoint `ck` (trained with `config`) over `episodes` episodes
/// with deterministic actions.
pub fn evaluate(
    config: &drill_config::Config,
    ck: &checkpoint::Checkpoint,
    episodes: usize,
    seed: u64,
    device: &burn::tensor::Device,
) -> Result<eval::EvalResult, TrainError> {
    let num_envs = config.env.evaluator_env_num.min(episodes.max(1));
    let mut evaluator = eval::Evaluator::new(&config.env.id, num_envs, episodes.max(1), seed)?;
    match &config.policy {
        drill_config::Policy::Dqn(p) => {
            let net = dqn::build_qnet(config, p, device)?;
            let (layout, _) = optim::ParamLayout::with_values(&net);
            let net = layout.write(net, &ck.get_params("model", &layout)?);
            let obs_dim = drill_env::spec(&config.env.id)?.obs_dim;
            Ok(evaluator.run(|obs, out| {
                if let eval::ActionBuf::Discrete(a) = out {
                    dqn::greedy(&net, obs, obs_dim, device, a);
                }
            }))
        }
        drill_config::Policy::Ppo(p) => {
            let agent = ppo::build_agent(config, p, device)?;
            let (layout, _) = optim::ParamLayout::with_values(&agent);
            let agent = layout.write(agent, &ck.get_params("model", &layout)?);
            let spec = drill_env::spec(&config.env.id)?;
            Ok(evaluator.run(|obs, out| {
                ppo::act_deterministic(&agent, &spec.action_space, obs, spec.obs_dim, device, out)
            }))
        }
    }
}
