//! [`ReplayBuffer`]: a ring of n-step transitions in structure-of-arrays storage, sampled
//! uniformly or by priority.

use super::{SumTree, Transition};
use rand::Rng;

/// A sampled minibatch; its buffers are reused between samples.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    /// `[batch, obs_dim]`.
    pub obs: Vec<f32>,
    /// `[batch, obs_dim]`.
    pub next_obs: Vec<f32>,
    /// `[batch]` action indices.
    pub actions: Vec<i64>,
    /// `[batch]` n-step discounted rewards.
    pub rewards: Vec<f32>,
    /// `[batch]` 1.0 where the episode terminated within the n steps.
    pub dones: Vec<f32>,
    /// `[batch]` `gamma^m` for the bootstrap term.
    pub discounts: Vec<f32>,
    /// `[batch]` importance-sampling weights (1.0 for uniform replay).
    pub weights: Vec<f32>,
    /// `[batch]` buffer slots, for priority updates.
    pub indices: Vec<usize>,
}

struct Priorities {
    tree: SumTree,
    alpha: f64,
    max: f64,
}

/// Fixed-capacity replay storage; the oldest transitions are overwritten first.
pub struct ReplayBuffer {
    capacity: usize,
    obs_dim: usize,
    len: usize,
    next: usize,
    obs: Vec<f32>,
    next_obs: Vec<f32>,
    actions: Vec<u32>,
    rewards: Vec<f32>,
    dones: Vec<f32>,
    discounts: Vec<f32>,
    priorities: Option<Priorities>,
}

impl ReplayBuffer {
    /// Uniform replay of `capacity` transitions.
    pub fn new(capacity: usize, obs_dim: usize) -> Self {
        Self {
            capacity,
            obs_dim,
            len: 0,
            next: 0,
            obs: vec![0.0; capacity * obs_dim],
            next_obs: vec![0.0; capacity * obs_dim],
            actions: vec![0; capacity],
            rewards: vec![0.0; capacity],
            dones: vec![0.0; capacity],
            discounts: vec![0.0; capacity],
            priorities: None,
        }
    }

    /// Proportional prioritized replay with exponent `alpha` (Schaul et al. 2016).
    pub fn prioritized(capacity: usize, obs_dim: usize, alpha: f64) -> Self {
        let mut b = Self::new(capacity, obs_dim);
        b.priorities = Some(Priorities {
            tree: SumTree::new(capacity),
            alpha,
            max: 1.0,
        });
        b
    }

    /// Transitions stored.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Nothing stored yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Store a transition (new ones get the highest priority seen so far).
    pub fn push(&mut self, t: &Transition<'_>) {
        let (i, d) = (self.next, self.obs_dim);
        self.obs[i * d..(i + 1) * d].copy_from_slice(t.obs);
        self.next_obs[i * d..(i + 1) * d].copy_from_slice(t.next_obs);
        self.actions[i] = t.action;
        self.rewards[i] = t.reward;
        self.dones[i] = if t.done { 1.0 } else { 0.0 };
        self.discounts[i] = t.discount;
        if let Some(p) = &mut self.priorities {
            p.tree.set(i, p.max.powf(p.alpha));
        }
        self.next = (self.next + 1) % self.capacity;
        self.len = (self.len + 1).min(self.capacity);
    }

