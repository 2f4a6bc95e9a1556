//! The algorithm a config names (`policy.type`): each entry point matches it once and calls
//! that algorithm's own function.

use crate::context::{RunContext, TrainResult};
use crate::envs;
use crate::error::TrainError;
use crate::{appo, checkpoint, ddp, dqn, eval, middleware, policy, ppo, sac};

/// Check what only the environment can tell: that the model fits the spaces of the
/// environment `spec` describes (`policy.model.obs_shape`, discrete vs continuous actions,
/// frames an encoder fits; [`envs::env_spec`] already named an unknown `env.id`). Builds
/// no network (each process builds its networks once, to train); call it before creating
/// anything on disk.
pub fn validate(
    config: &drill_config::Config,
    spec: &drill_env::EnvSpec,
) -> Result<(), TrainError> {
    match &config.policy {
        drill_config::Policy::Dqn(p) => dqn::check_model(config, p, spec).map(drop),
        drill_config::Policy::Ppo(p) | drill_config::Policy::Appo(p) => {
            ppo::check_model(config, p, spec).map(drop)
        }
        drill_config::Policy::Sac(p) => sac::check_model(config, p, spec).map(drop),
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
        drill_config::Policy::Appo(p) => appo::train(config, p, ctx),
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
    match &config.policy {
        drill_config::Policy::Dqn(p) => dqn::train_roles(config, p, run, task, roles),
        drill_config::Policy::Appo(p) => appo::train_roles(config, p, run, task, roles),
        _ => Err(not_splittable(config)),
    }
}

/// Whether `config`'s pipeline can be split over processes (`--parallel-workers`): DQN's
/// off-policy pipeline and APPO's can (APPO's learner also as a data-parallel group,
/// `policy.multi_gpu`); PPO's on-policy one is refused, naming `policy.type`.
pub fn check_splittable(config: &drill_config::Config) -> Result<(), TrainError> {
    if config.policy.multi_gpu() && !matches!(config.policy, drill_config::Policy::Appo(_)) {
        return Err(config
            .error(
                "policy.multi_gpu",
                "is true, but --parallel-workers trains only APPO's learner as a data-parallel group (several learner workers in [task.roles]): set `multi_gpu = false`, `type = \"appo\"`, or train with --nproc-per-node",
            )
            .into());
    }
    match &config.policy {
        drill_config::Policy::Dqn(_) | drill_config::Policy::Appo(_) => Ok(()),
        drill_config::Policy::Ppo(_) | drill_config::Policy::Sac(_) => Err(not_splittable(config)),
    }
}

fn not_splittable(config: &drill_config::Config) -> TrainError {
    let why = match config.policy {
        drill_config::Policy::Ppo(_) => {
            "--parallel-workers splits DQN's and APPO's pipelines; PPO is on-policy (each rollout must be trained on by the weights that collected it): set `type = \"appo\"` (V-trace corrects for collectors that act with older weights), or train PPO in one process or data-parallel with --nproc-per-node"
        }
        _ => {
            "--parallel-workers splits DQN's and APPO's pipelines only so far (SAC's is not wired to the exchangers): train it in one process, or data-parallel with --nproc-per-node"
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
        Ok(evaluator.run(|obs, hidden, out| policy.eval(obs, hidden, out))?)
    }
    let num_envs = config.env.evaluator_env_num.min(episodes.max(1));
    envs::register_env(config);
    let venv = drill_env::make_vec_with(
        &config.env.id,
        num_envs,
        seed,
        config.env.env_threads,
        &config.env.atari.eval(),
    )?;
    let mut evaluator = eval::Evaluator::with_envs(venv, episodes.max(1), seed);
    let alone = ddp::Ranks::alone();
    match &config.policy {
        drill_config::Policy::Dqn(p) => {
            let policy = dqn::Dqn::from_spec(config, p, spec, device)?;
            run(policy, ck, &mut evaluator)
        }
        drill_config::Policy::Ppo(p) | drill_config::Policy::Appo(p) => {
            let policy = ppo::Ppo::from_spec(config, p, spec, device, alone)?;
            run(policy, ck, &mut evaluator)
        }
        drill_config::Policy::Sac(p) => {
            let policy = sac::Sac::from_spec(config, p, spec, device, alone)?;
            run(policy, ck, &mut evaluator)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nets::tests::layers_built;
    use drill_env::{ActionSpace, EnvSpec};

    fn spec(obs: &[usize], actions: ActionSpace) -> EnvSpec {
        let mut spec = drill_env::spec("CartPole-v1").unwrap();
        spec.obs.shape = obs.to_vec();
        spec.action_space = actions;
        spec
    }

    /// Validation checks what building would, and builds nothing: a config that fits is
    /// accepted without a layer built, one that does not is refused with the builder's error.
    #[test]
    fn validation_builds_no_network_and_refuses_what_building_would() {
        let device = burn::tensor::Device::flex();
        let cont = ActionSpace::Continuous {
            low: vec![-1.0; 2],
            high: vec![1.0; 2],
        };
        let cases = [
            (
                "dqn",
                vec!["env.id=PongNoFrameskip-v4"],
                spec(&[4, 84, 84], ActionSpace::Discrete(6)),
            ),
            (
                "dqn",
                vec!["policy.model.encoder=nature"],
                spec(&[4, 84, 84], ActionSpace::Discrete(6)),
            ),
            ("ppo", vec![], spec(&[4, 84, 84], ActionSpace::Discrete(6))),
            ("ppo", vec![], spec(&[4], cont.clone())),
            ("sac", vec![], spec(&[3], cont.clone())),
            // Refused: frames too small, a vector where frames were meant, DQN on
            // continuous actions, SAC on discrete ones, a given shape that differs.
            ("dqn", vec![], spec(&[4, 30, 30], ActionSpace::Discrete(6))),
            ("ppo", vec![], spec(&[4, 84, 30], ActionSpace::Discrete(6))),
            (
                "dqn",
                vec!["policy.model.encoder_hidden_size_list=[32, 64]"],
                spec(&[4, 84, 84], ActionSpace::Discrete(6)),
            ),
            ("dqn", vec![], spec(&[4], cont.clone())),
            ("sac", vec![], spec(&[4], ActionSpace::Discrete(2))),
            (
                "ppo",
                vec!["policy.model.obs_shape=5"],
                spec(&[4], ActionSpace::Discrete(2)),
            ),
            ("dqn", vec![], spec(&[2, 3], ActionSpace::Discrete(2))),
        ];
        for (kind, set, spec) in cases {
            let mut o = vec![
                format!("policy.type={kind}"),
                "policy.collect.n_sample=64".into(),
            ];
            o.extend(set.iter().map(|s| s.to_string()));
            let config = drill_config::Config::parse("", "t.toml", &o).unwrap();
            let before = layers_built();
            let checked = validate(&config, &spec).map_err(|e| e.to_string());
            assert_eq!(
                layers_built(),
                before,
                "{kind} {set:?}: validation built layers"
            );
            let built = match &config.policy {
                drill_config::Policy::Dqn(p) => {
                    dqn::build_qnet(&config, p, &spec, &device).map(drop)
                }
                drill_config::Policy::Ppo(p) | drill_config::Policy::Appo(p) => {
                    ppo::build_agent(&config, p, &spec, &device).map(drop)
                }
                drill_config::Policy::Sac(p) => {
                    sac::Sac::from_spec(&config, p, &spec, &device, ddp::Ranks::alone()).map(drop)
                }
            };
            assert_eq!(
                checked,
                built.map_err(|e| e.to_string()),
                "{kind} {set:?} {:?}",
                spec.obs.shape
            );
            if checked.is_ok() {
                assert!(layers_built() > before, "{kind}: building built nothing");
            }
        }
    }
}
