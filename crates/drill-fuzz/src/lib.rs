//! Fuzzing on the stable toolchain (cargo-fuzz and libFuzzer need nightly): [`fuzz`] feeds a
//! decoder inputs made from valid ones by seeded mutations (bit flips, interesting integers
//! over length fields, truncation, insertion, splicing, random bytes), and checks that each
//! input ends in a value or an error: never a panic, never an allocation over [`MAX_ALLOC`]
//! (one sized by what the input claims), never a hang (a watchdog aborts the process naming
//! the target after [`HANG`]).
//!
//! Used from each crate's tests, next to the decoders (which stay private). A test binary that
//! fuzzes installs [`CountingAlloc`] as its global allocator; inputs per target come from
//! `DRILL_FUZZ_ITERS` (default [`DEFAULT_ITERS`], what CI runs), the generator's seed from
//! `DRILL_FUZZ_SEED` (default 0), and each call prints `fuzz TARGET: N inputs, ...` for
//! `scripts/fuzz.sh` to total.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Once;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The largest single allocation a decoder may make for one input.
pub const MAX_ALLOC: usize = 16 << 20;
/// How long one input may take before the watchdog aborts the process.
pub const HANG: Duration = Duration::from_secs(10);
/// Inputs per target unless `DRILL_FUZZ_ITERS` says otherwise.
pub const DEFAULT_ITERS: u64 = 20_000;

thread_local! {
    /// Whether this thread is running a fuzz input (the allocator and panic hook watch it).
    static ACTIVE: Cell<bool> = const { Cell::new(false) };
    /// The largest allocation this thread made during the current input.
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

/// The system allocator, noting the largest allocation a fuzzed input makes on its thread.
pub struct CountingAlloc;

// SAFETY: every call is forwarded unchanged to the system allocator; the bookkeeping touches
// only const-initialised thread-locals, which allocate nothing.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: forwarded with the caller's pointer, layout and size.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

fn note(size: usize) {
    let _ = ACTIVE.try_with(|a| {
        if a.get() {
            let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
        }
    });
}

/// A small, fast, seeded generator (xorshift64*).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        // splitmix64 of the seed: neighbouring seeds start far apart, and never at 0.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)) | 1)
    }

    /// The next 64 random bits.
    pub fn bits(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.bits() % n as u64) as usize
    }

    /// One of `items`.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Integers that find off-by-ones and overflows in length and count fields.
const INTERESTING: [u64; 14] = [
    0,
    1,
    2,
    7,
    8,
    0x7f,
    0x80,
    0xff,
    0xffff,
    0x7fff_ffff,
    0xffff_ffff,
    0x1_0000_0000,
    i64::MAX as u64,
    u64::MAX,
];

/// A new input made from `seeds`: one of them, mutated one to four times (or, now and then,
/// random bytes).
pub fn mutate(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    mutate_with(rng, seeds, &[])
}

/// [`mutate`], also replacing spans with (or inserting) tokens of `dict`: the words of a text
/// format (TOML values, flags), which byte flips rarely reach.
pub fn mutate_with(rng: &mut Rng, seeds: &[Vec<u8>], dict: &[&str]) -> Vec<u8> {
    if seeds.is_empty() || rng.below(50) == 0 {
        let n = rng.below(64);
        return (0..n).map(|_| rng.bits() as u8).collect();
    }
    let mut b = rng.pick(seeds).clone();
    for _ in 0..1 + rng.below(4) {
        if !dict.is_empty() && rng.below(2) == 0 {
            let token = rng.pick(dict).as_bytes();
            let at = rng.below(b.len() + 1);
            // Replace up to the end of a word (a value, a key), or insert.
            let end = if rng.below(3) == 0 {
                at
            } else {
                b[at..]
                    .iter()
                    .position(|c| matches!(c, b'\n' | b' ' | b',' | b']' | b'='))
                    .map_or(b.len(), |p| at + p)
            };
            b.splice(at..end, token.iter().copied());
        } else {
            mutate_once(rng, &mut b, seeds);
        }
    }
    b
}

