//! Screen preprocessing: the max of the last two frames and OpenCV's `INTER_AREA` resize
//! (`cv2.resize(frame, (84, 84), interpolation=cv2.INTER_AREA)`), reimplemented so that no
//! OpenCV is needed. The weights and the order of the float sums follow OpenCV's
//! `computeResizeAreaTab` and `ResizeArea_Invoker`, so frames agree with Gymnasium's
//! `AtariPreprocessing` pixel for pixel (checked by the fixtures in `tests/atari_parity.rs`).

/// One source pixel's share of one destination pixel along an axis.
#[derive(Clone, Copy, Debug)]
struct Tap {
    dst: usize,
    src: usize,
    weight: f32,
}

/// OpenCV's `computeResizeAreaTab` for one axis (`scale` = source / destination size).
fn area_taps(ssize: usize, dsize: usize) -> Vec<Tap> {
    let scale = 1.0 / (dsize as f64 / ssize as f64);
    let mut taps = Vec::new();
    for dx in 0..dsize {
        let fsx1 = dx as f64 * scale;
        let fsx2 = fsx1 + scale;
        let cell = scale.min(ssize as f64 - fsx1);
        let mut sx2 = fsx2.floor() as i64;
        let mut sx1 = fsx1.ceil() as i64;
        sx2 = sx2.min(ssize as i64 - 1);
        sx1 = sx1.min(sx2);
        if sx1 as f64 - fsx1 > 1e-3 {
            taps.push(Tap {
                dst: dx,
                src: (sx1 - 1) as usize,
                weight: ((sx1 as f64 - fsx1) / cell) as f32,
            });
        }
        for sx in sx1..sx2 {
            taps.push(Tap {
                dst: dx,
                src: sx as usize,
                weight: (1.0 / cell) as f32,
            });
        }
        if fsx2 - sx2 as f64 > 1e-3 {
            taps.push(Tap {
                dst: dx,
                src: sx2 as usize,
                weight: ((fsx2 - sx2 as f64).min(1.0).min(cell) / cell) as f32,
            });
        }
    }
    taps
}

/// A grayscale area resize from `src` (height, width) to `dst` (height, width), with its
/// tables and row buffers made once.
pub struct AreaResize {
    src: (usize, usize),
    dst: (usize, usize),
    xtaps: Vec<Tap>,
    ytaps: Vec<Tap>,
    row: Vec<f32>,
    sum: Vec<f32>,
}

impl AreaResize {
    /// A resize from `src` to `dst` (each (height, width)); only shrinking is supported.
    pub fn new(src: (usize, usize), dst: (usize, usize)) -> AreaResize {
        assert!(
            dst.0 <= src.0 && dst.1 <= src.1,
            "INTER_AREA here only shrinks"
        );
        AreaResize {
            src,
            dst,
            xtaps: area_taps(src.1, dst.1),
            ytaps: area_taps(src.0, dst.0),
            row: vec![0.0; dst.1],
            sum: vec![0.0; dst.1],
        }
    }

    /// Resize `src` (height*width bytes) into `out` (the destination's bytes).
    pub fn run(&mut self, src: &[u8], out: &mut [u8]) {
        let (sh, sw) = self.src;
        let (dh, dw) = self.dst;
        assert_eq!(src.len(), sh * sw);
        assert_eq!(out.len(), dh * dw);
        let mut prev = None;
        for t in &self.ytaps {
            let line = &src[t.src * sw..(t.src + 1) * sw];
            self.row.fill(0.0);
            for x in &self.xtaps {
                self.row[x.dst] += f32::from(line[x.src]) * x.weight;
            }
            if prev != Some(t.dst) {
                if let Some(p) = prev {
                    store(&self.sum, &mut out[p * dw..(p + 1) * dw]);
                }
                for (s, r) in self.sum.iter_mut().zip(&self.row) {
                    *s = t.weight * r;
                }
                prev = Some(t.dst);
            } else {
                for (s, r) in self.sum.iter_mut().zip(&self.row) {
                    *s += t.weight * r;
                }
            }
        }
        if let Some(p) = prev {
            store(&self.sum, &mut out[p * dw..(p + 1) * dw]);
        }
    }
}

/// OpenCV's `saturate_cast<uchar>(float)`: round half to even, clamp to 0..=255.
fn store(sum: &[f32], out: &mut [u8]) {
    for (o, s) in out.iter_mut().zip(sum) {
        *o = s.round_ties_even().clamp(0.0, 255.0) as u8;
    }
}

/// `a = max(a, b)` element-wise (the max-pool of the last two frames).
pub fn max_into(a: &mut [u8], b: &[u8]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x = (*x).max(*y);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flat_screen_stays_flat_and_weights_sum_to_one() {
        for (s, d) in [(210, 84), (160, 84), (168, 84), (100, 100)] {
            let taps = area_taps(s, d);
            for dx in 0..d {
                let w: f32 = taps.iter().filter(|t| t.dst == dx).map(|t| t.weight).sum();
                assert!((w - 1.0).abs() < 1e-5, "{s}->{d} dst {dx}: weights sum {w}");
            }
        }
        let mut r = AreaResize::new((210, 160), (84, 84));
        let mut out = vec![0u8; 84 * 84];
        r.run(&vec![137u8; 210 * 160], &mut out);
        assert!(out.iter().all(|&v| v == 137));
    }

    #[test]
    fn an_integer_factor_averages_blocks() {
        // 4x4 -> 2x2: each output is the mean of a 2x2 block (rounded half to even).
        let src = [0u8, 2, 10, 20, 4, 6, 30, 40, 1, 1, 255, 255, 1, 2, 255, 254];
        let mut out = [0u8; 4];
        AreaResize::new((4, 4), (2, 2)).run(&src, &mut out);
        assert_eq!(out, [3, 25, 1, 255]);
    }
}
