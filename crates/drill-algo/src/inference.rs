//! A trained policy loaded for inference outside a run ([`Loaded`], Python's `drill.load`):
//! from an experiment folder or one of its checkpoint files, with the config it was trained
//! with, it maps batches of observations to the actions `drill eval` takes, and to DQN's
//! Q-values or PPO's state values.

use std::path::{Path, PathBuf};

use burn::tensor::Device;
use drill_config::Config;
use drill_env::{ActionBuf, EnvSpec, Obs};

use crate::checkpoint::Checkpoint;
use crate::ddp::Ranks;
use crate::error::TrainError;
use crate::export::StateDict;
use crate::policy::{Hidden, Policy};
use crate::{dqn, ppo, sac};

/// The config of checkpoint `EXP/ckpt/X.safetensors`: `EXP/config.toml`, if there.
pub fn config_beside(checkpoint: &Path) -> Option<PathBuf> {
    let exp = checkpoint.parent()?.parent()?;
    Some(exp.join("config.toml")).filter(|p| p.is_file())
}

enum Net {
    Dqn(Box<dqn::Dqn>),
    Ppo(Box<ppo::Ppo>),
    Sac(Box<sac::Sac>),
}

/// A trained policy and what it was trained with.
pub struct Loaded {
    /// The config it was trained with.
    pub config: Config,
    /// Its environment's spec.
    pub spec: EnvSpec,
    /// The checkpoint loaded.
    pub checkpoint: Checkpoint,
    net: Net,
    hidden: Hidden,
}

impl Loaded {
    /// Load `path`: an experiment folder (its newest checkpoint, [`Checkpoint::newest_in`],
    /// and its `config.toml`) or a checkpoint file (with `config`, else the `config.toml` of
    /// its experiment folder). Builds the environment's spec (for Atari, its ROM).
    pub fn open(path: &Path, config: Option<&Path>, device: &Device) -> Result<Self, TrainError> {
        let missing = |what: &str| {
            TrainError::io(
                path.display().to_string(),
                std::io::Error::new(std::io::ErrorKind::NotFound, what.to_string()),
            )
        };
        let (checkpoint, found) = if path.is_dir() {
            let ck = Checkpoint::newest_in(path)?
                .ok_or_else(|| missing("no checkpoint in its ckpt/ folder (the run saved none)"))?;
            (ck, Some(path.join("config.toml")).filter(|p| p.is_file()))
        } else if path.is_file() {
            (Checkpoint::load(path)?, config_beside(path))
        } else {
            return Err(missing("no such experiment folder or checkpoint file"));
        };
        let config_path = match (config, found) {
            (Some(c), _) => c.to_path_buf(),
            (None, Some(c)) => c,
            (None, None) => {
                return Err(missing(
                    "no config.toml beside it (in its experiment folder): give the config it was trained with",
                ));
            }
        };
        let config = Config::load(&config_path.display().to_string(), &[])?;
        let spec = crate::envs::env_spec(&config)?;
        let mut net = match &config.policy {
            drill_config::Policy::Dqn(p) => {
                Net::Dqn(Box::new(dqn::Dqn::from_spec(&config, p, &spec, device)?))
            }
            drill_config::Policy::Ppo(p) | drill_config::Policy::Appo(p) => Net::Ppo(Box::new(
                ppo::Ppo::from_spec(&config, p, &spec, device, Ranks::alone())?,
            )),
            drill_config::Policy::Sac(p) => Net::Sac(Box::new(sac::Sac::from_spec(
                &config,
                p,
                &spec,
                device,
                Ranks::alone(),
            )?)),
        };
        match &mut net {
            Net::Dqn(p) => p.load_state_dict(&checkpoint)?,
            Net::Ppo(p) => p.load_state_dict(&checkpoint)?,
            Net::Sac(p) => p.load_state_dict(&checkpoint)?,
        }
        Ok(Loaded {
            config,
            spec,
            checkpoint,
            net,
            hidden: Hidden::default(),
        })
    }

    /// The actions `drill eval` takes for `obs` (deterministic: greedy, the most likely, or
    /// the mean), one per observation, into `out`. A recurrent policy steps its state, one
    /// row per observation (batches of one size, each row one env copy's; a batch of another
    /// size starts from zeros); [`Self::reset`] it where an episode ends.
    pub fn act(&mut self, obs: Obs<'_>, out: &mut ActionBuf) {
        let h = &mut self.hidden;
        match &mut self.net {
            Net::Dqn(p) => p.eval(obs, h, out),
            Net::Ppo(p) => p.eval(obs, h, out),
            Net::Sac(p) => p.eval(obs, h, out),
        }
    }

    /// A recurrent policy's state to zeros: for the rows `rows` (their episodes ended), or
    /// every row. Nothing for a feed-forward policy.
    pub fn reset(&mut self, rows: Option<&[usize]>) {
        match rows {
            Some(rows) => rows.iter().for_each(|&i| self.hidden.reset(i)),
            None => self.hidden.clear(),
        }
    }

    /// Whether the policy is recurrent (keeps a state per env copy between [`Self::act`]
    /// calls).
    pub fn recurrent(&self) -> bool {
        match &self.net {
            Net::Ppo(p) => p.trainer.model().state_width() > 0,
            Net::Dqn(_) | Net::Sac(_) => false,
        }
    }

