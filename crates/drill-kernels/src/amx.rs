//! Intel AMX tiles for bf16 products ([`super::bf16::Level::Amx`]): the process asks Linux for
//! the tile state once ([`available`]); a product job loads the tile configuration (eight
//! tiles of 16 rows by 64 bytes), computes 32 x 32 blocks of f32 on 2 x 2 accumulator tiles
//! with `tdpbf16ps` (16 x 16 x 32 bf16 multiply-adds each), and releases the tiles.
//!
//! The operands are pairs of bf16 along the depth in `u32`s ([`super::bf16`]'s packing): the
//! left one row-major (a tile is 16 rows of 16 pairs, `lda` pairs apart), the right one in
//! panels of 16 columns (a tile is 16 consecutive depth pairs of a panel: 1 KB, contiguous).
//! [`super::amx_conv`]'s convolutions use the same accumulators piecewise
//! ([`Tiles::start_from_rows`], [`Tiles::accumulate`], [`Tiles::store`]), with left tiles of up
//! to 16 rows read at any stride: output positions where they lie in a channels-last input.
//! Written as inline assembly because stable Rust has no AMX intrinsics; the instructions need
//! no target feature (the assembler takes them), only the CPU check and Linux's permission.

/// Rows and columns of a tile, and depth pairs per tile step.
pub const TILE: usize = 16;
/// Rows and columns of the block one job step computes (2 x 2 tiles).
pub const BLOCK: usize = 2 * TILE;

/// Whether this CPU has AMX-TILE and AMX-BF16 and Linux lets this process use them (asked once:
/// `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`; without that permission the first
/// tile instruction faults).
pub fn available() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| {
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        {
            // CPUID leaf 7: EDX bit 22 AMX-BF16, bit 24 AMX-TILE.
            let leaf = std::arch::x86_64::__cpuid_count(7, 0);
            let amx = leaf.edx & (1 << 22) != 0 && leaf.edx & (1 << 24) != 0;
            const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
            const XFEATURE_XTILEDATA: libc::c_long = 18;
            // SAFETY: arch_prctl with this request only changes which state components the
            // process may use; it reads and writes no memory of ours.
            amx && unsafe {
                libc::syscall(
                    libc::SYS_arch_prctl,
                    ARCH_REQ_XCOMP_PERM,
                    XFEATURE_XTILEDATA,
                )
            } == 0
        }
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
        false
    })
}

/// This thread's tiles configured for as long as the value lives (released when it is
/// dropped, so the thread's AMX state is back to its initial, cheap-to-switch state): tiles 0
/// to 3 accumulators, 4 and 5 left operands, 6 and 7 right operands. Not `Send`: the
/// configuration belongs to the thread that loaded it.
pub struct Tiles {
    rows: usize,
    _thread: std::marker::PhantomData<*const ()>,
}

impl Tiles {
    /// Load the configuration for [`Tiles::block`]: palette 1, tiles 0 to 7 of 16 rows by 64
    /// bytes.
    ///
    /// # Safety
    /// [`available`] must have returned `true` in this process.
    #[cfg(target_arch = "x86_64")]
    pub unsafe fn load() -> Tiles {
        // SAFETY: the caller's contract.
        unsafe { Tiles::load_rows(TILE) }
    }

