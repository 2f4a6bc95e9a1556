//! A safe handle on one emulator of the Arcade Learning Environment (ALE 0.6, vendored and
//! statically linked by the `ale-sys` crate; GPL-2.0, which is why Atari is a cargo feature).

use std::collections::HashMap;
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::{Mutex, Once, OnceLock};

use ale_sys as sys;

/// Screen height and width in pixels.
pub const SCREEN: (usize, usize) = (210, 160);

/// One ALE emulator of one ROM, loaded at first use: loading builds ALE 0.6's colour-averaging
/// tables (about 70 ms), and a seeded reset loads again, so loading at creation too would
/// double what making and seeding a vector env costs.
pub struct Ale {
    ptr: NonNull<sys::ALEInterface>,
    rom: CString,
    path: PathBuf,
    actions: Vec<i32>,
    /// The ROM has been loaded.
    loaded: bool,
}

// SAFETY: an ALEInterface owns its emulator and has no thread affinity; `Ale` is used from one
// thread at a time (`&mut self` for every call that touches it).
unsafe impl Send for Ale {}

/// Action sets by ROM path and action space (true: all 18).
type ActionSets = HashMap<(CString, bool), Vec<i32>>;

/// The action sets of the ROMs read so far in this process.
fn action_sets() -> &'static Mutex<ActionSets> {
    static SETS: OnceLock<Mutex<ActionSets>> = OnceLock::new();
    SETS.get_or_init(Default::default)
}

impl Ale {
    /// An emulator for `rom` with sticky actions at `repeat_action_probability`; the action
    /// set is the game's minimal one, or all 18 with `full`. The ROM is loaded (with seed 0
    /// unless [`Self::load`] names another) when the emulator is first used.
    pub fn new(rom: &Path, repeat_action_probability: f32, full: bool) -> Ale {
        let mut ale = Ale::bare(rom, repeat_action_probability);
        let mut sets = action_sets().lock().unwrap_or_else(|e| e.into_inner());
        let actions = sets.entry((ale.rom.clone(), full)).or_insert_with(|| {
            // Read on an emulator of its own, so that every emulator's first load is on a fresh
            // one: a load fills the console's RAM from ALE's generator before it seeds it.
            let mut probe = Ale::bare(rom, repeat_action_probability);
            probe.load(0);
            probe.read_action_set(full)
        });
        ale.actions = actions.clone();
        ale
    }

    /// An emulator for `rom`, nothing loaded.
    fn bare(rom: &Path, repeat_action_probability: f32) -> Ale {
        static QUIET: Once = Once::new();
        // SAFETY: sets a global log level; no other state.
        QUIET.call_once(|| unsafe { sys::setLoggerMode(2) });
        // SAFETY: ALE_new has no preconditions; a null result is an allocation failure.
        let ptr = NonNull::new(unsafe { sys::ALE_new() }).expect("ALE_new returned null");
        let path = rom.to_path_buf();
        let rom = CString::new(rom.as_os_str().as_encoded_bytes()).expect("ROM path with NUL");
        let mut ale = Ale {
            ptr,
            rom,
            path,
            actions: Vec::new(),
            loaded: false,
        };
        ale.set_float("repeat_action_probability", repeat_action_probability);
        ale
    }

    /// The game's action set, read from the loaded ROM.
    fn read_action_set(&mut self, full: bool) -> Vec<i32> {
        let p = self.ready();
        // SAFETY: valid interface with a ROM loaded; the arrays are sized by the matching Size
        // call.
        unsafe {
            let n = if full {
                sys::getLegalActionSize(p)
            } else {
                sys::getMinimalActionSize(p)
            } as usize;
            let mut a = vec![0i32; n];
            if full {
                sys::getLegalActionSet(p, a.as_mut_ptr());
            } else {
                sys::getMinimalActionSet(p, a.as_mut_ptr());
            }
            a
        }
    }

