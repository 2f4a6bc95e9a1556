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
use crate::policy::Policy;
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
            let ck = Checkpoint::newest_in(path)
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
        let spec = crate::session::env_spec(&config)?;
        let mut net = match &config.policy {
            drill_config::Policy::Dqn(p) => {
                Net::Dqn(Box::new(dqn::Dqn::from_spec(&config, p, &spec, device)?))
            }
            drill_config::Policy::Ppo(p) => Net::Ppo(Box::new(ppo::Ppo::from_spec(
                &config,
                p,
                &spec,
                device,
                Ranks::alone(),
            )?)),
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
        })
    }

    /// The actions `drill eval` takes for `obs` (deterministic: greedy, the most likely, or
    /// the mean), one per observation, into `out`.
    pub fn act(&mut self, obs: Obs<'_>, out: &mut ActionBuf) {
        match &mut self.net {
            Net::Dqn(p) => p.eval(obs, out),
            Net::Ppo(p) => p.eval(obs, out),
            Net::Sac(p) => p.eval(obs, out),
        }
    }

    /// DQN's Q-values of `obs`, `[n, actions]` row-major.
    pub fn q_values(&self, obs: Obs<'_>) -> Result<Vec<f32>, TrainError> {
        match &self.net {
            Net::Dqn(p) => Ok(p.q_values(obs)),
            _ => Err(self.unsupported("Q-values (DQN has them)")),
        }
    }

    /// PPO's state values of `obs`, one per observation.
    pub fn values(&mut self, obs: Obs<'_>) -> Result<Vec<f32>, TrainError> {
        match &mut self.net {
            Net::Ppo(p) => {
                let mut out = Vec::new();
                p.values(obs, &mut out)?;
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
