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
//!
//! PPO (DI-engine's `VAC` with `share_encoder=False`): drill's separate MLPs `obs → h1 → … →
//! hk → out` are an `FCEncoder` of `[h1 … h(k-1)]` and a head with one hidden layer of `hk`
//! (`DiscreteHead`, `ReparameterizationHead`, `RegressionHead` for the critic), which needs
//! `h(k-1) = hk`; VAC's state dict also lists each module under `actor.0`/`actor.1` and
//! `critic.0`/`critic.1`, so the export does too. An LSTM core (`policy.model.lstm_hidden_size`)
//! has no VAC twin: its tensors are PyTorch `nn.LSTM`'s (`lstm.weight_ih_l0`,
//! `lstm.weight_hh_l0`, `lstm.bias_ih_l0`, `lstm.bias_hh_l0`, gates i, f, g, o), the heads'
//! encoders reading its output.

use std::collections::BTreeMap;

use burn::tensor::Device;
use drill_config::{Config, Policy};
use drill_env::{Actions, ObsBuf};
use drill_exp::Checkpoint;
use rand::{Rng, SeedableRng};

use crate::ddp::Ranks;
use crate::dqn::Dqn;
use crate::envs;
use crate::error::TrainError;
use crate::policy::Policy as _;
use crate::ppo::Ppo;
use drill_kernels::View;

/// Name → (shape, values) in PyTorch's layout.
pub type StateDict = BTreeMap<String, (Vec<usize>, Vec<f32>)>;

/// `(in, out)` → `(out, in)`.
fn transpose(shape: &[usize], v: &[f32]) -> (Vec<usize>, Vec<f32>) {
    let (rows, cols) = (shape[0], shape[1]);
    (
        vec![cols, rows],
        View::transposed(v, cols).to_row_major(cols, rows),
    )
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

/// One tensor in PyTorch's layout: dense weights transposed, the rest as they are.
fn torch_layout(
    ck: &Checkpoint,
    name: &str,
    shape: &[usize],
    values: &[f32],
) -> Result<(Vec<usize>, Vec<f32>), TrainError> {
    let kind = name.rsplit('.').next().unwrap_or("");
    Ok(match (kind, shape.len()) {
        ("weight", 2) => transpose(shape, values),
        ("weight", 4) | ("bias", 1) => (shape.to_vec(), values.to_vec()),
        _ => {
            return Err(ck
                .mismatch(format!(
                    "tensor {name} of shape {shape:?}: not a dense or convolution layer"
                ))
                .into());
        }
    })
}

/// The online network of checkpoint `ck` (trained with `config`) under DI-engine's names in
/// PyTorch's layout: DQN as DI-engine's `DQN`, PPO as its `VAC`.
pub fn to_torch(config: &Config, ck: &Checkpoint) -> Result<StateDict, TrainError> {
    match &config.policy {
        Policy::Dqn(p) => dqn(config, p, ck),
        Policy::Ppo(p) | Policy::Appo(p) => vac(config, p, ck),
        Policy::Sac(_) => Err(config
            .error(
                "policy.type",
                "is \"sac\": the PyTorch/DI-engine export covers DQN and PPO so far",
            )
            .into()),
    }
}

fn dqn(
    config: &Config,
    p: &drill_config::DqnPolicy,
    ck: &Checkpoint,
) -> Result<StateDict, TrainError> {
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
        out.insert(
            format!("{torch}.{kind}"),
            torch_layout(ck, name, shape, values)?,
        );
    }
    if out.is_empty() {
        return Err(ck
            .mismatch("no tensors under model.: not a DQN checkpoint".into())
            .into());
    }
    Ok(out)
}

