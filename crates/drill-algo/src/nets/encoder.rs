//! [`ConvEncoder`]: convolutions over stacked frames, flattened, then one linear layer to a
//! feature vector. Two layouts:
//! - [`ConvEncoder::ding`]: DI-engine's `ConvEncoder` (`ding/model/common/encoder.py`) as its
//!   DQN builds it from `encoder_hidden_size_list`: convs 8x8/4, 4x4/2, 3x3/1 with the first
//!   three sizes as channels, ReLU after each, then `Linear(flat, last size)` with no
//!   activation (its dueling head follows);
//! - [`ConvEncoder::nature`]: the Nature-DQN / CleanRL `ppo_atari` trunk: convs 32, 64, 64
//!   (same kernels), then `Linear(flat, 512)` and ReLU.

use super::{Conv, Dense, Input};
use burn::module::{Module, Param};
use burn::nn::LinearConfig;
use burn::tensor::{Device, Distribution, Tensor, TensorData};

const KERNELS: [usize; 3] = [8, 4, 3];
const STRIDES: [usize; 3] = [4, 2, 1];

/// Convolutions, flatten, linear (see the module docs).
#[derive(Module, Debug)]
pub struct ConvEncoder {
    convs: Vec<Conv>,
    mid: Dense,
    channels: usize,
    height: usize,
    width: usize,
    mid_relu: bool,
}

/// Spatial size after the three convolutions (no padding).
fn out_side(mut side: usize) -> Option<usize> {
    for (k, s) in KERNELS.iter().zip(STRIDES) {
        side = side.checked_sub(*k)? / s + 1;
    }
    Some(side)
}

/// The frame's sides after the three convolutions, or why `shape`'s frames cannot take them.
fn out_sides(shape: [usize; 3]) -> Result<(usize, usize), String> {
    let [_, h, w] = shape;
    match (out_side(h), out_side(w)) {
        (Some(oh), Some(ow)) => Ok((oh, ow)),
        _ => Err(format!(
            "frames of {h}x{w} are too small for 8x8/4, 4x4/2, 3x3/1 convolutions (at least 36x36)"
        )),
    }
}

/// DI-engine's encoder's channels from `hidden`, or why it cannot make them.
fn ding_channels(hidden: &[usize]) -> Result<[usize; 3], String> {
    match hidden {
        &[a, b, c] => Ok([a, b, c]),
        _ => Err(format!(
            "a convolutional encoder takes 3 sizes (channels of the 3 convolutions, the last also the feature size), got {hidden:?}"
        )),
    }
}

/// Whether [`ConvEncoder::ding`] (`hidden`: `Some`) or [`ConvEncoder::nature`] (`None`) can
/// encode `shape`'s frames, without building it: the error either would return.
pub(crate) fn check(shape: [usize; 3], hidden: Option<&[usize]>) -> Result<(), String> {
    if let Some(hidden) = hidden {
        ding_channels(hidden)?;
    }
    out_sides(shape).map(drop)
}

impl ConvEncoder {
    /// DI-engine's encoder for `shape` = `[channels, height, width]` and `hidden` (at least
    /// three sizes; a fourth and later would be DI-engine's residual blocks, which drill does
    /// not build). PyTorch's default initialisation.
    pub fn ding(shape: [usize; 3], hidden: &[usize], device: &Device) -> Result<Self, String> {
        let channels = ding_channels(hidden)?;
        Self::build(shape, channels, channels[2], false, None, device)
    }

    /// The Nature-DQN trunk (features 512, ReLU), with CleanRL's orthogonal init (gain √2,
    /// zero biases) when `orthogonal`.
    pub fn nature(shape: [usize; 3], orthogonal: bool, device: &Device) -> Result<Self, String> {
        let gain = orthogonal.then_some(2f64.sqrt());
        Self::build(shape, [32, 64, 64], 512, true, gain, device)
    }

