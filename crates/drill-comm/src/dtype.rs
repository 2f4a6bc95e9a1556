//! Element types that collectives carry, and the reductions over them.

use bytemuck::Pod;
use half::{bf16, f16};
use serde::{Deserialize, Serialize};

/// The element types of a collective buffer (torch's dtypes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u8)]
pub enum DType {
    /// 32-bit float.
    F32 = 1,
    /// 64-bit float.
    F64 = 2,
    /// IEEE half.
    F16 = 3,
    /// bfloat16.
    BF16 = 4,
    /// 32-bit signed integer.
    I32 = 5,
    /// 64-bit signed integer.
    I64 = 6,
    /// Byte.
    U8 = 7,
}

impl DType {
    /// Every dtype, for tests and benchmarks.
    pub const ALL: [DType; 7] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::I64,
        DType::U8,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::U8 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
        }
    }

    /// Lower-case name as torch spells it.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::U8 => "uint8",
        }
    }
}

/// How all_reduce / reduce / reduce_scatter combine values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u8)]
pub enum ReduceOp {
    /// Sum.
    Sum = 1,
    /// Product.
    Prod = 2,
    /// Minimum.
    Min = 3,
    /// Maximum.
    Max = 4,
    /// Mean over ranks (sum, then divided by the world size; integer division for integers).
    Avg = 5,
}

impl ReduceOp {
    /// Every op, for tests.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];

    /// The op used while combining partial results (Avg combines as Sum).
    pub fn combining(self) -> ReduceOp {
        if self == ReduceOp::Avg {
            ReduceOp::Sum
        } else {
            self
        }
    }
}

/// A Rust type that collectives can carry.
pub trait Element: Pod + Send + Sync + PartialEq + std::fmt::Debug + 'static {
    /// Its dtype tag.
    const DTYPE: DType;
    /// Combine `x` into `acc` element-wise.
    fn reduce(op: ReduceOp, acc: &mut [Self], x: &[Self]);
    /// Divide every element by `n` (for Avg).
    fn div(acc: &mut [Self], n: usize);
    /// A value from a small integer (tests and benchmarks build references with it).
    fn from_i64(v: i64) -> Self;
}

macro_rules! native {
    ($t:ty, $d:expr, $min:expr, $max:expr, $add:expr, $mul:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            #[inline]
            fn reduce(op: ReduceOp, acc: &mut [Self], x: &[Self]) {
                let add: fn($t, $t) -> $t = $add;
                let mul: fn($t, $t) -> $t = $mul;
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => {
                        acc.iter_mut().zip(x).for_each(|(a, b)| *a = add(*a, *b))
                    }
                    ReduceOp::Prod => acc.iter_mut().zip(x).for_each(|(a, b)| *a = mul(*a, *b)),
                    ReduceOp::Min => acc.iter_mut().zip(x).for_each(|(a, b)| *a = $min(*a, *b)),
                    ReduceOp::Max => acc.iter_mut().zip(x).for_each(|(a, b)| *a = $max(*a, *b)),
                }
            }
            fn div(acc: &mut [Self], n: usize) {
                let n = n as $t;
                acc.iter_mut().for_each(|a| *a /= n);
            }
            fn from_i64(v: i64) -> Self {
                v as $t
            }
        }
    };
}

native!(f32, DType::F32, f32::min, f32::max, |a, b| a + b, |a, b| a
    * b);
native!(f64, DType::F64, f64::min, f64::max, |a, b| a + b, |a, b| a
    * b);
