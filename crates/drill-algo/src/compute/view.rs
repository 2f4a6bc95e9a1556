//! [`View`]: a strided matrix view of a slice, the operand type of every product
//! ([`super::gemm`], [`super::bf16`]).

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
        if m > 0 && n > 0 {
            let last = (m - 1) * self.rs + (n - 1) * self.cs;
            assert!(last < self.data.len(), "matmul: {what} is too small");
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
