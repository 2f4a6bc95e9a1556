//! On-policy data path: [`RolloutCollector`] → [`GaeEstimator`] → [`OnPolicyLearner`].

use std::cell::RefCell;

use drill_env::{ActionSpace, DynVecEnv};
use drill_task::{Middleware, OnlineRLContext, TaskError, TaskHandle};
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

use super::{EpisodeReturns, Ranks, account_collection, task_err};
use crate::TrainError;
use crate::data::gae;
use crate::eval::ActionBuf;

/// One rollout, time-major (`steps × num_envs` rows), filled by [`RolloutCollector`] and
/// completed by [`GaeEstimator`] (ctx extension, this step).
#[derive(Debug, Clone, Default)]
pub struct RolloutBuffer {
    /// Observation size.
    pub obs_dim: usize,
    /// Action size (1 for discrete).
    pub act_dim: usize,
    /// Env copies (columns).
    pub num_envs: usize,
    /// `[rows, obs_dim]`.
    pub obs: Vec<f32>,
    /// `[rows, obs_dim]`: the next observation (the episode's last when it ended).
    pub next_obs: Vec<f32>,
    /// `[rows, act_dim]`, the sampled actions (discrete: the index as f32).
    pub actions: Vec<f32>,
    /// Log-probabilities under the behaviour policy.
    pub logp: Vec<f32>,
    /// Rewards (scaled when reward normalisation is on).
    pub rewards: Vec<f32>,
    /// The episode terminated (no bootstrap).
    pub terminated: Vec<bool>,
    /// The episode ended (terminated or truncated).
    pub ended: Vec<bool>,
    /// Values under the behaviour critic ([`GaeEstimator`]).
    pub values: Vec<f32>,
    /// GAE advantages ([`GaeEstimator`]).
    pub adv: Vec<f32>,
    /// Value targets `adv + values` ([`GaeEstimator`]).
    pub returns: Vec<f32>,
}

impl RolloutBuffer {
    /// Rows held.
    pub fn len(&self) -> usize {
        self.logp.len()
    }

    /// None held.
    pub fn is_empty(&self) -> bool {
        self.logp.is_empty()
    }
}

/// Samples actions for a batch of observations: writes the env actions, the stored actions
/// (`act_dim` each) and their log-probabilities.
pub type SampleFn<'a> =
    Box<dyn FnMut(&[f32], &mut ChaCha8Rng, &mut ActionBuf, &mut [f32], &mut [f32]) + 'a>;

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

/// Rolls out `steps` steps in every env copy with the stochastic policy into a
/// [`RolloutBuffer`]; adds every rank's env steps to `ctx.env_step`.
pub struct RolloutCollector<'a> {
    venv: Box<dyn DynVecEnv>,
    steps: usize,
    sample: SampleFn<'a>,
    rng: &'a RefCell<ChaCha8Rng>,
    ranks: Ranks,
    scaler: Option<RewardScaler>,
    actions: ActionBuf,
}

impl<'a> RolloutCollector<'a> {
    /// `steps` vector steps per task step from `venv` (already reset).
    pub fn new(
        venv: Box<dyn DynVecEnv>,
        steps: usize,
        sample: impl FnMut(&[f32], &mut ChaCha8Rng, &mut ActionBuf, &mut [f32], &mut [f32]) + 'a,
        rng: &'a RefCell<ChaCha8Rng>,
        ranks: Ranks,
    ) -> Self {
        let actions = ActionBuf::for_space(&venv.spec().action_space, venv.num_envs());
        Self {
            venv,
            steps: steps.max(1),
            sample: Box::new(sample),
            rng,
            ranks,
            scaler: None,
            actions,
        }
    }

    /// Scale rewards by the running standard deviation of the `gamma`-discounted return.
    pub fn reward_norm(mut self, gamma: f64) -> Self {
        self.scaler = Some(RewardScaler {
            ret: vec![0.0; self.venv.num_envs()],
            count: 0.0,
            mean: 0.0,
            m2: 0.0,
            gamma,
        });
        self
    }
}

