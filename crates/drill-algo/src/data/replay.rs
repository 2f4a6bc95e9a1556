//! [`ReplayBuffer`]: a ring of n-step transitions in structure-of-arrays storage, sampled
//! uniformly or by priority. Observations are stored in their own element type (`f32`
//! vectors, `u8` frames) and actions of any space. Stacked `u8` frames (`[k, h, w]`) are
//! stored once per distinct frame ([`FrameStore`]); sampling rebuilds the stacks.

use super::frame_store::FrameStore;
use super::{SumTree, Transition};
use drill_env::{ActionBuf, ActionSpace, Dtype, Obs, ObsBuf, ObsSpace};
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

pub(super) struct Priorities {
    pub(super) tree: SumTree,
    pub(super) alpha: f64,
    pub(super) max: f64,
}

/// How observations are kept.
pub(super) enum ObsStore {
    /// Whole observations, `capacity * obs_dim` each.
    Rows { obs: ObsBuf, next_obs: ObsBuf },
    /// Stacks of `k` frames as frame ids: slot `i` holds `obs` ids then `next_obs` ids at
    /// `ids[i * 2k..(i + 1) * 2k]`.
    Frames {
        frames: FrameStore,
        k: usize,
        ids: Vec<u32>,
    },
}

/// Fixed-capacity replay storage; the oldest transitions are overwritten first.
/// Saved and restored by `replay_file.rs`.
pub struct ReplayBuffer {
    pub(super) capacity: usize,
    pub(super) obs_dim: usize,
    pub(super) dtype: Dtype,
    pub(super) len: usize,
    pub(super) next: usize,
    pub(super) store: ObsStore,
    pub(super) actions: ActionBuf,
    pub(super) rewards: Vec<f32>,
    pub(super) dones: Vec<f32>,
    pub(super) discounts: Vec<f32>,
    pub(super) priorities: Option<Priorities>,
}

impl ReplayBuffer {
    /// Uniform replay of `capacity` transitions of these spaces; stacked `u8` frames are
    /// stored frame by frame.
    pub fn new(capacity: usize, obs: &ObsSpace, actions: &ActionSpace) -> Self {
        let obs_dim = obs.dim();
        let store = match (obs.dtype, &obs.shape[..]) {
            (Dtype::U8, &[k, h, w]) if k > 1 => ObsStore::Frames {
                frames: FrameStore::new(h * w),
                k,
                ids: vec![0; capacity * 2 * k],
            },
            _ => ObsStore::Rows {
                obs: ObsBuf::zeros(obs.dtype, capacity * obs_dim),
                next_obs: ObsBuf::zeros(obs.dtype, capacity * obs_dim),
            },
        };
        Self {
            capacity,
            obs_dim,
            dtype: obs.dtype,
            len: 0,
            next: 0,
            store,
            actions: ActionBuf::for_space(actions, capacity),
            rewards: vec![0.0; capacity],
            dones: vec![0.0; capacity],
            discounts: vec![0.0; capacity],
            priorities: None,
        }
    }