native!(
    i32,
    DType::I32,
    Ord::min,
    Ord::max,
    i32::wrapping_add,
    i32::wrapping_mul
);
native!(
    i64,
    DType::I64,
    Ord::min,
    Ord::max,
    i64::wrapping_add,
    i64::wrapping_mul
);
native!(
    u8,
    DType::U8,
    Ord::min,
    Ord::max,
    u8::wrapping_add,
    u8::wrapping_mul
);
macro_rules! half_float {
    ($t:ty, $d:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            fn reduce(op: ReduceOp, acc: &mut [Self], x: &[Self]) {
                // Computed in f32 and rounded once, as torch does on CPU.
                let f: fn(f32, f32) -> f32 = match op {
                    ReduceOp::Sum | ReduceOp::Avg => |a, b| a + b,
                    ReduceOp::Prod => |a, b| a * b,
                    ReduceOp::Min => f32::min,
                    ReduceOp::Max => f32::max,
                };
                acc.iter_mut()
                    .zip(x)
                    .for_each(|(a, b)| *a = <$t>::from_f32(f(a.to_f32(), b.to_f32())));
            }
            fn div(acc: &mut [Self], n: usize) {
                acc.iter_mut()
                    .for_each(|a| *a = <$t>::from_f32(a.to_f32() / n as f32));
            }
            fn from_i64(v: i64) -> Self {
                <$t>::from_f32(v as f32)
            }
        }
    };
}

half_float!(f16, DType::F16);
half_float!(bf16, DType::BF16);

/// Combine the bytes of `x` into the bytes of `acc`, both holding `dtype` elements.
///
/// Both slices must be aligned for `dtype` and of equal length (whole elements).
pub fn reduce_bytes(dtype: DType, op: ReduceOp, acc: &mut [u8], x: &[u8]) {
    fn go<T: Element>(op: ReduceOp, acc: &mut [u8], x: &[u8]) {
        T::reduce(
            op.combining(),
            bytemuck::cast_slice_mut(acc),
            bytemuck::cast_slice(x),
        );
    }
    match dtype {
        DType::F32 => go::<f32>(op, acc, x),
        DType::F64 => go::<f64>(op, acc, x),
        DType::F16 => go::<f16>(op, acc, x),
        DType::BF16 => go::<bf16>(op, acc, x),
        DType::I32 => go::<i32>(op, acc, x),
        DType::I64 => go::<i64>(op, acc, x),
        DType::U8 => go::<u8>(op, acc, x),
    }
}

/// Divide `dtype` elements held in `acc` by `n` (the last step of Avg).
pub fn div_bytes(dtype: DType, acc: &mut [u8], n: usize) {
    fn go<T: Element>(acc: &mut [u8], n: usize) {
        T::div(bytemuck::cast_slice_mut(acc), n);
    }
    match dtype {
        DType::F32 => go::<f32>(acc, n),
        DType::F64 => go::<f64>(acc, n),
        DType::F16 => go::<f16>(acc, n),
        DType::BF16 => go::<bf16>(acc, n),
        DType::I32 => go::<i32>(acc, n),
        DType::I64 => go::<i64>(acc, n),
        DType::U8 => go::<u8>(acc, n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reductions_per_dtype() {
        let mut a = [1.0f32, 5.0, -2.0];
        f32::reduce(ReduceOp::Max, &mut a, &[2.0, 3.0, -1.0]);
        assert_eq!(a, [2.0, 5.0, -1.0]);
        let mut b = [200u8, 3];
        u8::reduce(ReduceOp::Sum, &mut b, &[100, 4]);
        assert_eq!(b, [44, 7], "u8 sums wrap as torch's uint8 does");
        let mut h = [f16::from_f32(1.5)];
        f16::reduce(ReduceOp::Prod, &mut h, &[f16::from_f32(2.0)]);
        assert_eq!(h[0].to_f32(), 3.0);
        let mut i = [7i64, -3];
        i64::div(&mut i, 2);
        assert_eq!(i, [3, -1]);
        let mut v = [1.0f32, 2.0];
        let x: [f32; 2] = [3.0, 4.0];
        reduce_bytes(
            DType::F32,
            ReduceOp::Avg,
            bytemuck::cast_slice_mut(&mut v),
            bytemuck::cast_slice(&x),
        );
        div_bytes(DType::F32, bytemuck::cast_slice_mut(&mut v), 2);
        assert_eq!(v, [2.0, 3.0]);
    }
}