impl Middleware<OnlineRLContext> for RolloutCollector<'_> {
    fn name(&self) -> String {
        "rollout_collector".into()
    }

    fn forward(&mut self, ctx: &mut OnlineRLContext, task: &TaskHandle) -> Result<(), TaskError> {
        if task.finished() {
            return Ok(());
        }
        let (n, d) = (self.venv.num_envs(), self.venv.spec().obs_dim);
        let act_dim = match &self.venv.spec().action_space {
            ActionSpace::Discrete(_) => 1,
            space => space.dim(),
        };
        let rows = self.steps * n;
        let mut r = RolloutBuffer {
            obs_dim: d,
            act_dim,
            num_envs: n,
            obs: vec![0.0; rows * d],
            next_obs: vec![0.0; rows * d],
            actions: vec![0.0; rows * act_dim],
            logp: vec![0.0; rows],
            rewards: vec![0.0; rows],
            terminated: vec![false; rows],
            ended: vec![false; rows],
            ..RolloutBuffer::default()
        };
        let mut returns = EpisodeReturns::default();
        let world = self.ranks.world() as u64;
        let mut rng = self.rng.borrow_mut();
        for t in 0..self.steps {
            let rows = t * n..(t + 1) * n;
            let obs = &mut r.obs[rows.start * d..rows.end * d];
            obs.copy_from_slice(self.venv.obs());
            (self.sample)(
                obs,
                &mut rng,
                &mut self.actions,
                &mut r.actions[rows.start * act_dim..rows.end * act_dim],
                &mut r.logp[rows.clone()],
            );
            self.venv.step(self.actions.as_actions());
            let v = &self.venv;
            r.next_obs[rows.start * d..rows.end * d].copy_from_slice(&v.final_obs()[..n * d]);
            for i in 0..n {
                let (term, done) = (v.terminated()[i], v.terminated()[i] || v.truncated()[i]);
                let rew = v.rewards()[i];
                r.rewards[rows.start + i] = match &mut self.scaler {
                    Some(s) => s.scale(i, rew, done),
                    None => rew,
                };
                r.terminated[rows.start + i] = term;
                r.ended[rows.start + i] = done;
                if done {
                    let at = ctx.env_step + (t * n) as u64 * world;
                    returns.0.push((v.final_returns()[i], at));
                }
            }
        }
        drop(rng);
        ctx.ext.insert(r);
        account_collection(ctx, &self.ranks, rows as u64, returns)
    }
}

/// The critic's values for a batch of observations.
pub type ValuesFn<'a> = Box<dyn FnMut(&[f32]) -> Vec<f32> + 'a>;

/// Values of every state and next state under the behaviour critic, then GAE advantages and
/// returns (DI-engine's `gae_estimator`).
pub struct GaeEstimator<'a> {
    values: ValuesFn<'a>,
    gamma: f32,
    lambda: f32,
}

impl<'a> GaeEstimator<'a> {
    /// `values` maps a batch of observations to the critic's values.
    pub fn new(gamma: f32, lambda: f32, values: impl FnMut(&[f32]) -> Vec<f32> + 'a) -> Self {
        Self {
            values: Box::new(values),
            gamma,
            lambda,
        }
    }
}

impl Middleware<OnlineRLContext> for GaeEstimator<'_> {
    fn name(&self) -> String {
        "gae_estimator".into()
    }

    fn forward(&mut self, ctx: &mut OnlineRLContext, _: &TaskHandle) -> Result<(), TaskError> {
        let Some(r) = ctx.ext.get_mut::<RolloutBuffer>() else {
            return Ok(());
        };
        r.values = (self.values)(&r.obs);
        let next_values = (self.values)(&r.next_obs);
        r.adv = vec![0.0; r.len()];
        gae(
            &r.rewards,
            &r.values,
            &next_values,
            &r.terminated,
            &r.ended,
            r.num_envs,
            self.gamma,
            self.lambda,
            &mut r.adv,
        );
        r.returns = r.adv.iter().zip(&r.values).map(|(a, v)| a + v).collect();
        Ok(())
    }
}

