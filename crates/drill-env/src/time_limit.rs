//! [`TimeLimit`]: truncate episodes after a fixed number of steps, as Gymnasium's wrapper does.

use crate::{Action, ClassicEnv, Env, EnvSpec, Step};

/// Wraps an environment and reports `truncated` once `max_steps` steps have been taken in the
/// current episode (unless it terminated on that same step; both can be true, as in Gymnasium).
pub struct TimeLimit<E> {
    inner: E,
    spec: EnvSpec,
    max_steps: u32,
    elapsed: u32,
}

impl<E: Env> TimeLimit<E> {
    /// Limit `inner` to `max_steps` steps per episode.
    pub fn new(inner: E, max_steps: u32) -> Self {
        let mut spec = inner.spec().clone();
        spec.max_episode_steps = Some(max_steps);
        Self {
            inner,
            spec,
            max_steps,
            elapsed: 0,
        }
    }

    /// The spec, to adjust registry facts such as the reward threshold.
    pub fn spec_mut(&mut self) -> &mut EnvSpec {
        &mut self.spec
    }

    /// The wrapped environment.
    pub fn inner(&self) -> &E {
        &self.inner
    }
}

impl<E: Env> Env for TimeLimit<E> {
    type Elem = E::Elem;

    fn spec(&self) -> &EnvSpec {
        &self.spec
    }

    fn reset(&mut self, seed: Option<u64>, obs: &mut [E::Elem]) {
        self.elapsed = 0;
        self.inner.reset(seed, obs);
    }

    #[inline]
    fn step(&mut self, action: Action<'_>, obs: &mut [E::Elem]) -> Step {
        let mut step = self.inner.step(action, obs);
        self.elapsed += 1;
        if self.elapsed >= self.max_steps {
            step.truncated = true;
        }
        step
    }
}

impl<E: ClassicEnv> ClassicEnv for TimeLimit<E> {
    fn state(&self) -> Vec<f64> {
        self.inner.state()
    }

    fn set_state(&mut self, state: &[f64], obs: &mut [f32]) {
        self.inner.set_state(state, obs);
    }
}
