//! One safe entry point for matrix products, [`matmul`] over strided views of slices: small
//! products (dense layers of small nets), products of few rows (a batch of 4 or 8 frames
//! through a wide dense layer) and shallow ones (a wide dense layer's weight gradient over a
//! batch of 32) go to [`super::small_gemm`], the rest to the `gemm`
//! crate (burn-flex's own GEMM; drill enables its AVX-512 kernels, picked at run time); with
//! `policy.precision = "bf16"` all but the small and few-row ones go to [`super::bf16`]
//! instead. [`gathered`] is the entry for the products of [`super::implicit`]'s
//! convolutions, whose left operand is no strided matrix. A dense layer's weight that few-row
//! products read again unchanged (the acting copy's) is kept packed by
//! [`crate::dense::Packing`] and multiplied by `few_rows_panels` or in bf16.

use super::small_gemm;
pub use super::small_gemm::Epilogue;
pub use super::view::View;
use super::view::extent;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// `dst (m x n) = [dst +] a (m x k) * b (k x n)`. `dst` is strided by `(row, column)`
/// strides `dst_strides`. Products of at most [`small_gemm::MAX_MACS`] multiply-adds into a
/// row-major destination run on one thread in [`super::small_gemm`]; in f32, products of at
/// most [`small_gemm::FEW_ROWS`] rows (or `SOME_ROWS` with a right operand larger than L2)
/// with a row-major right operand too, a block of columns per thread, and those of depth at
/// most `SHALLOW`, a block of rows per thread; the others run on the
/// rayon pool when `parallel` and the pool has threads (callers that already split work over
/// threads pass `false`).
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
            Epilogue::default(),
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
    product_then((m, n, k), a, b, Epilogue::default(), parallel)
}

/// [`product`] with `epilogue` applied to every element: in the small kernel's registers
/// before the store, otherwise in one pass after the product.
pub fn product_then(
    (m, n, k): (usize, usize, usize),
    a: View<'_>,
    b: View<'_>,
    epilogue: Epilogue<'_>,
    parallel: bool,
) -> Vec<f32> {
    if let Some(bias) = epilogue.bias {
        assert_eq!(bias.len(), n, "matmul: one bias per column");
    }
    if m == 0 || n == 0 || k == 0 {
        let mut out = vec![0.0; m * n];
        epilogue.apply(&mut out, n);
        return out;
    }
    let mut out: Vec<f32> = Vec::with_capacity(m * n);
    // SAFETY: the allocation holds m * n elements, exactly what the row-major strides reach;
    // with `accumulate` false and k > 0, both kernels write every one of them without reading
    // any, so all are initialised before `set_len`.
    unsafe {
        gemm_into(
            out.as_mut_ptr(),
            (m, n, k),
            (n, 1),
            false,
            a,
            b,
            epilogue,
            parallel,
        );
        out.set_len(m * n);
    }
    out
}

/// [`small_gemm::gathered`] (a convolution's product without a patch matrix), timed when a
/// [`profile`] is running.
///
/// # Safety
/// As [`small_gemm::gathered`]'s.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gathered(
    (m, n, k): (usize, usize, usize),
    dst: *mut f32,
    ldc: usize,
    accumulate: bool,
    a: *const f32,
    (rows, offsets): (&[usize], &[usize]),
    b: *const f32,
    ldb: usize,
    epilogue: Epilogue<'_>,
) {
    let start = PROFILING.load(Ordering::Relaxed).then(Instant::now);
    // SAFETY: the caller's promise, passed on.
    unsafe {
        small_gemm::gathered(
            (m, n, k),
            dst,
            ldc,
            accumulate,
            a,
            (rows, offsets),
            b,
            ldb,
            epilogue,
        )
    };
    if let Some(start) = start {
        let seconds = start.elapsed().as_secs_f64();
        TIMED.lock().unwrap_or_else(|e| e.into_inner()).push(Timed {
            shape: (m, n, k),
            kernel: "gathered",
            seconds,
            strides: [(0, 0), (ldb, 1), (ldc, 1)],
            accumulate,
            gather: Some(Arc::new((rows[..m].to_vec(), offsets[..k].to_vec()))),
        });
    }
}

