//! A trained policy in PyTorch's layout with DI-engine's parameter names (`drill export
//! --format torch`), so that `ding.model.DQN(...).load_state_dict(..., strict=True)` takes it.
//!
//! drill's names and layouts differ from PyTorch's in two ways: a dense layer's weight is
//! stored `(in, out)` (burn) where `nn.Linear` holds `(out, in)`, and the module paths are
//! drill's (`model.encoder.0`) rather than DI-engine's (`encoder.init`). Convolution weights
//! are `[out, in, kh, kw]` in both. Only the online network is exported: no target network,
//! no optimizer state.
//!
//! DQN (DI-engine's `ding/model/template/q_learning.py`): `FCEncoder` (`encoder.init`, then
//! `encoder.main.{0,2,..}`) or `ConvEncoder` (`encoder.main.{0,2,4}` convolutions, then
//! `encoder.mid`), and the `DuelingHead` (`head.A.0.0` / `head.A.1.0`, `head.V.0.0` /
//! `head.V.1.0`). A non-dueling drill DQN has no DI-engine twin: DI-engine's `DiscreteHead`
//! has a hidden layer before the output that drill's plain head lacks.

use std::collections::BTreeMap;

use burn::tensor::Device;
use drill_config::{Config, Policy};
use drill_env::{Actions, ObsBuf};
use drill_exp::Checkpoint;
use rand::{Rng, SeedableRng};

use crate::dqn::Dqn;
use crate::error::TrainError;
use crate::policy::Policy as _;
use crate::session;

/// Name → (shape, values) in PyTorch's layout.
pub type StateDict = BTreeMap<String, (Vec<usize>, Vec<f32>)>;

/// `(in, out)` → `(out, in)`.
fn transpose(shape: &[usize], v: &[f32]) -> (Vec<usize>, Vec<f32>) {
    let (rows, cols) = (shape[0], shape[1]);
    let mut out = vec![0.0; v.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = v[r * cols + c];
        }
    }
    (vec![cols, rows], out)
}

/// DI-engine's name of drill's online-network layer `layer` (without `.weight`/`.bias`).
fn dqn_name(layer: &str) -> Option<String> {
    let parts: Vec<&str> = layer.split('.').collect();
    let idx = |s: &str| s.parse::<usize>().ok();
    Some(match parts[..] {
        ["trunk", "convs", i] => format!("encoder.main.{}", 2 * idx(i)?),
        ["trunk", "mid"] => "encoder.mid".into(),
        ["encoder", "0"] => "encoder.init".into(),
        ["encoder", i] => format!("encoder.main.{}", 2 * (idx(i)? - 1)),
        ["advantage", i] => format!("head.A.{}.0", idx(i)?),
        ["value", i] => format!("head.V.{}.0", idx(i)?),
        _ => return None,
    })
}

/// The online network of checkpoint `ck` (trained with `config`) under DI-engine's names in
/// PyTorch's layout.
pub fn to_torch(config: &Config, ck: &Checkpoint) -> Result<StateDict, TrainError> {
    let Policy::Dqn(p) = &config.policy else {
        return Err(config
            .error(
                "policy.type",
                format!(
                    "is {:?}: the PyTorch/DI-engine export covers DQN only so far",
                    config.policy.kind()
                ),
            )
            .into());
    };
    if !p.model.dueling {
        return Err(config
            .error(
                "policy.model.dueling",
                "is false: a plain-head DQN has no DI-engine twin (DI-engine's DiscreteHead has a hidden layer before its output that drill's plain head lacks); train with dueling = true",
            )
            .into());
    }
    let mut out = StateDict::new();
    for (name, (shape, values)) in &ck.tensors {
        let Some(rest) = name.strip_prefix("model.") else {
            continue;
        };
        let Some((layer, kind)) = rest.rsplit_once('.') else {
            continue;
        };
        let torch = dqn_name(layer).ok_or_else(|| {
            ck.mismatch(format!(
                "tensor {name}: no DI-engine name for drill's layer {layer}"
            ))
        })?;
        let (shape, values) = match (kind, shape.len()) {
            ("weight", 2) => transpose(shape, values),
            ("weight", 4) | ("bias", 1) => (shape.clone(), values.clone()),
            _ => {
                return Err(ck
                    .mismatch(format!(
                        "tensor {name} of shape {shape:?}: not a dense or convolution layer"
                    ))
                    .into());
            }
        };
        out.insert(format!("{torch}.{kind}"), (shape, values));
    }
    if out.is_empty() {
        return Err(ck
            .mismatch("no tensors under model.: not a DQN checkpoint".into())
            .into());
    }
    Ok(out)
}

/// What the exported network must reproduce: observations and drill's outputs for them.
pub struct Probe {
    /// `[n, obs...]` as the network takes them (`u8` frames scaled to `[0, 1]`).
    pub obs: (Vec<usize>, Vec<f32>),
    /// `[n, actions]`: drill's Q-values of `obs`.
    pub q: (Vec<usize>, Vec<f32>),
}

/// `n` observations met by random actions in `config`'s environment (seeded `seed`) and the
/// Q-values drill's network of `ck` gives them.
pub fn probe(
    config: &Config,
    ck: &Checkpoint,
    n: usize,
    seed: u64,
    device: &Device,
) -> Result<Probe, TrainError> {
    let Policy::Dqn(p) = &config.policy else {
        return Err(config
            .error("policy.type", "is not dqn: only a DQN export has a probe")
            .into());
    };
    let mut dqn = Dqn::from_config(config, p, device)?;
    dqn.load_state_dict(ck)?;
    session::register_env(config);
    let mut venv = drill_env::make_vec_with(
        &config.env.id,
        1,
        seed,
        1,
        &session::atari_options(config).eval(),
    )?;
    let spec = venv.spec().clone();
    let d = spec.obs_dim();
    let mut obs = ObsBuf::new(spec.obs.dtype);
    obs.extend(venv.reset(None)?);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    while obs.len() < n * d {
        let a = match &spec.action_space {
            drill_env::ActionSpace::Discrete(k) => rng.random_range(0..*k as u32),
            drill_env::ActionSpace::Continuous { .. } => unreachable!("DQN acts discretely"),
        };
        venv.step(Actions::Discrete(&[a]))?;
        obs.extend(venv.obs());
    }
    let q = dqn.q_values(obs.as_obs());
    let scaled: Vec<f32> = match &obs {
        ObsBuf::F32(v) => v.clone(),
        // As `nets::input` scales them: divided by 255 on the batch.
        ObsBuf::U8(v) => v.iter().map(|&b| f32::from(b) / 255.0).collect(),
    };
    let mut shape = vec![n];
    shape.extend(&spec.obs.shape);
    Ok(Probe {
        obs: (shape, scaled),
        q: (vec![n, q.len() / n], q),
    })
}
