//! [`record`]: one episode segment of any environment, kept whole (observations with their
//! dtype and shape, actions, rewards, flags), for `drill env rollout` / `show` and for
//! anyone checking wrappers against another implementation.

use crate::{ActionBuf, ActionSpace, Actions, DynVecEnv, ObsBuf};

/// One episode segment: `obs` holds `steps + 1` observations (the reset's, then one after
/// each action: the episode's last observation where it ended, before any reset).
#[derive(Debug, Clone)]
pub struct Segment {
    /// Shape of one observation.
    pub shape: Vec<usize>,
    /// `(steps + 1) * prod(shape)` elements.
    pub obs: ObsBuf,
    /// The actions taken.
    pub actions: ActionBuf,
    /// Reward per step.
    pub rewards: Vec<f32>,
    /// Terminated flag per step.
    pub terminated: Vec<bool>,
    /// Truncated flag per step.
    pub truncated: Vec<bool>,
}

impl Segment {
    /// Steps recorded.
    pub fn steps(&self) -> usize {
        self.rewards.len()
    }
}

/// Reset copy 0 of `venv` with `seed` and step it with `action(t)` for at most `steps` steps,
/// stopping where the episode ends. `venv` should hold one copy (others step along unseen).
pub fn record(
    venv: &mut dyn DynVecEnv,
    seed: u64,
    steps: usize,
    mut action: impl FnMut(usize) -> ActionBuf,
) -> Result<Segment, crate::EnvError> {
    let spec = venv.spec().clone();
    let n = venv.num_envs();
    let d = spec.obs_dim();
    let mut obs = ObsBuf::new(spec.obs.dtype);
    obs.extend(venv.reset(Some(seed))?.rows(0..1, d));
    let mut actions = ActionBuf::for_space(&spec.action_space, 0);
    let (mut rewards, mut terminated, mut truncated) = (Vec::new(), Vec::new(), Vec::new());
    for t in 0..steps {
        let a = action(t);
        match (&a, &spec.action_space) {
            (ActionBuf::Discrete(x), ActionSpace::Discrete(_)) => {
                let all = vec![x[0]; n];
                venv.step(Actions::Discrete(&all))?;
            }
            (ActionBuf::Continuous { values, .. }, ActionSpace::Continuous { .. }) => {
                let all: Vec<f32> = (0..n).flat_map(|_| values.iter().copied()).collect();
                venv.step(Actions::Continuous(&all))?;
            }
            _ => panic!("an action of the wrong kind for {}", spec.id),
        }
        actions.extend(&a);
        obs.extend(venv.final_obs().rows(0..1, d));
        rewards.push(venv.rewards()[0]);
        terminated.push(venv.terminated()[0]);
        truncated.push(venv.truncated()[0]);
        if terminated[t] || truncated[t] {
            break;
        }
    }
    Ok(Segment {
        shape: spec.obs.shape.clone(),
        obs,
        actions,
        rewards,
        terminated,
        truncated,
    })
}
