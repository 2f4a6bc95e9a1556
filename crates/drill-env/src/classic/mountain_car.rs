//! MountainCar: Gymnasium's `mountain_car.py` (discrete actions).

use super::EnvRng;
use crate::{Action, ActionSpace, ClassicEnv, Env, EnvSpec, ObsSpace, Step};

const MIN_POSITION: f64 = -1.2;
const MAX_POSITION: f64 = 0.6;
const MAX_SPEED: f64 = 0.07;
const GOAL_POSITION: f64 = 0.5;
const GOAL_VELOCITY: f64 = 0.0;
const FORCE: f64 = 0.001;
const GRAVITY: f64 = 0.0025;

/// Drive an under-powered car up a hill: observation `[position, velocity]`, actions
/// `0` (left), `1` (none), `2` (right), reward -1 per step. [`crate::make`] truncates at 200.
#[derive(Debug, Clone)]
pub struct MountainCar {
    state: [f64; 2],
    rng: EnvRng,
    spec: EnvSpec,
}

impl Default for MountainCar {
    fn default() -> Self {
        Self::new()
    }
}

impl MountainCar {
    /// A new MountainCar-v0.
    pub fn new() -> Self {
        Self {
            state: [0.0; 2],
            rng: EnvRng::new(),
            spec: EnvSpec {
                id: "MountainCar-v0".into(),
                obs: ObsSpace::vector(2),
                action_space: ActionSpace::Discrete(3),
                max_episode_steps: None,
                reward_threshold: None,
            },
        }
    }

    #[inline]
    fn write_obs(&self, obs: &mut [f32]) {
        obs[0] = self.state[0] as f32;
        obs[1] = self.state[1] as f32;
    }
}

impl Env for MountainCar {
    type Elem = f32;

    fn spec(&self) -> &EnvSpec {
        &self.spec
    }

    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) {
        let rng = self.rng.reseed(seed);
        self.state = [rng.uniform(-0.6, -0.4), 0.0];
        self.write_obs(obs);
    }

    #[inline]
    fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Step {
        let a = match action {
            Action::Discrete(a @ 0..=2) => a as f64,
            other => panic!("MountainCar takes Discrete(0..=2), got {other:?}"),
        };
        let [mut position, mut velocity] = self.state;
        velocity += (a - 1.0) * FORCE + (3.0 * position).cos() * (-GRAVITY);
        velocity = velocity.clamp(-MAX_SPEED, MAX_SPEED);
        position += velocity;
        position = position.clamp(MIN_POSITION, MAX_POSITION);
        if position == MIN_POSITION && velocity < 0.0 {
            velocity = 0.0;
        }
        let terminated = position >= GOAL_POSITION && velocity >= GOAL_VELOCITY;
        self.state = [position, velocity];
        self.write_obs(obs);
        Step {
            reward: -1.0,
            terminated,
            truncated: false,
        }
    }
}

impl ClassicEnv for MountainCar {
    fn state(&self) -> Vec<f64> {
        self.state.to_vec()
    }

    fn set_state(&mut self, state: &[f64], obs: &mut [f32]) {
        self.state.copy_from_slice(&state[..2]);
        self.write_obs(obs);
    }
}
