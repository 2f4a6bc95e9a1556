//! PPO (Schulman et al. 2017) as CleanRL writes it, for categorical and Gaussian policies:
//! GAE, clipped surrogate, clipped value loss, entropy bonus, per-minibatch advantage
//! normalisation, several epochs of shuffled minibatches with an optional KL early stop
//! (checked once per epoch, as CleanRL), linear learning-rate annealing, global gradient-norm
//! clipping.
//!
//! Read top to bottom: the network (`check_model`, [`build_agent`]), acting (sampling for collection,
//! deterministic for evaluation) and the update (epochs over the rollout in [`Ppo`]'s
//! [`Policy::learn`], each minibatch's loss in [`minibatch_update`]), then [`train`]: setup
//! and the pipeline of built-in middlewares `evaluate? → roll out n_sample steps → GAE →
//! learn → log`. Hyper-parameters come from [`PpoPolicy`] (the `[policy]` table). A train
//! iteration is one minibatch gradient step (as DI-engine counts them).

use crate::checkpoint::{Checkpoint, CheckpointExt};
use crate::context;
use crate::context::{RunContext, TrainResult};
use crate::data::Rollout;
use crate::ddp;
use crate::ddp::Ranks;
use crate::envs;
use crate::error::TrainError;
use crate::middleware::{
    CkptSaver, GaeEstimator, InteractionEvaluator, OnPolicyLearner, OnlineLogger, Outputs,
    RolloutCollector, TerminationChecker, TrainClock, run_result,
};
use crate::nets;
use crate::nets::{
    Actor, ActorCritic, ActorHead, ConvEncoder, Critic, HALF_LN_2PI, ObsShape, check_encoder,
    input, input_rows,
};
use crate::optim::{ActingCopy, Trainer};
use crate::policy::{Acted, Explore, LearnOutput, Policy};
use crate::resume;
use burn::tensor::activation::log_softmax;
use burn::tensor::{Device, Int, Tensor, TensorData};
use drill_config::{Config, PpoPolicy, SigmaType};
use drill_env::{ActionBuf, ActionSpace, EnvSpec, Obs};
use drill_task::Task;
use rand::Rng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;
use std::cell::RefCell;

/// Check that `[policy.model]` makes an actor-critic for the environment `spec` describes,
/// without building it: the given shapes, frames a Nature-CNN trunk fits. Returns what
/// [`build_agent`] builds from: the observations, the action size and the actor's head.
pub(crate) fn check_model(
    cfg: &Config,
    p: &PpoPolicy,
    spec: &EnvSpec,
) -> Result<(ObsShape, usize, ActorHead), TrainError> {
    let (act_dim, head) = match &spec.action_space {
        ActionSpace::Discrete(n) => (*n, ActorHead::Categorical),
        ActionSpace::Continuous { low, .. } => match p.model.sigma_type {
            SigmaType::Independent => (low.len(), ActorHead::GaussianIndependent),
            SigmaType::Conditioned => (low.len(), ActorHead::GaussianConditioned),
        },
    };
    nets::check_shapes(
        cfg,
        (p.model.obs_shape.as_ref(), p.model.action_shape),
        (&spec.obs.shape, act_dim),
    )?;
    let obs = ObsShape::of(cfg, spec, "PPO")?;
    if let ObsShape::Frames(shape) = obs {
        check_encoder(shape, None).map_err(|e| cfg.error("env.screen_size", e))?;
    }
    Ok((obs, act_dim, head))
}

/// The actor-critic for the environment `spec` describes, as `[policy.model]` says
/// (`check_model` first).
pub fn build_agent(
    cfg: &Config,
    p: &PpoPolicy,
    spec: &EnvSpec,
    device: &Device,
) -> Result<ActorCritic, TrainError> {
    let (obs, act_dim, head) = check_model(cfg, p, spec)?;
    let hidden = &p.model.encoder_hidden_size_list;
    // Frames go through CleanRL's Nature-CNN trunk (orthogonal init), vectors straight in.
    let trunk = match obs {
        ObsShape::Vector(_) => None,
        ObsShape::Frames(shape) => Some(
            ConvEncoder::nature(shape, true, device)
                .map_err(|e| cfg.error("env.screen_size", e))?,
        ),
    };
    let input_dim = trunk.as_ref().map_or(spec.obs_dim(), ConvEncoder::features);
    Ok(ActorCritic {
        trunk,
        actor: Actor::new(
            input_dim,
            hidden,
            act_dim,
            head,
            p.model.activation,
            p.model.init_log_std,
            device,
        ),
        critic: Critic::new(input_dim, hidden, p.model.activation, device),
    })
}

