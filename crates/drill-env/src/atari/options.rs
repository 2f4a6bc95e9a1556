//! [`AtariOptions`]: the switches of DI-engine's Atari wrapper chain (see [`super`]), set from
//! a config's `[env]` table.

/// The wrapper chain's switches (see [`super`]). [`AtariOptions::default`] is
/// DI-engine's training chain; [`AtariOptions::eval`] its evaluator's (whole games, raw
/// rewards).
#[derive(Clone, Debug, PartialEq)]
pub struct AtariOptions {
    /// Most NOOP frames after a reset (0: none).
    pub noop_max: u32,
    /// Frames each action is repeated for.
    pub frame_skip: u32,
    /// A lost life ends the episode.
    pub episode_life: bool,
    /// Press FIRE after a reset where the game has it.
    pub fire_reset: bool,
    /// Rewards become their sign.
    pub clip_rewards: bool,
    /// Side of the square the screen is resized to.
    pub screen_size: usize,
    /// All 18 ALE actions instead of the game's minimal set (Gymnasium's
    /// `full_action_space`).
    pub full_action_space: bool,
    /// Frames stacked into one observation.
    pub frame_stack: usize,
}

impl Default for AtariOptions {
    fn default() -> Self {
        Self {
            noop_max: 30,
            frame_skip: 4,
            episode_life: true,
            fire_reset: true,
            clip_rewards: true,
            screen_size: 84,
            full_action_space: false,
            frame_stack: 4,
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
}
