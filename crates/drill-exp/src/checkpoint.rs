//! [`Checkpoint`]: named f32 tensors plus string metadata, stored as safetensors (PyTorch's
//! `safetensors.torch.load_file` reads them). Written durably ([`crate::durable`]: a
//! temporary file, `fsync`, rename, `fsync` of the folder), so neither a crash of the process
//! nor of the machine leaves a half-written checkpoint. The file format only: filling one from a
//! model is drill-algo's (`CheckpointExt`).

use safetensors::tensor::{Dtype, TensorView};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// Errors reading or writing a checkpoint, naming the file and tensor.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// I/O failed.
    #[error("checkpoint {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Not a valid safetensors file.
    #[error("checkpoint {path}: not a safetensors file: {message}")]
    Format {
        /// The file.
        path: PathBuf,
        /// The decoder's message.
        message: String,
    },
    /// A folder holds checkpoint files but none could be read.
    #[error("no readable checkpoint in {dir}: {why}")]
    NoneReadable {
        /// The `ckpt/` folder.
        dir: PathBuf,
        /// Each file and why it was skipped.
        why: String,
    },
    /// A tensor or metadata entry is missing or has the wrong shape.
    #[error("checkpoint {path}: {message}")]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// What does not match.
        message: String,
    },
}

/// Metadata entry: seconds of training it took to reach a checkpoint, over the runs that led
/// to it (each continued with `--resume` from the one before).
pub const TRAIN_SECONDS: &str = "train_seconds";

/// Tensors and metadata of one training state.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Checkpoint {
    /// Name → (shape, values).
    pub tensors: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
    /// String metadata: the counters (`env_steps`, `train_iters`), the training time
    /// ([`TRAIN_SECONDS`]), `algo`, `world_size` and each rank's random-generator state
    /// (`rng.R`); the config is the experiment folder's `config.toml`, not here.
    pub meta: BTreeMap<String, String>,
    /// Where it was loaded from (for error messages).
    pub path: PathBuf,
}

