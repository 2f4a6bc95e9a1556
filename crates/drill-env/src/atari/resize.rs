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

/// Taps regrouped per destination pixel, padded to the same count with zero weights (adding
/// `0.0 * x` leaves a non-negative sum unchanged, so the float sums are OpenCV's exactly).
struct Gather {
    /// Taps per destination pixel.
    k: usize,
    /// `dst * k + j`: source index of tap `j`.
    src: Vec<usize>,
    /// `dst * k + j`: weight of tap `j`.
    weight: Vec<f32>,
}

impl Gather {
    fn new(taps: &[Tap], dsize: usize) -> Gather {
        let k = (0..dsize)
            .map(|d| taps.iter().filter(|t| t.dst == d).count())
            .max()
            .unwrap_or(1);
        let mut src = Vec::with_capacity(dsize * k);
        let mut weight = Vec::with_capacity(dsize * k);
        for d in 0..dsize {
            let mine: Vec<&Tap> = taps.iter().filter(|t| t.dst == d).collect();
            for j in 0..k {
                match mine.get(j) {
                    Some(t) => {
                        src.push(t.src);
                        weight.push(t.weight);
                    }
                    None => {
                        src.push(mine[0].src);
                        weight.push(0.0);
                    }
                }
            }
        }
        Gather { k, src, weight }
    }
}

/// A grayscale area resize from `src` (height, width) to `dst` (height, width), with its
/// tables and buffers made once.
pub struct AreaResize {
    src: (usize, usize),
    dst: (usize, usize),
    x: Gather,
    y: Gather,
    /// One source line as floats.
    line: Vec<f32>,
    /// Every source line resized horizontally, `src.0 * dst.1`.
    rows: Vec<f32>,
    /// One output row's sums.
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
            x: Gather::new(&area_taps(src.1, dst.1), dst.1),
            y: Gather::new(&area_taps(src.0, dst.0), dst.0),
            line: vec![0.0; src.1],
            rows: vec![0.0; src.0 * dst.1],
            sum: vec![0.0; dst.1],
        }
    }

    /// Resize `src` (height*width bytes) into `out` (the destination's bytes).
    pub fn run(&mut self, src: &[u8], out: &mut [u8]) {
        let (sh, sw) = self.src;
        let (dh, dw) = self.dst;
        assert_eq!(src.len(), sh * sw);
        assert_eq!(out.len(), dh * dw);
        // Horizontal: each source line once (OpenCV redoes a line shared by two output
        // rows; the result is the same).
        match self.x.k {
            2 => self.horizontal::<2>(src),
            3 => self.horizontal::<3>(src),
            4 => self.horizontal::<4>(src),
            _ => self.horizontal_any(src),
        }
        // Vertical, in OpenCV's order: sum = beta0 * row0, then sum += beta_j * row_j.
        let ky = self.y.k;
        for (d, o) in out.chunks_exact_mut(dw).enumerate() {
            let taps = d * ky..(d + 1) * ky;
            let first = taps.start;
            let r0 = &self.rows[self.y.src[first] * dw..][..dw];
            let b0 = self.y.weight[first];
            let sum = &mut self.sum;
            for (s, r) in sum.iter_mut().zip(r0) {
                *s = b0 * r;
            }
            for j in taps.skip(1) {
                let r = &self.rows[self.y.src[j] * dw..][..dw];
                let b = self.y.weight[j];
                for (s, r) in sum.iter_mut().zip(r) {
                    *s += b * r;
                }
            }
            store(sum, o);
        }
    }
}

impl AreaResize {
    /// The horizontal pass with `K` taps per output pixel (unrolled).
    fn horizontal<const K: usize>(&mut self, src: &[u8]) {
        let (sw, dw) = (self.src.1, self.dst.1);
        let x = &self.x;
        for (line, row) in src.chunks_exact(sw).zip(self.rows.chunks_exact_mut(dw)) {
            for (f, &b) in self.line.iter_mut().zip(line) {
                *f = f32::from(b);
            }
            for ((r, s), w) in row
                .iter_mut()
                .zip(x.src.chunks_exact(K))
                .zip(x.weight.chunks_exact(K))
            {
                let s: &[usize; K] = s.try_into().unwrap();
                let w: &[f32; K] = w.try_into().unwrap();
                let mut acc = 0.0f32;
                for j in 0..K {
                    acc += self.line[s[j]] * w[j];
                }
                *r = acc;
            }
        }
    }

    /// The horizontal pass for any tap count.
    fn horizontal_any(&mut self, src: &[u8]) {
        let (sw, dw, k) = (self.src.1, self.dst.1, self.x.k);
        for (line, row) in src.chunks_exact(sw).zip(self.rows.chunks_exact_mut(dw)) {
            for (f, &b) in self.line.iter_mut().zip(line) {
                *f = f32::from(b);
            }
            for (d, r) in row.iter_mut().enumerate() {
                let mut acc = 0.0f32;
                for j in d * k..(d + 1) * k {
                    acc += self.line[self.x.src[j]] * self.x.weight[j];
                }
                *r = acc;
            }
        }
    }
}

/// OpenCV's `saturate_cast<uchar>(float)`: round half to even, clamp to 0..=255. Adding and
/// subtracting 2^23 rounds a float in [0, 2^23) to the nearest integer, ties to even.
fn store(sum: &[f32], out: &mut [u8]) {
    const MAGIC: f32 = 8_388_608.0;
    for (o, s) in out.iter_mut().zip(sum) {
        *o = ((s.max(0.0) + MAGIC) - MAGIC).min(255.0) as u8;
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
        assert!(r.x.k <= 4 && r.y.k <= 4);
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
