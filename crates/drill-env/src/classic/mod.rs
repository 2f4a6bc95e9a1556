//! Gymnasium's classic-control environments, ported line by line (state in `f64`, observations
//! in `f32`, the same operation order), so that a state and action give Gymnasium's numbers;
//! resets draw from numpy's generator (`np_random`), so a seed gives Gymnasium's episodes.

mod acrobot;
mod cartpole;
mod mountain_car;
mod np_random;
mod pendulum;

pub use acrobot::Acrobot;
pub use cartpole::CartPole;
pub use mountain_car::MountainCar;
pub use pendulum::Pendulum;

use np_random::NpRandom;

/// The per-environment generator, Gymnasium's `np_random` (numpy's PCG64 through
/// `SeedSequence`): seeded by `reset(Some(seed))`, from the OS when never seeded (as Gymnasium
/// does), so a seed gives Gymnasium's initial states.
#[derive(Debug, Clone)]
pub(crate) struct EnvRng(NpRandom);

impl EnvRng {
    pub(crate) fn new() -> Self {
        Self(NpRandom::new(rand::random::<u128>()))
    }

    /// Reseed when a seed is given; keep the stream otherwise.
    pub(crate) fn reseed(&mut self, seed: Option<u64>) -> &mut NpRandom {
        if let Some(seed) = seed {
            self.0 = NpRandom::new(u128::from(seed));
        }
        &mut self.0
    }
}
