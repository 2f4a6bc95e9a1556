//! On-policy data path: [`RolloutCollector`] → [`GaeEstimator`] → [`OnPolicyLearner`].

use std::cell::RefCell;

use drill_env::{ActionBuf, DynVecEnv, ObsBuf};
use drill_task::{Middleware, OnlineRLContext, TaskError, TaskHandle};
use rand_chacha::ChaCha8Rng;

use super::learner::log_scalars;
use super::{EpisodeReturns, account_collection, task_err};
use crate::TrainError;
use crate::data::{Rollout, gae};
use crate::ddp::Ranks;
use crate::policy::{Acted, Explore, LearnOutput, Policy};

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

/// Rolls out `steps` steps in every env copy with the policy's collect side into a
/// [`Rollout`]; adds every rank's env steps to `ctx.env_step`.
pub struct RolloutCollector<'a, P> {
    venv: Box<dyn DynVecEnv>,
    steps: usize,
    policy: &'a RefCell<P>,
    rng: &'a RefCell<ChaCha8Rng>,
    ranks: Ranks,
    scaler: Option<RewardScaler>,
    acted: Acted,
}

impl<'a, P: Policy<Data = Rollout>> RolloutCollector<'a, P> {
    /// `steps` vector steps per task step from `venv` (already reset).
    pub fn new(
        venv: Box<dyn DynVecEnv>,
        steps: usize,
        policy: &'a RefCell<P>,
        rng: &'a RefCell<ChaCha8Rng>,
        ranks: Ranks,
    ) -> Self {
        Self {
            venv,
            steps: steps.max(1),
            policy,
            rng,
            ranks,
            scaler: None,
            acted: Acted::default(),
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

impl<P: Policy<Data = Rollout>> Middleware<OnlineRLContext> for RolloutCollector<'_, P> {
    fn name(&self) -> String {
        "rollout_collector".into()
    }

    fn forward(&mut self, ctx: &mut OnlineRLContext, task: &TaskHandle) -> Result<(), TaskError> {
        if task.finished() {
            return Ok(());
        }
        let (n, spec) = (self.venv.num_envs(), self.venv.spec());
        let d = spec.obs_dim();
        let rows = self.steps * n;
        let mut r = Rollout {
            obs_dim: d,
            num_envs: n,
            obs: ObsBuf::zeros(spec.obs.dtype, rows * d),
            next_obs: ObsBuf::zeros(spec.obs.dtype, rows * d),
            actions: ActionBuf::for_space(&spec.action_space, 0),
            logp: vec![0.0; rows],
            rewards: vec![0.0; rows],
            terminated: vec![false; rows],
            ended: vec![false; rows],
            ..Rollout::default()
        };
        let explore = Explore {
            epsilon: 0.0,
            env_step: ctx.env_step,
        };
        let mut returns = EpisodeReturns::default();
        let world = self.ranks.world() as u64;
        let mut rng = self.rng.borrow_mut();
        let mut policy = self.policy.borrow_mut();
        for t in 0..self.steps {
            let rows = t * n..(t + 1) * n;
            let obs = self.venv.obs();
            r.obs.write(rows.start * d, obs);
            policy.collect(obs, &explore, &mut rng, &mut self.acted);
            r.actions.extend(&self.acted.actions);
            r.logp[rows.clone()].copy_from_slice(&self.acted.logp);
            self.venv
                .step(self.acted.actions.as_actions())
                .map_err(task_err)?;
            let v = &self.venv;
            r.next_obs.write(rows.start * d, v.final_obs());
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
        drop((rng, policy));
        ctx.ext.insert(r);
        account_collection(ctx, &self.ranks, rows as u64, returns)
    }
}

/// Values of every state and next state under the behaviour critic (the policy's
/// [`Policy::values`]), then GAE advantages and returns (DI-engine's `gae_estimator`).
pub struct GaeEstimator<'a, P> {
    policy: &'a RefCell<P>,
    gamma: f32,
    lambda: f32,
    next_values: Vec<f32>,
}

impl<'a, P: Policy> GaeEstimator<'a, P> {
    /// Discount `gamma`, GAE `lambda`.
    pub fn new(gamma: f32, lambda: f32, policy: &'a RefCell<P>) -> Self {
        Self {
            policy,
            gamma,
            lambda,
            next_values: Vec::new(),
        }
    }
}

impl<P: Policy> Middleware<OnlineRLContext> for GaeEstimator<'_, P> {
    fn name(&self) -> String {
        "gae_estimator".into()
    }

    fn forward(&mut self, ctx: &mut OnlineRLContext, _: &TaskHandle) -> Result<(), TaskError> {
        let Some(r) = ctx.ext.get_mut::<Rollout>() else {
            return Ok(());
        };
        let mut policy = self.policy.borrow_mut();
        policy
            .values(r.obs.as_obs(), &mut r.values)
            .map_err(task_err)?;
        policy
            .values(r.next_obs.as_obs(), &mut self.next_values)
            .map_err(task_err)?;
        r.adv = vec![0.0; r.len()];
        gae(
            &r.rewards,
            &r.values,
            &self.next_values,
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

/// Hands the step's [`Rollout`] (with advantages) to the policy's learn side — epochs,
/// minibatches and their schedule are the algorithm's — and logs the scalars it reports,
/// averaged over ranks.
pub struct OnPolicyLearner<'a, P> {
    policy: &'a RefCell<P>,
    rng: &'a RefCell<ChaCha8Rng>,
    ranks: Ranks,
    out: LearnOutput,
    logged: Vec<f32>,
}

impl<'a, P: Policy<Data = Rollout>> OnPolicyLearner<'a, P> {
    /// A learner for `policy`.
    pub fn new(policy: &'a RefCell<P>, rng: &'a RefCell<ChaCha8Rng>, ranks: Ranks) -> Self {
        Self {
            policy,
            rng,
            ranks,
            out: LearnOutput::default(),
            logged: Vec::new(),
        }
    }
}

impl<P: Policy<Data = Rollout>> Middleware<OnlineRLContext> for OnPolicyLearner<'_, P> {
    fn name(&self) -> String {
        "learner".into()
    }

    fn forward(&mut self, ctx: &mut OnlineRLContext, task: &TaskHandle) -> Result<(), TaskError> {
        if task.finished() {
            return Ok(());
        }
        let Some(r) = ctx.ext.get::<Rollout>() else {
            return Ok(());
        };
        if r.adv.len() != r.len() {
            return Err(TaskError::msg(
                "the rollout has no advantages: put GaeEstimator before OnPolicyLearner",
            ));
        }
        let mut policy = self.policy.borrow_mut();
        self.out.clear();
        policy
            .learn(r, ctx.env_step, &mut self.rng.borrow_mut(), &mut self.out)
            .map_err(task_err)?;
        if !self.out.loss.is_finite() {
            return Err(task_err(TrainError::NonFinite {
                iter: policy.train_iter(),
                value: f64::from(self.out.loss),
            }));
        }
        ctx.train_iter = policy.train_iter();
        log_scalars(ctx, &self.ranks, &self.out, &mut self.logged)
    }
}