    /// Load a configuration whose accumulators and left operands (tiles 0 to 5) have `rows`
    /// rows (1 to 16), the right operands 16; every row 64 bytes.
    ///
    /// # Safety
    /// [`available`] must have returned `true` in this process.
    #[cfg(target_arch = "x86_64")]
    pub unsafe fn load_rows(rows: usize) -> Tiles {
        assert!((1..=TILE).contains(&rows), "AMX tiles of {rows} rows");
        #[repr(C, align(64))]
        struct Config([u8; 64]);
        let mut cfg = Config([0; 64]);
        cfg.0[0] = 1;
        for t in 0..8 {
            // Bytes 16.. are each tile's row length in bytes (u16), bytes 48.. its rows.
            cfg.0[16 + 2 * t] = (TILE * 4) as u8;
            cfg.0[48 + t] = if t < 6 { rows as u8 } else { TILE as u8 };
        }
        // SAFETY: the caller vouches for AMX and the permission; the 64-byte configuration is
        // valid (palette 1, every used tile within 16 rows and 64 bytes).
        unsafe { std::arch::asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack)) };
        Tiles {
            rows,
            _thread: std::marker::PhantomData,
        }
    }

    /// Rows of the accumulator and left-operand tiles.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Start the four accumulators from a row of 16 floats each, repeated down the tile:
    /// tiles 0 and 2 from `r0`, tiles 1 and 3 from `r1` (a bias per column).
    ///
    /// # Safety
    /// `r0` and `r1` must be readable for 16 floats.
    #[cfg(target_arch = "x86_64")]
    pub unsafe fn start_from_rows(&self, r0: *const f32, r1: *const f32) {
        // SAFETY: a stride of 0 reads the same 64 bytes for every row; the caller vouches
        // for them.
        unsafe {
            std::arch::asm!(
                "tileloadd tmm0, [{r0} + {z}*1]",
                "tileloadd tmm1, [{r1} + {z}*1]",
                "tileloadd tmm2, [{r0} + {z}*1]",
                "tileloadd tmm3, [{r1} + {z}*1]",
                r0 = in(reg) r0, r1 = in(reg) r1, z = in(reg) 0usize,
                options(nostack, readonly),
            );
        }
    }

    /// `tile 2i + j += a_i * b_j` over `steps` depth steps, for two left tiles whose rows are
    /// `sa` bytes apart (`a0` and `a1` their first rows; each step 64 bytes, 16 bf16 pairs,
    /// further along the row) and two right panels (`b0`, `b1`: 16 pairs by 16 columns a
    /// step, the steps 1 KB apart). The left rows are read where they lie: a convolution's
    /// input positions, [`super::amx_conv`].
    ///
    /// # Safety
    /// `a0` and `a1` must be readable at `r * sa + q` for `r < self.rows()`, `q < 64 * steps`
    /// bytes; `b0` and `b1` for `steps * 256` values each; `steps > 0`.
    #[cfg(target_arch = "x86_64")]
    pub unsafe fn accumulate(
        &self,
        (a0, a1): (*const u16, *const u16),
        sa: usize,
        (b0, b1): (*const u32, *const u32),
        steps: usize,
    ) {
        debug_assert!(steps > 0);
        // SAFETY: the caller vouches for the operands' extent.
        unsafe {
            std::arch::asm!(
                "2:",
                "tileloadd tmm4, [{a0} + {sa}*1]",
                "tileloadd tmm6, [{b0} + {sb}*1]",
                "tileloadd tmm5, [{a1} + {sa}*1]",
                "tileloadd tmm7, [{b1} + {sb}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                "add {a0}, 64",
                "add {a1}, 64",
                "add {b0}, 1024",
                "add {b1}, 1024",
                "dec {n}",
                "jnz 2b",
                a0 = inout(reg) a0 => _,
                a1 = inout(reg) a1 => _,
                b0 = inout(reg) b0 => _,
                b1 = inout(reg) b1 => _,
                n = inout(reg) steps => _,
                sa = in(reg) sa,
                sb = in(reg) TILE * 4,
                options(nostack, readonly),
            );
        }
    }

    /// Store the four accumulators: tile `i` at `c[i]`, rows `ldc` floats apart.
    ///
    /// # Safety
    /// `c[i]` must be writable at `r * ldc + j` for `r < self.rows()`, `j < 16`.
    #[cfg(target_arch = "x86_64")]
    pub unsafe fn store(&self, c: [*mut f32; 4], ldc: usize) {
        // SAFETY: the caller vouches for the destinations.
        unsafe {
            std::arch::asm!(
                "tilestored [{c0} + {sc}*1], tmm0",
                "tilestored [{c1} + {sc}*1], tmm1",
                "tilestored [{c2} + {sc}*1], tmm2",
                "tilestored [{c3} + {sc}*1], tmm3",
                c0 = in(reg) c[0], c1 = in(reg) c[1], c2 = in(reg) c[2], c3 = in(reg) c[3],
                sc = in(reg) ldc * 4,
                options(nostack),
            );
        }
    }

    /// `c (32 x 32, rows ldc floats apart) = [c +] a (32 rows) * b (two panels of 16
    /// columns)` over `steps` depth steps of 16 pairs: `a` the first row of the left
    /// operand's two row tiles (`lda` pairs a row), `b0` and `b1` the start of the two right
    /// panels' first step (16 pairs by 16 columns, steps one after another). The accumulators
    /// start from `c` when `accumulate`, else from zero.
    ///
    /// # Safety
    /// `a` must be readable at `r * lda + p` for `r < 32`, `p < 16 * steps`; `b0` and `b1` at
    /// `steps * 256` values each; `c` readable (when accumulating) and writable at
    /// `r * ldc + j` for `r, j < 32`; `steps > 0`.
    #[cfg(target_arch = "x86_64")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn block(
        &self,
        a: *const u32,
        lda: usize,
        (b0, b1): (*const u32, *const u32),
        steps: usize,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    ) {
        debug_assert!(
            steps > 0 && self.rows() == TILE,
            "a block needs 16-row tiles"
        );
        // SAFETY: the caller vouches for the extent of `c` (32 rows of 32 floats, ldc apart;
        // the right tiles 16 floats in, the lower ones 16 rows down) and of the operands (the
        // lower row tile 16 rows of `lda` pairs down); tiles 0 to 3 hold the accumulators
        // between the three steps (the compiler does not use tile registers).
        unsafe {
            let c = corners(c, (0, TILE), 0, ldc);
            if accumulate {
                self.load_accumulators(c, ldc);
            } else {
                std::arch::asm!(
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "tilezero tmm2",
                    "tilezero tmm3",
                    options(nostack, nomem),
                );
            }
            let a = a as *const u16;
            let a1 = a.add(2 * TILE * lda);
            self.accumulate((a, a1), lda * 4, (b0, b1), steps);
            self.store(c, ldc);
        }
    }

    /// Load the four accumulators: tile `i` from `c[i]`, rows `ldc` floats apart.
    ///
    /// # Safety
    /// `c[i]` must be readable at `r * ldc + j` for `r < self.rows()`, `j < 16`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load_accumulators(&self, c: [*mut f32; 4], ldc: usize) {
        // SAFETY: the caller vouches for the sources.
        unsafe {
            std::arch::asm!(
                "tileloadd tmm0, [{c0} + {sc}*1]",
                "tileloadd tmm1, [{c1} + {sc}*1]",
                "tileloadd tmm2, [{c2} + {sc}*1]",
                "tileloadd tmm3, [{c3} + {sc}*1]",
                c0 = in(reg) c[0], c1 = in(reg) c[1], c2 = in(reg) c[2], c3 = in(reg) c[3],
                sc = in(reg) ldc * 4,
                options(nostack, readonly),
            );
        }
    }
}

/// Where [`Tiles::store`] puts the four accumulators of a block of `c` (rows `ld` floats
/// apart) whose two row tiles start at rows `r0` and `r1` and whose two column tiles at column
/// `col` and 16 further: `[(r0, col), (r0, col + 16), (r1, col), (r1, col + 16)]`.
pub fn corners(c: *mut f32, (r0, r1): (usize, usize), col: usize, ld: usize) -> [*mut f32; 4] {
    let at = |r: usize, j: usize| c.wrapping_add(r * ld + j);
    [
        at(r0, col),
        at(r0, col + TILE),
        at(r1, col),
        at(r1, col + TILE),
    ]
}

impl Drop for Tiles {
    fn drop(&mut self) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a `Tiles` exists only after `load` ran on this thread (AMX is there).
        unsafe {
            std::arch::asm!("tilerelease", options(nostack, nomem))
        };
    }
}
