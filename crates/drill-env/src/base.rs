//! The [`Env`] trait and the types it exchanges.

/// The action space of an environment.
#[derive(Debug, Clone, PartialEq)]
pub enum ActionSpace {
    /// `n` discrete actions, numbered `0..n`.
    Discrete(usize),
    /// A box of continuous actions, one `[low, high]` interval per dimension.
    Continuous {
        /// Lower bound per dimension.
        low: Vec<f32>,
        /// Upper bound per dimension.
        high: Vec<f32>,
    },
}

impl ActionSpace {
    /// Number of discrete actions, or the dimension of a continuous action.
    pub fn dim(&self) -> usize {
        match self {
            ActionSpace::Discrete(n) => *n,
            ActionSpace::Continuous { low, .. } => low.len(),
        }
    }

    /// Whether the space is discrete.
    pub fn is_discrete(&self) -> bool {
        matches!(self, ActionSpace::Discrete(_))
    }
}

/// Static facts about an environment: its id and spaces, and the episode limit Gymnasium
/// registers it with.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvSpec {
    /// Gymnasium id, e.g. `CartPole-v1`.
    pub id: &'static str,
    /// Length of the flat `f32` observation.
    pub obs_dim: usize,
    /// What `step` accepts.
    pub action_space: ActionSpace,
    /// Steps after which an episode is truncated (`None`: never).
    pub max_episode_steps: Option<u32>,
    /// Gymnasium's reward threshold for "solved", if it defines one.
    pub reward_threshold: Option<f64>,
}

/// One action for one environment.
#[derive(Debug, Clone, Copy)]
pub enum Action<'a> {
    /// Index of a discrete action.
    Discrete(usize),
    /// A continuous action vector.
    Continuous(&'a [f32]),
}

/// What one step returns besides the observation.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Step {
    /// Reward for the transition.
    pub reward: f64,
    /// The episode ended in a terminal state (no bootstrapping past it).
    pub terminated: bool,
    /// The episode was cut short (time limit): the next state still has value.
    pub truncated: bool,
}

impl Step {
    /// The episode is over, for either reason.
    pub fn done(&self) -> bool {
        self.terminated || self.truncated
    }
}

/// A reinforcement-learning environment with Gymnasium's semantics.
///
/// Observations are written into `obs`, which must hold `spec().obs_dim` values.
pub trait Env: Send {
    /// Id, spaces and limits.
    fn spec(&self) -> &EnvSpec;
    /// Start a new episode. `Some(seed)` reseeds the environment's generator (as Gymnasium's
    /// `reset(seed=...)`); `None` continues its stream.
    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]);
    /// Advance one step. Panics on an action outside the space (a caller bug, not bad input).
    fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Step;
    /// The physical state (Gymnasium's `env.unwrapped.state`), for fixtures and debugging.
    fn state(&self) -> Vec<f64>;
    /// Overwrite the physical state (e.g. with one recorded from Gymnasium) and write the
    /// matching observation.
    fn set_state(&mut self, state: &[f64], obs: &mut [f32]);
}
