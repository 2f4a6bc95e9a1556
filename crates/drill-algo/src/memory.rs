//! What a config will allocate, estimated from its sizes before anything is built, and
//! checked against the memory this machine has available: a size that cannot fit is refused
//! naming its key, instead of an allocation failure (and a backtrace) minutes in.
//!
//! The estimate covers what grows with the config: the network (parameters, gradients, Adam's
//! two moments, DQN's target copy, the flat buffers drill keeps), the environment copies, the
//! replay buffer or PPO's rollout, and a batch's activations. It is a floor, not a bound.

use drill_config::{Config, Policy};
use drill_env::{ActionSpace, EnvSpec};

use crate::error::TrainError;

/// One allocation: the config key that sizes it, what it is, and its bytes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Item {
    /// The config key that sizes it.
    pub(crate) key: &'static str,
    /// What it is, with the numbers behind it.
    pub(crate) what: String,
    /// Estimated bytes.
    pub(crate) bytes: f64,
}

/// The estimate of one training process's memory.
pub(crate) fn estimate(cfg: &Config, spec: &EnvSpec) -> Vec<Item> {
    let obs = spec.obs.dim() as f64;
    let obs_bytes = obs * spec.obs.dtype.size() as f64;
    let image = spec.obs.shape.len() == 3;
    let actions = match &spec.action_space {
        ActionSpace::Discrete(n) => *n,
        ActionSpace::Continuous { low, .. } => low.len(),
    };
    // Per environment copy: its observation buffers (current, final, stacked frames) and,
    // for Atari, the emulator with its screens (about 1 MiB measured per ALE instance).
    let per_env = 4.0 * obs_bytes + if image { 1.0 * MIB } else { 256.0 };
    let e = &cfg.env;
    let mut items = vec![
        Item {
            key: "env.collector_env_num",
            what: format!("{} environment copies", e.collector_env_num),
            bytes: e.collector_env_num as f64 * per_env,
        },
        Item {
            key: "env.evaluator_env_num",
            what: format!("{} evaluation copies", e.evaluator_env_num),
            bytes: e.evaluator_env_num as f64 * per_env,
        },
    ];
    // The network's parameters, and how many f32 per parameter training keeps (gradients,
    // Adam's moments, flat copies; DQN also a target net).
    let (key, params, copies, widths, batch) = match &cfg.policy {
        Policy::Dqn(p) => {
            let hidden = &p.model.encoder_hidden_size_list;
            let (params, widths) = encoder(&spec.obs.shape, hidden, actions);
            let key = "policy.model.encoder_hidden_size_list";
            (key, params, 7.0, widths, p.learn.batch_size)
        }
        Policy::Ppo(p) | Policy::Appo(p) => {
            let hidden = &p.model.encoder_hidden_size_list;
            let (params, widths) = encoder(&spec.obs.shape, hidden, actions + 1);
            let key = "policy.model.encoder_hidden_size_list";
            (key, params, 6.0, widths, p.learn.batch_size)
        }
        Policy::Sac(p) => {
            let (a, c) = (
                p.model.actor_head_hidden_size as f64,
                p.model.critic_head_hidden_size as f64,
            );
            let n = actions as f64;
            let actor = obs * a + a * a + a * 2.0 * n;
            let critic = (obs + n) * c + c * c + c;
            let key = "policy.model.actor_head_hidden_size";
            (
                key,
                actor + 4.0 * critic,
                6.0,
                2.0 * (a + c),
                p.learn.batch_size,
            )
        }
    };
    items.push(Item {
        key,
        what: format!(
            "a network of {} parameters and its optimizer state",
            human(params, "")
        ),
        bytes: params * copies * F32,
    });
    items.push(Item {
        key: "policy.learn.batch_size",
        what: format!("activations and gradients of batches of {batch}"),
        bytes: batch as f64 * widths * F32 * 6.0,
    });
    // An LSTM core: its weights (from the trunk's 512 features, or the observations) and
    // what its recurrence keeps per row of a minibatch (the input's projection, the gates,
    // h and c, and their gradients).
    if let Policy::Ppo(p) | Policy::Appo(p) = &cfg.policy
        && let Some(h) = p.model.lstm_hidden_size
    {
        let (h, features) = (h as f64, if image { 512.0 } else { obs });
        let params = 4.0 * h * (features + h + 2.0);
        items.push(Item {
            key: "policy.model.lstm_hidden_size",
            what: format!(
                "an LSTM of {} parameters, its optimizer state and a minibatch's recurrence",
                human(params, "")
            ),
            bytes: (params * 6.0 + p.learn.batch_size as f64 * h * 20.0) * F32,
        });
    }
    // Stored transitions: image frames once each (stacks are rebuilt from them), vectors with
    // their next observation.
    let transition = if image {
        (spec.obs.shape[1] * spec.obs.shape[2]) as f64 * spec.obs.dtype.size() as f64 + 32.0
    } else {
        2.0 * obs_bytes + 32.0
    };
    let replay = match &cfg.policy {
        Policy::Dqn(p) => Ok(p.other.replay_buffer.replay_buffer_size),
        Policy::Sac(p) => Ok(p.other.replay_buffer.replay_buffer_size),
        Policy::Ppo(p) | Policy::Appo(p) => Err(p.collect.n_sample),
    };
    items.push(match replay {
        Ok(size) => Item {
            key: "policy.other.replay_buffer.replay_buffer_size",
            what: format!("a replay buffer of {size} transitions"),
            bytes: size as f64 * transition,
        },
        Err(steps) => Item {
            key: "policy.collect.n_sample",
            what: format!("a rollout of {steps} steps"),
            bytes: steps as f64 * (obs * F32 + 64.0),
        },
    });
    items
}

