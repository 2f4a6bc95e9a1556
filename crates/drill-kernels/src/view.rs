//! [`View`]: a strided matrix view of a slice, the operand type of every product
//! ([`super::gemm`], [`super::bf16`]).

use std::mem::MaybeUninit;

/// A matrix view of a slice: element `(i, j)` is `data[i * rs + j * cs]`.
#[derive(Clone, Copy)]
pub struct View<'a> {
    pub(super) data: &'a [f32],
    pub(super) rs: usize,
    pub(super) cs: usize,
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

    /// The transpose of this view (no copy).
    pub fn t(self) -> Self {
        Self {
            data: self.data,
            rs: self.cs,
            cs: self.rs,
        }
    }

    /// The `m x n` matrix this view shows, copied into a new row-major buffer (e.g. a
    /// transposed view laid out transposed).
    pub fn to_row_major(&self, m: usize, n: usize) -> Vec<f32> {
        #[cfg(target_arch = "x86_64")]
        if self.rs == 1 && m * n > 0 && std::arch::is_x86_feature_detected!("avx2") {
            self.check(m, n, "the copied matrix");
            let mut out = Vec::with_capacity(m * n);
            // SAFETY: AVX2 was detected; the view holds the m x n matrix (the check above)
            // and the buffer has room for m * n values, all of which the transposition
            // writes before `set_len`.
            unsafe {
                transpose_avx2(self.data.as_ptr(), self.cs, m, n, out.as_mut_ptr());
                out.set_len(m * n);
            }
            return out;
        }
        self.copied_by_columns(m, n)
    }

    /// [`Self::to_row_major`] into `out`'s first `m * n` values (a buffer kept between calls).
    pub fn write_row_major(&self, m: usize, n: usize, out: &mut [f32]) {
        assert!(
            out.len() >= m * n,
            "the row-major copy's buffer is too small"
        );
        // SAFETY: `out` holds m * n values (checked above).
        unsafe { self.write_row_major_to(m, n, out.as_mut_ptr()) }
    }

    /// [`Self::write_row_major`] into memory not yet initialised (a buffer not zeroed first,
    /// as every value is written), which holds every one of its first `m * n` values after.
    pub fn write_row_major_uninit(&self, m: usize, n: usize, out: &mut [MaybeUninit<f32>]) {
        assert!(
            out.len() >= m * n,
            "the row-major copy's buffer is too small"
        );
        // SAFETY: `out` holds m * n values (checked above); they are only written.
        unsafe { self.write_row_major_to(m, n, out.as_mut_ptr().cast()) }
    }

    /// The copy of [`Self::write_row_major`], only writing `out`.
    ///
    /// # Safety
    /// `out` must be valid for `m * n` writes.
    unsafe fn write_row_major_to(&self, m: usize, n: usize, out: *mut f32) {
        self.check(m, n, "the copied matrix");
        #[cfg(target_arch = "x86_64")]
        if self.rs == 1 && m * n > 0 && std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 was detected; the view holds the m x n matrix (checked above) and
            // `out` room for m * n values (the caller's contract).
            unsafe { transpose_avx2(self.data.as_ptr(), self.cs, m, n, out) };
            return;
        }
        for i in 0..m {
            for j in 0..n {
                // SAFETY: i * n + j < m * n, inside `out` (the caller's contract).
                unsafe {
                    out.add(i * n + j)
                        .write(self.data[i * self.rs + j * self.cs])
                };
            }
        }
    }

    /// [`Self::to_row_major`] one column at a time (every view, every CPU).
    fn copied_by_columns(&self, m: usize, n: usize) -> Vec<f32> {
        self.check(m, n, "the copied matrix");
        if m == 0 || n == 0 {
            return Vec::new();
        }
        let mut out = Vec::with_capacity(m * n);
        let cells = out.spare_capacity_mut().as_mut_ptr();
        for j in 0..n {
            let from = &self.data[j * self.cs..];
            // SAFETY: j < n, and each column has m values (the check above).
            unsafe {
                if self.rs == 1 {
                    write_column(cells, n, j, from[..m].iter());
                } else {
                    write_column(cells, n, j, from.iter().step_by(self.rs).take(m));
                }
            }
        }
        // SAFETY: the loops wrote all m * n cells (the check above keeps every column m long).
        unsafe { out.set_len(m * n) };
        out
    }

    /// Panics unless every element of an `m x n` matrix lies in the slice.
    pub(super) fn check(&self, m: usize, n: usize, what: &str) {
        assert!(
            extent(m, n, (self.rs, self.cs)) <= self.data.len(),
            "matmul: {what} is too small"
        );
    }
}

/// Elements a slice needs to hold an `m x n` matrix at `(row, column)` strides `strides`: one
/// past its last element (0 for an empty matrix).
pub(super) fn extent(m: usize, n: usize, (rs, cs): (usize, usize)) -> usize {
    if m == 0 || n == 0 {
        0
    } else {
        (m - 1) * rs + (n - 1) * cs + 1
    }
}

