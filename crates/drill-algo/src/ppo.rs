//! PPO (Schulman et al. 2017) as CleanRL writes it, for categorical and Gaussian policies:
//! GAE, clipped surrogate, clipped value loss, entropy bonus, per-minibatch advantage
//! normalisation, several epochs of shuffled minibatches, global gradient-norm clipping.
//!
//! Read top to bottom: acting, the update rule ([`minibatch_update`]), then [`train`]: setup
//! and the pipeline of built-in middlewares `evaluate? → roll out n_sample steps → GAE →
//! epochs × minibatches → log`. Hyper-parameters come from [`PpoPolicy`] (the `[policy]` table).
//! A train iteration is one minibatch gradient step (as DI-engine counts them).

use crate::checkpoint::Checkpoint;
use crate::dqn::check_shapes;
use crate::eval::ActionBuf;
use crate::middleware::{
    CkptSaver, GaeEstimator, InteractionEvaluator, OnPolicy, OnPolicyLearner, OnlineLogger,
    Outputs, RolloutBuffer, RolloutCollector, TerminationChecker,
};
use crate::nets::{Actor, ActorCritic, ActorHead, Critic};
use crate::optim::Trainer;
use crate::run::{RunContext, TrainError, TrainResult};
use crate::session;
use burn::tensor::activation::log_softmax;
use burn::tensor::{Device, Int, Tensor, TensorData};
use drill_config::{Config, PpoPolicy, SigmaType};
use drill_env::ActionSpace;
use drill_task::{OnlineRLContext, Task};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;
use std::cell::RefCell;
use std::f32::consts::PI;
use std::time::Instant;

/// The actor-critic for `env.id` as `[policy.model]` describes it.
pub fn build_agent(
    cfg: &Config,
    p: &PpoPolicy,
    device: &Device,
) -> Result<ActorCritic, TrainError> {
    let spec = drill_env::spec(&cfg.env.id).map_err(|e| cfg.error("env.id", e.to_string()))?;
    let hidden = &p.model.encoder_hidden_size_list;
    let (act_dim, head) = match &spec.action_space {
        ActionSpace::Discrete(n) => (*n, ActorHead::Categorical),
        ActionSpace::Continuous { low, .. } => match p.model.sigma_type {
            SigmaType::Independent => (low.len(), ActorHead::GaussianIndependent),
            SigmaType::Conditioned => (low.len(), ActorHead::GaussianConditioned),
        },
    };
    check_shapes(
        cfg,
        (p.model.obs_shape, p.model.action_shape),
        (spec.obs_dim, act_dim),
    )?;
    Ok(ActorCritic {
        actor: Actor::new(
            spec.obs_dim,
            hidden,
            act_dim,
            head,
            p.model.activation,
            p.model.init_log_std,
            device,
        ),
        critic: Critic::new(spec.obs_dim, hidden, p.model.activation, device),
    })
}

/// Deterministic actions for evaluation: argmax logits, or the Gaussian mean clipped to bounds.
pub fn act_deterministic(
    agent: &ActorCritic,
    space: &ActionSpace,
    obs: &[f32],
    obs_dim: usize,
    device: &Device,
    out: &mut ActionBuf,
) {
    let n = obs.len() / obs_dim;
    let x = Tensor::<2>::from_data(TensorData::new(obs.to_vec(), [n, obs_dim]), device);
    match (space, out) {
        (ActionSpace::Discrete(k), ActionBuf::Discrete(a)) => {
            let logits = agent.actor.logits(x).into_data();
            let l = logits.as_slice::<f32>().unwrap();
            for (i, a) in a.iter_mut().enumerate() {
                let row = &l[i * k..(i + 1) * k];
                *a = (0..*k).fold(0, |b, j| if row[j] > row[b] { j } else { b }) as u32;
            }
        }
        (ActionSpace::Continuous { low, high }, ActionBuf::Continuous(a)) => {
            let mean = agent.actor.gaussian(x).0.into_data();
            for (j, (a, m)) in a
                .iter_mut()
                .zip(mean.as_slice::<f32>().unwrap())
                .enumerate()
            {
                let d = j % low.len();
                *a = m.clamp(low[d], high[d]);
            }
        }
        _ => unreachable!("action buffer matches the space"),
    }
}

