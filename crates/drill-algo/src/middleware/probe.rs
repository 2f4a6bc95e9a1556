//! [`Probe`]: a policy for the middlewares' tests (fixed actions, recorded weights).

use std::cell::Cell;

use drill_env::{ActionBuf, Obs};
use rand_chacha::ChaCha8Rng;

use crate::checkpoint::Checkpoint;
use crate::data::Batch;
use crate::error::TrainError;
use crate::policy::{Acted, Explore, Hidden, LearnOutput, Policy};

/// Always takes `action`; counts its eval calls; its weights are `[1.0]`, `[2.0]`, … on
/// successive calls; records the first weight of everything it loads.
pub(crate) struct Probe {
    pub obs_dim: usize,
    pub action: u32,
    pub evals: usize,
    pub explore: Option<Explore>,
    pub loaded: Vec<f32>,
    sent: Cell<f32>,
}

impl Probe {
    pub(crate) fn new(obs_dim: usize, action: u32) -> Self {
        Self {
            obs_dim,
            action,
            evals: 0,
            explore: None,
            loaded: Vec::new(),
            sent: Cell::new(0.0),
        }
    }
}

impl Policy for Probe {
    type Data = Batch;
    const NAME: &'static str = "probe";

    fn eval(&mut self, obs: Obs<'_>, _: &mut Hidden, out: &mut ActionBuf) {
        self.evals += 1;
        out.discrete_mut(obs.len() / self.obs_dim).fill(self.action);
    }

    fn collect(
        &mut self,
        obs: Obs<'_>,
        _: &mut Hidden,
        explore: &Explore,
        _: &mut ChaCha8Rng,
        out: &mut Acted,
    ) {
        self.explore = Some(*explore);
        out.actions
            .discrete_mut(obs.len() / self.obs_dim)
            .fill(self.action);
    }

    fn learn(
        &mut self,
        _: &Batch,
        _: u64,
        _: &mut ChaCha8Rng,
        _: &mut LearnOutput,
    ) -> Result<(), TrainError> {
        Ok(())
    }

    fn train_iter(&self) -> u64 {
        0
    }

    fn state_dict(&self) -> Checkpoint {
        Checkpoint::default()
    }

    fn load_state_dict(&mut self, _: &Checkpoint) -> Result<(), TrainError> {
        Ok(())
    }

    fn weights(&self) -> Vec<f32> {
        self.sent.set(self.sent.get() + 1.0);
        vec![self.sent.get()]
    }

    fn load_weights(&mut self, weights: &[f32]) {
        self.loaded.push(weights[0]);
    }
}