/// The call into `gemm` (or [`small_gemm`]), after checking the operands; timed when a
/// [`profile`] is running.
///
/// # Safety
/// `dst` must be valid for writes (and reads, when `accumulate`) at every element of the
/// `m x n` matrix its strides describe, and must not alias `a` or `b`.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_into(
    dst: *mut f32,
    shape: (usize, usize, usize),
    dst_strides: (usize, usize),
    accumulate: bool,
    a: View<'_>,
    b: View<'_>,
    epilogue: Epilogue<'_>,
    parallel: bool,
) {
    let start = PROFILING.load(Ordering::Relaxed).then(Instant::now);
    // SAFETY: the caller's promise, passed on.
    let kernel = unsafe {
        dispatch(
            dst,
            shape,
            dst_strides,
            accumulate,
            a,
            b,
            epilogue,
            parallel,
        )
    };
    if let Some(start) = start {
        let seconds = start.elapsed().as_secs_f64();
        TIMED.lock().unwrap_or_else(|e| e.into_inner()).push(Timed {
            shape,
            kernel,
            seconds,
            strides: [(a.rs, a.cs), (b.rs, b.cs), dst_strides],
            accumulate,
            gather: None,
        });
    }
}

/// Whether [`profile`] is running, and the products it has timed so far (on any thread).
static PROFILING: AtomicBool = AtomicBool::new(false);
static TIMED: Mutex<Vec<Timed>> = Mutex::new(Vec::new());

/// One product timed by [`profile`].
#[derive(Clone, Debug, PartialEq)]
pub struct Timed {
    /// `(m, n, k)`: `m x k` times `k x n`.
    pub shape: (usize, usize, usize),
    /// The kernel that computed it: `"small"`, `"few-rows"`, `"shallow"`, `"bf16"`, `"gemm"`
    /// or `"gathered"`.
    pub kernel: &'static str,
    /// Its wall time, epilogue included.
    pub seconds: f64,
    /// `(row, column)` strides of the left operand, the right operand and the destination.
    pub strides: [(usize, usize); 3],
    /// Whether the product was added to the destination.
    pub accumulate: bool,
    /// A gathered left operand's row and depth offsets ([`gathered`]; its strides then are
    /// `(0, 0)`).
    pub gather: Option<Arc<(Vec<usize>, Vec<usize>)>>,
}

/// Seconds per call of the product `t` describes (same shape, strides, accumulation and
/// kernel choice, no epilogue) on this thread, alone: repeated on the same operands, so they
/// are as hot in cache as they can be. Beside `t.seconds`, what the kernel itself reaches
/// and what the state of the update's data costs it. The median of 5 rounds of at least
/// `min_seconds` / 5 each.
pub fn time_alone(t: &Timed, min_seconds: f64) -> f64 {
    let (m, n, k) = t.shape;
    let [sa, sb, sd] = t.strides;
    let fill = |len: usize| -> Vec<f32> { (0..len).map(|i| (i % 17) as f32 / 17.0).collect() };
    let a_len = match &t.gather {
        Some(tables) => {
            let reach = |v: &[usize]| v.iter().max().copied().unwrap_or(0);
            reach(&tables.0) + reach(&tables.1) + 1
        }
        None => extent(m, k, sa),
    };
    let a = fill(a_len);
    let b = fill(extent(k, n, sb));
    let mut dst = vec![0f32; extent(m, n, sd)];
    let view = |data, (rs, cs)| View { data, rs, cs };
    let mut call = || {
        if let Some(tables) = &t.gather {
            // SAFETY: `a` reaches the largest row offset plus the largest depth offset, `b`
            // and `dst` hold the k x n and m x n matrices their strides describe.
            unsafe {
                gathered(
                    t.shape,
                    dst.as_mut_ptr(),
                    sd.0,
                    t.accumulate,
                    a.as_ptr(),
                    (&tables.0, &tables.1),
                    b.as_ptr(),
                    sb.0,
                    Epilogue::default(),
                )
            };
            return;
        }
        matmul(
            t.shape,
            &mut dst,
            sd,
            t.accumulate,
            view(&a, sa),
            view(&b, sb),
            false,
        )
    };
    call();
    let mut rounds = Vec::with_capacity(5);
    for _ in 0..5 {
        let (start, mut calls) = (Instant::now(), 0u32);
        while calls == 0 || start.elapsed().as_secs_f64() < min_seconds / 5.0 {
            call();
            calls += 1;
        }
        rounds.push(start.elapsed().as_secs_f64() / f64::from(calls));
    }
    rounds.sort_by(f64::total_cmp);
    rounds[2]
}