    fn build(
        shape: [usize; 3],
        channels: [usize; 3],
        features: usize,
        mid_relu: bool,
        orthogonal_gain: Option<f64>,
        device: &Device,
    ) -> Result<Self, String> {
        let [c, h, w] = shape;
        let (oh, ow) = out_sides(shape)?;
        let mut input = c;
        let convs = channels
            .iter()
            .zip(KERNELS.iter().zip(STRIDES))
            .map(|(&out, (&k, s))| {
                let mut conv = Conv::new(input, out, k, s, device);
                input = out;
                if let Some(gain) = orthogonal_gain {
                    conv.weight = Param::from_tensor(orthogonal(conv.weight.dims(), gain, device));
                    conv.bias = Param::from_tensor(Tensor::zeros([out], device));
                }
                conv
            })
            .collect();
        let flat = channels[2] * oh * ow;
        let mut mid = LinearConfig::new(flat, features).init(device);
        if let Some(gain) = orthogonal_gain {
            mid.weight = Param::from_tensor(orthogonal(mid.weight.dims(), gain, device));
            mid.bias = Some(Param::from_tensor(Tensor::zeros([features], device)));
        }
        let mid = Dense::from(mid);
        Ok(Self {
            convs,
            mid,
            channels: c,
            height: h,
            width: w,
            mid_relu,
        })
    }

    /// Features `[batch, out]` for flat frames `[batch, c*h*w]`: bytes, or floats scaled to
    /// `[0, 1]`.
    pub fn forward(&self, x: Input) -> Tensor<2> {
        let shape = [x.dims()[0], self.channels, self.height, self.width];
        let (first, rest) = self.convs.split_first().expect("three convolutions");
        let mut x = match x {
            Input::Frames(x) => first.forward_frames_relu(x.reshape(shape)),
            Input::Float(x) => first.forward_relu(x.reshape(shape)),
        };
        for conv in rest {
            x = conv.forward_relu(x);
        }
        let x = x.flatten(1, 3);
        if self.mid_relu {
            self.mid.forward_relu(x)
        } else {
            self.mid.forward(x)
        }
    }

    /// Size of the feature vector.
    pub fn features(&self) -> usize {
        self.mid.d_out()
    }
}

/// PyTorch's `orthogonal_` for a weight of shape `dims` (rows = `dims[0]`, columns = the
/// rest): orthonormal rows, or columns when there are more rows, times `gain`, from Gaussian
/// draws of burn's generator (so seeding burn fixes it). Written here because burn 0.22's
/// `Initializer::Orthogonal` runs its QR through per-column tensor operations, which took
/// over 100 s for the Nature trunk's 3136x512 layer; Gram-Schmidt in f64 ([`GramSchmidt`])
/// takes under a second to a few seconds, by the CPU.
fn orthogonal<const D: usize>(dims: [usize; D], gain: f64, device: &Device) -> Tensor<D> {
    let rows = dims[0];
    let cols: usize = dims[1..].iter().product();
    // `n` vectors of length `m`, made orthonormal.
    let (n, m) = (rows.min(cols), rows.max(cols));
    let g = Tensor::<2>::random([n, m], Distribution::Normal(0.0, 1.0), device).into_data();
    let mut v: Vec<f64> = g
        .as_slice::<f32>()
        .expect("f32 draws")
        .iter()
        .map(|&x| f64::from(x))
        .collect();
    pulp::Arch::new().dispatch(GramSchmidt { v: &mut v, n, m });
    let data: Vec<f32> = if rows <= cols {
        v.iter().map(|&x| (x * gain) as f32).collect()
    } else {
        (0..rows)
            .flat_map(|r| (0..cols).map(move |c| (r, c)))
            .map(|(r, c)| (v[c * m + r] * gain) as f32)
            .collect()
    };
    Tensor::from_data(TensorData::new(data, dims), device)
}

