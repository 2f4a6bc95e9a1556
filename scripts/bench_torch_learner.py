"""The PyTorch anchor for `drill bench learner`: the same nets, batches and update steps, timed
the same way (median over --iters after a warm-up), printed in drill's table format so
`scripts/bench_learner_vs_torch.sh` can put both side by side.

    python3 -m venv /tmp/tv && /tmp/tv/bin/pip install torch numpy
    /tmp/tv/bin/python scripts/bench_torch_learner.py [--threads 1] [--case NAME] [--iters N]

Cases (drill's names):
- nature-cnn-update: Nature-DQN CNN (conv 32x8x8/4, 64x4x4/2, 64x3x3/1, 512, 6 actions),
  4x84x84 frames, batch 32: target-net forward, online forward, gather, MSE, backward, Adam.
- pong-dqn-update: DI-engine's Pong DQN (`pong_dqn_config.py`: ConvEncoder 128-128-512 with
  its final Linear(25088, 512), dueling head 512-512-6 / 512-512-1), batch 32, DI-engine's
  double-DQN step: online and target forwards on next_obs (no grad), online forward on obs,
  gather, MSE, backward, Adam.
- dqn-update: the CartPole net 4-128-128-2, batch 64, the same double-DQN step.
- lstm-ppo-update: CleanRL ppo_atari_lstm's recurrent core and update: 512 features (the CNN's
  output there; random here) -> nn.LSTM(512, 128) -> Linear(128, 6) and Linear(128, 1), a
  minibatch of 2 sequences x 128 steps with episode ends (CleanRL's `get_states`: the LSTM
  called once per step, its state zeroed where an episode starts), PPO's clipped loss with a
  clipped value loss and entropy, backward, gradient-norm clip 0.5, Adam.
- lstm-ppo-update-one-call: the same with nn.LSTM called once over each whole sequence (no
  resets inside: the fastest PyTorch runs this LSTM, not CleanRL's semantics).
"""

import argparse
import statistics
import time

import torch
from torch import nn


def nature_cnn(actions):
    return nn.Sequential(
        nn.Conv2d(4, 32, 8, stride=4), nn.ReLU(),
        nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
        nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 512), nn.ReLU(),
        nn.Linear(512, actions),
    )


class Dueling(nn.Module):
    """DI-engine's DQN with a ConvEncoder (or an MLP) and its DuelingHead."""

    def __init__(self, trunk, hidden, actions):
        super().__init__()
        self.trunk = trunk
        self.a = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, actions))
        self.v = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, x):
        h = self.trunk(x)
        a = self.a(h)
        return self.v(h) + a - a.mean(dim=1, keepdim=True)