/// Runs `f` and returns every product computed while it ran (by `f` or any other thread), in
/// the order they finished, each timed: where an update's time goes, for
/// `drill bench learner --case nature-cnn-products`. One profile at a time (calls wait for
/// each other); products outside a profile cost one relaxed atomic load.
pub fn profile(f: impl FnOnce()) -> Vec<Timed> {
    static ONE: Mutex<()> = Mutex::new(());
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    TIMED.lock().unwrap_or_else(|e| e.into_inner()).clear();
    PROFILING.store(true, Ordering::Relaxed);
    // Stop timing even if `f` panics.
    struct Stop;
    impl Drop for Stop {
        fn drop(&mut self) {
            PROFILING.store(false, Ordering::Relaxed);
        }
    }
    let stop = Stop;
    f();
    drop(stop);
    std::mem::take(&mut *TIMED.lock().unwrap_or_else(|e| e.into_inner()))
}

/// [`gemm_into`]'s work: the product by the kernel that suits it, whose name it returns.
///
/// # Safety
/// As [`gemm_into`]'s.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn dispatch(
    dst: *mut f32,
    (m, n, k): (usize, usize, usize),
    dst_strides: (usize, usize),
    accumulate: bool,
    a: View<'_>,
    b: View<'_>,
    epilogue: Epilogue<'_>,
    parallel: bool,
) -> &'static str {
    a.check(m, k, "the left operand");
    b.check(k, n, "the right operand");
    if m * n * k <= small_gemm::MAX_MACS && dst_strides.1 == 1 && (b.cs == 1 || b.rs == 1) {
        // A transposed right operand (a dense layer's input gradient) is laid out row-major
        // first: the small kernel reads whole vectors of a row.
        let transposed;
        let (rhs, ldb) = if b.cs == 1 {
            (b.data, b.rs)
        } else {
            transposed = b.to_row_major(k, n);
            (&transposed[..], n)
        };
        // SAFETY: the operands' elements lie inside their slices (checked above, and the
        // transposed copy is exactly k x n); the caller vouches for the destination.
        unsafe {
            small_gemm::matmul(
                (m, n, k),
                dst,
                dst_strides.0,
                accumulate,
                a.data.as_ptr(),
                (a.rs, a.cs),
                rhs.as_ptr(),
                ldb,
                epilogue,
            );
        }
        return "small";
    }
    let threads = if parallel {
        rayon::current_num_threads()
    } else {
        1
    };
    let few = m <= small_gemm::FEW_ROWS || reads_right_once(m, n, k);
    if few && dst_strides.1 == 1 && b.cs == 1 {
        // SAFETY: as below; the caller vouches for the destination.
        unsafe {
            few_rows(
                dst,
                (m, n, k),
                dst_strides.0,
                accumulate,
                a,
                b,
                epilogue,
                threads,
            )
        };
        return "few-rows";
    }
    // In bf16 precision, all but the few-row products above: those read the right operand
    // once either way, and converting it would cost what bf16 saves (an acting batch through
    // a wide dense layer; one whose weight is read again unchanged is kept packed in bf16 by
    // `dense::Packing`, and does not come here).
    if super::bf16::enabled() {
        // SAFETY: as for `gemm` below: the operands were checked, the caller vouches for
        // the destination.
        unsafe {
            super::bf16::gemm(
                super::bf16::Level::current(),
                dst,
                (m, n, k),
                dst_strides,
                accumulate,
                a,
                b,
                parallel,
            );
        }
        if epilogue.bias.is_some() || epilogue.relu {
            // SAFETY: as below.
            epilogue.apply(unsafe { std::slice::from_raw_parts_mut(dst, m * n) }, n);
        }
        return "bf16";
    }
    if k <= SHALLOW && m >= SHALLOW_ROWS && dst_strides.1 == 1 && b.cs == 1 {
        // SAFETY: as below; the caller vouches for the destination.
        unsafe {
            shallow(
                dst,
                (m, n, k),
                dst_strides.0,
                accumulate,
                a,
                b,
                epilogue,
                threads,
            )
        };
        return "shallow";
    }
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
    if epilogue.bias.is_some() || epilogue.relu {
        // SAFETY: `product_then`, the only caller with an epilogue, passes its row-major
        // m x n buffer, now fully written.
        epilogue.apply(unsafe { std::slice::from_raw_parts_mut(dst, m * n) }, n);
    }
    "gemm"
}

