//! Reinforcement-learning environments with Gymnasium's semantics: native classic control, and
//! Atari games through ALE (feature `atari`).
//!
//! - [`Env`]: one environment; `reset(seed)` and `step(action)` write the observation into a
//!   caller-owned buffer, so stepping allocates nothing.
//! - [`classic`]: CartPole-v0/v1, Pendulum-v1, MountainCar-v0 and Acrobot-v1, numerically the same
//!   as Gymnasium's classic-control code (checked against recorded fixtures in `tests/`).
//! - [`TimeLimit`]: the episode step limit, reported as truncation.
//! - [`VecEnv`]: N copies stepped in one call into structure-of-arrays buffers, with same-step
//!   auto-reset (see its docs).
//! - [`atari`]: Atari games through ALE with DI-engine's wrapper chain (feature `atari`).
//! - `python`: any Gymnasium environment (`gymnasium:ID`) through embedded CPython (feature
//!   `python`).
//! - [`make`] / [`make_vec`]: build an environment from its Gymnasium id; [`ids`] lists them.
//! - [`record::record`]: one episode segment kept whole (`drill env rollout` / `show`).
//! - [`Obs`], [`ObsBuf`], [`ActionBuf`]: batches of observations (`f32` vectors or `u8`
//!   frames, shaped by the [`ObsSpace`]) and actions of any [`ActionSpace`], as the rest of
//!   the pipeline moves them.

pub mod atari;
mod base;
mod batch;
pub mod classic;
mod error;
pub mod gymnasium;
#[cfg(feature = "python")]
pub mod python;
pub mod record;
mod registry;
mod time_limit;
mod vector;

pub use base::{Action, ActionSpace, ClassicEnv, Dtype, Elem, Env, EnvSpec, Obs, ObsSpace, Step};
pub use batch::{ActionBuf, Actions, ObsBuf};
pub use error::EnvError;
pub use gymnasium::GYMNASIUM;
#[cfg(feature = "atari")]
pub use registry::make_atari;
pub use registry::{ENV_IDS, atari_rom, ids, make, make_vec, make_vec_with, spec, spec_with};
pub use time_limit::TimeLimit;
pub use vector::{DynVecEnv, VecEnv};
