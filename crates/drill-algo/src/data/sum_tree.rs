//! [`SumTree`]: a binary tree of priorities for proportional prioritized replay.

/// Leaves hold priorities; inner nodes hold the sums of their children.
#[derive(Debug, Clone)]
pub(crate) struct SumTree {
    cap: usize,
    nodes: Vec<f64>,
}

impl SumTree {
    /// A tree with `capacity` leaves, all zero.
    pub(crate) fn new(capacity: usize) -> Self {
        let cap = capacity.next_power_of_two();
        Self {
            cap,
            nodes: vec![0.0; 2 * cap],
        }
    }

    /// Sum of all priorities.
    pub(crate) fn total(&self) -> f64 {
        self.nodes[1]
    }

    /// Priority of leaf `i`.
    pub(crate) fn get(&self, i: usize) -> f64 {
        self.nodes[self.cap + i]
    }

    /// Set leaf `i`'s priority.
    pub(crate) fn set(&mut self, i: usize, priority: f64) {
        let mut k = self.cap + i;
        self.nodes[k] = priority;
        while k > 1 {
            k /= 2;
            self.nodes[k] = self.nodes[2 * k] + self.nodes[2 * k + 1];
        }
    }

    /// The leaf where the prefix sum passes `mass` (in `[0, total)`).
    pub(crate) fn find(&self, mut mass: f64) -> usize {
        let mut k = 1;
        while k < self.cap {
            let left = self.nodes[2 * k];
            if mass < left || self.nodes[2 * k + 1] <= 0.0 {
                k *= 2;
            } else {
                mass -= left;
                k = 2 * k + 1;
            }
        }
        k - self.cap
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_leaves_by_prefix_mass() {
        let mut t = SumTree::new(5);
        for (i, p) in [1.0, 0.0, 3.0, 2.0, 4.0].into_iter().enumerate() {
            t.set(i, p);
        }
        assert_eq!(t.total(), 10.0);
        let found: Vec<usize> = [0.0, 0.99, 1.0, 3.99, 4.0, 5.99, 6.0, 9.99]
            .iter()
            .map(|&m| t.find(m))
            .collect();
        assert_eq!(found, vec![0, 0, 2, 2, 3, 3, 4, 4]);
        t.set(2, 0.0);
        assert_eq!(t.total(), 7.0);
        assert_eq!(t.find(1.5), 3);
    }
}
