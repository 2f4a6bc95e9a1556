"""CleanRL's `ppo_atari` in PyTorch, on drill's vector environments (`drill.make_vec`) or, to
compare, ale-py's `AtariVectorEnv`: the same logic and hyper-parameters as `configs/pong_ppo.toml`
(8 envs x 128 steps, 4 epochs x 4 minibatches of 256, lr 2.5e-4 annealed over 10 M env steps,
clip 0.1 for policy and value, entropy 0.01, value 0.5, GAE 0.99/0.95, advantage
normalisation, gradient norm 0.5, the Nature CNN with orthogonal init). Both env sources get
DI-engine's training chain (noop 30, frame skip 4 with max-pool, fire reset, 84x84 grayscale,
reward clipping, stack 4, episodic life, no sticky actions).

    pip install torch ale-py==0.12.1 && MATURIN_PEP517_ARGS="--features atari" pip install ./python
    ALE_ROM_DIR=... python examples/python/ppo_atari.py [--envs drill|ale-py] [--total-steps N]
        [--iterations N] [--threads 2] [--env-threads 2] [--no-fire-reset] [--log-dir DIR]

It prints env steps/s per iteration and each finished episode's return, and at the end the
median env steps/s after the first iteration (the anchor
`scripts/bench_pong_ppo_vs_torch.sh` compares `drill train` with, on ale-py).
`--threads` is torch's intra-op threads (measure 1 and 2 on 2 cores). `--no-fire-reset` turns
both sources' fire reset off, where their frames agree pixel for pixel through whole games
(`scripts/compare_atari_vec.py --games N`). `--log-dir DIR` writes
the returns (`charts/episodic_return`) and the rate (`charts/sps`) to `DIR/metrics.jsonl` in
drill's format, so that `drill plot --tag charts/episodic_return DIR RUN...` draws this run
beside drill's own (a folder without a `config.toml` is labelled with its name).
"""

import argparse
import json
import os
import statistics
import time

import numpy as np
import torch
import torch.nn as nn
from torch.distributions.categorical import Categorical


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, actions):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512)),
            nn.ReLU(),
        )
        self.actor = layer_init(nn.Linear(512, actions), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1)

    def get_value(self, x):
        return self.critic(self.network(x / 255.0))

    def get_action_and_value(self, x, action=None):
        hidden = self.network(x / 255.0)
        probs = Categorical(logits=self.actor(hidden))
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(hidden)


