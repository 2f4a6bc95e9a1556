//! [`Checkpoint`]: named f32 tensors plus string metadata, stored as safetensors (PyTorch's
//! `safetensors.torch.load_file` reads them). Written to a temporary file and renamed, so a
//! crash never leaves a half-written checkpoint.

pub use crate::error::CheckpointError;
use crate::optim::{Adam, ParamLayout, Trainer};
use burn::module::Module;
use safetensors::tensor::{Dtype, TensorView};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// Tensors and metadata of one training state.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Checkpoint {
    /// Name → (shape, values).
    pub tensors: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
    /// String metadata: counters, algorithm, config.
    pub meta: BTreeMap<String, String>,
    /// Where it was loaded from (for error messages).
    pub path: PathBuf,
}

impl Checkpoint {
    /// Add a module's parameters (flat `values` in `layout`) under `prefix.`.
    pub fn put_params(&mut self, prefix: &str, layout: &ParamLayout, values: &[f32]) {
        for slot in &layout.slots {
            let v = values[slot.offset..slot.offset + slot.len].to_vec();
            self.tensors
                .insert(format!("{prefix}.{}", slot.name), (slot.shape.clone(), v));
        }
    }

    /// Read parameters saved under `prefix.` into a flat buffer in `layout`.
    pub fn get_params(
        &self,
        prefix: &str,
        layout: &ParamLayout,
    ) -> Result<Vec<f32>, CheckpointError> {
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
    pub fn put_trainer<M: Module>(&mut self, prefix: &str, trainer: &Trainer<M>) {
        self.put_params(prefix, &trainer.layout, &trainer.params);
        let n = trainer.params.len();
        self.tensors.insert(
            format!("{prefix}_optim.adam_m"),
            (vec![n], trainer.adam.m.clone()),
        );
        self.tensors.insert(
            format!("{prefix}_optim.adam_v"),
            (vec![n], trainer.adam.v.clone()),
        );
        self.meta
            .insert(format!("{prefix}_optim.adam_t"), trainer.adam.t.to_string());
    }

    /// Restore a trainer saved with [`Self::put_trainer`].
    pub fn get_trainer<M: Module>(
        &self,
        prefix: &str,
        trainer: &mut Trainer<M>,
    ) -> Result<(), CheckpointError> {
        trainer.params = self.get_params(prefix, &trainer.layout)?;
        let n = trainer.params.len();
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
            ..trainer.adam.clone()
        };
        trainer.adam = adam;
        trainer.sync_model();
        Ok(())
    }

    /// A tensor by name.
    pub fn tensor(&self, name: &str) -> Result<(&Vec<usize>, &Vec<f32>), CheckpointError> {
        self.tensors
            .get(name)
            .map(|(s, v)| (s, v))
            .ok_or_else(|| self.mismatch(format!("missing tensor {name}")))
    }

    /// An integer metadata entry.
    pub fn counter(&self, key: &str) -> Result<u64, CheckpointError> {
        self.meta
            .get(key)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| self.mismatch(format!("missing or non-integer metadata {key}")))
    }

    fn mismatch(&self, message: String) -> CheckpointError {
        CheckpointError::Mismatch {
            path: self.path.clone(),
            message,
        }
    }

    /// Serialise to safetensors bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = self
            .tensors
            .iter()
            .map(|(k, (shape, v))| {
                (
                    k.clone(),
                    shape.clone(),
                    v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                )
            })
            .collect();
        let views: Vec<(String, TensorView<'_>)> = bytes
            .iter()
            .map(|(k, shape, b)| {
                (
                    k.clone(),
                    TensorView::new(Dtype::F32, shape.clone(), b).expect("consistent tensor"),
                )
            })
            .collect();
        let meta: HashMap<String, String> = self.meta.clone().into_iter().collect();
        safetensors::serialize(views, Some(meta)).expect("serialising in memory cannot fail")
    }

    /// Write to `path` atomically (temporary file in the same folder, then rename).
    pub fn save(&self, path: &Path) -> Result<(), CheckpointError> {
        let io = |source| CheckpointError::Io {
            path: path.to_path_buf(),
            source,
        };
        let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
        std::fs::write(&tmp, self.to_bytes()).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }

    /// Read a checkpoint written by [`Self::save`].
    pub fn load(path: &Path) -> Result<Self, CheckpointError> {
        let bytes = std::fs::read(path).map_err(|source| CheckpointError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_bytes(&bytes, path)
    }

    /// Parse safetensors bytes (as [`Self::to_bytes`] writes); `path` names them in errors.
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Self, CheckpointError> {
        let format = |e: safetensors::SafeTensorError| CheckpointError::Format {
            path: path.to_path_buf(),
            message: e.to_string(),
        };
        let (_, metadata) = safetensors::SafeTensors::read_metadata(bytes).map_err(format)?;
        let st = safetensors::SafeTensors::deserialize(bytes).map_err(format)?;
        let mut ck = Checkpoint {
            path: path.to_path_buf(),
            ..Default::default()
        };
        for (name, view) in st.tensors() {
            if view.dtype() != Dtype::F32 {
                return Err(ck.mismatch(format!(
                    "tensor {name} is {:?}, drill stores F32",
                    view.dtype()
                )));
            }
            let values = view
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            ck.tensors.insert(name, (view.shape().to_vec(), values));
        }
        if let Some(meta) = metadata.metadata() {
            ck.meta = meta.clone().into_iter().collect();
        }
        Ok(ck)
    }
}

/// A generator's position, to save in checkpoints (`rng.{rank}` in their meta).
pub fn rng_state(rng: &ChaCha8Rng) -> String {
    let seed: String = rng.get_seed().iter().map(|b| format!("{b:02x}")).collect();
    format!("{seed}:{}:{}", rng.get_stream(), rng.get_word_pos())
}

/// The generator [`rng_state`] describes (`None` when malformed).
pub fn parse_rng_state(s: &str) -> Option<ChaCha8Rng> {
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
