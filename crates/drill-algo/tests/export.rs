//! `drill export --format torch` against DI-engine: the names and shapes of
//! `ding.model.DQN(obs_shape=4, action_shape=2, encoder_hidden_size_list=[128, 128, 64],
//! dueling=True).state_dict()` and of the `VAC`s of `cartpole_v1_ppo.toml` (discrete) and
//! `pendulum_ppo.toml` (continuous), written once by `scripts/check_export.py --fixture` into
//! `tests/fixtures/export/`, and each dense weight transposed to PyTorch's `(out, in)`. (The
//! script also loads an export into DI-engine with `strict=True` and compares outputs; that
//! needs torch, so it is not run here.)

use std::collections::BTreeMap;
use std::path::Path;

use drill_algo::checkpoint::Checkpoint;
use drill_algo::dqn::Dqn;
use drill_algo::policy::Policy as _;
use drill_config::{Config, Policy};

fn fixture(name: &str) -> BTreeMap<String, Vec<usize>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/export")
        .join(name);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    serde_json::from_value(v["state_dict"].clone()).unwrap()
}

fn shapes(state: &drill_algo::export::StateDict) -> BTreeMap<String, Vec<usize>> {
    state
        .iter()
        .map(|(k, (s, _))| (k.clone(), s.clone()))
        .collect()
}

/// The config at `path` (a PPO one) and a fresh PPO's checkpoint.
fn ppo_checkpoint(path: &Path) -> (Config, Checkpoint) {
    let config = Config::load(&path.display().to_string(), &[]).unwrap();
    let Policy::Ppo(p) = &config.policy else {
        unreachable!()
    };
    let device = burn::tensor::Device::flex();
    let ppo =
        drill_algo::ppo::Ppo::from_config(&config, p, &device, drill_algo::ddp::Ranks::alone())
            .unwrap();
    (config, ppo.state_dict())
}

#[test]
fn ppo_exports_as_di_engines_vac_discrete_and_continuous() {
    for (config, fixture_name) in [
        ("cartpole_v1_ppo.toml", "ding_vac_cartpole.json"),
        ("pendulum_ppo.toml", "ding_vac_pendulum.json"),
    ] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../configs")
            .join(config);
        let (config, ck) = ppo_checkpoint(&path);
        let got = drill_algo::export::to_torch(&config, &ck).unwrap();
        assert_eq!(shapes(&got), fixture(fixture_name), "{fixture_name}");
        // The critic's output layer, transposed; its alias holds the same values.
        let (s, v) = ck.tensor("model.critic.layers.2.weight").unwrap();
        let (ts, tv) = &got["critic_head.last.weight"];
        assert_eq!((ts.clone(), tv.len()), (vec![s[1], s[0]], v.len()));
        assert_eq!(tv, &got["critic.1.last.weight"].1);
        assert_eq!(tv[0], v[0]);
    }
}

fn cartpole_dqn() -> (Config, Checkpoint) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/cartpole_dqn.toml");
    let config = Config::load(&path.display().to_string(), &[]).unwrap();
    let Policy::Dqn(p) = &config.policy else {
        unreachable!()
    };
    let dqn = Dqn::from_config(&config, p, &burn::tensor::Device::flex()).unwrap();
    (config, dqn.state_dict())
}

#[test]
fn names_and_shapes_are_di_engines_and_weights_are_transposed() {
    let fixture: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/export/ding_dqn_cartpole.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let (config, ck) = cartpole_dqn();
    let Policy::Dqn(p) = &config.policy else {
        unreachable!()
    };
    assert_eq!(
        fixture["config"]["encoder_hidden_size_list"],
        serde_json::json!(p.model.encoder_hidden_size_list),
        "the fixture is of cartpole_dqn.toml's net"
    );
    let want: BTreeMap<String, Vec<usize>> =
        serde_json::from_value(fixture["state_dict"].clone()).unwrap();
    let got = drill_algo::export::to_torch(&config, &ck).unwrap();
    let got_shapes: BTreeMap<String, Vec<usize>> = got
        .iter()
        .map(|(k, (s, _))| (k.clone(), s.clone()))
        .collect();
    assert_eq!(got_shapes, want);
    // Dense weights: drill's (in, out) becomes PyTorch's (out, in), value for value.
    for (drill, torch) in [
        ("model.encoder.0.weight", "encoder.init.weight"),
        ("model.encoder.2.weight", "encoder.main.2.weight"),
        ("model.advantage.1.weight", "head.A.1.0.weight"),
        ("model.value.0.weight", "head.V.0.0.weight"),
    ] {
        let (s, v) = ck.tensor(drill).unwrap();
        let (ts, tv) = &got[torch];
        assert_eq!(ts, &vec![s[1], s[0]], "{torch}");
        for i in 0..s[0] {
            for o in 0..s[1] {
                assert_eq!(tv[o * s[0] + i], v[i * s[1] + o], "{torch}[{o}][{i}]");
            }
        }
    }
    assert_eq!(
        got["head.V.1.0.bias"].1,
        ck.tensor("model.value.1.bias").unwrap().1.clone()
    );
}

#[test]
fn a_plain_head_dqn_is_refused_with_the_key() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/cartpole_dqn.toml");
    let config = Config::load(
        &path.display().to_string(),
        &["policy.model.dueling=false".into()],
    )
    .unwrap();
    let Policy::Dqn(p) = &config.policy else {
        unreachable!()
    };
    let dqn = Dqn::from_config(&config, p, &burn::tensor::Device::flex()).unwrap();
    let e = drill_algo::export::to_torch(&config, &dqn.state_dict())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("policy.model.dueling") && e.contains("DiscreteHead"),
        "{e}"
    );
}

/// An LSTM core exports as PyTorch's `nn.LSTM` named `lstm` (weights `[4H, in]` and
/// `[4H, H]`, drill's `[in, 4H]` transposed; both biases), beside VAC's heads, which read
/// its output.
#[test]
fn an_lstm_core_exports_as_torchs_lstm() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/cartpole_novel_ppo_lstm.toml");
    let (config, ck) = ppo_checkpoint(&path);
    let got = drill_algo::export::to_torch(&config, &ck).unwrap();
    let h = 64;
    for (name, shape) in [
        ("lstm.weight_ih_l0", vec![4 * h, 2]),
        ("lstm.weight_hh_l0", vec![4 * h, h]),
        ("lstm.bias_ih_l0", vec![4 * h]),
        ("lstm.bias_hh_l0", vec![4 * h]),
    ] {
        assert_eq!(got[name].0, shape, "{name}");
    }
    for (drill, torch, d_in) in [
        ("model.lstm.input.weight", "lstm.weight_ih_l0", 2),
        ("model.lstm.recurrent.weight", "lstm.weight_hh_l0", h),
    ] {
        let (_, v) = ck.tensor(drill).unwrap();
        let t = &got[torch].1;
        for (r, c) in [(0, 0), (4 * h - 1, d_in - 1), (130, 1)] {
            assert_eq!(t[r * d_in + c], v[c * 4 * h + r], "{torch}[{r}][{c}]");
        }
    }
    // The heads keep VAC's names (their input is the LSTM's output).
    let vac = fixture("ding_vac_cartpole.json");
    for name in got.keys().filter(|n| !n.starts_with("lstm.")) {
        assert!(vac.contains_key(name), "{name} is not one of VAC's");
    }
    assert_eq!(got["actor_encoder.init.weight"].0, vec![64, h]);
}