    /// DQN's Q-values of `obs`, `[n, actions]` row-major.
    pub fn q_values(&self, obs: Obs<'_>) -> Result<Vec<f32>, TrainError> {
        match &self.net {
            Net::Dqn(p) => Ok(p.q_values(obs)),
            _ => Err(self.unsupported("Q-values (DQN has them)")),
        }
    }

    /// PPO's state values of `obs`, one per observation (a recurrent policy's seen from its
    /// current state, which this leaves as it is).
    pub fn values(&mut self, obs: Obs<'_>) -> Result<Vec<f32>, TrainError> {
        match &mut self.net {
            Net::Ppo(p) => {
                let mut out = Vec::new();
                p.values(obs, &self.hidden, &mut out)?;
                Ok(out)
            }
            _ => Err(self.unsupported("state values (PPO's critic has them)")),
        }
    }

    /// The policy's tensors in PyTorch's layout under DI-engine's names (`drill export`).
    pub fn torch_state(&self) -> Result<StateDict, TrainError> {
        crate::export::to_torch(&self.config, &self.checkpoint)
    }

    fn unsupported(&self, what: &'static str) -> TrainError {
        TrainError::Unsupported {
            policy: match self.net {
                Net::Dqn(_) => dqn::Dqn::NAME,
                Net::Ppo(_) => ppo::Ppo::NAME,
                Net::Sac(_) => sac::Sac::NAME,
            },
            what,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every tensor of every policy's checkpoint, in both precisions, removed, emptied,
    /// resized, or holding a NaN or an infinity: loading refuses it with an error that names
    /// the tensor, and never panics. The untouched checkpoint loads.
    #[test]
    fn fuzz_checkpoint_tensors_into_every_policy() {
        let mut cases = 0;
        for config in [
            "cartpole_dqn.toml",
            "cartpole_v1_ppo.toml",
            "pendulum_sac.toml",
        ] {
            for precision in ["f32", "bf16"] {
                let path =
                    concat!(env!("CARGO_MANIFEST_DIR"), "/../../configs/").to_string() + config;
                let set = [format!("policy.precision={precision}")];
                let cfg = Config::load(&path, &set).unwrap();
                let spec = crate::envs::env_spec(&cfg).unwrap();
                let device = Device::flex();
                let label = format!("{config} {precision}");
                cases += match &cfg.policy {
                    drill_config::Policy::Dqn(p) => {
                        let mut p = dqn::Dqn::from_spec(&cfg, p, &spec, &device).unwrap();
                        mutate_every_tensor(&mut p, &label)
                    }
                    drill_config::Policy::Ppo(p) | drill_config::Policy::Appo(p) => {
                        let mut p =
                            ppo::Ppo::from_spec(&cfg, p, &spec, &device, Ranks::alone()).unwrap();
                        mutate_every_tensor(&mut p, &label)
                    }
                    drill_config::Policy::Sac(p) => {
                        let mut p =
                            sac::Sac::from_spec(&cfg, p, &spec, &device, Ranks::alone()).unwrap();
                        mutate_every_tensor(&mut p, &label)
                    }
                };
            }
        }
        assert!(cases > 100, "{cases}");
    }

    /// Load `p`'s own checkpoint with each tensor mutated in turn; returns the cases tried.
    fn mutate_every_tensor<P: Policy>(p: &mut P, label: &str) -> usize {
        let mut cases = 0;
        let good = p.state_dict();
        p.load_state_dict(&good).unwrap();
        for (name, (shape, values)) in &good.tensors {
            // An empty tensor is one the model has none of (a discrete PPO's `log_std`):
            // only growing it or removing it can be wrong.
            let n = values.len();
            let mut nan = values.clone();
            let mut inf = values.clone();
            if n > 0 {
                nan[n / 2] = f32::NAN;
                inf[0] = f32::INFINITY;
            }
            let mutations: [(&str, Vec<usize>, Vec<f32>); 5] = [
                ("empty", vec![0], vec![]),
                ("longer", vec![n + 1], vec![0.5; n + 1]),
                ("reshaped", vec![1, n], values.clone()),
                ("nan", shape.clone(), nan),
                ("inf", shape.clone(), inf),
            ];
            for (what, s, v) in mutations {
                if (what == "reshaped" && &s == shape) || (n == 0 && what != "longer") {
                    continue;
                }
                let mut ck = good.clone();
                ck.tensors.insert(name.clone(), (s, v));
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    p.load_state_dict(&ck)
                }));
                let e = match r {
                    Ok(Err(e)) => e.to_string(),
                    Ok(Ok(())) => panic!("{label}: {name} {what} loaded"),
                    Err(_) => panic!("{label}: {name} {what} panicked"),
                };
                assert!(e.contains(name.as_str()), "{label} {name} {what}: {e}");
                cases += 1;
            }
            let mut ck = good.clone();
            ck.tensors.remove(name);
            let e = p.load_state_dict(&ck).unwrap_err().to_string();
            assert!(e.contains(&format!("missing tensor {name}")), "{e}");
            cases += 1;
        }
        for key in good.meta.keys().filter(|k| k.ends_with("adam_t")) {
            let mut ck = good.clone();
            ck.meta.remove(key);
            let e = p.load_state_dict(&ck).unwrap_err().to_string();
            assert!(e.contains(key.as_str()), "{label}: {e}");
            cases += 1;
        }
        p.load_state_dict(&good).unwrap();
        cases
    }
}
