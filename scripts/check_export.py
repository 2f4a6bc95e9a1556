"""Load `drill export` output into DI-engine's model (DQN, or VAC for PPO) with strict=True,
and compare its outputs with drill's (the probe `drill export --probe N` writes beside it);
for DQN also through plain PyTorch ops. Run by a developer, not CI (it needs torch, DI-engine
and the package `drill`, `pip install ./python`, whose `drill.policy.ding_model` builds the
model):

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
from drill.policy import ding_model
from safetensors.torch import load_file


def obs_shape(probe):
    return list(probe["obs"].shape[1:])


def ding_dqn(cfg, probe):
    return ding_model("dqn", cfg["policy"]["model"], obs_shape(probe), probe["q"].shape[1], False)


def ding_vac(cfg, probe):
    continuous = "mu" in probe
    actions = (probe["mu"] if continuous else probe["logit"]).shape[1]
    return ding_model("ppo", cfg["policy"]["model"], obs_shape(probe), actions, continuous)


def check_vac(model, probe):
    with torch.no_grad():
        out = model(probe["obs"], mode="compute_actor_critic")
    errs = {"value": (out["value"] - probe["value"]).abs().max().item()}
    if "mu" in probe:
        errs["mu"] = (out["logit"]["mu"] - probe["mu"]).abs().max().item()
        errs["sigma"] = (out["logit"]["sigma"] - probe["sigma"]).abs().max().item()
    else:
        errs["logit"] = (out["logit"] - probe["logit"]).abs().max().item()
    for k, e in errs.items():
        print(f"DI-engine VAC {k} vs drill's on {len(probe['obs'])} observations: max |diff| {e:.2e}")
    return max(errs.values())


def write_fixture(path, model, cfg):
    if not path:
        return
    import ding

    fixture = {
        "model": f"ding.model.{type(model).__name__}",
        "written_by": f"scripts/check_export.py, DI-engine {ding.__version__}, torch {torch.__version__}",
        "config": cfg["policy"]["model"],
        "state_dict": {k: list(v.shape) for k, v in model.state_dict().items()},
    }
    with open(path, "w") as f:
        json.dump(fixture, f, indent=1)
    print(f"wrote {path}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("export")
    ap.add_argument("config")
    ap.add_argument("--fixture")
    a = ap.parse_args()
    with open(a.config, "rb") as f:
        cfg = tomllib.load(f)
    state = load_file(a.export)
    probe = load_file(a.export.removesuffix(".safetensors") + ".probe.safetensors")
    ppo = cfg["policy"]["type"] == "ppo"
    model = ding_vac(cfg, probe) if ppo else ding_dqn(cfg, probe)
    model.load_state_dict(state, strict=True)
    model.eval()
    print(f"DI-engine {type(model).__name__}: load_state_dict(strict=True) took all {len(state)} tensors")
    if ppo:
        err = check_vac(model, probe)
        write_fixture(a.fixture, model, cfg)
        print("OK" if err < 1e-5 else "MISMATCH")
        sys.exit(0 if err < 1e-5 else 1)
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
    write_fixture(a.fixture, model, cfg)
    ok = err < 1e-5 and err2 < 1e-5
    print("OK" if ok else "MISMATCH")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
