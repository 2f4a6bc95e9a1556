//! PPO (Schulman et al. 2017) as CleanRL writes it, for categorical and Gaussian policies:
//! GAE, clipped surrogate, clipped value loss, entropy bonus, per-minibatch advantage
//! normalisation, several epochs of shuffled minibatches, global gradient-norm clipping.
//!
//! Read top to bottom: setup, then the loop `evaluate? → roll out n_sample steps → GAE →
//! epochs × minibatches`. Hyper-parameters come from [`PpoPolicy`] (the `[policy]` table).
//! A train iteration is one minibatch gradient step (as DI-engine counts them).

use crate::checkpoint::Checkpoint;
use crate::data::gae;
use crate::dqn::check_shapes;
use crate::eval::ActionBuf;
use crate::nets::{Actor, ActorCritic, ActorHead, Critic};
use crate::optim::Trainer;
use crate::run::{RunContext, TrainError, TrainResult};
use crate::session::Session;
use burn::tensor::activation::log_softmax;
use burn::tensor::{Device, Int, Tensor, TensorData};
use drill_config::{Config, PpoPolicy, SigmaType};
use drill_env::ActionSpace;
use rand::Rng;
use rand::seq::SliceRandom;
use rand_distr::StandardNormal;
use std::f32::consts::PI;

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

/// Running variance of the discounted return, for reward scaling (SB3's `VecNormalize`).
struct RewardScaler {
    ret: Vec<f64>,
    count: f64,
    mean: f64,
    m2: f64,
    gamma: f64,
}

impl RewardScaler {
    fn scale(&mut self, i: usize, r: f32, done: bool) -> f32 {
        self.ret[i] = self.ret[i] * self.gamma + f64::from(r);
        self.count += 1.0;
        let delta = self.ret[i] - self.mean;
        self.mean += delta / self.count;
        self.m2 += delta * (self.ret[i] - self.mean);
        if done {
            self.ret[i] = 0.0;
        }
        let var = if self.count > 1.0 {
            self.m2 / self.count
        } else {
            1.0
        };
        (f64::from(r) / (var.sqrt() + 1e-8)).clamp(-10.0, 10.0) as f32
    }
}

