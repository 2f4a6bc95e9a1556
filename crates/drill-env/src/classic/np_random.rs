//! [`NpRandom`]: numpy's default generator (`np.random.default_rng(seed)`, which Gymnasium's
//! `np_random` is): `SeedSequence` turns the seed into a PCG64 state, PCG64 (XSL-RR 128/64)
//! draws, and `uniform(low, high)` is `low + (high - low) * (u64 >> 11) * 2^-53`. With it a
//! classic env seeded `s` starts where Gymnasium's does, so native and `gymnasium:` runs of one
//! seed are the same episodes.
//!
//! Written by hand from numpy's `bit_generator.pyx` and `pcg64.h` (about 80 lines): no crate
//! reproduces numpy's `SeedSequence`; checked bit for bit against numpy 2.4's output below.

/// PCG's default 128-bit multiplier.
const MULT: u128 = 0x2360_ED05_1FC6_5DA4_4385_DF64_9FCC_F645;

/// numpy's `SeedSequence` constants.
const INIT_A: u32 = 0x43b0_d7e5;
const MULT_A: u32 = 0x931e_8875;
const INIT_B: u32 = 0x8b51_f9dd;
const MULT_B: u32 = 0x58f3_8ded;
const MIX_MULT_L: u32 = 0xca01_f9dd;
const MIX_MULT_R: u32 = 0x4973_f715;
const XSHIFT: u32 = 16;
const POOL: usize = 4;

fn hashmix(value: u32, hash_const: &mut u32) -> u32 {
    let mut v = value ^ *hash_const;
    *hash_const = hash_const.wrapping_mul(MULT_A);
    v = v.wrapping_mul(*hash_const);
    v ^ (v >> XSHIFT)
}

fn mix(x: u32, y: u32) -> u32 {
    let r = MIX_MULT_L
        .wrapping_mul(x)
        .wrapping_sub(MIX_MULT_R.wrapping_mul(y));
    r ^ (r >> XSHIFT)
}

/// `SeedSequence(seed).generate_state(4, uint64)`.
fn seed_sequence(seed: u128) -> [u64; 4] {
    // The seed as little-endian 32-bit words, without leading zero words (at least one).
    let mut entropy: Vec<u32> = (0..4).map(|k| (seed >> (32 * k)) as u32).collect();
    while entropy.len() > 1 && entropy.last() == Some(&0) {
        entropy.pop();
    }
    let mut pool = [0u32; POOL];
    let mut h = INIT_A;
    for (i, p) in pool.iter_mut().enumerate() {
        *p = hashmix(entropy.get(i).copied().unwrap_or(0), &mut h);
    }
    for src in 0..POOL {
        for dst in 0..POOL {
            if src != dst {
                pool[dst] = mix(pool[dst], hashmix(pool[src], &mut h));
            }
        }
    }
    for &e in entropy.iter().skip(POOL) {
        for p in pool.iter_mut() {
            *p = mix(*p, hashmix(e, &mut h));
        }
    }
    let mut words = [0u32; 8];
    let mut h = INIT_B;
    for (i, w) in words.iter_mut().enumerate() {
        let mut v = pool[i % POOL] ^ h;
        h = h.wrapping_mul(MULT_B);
        v = v.wrapping_mul(h);
        *w = v ^ (v >> XSHIFT);
    }
    std::array::from_fn(|k| u64::from(words[2 * k]) | (u64::from(words[2 * k + 1]) << 32))
}

/// numpy's `Generator(PCG64(SeedSequence(seed)))`.
#[derive(Debug, Clone)]
pub(crate) struct NpRandom {
    state: u128,
    inc: u128,
}

impl NpRandom {
    /// As `np.random.default_rng(seed)`.
    pub(crate) fn new(seed: u128) -> Self {
        let s = seed_sequence(seed);
        let initstate = (u128::from(s[0]) << 64) | u128::from(s[1]);
        let initseq = (u128::from(s[2]) << 64) | u128::from(s[3]);
        let mut r = Self {
            state: 0,
            inc: (initseq << 1) | 1,
        };
        r.step();
        r.state = r.state.wrapping_add(initstate);
        r.step();
        r
    }

