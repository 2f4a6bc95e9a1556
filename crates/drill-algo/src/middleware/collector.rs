//! Off-policy data path: [`EpsGreedyHandler`] → [`StepCollector`] → [`NStepRewardEnhancer`]
//! → [`DataPusher`].

use std::cell::RefCell;

use drill_config::EpsConfig;
use drill_env::{Actions, DynVecEnv};
use drill_task::{Middleware, OnlineRLContext, TaskError, TaskHandle};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::{ActFn, EpisodeReturns, Epsilon, Ranks, Transitions, account_collection};
use crate::data::{NStep, ReplayBuffer};
use crate::explore::epsilon;

/// Sets this step's exploration rate from the env-step count (DI-engine's
/// `eps_greedy_handler`).
pub struct EpsGreedyHandler {
    cfg: EpsConfig,
}

impl EpsGreedyHandler {
    /// The schedule `[policy.other.eps]`.
    pub fn new(cfg: EpsConfig) -> Self {
        Self { cfg }
    }
}

impl Middleware<OnlineRLContext> for EpsGreedyHandler {
    fn name(&self) -> String {
        "eps_greedy".into()
    }

    fn forward(&mut self, ctx: &mut OnlineRLContext, _: &TaskHandle) -> Result<(), TaskError> {
        ctx.ext.insert(Epsilon(epsilon(&self.cfg, ctx.env_step)));
        Ok(())
    }
}

/// How much a collector gathers per step.
#[derive(Debug, Clone, Copy)]
enum Until {
    Samples(usize),
    Episodes(usize),
}

/// Steps the vectorised environments with the acting policy (plus [`Epsilon`]-random actions
/// when set) and hands the one-step [`Transitions`] and finished [`EpisodeReturns`] to the
/// rest of the pipeline. Adds every rank's env steps to `ctx.env_step`.
pub struct StepCollector<'a> {
    venv: Box<dyn DynVecEnv>,
    until: Until,
    n_actions: u32,
    policy: ActFn<'a>,
    rng: &'a RefCell<ChaCha8Rng>,
    ranks: Ranks,
    prev_obs: Vec<f32>,
    actions: Vec<u32>,
}

impl<'a> StepCollector<'a> {
    /// Collect `n_sample` transitions per step (rounded up to whole vector steps) from `venv`
    /// (already reset), acting with `policy` (greedy actions for a batch of observations).
    pub fn new(
        venv: Box<dyn DynVecEnv>,
        n_sample: usize,
        policy: impl FnMut(&[f32], &mut [u32]) + 'a,
        rng: &'a RefCell<ChaCha8Rng>,
        ranks: Ranks,
    ) -> Self {
        let (n, d) = (venv.num_envs(), venv.spec().obs_dim);
        Self {
            n_actions: venv.spec().action_space.dim() as u32,
            venv,
            until: Until::Samples(n_sample),
            policy: Box::new(policy),
            rng,
            ranks,
            prev_obs: vec![0.0; n * d],
            actions: vec![0; n],
        }
    }

    /// DI-engine's episode collector: collect until `n_episode` episodes finished instead.
    pub fn episodes(mut self, n_episode: usize) -> Self {
        self.until = Until::Episodes(n_episode.max(1));
        self
    }
}