/// Sample actions for a batch of observations from the stochastic policy: env actions into
/// `out`, the stored actions (`act_dim` each; the index as f32 when discrete) into `store` and
/// their log-probabilities into `logp_out`.
#[allow(clippy::too_many_arguments)]
pub fn sample_actions(
    agent: &ActorCritic,
    space: &ActionSpace,
    obs: &[f32],
    device: &Device,
    rng: &mut impl Rng,
    out: &mut ActionBuf,
    store: &mut [f32],
    logp_out: &mut [f32],
) {
    let n = logp_out.len();
    let obs_dim = obs.len() / n;
    let x = Tensor::<2>::from_data(TensorData::new(obs.to_vec(), [n, obs_dim]), device);
    match (space, out) {
        (ActionSpace::Discrete(k), ActionBuf::Discrete(a)) => {
            let logp = log_softmax(agent.actor.logits(x), 1).into_data();
            let logp = logp.as_slice::<f32>().unwrap();
            for i in 0..n {
                let row = &logp[i * k..(i + 1) * k];
                let mut u: f32 = rng.random();
                let mut choice = k - 1;
                for (j, lp) in row.iter().enumerate() {
                    u -= lp.exp();
                    if u <= 0.0 {
                        choice = j;
                        break;
                    }
                }
                a[i] = choice as u32;
                store[i] = choice as f32;
                logp_out[i] = row[choice];
            }
        }
        (ActionSpace::Continuous { low, high }, ActionBuf::Continuous(a)) => {
            let act_dim = low.len();
            let (mean, log_std) = agent.actor.gaussian(x);
            let (mean, log_std) = (mean.into_data(), log_std.into_data());
            let (mean, log_std) = (
                mean.as_slice::<f32>().unwrap(),
                log_std.as_slice::<f32>().unwrap(),
            );
            for (i, lp_out) in logp_out.iter_mut().enumerate() {
                let mut lp = 0.0;
                for d in 0..act_dim {
                    let k = i * act_dim + d;
                    let z: f32 = rng.sample(StandardNormal);
                    let sample = mean[k] + log_std[k].exp() * z;
                    store[k] = sample;
                    a[k] = sample.clamp(low[d], high[d]);
                    lp += -0.5 * z * z - log_std[k] - 0.5 * (2.0 * PI).ln();
                }
                *lp_out = lp;
            }
        }
        _ => unreachable!("action buffer matches the space"),
    }
}

/// PPO's trainer and the copy of the actor-critic that the collector and evaluator act with.
pub struct PpoAgent {
    /// The actor-critic with its flat parameters and Adam state.
    pub trainer: Trainer<ActorCritic>,
    /// What the collector and evaluator act with (refreshed after each round of epochs).
    pub acting: ActorCritic,
    /// Minibatch steps done.
    pub iters: u64,
    p: PpoPolicy,
    space: ActionSpace,
    ad: Device,
    last_kl: f32,
}

impl OnPolicy for PpoAgent {
    fn train_iter(&self) -> u64 {
        self.iters
    }

    fn minibatch(
        &mut self,
        mb: &[usize],
        r: &RolloutBuffer,
        lr: f64,
    ) -> Result<Vec<(&'static str, f32)>, TrainError> {
        let view = Rollout {
            obs: &r.obs,
            actions: &r.actions,
            logp: &r.logp,
            adv: &r.adv,
            returns: &r.returns,
            values: &r.values,
            obs_dim: r.obs_dim,
            act_dim: r.act_dim,
        };
        let s = minibatch_update(
            &mut self.trainer,
            &self.p,
            &self.space,
            &self.ad,
            mb,
            &view,
            lr,
        )?;
        self.iters += 1;
        self.last_kl = s.approx_kl;
        Ok(vec![
            ("losses/total_loss", s.loss),
            ("losses/policy_loss", s.policy_loss),
            ("losses/value_loss", s.value_loss),
            ("losses/entropy", s.entropy),
            ("losses/approx_kl", s.approx_kl),
            ("losses/clipfrac", s.clipfrac),
        ])
    }