fn mutate_once(rng: &mut Rng, b: &mut Vec<u8>, seeds: &[Vec<u8>]) {
    let len = b.len();
    match rng.below(9) {
        0 if len > 0 => {
            let i = rng.below(len);
            b[i] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let i = rng.below(len);
            b[i] = rng.bits() as u8;
        }
        2 if len > 0 => {
            // An interesting integer over 1, 2, 4 or 8 bytes, little- or big-endian.
            let width = *rng.pick(&[1usize, 2, 4, 8]);
            let v = *rng.pick(&INTERESTING);
            let v = match rng.below(3) {
                0 => v,
                1 => v.wrapping_add(1),
                _ => v.wrapping_sub(1),
            };
            let bytes = if rng.below(2) == 0 {
                v.to_le_bytes()
            } else {
                v.to_be_bytes()
            };
            let at = rng.below(len);
            let src = if rng.below(2) == 0 {
                &bytes[..width]
            } else {
                &bytes[8 - width..]
            };
            for (k, x) in src.iter().enumerate() {
                if at + k < len {
                    b[at + k] = *x;
                }
            }
        }
        3 if len > 0 => b.truncate(rng.below(len)),
        4 => {
            let at = rng.below(len + 1);
            let n = 1 + rng.below(16);
            let ins: Vec<u8> = (0..n).map(|_| rng.bits() as u8).collect();
            b.splice(at..at, ins);
        }
        5 if len > 1 => {
            // Repeat a chunk.
            let from = rng.below(len);
            let n = 1 + rng.below((len - from).min(64));
            let chunk = b[from..from + n].to_vec();
            let at = rng.below(len + 1);
            b.splice(at..at, chunk);
        }
        6 if len > 1 => {
            // Remove a chunk.
            let from = rng.below(len);
            let n = 1 + rng.below((len - from).min(64));
            b.drain(from..from + n);
        }
        7 => {
            // Splice: this input's start, another seed's end.
            let other = rng.pick(seeds);
            let cut = rng.below(len + 1);
            let from = rng.below(other.len() + 1);
            b.truncate(cut);
            b.extend_from_slice(&other[from..]);
        }
        _ if len > 0 => {
            let i = rng.below(len);
            b[i] = *rng.pick(&[0u8, 0xff, 0x7f, 0x80, b'"', b'[', b'=', b'\n', b'-']);
        }
        _ => b.push(rng.bits() as u8),
    }
}

/// Inputs per target: `DRILL_FUZZ_ITERS`, else [`DEFAULT_ITERS`].
pub fn iterations() -> u64 {
    std::env::var("DRILL_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_ITERS)
}

/// The generator's seed: `DRILL_FUZZ_SEED`, else 0.
pub fn seed() -> u64 {
    std::env::var("DRILL_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Panics on fuzzing threads are expected findings: the hook stays quiet for them (they are
/// reported with their input) and prints as usual for every other thread.
fn quiet_panics_while_fuzzing() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !ACTIVE.try_with(Cell::get).unwrap_or(false) {
                default(info);
            }
        }));
    });
}

/// Feed `decode` [`iterations`] inputs mutated from `seeds` (valid encodings; the seeds
/// themselves go first) and panic, naming `target` and the first failing inputs, if any
/// input panicked or allocated more than [`MAX_ALLOC`] at once. Returns the inputs tried.
pub fn fuzz(target: &str, seeds: &[Vec<u8>], decode: impl FnMut(&[u8])) -> u64 {
    fuzz_with(target, seeds, &[], decode)
}