/// Deterministic actions for evaluation: argmax logits, or the Gaussian mean clipped to bounds.
pub(crate) fn act_deterministic(
    agent: &ActorCritic,
    space: &ActionSpace,
    obs: Obs<'_>,
    obs_dim: usize,
    device: &Device,
    out: &mut ActionBuf,
) {
    let n = obs.len() / obs_dim;
    let x = agent.features(input(obs, obs_dim, device));
    match space {
        ActionSpace::Discrete(k) => {
            let logits = agent.actor.logits(x).into_data();
            let l = logits.as_slice::<f32>().unwrap();
            for (i, a) in out.discrete_mut(n).iter_mut().enumerate() {
                let row = &l[i * k..(i + 1) * k];
                *a = crate::nets::argmax(row) as u32;
            }
        }
        ActionSpace::Continuous { low, high } => {
            let mean = agent.actor.gaussian(x).0.into_data();
            let out = out.continuous_mut(n, low.len());
            for (j, (a, m)) in out
                .iter_mut()
                .zip(mean.as_slice::<f32>().unwrap())
                .enumerate()
            {
                let d = j % low.len();
                *a = m.clamp(low[d], high[d]);
            }
        }
    }
}

/// Sample actions for a batch of observations from the stochastic policy: the actions
/// (continuous ones unclipped: the env clips), their log-probabilities and the critic's values
/// (from the same trunk features: one forward pass) into `out`.
pub(crate) fn sample_actions(
    agent: &ActorCritic,
    space: &ActionSpace,
    obs: Obs<'_>,
    obs_dim: usize,
    device: &Device,
    rng: &mut impl Rng,
    out: &mut Acted,
) {
    let n = obs.len() / obs_dim;
    let x = agent.features(input(obs, obs_dim, device));
    out.logp.resize(n, 0.0);
    let v = agent.critic.forward(x.clone()).into_data();
    out.values.clear();
    out.values
        .extend_from_slice(v.as_slice::<f32>().expect("f32 values"));
    match space {
        ActionSpace::Discrete(k) => {
            let logp = log_softmax(agent.actor.logits(x), 1).into_data();
            let logp = logp.as_slice::<f32>().unwrap();
            let a = out.actions.discrete_mut(n);
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
                out.logp[i] = row[choice];
            }
        }
        ActionSpace::Continuous { low, .. } => {
            let act_dim = low.len();
            let (mean, log_std) = agent.actor.gaussian(x);
            let (mean, log_std) = (mean.into_data(), log_std.into_data());
            let (mean, log_std) = (
                mean.as_slice::<f32>().unwrap(),
                log_std.as_slice::<f32>().unwrap(),
            );
            let a = out.actions.continuous_mut(n, act_dim);
            for (i, lp_out) in out.logp.iter_mut().enumerate() {
                let mut lp = 0.0;
                for d in 0..act_dim {
                    let k = i * act_dim + d;
                    let z: f32 = rng.sample(StandardNormal);
                    a[k] = mean[k] + log_std[k].exp() * z;
                    lp += -0.5 * z * z - log_std[k] - HALF_LN_2PI as f32;
                }
                *lp_out = lp;
            }
        }
    }
}

/// The log-probabilities of `actions` (as [`sample_actions`] drew them) for `obs` and the
/// critic's values, from one forward pass, into `logp` and `values`.
pub(crate) fn action_logp(
    agent: &ActorCritic,
    obs: Obs<'_>,
    obs_dim: usize,
    actions: &ActionBuf,
    device: &Device,
    logp: &mut Vec<f32>,
    values: &mut Vec<f32>,
) {
    let n = obs.len() / obs_dim;
    let x = agent.features(input(obs, obs_dim, device));
    let v = agent.critic.forward(x.clone()).into_data();
    values.clear();
    values.extend_from_slice(v.as_slice::<f32>().expect("f32 values"));
    logp.clear();
    match actions {
        ActionBuf::Discrete(taken) => {
            let lp = log_softmax(agent.actor.logits(x), 1).into_data();
            let lp = lp.as_slice::<f32>().expect("f32 logits");
            let k = lp.len() / n;
            logp.extend(
                taken
                    .iter()
                    .enumerate()
                    .map(|(i, &a)| lp[i * k + a as usize]),
            );
        }
        ActionBuf::Continuous { dim, values: a } => {
            let (mean, log_std) = agent.actor.gaussian(x);
            let (mean, log_std) = (mean.into_data(), log_std.into_data());
            let (mean, log_std) = (
                mean.as_slice::<f32>().expect("f32 mean"),
                log_std.as_slice::<f32>().expect("f32 log-std"),
            );
            for i in 0..n {
                let mut lp = 0.0;
                for j in i * dim..(i + 1) * dim {
                    let z = (a[j] - mean[j]) / log_std[j].exp();
                    lp += -0.5 * z * z - log_std[j] - HALF_LN_2PI as f32;
                }
                logp.push(lp);
            }
        }
    }
}

