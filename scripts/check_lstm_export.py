"""An LSTM policy's export (`drill export`, `drill.load(...).state_dict()`) run in plain
PyTorch: `nn.LSTM` loaded with the `lstm.*` tensors, the heads' dense layers under their
DI-engine names, stepped through episodes of the policy's own env beside `drill.load`'s
policy (its state reset where episodes end, `nn.LSTM`'s state zeroed there too). Prints the
largest difference of the values and how many actions differ. Run by a developer, not CI (it
needs torch and the package `drill`, `pip install ./python`); discrete actions, MLP heads:

    python scripts/check_lstm_export.py EXP [--steps 300] [--envs 4]
"""

import argparse
import re
import tomllib

import numpy as np
import torch

import drill


def layers(sd, side, head):
    """The dense layers of one side in order: its encoder's init and main layers, then the
    head's (`head`: the head's module names in order)."""
    main = sorted(
        {int(m.group(1)) for n in sd if (m := re.match(rf"{side}_encoder\.main\.(\d+)\.weight", n))}
    )
    names = [f"{side}_encoder.init"] + [f"{side}_encoder.main.{i}" for i in main] + head
    return [(torch.tensor(sd[f"{n}.weight"]), torch.tensor(sd[f"{n}.bias"])) for n in names]


def mlp(ls, x, act):
    for i, (w, b) in enumerate(ls):
        x = x @ w.T + b
        if i + 1 < len(ls):
            x = act(x)
    return x


def main():
    a = argparse.ArgumentParser()
    a.add_argument("exp")
    a.add_argument("--steps", type=int, default=300)
    a.add_argument("--envs", type=int, default=4)
    args = a.parse_args()
    p = drill.load(args.exp)
    assert p.recurrent, "not an LSTM policy"
    cfg = tomllib.loads(p.config)
    act = torch.tanh if cfg["policy"]["model"].get("activation") == "tanh" else torch.relu
    sd = p.state_dict()
    w_ih = torch.tensor(sd["lstm.weight_ih_l0"])
    hidden = w_ih.shape[0] // 4
    lstm = torch.nn.LSTM(w_ih.shape[1], hidden)
    lstm.load_state_dict({k[len("lstm."):]: torch.tensor(v) for k, v in sd.items() if k.startswith("lstm.")})
    actor = layers(sd, "actor", ["actor_head.Q.0.0", "actor_head.Q.1.0"])
    critic = layers(sd, "critic", ["critic_head.main.0", "critic_head.last"])
    env = drill.make_vec(p.env_id, args.envs, seed=0)
    obs, _ = env.reset(seed=0)
    h = torch.zeros(1, args.envs, hidden)
    c = torch.zeros(1, args.envs, hidden)
    p.reset()
    worst, differ, ends = 0.0, 0, 0
    with torch.no_grad():
        for _ in range(args.steps):
            v_drill = p.values(obs)
            a_drill = p(obs)
            out, (h, c) = lstm(torch.tensor(obs)[None], (h, c))
            v = mlp(critic, out[0], act)[:, 0]
            a_torch = mlp(actor, out[0], act).argmax(1).numpy()
            worst = max(worst, float((v - torch.tensor(v_drill)).abs().max()))
            differ += int((a_torch != a_drill).sum())
            obs, _, term, trunc, _ = env.step(a_drill)
            done = term | trunc
            ends += int(done.sum())
            p.reset(done)
            keep = torch.tensor(~done, dtype=torch.float32).view(1, -1, 1)
            h, c = h * keep, c * keep
    print(
        f"{args.steps} steps of {args.envs} copies ({ends} episode ends): values max |diff| {worst:.2e}, "
        f"{differ} of {args.steps * args.envs} actions differ (torch {torch.__version__})"
    )


if __name__ == "__main__":
    main()