/// Modified Gram-Schmidt, re-orthogonalised, over `n` vectors of length `m` in `v`, through
/// pulp's dispatch: compiled for the machine's widest vectors (a closure handed to
/// `dispatch` is left out of line and compiled for SSE2).
/// The sums' order is fixed by [`dot`]'s lanes, so every machine gets the same values.
struct GramSchmidt<'a> {
    v: &'a mut [f64],
    n: usize,
    m: usize,
}

impl pulp::WithSimd for GramSchmidt<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        let Self { v, n, m } = self;
        for i in 0..n {
            let (done, rest) = v.split_at_mut(i * m);
            let vi = &mut rest[..m];
            // Twice, for numerical orthogonality.
            for _ in 0..2 {
                for j in 0..i {
                    let vj = &done[j * m..(j + 1) * m];
                    let dot = dot(vi, vj);
                    vi.iter_mut().zip(vj).for_each(|(a, b)| *a -= dot * b);
                }
            }
            let norm = vi.iter().map(|a| a * a).sum::<f64>().sqrt().max(1e-12);
            vi.iter_mut().for_each(|a| *a /= norm);
        }
    }
}

/// `a . b`, summed in 8 lanes so that it vectorises: one running sum is a chain of dependent
/// adds, and it made the Nature trunk's orthogonal init take seconds.
#[inline(always)]
fn dot(a: &[f64], b: &[f64]) -> f64 {
    let mut lanes = [0f64; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let rest: f64 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for ((s, x), y) in lanes.iter_mut().zip(x).zip(y) {
            *s += x * y;
        }
    }
    lanes.iter().sum::<f64>() + rest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dings_pong_encoder_has_its_parameter_count_and_shapes() {
        let device = Device::default();
        let e = ConvEncoder::ding([4, 84, 84], &[128, 128, 512], &device).unwrap();
        // conv 4->128 8x8, 128->128 4x4, 128->512 3x3, Linear(512*7*7, 512).
        let want = (4 * 128 * 64 + 128)
            + (128 * 128 * 16 + 128)
            + (128 * 512 * 9 + 512)
            + (512 * 7 * 7 * 512 + 512);
        assert_eq!(e.num_params(), want);
        let y = e.forward(Input::Float(Tensor::zeros([2, 4 * 84 * 84], &device)));
        assert_eq!(y.dims(), [2, 512]);
        // DI-engine's DQN on Pong: this encoder, then the dueling head (512 -> 512 -> 6 and
        // 512 -> 512 -> 1).
        let q = super::super::QNet::with_trunk(e.clone(), 6, true, &device);
        assert_eq!(
            q.num_params(),
            want + (512 * 512 + 512) + (512 * 6 + 6) + (512 * 512 + 512) + (512 + 1)
        );
        assert_eq!(q.num_params(), 14_259_975);
        let n = ConvEncoder::nature([4, 84, 84], true, &device).unwrap();
        assert_eq!(
            n.num_params(),
            (4 * 32 * 64 + 32) + (32 * 64 * 16 + 64) + (64 * 64 * 9 + 64) + (3136 * 512 + 512)
        );
        assert!(ConvEncoder::ding([4, 20, 20], &[8, 8, 8], &device).is_err());
        // Orthogonal init: the trunk's linear layer has orthonormal columns (times the gain).
        let w = n.mid.weight.val().into_data();
        let w = w.as_slice::<f32>().unwrap();
        let (rows, cols) = (3136, 512);
        for (a, b) in [(0, 0), (0, 1), (5, 300), (511, 511)] {
            let dot: f64 = (0..rows)
                .map(|r| f64::from(w[r * cols + a]) * f64::from(w[r * cols + b]))
                .sum();
            let want = if a == b { 2.0 } else { 0.0 };
            assert!((dot - want).abs() < 1e-3, "columns {a}, {b}: {dot}");
        }
        assert!(ConvEncoder::ding([4, 84, 84], &[8, 8, 8, 8], &device).is_err());
    }
}