/// PPO: the actor-critic with its flat parameters and Adam state, the copy the collector and
/// evaluator act with, and the update schedule.
pub struct Ppo {
    /// The actor-critic with its flat parameters and Adam state.
    pub trainer: Trainer<ActorCritic>,
    acting: ActingCopy<ActorCritic>,
    /// Minibatch steps done.
    pub iters: u64,
    p: PpoPolicy,
    space: ActionSpace,
    obs_dim: usize,
    device: Device,
    ad: Device,
    ranks: Ranks,
    batch_size: usize,
    anneal_to: Option<u64>,
    order: Vec<usize>,
}

impl Ppo {
    /// The actor's outputs (logits, or the Gaussian's mean and log-std) and the critic's
    /// values for `obs`, row-major; for exports' checks.
    pub fn outputs(&self, obs: Obs<'_>) -> (Vec<f32>, Option<Vec<f32>>, Vec<f32>) {
        let net = self.trainer.inference();
        let x = net.features(input(obs, self.obs_dim, &self.device));
        let flat = |t: burn::tensor::Tensor<2>| -> Vec<f32> {
            t.into_data().as_slice::<f32>().expect("f32").to_vec()
        };
        let (actor, log_std) = match self.space {
            ActionSpace::Discrete(_) => (flat(net.actor.logits(x.clone())), None),
            ActionSpace::Continuous { .. } => {
                let (mean, log_std) = net.actor.gaussian(x.clone());
                (flat(mean), Some(flat(log_std)))
            }
        };
        let v = net.critic.forward(x).into_data();
        (actor, log_std, v.as_slice::<f32>().expect("f32").to_vec())
    }

    /// PPO for `cfg`'s environment on `device` (the plain device), its spec built here; `ranks`
    /// average the KL of the early stop under DDP.
    pub fn from_config(
        cfg: &Config,
        p: &PpoPolicy,
        device: &Device,
        ranks: Ranks,
    ) -> Result<Self, TrainError> {
        Self::from_spec(cfg, p, &envs::env_spec(cfg)?, device, ranks)
    }

    /// PPO for the environment `spec` describes, on `device` (the plain device); `ranks`
    /// average the KL of the early stop under DDP.
    pub(crate) fn from_spec(
        cfg: &Config,
        p: &PpoPolicy,
        spec: &EnvSpec,
        device: &Device,
        ranks: Ranks,
    ) -> Result<Self, TrainError> {
        let ad = device.clone().autodiff();
        let trainer = Trainer::new(build_agent(cfg, p, spec, &ad)?, 1e-5);
        Ok(Self {
            acting: ActingCopy::new(&trainer),
            trainer,
            iters: 0,
            p: p.clone(),
            space: spec.action_space.clone(),
            obs_dim: spec.obs_dim(),
            device: device.clone(),
            ad,
            batch_size: ddp::split(cfg, &ranks, p.learn.batch_size),
            ranks,
            anneal_to: if p.learn.lr_anneal {
                cfg.max_env_step
            } else {
                None
            },
            order: Vec::new(),
        })
    }

    /// Train data-parallel on `pg`: rank 0's actor-critic is broadcast, and every update
    /// averages gradients across ranks.
    pub fn distribute(
        &mut self,
        pg: drill_comm::ProcessGroup,
        opts: crate::optim::DdpOptions,
    ) -> Result<(), TrainError> {
        self.trainer.distribute(pg, opts)?;
        self.acting.invalidate();
        Ok(())
    }
}

impl Policy for Ppo {
    type Data = Rollout;
    const NAME: &'static str = "ppo";

    fn eval(&mut self, obs: Obs<'_>, out: &mut ActionBuf) {
        let net = self.acting.get(&self.trainer);
        act_deterministic(net, &self.space, obs, self.obs_dim, &self.device, out);
    }

    fn collect(&mut self, obs: Obs<'_>, _: &Explore, rng: &mut ChaCha8Rng, out: &mut Acted) {
        let net = self.acting.get(&self.trainer);
        sample_actions(net, &self.space, obs, self.obs_dim, &self.device, rng, out);
    }