/// [`fuzz`] with a dictionary of tokens for the mutations ([`mutate_with`]).
pub fn fuzz_with(
    target: &str,
    seeds: &[Vec<u8>],
    dict: &[&str],
    mut decode: impl FnMut(&[u8]),
) -> u64 {
    quiet_panics_while_fuzzing();
    let iters = iterations();
    let mut rng = Rng::new(seed() ^ hash(target));
    // The watchdog: the input's start time (ms since `t0`, 0 when idle); a hang aborts.
    let t0 = Instant::now();
    let started = std::sync::Arc::new(AtomicU64::new(0));
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watchdog = {
        let (started, done, target) = (started.clone(), done.clone(), target.to_string());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                let s = started.load(Ordering::Relaxed);
                if s > 0 && t0.elapsed().as_millis() as u64 > s + HANG.as_millis() as u64 {
                    eprintln!("fuzz {target}: one input ran over {HANG:?}: a hang");
                    std::process::abort();
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let mut failures: Vec<String> = Vec::new();
    let mut failed = 0u64;
    let (mut slowest, mut largest_seen) = (Duration::ZERO, 0usize);
    for i in 0..iters {
        let input = match seeds.get(i as usize) {
            Some(s) => s.clone(),
            None => mutate_with(&mut rng, seeds, dict),
        };
        let start = Instant::now();
        started.store(t0.elapsed().as_millis() as u64 + 1, Ordering::Relaxed);
        LARGEST.with(|l| l.set(0));
        ACTIVE.with(|a| a.set(true));
        let outcome = catch_unwind(AssertUnwindSafe(|| decode(&input)));
        ACTIVE.with(|a| a.set(false));
        started.store(0, Ordering::Relaxed);
        slowest = slowest.max(start.elapsed());
        let largest = LARGEST.with(Cell::get);
        largest_seen = largest_seen.max(largest);
        let problem = match outcome {
            Err(p) => Some(format!(
                "panicked ({})",
                p.downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_default()
            )),
            Ok(()) if largest > MAX_ALLOC => Some(format!("allocated {largest} bytes at once")),
            Ok(()) => None,
        };
        if let Some(p) = problem {
            failed += 1;
            if failures.len() < 5 {
                failures.push(format!("{p} on input {}", hex(&input)));
            }
        }
    }
    done.store(true, Ordering::Relaxed);
    let _ = watchdog.join();
    println!(
        "fuzz {target}: {iters} inputs, {failed} failing, slowest {:.3} ms, largest allocation {largest_seen} bytes",
        slowest.as_secs_f64() * 1e3
    );
    assert!(
        failures.is_empty(),
        "fuzz {target}: {failed} of {iters} inputs failed:\n{}",
        failures.join("\n")
    );
    iters
}

/// The first 256 bytes of `b` in hex (and the length).
fn hex(b: &[u8]) -> String {
    let shown: String = b.iter().take(256).map(|x| format!("{x:02x}")).collect();
    format!("({} bytes) {shown}", b.len())
}

fn hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[global_allocator]
    static ALLOC: CountingAlloc = CountingAlloc;

    #[test]
    fn a_panicking_or_greedy_decoder_is_caught_and_a_sound_one_passes() {
        let seeds = vec![b"hello".to_vec(), vec![0, 1, 2, 3]];
        let sound = fuzz("sound", &seeds, |b| {
            let _ = b.first();
        });
        assert_eq!(sound, iterations());
        let panics = catch_unwind(|| {
            fuzz("panicky", &seeds, |b| {
                let _ = b[3];
            })
        });
        let msg = *panics.unwrap_err().downcast::<String>().unwrap();
        assert!(
            msg.contains("fuzz panicky") && msg.contains("panicked"),
            "{msg}"
        );
        let greedy = catch_unwind(|| {
            fuzz("greedy", &seeds, |b| {
                let n = b.first().copied().unwrap_or(0) as usize;
                drop(Vec::<u8>::with_capacity(n << 20));
            })
        });
        let msg = *greedy.unwrap_err().downcast::<String>().unwrap();
        assert!(msg.contains("allocated"), "{msg}");
    }

    #[test]
    fn mutations_are_repeatable_from_the_seed() {
        let seeds = vec![b"[env]\nid = \"CartPole-v0\"\n".to_vec()];
        let run = || {
            let mut rng = Rng::new(7);
            (0..100)
                .map(|_| mutate(&mut rng, &seeds))
                .collect::<Vec<_>>()
        };
        let (a, b) = (run(), run());
        assert_eq!(a, b);
        assert!(a.iter().filter(|x| **x != seeds[0]).count() > 90);
    }
}
