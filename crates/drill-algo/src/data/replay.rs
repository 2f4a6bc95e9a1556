//! [`ReplayBuffer`]: a ring of n-step transitions in structure-of-arrays storage, sampled
//! uniformly or by priority. Observations are stored in their own element type (`f32`
//! vectors, `u8` frames) and actions of any space.

use super::{SumTree, Transition};
use drill_env::{ActionBuf, ActionSpace, ObsBuf, ObsSpace};
use rand::Rng;

/// A sampled minibatch; its buffers are reused between samples.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    /// `[batch, obs_dim]`.
    pub obs: ObsBuf,
    /// `[batch, obs_dim]`.
    pub next_obs: ObsBuf,
    /// `[batch]` actions.
    pub actions: ActionBuf,
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

impl Batch {
    /// Transitions held.
    pub fn len(&self) -> usize {
        self.rewards.len()
    }

    /// None held.
    pub fn is_empty(&self) -> bool {
        self.rewards.is_empty()
    }
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
    obs: ObsBuf,
    next_obs: ObsBuf,
    actions: ActionBuf,
    rewards: Vec<f32>,
    dones: Vec<f32>,
    discounts: Vec<f32>,
    priorities: Option<Priorities>,
}

impl ReplayBuffer {
    /// Uniform replay of `capacity` transitions of these spaces.
    pub fn new(capacity: usize, obs: &ObsSpace, actions: &ActionSpace) -> Self {
        let obs_dim = obs.dim();
        Self {
            capacity,
            obs_dim,
            len: 0,
            next: 0,
            obs: ObsBuf::zeros(obs.dtype, capacity * obs_dim),
            next_obs: ObsBuf::zeros(obs.dtype, capacity * obs_dim),
            actions: ActionBuf::for_space(actions, capacity),
            rewards: vec![0.0; capacity],
            dones: vec![0.0; capacity],
            discounts: vec![0.0; capacity],
            priorities: None,
        }
    }

    /// Proportional prioritized replay with exponent `alpha` (Schaul et al. 2016).
    pub fn prioritized(capacity: usize, obs: &ObsSpace, actions: &ActionSpace, alpha: f64) -> Self {
        let mut b = Self::new(capacity, obs, actions);
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
        self.obs.write(i * d, t.obs);
        self.next_obs.write(i * d, t.next_obs);
        match (&mut self.actions, t.action) {
            (ActionBuf::Discrete(a), drill_env::Action::Discrete(x)) => a[i] = x as u32,
            (ActionBuf::Continuous { dim, values }, drill_env::Action::Continuous(x)) => {
                values[i * *dim..(i + 1) * *dim].copy_from_slice(x)
            }
            (_, a) => panic!("replay buffer of another action space got {a:?}"),
        }
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
        if out.obs.dtype() != self.obs.dtype() {
            out.obs = ObsBuf::new(self.obs.dtype());
            out.next_obs = ObsBuf::new(self.obs.dtype());
        }
        if std::mem::discriminant(&out.actions) != std::mem::discriminant(&self.actions) {
            out.actions = self.actions.empty_like();
        }
        out.obs.clear();
        out.next_obs.clear();
        out.actions.clear();
        out.rewards.clear();
        out.dones.clear();
        out.discounts.clear();
        let (obs, next_obs) = (self.obs.as_obs(), self.next_obs.as_obs());
        for &i in &out.indices {
            out.obs.extend(obs.rows(i..i + 1, d));
            out.next_obs.extend(next_obs.rows(i..i + 1, d));
            out.actions.push(self.actions.get(i));
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
    use drill_env::{Action, Obs};

    fn discrete(capacity: usize) -> ReplayBuffer {
        ReplayBuffer::new(capacity, &ObsSpace::vector(2), &ActionSpace::Discrete(8))
    }

    fn actions(b: &Batch) -> &[u32] {
        let ActionBuf::Discrete(a) = &b.actions else {
            unreachable!()
        };
        a
    }
    use rand::SeedableRng;

    fn t(v: f32) -> ([f32; 2], [f32; 2]) {
        ([v, -v], [v + 1.0, 0.0])
    }

    #[test]
    fn ring_overwrites_oldest_and_samples_whole_transitions() {
        let mut b = discrete(3);
        for v in 0..5 {
            let (o, n) = t(v as f32);
            b.push(&Transition {
                obs: Obs::F32(&o),
                action: Action::Discrete(v),
                reward: v as f32 * 10.0,
                next_obs: Obs::F32(&n),
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
            let a = actions(&batch)[k] as usize;
            seen.insert(a);
            assert!((2..5).contains(&a), "only the newest three remain");
            assert_eq!(
                batch.obs.as_obs().f32()[2 * k..2 * k + 2],
                [a as f32, -(a as f32)]
            );
            assert_eq!(batch.next_obs.as_obs().f32()[2 * k], a as f32 + 1.0);
            assert_eq!(batch.rewards[k], a as f32 * 10.0);
            assert_eq!(batch.dones[k], if a == 4 { 1.0 } else { 0.0 });
            assert_eq!(batch.weights[k], 1.0);
        }
        assert_eq!(seen.len(), 3);
    }

    #[test]
    fn priorities_bias_sampling_and_weights_correct_it() {
        let mut b =
            ReplayBuffer::prioritized(4, &ObsSpace::vector(2), &ActionSpace::Discrete(8), 1.0);
        for v in 0..4 {
            let (o, n) = t(v as f32);
            b.push(&Transition {
                obs: Obs::F32(&o),
                action: Action::Discrete(v),
                reward: 0.0,
                next_obs: Obs::F32(&n),
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
            count0 += actions(&batch).iter().filter(|&&a| a == 0).count();
            for (a, w) in actions(&batch).iter().zip(&batch.weights) {
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