    fn values(&mut self, obs: Obs<'_>, out: &mut Vec<f32>) -> Result<(), TrainError> {
        let net = self.acting.get(&self.trainer);
        let v = net
            .critic
            .forward(net.features(input(obs, self.obs_dim, &self.device)));
        *out = v.into_data().try_into_vec::<f32>().expect("f32 values");
        Ok(())
    }

    fn evaluate_actions(
        &mut self,
        obs: Obs<'_>,
        actions: &ActionBuf,
        logp: &mut Vec<f32>,
        values: &mut Vec<f32>,
    ) -> Result<(), TrainError> {
        let net = self.acting.get(&self.trainer);
        action_logp(net, obs, self.obs_dim, actions, &self.device, logp, values);
        Ok(())
    }

    fn learn(
        &mut self,
        r: &Rollout,
        env_step: u64,
        rng: &mut ChaCha8Rng,
        out: &mut LearnOutput,
    ) -> Result<(), TrainError> {
        // ALGO: learning rate, annealed linearly to 0 at max_env_step when asked.
        let lr = match self.anneal_to {
            Some(max) => self.p.learn.learning_rate * (1.0 - env_step as f64 / max as f64).max(0.0),
            None => self.p.learn.learning_rate,
        };
        // ALGO: epoch_per_collect passes of shuffled minibatches; the early stop compares the
        // last minibatch's approximate KL (averaged over ranks, so every rank agrees) with
        // target_kl after each epoch.
        self.order.clear();
        self.order.extend(0..r.len());
        let mut last = MinibatchStats::default();
        for _ in 0..self.p.learn.epoch_per_collect {
            self.order.shuffle(rng);
            for mb in self.order.chunks(self.batch_size) {
                last =
                    minibatch_update(&mut self.trainer, &self.p, &self.space, &self.ad, mb, r, lr)?;
                self.iters += 1;
                if !last.loss.is_finite() {
                    return Err(TrainError::NonFinite {
                        iter: self.iters,
                        value: f64::from(last.loss),
                    });
                }
            }
            if self.p.learn.target_kl > 0.0 {
                let mut kl = [last.approx_kl];
                self.ranks.mean(&mut kl)?;
                if f64::from(kl[0]) > self.p.learn.target_kl {
                    break;
                }
            }
        }
        self.acting.invalidate();
        out.loss = last.loss;
        out.scalars.extend([
            ("losses/total_loss", last.loss),
            ("losses/policy_loss", last.policy_loss),
            ("losses/value_loss", last.value_loss),
            ("losses/entropy", last.entropy),
            ("losses/approx_kl", last.approx_kl),
            ("losses/clipfrac", last.clipfrac),
            ("charts/learning_rate", lr as f32),
        ]);
        Ok(())
    }

    fn train_iter(&self) -> u64 {
        self.iters
    }

    fn state_dict(&self) -> Checkpoint {
        let mut ck = Checkpoint::default();
        ck.put_trainer("model", &self.trainer);
        ck.meta.insert("train_iters".into(), self.iters.to_string());
        ck
    }

    fn load_state_dict(&mut self, ck: &Checkpoint) -> Result<(), TrainError> {
        ck.get_trainer("model", &mut self.trainer)?;
        self.iters = ck.counter("train_iters")?;
        self.acting.invalidate();
        Ok(())
    }

    fn weights(&self) -> Vec<f32> {
        self.trainer.params().to_vec()
    }