def make_envs(source, game, num_envs, threads, seed, fire_reset=True):
    """8 copies of `game` behind DI-engine's training chain, from drill or from ale-py."""
    if source == "drill":
        import drill

        name = "".join(w.capitalize() for w in game.split("_"))
        return drill.make_vec(
            f"{name}NoFrameskip-v4", num_envs, seed=seed, num_threads=threads, fire_reset=fire_reset
        )
    import ale_py

    return ale_py.vector_env.AtariVectorEnv(
        game=game,
        num_envs=num_envs,
        num_threads=threads,
        repeat_action_probability=0.0,
        episodic_life=True,
        reward_clipping=True,
        use_fire_reset=fire_reset,
    )


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--game", default="pong")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--env-threads", type=int, default=2)
    p.add_argument("--envs", choices=("drill", "ale-py"), default="drill")
    p.add_argument("--total-steps", type=int, default=10_000_000)
    p.add_argument("--iterations", type=int, default=None, help="stop after N iterations (default: total steps)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--no-fire-reset",
        action="store_true",
        help="no FIRE at a reset (drill: fire_reset=False; ale-py: use_fire_reset=False)",
    )
    p.add_argument("--log-dir", default=None, help="write DIR/metrics.jsonl as drill does")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    num_envs, num_steps, epochs, minibatches = 8, 128, 4, 4
    lr, gamma, lam, clip, ent, vf, max_norm = 2.5e-4, 0.99, 0.95, 0.1, 0.01, 0.5, 0.5
    total_steps = a.total_steps
    batch = num_envs * num_steps
    iterations = a.iterations or total_steps // batch
    mb_size = batch // minibatches

    envs = make_envs(a.envs, a.game, num_envs, a.env_threads, a.seed, not a.no_fire_reset)
    n_act = envs.single_action_space.n
    agent = Agent(n_act)
    opt = torch.optim.Adam(agent.parameters(), lr=lr, eps=1e-5)
    obs = torch.zeros((num_steps, num_envs, 4, 84, 84), dtype=torch.uint8)
    actions = torch.zeros((num_steps, num_envs), dtype=torch.long)
    logprobs = torch.zeros((num_steps, num_envs))
    rewards = torch.zeros((num_steps, num_envs))
    dones = torch.zeros((num_steps, num_envs))
    values = torch.zeros((num_steps, num_envs))
    next_obs, _ = envs.reset(seed=a.seed)
    next_obs = torch.as_tensor(next_obs)
    next_done = torch.zeros(num_envs)
    step = 0
    rates = []
    running = np.zeros(num_envs)
    log = None
    if a.log_dir:
        os.makedirs(a.log_dir, exist_ok=True)
        log = open(os.path.join(a.log_dir, "metrics.jsonl"), "w")

    def record(tag, value):
        if log:
            row = {"tag": tag, "step": step, "value": float(value), "wall_time": time.time()}
            log.write(json.dumps(row) + "\n")
            log.flush()

    for it in range(1, iterations + 1):
        t0 = time.perf_counter()
        opt.param_groups[0]["lr"] = lr * (1.0 - (it - 1.0) * batch / total_steps)
        for s in range(num_steps):
            step += num_envs
            obs[s] = next_obs
            dones[s] = next_done
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs.float())
                values[s] = value.flatten()
            actions[s] = action
            logprobs[s] = logprob
            o, r, term, trunc, _ = envs.step(action.numpy())
            rewards[s] = torch.as_tensor(r, dtype=torch.float32)
            next_obs = torch.as_tensor(o)
            done = np.logical_or(term, trunc)
            next_done = torch.as_tensor(done, dtype=torch.float32)
            running += r
            for i in np.flatnonzero(done):
                print(f"env step {step}: episode return {running[i]:.0f}", flush=True)
                record("charts/episodic_return", running[i])
                running[i] = 0
        with torch.no_grad():
            next_value = agent.get_value(next_obs.float()).reshape(1, -1)
            adv = torch.zeros_like(rewards)
            last = 0
            for t in reversed(range(num_steps)):
                if t == num_steps - 1:
                    nonterminal, nextvalues = 1.0 - next_done, next_value
                else:
                    nonterminal, nextvalues = 1.0 - dones[t + 1], values[t + 1]
                delta = rewards[t] + gamma * nextvalues * nonterminal - values[t]
                adv[t] = last = delta + gamma * lam * nonterminal * last
            returns = adv + values
        b_obs = obs.reshape((-1, 4, 84, 84))
        b_logprobs, b_actions = logprobs.reshape(-1), actions.reshape(-1)
        b_adv, b_returns, b_values = adv.reshape(-1), returns.reshape(-1), values.reshape(-1)
        inds = np.arange(batch)
        for _ in range(epochs):
            np.random.shuffle(inds)
            for start in range(0, batch, mb_size):
                mb = inds[start : start + mb_size]
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(
                    b_obs[mb].float(), b_actions[mb]
                )
                logratio = newlogprob - b_logprobs[mb]
                ratio = logratio.exp()
                mb_adv = b_adv[mb]
                mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
                pg_loss = torch.max(
                    -mb_adv * ratio, -mb_adv * torch.clamp(ratio, 1 - clip, 1 + clip)
                ).mean()
                newvalue = newvalue.view(-1)
                v_unclipped = (newvalue - b_returns[mb]) ** 2
                v_clipped = b_values[mb] + torch.clamp(newvalue - b_values[mb], -clip, clip)
                v_loss = 0.5 * torch.max(v_unclipped, (v_clipped - b_returns[mb]) ** 2).mean()
                loss = pg_loss - ent * entropy.mean() + v_loss * vf
                opt.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), max_norm)
                opt.step()
        rate = batch / (time.perf_counter() - t0)
        if it > 1:
            rates.append(rate)
        print(f"iteration {it}: {step} env steps, {rate:.1f} env steps/s", flush=True)
        record("charts/sps", rate)
    envs.close()
    print(
        f"torch ppo_atari on {a.envs}: median {statistics.median(rates):.1f} env steps/s after "
        f"the first iteration ({a.threads} torch threads, {a.env_threads} env threads)"
    )


if __name__ == "__main__":
    main()