impl Checkpoint {
    /// A tensor by name, checked: its values fill its shape and are all finite (a state that
    /// trained to NaN or a file edited by hand is refused here, naming the tensor, instead of
    /// being trained on).
    pub fn tensor(&self, name: &str) -> Result<(&Vec<usize>, &Vec<f32>), CheckpointError> {
        let (shape, values) = self
            .tensors
            .get(name)
            .ok_or_else(|| self.mismatch(format!("missing tensor {name}")))?;
        if shape.iter().product::<usize>() != values.len() {
            return Err(self.mismatch(format!(
                "tensor {name} has shape {shape:?} but {} values",
                values.len()
            )));
        }
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            return Err(self.mismatch(format!("tensor {name} holds {} at index {i}", values[i])));
        }
        Ok((shape, values))
    }

    /// A tensor that must have exactly `shape` (an empty or resized one is refused by name).
    pub fn tensor_shaped(&self, name: &str, shape: &[usize]) -> Result<&[f32], CheckpointError> {
        let (s, v) = self.tensor(name)?;
        if s != shape {
            return Err(self.mismatch(format!("tensor {name} has shape {s:?}, expected {shape:?}")));
        }
        Ok(v)
    }

    /// An integer metadata entry.
    pub fn counter(&self, key: &str) -> Result<u64, CheckpointError> {
        self.meta
            .get(key)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| self.mismatch(format!("missing or non-integer metadata {key}")))
    }

    /// [`TRAIN_SECONDS`], when present and a finite, non-negative number (a checkpoint
    /// written before drill counted it has none).
    pub fn train_seconds(&self) -> Option<f64> {
        self.meta
            .get(TRAIN_SECONDS)
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s >= 0.0)
    }

    /// A [`CheckpointError::Mismatch`] naming this checkpoint's file.
    pub fn mismatch(&self, message: String) -> CheckpointError {
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

    /// Write to `path` atomically and durably ([`crate::durable::write_atomic`]); on a full
    /// disk the error says how many bytes the file needed, and the previous file stays.
    pub fn save(&self, path: &Path) -> Result<(), CheckpointError> {
        crate::durable::write_atomic(path, &self.to_bytes()).map_err(|source| CheckpointError::Io {
            path: path.to_path_buf(),
            source,
        })
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

    /// The checkpoint with the most train iterations among `final`, `latest` and `best` in
    /// `dir/ckpt` (each is complete: written by [`Self::save`]); what a restarted or
    /// resumed run goes on from. `None` when there is none; unreadable ones are skipped with
    /// a warning, and when every one there is unreadable the error names each and why.
    pub fn newest_in(dir: &Path) -> Result<Option<Checkpoint>, CheckpointError> {
        let mut best: Option<(u64, Checkpoint)> = None;
        let mut skipped = Vec::new();
        for name in ["final", "latest", "best"] {
            let path = dir.join("ckpt").join(format!("{name}.safetensors"));
            if !path.exists() {
                continue;
            }
            match Self::load(&path).and_then(|ck| Ok((ck.counter("train_iters")?, ck))) {
                Ok((iters, ck)) if best.as_ref().is_none_or(|(b, _)| iters > *b) => {
                    best = Some((iters, ck))
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!("skipping {}: {e}", path.display());
                    skipped.push(format!("{name}.safetensors ({e})"));
                }
            }
        }
        match best {
            Some((_, ck)) => Ok(Some(ck)),
            None if skipped.is_empty() => Ok(None),
            None => Err(CheckpointError::NoneReadable {
                dir: dir.join("ckpt"),
                why: skipped.join("; "),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No files: none, said as such. Files that are all unreadable: an error naming each and
    /// why. One good among bad ones: the good one.
    #[test]
    fn newest_in_names_every_unreadable_checkpoint() {
        let tmp = tempfile::tempdir().unwrap();
        let ckpt = tmp.path().join("ckpt");
        std::fs::create_dir(&ckpt).unwrap();
        assert!(Checkpoint::newest_in(tmp.path()).unwrap().is_none());
        std::fs::write(ckpt.join("final.safetensors"), b"torn").unwrap();
        let mut no_iters = Checkpoint::default();
        no_iters.tensors.insert("w".into(), (vec![1], vec![0.5]));
        no_iters.save(&ckpt.join("latest.safetensors")).unwrap();
        let e = Checkpoint::newest_in(tmp.path()).unwrap_err().to_string();
        assert!(
            e.contains("final.safetensors (") && e.contains("not a safetensors"),
            "{e}"
        );
        assert!(
            e.contains("latest.safetensors (") && e.contains("train_iters"),
            "{e}"
        );
        let mut good = no_iters.clone();
        good.meta.insert("train_iters".into(), "7".into());
        good.save(&ckpt.join("best.safetensors")).unwrap();
        let ck = Checkpoint::newest_in(tmp.path()).unwrap().unwrap();
        assert_eq!(ck.counter("train_iters").unwrap(), 7);
    }

    /// Checkpoint files from anywhere (`--resume`, `drill eval`), fuzzed: headers that lie
    /// about sizes and offsets, truncations, other dtypes.
    #[test]
    fn fuzz_hostile_checkpoints() {
        let mut ck = Checkpoint::default();
        ck.tensors
            .insert("q.0.weight".into(), (vec![4, 3], vec![0.5; 12]));
        ck.tensors
            .insert("q.0.bias".into(), (vec![3], vec![0.1; 3]));
        ck.meta.insert("train_iters".into(), "40".into());
        ck.meta.insert("algo".into(), "dqn".into());
        let seeds = vec![ck.to_bytes(), Checkpoint::default().to_bytes()];
        let path = Path::new("fuzz.safetensors");
        // Words of the JSON header: dtypes, shapes and offsets that lie.
        let dict = [
            "\"F16\"",
            "\"I64\"",
            "\"BOOL\"",
            "[]",
            "[0]",
            "[4,3]",
            "[18446744073709551615]",
            "[4294967296,4294967296]",
            "[0,48]",
            "[48,0]",
            "[0,99999999999]",
            "\"data_offsets\"",
            "\"shape\"",
            "\"dtype\"",
            "\"__metadata__\"",
            "{}",
            "null",
            "-1",
        ];
        drill_fuzz::fuzz_with("checkpoint file", &seeds, &dict, |b| {
            if let Ok(ck) = Checkpoint::from_bytes(b, path) {
                let _ = ck.counter("train_iters");
            }
        });
    }
}