    fn step(&mut self) {
        self.state = self.state.wrapping_mul(MULT).wrapping_add(self.inc);
    }

    /// `bit_generator.random_raw()`.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.step();
        let s = self.state;
        let x = ((s >> 64) as u64) ^ (s as u64);
        x.rotate_right((s >> 122) as u32)
    }

    /// `uniform(low, high)`: one draw in `[low, high)`.
    pub(crate) fn uniform(&mut self, low: f64, high: f64) -> f64 {
        let u = (self.next_u64() >> 11) as f64 * (1.0 / 9_007_199_254_740_992.0);
        low + (high - low) * u
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `np.random.default_rng(s)`: `bit_generator.random_raw(2)` and
    /// `uniform(-0.05, 0.05, size=4)` (float hex), printed by numpy 2.4.6.
    const NUMPY: [(u128, [u64; 2], [&str; 4]); 5] = [
        (
            0,
            [11749869230777074271, 4976686463289251617],
            [
                "0x1.c0cbca647ced0p-7",
                "-0x1.792e736320f47p-6",
                "-0x1.7808d4489d6d2p-5",
                "-0x1.8c0f80ec8f29dp-5",
            ],
        ),
        (
            1,
            [9441442522235856127, 17532960557476522086],
            [
                "0x1.35e59496dac00p-10",
                "0x1.7105158c043bcp-5",
                "-0x1.2381235316a62p-5",
                "0x1.6f889bc9088e2p-5",
            ],
        ),
        (
            42,
            [14276969152011380360, 8095878257575067585],
            [
                "0x1.c0d97eba2bd40p-6",
                "-0x1.9090f63c0b010p-8",
                "0x1.25c36f3afc536p-5",
                "0x1.435e26c08cd04p-6",
            ],
        ),
        (
            (1 << 40) + 5,
            [87427594128977387, 6872972437549564694],
            [
                "-0x1.95b7a9cff466cp-5",
                "-0x1.a183cc93d7234p-7",
                "0x1.1dd558beebef8p-7",
                "-0x1.1d92cad9ebfb7p-5",
            ],
        ),
        (
            u64::MAX as u128,
            [12544278110101001871, 15593249672699323225],
            [
                "0x1.26f4a976b4fb8p-6",
                "0x1.1ae11fdfd71a0p-5",
                "-0x1.93890faeda5d7p-5",
                "0x1.433aeefd1ed3cp-5",
            ],
        ),
    ];

    /// Python's `float.hex()` format.
    fn hex(x: f64) -> String {
        if x == 0.0 {
            return "0x0.0p+0".into();
        }
        let bits = x.to_bits();
        let sign = if bits >> 63 == 1 { "-" } else { "" };
        let exp = ((bits >> 52) & 0x7ff) as i64 - 1023;
        let mantissa = bits & ((1 << 52) - 1);
        format!("{sign}0x1.{mantissa:013x}p{exp:+}")
    }

    #[test]
    fn draws_are_numpys_bit_for_bit() {
        for (seed, raw, uniform) in NUMPY {
            let mut r = NpRandom::new(seed);
            assert_eq!([r.next_u64(), r.next_u64()], raw, "seed {seed}");
            let mut r = NpRandom::new(seed);
            let got: Vec<String> = (0..4).map(|_| hex(r.uniform(-0.05, 0.05))).collect();
            assert_eq!(got, uniform, "seed {seed}");
        }
        // Pendulum's reset: uniform(low=-[pi, 1], high=[pi, 1]) with seed 7.
        let mut r = NpRandom::new(7);
        let (a, b) = (
            r.uniform(-std::f64::consts::PI, std::f64::consts::PI),
            r.uniform(-1.0, 1.0),
        );
        assert_eq!(
            [hex(a), hex(b)],
            ["0x1.926e545e3f060p-1", "0x1.96bf36f2bc99ap-1"]
        );
    }
}