/// Refuse `cfg` when `processes` training processes on this machine would need more memory
/// than it has available (`MemAvailable`), naming the key of the largest allocation. Skipped
/// where that is unknown, or with `DRILL_MEMORY_CHECK=0`.
pub(crate) fn check(cfg: &Config, spec: &EnvSpec, processes: usize) -> Result<(), TrainError> {
    if std::env::var("DRILL_MEMORY_CHECK").is_ok_and(|v| v == "0") {
        return Ok(());
    }
    let Some(available) = available_bytes() else {
        return Ok(());
    };
    let items = estimate(cfg, spec);
    let per_process: f64 = items.iter().map(|i| i.bytes).sum();
    let total = per_process * processes.max(1) as f64;
    if total <= available {
        return Ok(());
    }
    let big = items
        .iter()
        .max_by(|a, b| a.bytes.total_cmp(&b.bytes))
        .expect("the estimate has items");
    let times = match processes {
        0 | 1 => String::new(),
        n => format!(" per process, {} for {n} processes", human(total, "B")),
    };
    Err(cfg
        .error(
            big.key,
            format!(
                "needs about {} for {} (a run of this config: at least {}{times}), but this machine has {} available; lower it (DRILL_MEMORY_CHECK=0 skips this check)",
                human(big.bytes, "B"),
                big.what,
                human(per_process, "B"),
                human(available, "B")
            ),
        )
        .into())
}

const F32: f64 = 4.0;
const MIB: f64 = 1024.0 * 1024.0;

/// Parameters and the summed layer widths (one sample's activations) of the encoder
/// `hidden` over observations of `shape`, plus a head of `outputs`: DI-engine's conv
/// encoder for images (8x8/4, 4x4/2, 3x3/1), an MLP otherwise.
fn encoder(shape: &[usize], hidden: &[usize], outputs: usize) -> (f64, f64) {
    let mut params = 0.0;
    let mut widths = 0.0;
    let mut input;
    if let [c, h, w] = *shape {
        let mut side = (h as f64, w as f64);
        input = c as f64;
        // DI-engine's encoder takes its channels from the list; without three sizes the
        // Nature trunk (32, 64, 64) is built.
        let (channels, rest) = if hidden.len() >= 3 {
            hidden.split_at(3)
        } else {
            (&[32, 64, 64][..], &[][..])
        };
        for (&out, (k, s)) in channels.iter().zip([(8.0, 4.0), (4.0, 2.0), (3.0, 1.0)]) {
            let out = out as f64;
            params += input * out * k * k + out;
            side = (
                ((side.0 - k) / s).floor().max(0.0) + 1.0,
                ((side.1 - k) / s).floor().max(0.0) + 1.0,
            );
            widths += out * side.0 * side.1;
            input = out;
        }
        input *= side.0 * side.1;
        for &out in rest {
            params += input * out as f64 + out as f64;
            widths += out as f64;
            input = out as f64;
        }
        // The trunk's feature layer (the last conv size as DI-engine, or the Nature 512).
        let features = hidden.last().copied().unwrap_or(512).max(512) as f64;
        params += input * features + features;
        widths += features;
        input = features;
    } else {
        input = shape.iter().product::<usize>() as f64;
        for &out in hidden {
            params += input * out as f64 + out as f64;
            widths += out as f64;
            input = out as f64;
        }
    }
    params += input * outputs as f64 + outputs as f64;
    widths += outputs as f64;
    (params, widths)
}

