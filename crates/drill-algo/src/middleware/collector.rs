//! Off-policy data path: [`EpsGreedyHandler`] → [`StepCollector`] → [`NStepRewardEnhancer`]
//! → [`DataPusher`].

use std::cell::RefCell;

use drill_config::EpsConfig;
use drill_env::{ActionBuf, ActionSpace, DynVecEnv, ObsSpace};
use drill_task::{Middleware, OnlineRLContext, TaskError, TaskHandle};
use rand_chacha::ChaCha8Rng;

use super::{EpisodeReturns, Epsilon, Transitions, account_collection, task_err};
use crate::data::{NStep, ReplayBuffer};
use crate::ddp::Ranks;
use crate::explore::epsilon;
use crate::policy::{Acted, Explore, Hidden, Policy};

/// Sets this step's exploration rate from the env-step count (DI-engine's
/// `eps_greedy_handler`); the policy's collect side applies it.
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

/// Steps the vectorised environments with the policy's collect side (told this step's
/// [`Epsilon`] when set) and hands the one-step [`Transitions`] and finished
/// `EpisodeReturns` to the rest of the pipeline. Adds every rank's env steps to
/// `ctx.env_step`.
pub struct StepCollector<'a, P> {
    venv: Box<dyn DynVecEnv>,
    until: Until,
    policy: &'a RefCell<P>,
    rng: &'a RefCell<ChaCha8Rng>,
    ranks: Ranks,
    acted: Acted,
    /// The policy's recurrent state per env copy.
    hidden: Hidden,
}

impl<'a, P: Policy> StepCollector<'a, P> {
    /// Collect `n_sample` transitions per step (rounded up to whole vector steps) from `venv`
    /// (already reset), acting with `policy`.
    pub fn new(
        venv: Box<dyn DynVecEnv>,
        n_sample: usize,
        policy: &'a RefCell<P>,
        rng: &'a RefCell<ChaCha8Rng>,
        ranks: Ranks,
    ) -> Self {
        Self {
            venv,
            until: Until::Samples(n_sample),
            policy,
            rng,
            ranks,
            acted: Acted::default(),
            hidden: Hidden::default(),
        }
    }

    /// DI-engine's episode collector: collect until `n_episode` episodes finished instead.
    pub fn episodes(mut self, n_episode: usize) -> Self {
        self.until = Until::Episodes(n_episode.max(1));
        self
    }
}

