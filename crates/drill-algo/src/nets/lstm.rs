//! [`Lstm`]: a one-layer LSTM core with PyTorch's `nn.LSTM` gates and parameters: the input's
//! projection a [`Dense`] layer, the recurrence one operation over a whole sequence
//! ([`crate::compute::lstm`]: drill-kernels' on the CPU); stepped one observation at a time
//! while acting, and over whole sequences from stored initial states while training
//! (CleanRL's ppo_atari_lstm).

use super::Dense;
use burn::module::{Module, Param};
use burn::nn::{Initializer, LinearConfig};
use burn::tensor::{Device, Tensor};

fn layer(d_in: usize, d_out: usize, device: &Device) -> Dense {
    let mut l = LinearConfig::new(d_in, d_out)
        .with_bias(false)
        .with_initializer(Initializer::Orthogonal { gain: 1.0 })
        .init(device);
    l.bias = Some(Param::from_tensor(Tensor::zeros([d_out], device)));
    Dense::from(l)
}

/// `i, f, g, o = split(x W_ih + b_ih + h W_hh + b_hh)`, `c' = σ(f) c + σ(i) tanh(g)`,
/// `h' = σ(o) tanh(c')`. A state is `[rows, 2H]`: `h` then `c`.
#[derive(Module, Debug)]
pub struct Lstm {
    /// `x W_ih + b_ih`: weight `[in, 4H]` (PyTorch's `weight_ih_l0` transposed), gates in
    /// PyTorch's order i, f, g, o.
    input: Dense,
    /// `h W_hh + b_hh`: weight `[H, 4H]` (`weight_hh_l0` transposed).
    recurrent: Dense,
    hidden: usize,
}

impl Lstm {
    /// `d_in → hidden`, orthogonal weights (gain 1) and zero biases, as CleanRL.
    pub(crate) fn new(d_in: usize, hidden: usize, device: &Device) -> Self {
        Self {
            input: layer(d_in, 4 * hidden, device),
            recurrent: layer(hidden, 4 * hidden, device),
            hidden,
        }
    }

    /// `H`.
    pub(crate) fn hidden(&self) -> usize {
        self.hidden
    }

    /// Floats per state row (`h` and `c`).
    pub(crate) fn state_width(&self) -> usize {
        2 * self.hidden
    }

    /// One step for a batch: `x` `[n, in]` and `state` `[n, 2H]` give the output `h'`
    /// `[n, H]` and the new state.
    pub(crate) fn step(&self, x: Tensor<2>, state: Tensor<2>) -> (Tensor<2>, Tensor<2>) {
        let n = x.dims()[0];
        let y = self.recurrence(x, state, &vec![false; n]);
        (y.clone().narrow(1, 0, self.hidden), y)
    }

    /// `steps` steps of `m` sequences: `x` `[steps·m, in]` time-major (row `t·m + j` is
    /// sequence `j`'s step `t`) from `state0` `[m, 2H]`; where `ended[t·m + j]` the sequence's
    /// episode ended at step `t` and its state is zeroed after it. Returns every step's
    /// output `[steps·m, H]`, the rows of `x`.
    pub(crate) fn sequence(
        &self,
        x: Tensor<2>,
        state0: Tensor<2>,
        ended: &[bool],
        steps: usize,
    ) -> Tensor<2> {
        debug_assert_eq!(x.dims()[0], steps * state0.dims()[0]);
        self.recurrence(x, state0, ended).narrow(1, 0, self.hidden)
    }

    /// Every step's `h` and `c` ([`crate::compute::lstm`]): the input's projection for all
    /// steps in one product, then the recurrence.
    fn recurrence(&self, x: Tensor<2>, state0: Tensor<2>, ended: &[bool]) -> Tensor<2> {
        let xp = self.input.forward(x);
        let (w, b) = (self.recurrent.weight.val(), self.recurrent.bias.val());
        crate::compute::lstm(xp, w, b, state0, ended)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Distribution, TensorData};

    fn flat(t: Tensor<2>) -> Vec<f32> {
        t.into_data().try_to_vec::<f32>().unwrap()
    }

    /// PyTorch's `nn.LSTM` cell on plain floats (weights `[in, 4H]` as drill stores them).
    #[allow(clippy::too_many_arguments)]
    fn reference_cell(
        x: &[f32],
        h: &[f32],
        c: &[f32],
        wi: &[f32],
        bi: &[f32],
        wh: &[f32],
        bh: &[f32],
        hd: usize,
    ) -> (Vec<f32>, Vec<f32>) {
        let sig = |v: f32| 1.0 / (1.0 + (-v).exp());
        let g: Vec<f32> = (0..4 * hd)
            .map(|k| {
                let xi: f32 = x
                    .iter()
                    .enumerate()
                    .map(|(i, v)| v * wi[i * 4 * hd + k])
                    .sum();
                let hh: f32 = h
                    .iter()
                    .enumerate()
                    .map(|(i, v)| v * wh[i * 4 * hd + k])
                    .sum();
                xi + bi[k] + hh + bh[k]
            })
            .collect();
        let c2: Vec<f32> = (0..hd)
            .map(|k| sig(g[hd + k]) * c[k] + sig(g[k]) * g[2 * hd + k].tanh())
            .collect();
        let h2 = (0..hd).map(|k| sig(g[3 * hd + k]) * c2[k].tanh()).collect();
        (h2, c2)
    }

