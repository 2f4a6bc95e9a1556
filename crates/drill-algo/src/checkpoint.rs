//! Checkpoints of training state: the file itself is drill-exp's [`Checkpoint`]; this module
//! adds what needs the model ([`CheckpointExt`]: flat parameters and a [`Trainer`]'s Adam
//! state in and out) and generator states for resumes (`rng_state`).

pub use drill_exp::Checkpoint;
pub(crate) use drill_exp::{CheckpointError, TRAIN_SECONDS};

use crate::optim::{Adam, ParamLayout, Trainer};
use burn::module::Module;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// A model's parameters and optimizer state in and out of a [`Checkpoint`].
pub trait CheckpointExt {
    /// Add a module's parameters (flat `values` in `layout`) under `prefix.`.
    fn put_params(&mut self, prefix: &str, layout: &ParamLayout, values: &[f32]);
    /// Read parameters saved under `prefix.` into a flat buffer in `layout`.
    fn get_params(&self, prefix: &str, layout: &ParamLayout) -> Result<Vec<f32>, CheckpointError>;
    /// Save a trainer's parameters and Adam state under `prefix`.
    fn put_trainer<M: Module>(&mut self, prefix: &str, trainer: &Trainer<M>);
    /// Restore a trainer saved with [`Self::put_trainer`].
    fn get_trainer<M: Module>(
        &self,
        prefix: &str,
        trainer: &mut Trainer<M>,
    ) -> Result<(), CheckpointError>;
}

impl CheckpointExt for Checkpoint {
    /// Add a module's parameters (flat `values` in `layout`) under `prefix.`.
    fn put_params(&mut self, prefix: &str, layout: &ParamLayout, values: &[f32]) {
        for slot in &layout.slots {
            let v = values[slot.offset..slot.offset + slot.len].to_vec();
            self.tensors
                .insert(format!("{prefix}.{}", slot.name), (slot.shape.clone(), v));
        }
    }

    /// Read parameters saved under `prefix.` into a flat buffer in `layout`.
    fn get_params(&self, prefix: &str, layout: &ParamLayout) -> Result<Vec<f32>, CheckpointError> {
        let mut out = vec![0.0; layout.len];
        for slot in &layout.slots {
            let name = format!("{prefix}.{}", slot.name);
            let (shape, values) = self.tensor(&name)?;
            if shape != &slot.shape {
                return Err(self.mismatch(format!(
                    "tensor {name} has shape {shape:?}, the model needs {:?}",
                    slot.shape
                )));
            }
            out[slot.offset..slot.offset + slot.len].copy_from_slice(values);
        }
        Ok(out)
    }

    /// Save a trainer's parameters and Adam state under `prefix`.
    fn put_trainer<M: Module>(&mut self, prefix: &str, trainer: &Trainer<M>) {
        self.put_params(prefix, trainer.layout(), trainer.params());
        let (n, adam) = (trainer.params().len(), trainer.adam());
        self.tensors
            .insert(format!("{prefix}_optim.adam_m"), (vec![n], adam.m.clone()));
        self.tensors
            .insert(format!("{prefix}_optim.adam_v"), (vec![n], adam.v.clone()));
        self.meta
            .insert(format!("{prefix}_optim.adam_t"), adam.t.to_string());
    }

    /// Restore a trainer saved with [`Self::put_trainer`].
    fn get_trainer<M: Module>(
        &self,
        prefix: &str,
        trainer: &mut Trainer<M>,
    ) -> Result<(), CheckpointError> {
        let params = self.get_params(prefix, trainer.layout())?;
        let n = params.len();
        let moment = |k: &str| -> Result<Vec<f32>, CheckpointError> {
            let (shape, v) = self.tensor(&format!("{prefix}_optim.{k}"))?;
            if shape != &[n] {
                return Err(self.mismatch(format!(
                    "{prefix}_optim.{k} has shape {shape:?}, expected [{n}]"
                )));
            }
            Ok(v.clone())
        };
        let adam = Adam {
            m: moment("adam_m")?,
            v: moment("adam_v")?,
            t: self.counter(&format!("{prefix}_optim.adam_t"))?,
            ..trainer.adam().clone()
        };
        trainer.restore(params, adam);
        Ok(())
    }
}

/// A generator's position, to save in checkpoints (`rng.{rank}` in their meta).
pub(crate) fn rng_state(rng: &ChaCha8Rng) -> String {
    let seed: String = rng.get_seed().iter().map(|b| format!("{b:02x}")).collect();
    format!("{seed}:{}:{}", rng.get_stream(), rng.get_word_pos())
}

/// The generator [`rng_state`] describes (`None` when malformed).
pub(crate) fn parse_rng_state(s: &str) -> Option<ChaCha8Rng> {
    let mut it = s.split(':');
    let hex = it.next()?;
    let stream: u64 = it.next()?.parse().ok()?;
    let pos: u128 = it.next()?.parse().ok()?;
    let mut seed = [0u8; 32];
    for (k, b) in seed.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * k..2 * k + 2)?, 16).ok()?;
    }
    let mut rng = ChaCha8Rng::from_seed(seed);
    rng.set_stream(stream);
    rng.set_word_pos(pos);
    Some(rng)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    #[test]
    fn rng_state_round_trips_mid_stream() {
        let mut a = ChaCha8Rng::seed_from_u64(7);
        for _ in 0..13 {
            a.random::<u32>();
        }
        let mut b = parse_rng_state(&rng_state(&a)).unwrap();
        let xs: Vec<u64> = (0..5).map(|_| a.random()).collect();
        let ys: Vec<u64> = (0..5).map(|_| b.random()).collect();
        assert_eq!(xs, ys);
    }
}