    fn approx_kl(&self) -> f32 {
        self.last_kl
    }

    fn publish(&mut self) {
        self.acting = self.trainer.inference();
    }
}

/// Train PPO as configured; stops at `env.stop_value`, `max_env_step` or `max_train_iter`.
/// The pipeline of built-in middlewares: `evaluate? → roll out n_sample steps → GAE →
/// epochs × minibatches → log`.
pub fn train(
    cfg: &Config,
    p: &PpoPolicy,
    run: &mut RunContext<'_>,
) -> Result<TrainResult, TrainError> {
    // PLUMBING: seeding, environments, networks.
    let start = Instant::now();
    let ranks = session::setup(cfg, run);
    let venv = session::collector_envs(cfg, ranks.rank())?;
    let (rank, world) = (ranks.rank(), ranks.world());
    let plain = run.device.clone();
    let n_env = venv.num_envs();
    let space = venv.spec().action_space.clone();
    let obs_dim = venv.spec().obs_dim;
    let ad = plain.clone().autodiff();
    let mut trainer = Trainer::new(build_agent(cfg, p, &ad)?, 1e-5);
    let (mut iters, mut env_step) = (0, 0);
    if let Some(ck) = &run.resume {
        ck.get_trainer("model", &mut trainer)?;
        iters = ck.counter("train_iters")?;
        env_step = ck.counter("env_steps")?;
    }
    if let Some(pg) = ranks.group() {
        trainer.distribute(pg.clone(), session::ddp_options(cfg))?;
    }
    let agent = RefCell::new(PpoAgent {
        acting: trainer.inference(),
        trainer,
        iters,
        p: p.clone(),
        space: space.clone(),
        ad,
        last_kl: 0.0,
    });
    let rng = RefCell::new(session::rank_rng(cfg, run.resume.as_ref(), rank));
    let split = |n: usize| {
        if cfg.policy.ddp().0 {
            n.div_ceil(world)
        } else {
            n
        }
    };
    let out = Outputs::new(&mut *run.reporter);
    let mut task = Task::<OnlineRLContext>::new();
    if cfg.task.step_timer > 0 {
        task.step_timer(cfg.task.step_timer);
    }
    task.ctx_mut().env_step = env_step;
    task.ctx_mut().train_iter = iters;

    // ALGO: evaluate deterministically every eval_freq train iterations (and before training).
    let evaluator = (rank == 0)
        .then(|| session::evaluator(cfg, world))
        .transpose()?;
    let policy = |obs: &[f32], a: &mut ActionBuf| {
        act_deterministic(&agent.borrow().acting, &space, obs, obs_dim, &plain, a)
    };
    task.use_mw(InteractionEvaluator::new(
        evaluator,
        p.eval.evaluator.eval_freq,
        cfg.env.stop_value,
        ranks.clone(),
        policy,
    ));
    let build = || {
        let mut ck = Checkpoint::default();
        ck.put_trainer("model", &agent.borrow().trainer);
        ck
    };
    task.use_mw(CkptSaver::new(&out, "ppo", ranks.clone(), &rng, build));
    task.use_mw(TerminationChecker::new(
        cfg.max_env_step,
        cfg.max_train_iter,
        ranks.clone(),
    ));
    // ALGO: roll out n_sample / env_num steps in every env with the stochastic policy.
    let steps = (split(p.collect.n_sample) / n_env).max(1);
    let sample = |obs: &[f32],
                  rng: &mut ChaCha8Rng,
                  a: &mut ActionBuf,
                  store: &mut [f32],
                  logp: &mut [f32]| {
        sample_actions(
            &agent.borrow().acting,
            &space,
            obs,
            &plain,
            rng,
            a,
            store,
            logp,
        )
    };
    let mut collector = RolloutCollector::new(venv, steps, sample, &rng, ranks.clone());
    if p.learn.reward_norm {
        collector = collector.reward_norm(p.collect.discount_factor);
    }
    task.use_mw(collector);
    // ALGO: values of every state and next state, then GAE advantages and returns.
    let values = |obs: &[f32]| critic_values(&agent.borrow().acting.critic, obs, obs_dim, &plain);
    task.use_mw(GaeEstimator::new(
        p.collect.discount_factor as f32,
        p.collect.gae_lambda as f32,
        values,
    ));
    // ALGO: epoch_per_collect passes of shuffled minibatches.
    let mut learn = OnPolicyLearner::new(&agent, &rng, ranks.clone());
    learn.batch_size = split(p.learn.batch_size);
    learn.epoch_per_collect = p.learn.epoch_per_collect;
    learn.learning_rate = p.learn.learning_rate;
    learn.anneal_to = if p.learn.lr_anneal {
        cfg.max_env_step
    } else {
        None
    };
    learn.target_kl = p.learn.target_kl;
    task.use_mw(learn);
    task.use_mw(OnlineLogger::new(&out, cfg.max_env_step));
    let ctx = task.run(None)?;
    Ok(session::result(
        &ctx,
        start.elapsed().as_secs_f64(),
        world,
        run.restarts,
    ))
}