    fn set_float(&mut self, key: &str, v: f32) {
        let k = CString::new(key).unwrap();
        // SAFETY: valid interface and NUL-terminated key.
        unsafe { sys::setFloat(self.ptr.as_ptr(), k.as_ptr(), v) }
    }

    /// (Re)load the ROM with ALE's generator seeded by `seed` (what ale-py's `reset(seed=...)`
    /// does: the seed takes effect on load), and reset the game.
    pub fn load(&mut self, seed: u64) {
        // ALE takes a 31-bit seed, and seeds from the clock when it is 0 (ALE 0.6's
        // `OSystem::resetRNGSeed`): `seed` is taken modulo `i32::MAX`, and a residue of 0 is
        // given as `i32::MAX`, which no other residue becomes.
        let seed = match (seed % i32::MAX as u64) as i32 {
            0 => i32::MAX,
            s => s,
        };
        // ALE 0.6 exits the process on a missing file: a ROM removed since the emulator was
        // made (it loads at its first reset) is a panic that names it instead.
        assert!(
            self.path.is_file(),
            "the ROM {} is no longer there",
            self.path.display()
        );
        let k = CString::new("random_seed").unwrap();
        // One load at a time in the process: ALE 0.6's `Cartridge::create` (run by every
        // `loadROM`) assigns the process-wide `Cartridge::myAboutString`, a static
        // `std::string`. Two threads loading at once (the evaluator's seeded resets of its
        // games on 2 env threads) raced on its buffer and corrupted the heap: a `pong_ppo` run
        // aborted with "malloc(): unaligned tcache chunk detected" 8 minutes after an
        // evaluation. A load takes milliseconds, a few times per evaluation.
        static LOADING: Mutex<()> = Mutex::new(());
        let _one = LOADING.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: valid interface, NUL-terminated strings; the ROM exists (checked above);
        // no other thread is loading a ROM (the lock above).
        unsafe {
            sys::setInt(self.ptr.as_ptr(), k.as_ptr(), seed);
            sys::loadROM(self.ptr.as_ptr(), self.rom.as_ptr());
            sys::reset_game(self.ptr.as_ptr());
        }
        self.loaded = true;
    }

    /// The emulator with its ROM loaded (seed 0 when nothing named one), for a call that
    /// reads or runs it.
    #[inline]
    fn ready(&mut self) -> *mut sys::ALEInterface {
        if !self.loaded {
            self.load(0);
        }
        self.ptr.as_ptr()
    }

    /// The ALE action codes the agent's action indices map to.
    pub fn action_set(&self) -> &[i32] {
        &self.actions
    }

    /// Emulate one frame with ALE action `code`; returns the reward.
    #[inline]
    pub fn act(&mut self, code: i32) -> i32 {
        let p = self.ready();
        // SAFETY: valid interface with a ROM loaded.
        unsafe { sys::act(p, code) }
    }

    /// The game is over (terminal).
    #[inline]
    pub fn game_over(&mut self) -> bool {
        let p = self.ready();
        // SAFETY: valid interface with a ROM loaded.
        unsafe { sys::game_over(p) }
    }

    /// Start a new game (no reload, no reseed).
    pub fn reset_game(&mut self) {
        let p = self.ready();
        // SAFETY: valid interface with a ROM loaded.
        unsafe { sys::reset_game(p) }
    }

    /// Lives left.
    #[inline]
    pub fn lives(&mut self) -> i32 {
        let p = self.ready();
        // SAFETY: valid interface with a ROM loaded.
        unsafe { sys::lives(p) }
    }

    /// Frames emulated since the game started.
    #[inline]
    pub fn episode_frame(&mut self) -> u32 {
        let p = self.ready();
        // SAFETY: valid interface with a ROM loaded.
        unsafe { sys::getEpisodeFrameNumber(p) as u32 }
    }

    /// The screen in ALE's grayscale palette, 210x160 bytes into `out`.
    #[inline]
    pub fn grayscale(&mut self, out: &mut [u8]) {
        assert_eq!(out.len(), SCREEN.0 * SCREEN.1, "a 210x160 buffer");
        let p = self.ready();
        // SAFETY: valid interface with a ROM loaded; `out` holds a whole screen.
        unsafe { sys::getScreenGrayscale(p, out.as_mut_ptr()) }
    }
}