/// PPO's actor and critic as DI-engine's `VAC(share_encoder=False)`.
fn vac(
    config: &Config,
    p: &drill_config::PpoPolicy,
    ck: &Checkpoint,
) -> Result<StateDict, TrainError> {
    let h = &p.model.encoder_hidden_size_list;
    let k = h.len();
    if k < 2 || h[k - 2] != h[k - 1] {
        return Err(config
            .error(
                "policy.model.encoder_hidden_size_list",
                format!(
                    "is {h:?}: DI-engine's VAC reads its encoder's last width into a head with one hidden layer of the same width, so the export needs at least two sizes with the last two equal (e.g. [64, 64])"
                ),
            )
            .into());
    }
    if ck.tensors.keys().any(|n| n.starts_with("model.trunk.")) {
        return Err(config
            .error(
                "env.id",
                "is an image env: PPO's shared convolutional trunk (CleanRL's ppo_atari) has no VAC twin to export to",
            )
            .into());
    }
    let continuous = matches!(
        envs::env_spec(config)?.action_space,
        drill_env::ActionSpace::Continuous { .. }
    );
    let conditioned =
        continuous && matches!(p.model.sigma_type, drill_config::SigmaType::Conditioned);
    // VAC's module for drill's layer `i` of `side`; `None` for a conditioned actor's output
    // layer, which VAC splits in two.
    let head = |side: &str, i: usize| -> Option<String> {
        Some(match (side, i) {
            (_, 0) => format!("{side}_encoder.init"),
            (_, i) if i < k - 1 => format!("{side}_encoder.main.{}", 2 * (i - 1)),
            ("critic", i) if i == k - 1 => "critic_head.main.0".into(),
            ("critic", _) => "critic_head.last".into(),
            (_, i) if i == k - 1 && continuous => "actor_head.main.0".into(),
            (_, i) if i == k - 1 => "actor_head.Q.0.0".into(),
            _ if conditioned => return None,
            _ if continuous => "actor_head.mu".into(),
            _ => "actor_head.Q.1.0".into(),
        })
    };
    let mut out = StateDict::new();
    if p.model.lstm_hidden_size.is_some() {
        for (drill, torch) in [("input", "ih"), ("recurrent", "hh")] {
            for kind in ["weight", "bias"] {
                let name = format!("model.lstm.{drill}.{kind}");
                let (shape, values) = ck.tensor(&name)?;
                let t = torch_layout(ck, &name, shape, values)?;
                out.insert(format!("lstm.{kind}_{torch}_l0"), t);
            }
        }
    }
    for side in ["actor", "critic"] {
        for i in 0..=k {
            for kind in ["weight", "bias"] {
                let name = format!("model.{side}.layers.{i}.{kind}");
                let (shape, values) = ck.tensor(&name)?;
                let (shape, values) = torch_layout(ck, &name, shape, values)?;
                if let Some(module) = head(side, i) {
                    out.insert(format!("{module}.{kind}"), (shape, values));
                    continue;
                }
                // One output layer [mean; log-std] → VAC's `mu` and `log_sigma_layer`.
                let act = shape[0] / 2;
                let row = values.len() / shape[0];
                let (mu, ls) = values.split_at(act * row);
                let mut s = shape.clone();
                s[0] = act;
                out.insert(format!("actor_head.mu.{kind}"), (s.clone(), mu.to_vec()));
                out.insert(
                    format!("actor_head.log_sigma_layer.{kind}"),
                    (s, ls.to_vec()),
                );
            }
        }
    }
    if continuous && !conditioned {
        let (shape, values) = ck.tensor("model.actor.log_std")?;
        out.insert(
            "actor_head.log_sigma_param".into(),
            (vec![1, shape[0]], values.clone()),
        );
    }
    // VAC also registers its modules as `actor = [actor_encoder, actor_head]` and
    // `critic = [critic_encoder, critic_head]`: the same tensors under a second name.
    let aliases: StateDict = out
        .iter()
        .filter_map(|(n, t)| {
            let alias = n
                .strip_prefix("actor_encoder.")
                .map(|r| format!("actor.0.{r}"))
                .or_else(|| {
                    n.strip_prefix("actor_head.")
                        .map(|r| format!("actor.1.{r}"))
                })
                .or_else(|| {
                    n.strip_prefix("critic_encoder.")
                        .map(|r| format!("critic.0.{r}"))
                })
                .or_else(|| {
                    n.strip_prefix("critic_head.")
                        .map(|r| format!("critic.1.{r}"))
                })?;
            Some((alias, t.clone()))
        })
        .collect();
    out.extend(aliases);
    Ok(out)
}

/// What the exported network must reproduce: observations and drill's outputs for them
/// (`q` for DQN; `logit` or `mu` and `sigma`, and `value`, for PPO), each `(shape, values)`.
pub struct Probe {
    /// `[n, obs...]` as the network takes them (`u8` frames scaled to `[0, 1]`).
    pub obs: (Vec<usize>, Vec<f32>),
    /// Name → drill's output.
    pub outputs: StateDict,
}

/// `n` observations met by random actions in `config`'s environment (seeded `seed`) and what
/// drill's network of `ck` outputs for them.
pub fn probe(
    config: &Config,
    ck: &Checkpoint,
    n: usize,
    seed: u64,
    device: &Device,
) -> Result<Probe, TrainError> {
    envs::register_env(config);
    let mut venv = drill_env::make_vec_with(&config.env.id, 1, seed, 1, &config.env.atari.eval())?;
    let spec = venv.spec().clone();
    let d = spec.obs_dim();
    let mut obs = ObsBuf::new(spec.obs.dtype);
    obs.extend(venv.reset(None)?);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut cont = vec![0.0f32; spec.action_space.dim()];
    while obs.len() < n * d {
        match &spec.action_space {
            drill_env::ActionSpace::Discrete(k) => {
                venv.step(Actions::Discrete(&[rng.random_range(0..*k as u32)]))?
            }
            drill_env::ActionSpace::Continuous { low, high } => {
                for (c, (l, h)) in cont.iter_mut().zip(low.iter().zip(high)) {
                    *c = rng.random_range(*l..=*h);
                }
                venv.step(Actions::Continuous(&cont))?
            }
        }
        obs.extend(venv.obs());
    }
    let mut outputs = StateDict::new();
    let rows = |v: Vec<f32>| (vec![n, v.len() / n], v);
    match &config.policy {
        Policy::Dqn(p) => {
            let mut dqn = Dqn::from_config(config, p, device)?;
            dqn.load_state_dict(ck)?;
            outputs.insert("q".into(), rows(dqn.q_values(obs.as_obs())));
        }
        Policy::Ppo(p) | Policy::Appo(p) => {
            let mut ppo = Ppo::from_config(config, p, device, Ranks::alone())?;
            ppo.load_state_dict(ck)?;
            let (actor, log_std, value) = ppo.outputs(obs.as_obs());
            match log_std {
                None => outputs.insert("logit".into(), rows(actor)),
                Some(ls) => {
                    outputs.insert("mu".into(), rows(actor));
                    outputs.insert("sigma".into(), rows(ls.iter().map(|x| x.exp()).collect()))
                }
            };
            outputs.insert("value".into(), (vec![n], value));
        }
        Policy::Sac(_) => {
            return Err(config
                .error("policy.type", "is \"sac\": no export to probe")
                .into());
        }
    }
    let scaled: Vec<f32> = match &obs {
        ObsBuf::F32(v) => v.clone(),
        // As `nets::input` scales them: divided by 255 on the batch.
        ObsBuf::U8(v) => v.iter().map(|&b| f32::from(b) / 255.0).collect(),
    };
    let mut shape = vec![n];
    shape.extend(&spec.obs.shape);
    Ok(Probe {
        obs: (shape, scaled),
        outputs,
    })
}
