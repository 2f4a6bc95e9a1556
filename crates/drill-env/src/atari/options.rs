//! [`AtariOptions`]: the switches of DI-engine's Atari wrapper chain (see [`super`]), the one
//! definition a config's `[env]` table (drill-config), `drill env` and Python's `make_vec`
//! keyword arguments all read.

use serde::{Deserialize, Serialize};

/// The wrapper chain's switches (see [`super`]). [`AtariOptions::default`] is
/// DI-engine's training chain; [`AtariOptions::eval`] its evaluator's (whole games, raw
/// rewards). In a config they are keys of `[env]` (`env.frame_stack`, ...).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AtariOptions {
    /// Frames stacked into one observation (DI-engine's `frame_stack`).
    pub frame_stack: usize,
    /// At most this many NOOP frames after a reset (0: none).
    pub noop_max: u32,
    /// Frames each action is repeated for (the observation max-pools the last two).
    pub frame_skip: u32,
    /// A lost life ends a training episode (never in evaluation).
    pub episode_life: bool,
    /// Press FIRE after a reset in games that have it.
    pub fire_reset: bool,
    /// Training rewards become their sign (never in evaluation).
    pub clip_rewards: bool,
    /// Side of the square grayscale frame the screen is resized to.
    pub screen_size: usize,
    /// All 18 ALE actions instead of the game's minimal set (Gymnasium's
    /// `full_action_space`).
    pub full_action_space: bool,
}

impl Default for AtariOptions {
    fn default() -> Self {
        Self {
            frame_stack: 4,
            noop_max: 30,
            frame_skip: 4,
            episode_life: true,
            fire_reset: true,
            clip_rewards: true,
            screen_size: 84,
            full_action_space: false,
        }
    }
}

impl AtariOptions {
    /// The evaluator's chain: the same, but whole games and raw rewards.
    pub fn eval(&self) -> Self {
        Self {
            episode_life: false,
            clip_rewards: false,
            ..self.clone()
        }
    }

    /// The first option out of range: its name and the range it must be in.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        let ranges: [(&str, usize, usize, &str); 3] = [
            ("frame_stack", self.frame_stack, 64, ""),
            ("frame_skip", self.frame_skip as usize, 64, ""),
            (
                "screen_size",
                self.screen_size,
                160,
                " (the frame is shrunk from the 210x160 screen)",
            ),
        ];
        for (key, v, max, why) in ranges {
            if !(1..=max).contains(&v) {
                return Err((key, format!("must be 1..={max}{why}, got {v}")));
            }
        }
        Ok(())
    }
}