/// The machine's available memory (`MemAvailable` of /proc/meminfo), if known.
fn available_bytes() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024.0)
}

/// `1.5 GB`, `640 kB`, `3.2 M` (no unit: a count).
fn human(v: f64, unit: &str) -> String {
    let (div, prefix) = [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")]
        .into_iter()
        .find(|(d, _)| v >= *d)
        .unwrap_or((1.0, ""));
    let sep = if unit.is_empty() { "" } else { " " };
    format!("{:.1}{sep}{prefix}{unit}", v / div)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envs;

    fn config(text: &str, sets: &[&str]) -> Config {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        Config::parse(text, "t.toml", &sets).unwrap()
    }

    const CARTPOLE: &str = r#"
exp_name = "t"
[env]
id = "CartPole-v0"
[policy]
type = "dqn"
[policy.model]
encoder_hidden_size_list = [128, 128, 64]
"#;

    #[test]
    fn the_shipped_sizes_are_small_and_absurd_ones_are_named() {
        let cfg = config(CARTPOLE, &[]);
        let spec = envs::env_spec(&cfg).unwrap();
        let total: f64 = estimate(&cfg, &spec).iter().map(|i| i.bytes).sum();
        assert!(total < 64.0 * MIB, "{total}");
        // DI-engine's CartPole net: 4-128-128-64 plus a 2-action head.
        let (params, _) = encoder(&[4], &[128, 128, 64], 2);
        assert_eq!(
            params,
            (4 * 128 + 128 + 128 * 128 + 128 + 128 * 64 + 64 + 64 * 2 + 2) as f64
        );
        let cfg = config(
            CARTPOLE,
            &["policy.other.replay_buffer.replay_buffer_size=100000000000"],
        );
        let spec = envs::env_spec(&cfg).unwrap();
        let items = estimate(&cfg, &spec);
        let big = items
            .iter()
            .max_by(|a, b| a.bytes.total_cmp(&b.bytes))
            .unwrap();
        assert_eq!(big.key, "policy.other.replay_buffer.replay_buffer_size");
        assert!(big.bytes > 1e12, "{big:?}");
        let e = check(&cfg, &spec, 1).unwrap_err().to_string();
        assert!(
            e.contains("policy.other.replay_buffer.replay_buffer_size") && e.contains("available"),
            "{e}"
        );
    }

    /// An LSTM's weights are counted, and a huge one is the item its key names.
    #[test]
    fn an_lstm_too_large_is_named() {
        let ppo = "exp_name = \"t\"\n[env]\nid = \"CartPole-v1\"\n[policy]\ntype = \"ppo\"\n\
                   [policy.collect]\nn_sample = 256\n[policy.learn]\nbatch_size = 256\n";
        let cfg = config(
            ppo,
            &[
                "env.collector_env_num=8",
                "policy.model.lstm_hidden_size=64",
            ],
        );
        let spec = envs::env_spec(&cfg).unwrap();
        let lstm = estimate(&cfg, &spec)
            .into_iter()
            .find(|i| i.key == "policy.model.lstm_hidden_size")
            .unwrap();
        // 4 · 64 · (4 inputs + 64 + 2 biases): PyTorch's nn.LSTM(4, 64).
        assert!(lstm.what.contains("17.9k parameters"), "{lstm:?}");
        let cfg = config(ppo, &["policy.model.lstm_hidden_size=16384"]);
        let big = estimate(&cfg, &spec)
            .into_iter()
            .max_by(|a, b| a.bytes.total_cmp(&b.bytes))
            .unwrap();
        assert_eq!(big.key, "policy.model.lstm_hidden_size");
        assert!(big.bytes > 2e10, "{big:?}");
    }

    #[test]
    fn pong_conv_encoder_params_match_the_built_net() {
        // DI-engine's Pong encoder [128, 128, 512] over 4x84x84: 14.26 M parameters with its
        // dueling head (counted by `drill bench`); the encoder and a plain head come close.
        let (params, _) = encoder(&[4, 84, 84], &[128, 128, 512], 6);
        assert!((13.0e6..15.0e6).contains(&params), "{params}");
    }
}
