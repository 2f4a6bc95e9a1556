//! An LSTM layer's recurrence over a batch of sequences (PyTorch's `nn.LSTM` cell: gates i,
//! f, g, o), forward and backward through time, on slices. The input's projection
//! `x W_ih + b_ih` of every step is one product the caller makes before ([`crate::dense`]);
//! here each step adds `h W_hh + b_hh` (one product of `rows` rows) and runs the cell's
//! element-wise part in one pass, so a whole sequence is one operation for the tensor library
//! instead of a dozen per step.
//!
//! Layouts, all row-major: a step's rows are contiguous (`t · rows + j` is sequence `j`'s
//! step `t`); a state row is `h` then `c` (`2H`); `keep[t · rows + j]` is 0 where sequence
//! `j`'s episode ended at step `t` (its state is zeroed before step `t + 1`), else 1.

use super::gemm::{View, matmul, product};

/// Sizes of one recurrence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Steps per sequence.
    pub steps: usize,
    /// Sequences (rows of each step).
    pub rows: usize,
    /// Hidden size `H`.
    pub hidden: usize,
}

impl Shape {
    fn check(&self, xp: &[f32], w_hh: &[f32], b_hh: &[f32], state0: &[f32], keep: &[f32]) {
        let (n, h) = (self.steps * self.rows, self.hidden);
        assert_eq!(xp.len(), n * 4 * h, "lstm: input projection size");
        assert_eq!(w_hh.len(), h * 4 * h, "lstm: recurrent weight size");
        assert_eq!(b_hh.len(), 4 * h, "lstm: recurrent bias size");
        assert_eq!(state0.len(), self.rows * 2 * h, "lstm: initial state size");
        assert_eq!(keep.len(), n, "lstm: episode-end mask size");
    }
}

/// What the forward pass keeps for the backward one.
#[derive(Debug, Clone)]
pub struct Saved {
    /// Every step's activated gates `[steps · rows, 4H]`: σ(i), σ(f), tanh(g), σ(o).
    pub gates: Vec<f32>,
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `tanh` through one `exp` (`2σ(2x) − 1`): libm's `tanhf` goes through `expm1f`, which took
/// most of the recurrence's time; the difference is an absolute error of a few ulps of 1.
fn tanh(x: f32) -> f32 {
    2.0 / (1.0 + (-2.0 * x).exp()) - 1.0
}

/// `(h, c)` of row `j` entering step `t`: the initial state, or the previous step's output
/// times its `keep`.
fn state_in<'a>(
    y: &'a [f32],
    state0: &'a [f32],
    keep: &[f32],
    s: Shape,
    t: usize,
    j: usize,
) -> (&'a [f32], &'a [f32], f32) {
    let h = s.hidden;
    if t == 0 {
        let r = &state0[j * 2 * h..(j + 1) * 2 * h];
        (&r[..h], &r[h..], 1.0)
    } else {
        let k = (t - 1) * s.rows + j;
        let r = &y[k * 2 * h..(k + 1) * 2 * h];
        (&r[..h], &r[h..], keep[k])
    }
}

/// Run the recurrence: every step's output `y [steps · rows, 2H]` (its `h` and `c`, before
/// the episode-end mask) and what [`backward`] needs. `xp` `[steps · rows, 4H]` is the
/// input's projection with its bias; `w_hh` `[H, 4H]`, `b_hh` `[4H]`; `state0` `[rows, 2H]`.
pub fn forward(
    xp: &[f32],
    w_hh: &[f32],
    b_hh: &[f32],
    state0: &[f32],
    keep: &[f32],
    s: Shape,
) -> (Vec<f32>, Saved) {
    s.check(xp, w_hh, b_hh, state0, keep);
    let (m, h) = (s.rows, s.hidden);
    let mut y = vec![0f32; s.steps * m * 2 * h];
    let mut gates = vec![0f32; s.steps * m * 4 * h];
    let mut h_in = vec![0f32; m * h];
    for t in 0..s.steps {
        // The outputs so far (read as this step's input state) and this step's.
        let (done, out) = y.split_at_mut(t * m * 2 * h);
        let out = &mut out[..m * 2 * h];
        // The rows' h entering this step, masked, as one matrix for the product.
        for j in 0..m {
            let (hp, _, k) = state_in(done, state0, keep, s, t, j);
            h_in[j * h..(j + 1) * h]
                .iter_mut()
                .zip(hp)
                .for_each(|(d, v)| *d = v * k);
        }
        let g = &mut gates[t * m * 4 * h..(t + 1) * m * 4 * h];
        let x = &xp[t * m * 4 * h..(t + 1) * m * 4 * h];
        for (row_g, row_x) in g.chunks_exact_mut(4 * h).zip(x.chunks_exact(4 * h)) {
            for ((d, a), b) in row_g.iter_mut().zip(row_x).zip(b_hh) {
                *d = a + b;
            }
        }
        matmul(
            (m, 4 * h, h),
            g,
            (4 * h, 1),
            true,
            View::rows(&h_in, h),
            View::rows(w_hh, 4 * h),
            false,
        );
        for j in 0..m {
            let (_, c_prev, keep_prev) = state_in(done, state0, keep, s, t, j);
            let row = &mut g[j * 4 * h..(j + 1) * 4 * h];
            let out = &mut out[j * 2 * h..(j + 1) * 2 * h];
            for q in 0..h {
                let i = sigmoid(row[q]);
                let f = sigmoid(row[h + q]);
                let gg = tanh(row[2 * h + q]);
                let o = sigmoid(row[3 * h + q]);
                let c = f * c_prev[q] * keep_prev + i * gg;
                out[q] = o * tanh(c);
                out[h + q] = c;
                row[q] = i;
                row[h + q] = f;
                row[2 * h + q] = gg;
                row[3 * h + q] = o;
            }
        }
    }
    (y, Saved { gates })
}

