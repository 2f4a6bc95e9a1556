//! [`Adam`]: PyTorch's Adam (bias-corrected, no weight decay) over flat buffers.

use std::ops::Range;

/// Moments smaller than this are set to zero (see [`Adam::step`]).
const FLUSH: f32 = 1e-30;

/// Parameters from which [`Adam::step_copy`] splits its pass over threads (the Nature CNN's
/// 1.7 M: about 4 ms a step on one core, its five buffers read or written once).
const PARALLEL_FROM: usize = 1 << 18;
/// Parameters one thread takes at a time in a split pass.
const BLOCK: usize = 1 << 16;

/// Adam moments for a flat parameter buffer.
#[derive(Debug, Clone, PartialEq)]
pub struct Adam {
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// Denominator epsilon.
    pub eps: f32,
    /// First moments, one per parameter.
    pub m: Vec<f32>,
    /// Second moments, one per parameter.
    pub v: Vec<f32>,
    /// Steps taken (for bias correction).
    pub t: u64,
}

impl Adam {
    /// Fresh moments for `n` parameters with PyTorch's defaults except `eps`.
    pub fn new(n: usize, eps: f32) -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.999,
            eps,
            m: vec![0.0; n],
            v: vec![0.0; n],
            t: 0,
        }
    }

    /// One update of `params` with `grads` at learning rate `lr`.
    pub fn step(&mut self, params: &mut [f32], grads: &[f32], lr: f32) {
        let k = self.begin(params.len(), grads.len(), lr);
        let (m, v) = (&mut self.m, &mut self.v);
        // Compiled for the machine's widest vectors (pulp's dispatch), as one pass.
        pulp::Arch::new().dispatch(
            #[inline(always)]
            || {
                for (((p, g), m), v) in params.iter_mut().zip(grads).zip(m).zip(v) {
                    *p = k.update(*p, *g, m, v);
                }
            },
        );
    }

    /// [`Self::step`], also returning the new parameters as a new buffer written in the same
    /// pass (for the model's tensors: no second pass to copy them). A large model's buffers
    /// are split into blocks over the pool's threads (each element's update is independent,
    /// so the values are the same).
    pub fn step_copy(&mut self, params: &mut [f32], grads: &[f32], lr: f32) -> Vec<f32> {
        assert_eq!(grads.len(), params.len());
        let whole = [(0..params.len(), Some(grads))];
        self.step_copy_parts(params, &whole, 1.0, lr).0
    }

    /// [`Self::step_copy`] with the gradients in parts where the backward pass left them:
    /// `parts[i]` holds the gradient of the parameters `ranges[i]` (none: zeros), which cover
    /// `params` in order. Each gradient is multiplied by `scale` (clipping) as it is used.
    /// Returns the new parameters and the sum of the squares of the unscaled gradients, both
    /// from the same pass: no flat copy of the gradients, no second read for their norm.
    pub(crate) fn step_copy_parts(
        &mut self,
        params: &mut [f32],
        parts: &[(Range<usize>, Option<&[f32]>)],
        scale: f32,
        lr: f32,
    ) -> (Vec<f32>, f32) {
        let k = self.begin(params.len(), params.len(), lr);
        let n = params.len();
        let mut out = Vec::with_capacity(n);
        let cells = &mut out.spare_capacity_mut()[..n];
        let mut sum = 0.0;
        let mut end = 0;
        for (range, grads) in parts {
            assert_eq!(range.start, end, "the parts cover the parameters in order");
            end = range.end;
            let zeros;
            let g = match grads {
                Some(g) => *g,
                None => {
                    zeros = vec![0.0; range.len()];
                    &zeros[..]
                }
            };
            assert_eq!(g.len(), range.len(), "a part's gradient");
            let (p, m, v, o) = (
                &mut params[range.clone()],
                &mut self.m[range.clone()],
                &mut self.v[range.clone()],
                &mut cells[range.clone()],
            );
            sum += if range.len() >= PARALLEL_FROM && rayon::current_num_threads() > 1 {
                use rayon::prelude::*;
                p.par_chunks_mut(BLOCK)
                    .zip(g.par_chunks(BLOCK))
                    .zip(m.par_chunks_mut(BLOCK).zip(v.par_chunks_mut(BLOCK)))
                    .zip(o.par_chunks_mut(BLOCK))
                    .map(|(((p, g), (m, v)), o)| update_block(k, p, g, scale, m, v, o))
                    .collect::<Vec<f32>>()
                    .iter()
                    .sum::<f32>()
            } else {
                update_block(k, p, g, scale, m, v, o)
            };
        }
        assert_eq!(end, n, "the parts cover the parameters");
        // SAFETY: every element of every part was written (the parts cover `0..n`, checked
        // above, and each part's five slices have its length).
        unsafe { out.set_len(n) };
        (out, sum)
    }

    /// Checks the lengths, counts the step and computes its constants.
    fn begin(&mut self, params: usize, grads: usize, lr: f32) -> StepConstants {
        assert_eq!(params, self.m.len());
        assert_eq!(grads, self.m.len());
        self.t += 1;
        let (b1, b2) = (self.beta1, self.beta2);
        let bc1 = 1.0 - b1.powi(self.t.min(i32::MAX as u64) as i32);
        let bc2 = 1.0 - b2.powi(self.t.min(i32::MAX as u64) as i32);
        StepConstants {
            b1,
            b2,
            step_size: lr / bc1,
            bc2_sqrt: bc2.sqrt(),
            eps: self.eps,
        }
    }
}

