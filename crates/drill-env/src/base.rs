//! The [`Env`] trait and the types it exchanges: spaces, [`Step`], the observation element
//! types ([`Elem`]) and their borrowed batch ([`Obs`]). Below every module but `error`.

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

    /// Values stored per action: 1 for discrete (the index), the dimension for continuous.
    pub fn stored_dim(&self) -> usize {
        match self {
            ActionSpace::Discrete(_) => 1,
            ActionSpace::Continuous { low, .. } => low.len(),
        }
    }
}

/// The element type of observations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Dtype {
    /// `f32` (classic control).
    F32,
    /// `u8` (image frames).
    U8,
}

impl Dtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::U8 => 1,
        }
    }
}

/// The observation space: a shape (e.g. `[4]`, or `[4, 84, 84]` for stacked frames) and an
/// element type. Observations travel flat, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct ObsSpace {
    /// Shape of one observation.
    pub shape: Vec<usize>,
    /// Element type.
    pub dtype: Dtype,
}

impl ObsSpace {
    /// A flat `f32` vector of `n` values.
    pub fn vector(n: usize) -> Self {
        Self {
            shape: vec![n],
            dtype: Dtype::F32,
        }
    }

    /// Elements per observation (the product of the shape).
    pub fn dim(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Static facts about an environment: its id and spaces, and the episode limit Gymnasium
/// registers it with.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvSpec {
    /// Gymnasium id, e.g. `CartPole-v1`.
    pub id: String,
    /// What `reset` and `step` write.
    pub obs: ObsSpace,
    /// What `step` accepts.
    pub action_space: ActionSpace,
    /// Steps after which an episode is truncated (`None`: never).
    pub max_episode_steps: Option<u32>,
    /// Gymnasium's reward threshold for "solved", if it defines one.
    pub reward_threshold: Option<f64>,
}

impl EnvSpec {
    /// Elements per observation.
    pub fn obs_dim(&self) -> usize {
        self.obs.dim()
    }
}

/// One action for one environment.
#[derive(Debug, Clone, Copy, PartialEq)]
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

/// A borrowed batch of observations, row-major: `n * dim` elements for `n` observations of
/// `dim` elements each (the shape is the space's).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Obs<'a> {
    /// Float observations (classic control).
    F32(&'a [f32]),
    /// Byte observations (frames), scaled to float inside the network.
    U8(&'a [u8]),
}

impl<'a> Obs<'a> {
    /// Elements held (not observations).
    pub fn len(&self) -> usize {
        match self {
            Obs::F32(x) => x.len(),
            Obs::U8(x) => x.len(),
        }
    }

    /// Nothing held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its element type.
    pub fn dtype(&self) -> Dtype {
        match self {
            Obs::F32(_) => Dtype::F32,
            Obs::U8(_) => Dtype::U8,
        }
    }

    /// Rows `rows` (observations of `dim` elements).
    pub fn rows(&self, rows: std::ops::Range<usize>, dim: usize) -> Obs<'a> {
        let r = rows.start * dim..rows.end * dim;
        match *self {
            Obs::F32(x) => Obs::F32(&x[r]),
            Obs::U8(x) => Obs::U8(&x[r]),
        }
    }

    /// The float elements; panics on bytes (for code that only runs on float spaces, after
    /// the model checked the space).
    pub fn f32(&self) -> &'a [f32] {
        match *self {
            Obs::F32(x) => x,
            Obs::U8(_) => panic!("expected f32 observations, got u8"),
        }
    }

    /// Every element as `f32` (bytes unscaled), appended to `out`.
    pub fn extend_f32(&self, out: &mut Vec<f32>) {
        match *self {
            Obs::F32(x) => out.extend_from_slice(x),
            Obs::U8(x) => out.extend(x.iter().map(|&b| f32::from(b))),
        }
    }
}

/// The element type of an environment's observations: `f32` (vectors) or `u8` (frames).
pub trait Elem: Copy + Default + Send + Sync + 'static {
    /// The matching [`Dtype`].
    const DTYPE: Dtype;
    /// A borrowed batch of these.
    fn obs(x: &[Self]) -> Obs<'_>;
}

impl Elem for f32 {
    const DTYPE: Dtype = Dtype::F32;
    fn obs(x: &[f32]) -> Obs<'_> {
        Obs::F32(x)
    }
}

impl Elem for u8 {
    const DTYPE: Dtype = Dtype::U8;
    fn obs(x: &[u8]) -> Obs<'_> {
        Obs::U8(x)
    }
}

/// A reinforcement-learning environment with Gymnasium's semantics.
///
/// Observations are written into `obs`, which must hold `spec().obs_dim()` elements of
/// [`Env::Elem`]: `f32` for classic control, `u8` frames for Atari.
pub trait Env: Send {
    /// Observation element type (agrees with `spec().obs.dtype`).
    type Elem: Elem;
    /// Id, spaces and limits.
    fn spec(&self) -> &EnvSpec;
    /// Start a new episode. `Some(seed)` reseeds the environment's generator (as Gymnasium's
    /// `reset(seed=...)`); `None` continues its stream.
    fn reset(&mut self, seed: Option<u64>, obs: &mut [Self::Elem]);
    /// Advance one step. Panics on an action outside the space (a caller bug, not bad input).
    fn step(&mut self, action: Action<'_>, obs: &mut [Self::Elem]) -> Step;
}

/// A classic-control environment: an [`Env`] over `f32` vectors whose physical state can be
/// read and set (for fixtures recorded from Gymnasium, and debugging).
pub trait ClassicEnv: Env<Elem = f32> {
    /// The physical state (Gymnasium's `env.unwrapped.state`).
    fn state(&self) -> Vec<f64>;
    /// Overwrite the physical state (e.g. with one recorded from Gymnasium) and write the
    /// matching observation.
    fn set_state(&mut self, state: &[f64], obs: &mut [f32]);
}