impl Middleware<OnlineRLContext> for StepCollector<'_> {
    fn name(&self) -> String {
        "collector".into()
    }

    fn forward(&mut self, ctx: &mut OnlineRLContext, task: &TaskHandle) -> Result<(), TaskError> {
        if task.finished() {
            return Ok(());
        }
        let n = self.venv.num_envs();
        let d = self.venv.spec().obs_dim;
        let eps = ctx.ext.get::<Epsilon>().map_or(0.0, |e| e.0);
        let world = self.ranks.world() as u64;
        let mut t = Transitions {
            obs_dim: d,
            ..Transitions::default()
        };
        let mut returns = EpisodeReturns::default();
        let mut local = 0u64;
        let mut rng = self.rng.borrow_mut();
        loop {
            let done = match self.until {
                Until::Samples(s) => local as usize >= s,
                Until::Episodes(e) => returns.0.len() >= e,
            };
            if done {
                break;
            }
            self.prev_obs.copy_from_slice(self.venv.obs());
            (self.policy)(&self.prev_obs, &mut self.actions);
            if eps > 0.0 {
                for a in self.actions.iter_mut() {
                    if rng.random::<f64>() < eps {
                        *a = rng.random_range(0..self.n_actions);
                    }
                }
            }
            self.venv.step(Actions::Discrete(&self.actions));
            let v = &self.venv;
            t.env.extend(0..n as u32);
            t.obs.extend_from_slice(&self.prev_obs);
            t.actions.extend_from_slice(&self.actions);
            t.rewards.extend_from_slice(v.rewards());
            t.next_obs.extend_from_slice(&v.final_obs()[..n * d]);
            t.terminated.extend_from_slice(v.terminated());
            t.truncated.extend_from_slice(v.truncated());
            local += n as u64;
            for i in 0..n {
                if v.terminated()[i] || v.truncated()[i] {
                    // The global count as of this vector step (exact alone; assumes the
                    // other ranks progress alike under DDP).
                    returns
                        .0
                        .push((v.final_returns()[i], ctx.env_step + local * world));
                }
            }
        }
        drop(rng);
        ctx.ext.insert(t);
        account_collection(ctx, &self.ranks, local, returns)
    }
}

/// Turns this step's one-step [`Transitions`] into n-step ones (per env copy, episodes
/// flushed at their end), DI-engine's `nstep_reward_enhancer`.
pub struct NStepRewardEnhancer {
    nstep: NStep,
}

impl NStepRewardEnhancer {
    /// `n` steps, discount `gamma`, for `num_envs` env copies of `obs_dim` observations.
    pub fn new(n: usize, gamma: f32, num_envs: usize, obs_dim: usize) -> Self {
        Self {
            nstep: NStep::new(n, gamma, num_envs, obs_dim),
        }
    }
}

impl Middleware<OnlineRLContext> for NStepRewardEnhancer {
    fn name(&self) -> String {
        "nstep_reward_enhancer".into()
    }

    fn forward(&mut self, ctx: &mut OnlineRLContext, _: &TaskHandle) -> Result<(), TaskError> {
        let Some(raw) = ctx.ext.get::<Transitions>() else {
            return Ok(());
        };
        if !raw.discounts.is_empty() {
            return Err(TaskError::msg(
                "transitions are already n-step: use one NStepRewardEnhancer",
            ));
        }
        let d = raw.obs_dim;
        let mut out = Transitions {
            obs_dim: d,
            ..Transitions::default()
        };
        for k in 0..raw.len() {
            let i = raw.env[k] as usize;
            self.nstep.push(
                i,
                &raw.obs[k * d..(k + 1) * d],
                raw.actions[k],
                raw.rewards[k],
                &raw.next_obs[k * d..(k + 1) * d],
                raw.terminated[k],
                raw.truncated[k],
                |t| {
                    out.obs.extend_from_slice(t.obs);
                    out.actions.push(t.action);
                    out.rewards.push(t.reward);
                    out.next_obs.extend_from_slice(t.next_obs);
                    out.terminated.push(t.done);
                    out.discounts.push(t.discount);
                },
            );
        }
        ctx.ext.insert(out);
        Ok(())
    }
}

/// Pushes this step's n-step [`Transitions`] into the replay buffer (DI-engine's
/// `data_pusher`).
pub struct DataPusher<'a> {
    buffer: &'a RefCell<ReplayBuffer>,
}

impl<'a> DataPusher<'a> {
    /// Into `buffer`.
    pub fn new(buffer: &'a RefCell<ReplayBuffer>) -> Self {
        Self { buffer }
    }
}