    /// Sample `batch_size` transitions (with replacement) into `out`. `beta` is the
    /// importance-sampling exponent (ignored for uniform replay).
    pub fn sample(&self, batch_size: usize, beta: f64, rng: &mut impl Rng, out: &mut Batch) {
        assert!(self.len > 0, "sampling from an empty replay buffer");
        let d = self.obs_dim;
        out.indices.clear();
        out.weights.clear();
        match &self.priorities {
            None => {
                out.indices
                    .extend((0..batch_size).map(|_| rng.random_range(0..self.len)));
                out.weights.resize(batch_size, 1.0);
            }
            Some(p) => {
                // Stratified: one draw per equal slice of the total mass.
                let total = p.tree.total();
                let seg = total / batch_size as f64;
                let min_prob = (0..self.len)
                    .map(|i| p.tree.get(i))
                    .fold(f64::INFINITY, f64::min)
                    / total;
                let max_w = (self.len as f64 * min_prob).powf(-beta);
                for k in 0..batch_size {
                    let mass = (k as f64 + rng.random::<f64>()) * seg;
                    let i = p
                        .tree
                        .find(mass.min(total * (1.0 - 1e-12)))
                        .min(self.len - 1);
                    let prob = p.tree.get(i) / total;
                    out.indices.push(i);
                    out.weights
                        .push(((self.len as f64 * prob).powf(-beta) / max_w) as f32);
                }
            }
        }
        out.obs.clear();
        out.next_obs.clear();
        out.actions.clear();
        out.rewards.clear();
        out.dones.clear();
        out.discounts.clear();
        for &i in &out.indices {
            out.obs.extend_from_slice(&self.obs[i * d..(i + 1) * d]);
            out.next_obs
                .extend_from_slice(&self.next_obs[i * d..(i + 1) * d]);
            out.actions.push(i64::from(self.actions[i]));
            out.rewards.push(self.rewards[i]);
            out.dones.push(self.dones[i]);
            out.discounts.push(self.discounts[i]);
        }
    }

    /// Set new priorities `|td| + 1e-6` for sampled slots (no-op for uniform replay).
    pub fn update_priorities(&mut self, indices: &[usize], td_errors: &[f32]) {
        if let Some(p) = &mut self.priorities {
            for (&i, &td) in indices.iter().zip(td_errors) {
                let prio = f64::from(td.abs()) + 1e-6;
                p.max = p.max.max(prio);
                p.tree.set(i, prio.powf(p.alpha));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn t(v: f32) -> ([f32; 2], [f32; 2]) {
        ([v, -v], [v + 1.0, 0.0])
    }

    #[test]
    fn ring_overwrites_oldest_and_samples_whole_transitions() {
        let mut b = ReplayBuffer::new(3, 2);
        for v in 0..5 {
            let (o, n) = t(v as f32);
            b.push(&Transition {
                obs: &o,
                action: v,
                reward: v as f32 * 10.0,
                next_obs: &n,
                done: v == 4,
                discount: 0.9,
            });
        }
        assert_eq!(b.len(), 3);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
        let mut batch = Batch::default();
        b.sample(64, 0.4, &mut rng, &mut batch);
        let mut seen = std::collections::BTreeSet::new();
        for k in 0..64 {
            let a = batch.actions[k];
            seen.insert(a);
            assert!((2..5).contains(&a), "only the newest three remain");
            assert_eq!(batch.obs[2 * k..2 * k + 2], [a as f32, -(a as f32)]);
            assert_eq!(batch.next_obs[2 * k], a as f32 + 1.0);
            assert_eq!(batch.rewards[k], a as f32 * 10.0);
            assert_eq!(batch.dones[k], if a == 4 { 1.0 } else { 0.0 });
            assert_eq!(batch.weights[k], 1.0);
        }
        assert_eq!(seen.len(), 3);
    }

    #[test]
    fn priorities_bias_sampling_and_weights_correct_it() {
        let mut b = ReplayBuffer::prioritized(4, 2, 1.0);
        for v in 0..4 {
            let (o, n) = t(v as f32);
            b.push(&Transition {
                obs: &o,
                action: v,
                reward: 0.0,
                next_obs: &n,
                done: false,
                discount: 1.0,
            });
        }
        b.update_priorities(&[0, 1, 2, 3], &[9.0, 1.0, 1.0, 1.0]);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let mut batch = Batch::default();
        let mut count0 = 0;
        for _ in 0..100 {
            b.sample(12, 1.0, &mut rng, &mut batch);
            count0 += batch.actions.iter().filter(|&&a| a == 0).count();
            for (a, w) in batch.actions.iter().zip(&batch.weights) {
                // With beta 1 the weights are 1/(N p) normalised by the largest: 1/9 for slot 0.
                let want = if *a == 0 { 1.0 / 9.0 } else { 1.0 };
                assert!((w - want).abs() < 1e-4, "slot {a}: weight {w}");
            }
        }
        let frac = count0 as f64 / 1200.0;
        assert!(
            (frac - 0.75).abs() < 0.05,
            "slot 0 holds 3/4 of the mass, drawn {frac}"
        );
    }
}