/// One block's updates with the gradients `g` times `scale`: `p`, `m` and `v` in place, the
/// new parameters also into `out`. Returns the sum of the squares of `g`, in 16 lanes so that
/// the pass still vectorises.
fn update_block(
    k: StepConstants,
    p: &mut [f32],
    g: &[f32],
    scale: f32,
    m: &mut [f32],
    v: &mut [f32],
    out: &mut [std::mem::MaybeUninit<f32>],
) -> f32 {
    let n = p.len();
    assert!(g.len() == n && m.len() == n && v.len() == n && out.len() == n);
    // Compiled for the machine's widest vectors (pulp's dispatch), as one pass.
    pulp::Arch::new().dispatch(Block {
        k,
        p,
        g,
        scale,
        m,
        v,
        out,
    })
}

/// [`update_block`]'s operands, for [`pulp::WithSimd`]: its loop inlined into the function
/// compiled for the SIMD level (a closure doing the same was not, and ran scalar).
struct Block<'a> {
    k: StepConstants,
    p: &'a mut [f32],
    g: &'a [f32],
    scale: f32,
    m: &'a mut [f32],
    v: &'a mut [f32],
    out: &'a mut [std::mem::MaybeUninit<f32>],
}

impl pulp::WithSimd for Block<'_> {
    type Output = f32;

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) -> f32 {
        const L: usize = 16;
        let Self {
            k,
            p,
            g,
            scale,
            m,
            v,
            out,
        } = self;
        let body = p.len() / L * L;
        let mut lanes = [0f32; L];
        let chunks = (p[..body].chunks_exact_mut(L))
            .zip(g[..body].chunks_exact(L))
            .zip(m[..body].chunks_exact_mut(L))
            .zip(v[..body].chunks_exact_mut(L))
            .zip(out[..body].chunks_exact_mut(L));
        for ((((p, g), m), v), o) in chunks {
            for i in 0..L {
                lanes[i] += g[i] * g[i];
                p[i] = k.update(p[i], g[i] * scale, &mut m[i], &mut v[i]);
                o[i].write(p[i]);
            }
        }
        let mut tail = 0.0;
        let rest = (p[body..].iter_mut())
            .zip(&g[body..])
            .zip(&mut m[body..])
            .zip(&mut v[body..])
            .zip(&mut out[body..]);
        for ((((p, g), m), v), o) in rest {
            tail += g * g;
            *p = k.update(*p, g * scale, m, v);
            o.write(*p);
        }
        lanes.iter().sum::<f32>() + tail
    }
}

/// What one step's element updates share.
#[derive(Clone, Copy)]
struct StepConstants {
    b1: f32,
    b2: f32,
    step_size: f32,
    bc2_sqrt: f32,
    eps: f32,
}

impl StepConstants {
    /// The new value of parameter `p` with gradient `g`, updating its moments.
    #[inline(always)]
    fn update(self, p: f32, g: f32, m: &mut f32, v: &mut f32) -> f32 {
        let Self {
            b1,
            b2,
            step_size,
            bc2_sqrt,
            eps,
        } = self;
        // Moments of parameters whose gradient stays zero decay geometrically into the
        // subnormal range, where x86 arithmetic is ~100x slower (measured: Adam took 37% of a
        // DQN update). Flushing below FLUSH changes nothing a float32 update can see.
        let mn = b1 * *m + (1.0 - b1) * g;
        let vn = b2 * *v + (1.0 - b2) * g * g;
        *m = if mn.abs() < FLUSH { 0.0 } else { mn };
        *v = if vn < FLUSH { 0.0 } else { vn };
        p - step_size * *m / (v.sqrt() / bc2_sqrt + eps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_pytorch_adam_on_a_quadratic() {
        // PyTorch's documented Adam (torch.optim.Adam, amsgrad off) on f(x) = x^2 from x = 1,
        // lr = 0.1, evaluated in float64 by hand: 0.9, 0.80041223, 0.70158627.
        let mut adam = Adam::new(1, 1e-8);
        let mut x = [1.0f32];
        let mut trace = vec![];
        for _ in 0..3 {
            let g = [2.0 * x[0]];
            adam.step(&mut x, &g, 0.1);
            trace.push(x[0]);
        }
        let want = [0.9, 0.800_412_23, 0.701_586_27];
        let mut copying = Adam::new(1, 1e-8);
        let mut y = [1.0f32];
        for &x in &trace {
            let g = [2.0 * y[0]];
            assert_eq!(copying.step_copy(&mut y, &g, 0.1), vec![x]);
            assert_eq!(y[0], x);
        }
        for (a, b) in trace.iter().zip(want) {
            assert!((a - b).abs() < 2e-6, "{trace:?}");
        }
    }

    /// A buffer large enough to be split over threads gets the values of the one-pass
    /// `step`, bit for bit, on one thread and on three (blocks and a short last one).
    #[test]
    fn a_split_pass_gives_the_values_of_one_pass() {
        let n = PARALLEL_FROM + 3 * BLOCK + 123;
        let start: Vec<f32> = (0..n).map(|i| (i as f32 * 0.013).sin()).collect();
        let grads: Vec<Vec<f32>> = (0..3)
            .map(|s| {
                (0..n)
                    .map(|i| (i as f32 * 0.007 + s as f32).cos())
                    .collect()
            })
            .collect();
        let mut serial = Adam::new(n, 1e-8);
        let mut want = start.clone();
        for g in &grads {
            serial.step(&mut want, g, 1e-3);
        }
        for threads in [1, 3] {
            let mut adam = Adam::new(n, 1e-8);
            let mut p = start.clone();
            let last = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("a thread pool")
                .install(|| grads.iter().map(|g| adam.step_copy(&mut p, g, 1e-3)).last());
            assert!(p == want && last == Some(want.clone()), "{threads} threads");
            assert_eq!(adam, serial);
        }
    }
}
