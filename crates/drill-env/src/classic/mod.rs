//! Gymnasium's classic-control environments, ported line by line (state in `f64`, observations
//! in `f32`, the same operation order), so that a state and action give Gymnasium's numbers.

mod acrobot;
mod cartpole;
mod mountain_car;
mod pendulum;

pub use acrobot::Acrobot;
pub use cartpole::CartPole;
pub use mountain_car::MountainCar;
pub use pendulum::Pendulum;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// The per-environment generator: seeded by `reset(Some(seed))`, from the OS when never seeded
/// (as Gymnasium does).
#[derive(Debug, Clone)]
pub(crate) struct EnvRng(ChaCha8Rng);

impl EnvRng {
    pub(crate) fn new() -> Self {
        Self(ChaCha8Rng::from_os_rng())
    }

    /// Reseed when a seed is given; keep the stream otherwise.
    pub(crate) fn reseed(&mut self, seed: Option<u64>) -> &mut ChaCha8Rng {
        if let Some(seed) = seed {
            self.0 = ChaCha8Rng::seed_from_u64(seed);
        }
        &mut self.0
    }
}
