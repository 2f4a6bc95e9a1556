//! A 2-D convolution layer on the CPU (no padding, no dilation, one group; bias and ReLU
//! fused), its forward pass and both gradients, on the kernels this process runs it with:
//! chosen here, at run time, from the CPU and the precision.
//!
//! - bf16 precision on a CPU with AMX: the products on AMX tiles without a patch matrix
//!   (`amx_conv`);
//! - f32 where the CPU has AVX2 and FMA: without a patch matrix (`implicit`: the products'
//!   left operand gathered from the input in the tile), the input gradient through im2col;
//! - else im2col: patches into a matrix, one `gemm` product per group of batch elements
//!   (bf16 products there when bf16 is on), col2im for the input gradient.
//!
//! Every path gives the same results as the portable one to f32 rounding; the tests compare
//! each against a direct convolution.

pub use super::im2col::{Geometry, Source};
use super::{im2col, implicit};

/// The kernels a convolution runs on.
#[derive(Clone, Copy)]
enum Kernel {
    #[cfg(target_arch = "x86_64")]
    Amx,
    Implicit,
    Im2col,
}

/// The kernels a convolution of geometry `g` runs on in this process: AMX tiles where
/// `amx_conv` takes the shape in bf16, else without a patch matrix in f32 where the CPU suits
/// it (bf16's products are packed by im2col), else im2col.
fn chosen(g: &Geometry) -> Kernel {
    #[cfg(target_arch = "x86_64")]
    if super::amx_conv::chosen(g) {
        return Kernel::Amx;
    }
    let _ = g;
    if implicit::chosen() && !super::bf16::enabled() {
        Kernel::Implicit
    } else {
        Kernel::Im2col
    }
}

/// The name of the kernels a convolution of geometry `g` runs on in this process: `"amx"`,
/// `"implicit"` or `"im2col"`.
pub fn kernel(g: &Geometry) -> &'static str {
    match chosen(g) {
        #[cfg(target_arch = "x86_64")]
        Kernel::Amx => "amx",
        Kernel::Implicit => "implicit",
        Kernel::Im2col => "im2col",
    }
}

/// The forward pass: `x` (`[batch, c_in, h, w]`, floats or `u8` frames) convolved with
/// `weight` (`[c_out, c_in, kh, kw]`), plus `bias`, then ReLU when `relu`:
/// `[batch, c_out, oh, ow]`.
pub fn forward(x: Source<'_>, weight: &[f32], bias: &[f32], g: &Geometry, relu: bool) -> Vec<f32> {
    match chosen(g) {
        #[cfg(target_arch = "x86_64")]
        Kernel::Amx => super::amx_conv::forward(x, weight, bias, g, relu),
        Kernel::Implicit => implicit::forward(x, weight, bias, g, relu),
        Kernel::Im2col => im2col::forward(x, weight, bias, g, relu),
    }
}

/// The weight and bias gradients from the input `x` and the output gradient `dz` (already
/// through the ReLU), on the kernels [`forward`] runs.
pub fn backward_params(x: Source<'_>, dz: &[f32], g: &Geometry) -> (Vec<f32>, Vec<f32>) {
    match chosen(g) {
        #[cfg(target_arch = "x86_64")]
        Kernel::Amx => super::amx_conv::backward_params(x, dz, g),
        Kernel::Implicit => implicit::backward_params(x, dz, g),
        Kernel::Im2col => im2col::backward_params(x, dz, g),
    }
}

/// The input gradient from the weight and the output gradient `dz`: on AMX tiles where
/// [`forward`] runs there, else im2col's product and col2im.
pub fn backward_input(weight: &[f32], dz: &[f32], g: &Geometry) -> Vec<f32> {
    match chosen(g) {
        #[cfg(target_arch = "x86_64")]
        Kernel::Amx => super::amx_conv::backward_input(weight, dz, g),
        Kernel::Implicit | Kernel::Im2col => im2col::backward_input(weight, dz, g),
    }
}
