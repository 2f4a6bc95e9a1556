//! [`Checker`]: a config's values checked table by table (each table's `check` sits next to
//! its struct: `tree.rs`, `policy.rs`), the first bad one named by its key path.

use crate::ConfigError;

/// Most environment copies of one kind in one process.
pub(crate) const MAX_ENVS: u64 = 65_536;
/// Largest batch.
pub(crate) const MAX_BATCH: u64 = 1 << 20;
/// Widest layer.
pub(crate) const MAX_WIDTH: u64 = 1 << 16;

/// Collects the first bad value, naming its key path.
pub(crate) struct Checker<'a> {
    source: &'a str,
    first: Option<ConfigError>,
}

impl<'a> Checker<'a> {
    /// A checker for the config read from `source`.
    pub(crate) fn new(source: &'a str) -> Self {
        Checker {
            source,
            first: None,
        }
    }
    /// The first bad value found, if any.
    pub(crate) fn result(self) -> Result<(), ConfigError> {
        match self.first {
            Some(err) => Err(err),
            None => Ok(()),
        }
    }
    /// Note a bad value at `path` unless `ok` (only the first is kept).
    pub(crate) fn check(&mut self, ok: bool, path: &str, message: &str) {
        if !ok && self.first.is_none() {
            self.first = Some(value_err(self.source, path, message.to_string()));
        }
    }
    /// A count: at least 1.
    pub(crate) fn at_least_1(&mut self, path: &str, v: u64) {
        self.check(v >= 1, path, "must be at least 1");
    }
    /// A count or size: 1..=`max` (more is surely a typo, and would fail to allocate).
    pub(crate) fn size(&mut self, path: &str, v: u64, max: u64) {
        self.check(
            (1..=max).contains(&v),
            path,
            &format!("must be 1..={max}, got {v}"),
        );
    }
    /// A finite number above 0.
    pub(crate) fn positive(&mut self, path: &str, v: f64) {
        self.check(
            v.is_finite() && v > 0.0,
            path,
            &format!("must be a positive number, got {v}"),
        );
    }
    /// A fraction in (0, 1].
    pub(crate) fn unit(&mut self, path: &str, v: f64) {
        self.check(
            v > 0.0 && v <= 1.0,
            path,
            &format!("must be in (0, 1], got {v}"),
        );
    }
    /// An off-policy learner's batch size and gradient steps per collect
    /// (`policy.learn.batch_size`, `policy.learn.update_per_collect`).
    pub(crate) fn off_policy_learn(&mut self, batch_size: usize, update_per_collect: usize) {
        self.size("policy.learn.batch_size", batch_size as u64, MAX_BATCH);
        self.size(
            "policy.learn.update_per_collect",
            update_per_collect as u64,
            1 << 20,
        );
    }
    /// A replay buffer that holds at least one batch
    /// (`policy.other.replay_buffer.replay_buffer_size`).
    pub(crate) fn holds_a_batch(&mut self, replay_buffer_size: usize, batch_size: usize) {
        self.check(
            replay_buffer_size >= batch_size,
            "policy.other.replay_buffer.replay_buffer_size",
            &format!("must hold at least one batch ({batch_size})"),
        );
    }
    /// Layer sizes, at least one.
    pub(crate) fn hidden(&mut self, path: &str, sizes: &[usize]) {
        self.check(
            !sizes.is_empty(),
            path,
            &format!("must list at least one layer size, each 1..={MAX_WIDTH}"),
        );
        self.widths(path, sizes);
    }
    /// Layer sizes (possibly none), each 1..=[`MAX_WIDTH`].
    pub(crate) fn widths(&mut self, path: &str, sizes: &[usize]) {
        self.check(
            sizes.iter().all(|&s| (1..=MAX_WIDTH as usize).contains(&s)),
            path,
            &format!("layer sizes must be 1..={MAX_WIDTH}, got {sizes:?}"),
        );
    }
}

/// A bad value at `path` of the config read from `source`.
pub(crate) fn value_err(source: &str, path: &str, message: String) -> ConfigError {
    ConfigError::Value {
        file: source.to_string(),
        path: path.to_string(),
        message,
    }
}