impl Drop for Ale {
    fn drop(&mut self) {
        // SAFETY: created by ALE_new, deleted once.
        unsafe { sys::ALE_del(self.ptr.as_ptr()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rewards and every 50th grayscale screen over 3000 frames of a fixed action pattern.
    fn play(ale: &mut Ale) -> (Vec<i32>, Vec<u8>) {
        let mut screen = vec![0u8; SCREEN.0 * SCREEN.1];
        let (mut rewards, mut screens) = (Vec::new(), Vec::new());
        let actions = ale.action_set().to_vec();
        for t in 0..3000 {
            rewards.push(ale.act(actions[(t / 7) % actions.len()]));
            if t % 50 == 0 {
                ale.grayscale(&mut screen);
                screens.extend_from_slice(&screen);
            }
        }
        (rewards, screens)
    }

    #[test]
    fn the_first_use_loads_seed_0_and_seed_0_is_a_seed_like_any_other() {
        let rom = super::super::roms::find("pong")
            .1
            .expect("this test needs ROMs (ALE_ROM_DIR)");
        // Sticky actions draw from ALE's generator, so its state is compared too.
        let new = || Ale::new(&rom, 0.25, false);
        let mut seeded = new();
        seeded.load(7);
        let want = play(&mut seeded);
        let mut other = new();
        other.load(8);
        assert_ne!(play(&mut other), want, "the seed takes effect");
        let mut again = new();
        again.load(7);
        assert_eq!(play(&mut again), want, "the same seed on another emulator");
        // Used before any load, an emulator runs as one loaded with seed 0; and ALE 0.6 would
        // seed from the clock (in seconds) if given 0.
        let first_use = play(&mut new());
        std::thread::sleep(std::time::Duration::from_millis(1100));
        let mut zero = new();
        zero.load(0);
        assert_eq!(play(&mut zero), first_use, "seed 0, a second later");
    }

    /// Emulators loading on two threads at once (an evaluator's seeded resets on its env
    /// threads). ALE 0.6's loads assign one process-wide string (`Cart.cxx`, where valgrind's
    /// helgrind reports the two threads' writes), so without `load`'s lock they raced on its
    /// buffer: a `pong_ppo` run aborted in malloc.
    #[test]
    fn emulators_load_on_several_threads_at_once() {
        let rom = super::super::roms::find("pong")
            .1
            .expect("this test needs ROMs (ALE_ROM_DIR)");
        let seeds = [3u64, 4];
        // Each thread's emulator plays as one loaded with the same seed on this thread.
        let concurrent: Vec<_> = std::thread::scope(|s| {
            let loaders: Vec<_> = seeds
                .iter()
                .map(|&seed| {
                    let rom = &rom;
                    s.spawn(move || {
                        let mut ale = Ale::new(rom, 0.25, false);
                        ale.load(seed + 10);
                        ale.load(seed);
                        play(&mut ale)
                    })
                })
                .collect();
            loaders.into_iter().map(|l| l.join().unwrap()).collect()
        });
        for (seed, got) in seeds.iter().zip(concurrent) {
            let mut alone = Ale::new(&rom, 0.25, false);
            alone.load(*seed);
            assert!(got == play(&mut alone), "seed {seed}");
        }
    }

    #[test]
    #[should_panic(expected = "is no longer there")]
    fn a_rom_removed_before_the_first_load_is_a_panic_that_names_it() {
        let rom = super::super::roms::find("pong")
            .1
            .expect("this test needs ROMs (ALE_ROM_DIR)");
        let dir = std::env::temp_dir().join(format!("drill-ale-rom-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let copy = dir.join("pong.bin");
        std::fs::copy(&rom, &copy).unwrap();
        let mut ale = Ale::new(&copy, 0.0, false);
        std::fs::remove_dir_all(&dir).unwrap();
        ale.load(1);
    }
}