fn critic_values(critic: &Critic, obs: &[f32], obs_dim: usize, device: &Device) -> Vec<f32> {
    let n = obs.len() / obs_dim;
    let v = critic.forward(Tensor::from_data(
        TensorData::new(obs.to_vec(), [n, obs_dim]),
        device,
    ));
    v.into_data().try_into_vec::<f32>().expect("f32 values")
}

/// The rollout a minibatch is drawn from (time-major rows).
pub struct Rollout<'a> {
    /// `[rows, obs_dim]`.
    pub obs: &'a [f32],
    /// `[rows, act_dim]` (discrete: the index as f32).
    pub actions: &'a [f32],
    /// Log-probabilities under the behaviour policy.
    pub logp: &'a [f32],
    /// GAE advantages.
    pub adv: &'a [f32],
    /// Value targets.
    pub returns: &'a [f32],
    /// Values under the behaviour critic.
    pub values: &'a [f32],
    /// Observation size.
    pub obs_dim: usize,
    /// Action size (1 for discrete).
    pub act_dim: usize,
}

/// What a minibatch update measured.
#[derive(Debug, Clone, Copy, Default)]
pub struct MinibatchStats {
    /// Total loss.
    pub loss: f32,
    /// Clipped surrogate loss.
    pub policy_loss: f32,
    /// Value loss.
    pub value_loss: f32,
    /// Mean entropy.
    pub entropy: f32,
    /// `mean((ratio - 1) - log ratio)`.
    pub approx_kl: f32,
    /// Fraction of ratios outside the clip range.
    pub clipfrac: f32,
}

