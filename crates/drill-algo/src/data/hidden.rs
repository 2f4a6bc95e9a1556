//! [`Hidden`]: a recurrent policy's state per env copy.

use serde::{Deserialize, Serialize};

/// A recurrent policy's state, one row per env copy (an LSTM's `h` then `c`), kept by
/// whoever steps the envs (the collector, the evaluator, `drill eval`, `drill.load`) and
/// updated by each call of the collect or eval side. Empty is all zeros: the state of a new
/// episode, and what a feed-forward policy leaves it. Whoever steps an env copy calls
/// [`Hidden::reset`] when its episode ends.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Hidden {
    width: usize,
    data: Vec<f32>,
}

impl Hidden {
    /// `rows` states of `width` zeros.
    pub fn zeros(rows: usize, width: usize) -> Self {
        Self {
            width,
            data: vec![0.0; rows * width],
        }
    }

    /// Floats per row (0 while empty).
    pub fn width(&self) -> usize {
        self.width
    }

    /// Rows held.
    pub fn rows(&self) -> usize {
        self.data.len().checked_div(self.width).unwrap_or(0)
    }

    /// Nothing held yet (all zeros).
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Row-major `[rows, width]`.
    pub fn as_slice(&self) -> &[f32] {
        &self.data
    }

    /// Row `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.width..(i + 1) * self.width]
    }

    /// `rows` rows of `width` to read and overwrite: as held, or zeros where the shape differs
    /// (the first step, or a batch of another size).
    pub fn rows_mut(&mut self, rows: usize, width: usize) -> &mut [f32] {
        if self.width != width || self.data.len() != rows * width {
            *self = Self::zeros(rows, width);
        }
        &mut self.data
    }

    /// Env copy `i`'s episode ended: its next step starts from zeros.
    pub fn reset(&mut self, i: usize) {
        if let Some(row) = self.data.get_mut(i * self.width..(i + 1) * self.width) {
            row.fill(0.0);
        }
    }

    /// Every row to zeros (new episodes everywhere).
    pub fn clear(&mut self) {
        self.data.clear();
    }

    /// Append `row` (of `other`'s width).
    pub fn push_row(&mut self, other: &Hidden, i: usize) {
        if other.is_empty() {
            return;
        }
        self.width = other.width;
        self.data.extend_from_slice(other.row(i));
    }
}
