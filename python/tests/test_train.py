"""drill.train and drill.load: CartPole to its stop value in the process, the same run as
`drill train`; a bad key as a ConfigError naming it; Ctrl-C as KeyboardInterrupt after the
final checkpoint; a loaded policy acting as `drill eval` does."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib

import drill


def test_train_to_the_stop_value_then_load(configs, tmp_path):
    r = drill.train(configs / "cartpole_dqn.toml", seed=0, quiet=True, exp_dir=tmp_path / "run")
    assert r["stop_reached"] and r["eval_reward_mean"] >= 195
    # The command line's figures for this config and seed (docs/python.md, README).
    assert (r["env_steps"], r["train_iters"]) == (2872, 1760)
    assert json.loads(open(r["result_file"]).read())["env_steps"] == 2872
    p = drill.load(r["exp_dir"])
    assert (p.kind, p.env_id) == ("dqn", "CartPole-v0")
    obs = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
    q = p.q_values(obs)
    assert q.shape == (16, 2)
    np.testing.assert_array_equal(p(obs), q.argmax(1))
    assert p(obs[0]) == q[0].argmax()
    with pytest.raises(drill.Error, match="state values"):
        p.values(obs)
    state = p.state_dict()
    assert all(isinstance(v, np.ndarray) for v in state.values()) and len(state) > 0


def evaluate(policy, env_id, episodes, num_envs, seed):
    """drill's evaluator, in Python: copy i seeded seed+i, each copy's share of the episodes,
    returns ordered by (step, copy); a recurrent policy's state reset where episodes end."""
    env = drill.make_vec(env_id, num_envs, seed=seed)
    obs, _ = env.reset(seed=seed)
    left = [episodes // num_envs + (i < episodes % num_envs) for i in range(num_envs)]
    got, step = [], 0
    policy.reset()
    while any(left):
        obs, _, term, trunc, info = env.step(policy(obs))
        policy.reset(term | trunc)
        step += 1
        for i in np.flatnonzero(term | trunc):
            if left[i]:
                got.append((step, i, info["episode"]["r"][i]))
                left[i] -= 1
    returns = [r for _, _, r in sorted(got)]
    return float(np.mean(returns)), returns


def drill_eval(policy, exp_dir, episodes, seed):
    """`drill eval` of the run's final checkpoint (its JSON line), and the evaluator's copies."""
    ck = os.path.join(exp_dir, "ckpt", "final.safetensors")
    out = subprocess.run(
        [os.environ["DRILL_BIN"], "eval", ck, "--config", os.path.join(exp_dir, "config.toml"),
         "--episodes", str(episodes), "--seed", str(seed), "--json"],
        check=True, capture_output=True, text=True,
    )
    copies = min(tomllib.loads(policy.config)["env"]["evaluator_env_num"], episodes)
    return json.loads(out.stdout.strip().splitlines()[-1]), copies


@pytest.mark.skipif(not os.environ.get("DRILL_BIN"), reason="DRILL_BIN: the drill executable to compare with")
def test_loaded_policy_acts_as_drill_eval(configs, tmp_path):
    # Half trained, so that the episodes' returns differ.
    r = drill.train(configs / "cartpole_dqn.toml", seed=1, quiet=True, exp_dir=tmp_path / "dqn",
                    overrides={"max_env_step": 760})
    p = drill.load(r["exp_dir"])
    cli, copies = drill_eval(p, r["exp_dir"], 7, 123)
    mean, returns = evaluate(p, "CartPole-v0", 7, copies, 123)
    assert len(returns) == cli["eval_episodes"] == 7
    assert len(set(returns)) > 1, "returns that all agree would not tell the orders apart"
    assert mean == pytest.approx(cli["eval_reward_mean"], abs=1e-9)


@pytest.mark.skipif(not os.environ.get("DRILL_BIN"), reason="DRILL_BIN: the drill executable to compare with")
def test_a_recurrent_policy_steps_its_state_as_drill_eval(configs, tmp_path):
    # An LSTM policy on CartPole without velocities, partly trained.
    r = drill.train(configs / "cartpole_novel_ppo_lstm.toml", seed=2, quiet=True, exp_dir=tmp_path / "lstm",
                    overrides={"max_env_step": 40960})
    p = drill.load(r["exp_dir"])
    assert p.recurrent
    cli, copies = drill_eval(p, r["exp_dir"], 9, 5)
    mean, returns = evaluate(p, "CartPoleNoVel-v1", 9, copies, 5)
    assert len(set(returns)) > 1, "returns that all agree would not tell the orders apart"
    assert mean == pytest.approx(cli["eval_reward_mean"], abs=1e-9)
    # The state is the policy's memory: after a few steps the values differ from a reset's.
    obs = np.array([[0.01, -0.02], [0.03, 0.0]], np.float32)
    p.reset()
    for _ in range(5):
        p(obs)
    carried = p.values(obs)
    p.reset([True, False])
    reset = p.values(obs)
    assert reset[0] != carried[0] and reset[1] == carried[1]


def test_ppo_values(configs, tmp_path):
    r = drill.train(configs / "cartpole_v1_ppo.toml", seed=0, quiet=True, exp_dir=tmp_path / "ppo",
                    overrides={"max_env_step": 4096})
    p = drill.load(r["exp_dir"])
    assert p.kind == "ppo" and not p.recurrent
    v = p.values(np.zeros((3, 4), np.float32))
    assert v.shape == (3,) and v.dtype == np.float32 and np.all(v == v[0])
    with pytest.raises(drill.Error, match="Q-values"):
        p.q_values(np.zeros((1, 4), np.float32))


def test_a_bad_key_is_a_config_error_naming_it(configs):
    with pytest.raises(drill.ConfigError, match=r"policy\.learn\.batch_sise.*batch_size"):
        drill.train(configs / "cartpole_dqn.toml", overrides={"policy.learn.batch_sise": 3})
    with pytest.raises(drill.ConfigError, match="env.id"):
        drill.train(configs / "cartpole_dqn.toml", overrides={"env.id": "CartPole-v9"})


def test_data_parallel_from_python(configs, tmp_path):
    r = drill.train(configs / "cartpole_dqn_ddp.toml", seed=0, quiet=True, exp_dir=tmp_path / "ddp", nproc_per_node=2)
    assert r["world_size"] == 2 and r["stop_reached"]
    assert (r["env_steps"], r["train_iters"]) == (1904, 560)


def test_ctrl_c_is_keyboard_interrupt_after_the_final_checkpoint(configs, tmp_path):
    script = f"""
import signal, sys, drill
signal.signal(signal.SIGINT, signal.default_int_handler)
try:
    drill.train({str(configs / 'cartpole_dqn.toml')!r}, quiet=True, exp_dir={str(tmp_path / 'intr')!r},
                overrides={{"env.stop_value": 1e9, "max_env_step": 100_000_000}})
except KeyboardInterrupt as e:
    print("KeyboardInterrupt", e, flush=True)
    # The interpreter's own handler is back: a second Ctrl-C is Python's again.
    print(signal.getsignal(signal.SIGINT) is signal.default_int_handler, flush=True)
    sys.exit(0)
sys.exit(3)
"""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not (tmp_path / "intr" / "ckpt").is_dir() and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    assert "KeyboardInterrupt" in out and "True" in out, out
    assert (tmp_path / "intr" / "ckpt" / "final.safetensors").is_file()
    result = json.loads((tmp_path / "intr" / "result.json").read_text())
    assert result["interrupted"] is True
    # The run continues from that folder.
    r = drill.train(resume=tmp_path / "intr", quiet=True, overrides={"max_env_step": result["env_steps"] + 64})
    assert r["env_steps"] >= result["env_steps"]
    shutil.rmtree(tmp_path / "intr")


def test_to_torch_gives_di_engines_model_with_drills_outputs(configs, tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("ding.model")
    r = drill.train(configs / "cartpole_dqn.toml", seed=0, quiet=True, exp_dir=tmp_path / "dqn")
    p = drill.load(r["exp_dir"])
    obs = np.random.default_rng(1).normal(size=(32, 4)).astype(np.float32)
    model = p.to_torch()
    assert type(model).__name__ == "DQN"
    with torch.no_grad():
        q = model(torch.from_numpy(obs))["logit"].numpy()
    np.testing.assert_allclose(q, p.q_values(obs), atol=1e-5)

    r = drill.train(configs / "cartpole_v1_ppo.toml", seed=0, quiet=True, exp_dir=tmp_path / "ppo",
                    overrides={"max_env_step": 4096})
    p = drill.load(r["exp_dir"])
    vac = p.to_torch()
    with torch.no_grad():
        out = vac(torch.from_numpy(obs), mode="compute_actor_critic")
    np.testing.assert_allclose(out["value"].numpy(), p.values(obs), atol=1e-5)
    np.testing.assert_array_equal(out["logit"].argmax(-1).numpy(), p(obs))