/// One PPO gradient step on the rows `mb` of `r`.
pub fn minibatch_update(
    trainer: &mut Trainer<ActorCritic>,
    p: &PpoPolicy,
    space: &ActionSpace,
    ad: &Device,
    mb: &[usize],
    r: &Rollout<'_>,
    lr: f64,
) -> Result<MinibatchStats, TrainError> {
    let (b, d, ad_dim) = (mb.len(), r.obs_dim, r.act_dim);
    let gather = |src: &[f32], width: usize| -> Vec<f32> {
        mb.iter()
            .flat_map(|&k| src[k * width..(k + 1) * width].iter().copied())
            .collect()
    };
    let obs = Tensor::<2>::from_data(TensorData::new(gather(r.obs, d), [b, d]), ad);
    let old_logp = Tensor::<1>::from_data(TensorData::new(gather(r.logp, 1), [b]), ad);
    let mut adv = gather(r.adv, 1);
    if p.learn.adv_norm && b > 1 {
        let mean = adv.iter().sum::<f32>() / b as f32;
        let std = (adv.iter().map(|a| (a - mean).powi(2)).sum::<f32>() / (b - 1) as f32).sqrt();
        adv.iter_mut().for_each(|a| *a = (*a - mean) / (std + 1e-8));
    }
    let adv = Tensor::<1>::from_data(TensorData::new(adv, [b]), ad);
    let model = trainer.model();
    // ALGO: log-probability and entropy of the taken actions under the current policy.
    let (new_logp, entropy) = match space {
        ActionSpace::Discrete(_) => {
            let acts: Vec<i64> = mb.iter().map(|&k| r.actions[k] as i64).collect();
            let logp = log_softmax(model.actor.logits(obs.clone()), 1);
            let taken = logp
                .clone()
                .gather(
                    1,
                    Tensor::<2, Int>::from_data(TensorData::new(acts, [b, 1]), ad),
                )
                .reshape([b]);
            let entropy = (logp.clone().exp() * logp).sum_dim(1).neg().reshape([b]);
            (taken, entropy)
        }
        ActionSpace::Continuous { .. } => {
            let a =
                Tensor::<2>::from_data(TensorData::new(gather(r.actions, ad_dim), [b, ad_dim]), ad);
            let (mean, log_std) = model.actor.gaussian(obs.clone());
            let z = (a - mean) / log_std.clone().exp();
            let logp = (z.clone() * z).mul_scalar(-0.5)
                - log_std.clone()
                - 0.5 * (2.0 * std::f64::consts::PI).ln();
            let entropy = log_std.add_scalar(0.5 + 0.5 * (2.0 * std::f64::consts::PI).ln());
            (
                logp.sum_dim(1).reshape([b]),
                entropy.sum_dim(1).reshape([b]),
            )
        }
    };
    // ALGO: clipped surrogate objective.
    let log_ratio = new_logp - old_logp;
    let ratio = log_ratio.clone().exp();
    let c = p.learn.clip_ratio;
    let pg1 = adv.clone().neg() * ratio.clone();
    let pg2 = adv.neg() * ratio.clone().clamp(1.0 - c, 1.0 + c);
    let policy_loss = pg1.max_pair(pg2).mean();
    // ALGO: value loss, clipped around the behaviour values.
    let returns = Tensor::<1>::from_data(TensorData::new(gather(r.returns, 1), [b]), ad);
    let v = model.critic.forward(obs);
    let value_loss = if p.learn.value_clip {
        let old_v = Tensor::<1>::from_data(TensorData::new(gather(r.values, 1), [b]), ad);
        let v_clipped = old_v.clone() + (v.clone() - old_v).clamp(-c, c);
        let l1 = (v - returns.clone()).square();
        let l2 = (v_clipped - returns).square();
        l1.max_pair(l2).mean().mul_scalar(0.5)
    } else {
        (v - returns).square().mean().mul_scalar(0.5)
    };
    let entropy = entropy.mean();
    let loss = policy_loss.clone() + value_loss.clone().mul_scalar(p.learn.value_weight)
        - entropy.clone().mul_scalar(p.learn.entropy_weight);
    // PLUMBING: statistics (detached), then backward and the Adam step.
    let approx_kl = ((ratio.clone() - 1.0) - log_ratio)
        .mean()
        .into_scalar::<f32>();
    let clipfrac = (ratio - 1.0)
        .abs()
        .greater_elem(c)
        .float()
        .mean()
        .into_scalar::<f32>();
    let stats = MinibatchStats {
        loss: loss.clone().into_scalar::<f32>(),
        policy_loss: policy_loss.into_scalar::<f32>(),
        value_loss: value_loss.into_scalar::<f32>(),
        entropy: entropy.into_scalar::<f32>(),
        approx_kl,
        clipfrac,
    };
    trainer.backward(loss)?;
    trainer.step(lr, p.learn.grad_clip_value)?;
    Ok(stats)
}
