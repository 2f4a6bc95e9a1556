"""Load `drill export` output into DI-engine's DQN and plain PyTorch, and compare the outputs
with drill's (the probe `drill export --probe N` writes beside it). Run by a developer, not
CI (it needs torch and DI-engine):

    drill export EXP/ckpt/best.safetensors -o dqn.safetensors --probe 256
    python scripts/check_export.py dqn.safetensors EXP/config.toml

With --fixture FILE it also writes the names and shapes of DI-engine's model for that config
(what crates/drill-algo/tests/export.rs checks drill's export against).
"""

import argparse
import json
import sys
import tomllib

import torch
from safetensors.torch import load_file


def ding_dqn(cfg):
    from ding.model import DQN

    env, model = cfg["env"], cfg["policy"]["model"]
    obs_shape = model["obs_shape"]
    return DQN(
        obs_shape=obs_shape if isinstance(obs_shape, int) or len(obs_shape) > 1 else obs_shape[0],
        action_shape=model["action_shape"],
        encoder_hidden_size_list=model["encoder_hidden_size_list"],
        dueling=model["dueling"],
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("export")
    ap.add_argument("config")
    ap.add_argument("--fixture")
    a = ap.parse_args()
    with open(a.config, "rb") as f:
        cfg = tomllib.load(f)
    state = load_file(a.export)
    model = ding_dqn(cfg)
    model.load_state_dict(state, strict=True)
    model.eval()
    print(f"DI-engine DQN: load_state_dict(strict=True) took all {len(state)} tensors")
    probe = load_file(a.export.removesuffix(".safetensors") + ".probe.safetensors")
    with torch.no_grad():
        q = model(probe["obs"])["logit"]
    err = (q - probe["q"]).abs().max().item()
    print(f"DI-engine Q-values vs drill's on {len(q)} observations: max |diff| {err:.2e}")
    # Plain PyTorch: the same numbers from the tensors alone.
    with torch.no_grad():
        x = probe["obs"].flatten(1) if "encoder.init.weight" in state else probe["obs"]
        if "encoder.init.weight" in state:
            x = torch.relu(x @ state["encoder.init.weight"].T + state["encoder.init.bias"])
            i = 0
            while f"encoder.main.{i}.weight" in state:
                x = torch.relu(x @ state[f"encoder.main.{i}.weight"].T + state[f"encoder.main.{i}.bias"])
                i += 2
        else:
            for i, s in ((0, 4), (2, 2), (4, 1)):
                x = torch.relu(torch.nn.functional.conv2d(x, state[f"encoder.main.{i}.weight"], state[f"encoder.main.{i}.bias"], stride=s))
            x = x.flatten(1) @ state["encoder.mid.weight"].T + state["encoder.mid.bias"]

        def mlp(p):
            h = torch.relu(x @ state[f"head.{p}.0.0.weight"].T + state[f"head.{p}.0.0.bias"])
            return h @ state[f"head.{p}.1.0.weight"].T + state[f"head.{p}.1.0.bias"]

        adv, v = mlp("A"), mlp("V")
        q2 = adv - adv.mean(-1, keepdim=True) + v
    err2 = (q2 - probe["q"]).abs().max().item()
    print(f"plain PyTorch Q-values vs drill's: max |diff| {err2:.2e}")
    if a.fixture:
        import ding

        names = {k: list(v.shape) for k, v in model.state_dict().items()}
        fixture = {
            "model": "ding.model.DQN",
            "written_by": f"scripts/check_export.py, DI-engine {ding.__version__}, torch {torch.__version__}",
            "config": cfg["policy"]["model"],
            "state_dict": names,
        }
        with open(a.fixture, "w") as f:
            json.dump(fixture, f, indent=1)
        print(f"wrote {a.fixture}")
    ok = err < 1e-5 and err2 < 1e-5
    print("OK" if ok else "MISMATCH")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
