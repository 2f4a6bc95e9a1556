//! [`DistributedSampler`]: torch's `DistributedSampler` for dataset-style training.

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

/// Splits the indices `0..len` of a dataset into disjoint, equally long shards, one per rank.
///
/// As torch's: with `shuffle`, the order is a permutation seeded by `seed + epoch`, the same on
/// every rank, so shards stay disjoint; [`Self::set_epoch`] reshuffles. Without `drop_last`
/// the list is padded by repeating its start so every rank gets `ceil(len / replicas)`
/// indices; with it, the tail is dropped to `floor(len / replicas)` each.
#[derive(Debug, Clone)]
pub struct DistributedSampler {
    len: usize,
    replicas: usize,
    rank: usize,
    shuffle: bool,
    seed: u64,
    epoch: u64,
    drop_last: bool,
}

impl DistributedSampler {
    /// A sampler over `len` items for `rank` of `replicas` (shuffled, padded).
    pub fn new(len: usize, replicas: usize, rank: usize) -> Self {
        assert!(
            rank < replicas,
            "rank {rank} is not below the {replicas} replicas"
        );
        Self {
            len,
            replicas,
            rank,
            shuffle: true,
            seed: 0,
            epoch: 0,
            drop_last: false,
        }
    }

    /// Shuffle or keep the dataset order.
    pub fn shuffle(mut self, on: bool) -> Self {
        self.shuffle = on;
        self
    }

    /// The shuffling seed (must be the same on every rank).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Drop the tail instead of padding.
    pub fn drop_last(mut self, on: bool) -> Self {
        self.drop_last = on;
        self
    }

    /// Use the permutation of `epoch` (call at the start of every epoch).
    pub fn set_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
    }

    /// Indices per rank.
    pub(crate) fn num_samples(&self) -> usize {
        if self.drop_last {
            self.len / self.replicas
        } else {
            self.len.div_ceil(self.replicas)
        }
    }

    /// This rank's indices for the current epoch.
    pub fn indices(&self) -> Vec<usize> {
        let mut all: Vec<usize> = (0..self.len).collect();
        if self.shuffle {
            all.shuffle(&mut ChaCha8Rng::seed_from_u64(
                self.seed.wrapping_add(self.epoch),
            ));
        }
        let total = self.num_samples() * self.replicas;
        if total > all.len() && !all.is_empty() {
            let pad: Vec<usize> = all
                .iter()
                .cycle()
                .take(total - all.len())
                .copied()
                .collect();
            all.extend(pad);
        }
        all.truncate(total);
        all.into_iter()
            .skip(self.rank)
            .step_by(self.replicas)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_disjoint_cover_everything_and_are_padded_equally() {
        for (len, n) in [(10, 3), (9, 3), (1, 4), (100, 7)] {
            let shards: Vec<Vec<usize>> = (0..n)
                .map(|r| DistributedSampler::new(len, n, r).seed(5).indices())
                .collect();
            let per = len.div_ceil(n);
            assert!(shards.iter().all(|s| s.len() == per), "{shards:?}");
            let mut seen: Vec<usize> = shards.concat();
            // Padding repeats exactly (total - len) indices; everything else appears once.
            seen.sort();
            let mut uniq = seen.clone();
            uniq.dedup();
            assert_eq!(uniq, (0..len).collect::<Vec<_>>());
            assert_eq!(seen.len() - uniq.len(), per * n - len);
        }
    }

    #[test]
    fn set_epoch_reshuffles_identically_on_every_rank() {
        let mut a = DistributedSampler::new(50, 2, 0).seed(1);
        let mut b = DistributedSampler::new(50, 2, 1).seed(1);
        let (a0, b0) = (a.indices(), b.indices());
        a.set_epoch(1);
        b.set_epoch(1);
        let (a1, b1) = (a.indices(), b.indices());
        assert_ne!(a0, a1, "a new epoch gives a new order");
        for (x, y) in [(&a0, &b0), (&a1, &b1)] {
            assert!(x.iter().all(|i| !y.contains(i)), "disjoint within an epoch");
        }
        assert_eq!(
            DistributedSampler::new(50, 2, 1).seed(1).indices(),
            b0,
            "deterministic"
        );
    }

    #[test]
    fn drop_last_and_no_shuffle() {
        let s = DistributedSampler::new(10, 3, 1)
            .shuffle(false)
            .drop_last(true);
        assert_eq!(s.indices(), vec![1, 4, 7]);
        let s = DistributedSampler::new(10, 3, 2).shuffle(false);
        assert_eq!(s.indices(), vec![2, 5, 8, 1]);
    }
}
