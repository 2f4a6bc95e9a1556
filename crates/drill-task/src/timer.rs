//! [`StepTimer`]: per-middleware time per step (DI-engine's `StepTimer` wrapper).

use std::time::{Duration, Instant};

/// Last and mean time of one middleware.
#[derive(Debug, Clone, PartialEq)]
pub struct TimerStats {
    /// The middleware's name.
    pub name: String,
    /// Time in the last step (forward + backward), milliseconds.
    pub last_ms: f64,
    /// Mean over the steps so far, milliseconds.
    pub mean_ms: f64,
    /// Steps measured.
    pub steps: u64,
}

/// Accumulates each middleware's time; logs a table every `print_every` steps (0: never).
#[derive(Debug, Clone)]
pub struct StepTimer {
    stats: Vec<TimerStats>,
    print_every: u64,
    steps: u64,
}

impl StepTimer {
    /// A timer that logs every `print_every` steps (0: only read from code).
    pub fn new(print_every: u64) -> Self {
        Self {
            stats: Vec::new(),
            print_every,
            steps: 0,
        }
    }

    /// The statistics, in registration order.
    pub fn stats(&self) -> &[TimerStats] {
        &self.stats
    }

    /// Statistics of the middleware called `name`.
    pub fn get(&self, name: &str) -> Option<&TimerStats> {
        self.stats.iter().find(|s| s.name == name)
    }

    pub(crate) fn ensure(&mut self, names: impl Iterator<Item = String>) {
        for (k, name) in names.enumerate() {
            if self.stats.get(k).is_none_or(|s| s.name != name) {
                self.stats.insert(
                    k,
                    TimerStats {
                        name,
                        last_ms: 0.0,
                        mean_ms: 0.0,
                        steps: 0,
                    },
                );
            }
        }
    }

    pub(crate) fn record(&mut self, k: usize, spent: Duration, first_part: bool) {
        let s = &mut self.stats[k];
        let ms = spent.as_secs_f64() * 1e3;
        if first_part {
            s.last_ms = ms;
        } else {
            s.last_ms += ms;
            s.steps += 1;
            s.mean_ms += (s.last_ms - s.mean_ms) / s.steps as f64;
        }
    }

    pub(crate) fn end_step(&mut self) {
        self.steps += 1;
        if self.print_every > 0 && self.steps.is_multiple_of(self.print_every) {
            let rows: Vec<String> = self
                .stats
                .iter()
                .map(|s| format!("{} {:.3}/{:.3} ms", s.name, s.last_ms, s.mean_ms))
                .collect();
            tracing::info!("step {} (last/mean): {}", self.steps, rows.join(", "));
        }
    }
}

/// Measures from creation.
pub(crate) struct Clock(Instant);

impl Clock {
    pub(crate) fn start() -> Self {
        Self(Instant::now())
    }
    pub(crate) fn spent(&self) -> Duration {
        self.0.elapsed()
    }
}