/// Whether an `m x n x k` product has so few rows for its right operand, one larger than L2,
/// that it reads it once from memory whatever the kernel: [`few_rows`]'s second case, and
/// the weights [`crate::dense::Packing`] keeps packed.
pub(super) fn reads_right_once(m: usize, n: usize, k: usize) -> bool {
    m <= SOME_ROWS && k * n >= LARGE_RIGHT
}

/// Products of at most this many rows also go to [`few_rows`] when their right operand
/// holds at least [`LARGE_RIGHT`] values: `gemm` reads a right operand in place for up to 32
/// rows, and the DQN learner's batch of 32 through the Nature CNN's 3136 x 512 weight waits
/// on memory there. The convolutions' products of 32 rows (patches smaller than L2) stay in
/// `gemm`, which runs them faster.
const SOME_ROWS: usize = 32;

/// A right operand of at least this many values (4 MiB) is larger than L2.
const LARGE_RIGHT: usize = 1 << 20;

/// Products of at most this depth (and at least [`SHALLOW_ROWS`] rows) go to [`shallow`]: a
/// dense layer's weight gradient over a batch of 32, `x^T dy`.
const SHALLOW: usize = 32;

/// Rows from which a product of depth at most [`SHALLOW`] goes to [`shallow`].
const SHALLOW_ROWS: usize = 256;

/// A product of depth at most [`SHALLOW`] with a row-major right operand (the Nature CNN's
/// dense weight gradient at batch 32: 3136 x 512 outputs of 32 multiply-adds each) in
/// [`small_gemm`], one block of rows per thread. Each tile reads its whole depth of both
/// operands (a few KiB, in L1 and L2) and stores its outputs once, where `gemm` would pack
/// both operands for a depth of only 32 (`drill bench learner --case nature-cnn-products`
/// times the two).
///
/// # Safety
/// As [`gemm_into`]'s, with `dst` row-major (row stride `ldc`, column stride 1).
#[allow(clippy::too_many_arguments)]
unsafe fn shallow(
    dst: *mut f32,
    (m, n, k): (usize, usize, usize),
    ldc: usize,
    accumulate: bool,
    a: View<'_>,
    b: View<'_>,
    epilogue: Epilogue<'_>,
    threads: usize,
) {
    // Blocks of whole tiles: 24 rows are 4 of AVX2's 6-row tiles, or 4 or 3 of AVX-512's
    // 6- or 8-row ones (`small_gemm::tile_shape`).
    let dst = dst as usize;
    per_thread_blocks(m, 24, threads, |i, rows| {
        // SAFETY: rows `i..i + rows` of the destination and of `a` lie inside the regions
        // the caller and `gemm_into`'s checks vouch for; blocks do not overlap.
        unsafe {
            small_gemm::matmul(
                (rows, n, k),
                (dst as *mut f32).add(i * ldc),
                ldc,
                accumulate,
                a.data.as_ptr().add(i * a.rs),
                (a.rs, a.cs),
                b.data.as_ptr(),
                b.rs,
                epilogue,
            );
        }
    });
}