impl Middleware<OnlineRLContext> for DataPusher<'_> {
    fn name(&self) -> String {
        "data_pusher".into()
    }

    fn forward(&mut self, ctx: &mut OnlineRLContext, _: &TaskHandle) -> Result<(), TaskError> {
        let Some(t) = ctx.ext.get::<Transitions>() else {
            return Ok(());
        };
        if t.discounts.len() != t.len() {
            return Err(TaskError::msg(
                "the replay buffer stores n-step transitions: put NStepRewardEnhancer before DataPusher",
            ));
        }
        let d = t.obs_dim;
        let mut b = self.buffer.borrow_mut();
        for k in 0..t.len() {
            b.push(&crate::data::Transition {
                obs: &t.obs[k * d..(k + 1) * d],
                action: t.actions[k],
                reward: t.rewards[k],
                next_obs: &t.next_obs[k * d..(k + 1) * d],
                done: t.terminated[k],
                discount: t.discounts[k],
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drill_task::Task;
    use rand::SeedableRng;

    #[test]
    fn collect_nstep_push_and_the_missing_enhancer_is_named() {
        let venv = drill_env::make_vec("CartPole-v1", 4, 0, 1).unwrap();
        let mut venv = venv;
        venv.reset(None);
        let rng = RefCell::new(ChaCha8Rng::seed_from_u64(0));
        let buffer = RefCell::new(ReplayBuffer::new(1000, 4));
        let mut task = Task::<OnlineRLContext>::new();
        task.use_mw(EpsGreedyHandler::new(EpsConfig::default()));
        let policy = |_: &[f32], a: &mut [u32]| a.fill(1);
        task.use_mw(StepCollector::new(venv, 10, policy, &rng, Ranks::alone()));
        task.use_fn("check_one_step", |ctx, _| {
            let t = ctx.ext.get::<Transitions>().unwrap();
            assert_eq!(t.len(), 12, "10 samples round up to 3 vector steps of 4");
            assert!(t.discounts.is_empty() && t.env[..4] == [0, 1, 2, 3]);
            assert!(ctx.ext.get::<Epsilon>().unwrap().0 > 0.9);
            Ok(())
        });
        task.use_mw(NStepRewardEnhancer::new(1, 0.9, 4, 4));
        task.use_mw(DataPusher::new(&buffer));
        let ctx = task.run(Some(2)).unwrap();
        assert_eq!(ctx.env_step, 24);
        assert_eq!(
            buffer.borrow().len(),
            24,
            "one-step: every transition completes"
        );

        let venv = drill_env::make_vec("CartPole-v1", 2, 0, 1).unwrap();
        let mut task = Task::<OnlineRLContext>::new();
        let policy = |_: &[f32], a: &mut [u32]| a.fill(0);
        task.use_mw(StepCollector::new(venv, 2, policy, &rng, Ranks::alone()));
        task.use_mw(DataPusher::new(&buffer));
        let e = task.run(Some(1)).unwrap_err().to_string();
        assert!(
            e.contains("data_pusher") && e.contains("NStepRewardEnhancer"),
            "{e}"
        );
    }

    #[test]
    fn the_episode_collector_stops_after_n_episodes() {
        let mut venv = drill_env::make_vec("CartPole-v1", 2, 0, 1).unwrap();
        venv.reset(None);
        let rng = RefCell::new(ChaCha8Rng::seed_from_u64(0));
        let mut task = Task::<OnlineRLContext>::new();
        let policy = |_: &[f32], a: &mut [u32]| a.fill(0);
        task.use_mw(StepCollector::new(venv, 0, policy, &rng, Ranks::alone()).episodes(3));
        let ctx = task.run(Some(1)).unwrap();
        assert!(ctx.env_episode >= 3, "{}", ctx.env_episode);
        assert!(ctx.env_step > 0);
    }
}