    /// Random weights and biases (the init's biases are zero, which would hide a bias bug).
    fn random_lstm(d_in: usize, hd: usize, device: &Device) -> Lstm {
        let mut l = Lstm::new(d_in, hd, device);
        let u = Distribution::Uniform(-0.5, 0.5);
        for d in [&mut l.input, &mut l.recurrent] {
            d.weight = Param::from_tensor(Tensor::random(d.weight.dims(), u, device));
            d.bias = Param::from_tensor(Tensor::random(d.bias.dims(), u, device));
        }
        l
    }

    /// One step is PyTorch's cell (gates i, f, g, o; both biases), and a sequence with
    /// episode ends inside it equals stepping row by row with the state zeroed after each
    /// end: the learner's replay of a rollout is what the collector stepped.
    #[test]
    fn a_sequence_is_the_cell_stepped_one_by_one_with_resets() {
        let device = Device::default();
        let (d_in, hd, m, steps) = (3, 5, 4, 6);
        let l = random_lstm(d_in, hd, &device);
        let u = Distribution::Uniform(-1.0, 1.0);
        let x = Tensor::<2>::random([steps * m, d_in], u, &device);
        let s0 = Tensor::<2>::random([m, 2 * hd], u, &device);
        let ended: Vec<bool> = (0..steps * m).map(|k| k % 7 == 3 || k == 9).collect();
        let out = flat(l.sequence(x.clone(), s0.clone(), &ended, steps));
        // The state after the last step: its h and c, zeroed where the episode ended there.
        let y = flat(l.recurrence(x.clone(), s0.clone(), &ended));
        let last: Vec<f32> = ((steps - 1) * m..steps * m)
            .flat_map(|k| {
                let keep = if ended[k] { 0.0 } else { 1.0 };
                y[k * 2 * hd..(k + 1) * 2 * hd]
                    .iter()
                    .map(move |v| v * keep)
            })
            .collect();
        let (xv, s0v) = (flat(x), flat(s0));
        let p = |d: &Dense| {
            (
                flat(d.weight.val()),
                d.bias.val().into_data().try_to_vec::<f32>().unwrap(),
            )
        };
        let ((wi, bi), (wh, bh)) = (p(&l.input), p(&l.recurrent));
        let mut state: Vec<(Vec<f32>, Vec<f32>)> = (0..m)
            .map(|j| {
                let r = &s0v[j * 2 * hd..(j + 1) * 2 * hd];
                (r[..hd].to_vec(), r[hd..].to_vec())
            })
            .collect();
        let mut stepped =
            Tensor::<2>::from_data(TensorData::new(s0v.clone(), [m, 2 * hd]), &device);
        for t in 0..steps {
            let xt = Tensor::<2>::from_data(
                TensorData::new(xv[t * m * d_in..(t + 1) * m * d_in].to_vec(), [m, d_in]),
                &device,
            );
            let (h_step, next) = l.step(xt, stepped);
            let h_step = flat(h_step);
            let mut next = flat(next);
            for j in 0..m {
                let k = t * m + j;
                let (h, c) = &state[j];
                let (h2, c2) =
                    reference_cell(&xv[k * d_in..(k + 1) * d_in], h, c, &wi, &bi, &wh, &bh, hd);
                for q in 0..hd {
                    let (want, seq, one) = (h2[q], out[k * hd + q], h_step[j * hd + q]);
                    assert!(
                        (seq - want).abs() < 1e-5,
                        "sequence, step {t} row {j}: {seq} vs {want}"
                    );
                    assert!(
                        (one - want).abs() < 1e-5,
                        "step, step {t} row {j}: {one} vs {want}"
                    );
                }
                state[j] = if ended[k] {
                    next[j * 2 * hd..(j + 1) * 2 * hd].fill(0.0);
                    (vec![0.0; hd], vec![0.0; hd])
                } else {
                    (h2, c2)
                };
            }
            stepped = Tensor::from_data(TensorData::new(next, [m, 2 * hd]), &device);
        }
        let stepped = flat(stepped);
        for (a, b) in last.iter().zip(&stepped) {
            assert!((a - b).abs() < 1e-5, "final state: {a} vs {b}");
        }
    }
}