/// `out (m x n, row-major) = a` where `a`'s column `j` is the `m` contiguous values at
/// `src + j * cs` (a transposed view): 8 x 8 blocks transposed in registers (`vunpcklps`,
/// `vshufps`, `vperm2f128`), the edges one value at a time. A copy: the same values as the
/// column-by-column loop, in a third of its instructions.
///
/// # Safety
/// The CPU must have AVX2; `src` must hold the `m x n` matrix, `out` room for `m * n` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn transpose_avx2(src: *const f32, cs: usize, m: usize, n: usize, out: *mut f32) {
    use std::arch::x86_64::*;
    let (m8, n8) = (m / 8 * 8, n / 8 * 8);
    // SAFETY: every read is of cell (i, j) at src + j cs + i with i < m, j < n, every write
    // of out + i n + j: inside both matrices (the caller's contract).
    unsafe {
        for j in (0..n8).step_by(8) {
            for i in (0..m8).step_by(8) {
                let r: [__m256; 8] =
                    std::array::from_fn(|c| _mm256_loadu_ps(src.add((j + c) * cs + i)));
                let t0 = _mm256_unpacklo_ps(r[0], r[1]);
                let t1 = _mm256_unpackhi_ps(r[0], r[1]);
                let t2 = _mm256_unpacklo_ps(r[2], r[3]);
                let t3 = _mm256_unpackhi_ps(r[2], r[3]);
                let t4 = _mm256_unpacklo_ps(r[4], r[5]);
                let t5 = _mm256_unpackhi_ps(r[4], r[5]);
                let t6 = _mm256_unpacklo_ps(r[6], r[7]);
                let t7 = _mm256_unpackhi_ps(r[6], r[7]);
                let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
                let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
                let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
                let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
                let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
                let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
                let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
                let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
                let rows = [
                    _mm256_permute2f128_ps::<0x20>(u0, u4),
                    _mm256_permute2f128_ps::<0x20>(u1, u5),
                    _mm256_permute2f128_ps::<0x20>(u2, u6),
                    _mm256_permute2f128_ps::<0x20>(u3, u7),
                    _mm256_permute2f128_ps::<0x31>(u0, u4),
                    _mm256_permute2f128_ps::<0x31>(u1, u5),
                    _mm256_permute2f128_ps::<0x31>(u2, u6),
                    _mm256_permute2f128_ps::<0x31>(u3, u7),
                ];
                for (q, row) in rows.into_iter().enumerate() {
                    _mm256_storeu_ps(out.add((i + q) * n + j), row);
                }
            }
            for i in m8..m {
                for c in j..j + 8 {
                    *out.add(i * n + c) = *src.add(c * cs + i);
                }
            }
        }
        for j in n8..n {
            for i in 0..m {
                *out.add(i * n + j) = *src.add(j * cs + i);
            }
        }
    }
}

/// Writes `column` down column `j` of the row-major buffer `cells` with `n` columns.
///
/// # Safety
/// `cells` must hold `column`'s length rows of `n` cells, and `j < n`.
unsafe fn write_column<'a>(
    cells: *mut std::mem::MaybeUninit<f32>,
    n: usize,
    j: usize,
    column: impl Iterator<Item = &'a f32>,
) {
    // SAFETY: cell (i, j), inside the buffer by the caller's contract; the last step leaves
    // `cell` one row past the end, unused.
    let mut cell = unsafe { cells.add(j) };
    for x in column {
        // SAFETY: the column's cells lie inside the buffer (the caller's contract); `cell`
        // steps one row (n) per element.
        unsafe {
            (*cell).write(*x);
            cell = cell.wrapping_add(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every shape around the 8 x 8 blocks, transposed views with padded columns, and a
    /// strided view: each cell where the definition puts it, on this CPU's path, on the
    /// column-by-column one, and written into a given buffer (initialised or not).
    #[test]
    fn to_row_major_matches_the_definition() {
        for m in [1, 7, 8, 9, 16, 21] {
            for n in [1, 5, 8, 13, 24] {
                for pad in [0, 3] {
                    let cs = m + pad;
                    let data: Vec<f32> = (0..cs * n).map(|v| v as f32).collect();
                    let view = View::transposed(&data, cs);
                    let mut written = vec![f32::NAN; m * n + 2];
                    view.write_row_major(m, n, &mut written);
                    assert!(written[m * n..].iter().all(|v| v.is_nan()), "past m x n");
                    written.truncate(m * n);
                    let mut fresh: Vec<f32> = Vec::with_capacity(m * n);
                    view.write_row_major_uninit(m, n, fresh.spare_capacity_mut());
                    // SAFETY: the call wrote all m * n values.
                    unsafe { fresh.set_len(m * n) };
                    for got in [
                        view.to_row_major(m, n),
                        view.copied_by_columns(m, n),
                        written,
                        fresh,
                    ] {
                        for i in 0..m {
                            for j in 0..n {
                                assert_eq!(got[i * n + j], data[j * cs + i], "{m}x{n} pad {pad}");
                            }
                        }
                    }
                    let strided = View {
                        rs: 2,
                        cs: 2 * m,
                        data: &data[..],
                    };
                    let mut written = vec![0.0; (m / 2) * (n / 2)];
                    strided.write_row_major(m / 2, n / 2, &mut written);
                    for got in [strided.to_row_major(m / 2, n / 2), written] {
                        for i in 0..m / 2 {
                            for j in 0..n / 2 {
                                assert_eq!(got[i * (n / 2) + j], data[2 * i + 2 * m * j]);
                            }
                        }
                    }
                }
            }
        }
    }
}
