//! drill's CPU kernels: the matrix products, convolutions and dense layers under drill's
//! networks, in f32 and in bf16, on slices (no tensor library: `drill-algo` runs them as burn
//! operations). The SIMD level is chosen at run time from the CPU (AVX-512, AVX2 and FMA,
//! Intel AMX tiles for bf16), with a portable path that gives the same results.
//!
//! - [`product`] over [`View`]s: a matrix product with a fused [`Epilogue`] (bias, ReLU);
//!   small products on drill's own tile, large ones through the `gemm` crate (f32) or
//!   drill's packed bf16 kernels;
//! - [`conv`]: a 2-D convolution's forward pass and gradients, on the kernels chosen for the
//!   CPU and precision ([`conv::kernel`] says which);
//! - [`dense`]: a dense layer and its gradients, and weights kept packed ([`dense::Packing`]);
//! - [`lstm`]: an LSTM layer's recurrence over a batch of sequences, forward and backward
//!   through time;
//! - [`frames`]: `u8` frames read as floats, `b / 255`, as the first layer reads them;
//! - [`precision`]: bf16 products on or off, and the level they run at;
//! - [`peak`]: the f32 FMA peak the benchmarks compare with; [`profile`] and [`time_alone`]:
//!   every product of a workload timed inside it and alone.

mod amx;
#[cfg(target_arch = "x86_64")]
mod amx_conv;
mod bf16;
pub mod conv;
pub mod dense;
pub mod frames;
mod gemm;
mod im2col;
mod implicit;
pub mod lstm;
pub mod peak;
mod small_gemm;
mod view;

pub use gemm::{Epilogue, Timed, View, product, profile, time_alone};

/// Large products in bf16 (operands rounded to bfloat16, f32 accumulation): whether they run
/// so, and at which [`precision::Level`] (AMX tiles, AVX-512 BF16, or the portable path).
pub mod precision {
    pub use crate::bf16::{Level, enabled, set_enabled, slow_here};
}

/// ReLU over a buffer, as burn-flex's (NaN stays NaN). Written as a select, not a branch:
/// the sign of a pre-activation is a coin flip, and a mispredicted branch per element cost
/// more than the layer's GEMM.
fn relu_in_place(v: &mut [f32]) {
    for x in v {
        *x = if *x > 0.0 || x.is_nan() { *x } else { 0.0 };
    }
}