    fn load_weights(&mut self, weights: &[f32]) {
        self.acting.load(self.trainer.layout(), weights);
    }
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
    r: &Rollout,
    lr: f64,
) -> Result<MinibatchStats, TrainError> {
    let (b, d) = (mb.len(), r.obs_dim);
    let gather = |src: &[f32], width: usize| -> Vec<f32> {
        mb.iter()
            .flat_map(|&k| src[k * width..(k + 1) * width].iter().copied())
            .collect()
    };
    let obs = input_rows(r.obs.as_obs(), mb, d, ad);
    let old_logp = Tensor::<1>::from_data(TensorData::new(gather(&r.logp, 1), [b]), ad);
    let mut adv = gather(&r.adv, 1);
    if p.learn.adv_norm && b > 1 {
        let mean = adv.iter().sum::<f32>() / b as f32;
        let std = (adv.iter().map(|a| (a - mean).powi(2)).sum::<f32>() / (b - 1) as f32).sqrt();
        adv.iter_mut().for_each(|a| *a = (*a - mean) / (std + 1e-8));
    }
    let adv = Tensor::<1>::from_data(TensorData::new(adv, [b]), ad);
    let model = trainer.model();
    let obs = model.features(obs);
    // ALGO: log-probability and entropy of the taken actions under the current policy.
    let (new_logp, entropy) = match space {
        ActionSpace::Discrete(_) => {
            let ActionBuf::Discrete(taken) = &r.actions else {
                unreachable!("discrete space, discrete actions")
            };
            let acts: Vec<i64> = mb.iter().map(|&k| i64::from(taken[k])).collect();
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
            let ActionBuf::Continuous { dim, values } = &r.actions else {
                unreachable!("continuous space, continuous actions")
            };
            let a = Tensor::<2>::from_data(TensorData::new(gather(values, *dim), [b, *dim]), ad);
            let (mean, log_std) = model.actor.gaussian(obs.clone());
            let z = (a - mean) / log_std.clone().exp();
            let logp = (z.clone() * z).mul_scalar(-0.5) - log_std.clone() - HALF_LN_2PI;
            let entropy = log_std.add_scalar(0.5 + HALF_LN_2PI);
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
    let returns = Tensor::<1>::from_data(TensorData::new(gather(&r.returns, 1), [b]), ad);
    let v = model.critic.forward(obs);
    let value_loss = if p.learn.value_clip {
        let old_v = Tensor::<1>::from_data(TensorData::new(gather(&r.values, 1), [b]), ad);
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

/// Train PPO as configured; stops at `env.stop_value`, `max_env_step` or `max_train_iter`.
/// The pipeline of built-in middlewares: `evaluate? → roll out n_sample steps → GAE →
/// learn → log`.
pub fn train(
    cfg: &Config,
    p: &PpoPolicy,
    run: &mut RunContext<'_>,
) -> Result<TrainResult, TrainError> {
    // PLUMBING: seeding, environments, networks.
    let clock = TrainClock::start(run.resume.as_ref());
    let ranks = ddp::setup(cfg, run);
    let streams = resume::stream_seed(cfg, run.resume.as_ref(), run.restarts);
    let venv = envs::collector_envs(cfg, streams, ranks.rank())?;
    let (rank, world) = (ranks.rank(), ranks.world());
    let n_env = venv.num_envs();
    let mut ppo = Ppo::from_spec(cfg, p, &run.spec, &run.device, ranks.clone())?;
    let env_step = resume::restore(&mut ppo, run.resume.as_ref())?;
    if let Some(pg) = ranks.group() {
        ppo.distribute(pg.clone(), ddp::options(cfg))?;
    }
    let ppo = RefCell::new(ppo);
    let rng = RefCell::new(resume::rank_rng(streams, run.resume.as_ref(), rank));
    let out = Outputs::new(&mut *run.reporter);
    let iters = ppo.borrow().iters;
    let mut task = context::task(cfg, Task::new(), env_step, iters);

    // ALGO: evaluate deterministically every eval_freq train iterations (and before training).
    let evaluator = envs::evaluator(cfg, world, ranks.rank(), ranks.world())?;
    task.use_mw(InteractionEvaluator::new(
        evaluator,
        p.eval.evaluator.eval_freq,
        cfg.env.stop_value,
        ranks.clone(),
        &ppo,
    ));
    task.use_mw(CkptSaver::new(&out, &ppo, ranks.clone(), &rng, clock));
    task.use_mw(TerminationChecker::new(
        cfg.max_env_step,
        cfg.max_train_iter,
        ranks.clone(),
    ));
    // ALGO: roll out n_sample / env_num steps in every env with the stochastic policy.
    let steps = (ddp::split(cfg, &ranks, p.collect.n_sample) / n_env).max(1);
    let mut collector = RolloutCollector::new(venv, steps, &ppo, &rng, ranks.clone());
    if p.learn.reward_norm {
        collector = collector.reward_norm(p.collect.discount_factor);
    }
    task.use_mw(collector);
    // ALGO: GAE advantages and returns from the collector's values.
    task.use_mw(GaeEstimator::new(
        p.collect.discount_factor as f32,
        p.collect.gae_lambda as f32,
    ));
    // ALGO: the update (Ppo::learn): epochs of shuffled minibatches.
    task.use_mw(OnPolicyLearner::new(&ppo, &rng, ranks.clone()));
    task.use_mw(OnlineLogger::new(&out, cfg.max_env_step, env_step));
    let ctx = task.run(None)?;
    Ok(run_result(&ctx, env_step, &clock, world, run.restarts))
}