/// What an on-policy learner trains (PPO: the actor-critic and its acting copy).
pub trait OnPolicy {
    /// Minibatch steps done so far.
    fn train_iter(&self) -> u64;
    /// One gradient step on the rows `mb` of `r` at learning rate `lr`; the scalars to log
    /// (`losses/...`), the first being the total loss.
    fn minibatch(
        &mut self,
        mb: &[usize],
        r: &RolloutBuffer,
        lr: f64,
    ) -> Result<Vec<(&'static str, f32)>, TrainError>;
    /// The approximate KL of the last minibatch (for early stopping).
    fn approx_kl(&self) -> f32;
    /// After the epochs: refresh what the collector and evaluator act with.
    fn publish(&mut self);
}

/// `epoch_per_collect` passes of shuffled minibatches over the rollout, optionally stopping
/// early when the (rank-averaged) approximate KL exceeds `target_kl`; learning rate annealed
/// linearly to 0 at `anneal_to` env steps when set.
pub struct OnPolicyLearner<'a, P: OnPolicy> {
    policy: &'a RefCell<P>,
    rng: &'a RefCell<ChaCha8Rng>,
    ranks: Ranks,
    /// Minibatch size.
    pub batch_size: usize,
    /// Passes over the rollout.
    pub epoch_per_collect: usize,
    /// Learning rate.
    pub learning_rate: f64,
    /// Anneal the learning rate to 0 at this many env steps.
    pub anneal_to: Option<u64>,
    /// Stop the epochs when the approximate KL exceeds this (0: never).
    pub target_kl: f64,
    order: Vec<usize>,
}

impl<'a, P: OnPolicy> OnPolicyLearner<'a, P> {
    /// A learner for `policy`; set the public fields for the schedule.
    pub fn new(policy: &'a RefCell<P>, rng: &'a RefCell<ChaCha8Rng>, ranks: Ranks) -> Self {
        Self {
            policy,
            rng,
            ranks,
            batch_size: 64,
            epoch_per_collect: 1,
            learning_rate: 3e-4,
            anneal_to: None,
            target_kl: 0.0,
            order: Vec::new(),
        }
    }
}

impl<P: OnPolicy> Middleware<OnlineRLContext> for OnPolicyLearner<'_, P> {
    fn name(&self) -> String {
        "learner".into()
    }

    fn forward(&mut self, ctx: &mut OnlineRLContext, task: &TaskHandle) -> Result<(), TaskError> {
        if task.finished() {
            return Ok(());
        }
        let Some(r) = ctx.ext.get::<RolloutBuffer>() else {
            return Ok(());
        };
        if r.adv.len() != r.len() {
            return Err(TaskError::msg(
                "the rollout has no advantages: put GaeEstimator before OnPolicyLearner",
            ));
        }
        let lr = match self.anneal_to {
            Some(max) => self.learning_rate * (1.0 - ctx.env_step as f64 / max as f64).max(0.0),
            None => self.learning_rate,
        };
        self.order.clear();
        self.order.extend(0..r.len());
        let mut policy = self.policy.borrow_mut();
        let mut stats = Vec::new();
        'epochs: for _ in 0..self.epoch_per_collect {
            self.order.shuffle(&mut *self.rng.borrow_mut());
            for mb in self.order.chunks(self.batch_size) {
                stats = policy.minibatch(mb, r, lr).map_err(task_err)?;
                if let Some(&(_, loss)) = stats.first()
                    && !loss.is_finite()
                {
                    return Err(task_err(TrainError::NonFinite {
                        iter: policy.train_iter(),
                        value: f64::from(loss),
                    }));
                }
                // Early stop on KL: every rank must agree, so the averaged KL decides.
                if self.target_kl > 0.0 {
                    let mut kl = [policy.approx_kl()];
                    self.ranks.mean(&mut kl).map_err(task_err)?;
                    if f64::from(kl[0]) > self.target_kl {
                        break 'epochs;
                    }
                }
            }
        }
        policy.publish();
        ctx.train_iter = policy.train_iter();
        let mut values: Vec<f32> = stats.iter().map(|&(_, v)| v).collect();
        self.ranks.mean(&mut values).map_err(task_err)?;
        for ((tag, _), v) in stats.iter().zip(values) {
            ctx.train_output.push(((*tag).into(), f64::from(v)));
        }
        ctx.train_output.push(("charts/learning_rate".into(), lr));
        Ok(())
    }
}
