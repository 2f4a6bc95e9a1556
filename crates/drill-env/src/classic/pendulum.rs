//! Pendulum: Gymnasium's `pendulum.py`, the inverted pendulum swing-up.

use super::EnvRng;
use crate::{Action, ActionSpace, ClassicEnv, Env, EnvSpec, ObsSpace, Step};
use std::f64::consts::PI;

const MAX_SPEED: f64 = 8.0;
const MAX_TORQUE: f64 = 2.0;
const DT: f64 = 0.05;
const G: f64 = 10.0;
const M: f64 = 1.0;
const L: f64 = 1.0;

/// Swing a pendulum up and hold it: observation `[cos θ, sin θ, θ̇]`, one continuous torque in
/// `[-2, 2]` (clipped), reward `-(θ² + 0.1 θ̇² + 0.001 u²)`. Never terminates; [`crate::make`]
/// truncates at 200 steps.
#[derive(Debug, Clone)]
pub struct Pendulum {
    state: [f64; 2],
    rng: EnvRng,
    spec: EnvSpec,
}

impl Default for Pendulum {
    fn default() -> Self {
        Self::new()
    }
}

impl Pendulum {
    /// A new Pendulum-v1.
    pub fn new() -> Self {
        Self {
            state: [0.0; 2],
            rng: EnvRng::new(),
            spec: EnvSpec {
                id: "Pendulum-v1".into(),
                obs: ObsSpace::vector(3),
                action_space: ActionSpace::Continuous {
                    low: vec![-MAX_TORQUE as f32],
                    high: vec![MAX_TORQUE as f32],
                },
                max_episode_steps: None,
                reward_threshold: None,
            },
        }
    }

    #[inline]
    fn write_obs(&self, obs: &mut [f32]) {
        let [th, thdot] = self.state;
        obs[0] = th.cos() as f32;
        obs[1] = th.sin() as f32;
        obs[2] = thdot as f32;
    }
}

fn angle_normalize(x: f64) -> f64 {
    (x + PI).rem_euclid(2.0 * PI) - PI
}

impl Env for Pendulum {
    type Elem = f32;

    fn spec(&self) -> &EnvSpec {
        &self.spec
    }

    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) {
        let rng = self.rng.reseed(seed);
        self.state = [rng.uniform(-PI, PI), rng.uniform(-1.0, 1.0)];
        self.write_obs(obs);
    }

    #[inline]
    fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Step {
        let Action::Continuous(&[u, ..]) = action else {
            panic!("Pendulum takes Continuous([torque]), got {action:?}");
        };
        let [th, thdot] = self.state;
        // Gymnasium clips the float32 action and computes the torque terms in float32.
        let u = u.clamp(-MAX_TORQUE as f32, MAX_TORQUE as f32);
        let costs =
            angle_normalize(th).powi(2) + 0.1 * thdot * thdot + f64::from(0.001f32 * (u * u));
        let torque = f64::from(3.0f32 / (M * L * L) as f32 * u);
        let newthdot = thdot + (3.0 * G / (2.0 * L) * th.sin() + torque) * DT;
        let newthdot = newthdot.clamp(-MAX_SPEED, MAX_SPEED);
        let newth = th + newthdot * DT;
        self.state = [newth, newthdot];
        self.write_obs(obs);
        Step {
            reward: -costs,
            terminated: false,
            truncated: false,
        }
    }
}

impl ClassicEnv for Pendulum {
    fn state(&self) -> Vec<f64> {
        self.state.to_vec()
    }

    fn set_state(&mut self, state: &[f64], obs: &mut [f32]) {
        self.state.copy_from_slice(&state[..2]);
        self.write_obs(obs);
    }
}
