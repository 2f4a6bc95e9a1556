//! A safe handle on one emulator of the Arcade Learning Environment (ALE 0.6, vendored and
//! statically linked by the `ale-sys` crate; GPL-2.0, which is why Atari is a cargo feature).

use std::ffi::CString;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::Once;

use ale_sys as sys;

/// Screen height and width in pixels.
pub const SCREEN: (usize, usize) = (210, 160);

/// One ALE emulator with a ROM loaded.
pub struct Ale {
    ptr: NonNull<sys::ALEInterface>,
    rom: CString,
    actions: Vec<i32>,
}

// SAFETY: an ALEInterface owns its emulator and has no thread affinity; `Ale` is used from one
// thread at a time (`&mut self` for every call that touches it).
unsafe impl Send for Ale {}

impl Ale {
    /// Load `rom` with ALE's `random_seed` = `seed` and `repeat_action_probability`; the action
    /// set is the game's minimal one, or all 18 with `full_action_space`.
    pub fn new(rom: &Path, seed: i32, repeat_action_probability: f32, full: bool) -> Ale {
        static QUIET: Once = Once::new();
        // SAFETY: sets a global log level; no other state.
        QUIET.call_once(|| unsafe { sys::setLoggerMode(2) });
        // SAFETY: ALE_new has no preconditions; a null result is an allocation failure.
        let ptr = NonNull::new(unsafe { sys::ALE_new() }).expect("ALE_new returned null");
        let rom = CString::new(rom.as_os_str().as_encoded_bytes()).expect("ROM path with NUL");
        let mut ale = Ale {
            ptr,
            rom,
            actions: Vec::new(),
        };
        ale.set_float("repeat_action_probability", repeat_action_probability);
        ale.load(seed);
        let p = ale.ptr.as_ptr();
        // SAFETY: the arrays are sized by the matching Size call.
        ale.actions = unsafe {
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
        };
        ale
    }

    fn set_float(&mut self, key: &str, v: f32) {
        let k = CString::new(key).unwrap();
        // SAFETY: valid interface and NUL-terminated key.
        unsafe { sys::setFloat(self.ptr.as_ptr(), k.as_ptr(), v) }
    }

    /// (Re)load the ROM with ALE's generator seeded by `seed` (what ale-py's `reset(seed=...)`
    /// does: the seed takes effect on load), and reset the game.
    pub fn load(&mut self, seed: i32) {
        let k = CString::new("random_seed").unwrap();
        // SAFETY: valid interface, NUL-terminated strings; the ROM exists (checked by the
        // caller: ALE 0.6 exits the process on a missing file).
        unsafe {
            sys::setInt(self.ptr.as_ptr(), k.as_ptr(), seed);
            sys::loadROM(self.ptr.as_ptr(), self.rom.as_ptr());
            sys::reset_game(self.ptr.as_ptr());
        }
    }

    /// The ALE action codes the agent's action indices map to.
    pub fn action_set(&self) -> &[i32] {
        &self.actions
    }

    /// Emulate one frame with ALE action `code`; returns the reward.
    #[inline]
    pub fn act(&mut self, code: i32) -> i32 {
        // SAFETY: valid interface.
        unsafe { sys::act(self.ptr.as_ptr(), code) }
    }

    /// The game is over (terminal).
    #[inline]
    pub fn game_over(&self) -> bool {
        // SAFETY: valid interface.
        unsafe { sys::game_over(self.ptr.as_ptr()) }
    }

    /// Start a new game (no reload, no reseed).
    pub fn reset_game(&mut self) {
        // SAFETY: valid interface.
        unsafe { sys::reset_game(self.ptr.as_ptr()) }
    }

    /// Lives left.
    #[inline]
    pub fn lives(&self) -> i32 {
        // SAFETY: valid interface.
        unsafe { sys::lives(self.ptr.as_ptr()) }
    }

    /// Frames emulated since the game started.
    #[inline]
    pub fn episode_frame(&self) -> u32 {
        // SAFETY: valid interface.
        unsafe { sys::getEpisodeFrameNumber(self.ptr.as_ptr()) as u32 }
    }

    /// The screen in ALE's grayscale palette, 210x160 bytes into `out`.
    #[inline]
    pub fn grayscale(&mut self, out: &mut [u8]) {
        assert_eq!(out.len(), SCREEN.0 * SCREEN.1, "a 210x160 buffer");
        // SAFETY: valid interface; `out` holds a whole screen.
        unsafe { sys::getScreenGrayscale(self.ptr.as_ptr(), out.as_mut_ptr()) }
    }
}

impl Drop for Ale {
    fn drop(&mut self) {
        // SAFETY: created by ALE_new, deleted once.
        unsafe { sys::ALE_del(self.ptr.as_ptr()) }
    }
}