    /// Proportional prioritized replay with exponent `alpha` (Schaul et al. 2016).
    pub(crate) fn prioritized(
        capacity: usize,
        obs: &ObsSpace,
        actions: &ActionSpace,
        alpha: f64,
    ) -> Self {
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

    /// Bytes held per stored transition (observations, actions, rewards, flags, and the
    /// priority tree), for capacity planning; 0 when empty.
    pub fn bytes_per_transition(&self) -> f64 {
        if self.len == 0 {
            return 0.0;
        }
        // Observations: two rows per slot, or two stacks of frame ids per slot plus the
        // frames themselves, shared by every stored transition.
        let obs = match &self.store {
            ObsStore::Rows { .. } => (2 * self.obs_dim * self.dtype_size()) as f64,
            ObsStore::Frames { frames, k, .. } => {
                (2 * k * 4) as f64 + frames.bytes() as f64 / self.len as f64
            }
        };
        let action = match &self.actions {
            ActionBuf::Discrete(_) => 4,
            ActionBuf::Continuous { dim, .. } => 4 * dim,
        };
        // Reward, done and discount; a sum-tree leaf and its parent under prioritized replay.
        let rest = 3 * 4 + if self.priorities.is_some() { 16 } else { 0 };
        obs + (action + rest) as f64
    }

    fn dtype_size(&self) -> usize {
        match self.dtype {
            Dtype::F32 => 4,
            Dtype::U8 => 1,
        }
    }

    /// Store a transition (new ones get the highest priority seen so far).
    pub fn push(&mut self, t: &Transition<'_>) {
        let (i, d) = (self.next, self.obs_dim);
        match &mut self.store {
            ObsStore::Rows { obs, next_obs } => {
                obs.write(i * d, t.obs);
                next_obs.write(i * d, t.next_obs);
            }
            ObsStore::Frames { frames, k, ids } => {
                let (Obs::U8(o), Obs::U8(n)) = (t.obs, t.next_obs) else {
                    panic!("a frame replay buffer got float observations");
                };
                let slot = &mut ids[i * 2 * *k..(i + 1) * 2 * *k];
                if i < self.len {
                    frames.release(slot);
                }
                let (so, sn) = slot.split_at_mut(*k);
                frames.insert(o, so);
                frames.insert(n, sn);
            }
        }
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
        if out.obs.dtype() != self.dtype {
            out.obs = ObsBuf::new(self.dtype);
            out.next_obs = ObsBuf::new(self.dtype);
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
        for &i in &out.indices {
            match &self.store {
                ObsStore::Rows { obs, next_obs } => {
                    out.obs.extend(obs.as_obs().rows(i..i + 1, d));
                    out.next_obs.extend(next_obs.as_obs().rows(i..i + 1, d));
                }
                ObsStore::Frames { frames, k, ids } => {
                    let (ObsBuf::U8(o), ObsBuf::U8(n)) = (&mut out.obs, &mut out.next_obs) else {
                        unreachable!("frame batches are u8");
                    };
                    let slot = &ids[i * 2 * k..(i + 1) * 2 * k];
                    frames.extend_stack(&slot[..*k], o);
                    frames.extend_stack(&slot[*k..], n);
                }
            }
            out.actions.push(self.actions.get(i));
            out.rewards.push(self.rewards[i]);
            out.dones.push(self.dones[i]);
            out.discounts.push(self.discounts[i]);
        }
    }

    /// Set new priorities `|td| + 1e-6` for sampled slots (no-op for uniform replay).
    pub(crate) fn update_priorities(&mut self, indices: &[usize], td_errors: &[f32]) {
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

    #[test]
    fn frame_dedup_returns_the_same_stacks_as_a_naive_buffer_in_a_fraction_of_the_bytes() {
        // Three streams of 4-frame stacks that shift by one frame per step, episodes of
        // random length restarting with a stack of one repeated frame (as frame stacking does).
        let (k, hw, cap) = (4, 400, 1000);
        let frames = ObsSpace {
            shape: vec![k, 20, 20],
            dtype: Dtype::U8,
        };
        let naive = ObsSpace {
            shape: vec![k * hw],
            dtype: Dtype::U8,
        };
        let space = ActionSpace::Discrete(3);
        let mut dedup = ReplayBuffer::new(cap, &frames, &space);
        let mut plain = ReplayBuffer::new(cap, &naive, &space);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let mut frame = || -> Vec<u8> { (0..hw).map(|_| rng.random()).collect() };
        let mut stacks: Vec<Vec<u8>> = (0..3).map(|_| frame().repeat(k)).collect();
        for t in 0..3000 {
            let e = t % 3;
            let obs = stacks[e].clone();
            let mut next = obs[hw..].to_vec();
            next.extend(frame());
            let done = t % 17 == 5;
            let tr = Transition {
                obs: Obs::U8(&obs),
                action: Action::Discrete(t % 3),
                reward: t as f32,
                next_obs: Obs::U8(&next),
                done,
                discount: 0.99,
            };
            dedup.push(&tr);
            plain.push(&tr);
            stacks[e] = if done { frame().repeat(k) } else { next };
        }
        let (mut a, mut b) = (Batch::default(), Batch::default());
        let mut r1 = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let mut r2 = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        for _ in 0..20 {
            dedup.sample(16, 0.4, &mut r1, &mut a);
            plain.sample(16, 0.4, &mut r2, &mut b);
            assert_eq!(a.indices, b.indices);
            assert_eq!(a.obs, b.obs);
            assert_eq!(a.next_obs, b.next_obs);
            assert_eq!(a.rewards, b.rewards);
        }
        let (d, p) = (dedup.bytes_per_transition(), plain.bytes_per_transition());
        assert!(d < p / 3.0, "dedup {d} bytes/transition vs naive {p}");
        let ObsStore::Frames { frames, .. } = &dedup.store else {
            unreachable!()
        };
        // About one new frame per transition, plus the stacks still being built.
        assert!(
            frames.live() <= cap + 3 * 2 * k + cap / 17 * 2,
            "{} live",
            frames.live()
        );
    }
}