def ding_pong(actions):
    # ding/model/common/encoder.py ConvEncoder([4, 84, 84], [128, 128, 512]): ReLU after each
    # conv, then Linear(flat, 512) with no activation before the head.
    trunk = nn.Sequential(
        nn.Conv2d(4, 128, 8, stride=4), nn.ReLU(),
        nn.Conv2d(128, 128, 4, stride=2), nn.ReLU(),
        nn.Conv2d(128, 512, 3, stride=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(512 * 7 * 7, 512),
    )
    return Dueling(trunk, 512, actions)


def cartpole():
    return nn.Sequential(
        nn.Linear(4, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 2)
    )


def td_step(online, opt, obs, act, y):
    """One gradient step of Q(obs, act) towards the target y: MSE, backward, Adam."""
    q = online(obs).gather(1, act).squeeze(1)
    loss = ((q - y) ** 2).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def nature_step(shape, bs, actions):
    online, target = nature_cnn(actions), nature_cnn(actions)
    opt = torch.optim.Adam(online.parameters(), lr=1e-4, eps=1e-8)
    obs = torch.rand(bs, *shape)
    act = (torch.arange(bs) % actions).unsqueeze(1)

    def step():
        with torch.no_grad():
            y = target(obs).max(dim=1).values * 0.99 + 1.0
        td_step(online, opt, obs, act, y)

    return step


def double_dqn_step(make, shape, bs, actions, gamma):
    online, target = make(), make()
    target.load_state_dict(online.state_dict())
    opt = torch.optim.Adam(online.parameters(), lr=1e-4, eps=1e-8)
    obs, next_obs = torch.rand(bs, *shape), torch.rand(bs, *shape)
    act = torch.randint(0, actions, (bs, 1))
    rew = torch.ones(bs)
    done = (torch.arange(bs) % 10 == 0).float()

    def step():
        with torch.no_grad():
            a_next = online(next_obs).argmax(dim=1, keepdim=True)
            q_next = target(next_obs).gather(1, a_next).squeeze(1)
            y = rew + gamma * (1.0 - done) * q_next
        td_step(online, opt, obs, act, y)

    return step


class LstmAgent(nn.Module):
    """CleanRL ppo_atari_lstm's Agent after its CNN: the LSTM (orthogonal weights, zero
    biases) and the two linear heads."""

    def __init__(self, features=512, hidden=128, actions=6):
        super().__init__()
        self.lstm = nn.LSTM(features, hidden)
        for name, param in self.lstm.named_parameters():
            if "bias" in name:
                nn.init.constant_(param, 0)
            elif "weight" in name:
                nn.init.orthogonal_(param, 1.0)
        self.actor = nn.Linear(hidden, actions)
        self.critic = nn.Linear(hidden, 1)

    def states(self, x, state, done, one_call):
        batch = state[0].shape[1]
        x = x.reshape((-1, batch, x.shape[-1]))
        if one_call:
            out, _ = self.lstm(x, state)
            return torch.flatten(out, 0, 1)
        done = done.reshape((-1, batch))
        new = []
        for h, d in zip(x, done):
            keep = (1.0 - d).view(1, -1, 1)
            h, state = self.lstm(h.unsqueeze(0), (keep * state[0], keep * state[1]))
            new += [h]
        return torch.flatten(torch.cat(new), 0, 1)


def lstm_ppo_step(one_call, seqs=2, steps=128, features=512, actions=6):
    agent = LstmAgent(features, 128, actions)
    opt = torch.optim.Adam(agent.parameters(), lr=2.5e-4, eps=1e-5)
    n = seqs * steps
    x = torch.rand(steps, seqs, features).reshape(n, features)
    done = (torch.arange(n) % 37 == 0).float()
    state = (torch.zeros(1, seqs, 128), torch.zeros(1, seqs, 128))
    act = torch.randint(0, actions, (n,))
    old_logp = torch.rand(n) * 0.5 - 2.0
    adv, ret, old_v = torch.rand(n) * 2 - 1, torch.rand(n) * 2 - 1, torch.rand(n) * 2 - 1
    clip = 0.1

    def step():
        h = agent.states(x, state, done, one_call)
        dist = torch.distributions.Categorical(logits=agent.actor(h))
        logp, entropy = dist.log_prob(act), dist.entropy()
        v = agent.critic(h).view(-1)
        ratio = (logp - old_logp).exp()
        a = (adv - adv.mean()) / (adv.std() + 1e-8)
        pg = torch.max(-a * ratio, -a * torch.clamp(ratio, 1 - clip, 1 + clip)).mean()
        v_clipped = old_v + torch.clamp(v - old_v, -clip, clip)
        v_loss = 0.5 * torch.max((v - ret) ** 2, (v_clipped - ret) ** 2).mean()
        loss = pg - 0.01 * entropy.mean() + 0.5 * v_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
        opt.step()

    return step


CASES = {
    # name: (make the step, default iters, note)
    "dqn-update": (
        lambda: double_dqn_step(cartpole, (4,), 64, 2, 0.97), 2000,
        "4-128-128-2, batch 64, Adam, double-DQN target"),
    "nature-cnn-update": (
        lambda: nature_step((4, 84, 84), 32, 6), 30, "4x84x84, batch 32, Adam"),
    "pong-dqn-update": (
        lambda: double_dqn_step(lambda: ding_pong(6), (4, 84, 84), 32, 6, 0.99 ** 3), 10,
        "DI-engine pong net 128-128-512 + dueling, 4x84x84, batch 32, double DQN, Adam"),
    "lstm-ppo-update": (
        lambda: lstm_ppo_step(False), 20,
        "512 -> LSTM 128 -> 6 + 1, 2 x 128 steps, CleanRL's per-step LSTM calls, PPO loss, Adam"),
    "lstm-ppo-update-one-call": (
        lambda: lstm_ppo_step(True), 20,
        "512 -> LSTM 128 -> 6 + 1, 2 x 128 steps, one nn.LSTM call per sequence, PPO loss, Adam"),
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--case")
    p.add_argument("--iters", type=int)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    for name, (make, iters, note) in CASES.items():
        if a.case and a.case != name:
            continue
        n = a.iters or iters
        step = make()
        for _ in range(min(n, 50) if n > 2 else 1):
            step()
        times = []
        for _ in range(n):
            t = time.perf_counter()
            step()
            times.append((time.perf_counter() - t) * 1e6)
        us = statistics.median(times)
        print(f"{name:<28} {us:>14.3f} us         ({n} iters) torch {torch.__version__}, "
              f"{note}, {a.threads} thread(s)")


if __name__ == "__main__":
    main()
