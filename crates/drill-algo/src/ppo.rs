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
    Actor, ActorCritic, ActorHead, ConvEncoder, Critic, HALF_LN_2PI, Lstm, ObsShape, check_encoder,
    input, input_rows,
};
use crate::optim::{ActingCopy, Trainer};
use crate::policy::{Acted, Explore, Hidden, LearnOutput, Policy};
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
    let features = trunk.as_ref().map_or(spec.obs_dim(), ConvEncoder::features);
    // An LSTM core (CleanRL's ppo_atari_lstm) reads the features; the heads read its output.
    let lstm = p
        .model
        .lstm_hidden_size
        .map(|h| Lstm::new(features, h, device));
    let input_dim = lstm.as_ref().map_or(features, Lstm::hidden);
    Ok(ActorCritic {
        trunk,
        lstm,
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

/// What the heads read for a batch of observations: [`ActorCritic::step`] from and to
/// `hidden` (one row per observation).
fn step(
    net: &ActorCritic,
    obs: Obs<'_>,
    obs_dim: usize,
    device: &Device,
    hidden: &mut Hidden,
) -> Tensor<2> {
    let n = obs.len() / obs_dim;
    let state = hidden.rows_mut(n, net.state_width());
    net.step(input(obs, obs_dim, device), state)
}

/// Deterministic actions for evaluation from the heads' input `x` ([`step`]):
/// argmax logits, or the Gaussian mean clipped to bounds.
pub(crate) fn act_deterministic(
    agent: &ActorCritic,
    space: &ActionSpace,
    x: Tensor<2>,
    out: &mut ActionBuf,
) {
    let n = x.dims()[0];
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

/// Sample actions for a batch from the stochastic policy, given the heads' input `x`
/// ([`step`]): the actions (continuous ones unclipped: the env clips), their
/// log-probabilities and the critic's values (from the same features: one forward pass) into
/// `out`.
pub(crate) fn sample_actions(
    agent: &ActorCritic,
    space: &ActionSpace,
    x: Tensor<2>,
    rng: &mut impl Rng,
    out: &mut Acted,
) {
    let n = x.dims()[0];
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

/// The log-probabilities of the rollout's actions (as [`sample_actions`] drew them) and the
/// critic's values of its observations, from one forward pass (an LSTM's over every env
/// copy's sequence from the rollout's initial state), into `logp` and `values`.
pub(crate) fn action_logp(
    agent: &ActorCritic,
    r: &Rollout,
    device: &Device,
    logp: &mut Vec<f32>,
    values: &mut Vec<f32>,
) {
    let (n, obs_dim, actions) = (r.len(), r.obs_dim, &r.actions);
    let obs = input(r.obs.as_obs(), obs_dim, device);
    let x = if agent.lstm.is_some() {
        let steps = n / r.num_envs.max(1);
        let state0 = initial_state(agent, r, &(0..r.num_envs).collect::<Vec<_>>(), device);
        agent.sequence(obs, state0, &r.ended, steps)
    } else {
        agent.features(obs)
    };
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

/// The recurrent state before the rollout's first row for env copies `cols` (`[cols, width]`;
/// zeros where the rollout holds none).
fn initial_state(agent: &ActorCritic, r: &Rollout, cols: &[usize], device: &Device) -> Tensor<2> {
    let w = agent.state_width();
    let h = &r.hidden0;
    let data: Vec<f32> = if h.is_empty() {
        vec![0.0; cols.len() * w]
    } else {
        cols.iter()
            .flat_map(|&j| h.row(j).iter().copied())
            .collect()
    };
    Tensor::from_data(TensorData::new(data, [cols.len(), w]), device)
}

/// A recurrent minibatch: whole env copies' sequences (`cols`, each `steps` rows) replayed
/// from the rollout's initial states; its rows are time-major (`t · num_envs + col`).
#[derive(Debug, Clone, Copy)]
pub struct Sequences<'a> {
    /// Rows per sequence.
    pub steps: usize,
    /// The env copies (columns of the rollout).
    pub cols: &'a [usize],
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
    rows: Vec<usize>,
}

impl Ppo {
    /// The actor's outputs (logits, or the Gaussian's mean and log-std) and the critic's
    /// values for `obs` (an episode's first step: the recurrent state from zeros),
    /// row-major; for exports' checks.
    pub fn outputs(&self, obs: Obs<'_>) -> (Vec<f32>, Option<Vec<f32>>, Vec<f32>) {
        let net = self.trainer.inference();
        let x = step(
            &net,
            obs,
            self.obs_dim,
            &self.device,
            &mut Hidden::default(),
        );
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
            rows: Vec::new(),
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

    fn eval(&mut self, obs: Obs<'_>, hidden: &mut Hidden, out: &mut ActionBuf) {
        let net = self.acting.get(&self.trainer);
        let x = step(net, obs, self.obs_dim, &self.device, hidden);
        act_deterministic(net, &self.space, x, out);
    }

    fn collect(
        &mut self,
        obs: Obs<'_>,
        hidden: &mut Hidden,
        _: &Explore,
        rng: &mut ChaCha8Rng,
        out: &mut Acted,
    ) {
        let net = self.acting.get(&self.trainer);
        let x = step(net, obs, self.obs_dim, &self.device, hidden);
        sample_actions(net, &self.space, x, rng, out);
    }

    fn values(
        &mut self,
        obs: Obs<'_>,
        hidden: &Hidden,
        out: &mut Vec<f32>,
    ) -> Result<(), TrainError> {
        let net = self.acting.get(&self.trainer);
        let mut hidden = hidden.clone();
        let x = step(net, obs, self.obs_dim, &self.device, &mut hidden);
        let v = net.critic.forward(x);
        *out = v.into_data().try_into_vec::<f32>().expect("f32 values");
        Ok(())
    }

    fn evaluate_actions(
        &mut self,
        r: &Rollout,
        logp: &mut Vec<f32>,
        values: &mut Vec<f32>,
    ) -> Result<(), TrainError> {
        let net = self.acting.get(&self.trainer);
        action_logp(net, r, &self.device, logp, values);
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
        // A recurrent policy's minibatches are whole env copies' sequences (CleanRL's
        // ppo_atari_lstm: batch_size / steps copies each), a feed-forward one's single rows.
        let recurrent = self.trainer.model().lstm.is_some();
        let (n, steps) = (r.num_envs.max(1), r.len() / r.num_envs.max(1));
        let (units, per_mb) = if recurrent {
            (n, (self.batch_size / steps.max(1)).max(1))
        } else {
            (r.len(), self.batch_size)
        };
        self.order.clear();
        self.order.extend(0..units);
        let mut last = MinibatchStats::default();
        for _ in 0..self.p.learn.epoch_per_collect {
            self.order.shuffle(rng);
            for mb in self.order.chunks(per_mb) {
                let (rows, seqs) = if recurrent {
                    self.rows.clear();
                    self.rows
                        .extend((0..steps).flat_map(|t| mb.iter().map(move |&j| t * n + j)));
                    (&self.rows[..], Some(Sequences { steps, cols: mb }))
                } else {
                    (mb, None)
                };
                let (p, space, ad) = (&self.p, &self.space, &self.ad);
                last = minibatch_update(&mut self.trainer, p, space, ad, rows, seqs, r, lr)?;
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

/// What the actor and the critic read for the rows `mb` of `r` (their observations `obs`):
/// the features, or for a recurrent policy the LSTM's outputs over the sequences `seqs`.
fn heads_input(
    model: &ActorCritic,
    obs: nets::Input,
    mb: &[usize],
    seqs: Option<Sequences<'_>>,
    r: &Rollout,
    ad: &Device,
) -> Result<Tensor<2>, TrainError> {
    Ok(match (seqs, model.lstm.is_some()) {
        // ALGO: a recurrent policy replays each sequence from its stored initial state, its
        // state zeroed after each episode's end as while collecting.
        (Some(s), true) => {
            let ended: Vec<bool> = mb.iter().map(|&k| r.ended[k]).collect();
            model.sequence(obs, initial_state(model, r, s.cols, ad), &ended, s.steps)
        }
        (None, true) => {
            return Err(TrainError::Unsupported {
                policy: "ppo",
                what: "minibatch of single rows (an LSTM policy trains on sequences)",
            });
        }
        (_, false) => model.features(obs),
    })
}

/// One PPO gradient step on the rows `mb` of `r`; for a recurrent policy they are the
/// sequences `seqs` (time-major), replayed from the rollout's initial states.
#[allow(clippy::too_many_arguments)]
pub fn minibatch_update(
    trainer: &mut Trainer<ActorCritic>,
    p: &PpoPolicy,
    space: &ActionSpace,
    ad: &Device,
    mb: &[usize],
    seqs: Option<Sequences<'_>>,
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
    let obs = heads_input(model, obs, mb, seqs, r, ad)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Device;
    use drill_task::{Context, OnlineRLContext};
    use rand::SeedableRng;

    /// An LSTM PPO on CartPole without velocities: 4 copies, 64 steps each per rollout.
    fn recurrent() -> (Config, PpoPolicy) {
        let text = "seed = 3\n[env]\nid = \"CartPoleNoVel-v1\"\ncollector_env_num = 4\n\
                    [policy]\ntype = \"ppo\"\n[policy.model]\nlstm_hidden_size = 16\n\
                    [policy.collect]\nn_sample = 256\n[policy.learn]\nbatch_size = 128\n";
        let cfg = Config::parse(text, "t.toml", &[]).unwrap();
        let drill_config::Policy::Ppo(p) = cfg.policy.clone() else {
            unreachable!("a PPO config")
        };
        (cfg, p)
    }

    /// The second rollout of a collector (its copies' states carried from the first, with
    /// episode ends inside), and the policy that collected it.
    fn second_rollout() -> (Config, PpoPolicy, RefCell<Ppo>, Rollout) {
        let (cfg, p) = recurrent();
        let mut ppo = Ppo::from_config(&cfg, &p, &Device::flex(), Ranks::alone()).unwrap();
        // Sharper than the init (whose logits are near 0.01 × features): the state must
        // show in the log-probabilities.
        let mut ck = ppo.state_dict();
        for (name, (_, v)) in ck.tensors.iter_mut() {
            let gain = match name {
                n if n.starts_with("model.actor.layers.2") => 100.0,
                n if n.starts_with("model.lstm.") => 2.0,
                _ => 1.0,
            };
            v.iter_mut().for_each(|x| *x *= gain);
        }
        ppo.load_state_dict(&ck).unwrap();
        let ppo = RefCell::new(ppo);
        let rng = RefCell::new(ChaCha8Rng::seed_from_u64(1));
        let r = {
            let mut task = Task::<OnlineRLContext>::new();
            let venv = envs::collector_envs(&cfg, cfg.seed, 0).unwrap();
            task.use_mw(RolloutCollector::new(venv, 64, &ppo, &rng, Ranks::alone()));
            for _ in 0..2 {
                task.ctx_mut().renew();
                task.step().unwrap();
            }
            task.ctx().ext.get::<Rollout>().unwrap().clone()
        };
        (cfg, p, ppo, r)
    }

    /// The learner's replay of a rollout (each copy's sequence from the stored initial
    /// state, zeroed after each episode's end) gives the log-probabilities and values the
    /// collector got stepping one observation at a time; a minibatch of whole sequences
    /// trained with the collecting weights starts at ratio 1 (no KL, nothing clipped).
    #[test]
    fn the_learners_sequences_replay_what_the_collector_stepped() {
        let (_, p, ppo, r) = second_rollout();
        assert_eq!(r.hidden0.rows(), 4, "the first rollout's last states");
        assert!(r.hidden0.as_slice().iter().any(|&h| h != 0.0));
        let ends = r.ended.iter().filter(|&&e| e).count();
        assert!(ends >= 4, "episodes end inside the rollout ({ends})");
        assert_eq!(r.bootstrap_hidden.rows(), r.bootstrap_rows.len());
        let (mut logp, mut values) = (Vec::new(), Vec::new());
        ppo.borrow_mut()
            .evaluate_actions(&r, &mut logp, &mut values)
            .unwrap();
        let worst = |a: &[f32], b: &[f32]| {
            a.iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max)
        };
        let (dl, dv) = (worst(&logp, &r.logp), worst(&values, &r.values));
        eprintln!("replay: log-probabilities within {dl}, values within {dv}");
        assert!(dl < 1e-4, "log-probabilities {dl}");
        assert!(dv < 1e-4, "values {dv}");
        let mut ppo = ppo.into_inner();
        let (n, steps, cols) = (4, 64, [3, 1]);
        let rows: Vec<usize> = (0..steps).flat_map(|t| cols.map(|j| t * n + j)).collect();
        let mut r = r;
        r.adv = (0..r.len()).map(|k| (k % 5) as f32 - 2.0).collect();
        r.returns = r.values.clone();
        let (space, ad) = (ppo.space.clone(), ppo.ad.clone());
        let seqs = Some(Sequences { steps, cols: &cols });
        // The training path's log-probabilities of these rows, as the update computes them.
        let model = ppo.trainer.model();
        let obs = input_rows(r.obs.as_obs(), &rows, r.obs_dim, &ad);
        let x = heads_input(model, obs, &rows, seqs, &r, &ad).unwrap();
        let lp = log_softmax(model.actor.logits(x), 1).into_data();
        let lp = lp.as_slice::<f32>().unwrap();
        let ActionBuf::Discrete(taken) = &r.actions else {
            unreachable!("CartPole's actions")
        };
        let trained: Vec<f32> = rows
            .iter()
            .enumerate()
            .map(|(i, &k)| lp[i * 2 + taken[k] as usize])
            .collect();
        let behaviour: Vec<f32> = rows.iter().map(|&k| r.logp[k]).collect();
        let dt = worst(&trained, &behaviour);
        eprintln!("minibatch sequences: log-probabilities within {dt}");
        assert!(dt < 1e-4, "a minibatch's log-probabilities {dt}");
        let s = minibatch_update(&mut ppo.trainer, &p, &space, &ad, &rows, seqs, &r, 1e-3).unwrap();
        assert!(s.approx_kl.abs() < 1e-9, "approx KL {}", s.approx_kl);
        assert_eq!(s.clipfrac, 0.0);
        let e = minibatch_update(&mut ppo.trainer, &p, &space, &ad, &rows, None, &r, 1e-3);
        assert!(e.unwrap_err().to_string().contains("sequences"));
    }

    /// Acting keeps a state per row; a checkpoint taken mid-episode and loaded elsewhere
    /// goes on from the same state to the same actions and states, and the state matters
    /// (from zeros the values differ).
    #[test]
    fn a_checkpoint_goes_on_from_the_callers_state() {
        let (cfg, p) = recurrent();
        let mut a = Ppo::from_config(&cfg, &p, &Device::flex(), Ranks::alone()).unwrap();
        let mut venv = envs::collector_envs(&cfg, 9, 0).unwrap();
        let (mut ha, mut out) = (Hidden::default(), ActionBuf::Discrete(Vec::new()));
        for _ in 0..5 {
            a.eval(venv.obs(), &mut ha, &mut out);
            venv.step(out.as_actions()).unwrap();
        }
        assert_eq!((ha.rows(), ha.width()), (4, 32));
        let mut b = Ppo::from_config(&cfg, &p, &Device::flex(), Ranks::alone()).unwrap();
        b.load_state_dict(&a.state_dict()).unwrap();
        let mut hb = ha.clone();
        let mut out_b = ActionBuf::Discrete(Vec::new());
        for _ in 0..5 {
            a.eval(venv.obs(), &mut ha, &mut out);
            b.eval(venv.obs(), &mut hb, &mut out_b);
            assert_eq!(out, out_b);
            assert_eq!(ha, hb);
            venv.step(out.as_actions()).unwrap();
        }
        let (mut carried, mut fresh) = (Vec::new(), Vec::new());
        b.values(venv.obs(), &hb, &mut carried).unwrap();
        b.values(venv.obs(), &Hidden::default(), &mut fresh)
            .unwrap();
        assert_ne!(carried, fresh);
    }
}