/// Gradients of one recurrence.
#[derive(Debug, Clone)]
pub struct Grads {
    /// Of the input's projection `[steps · rows, 4H]` (the gates' pre-activations).
    pub xp: Vec<f32>,
    /// Of `W_hh` `[H, 4H]`.
    pub w_hh: Vec<f32>,
    /// Of `b_hh` `[4H]`.
    pub b_hh: Vec<f32>,
    /// Of the initial state `[rows, 2H]`.
    pub state0: Vec<f32>,
}

/// Backward through time for the output gradient `dy` `[steps · rows, 2H]` (of `h` and `c`
/// as [`forward`] returned them), from its output `y` and `saved`.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    dy: &[f32],
    y: &[f32],
    saved: &Saved,
    w_hh: &[f32],
    state0: &[f32],
    keep: &[f32],
    s: Shape,
) -> Grads {
    let (m, h, n) = (s.rows, s.hidden, s.steps * s.rows);
    assert_eq!(dy.len(), n * 2 * h, "lstm: output gradient size");
    assert_eq!(y.len(), n * 2 * h, "lstm: output size");
    let mut dxp = vec![0f32; n * 4 * h];
    // The masked h entering each step, for W_hh's gradient (one product at the end).
    let mut h_in = vec![0f32; n * h];
    // Gradient flowing into the state entering step t + 1 (after the mask), `[rows, 2H]`.
    let mut d_next = vec![0f32; m * 2 * h];
    let mut dh_in = vec![0f32; m * h];
    // W_hhᵀ `[4H, H]` row-major once: read transposed, every step's product would repack it.
    let mut w_t = vec![0f32; 4 * h * h];
    for (r, row) in w_hh.chunks_exact(4 * h).enumerate() {
        for (c, v) in row.iter().enumerate() {
            w_t[c * h + r] = *v;
        }
    }
    for t in (0..s.steps).rev() {
        for j in 0..m {
            let k = t * m + j;
            let (hp, cp, keep_prev) = state_in(y, state0, keep, s, t, j);
            h_in[k * h..(k + 1) * h]
                .iter_mut()
                .zip(hp)
                .for_each(|(d, v)| *d = v * keep_prev);
            let gates = &saved.gates[k * 4 * h..(k + 1) * 4 * h];
            let c = &y[k * 2 * h + h..(k + 1) * 2 * h];
            let d_out = &dy[k * 2 * h..(k + 1) * 2 * h];
            let dn = &mut d_next[j * 2 * h..(j + 1) * 2 * h];
            let dg = &mut dxp[k * 4 * h..(k + 1) * 4 * h];
            for q in 0..h {
                let (i, f, gg, o) = (gates[q], gates[h + q], gates[2 * h + q], gates[3 * h + q]);
                let dh = d_out[q] + dn[q];
                let tc = tanh(c[q]);
                let dc = d_out[h + q] + dn[h + q] + dh * o * (1.0 - tc * tc);
                dg[q] = dc * gg * i * (1.0 - i);
                dg[h + q] = dc * cp[q] * keep_prev * f * (1.0 - f);
                dg[2 * h + q] = dc * i * (1.0 - gg * gg);
                dg[3 * h + q] = dh * tc * o * (1.0 - o);
                // c's share of the state entering this step (its h share: below).
                dn[h + q] = dc * f * keep_prev;
            }
        }
        // dh entering this step: dg W_hhᵀ, through the mask.
        matmul(
            (m, h, 4 * h),
            &mut dh_in,
            (h, 1),
            false,
            View::rows(&dxp[t * m * 4 * h..(t + 1) * m * 4 * h], 4 * h),
            View::rows(&w_t, h),
            false,
        );
        for j in 0..m {
            let keep_prev = if t == 0 { 1.0 } else { keep[(t - 1) * m + j] };
            let dn = &mut d_next[j * 2 * h..j * 2 * h + h];
            dn.iter_mut()
                .zip(&dh_in[j * h..(j + 1) * h])
                .for_each(|(d, g)| *d = g * keep_prev);
        }
    }
    let dw = product(
        (h, 4 * h, n),
        View::transposed(&h_in, h),
        View::rows(&dxp, 4 * h),
        true,
    );
    let mut db = vec![0f32; 4 * h];
    for row in dxp.chunks_exact(4 * h) {
        db.iter_mut().zip(row).for_each(|(s, g)| *s += g);
    }
    Grads {
        xp: dxp,
        w_hh: dw,
        b_hh: db,
        state0: d_next,
    }
}