/// `run(start, len)` over `0..total` split into one block per thread, each a whole number of
/// `unit`s (the last one shorter); on the calling thread when one block covers it. The
/// destinations of [`shallow`] and [`few_rows`] travel to the threads as addresses (raw
/// pointers are not `Sync`).
fn per_thread_blocks(total: usize, unit: usize, threads: usize, run: impl Fn(usize, usize) + Sync) {
    if total == 0 {
        return;
    }
    let block = total
        .div_ceil(threads.max(1))
        .next_multiple_of(unit)
        .min(total);
    let blocks = total.div_ceil(block);
    if blocks == 1 {
        run(0, total);
    } else {
        use rayon::prelude::*;
        (0..blocks)
            .into_par_iter()
            .for_each(|t| run(t * block, block.min(total - t * block)));
    }
}

thread_local! {
    /// This thread's copy of one depth step of [`few_rows`]'s right operand.
    static STAGE: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Rows of the right operand one pass of [`few_rows`] takes: 64 rows of a 512-column weight
/// are 128 KiB, so that the copy computed from and the next one prefetched fill half an L2
/// cache: the fastest of 32-128 (`drill bench learner --case nature-cnn-products`).
const FEW_ROWS_DEPTH: usize = 64;

/// A product of at most [`small_gemm::FEW_ROWS`] rows (or [`SOME_ROWS`] with a large right
/// operand) with a row-major right operand (the collector's and evaluator's forward pass
/// through a dense layer: a batch of 4 or 8 frames times the Nature CNN's 3136 x 512 weight;
/// the DQN learner's batch of 32 through it) in [`small_gemm`], a depth step of the right
/// operand at a time, each copied row by row into a buffer first: `gemm` packs all of it into
/// panels, a costlier copy for only `m` rows of use. While one step computes, it prefetches
/// the rows the next step copies ([`small_gemm::matmul_prefetching`]): the weight comes from
/// memory (Adam rewrote it since the last pass), and copied without that the copy waited on
/// it, 27 % of the product on one thread. Read in place instead (no copy, the next panel
/// prefetched), the product was slower still: a panel's rows 2 KB apart fall into a few cache
/// sets and evict each other. The columns are split into one block per thread.
///
/// # Safety
/// As [`gemm_into`]'s, with `dst` row-major (row stride `ldc`, column stride 1).
#[allow(clippy::too_many_arguments)]
unsafe fn few_rows(
    dst: *mut f32,
    (m, n, k): (usize, usize, usize),
    ldc: usize,
    accumulate: bool,
    a: View<'_>,
    b: View<'_>,
    epilogue: Epilogue<'_>,
    threads: usize,
) {
    // Blocks of whole 16-column groups, so that every thread's tiles stay full.
    let dst = dst as usize;
    per_thread_blocks(n, 16, threads, |j, cols| {
        // Depth in steps of `FEW_ROWS_DEPTH` rows of `b`, each step's block copied row by row
        // into a contiguous buffer that stays in L2 while every row tile passes over it. Read
        // in place, a tile's depth loop takes one cache line from each of its rows 2 KB apart
        // (the Nature CNN's 512 columns), which the hardware prefetchers do not follow: the
        // product waited on memory for every line.
        let mut stage = STAGE.take();
        if stage.len() < FEW_ROWS_DEPTH * cols {
            stage.resize(FEW_ROWS_DEPTH * cols, 0.0);
        }
        let block = (dst as *mut f32, j, cols);
        // SAFETY: columns `j..j + cols` of the destination and the matching columns of `a` lie
        // inside the regions the caller and `gemm_into`'s checks vouch for; blocks do not
        // overlap; each step's rows are in the stage, `cols` apart; `next` is only prefetched.
        unsafe {
            depth_steps(block, (m, k), ldc, accumulate, a, epilogue, |d, depth| {
                for (r, row) in stage.chunks_exact_mut(cols).take(depth).enumerate() {
                    let at = (d + r) * b.rs + j;
                    row.copy_from_slice(&b.data[at..at + cols]);
                }
                // The next step's rows, prefetched while this one computes, so that its copy
                // does not wait on memory.
                let next = if d + depth == k {
                    std::ptr::null()
                } else {
                    b.data.as_ptr().wrapping_add((d + depth) * b.rs + j)
                };
                ((stage.as_ptr(), cols), (next, b.rs))
            });
        }
        STAGE.set(stage);
    });
}

/// The depth steps of one column block of a few-row product, `(dst, j, cols)`: columns
/// `j..j + cols` of a row-major `m x n` destination (row stride `ldc`) get `a (m x k)` times
/// the block, [`FEW_ROWS_DEPTH`] rows at a time, each step's product added to them in order
/// (to what they held when `accumulate`), `epilogue`'s bias and ReLU after the last.
/// `rows(d, depth)` readies rows `d..d + depth` of the block and returns them (pointer, row
/// stride) with rows to prefetch while they are multiplied (pointer, row stride; null: none).
/// [`few_rows`] and [`few_rows_panels`] share it: the same steps, so the same bits.
///
/// # Safety
/// The block's columns of the destination must be valid and written by no other thread; the
/// rows `rows` returns must hold `cols` values each; `a` must hold its `m x k` elements.
#[allow(clippy::too_many_arguments)]
unsafe fn depth_steps(
    (dst, j, cols): (*mut f32, usize, usize),
    (m, k): (usize, usize),
    ldc: usize,
    accumulate: bool,
    a: View<'_>,
    epilogue: Epilogue<'_>,
    mut rows: impl FnMut(usize, usize) -> ((*const f32, usize), (*const f32, usize)),
) {
    for d in (0..k).step_by(FEW_ROWS_DEPTH) {
        let depth = FEW_ROWS_DEPTH.min(k - d);
        let ((b, ldb), next) = rows(d, depth);
        let epilogue = if d + depth == k {
            Epilogue {
                bias: epilogue.bias.map(|bias| &bias[j..j + cols]),
                relu: epilogue.relu,
            }
        } else {
            Epilogue::default()
        };
        // SAFETY: the caller's promise: the block's columns of the destination, `depth` rows
        // of `cols` at `b`, `a`'s columns `d..d + depth`; `next` is only prefetched.
        unsafe {
            small_gemm::matmul_prefetching(
                (m, cols, depth),
                dst.add(j),
                ldc,
                accumulate || d > 0,
                a.data.as_ptr().add(d * a.cs),
                (a.rs, a.cs),
                b,
                ldb,
                epilogue,
                next,
            );
        }
    }
}

/// Columns of one panel of a weight kept by [`crate::dense::Packing`] for `few_rows_panels`.
pub(super) const PANEL: usize = 64;

/// `b (k x n)`, row-major with row stride `ldb`, as contiguous panels of [`PANEL`] columns
/// (panel `t`, row `d` at `(t * k + d) * PANEL`; the last panel's missing columns zero).
pub(super) fn panels(b: &[f32], ldb: usize, (k, n): (usize, usize)) -> Vec<f32> {
    let mut out = vec![0f32; n.div_ceil(PANEL) * k * PANEL];
    for (t, panel) in out.chunks_exact_mut(k * PANEL).enumerate() {
        let (j, cols) = (t * PANEL, PANEL.min(n - t * PANEL));
        for (d, row) in panel.chunks_exact_mut(PANEL).enumerate() {
            row[..cols].copy_from_slice(&b[d * ldb + j..d * ldb + j + cols]);
        }
    }
    out
}

/// [`few_rows`] with its right operand already laid out as [`panels`] (a weight read again
/// unchanged: [`crate::dense::Packing`]), into a row-major `m x n` `dst` (row stride `ldc`):
/// no copy of the weight, which streams from memory once, a whole panel contiguous. The same
/// depth steps of [`FEW_ROWS_DEPTH`] rows, added in the same order, so the same bits as
/// [`few_rows`] from the weight itself. Whole panels per thread.
///
/// # Safety
/// As [`gemm_into`]'s, with `dst` row-major (row stride `ldc`, column stride 1); `panels`
/// must be [`panels`] of a `k x n` operand.
pub(super) unsafe fn few_rows_panels(
    dst: *mut f32,
    (m, n, k): (usize, usize, usize),
    ldc: usize,
    a: View<'_>,
    panels: &[f32],
    epilogue: Epilogue<'_>,
) {
    a.check(m, k, "the left operand");
    assert_eq!(
        panels.len(),
        n.div_ceil(PANEL) * k * PANEL,
        "panels of a k x n operand"
    );
    let dst = dst as usize;
    per_thread_blocks(n, PANEL, rayon::current_num_threads(), |j0, width| {
        for j in (j0..j0 + width).step_by(PANEL) {
            let cols = PANEL.min(n - j);
            let panel = &panels[j / PANEL * k * PANEL..][..k * PANEL];
            let block = (dst as *mut f32, j, cols);
            // SAFETY: columns `j..j + cols` of the destination (the caller's); each step's
            // rows lie in the panel, which holds k rows of PANEL; blocks of threads do not
            // overlap; `a`'s columns were checked above.
            unsafe {
                depth_steps(block, (m, k), ldc, false, a, epilogue, |d, _| {
                    ((panel[d * PANEL..].as_ptr(), PANEL), (std::ptr::null(), 0))
                });
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` values of a sine sampled from `s` in steps of 0.37.
    fn values(n: usize, s: f32) -> Vec<f32> {
        (0..n).map(|i| ((i as f32) * 0.37 + s).sin()).collect()
    }

    /// A pool of `threads` threads of its own.
    fn pool(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("a thread pool")
    }

    /// A profile names each product's shape and kernel, leaves the results as they are,
    /// and sees nothing computed outside it. Other tests may run products beside it, so it
    /// looks for its own shapes (used by no other test).
    #[test]
    fn a_profile_times_the_products_inside_it_and_no_others() {
        let v = |n: usize| values(n, 0.0);
        let shapes = [
            (3, 17, 5, "small"),
            (7, 4100, 300, "few-rows"),
            (600, 100, 20, "shallow"),
            (97, 131, 91, "gemm"),
        ];
        let run = || {
            for (m, n, k, _) in shapes {
                let (a, b) = (v(m * k), v(k * n));
                let got = product((m, n, k), View::rows(&a, k), View::rows(&b, n), true);
                for (i, j) in [(0, 0), (m - 1, n - 1), (m / 2, n / 3)] {
                    let want: f32 = (0..k).map(|d| a[i * k + d] * b[d * n + j]).sum();
                    assert!(
                        (got[i * n + j] - want).abs() < 1e-3,
                        "{m}x{n}x{k} at ({i}, {j})"
                    );
                }
            }
            // A gathered 5 x 9 x 4 product: element (i, d) of the left operand at 3 i + 7 d.
            let (a, b) = (v(3 * 4 + 7 * 3 + 1), v(4 * 9));
            let (rows, offsets): (Vec<usize>, Vec<usize>) = (
                (0..5).map(|i| 3 * i).collect(),
                (0..4).map(|d| 7 * d).collect(),
            );
            let mut c = vec![0f32; 5 * 9];
            // SAFETY: a holds 3 * 4 + 7 * 3 + 1 values, b 4 x 9 and c 5 x 9.
            unsafe {
                gathered(
                    (5, 9, 4),
                    c.as_mut_ptr(),
                    9,
                    false,
                    a.as_ptr(),
                    (&rows, &offsets),
                    b.as_ptr(),
                    9,
                    Epilogue::default(),
                )
            };
            let want: f32 = (0..4).map(|d| a[3 * 4 + 7 * d] * b[d * 9 + 8]).sum();
            assert!((c[4 * 9 + 8] - want).abs() < 1e-4, "the gathered product");
        };
        let timed = profile(run);
        let gathered: Vec<_> = timed.iter().filter(|t| t.kernel == "gathered").collect();
        assert_eq!(gathered.len(), 1, "{timed:?}");
        assert_eq!(gathered[0].shape, (5, 9, 4));
        assert_eq!(gathered[0].strides, [(0, 0), (9, 1), (9, 1)]);
        let tables = gathered[0].gather.as_deref().expect("its tables");
        assert_eq!((tables.0.len(), tables.1.len()), (5, 4));
        let alone = time_alone(gathered[0], 0.001);
        assert!(alone > 0.0 && alone.is_finite(), "gathered: {alone}");
        for (m, n, k, kernel) in shapes {
            let mine: Vec<_> = timed.iter().filter(|t| t.shape == (m, n, k)).collect();
            assert_eq!(mine.len(), 1, "{m}x{n}x{k}: {timed:?}");
            assert_eq!(mine[0].kernel, kernel, "{m}x{n}x{k}");
            assert!(mine[0].seconds > 0.0);
            assert_eq!(mine[0].strides, [(k, 1), (n, 1), (n, 1)], "{m}x{n}x{k}");
            assert!(!mine[0].accumulate);
            let alone = time_alone(mine[0], 0.001);
            assert!(alone > 0.0 && alone.is_finite(), "{m}x{n}x{k}: {alone}");
        }
        run();
        let after = profile(|| {});
        assert!(
            after
                .iter()
                .all(|t| shapes.iter().all(|&(m, n, k, _)| t.shape != (m, n, k))),
            "{after:?}"
        );
    }

    /// Shallow products (a dense weight gradient's shape) against the definition, every
    /// element: a transposed and a row-major left operand, a masked last column vector, a
    /// short last row block, accumulation, and the bias + ReLU epilogue, on 1 and 3 threads.
    #[test]
    fn shallow_products_match_the_definition() {
        for threads in [1, 3] {
            let pool = pool(threads);
            for (m, n, k) in [(1003, 70, 32), (4097, 512, 7)] {
                let (a, b, bias) = (values(m * k, 0.1), values(k * n, 0.2), values(n, 0.3));
                let at = View::transposed(&a, m).to_row_major(m, k);
                let old = values(m * n, 0.4);
                let cell = |i: usize, j: usize| -> f32 {
                    (0..k).map(|d| a[d * m + i] * b[d * n + j]).sum::<f32>()
                };
                pool.install(|| {
                    let mut added = old.clone();
                    let left = View::transposed(&a, m);
                    matmul(
                        (m, n, k),
                        &mut added,
                        (n, 1),
                        true,
                        left,
                        View::rows(&b, n),
                        true,
                    );
                    let fresh = product_then(
                        (m, n, k),
                        View::rows(&at, k),
                        View::rows(&b, n),
                        Epilogue {
                            bias: Some(&bias),
                            relu: true,
                        },
                        true,
                    );
                    for i in 0..m {
                        for j in 0..n {
                            let want = cell(i, j);
                            let (got, sum) = (fresh[i * n + j], added[i * n + j]);
                            let what = format!("{m}x{n}x{k}, {threads} threads, ({i}, {j})");
                            assert!((got - (want + bias[j]).max(0.0)).abs() < 1e-4, "{what}");
                            assert!((sum - (want + old[i * n + j])).abs() < 1e-4, "{what}");
                        }
                    }
                });
            }
        }
    }

    /// A weight kept as panels gives the few-row product's bits exactly: a ragged last panel
    /// and depth step, 1 to 32 rows, bias and ReLU, on 1 and 3 threads.
    #[test]
    fn few_rows_from_panels_give_the_few_row_product_bit_for_bit() {
        for threads in [1, 3] {
            let pool = pool(threads);
            for (m, n, k) in [
                (8, 512, 3136),
                (1, 1100, 1000),
                (32, 1030, 1100),
                (5, 70, 300),
            ] {
                let (a, b, bias) = (values(m * k, 0.1), values(k * n, 0.2), values(n, 0.3));
                let epilogue = Epilogue {
                    bias: Some(&bias),
                    relu: true,
                };
                let kept = panels(&b, n, (k, n));
                pool.install(|| {
                    let mut want = vec![0f32; m * n];
                    // SAFETY: `want` is a row-major m x n buffer of its own.
                    unsafe {
                        few_rows(
                            want.as_mut_ptr(),
                            (m, n, k),
                            n,
                            false,
                            View::rows(&a, k),
                            View::rows(&b, n),
                            epilogue,
                            threads,
                        );
                    }
                    let mut got = vec![f32::NAN; m * n];
                    // SAFETY: as above; `kept` is `panels` of b.
                    unsafe {
                        few_rows_panels(
                            got.as_mut_ptr(),
                            (m, n, k),
                            n,
                            View::rows(&a, k),
                            &kept,
                            epilogue,
                        );
                    }
                    assert!(got == want, "{m}x{n}x{k}, {threads} threads");
                });
            }
        }
    }
}
