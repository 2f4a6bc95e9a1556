//! One safe entry point to the `gemm` crate (burn-flex's own GEMM; drill enables its AVX-512
//! kernels, picked at run time): [`matmul`] over strided views of slices.

/// A matrix view of a slice: element `(i, j)` is `data[i * rs + j * cs]`.
#[derive(Clone, Copy)]
pub struct View<'a> {
    data: &'a [f32],
    rs: usize,
    cs: usize,
}

impl<'a> View<'a> {
    /// `data` as a row-major matrix with `cols` columns.
    pub fn rows(data: &'a [f32], cols: usize) -> Self {
        Self {
            data,
            rs: cols,
            cs: 1,
        }
    }

    /// The transpose of `data` taken as a row-major matrix with `cols` columns.
    pub fn transposed(data: &'a [f32], cols: usize) -> Self {
        Self {
            data,
            rs: 1,
            cs: cols,
        }
    }

    /// Panics unless every element of an `m x n` matrix lies in the slice.
    fn check(&self, m: usize, n: usize, what: &str) {
        if m > 0 && n > 0 {
            let last = (m - 1) * self.rs + (n - 1) * self.cs;
            assert!(last < self.data.len(), "matmul: {what} is too small");
        }
    }
}

/// `dst (m x n) = [dst +] a (m x k) * b (k x n)`. `dst` is strided by `(row, column)`
/// strides `dst_strides`. Runs on the rayon pool when `parallel` and the pool has threads
/// (callers that already split work over threads pass `false`).
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    (m, n, k): (usize, usize, usize),
    dst: &mut [f32],
    dst_strides: (usize, usize),
    accumulate: bool,
    a: View<'_>,
    b: View<'_>,
    parallel: bool,
) {
    View {
        data: dst,
        rs: dst_strides.0,
        cs: dst_strides.1,
    }
    .check(m, n, "the destination");
    // SAFETY: the destination covers every element the strides reach (checked above) and is
    // borrowed mutably, so it aliases neither operand.
    unsafe {
        gemm_into(
            dst.as_mut_ptr(),
            (m, n, k),
            dst_strides,
            accumulate,
            a,
            b,
            parallel,
        )
    }
}

/// `a (m x k) * b (k x n)` as a new row-major `m x n` buffer. The buffer is not zeroed
/// first (the product writes every element): zeroing cost the small-MLP update 4% of its
/// instructions.
pub fn product(
    (m, n, k): (usize, usize, usize),
    a: View<'_>,
    b: View<'_>,
    parallel: bool,
) -> Vec<f32> {
    if m == 0 || n == 0 || k == 0 {
        return vec![0.0; m * n];
    }
    let mut out: Vec<f32> = Vec::with_capacity(m * n);
    // SAFETY: the allocation holds m * n elements, exactly what the row-major strides reach;
    // with `accumulate` false and k > 0, gemm writes every one of them without reading any,
    // so all are initialised before `set_len`.
    unsafe {
        gemm_into(out.as_mut_ptr(), (m, n, k), (n, 1), false, a, b, parallel);
        out.set_len(m * n);
    }
    out
}

/// The call into `gemm`, after checking the operands.
///
/// # Safety
/// `dst` must be valid for writes (and reads, when `accumulate`) at every element of the
/// `m x n` matrix its strides describe, and must not alias `a` or `b`.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_into(
    dst: *mut f32,
    (m, n, k): (usize, usize, usize),
    dst_strides: (usize, usize),
    accumulate: bool,
    a: View<'_>,
    b: View<'_>,
    parallel: bool,
) {
    a.check(m, k, "the left operand");
    b.check(k, n, "the right operand");
    let threads = if parallel {
        rayon::current_num_threads()
    } else {
        1
    };
    let parallelism = if threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: the operands' elements lie inside their slices (checked above); the caller
    // vouches for the destination.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            dst_strides.1 as isize,
            dst_strides.0 as isize,
            accumulate,
            a.data.as_ptr(),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr(),
            b.cs as isize,
            b.rs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}