/// Train PPO as configured; stops at `env.stop_value`, `max_env_step` or `max_train_iter`.
pub fn train(
    cfg: &Config,
    p: &PpoPolicy,
    ctx: &mut RunContext<'_>,
) -> Result<TrainResult, TrainError> {
    // PLUMBING: seeding, environments, networks, rollout storage (allocated once).
    let mut s = Session::new(cfg, ctx, "ppo")?;
    let n_env = cfg.env.collector_env_num;
    let space = s.venv.spec().action_space.clone();
    let obs_dim = s.venv.spec().obs_dim;
    let act_dim = if space.is_discrete() { 1 } else { space.dim() };
    let plain = ctx.device.clone();
    let ad = plain.clone().autodiff();
    let mut trainer = Trainer::new(build_agent(cfg, p, &ad)?, 1e-5);
    let mut iters = 0u64;
    if let Some(ck) = &ctx.resume {
        ck.get_trainer("model", &mut trainer)?;
        iters = ck.counter("train_iters")?;
    }
    if let Some(pg) = s.dist() {
        trainer.distribute(pg.clone(), Session::ddp_options(cfg))?;
    }
    let batch_size = s.per_rank(cfg, p.learn.batch_size);
    let steps = (s.per_rank(cfg, p.collect.n_sample) / n_env).max(1);
    let total = steps * n_env;
    let mut obs_buf = vec![0f32; total * obs_dim];
    let mut next_obs_buf = vec![0f32; total * obs_dim];
    let mut act_buf = vec![0f32; total * act_dim];
    let mut logp_buf = vec![0f32; total];
    let mut rew_buf = vec![0f32; total];
    let mut term_buf = vec![false; total];
    let mut end_buf = vec![false; total];
    let mut adv = vec![0f32; total];
    let mut actions = ActionBuf::for_space(&space, n_env);
    let mut scaler = RewardScaler {
        ret: vec![0.0; n_env],
        count: 0.0,
        mean: 0.0,
        m2: 0.0,
        gamma: p.collect.discount_factor,
    };
    let mut order: Vec<usize> = (0..total).collect();
    let mut agent = trainer.inference();
    let checkpoint = |trainer: &Trainer<ActorCritic>| {
        let mut ck = Checkpoint::default();
        ck.put_trainer("model", trainer);
        ck
    };

    loop {
        // ALGO: evaluate deterministically every eval_freq train iterations (and before training).
        if s.eval_due(iters, p.eval.evaluator.eval_freq) {
            let policy = |obs: &[f32], out: &mut ActionBuf| {
                act_deterministic(&agent, &space, obs, obs_dim, &plain, out)
            };
            if s.evaluate(cfg, ctx, iters, policy, &mut || checkpoint(&trainer))? {
                break;
            }
        }
        if s.limits_reached(cfg, iters)? {
            break;
        }

        // ALGO: roll out `steps` steps in every env with the current (stochastic) policy.
        for t in 0..steps {
            let rows = t * n_env..(t + 1) * n_env;
            let obs = &mut obs_buf[rows.start * obs_dim..rows.end * obs_dim];
            obs.copy_from_slice(s.venv.obs());
            let x = Tensor::<2>::from_data(TensorData::new(obs.to_vec(), [n_env, obs_dim]), &plain);
            match (&space, &mut actions) {
                (ActionSpace::Discrete(k), ActionBuf::Discrete(a)) => {
                    let logp = log_softmax(agent.actor.logits(x), 1).into_data();
                    let logp = logp.as_slice::<f32>().unwrap();
                    for i in 0..n_env {
                        let row = &logp[i * k..(i + 1) * k];
                        let mut u: f32 = s.rng.random();
                        let mut choice = k - 1;
                        for (j, lp) in row.iter().enumerate() {
                            u -= lp.exp();
                            if u <= 0.0 {
                                choice = j;
                                break;
                            }
                        }
                        a[i] = choice as u32;
                        act_buf[rows.start + i] = choice as f32;
                        logp_buf[rows.start + i] = row[choice];
                    }
                }
                (ActionSpace::Continuous { low, high }, ActionBuf::Continuous(a)) => {
                    let (mean, log_std) = agent.actor.gaussian(x);
                    let (mean, log_std) = (mean.into_data(), log_std.into_data());
                    let (mean, log_std) = (
                        mean.as_slice::<f32>().unwrap(),
                        log_std.as_slice::<f32>().unwrap(),
                    );
                    for i in 0..n_env {
                        let mut lp = 0.0;
                        for d in 0..act_dim {
                            let k = i * act_dim + d;
                            let z: f32 = s.rng.sample(StandardNormal);
                            let sample = mean[k] + log_std[k].exp() * z;
                            act_buf[rows.start * act_dim + k] = sample;
                            a[k] = sample.clamp(low[d], high[d]);
                            lp += -0.5 * z * z - log_std[k] - 0.5 * (2.0 * PI).ln();
                        }
                        logp_buf[rows.start + i] = lp;
                    }
                }
                _ => unreachable!("action buffer matches the space"),
            }
            s.venv.step(actions.as_actions());
            let venv = &s.venv;
            next_obs_buf[rows.start * obs_dim..rows.end * obs_dim]
                .copy_from_slice(venv.final_obs());
            for i in 0..n_env {
                let (term, done) = (
                    venv.terminated()[i],
                    venv.terminated()[i] || venv.truncated()[i],
                );
                let r = venv.rewards()[i];
                rew_buf[rows.start + i] = if p.learn.reward_norm {
                    scaler.scale(i, r, done)
                } else {
                    r
                };
                term_buf[rows.start + i] = term;
                end_buf[rows.start + i] = done;
                if done {
                    ctx.reporter.scalar(
                        "charts/episodic_return",
                        venv.final_returns()[i],
                        s.env_steps_now((t * n_env) as u64),
                    );
                }
            }
        }
        s.collected(total as u64)?;

        // ALGO: values of every state and next state, then GAE advantages and returns.
        let values = critic_values(&agent.critic, &obs_buf, obs_dim, &plain);
        let next_values = critic_values(&agent.critic, &next_obs_buf, obs_dim, &plain);
        let (gamma, lambda) = (
            p.collect.discount_factor as f32,
            p.collect.gae_lambda as f32,
        );
        gae(
            &rew_buf,
            &values,
            &next_values,
            &term_buf,
            &end_buf,
            n_env,
            gamma,
            lambda,
            &mut adv,
        );
        let returns: Vec<f32> = adv.iter().zip(&values).map(|(a, v)| a + v).collect();

        // ALGO: epoch_per_collect passes of shuffled minibatches.
        let lr = if p.learn.lr_anneal {
            let max = cfg
                .max_env_step
                .expect("validated: lr_anneal needs max_env_step") as f64;
            p.learn.learning_rate * (1.0 - s.env_steps as f64 / max).max(0.0)
        } else {
            p.learn.learning_rate
        };
        let rollout = Rollout {
            obs: &obs_buf,
            actions: &act_buf,
            logp: &logp_buf,
            adv: &adv,
            returns: &returns,
            values: &values,
            obs_dim,
            act_dim,
        };
        let mut stats = MinibatchStats::default();
        'epochs: for _ in 0..p.learn.epoch_per_collect {
            order.shuffle(&mut s.rng);
            for mb in order.chunks(batch_size) {
                stats = minibatch_update(&mut trainer, p, &space, &ad, mb, &rollout, lr)?;
                iters += 1;
                if !stats.loss.is_finite() {
                    return Err(TrainError::NonFinite {
                        iter: iters,
                        value: f64::from(stats.loss),
                    });
                }
                // Early stop on KL: every rank must agree, so the averaged KL decides.
                if p.learn.target_kl > 0.0 {
                    let mut kl = [stats.approx_kl];
                    s.mean_across_ranks(&mut kl)?;
                    if f64::from(kl[0]) > p.learn.target_kl {
                        break 'epochs;
                    }
                }
            }
        }
        agent = trainer.inference();
        let step = s.env_steps;
        let mut logged = [
            stats.policy_loss,
            stats.value_loss,
            stats.entropy,
            stats.approx_kl,
            stats.clipfrac,
        ];
        s.mean_across_ranks(&mut logged)?;
        for (tag, v) in [
            "losses/policy_loss",
            "losses/value_loss",
            "losses/entropy",
            "losses/approx_kl",
            "losses/clipfrac",
        ]
        .into_iter()
        .zip(logged)
        {
            ctx.reporter.scalar(tag, f64::from(v), step);
        }
        ctx.reporter.scalar("charts/learning_rate", lr, step);
        ctx.reporter
            .scalar("charts/SPS", step as f64 / s.seconds(), step);
        s.progress(cfg, ctx, iters);
    }
    s.finish(ctx, iters, &mut || checkpoint(&trainer))
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