impl<P: Policy> Middleware<OnlineRLContext> for StepCollector<'_, P> {
    fn name(&self) -> String {
        "collector".into()
    }

    fn forward(&mut self, ctx: &mut OnlineRLContext, task: &TaskHandle) -> Result<(), TaskError> {
        if task.finished() {
            return Ok(());
        }
        let n = self.venv.num_envs();
        let spec = self.venv.spec();
        let actions = ActionBuf::for_space(&spec.action_space, 0);
        let mut t = Transitions::empty(spec.obs_dim(), spec.obs.dtype, &actions);
        let explore = Explore {
            epsilon: ctx.ext.get::<Epsilon>().map_or(0.0, |e| e.0),
            env_step: ctx.env_step,
        };
        let world = self.ranks.world() as u64;
        let mut returns = EpisodeReturns::default();
        let mut local = 0u64;
        let mut rng = self.rng.borrow_mut();
        let mut policy = self.policy.borrow_mut();
        loop {
            let done = match self.until {
                Until::Samples(s) => local as usize >= s,
                Until::Episodes(e) => returns.0.len() >= e,
            };
            if done {
                break;
            }
            let obs = self.venv.obs();
            policy.collect(obs, &mut self.hidden, &explore, &mut rng, &mut self.acted);
            t.obs.extend(obs);
            self.venv
                .step(self.acted.actions.as_actions())
                .map_err(task_err)?;
            let v = &self.venv;
            t.env.extend(0..n as u32);
            t.actions.extend(&self.acted.actions);
            t.rewards.extend_from_slice(v.rewards());
            t.next_obs.extend(v.final_obs());
            t.terminated.extend_from_slice(v.terminated());
            t.truncated.extend_from_slice(v.truncated());
            local += n as u64;
            for i in 0..n {
                if v.terminated()[i] || v.truncated()[i] {
                    self.hidden.reset(i);
                    // The global count as of this vector step (exact alone; assumes the
                    // other ranks progress alike under DDP).
                    returns
                        .0
                        .push((v.final_returns()[i], ctx.env_step + local * world));
                }
            }
        }
        drop((rng, policy));
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
    /// `n` steps, discount `gamma`, for `num_envs` env copies of these spaces.
    pub fn new(
        n: usize,
        gamma: f32,
        num_envs: usize,
        obs: &ObsSpace,
        actions: &ActionSpace,
    ) -> Self {
        Self {
            nstep: NStep::new(n, gamma, num_envs, obs, actions),
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
        let mut out = Transitions::empty(d, raw.obs.dtype(), &raw.actions);
        let (obs, next_obs) = (raw.obs.as_obs(), raw.next_obs.as_obs());
        for k in 0..raw.len() {
            let i = raw.env[k] as usize;
            self.nstep.push(
                i,
                obs.rows(k..k + 1, d),
                raw.actions.get(k),
                raw.rewards[k],
                next_obs.rows(k..k + 1, d),
                raw.terminated[k],
                raw.truncated[k],
                |t| {
                    out.obs.extend(t.obs);
                    out.actions.push(t.action);
                    out.rewards.push(t.reward);
                    out.next_obs.extend(t.next_obs);
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
        let (obs, next_obs) = (t.obs.as_obs(), t.next_obs.as_obs());
        let mut b = self.buffer.borrow_mut();
        for k in 0..t.len() {
            b.push(&crate::data::Transition {
                obs: obs.rows(k..k + 1, d),
                action: t.actions.get(k),
                reward: t.rewards[k],
                next_obs: next_obs.rows(k..k + 1, d),
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
    use crate::middleware::probe::Probe;
    use drill_env::{ActionSpace, ObsSpace};
    use drill_task::Task;
    use rand::SeedableRng;

    #[test]
    fn collect_nstep_push_and_the_missing_enhancer_is_named() {
        let venv = drill_env::make_vec("CartPole-v1", 4, 0, 1).unwrap();
        let mut venv = venv;
        venv.reset(None).unwrap();
        let rng = RefCell::new(ChaCha8Rng::seed_from_u64(0));
        let (obs, actions) = (ObsSpace::vector(4), ActionSpace::Discrete(2));
        let buffer = RefCell::new(ReplayBuffer::new(1000, &obs, &actions));
        let policy = RefCell::new(Probe::new(4, 1));
        let mut task = Task::<OnlineRLContext>::new();
        task.use_mw(EpsGreedyHandler::new(EpsConfig::default()));
        task.use_mw(StepCollector::new(venv, 10, &policy, &rng, Ranks::alone()));
        task.use_fn("check_one_step", |ctx, _| {
            let t = ctx.ext.get::<Transitions>().unwrap();
            assert_eq!(t.len(), 12, "10 samples round up to 3 vector steps of 4");
            assert!(t.discounts.is_empty() && t.env[..4] == [0, 1, 2, 3]);
            assert!(ctx.ext.get::<Epsilon>().unwrap().0 > 0.9);
            assert_eq!(t.actions, drill_env::ActionBuf::Discrete(vec![1; 12]));
            Ok(())
        });
        task.use_mw(NStepRewardEnhancer::new(1, 0.9, 4, &obs, &actions));
        task.use_mw(DataPusher::new(&buffer));
        let ctx = task.run(Some(2)).unwrap();
        assert_eq!(ctx.env_step, 24);
        assert_eq!(
            buffer.borrow().len(),
            24,
            "one-step: every transition completes"
        );
        let told = policy.borrow().explore.unwrap();
        assert!(told.epsilon > 0.9 && told.env_step == 12, "{told:?}");

        let venv = drill_env::make_vec("CartPole-v1", 2, 0, 1).unwrap();
        let policy = RefCell::new(Probe::new(4, 0));
        let mut task = Task::<OnlineRLContext>::new();
        task.use_mw(StepCollector::new(venv, 2, &policy, &rng, Ranks::alone()));
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
        venv.reset(None).unwrap();
        let rng = RefCell::new(ChaCha8Rng::seed_from_u64(0));
        let policy = RefCell::new(Probe::new(4, 0));
        let mut task = Task::<OnlineRLContext>::new();
        task.use_mw(StepCollector::new(venv, 0, &policy, &rng, Ranks::alone()).episodes(3));
        let ctx = task.run(Some(1)).unwrap();
        assert!(ctx.env_episode >= 3, "{}", ctx.env_episode);
        assert!(ctx.env_step > 0);
    }
}
