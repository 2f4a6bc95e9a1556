//! `policy.precision = "bf16"` at the layer level: the Nature CNN's convolutions (forward,
//! weight and input gradients, on AMX's tiles where the CPU has them) and a wide dense product
//! against f32, at every kernel level this CPU has (AMX and AVX-512 BF16 where present, and
//! the portable path). Its own test binary:
//! the precision is process-wide, and one test sets it for the others' duration.

use drill_kernels::conv::{self, Geometry, Source};
use drill_kernels::precision::{self, Level};
use drill_kernels::{View, product};

mod common;
use common::{rel_err, values};

/// What each layer computes, in the process's current precision.
fn layers() -> Vec<Vec<f32>> {
    let mut out = Vec::new();
    let shape = |batch, c_in, (h, w), c_out, (kh, kw), (sh, sw)| Geometry {
        batch,
        c_in,
        h,
        w,
        c_out,
        kh,
        kw,
        sh,
        sw,
    };
    // The Nature CNN's three convolutions, batch 3; then shapes that suit AMX's tiles
    // (`conv::kernel` says "amx") with odd corners: rows of positions that split unevenly (37 into
    // tiles of 13, the last overlapping), an odd number of positions, 8 and 16 channels,
    // three blocks of 32 output channels (each product past `small_gemm::MAX_MACS`, so that
    // every level computes it in bf16).
    for g in [
        shape(3, 4, (84, 84), 32, (8, 8), (4, 4)),
        shape(3, 32, (20, 20), 64, (4, 4), (2, 2)),
        shape(3, 64, (9, 9), 64, (3, 3), (1, 1)),
        shape(2, 8, (10, 40), 96, (4, 4), (2, 1)),
        shape(3, 16, (14, 45), 64, (4, 2), (1, 3)),
    ] {
        let (c_in, c_out) = (g.c_in, g.c_out);
        if precision::enabled() && Level::current() == Level::Amx {
            assert_eq!(conv::kernel(&g), "amx", "{g:?} on AMX's tiles");
        }
        let x = values(g.batch * c_in * g.h * g.w, c_in as u32);
        let w = values(c_out * g.k(), c_out as u32 + 1);
        let b = values(c_out, 3);
        let dy = values(g.batch * c_out * g.p(), 4);
        let y = conv::forward(Source::F32(&x), &w, &b, &g, false);
        let (dw, db) = conv::backward_params(Source::F32(&x), &dy, &g);
        if c_in == 4 {
            // The first layer reads frames too: the same bits as from their values.
            let bytes: Vec<u8> = x.iter().map(|v| ((v + 1.0) * 127.5) as u8).collect();
            let converted: Vec<f32> = bytes.iter().map(|&b| f32::from(b) / 255.0).collect();
            let from_frames = conv::forward(Source::Frames(&bytes), &w, &b, &g, false);
            let from_values = conv::forward(Source::F32(&converted), &w, &b, &g, false);
            assert!(from_frames == from_values, "first layer from frames");
            let from_frames = conv::backward_params(Source::Frames(&bytes), &dy, &g);
            let from_values = conv::backward_params(Source::F32(&converted), &dy, &g);
            assert!(
                from_frames == from_values,
                "its weight gradient from frames"
            );
        }
        out.push(y);
        out.extend([dw, db, conv::backward_input(&w, &dy, &g)]);
    }
    // The dense layer after them: 3136 features to 512, batch 40, and its input gradient
    // (a transposed right operand).
    let x = values(40 * 3136, 5);
    let w = values(3136 * 512, 6);
    out.push(product(
        (40, 512, 3136),
        View::rows(&x, 3136),
        View::rows(&w, 512),
        true,
    ));
    let dy = values(40 * 512, 7);
    out.push(product(
        (40, 3136, 512),
        View::rows(&dy, 512),
        View::transposed(&w, 512),
        true,
    ));
    out
}

/// bf16 keeps 8 significant bits per operand (relative rounding error at most 2^-9), so a
/// sum of products of random-signed operands is off by about 2^-9 relative: 1 % bounds it
/// with room. The bias gradient (no product) is exact.
#[test]
fn bf16_layers_match_f32_within_bf16_rounding_at_every_level() {
    let f32_out = layers();
    let mut per_level = Vec::new();
    for level in Level::available() {
        precision::set_enabled(true);
        Level::force(Some(level));
        let out = layers();
        precision::set_enabled(false);
        Level::force(None);
        for (i, (got, want)) in out.iter().zip(&f32_out).enumerate() {
            let e = rel_err(got, want);
            assert!(e < 1e-2, "{level:?}, output {i}: relative error {e}");
            assert!(
                e > 0.0 || i % 4 == 2,
                "{level:?}, output {i}: not computed in bf16"
            );
        }
        per_level.push(out);
    }
    // The levels agree with each other to f32 rounding: the same rounded operands.
    for other in &per_level[1..] {
        for (i, (a, b)) in other.iter().zip(&per_level[0]).enumerate() {
            let e = rel_err(a, b);
            assert!(e < 1e-5, "levels differ on output {i}: relative error {e}");
        }
    }
}
