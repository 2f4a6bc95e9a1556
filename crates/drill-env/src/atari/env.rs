//! [`Atari`]: one game behind DI-engine's Atari wrapper chain (`wrap_deepmind`), as one
//! [`Env`] writing `u8` frame stacks. In order, each step of the chain switchable from
//! [`AtariOptions`]:
//!
//! 1. noop reset: after a real reset, 1..=`noop_max` NOOP frames (0: none);
//! 2. max-and-skip: the action repeated for `frame_skip` frames, rewards summed, the
//!    observation the max of the last two frames' grayscale screens;
//! 3. episodic life (training): losing a life ends the episode (terminated); the next reset
//!    continues the game with one NOOP step instead of restarting it;
//! 4. fire reset: games whose action 1 is FIRE press FIRE, then action 2, after each reset;
//! 5. warp: the pooled screen resized to `screen_size` squared with `INTER_AREA`;
//! 6. reward clipping (training): the reward's sign;
//! 7. frame stack: the last `frame_stack` frames, oldest first (`[stack, size, size]`).
//!
//! The order of frame capture and max-pooling is Gymnasium's `AtariPreprocessing` (which the
//! parity fixtures record): a frame skip cut short by the game's end keeps the frames it had.
//! Truncation is ALE's: `max_frames` emulated frames per game (whole game, not per life).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::AtariOptions;
use super::ale::{Ale, SCREEN};
use super::resize::{AreaResize, max_into};
use crate::{Action, ActionSpace, Env, EnvSpec, Step};

/// ALE's FIRE action code.
const FIRE: i32 = 1;
/// ALE's NOOP action code.
const NOOP: i32 = 0;

/// One game behind the wrapper chain; observations are `[frame_stack, size, size]` bytes.
pub struct Atari {
    ale: Ale,
    spec: EnvSpec,
    opts: AtariOptions,
    /// Truncate a game after this many emulated frames.
    max_frames: u32,
    /// The game has FIRE as action 1 and at least 3 actions.
    has_fire: bool,
    rng: ChaCha8Rng,
    /// Grayscale screens of the last two frames of a skip (`[0]` the last).
    screens: [Vec<u8>; 2],
    /// The current resized frame.
    frame: Vec<u8>,
    resize: AreaResize,
    lives: i32,
    /// The last episode ended with the game (not only a life).
    real_done: bool,
}

impl Atari {
    /// `rom` (loaded at the first reset, with its seed, or seed 0), sticky actions with
    /// `repeat_action_probability`, the minimal action set (or all 18 with
    /// `full_action_space`), truncation after `max_frames` frames; `id` is the id it was made
    /// from.
    pub fn new(
        id: &str,
        rom: &std::path::Path,
        repeat_action_probability: f32,
        full_action_space: bool,
        max_frames: u32,
        opts: AtariOptions,
    ) -> Atari {
        assert!(opts.frame_skip >= 1 && opts.frame_stack >= 1 && opts.screen_size >= 1);
        let ale = Ale::new(rom, repeat_action_probability, full_action_space);
        let actions = ale.action_set();
        let has_fire = actions.len() >= 3 && actions[1] == FIRE;
        let n = opts.screen_size;
        let spec = EnvSpec {
            id: id.to_string(),
            obs: crate::ObsSpace {
                shape: vec![opts.frame_stack, n, n],
                dtype: crate::Dtype::U8,
            },
            action_space: ActionSpace::Discrete(actions.len()),
            max_episode_steps: Some(max_frames / opts.frame_skip),
            reward_threshold: None,
        };
        Atari {
            ale,
            spec,
            max_frames,
            has_fire,
            rng: ChaCha8Rng::seed_from_u64(0),
            screens: [vec![0; SCREEN.0 * SCREEN.1], vec![0; SCREEN.0 * SCREEN.1]],
            frame: vec![0; n * n],
            resize: AreaResize::new(SCREEN, (n, n)),
            lives: 0,
            real_done: true,
            opts,
        }
    }

    /// The ALE action codes behind the action indices.
    pub fn action_set(&self) -> &[i32] {
        self.ale.action_set()
    }

    /// Max-and-skip with action `code`: (summed reward, game over). Frames are captured as
    /// Gymnasium's `AtariPreprocessing` does.
    fn skip(&mut self, code: i32) -> (i32, bool) {
        let k = self.opts.frame_skip;
        let mut reward = 0;
        for t in 0..k {
            reward += self.ale.act(code);
            if self.ale.game_over() || self.truncated() {
                return (reward, self.ale.game_over());
            }
            if k > 1 && t == k - 2 {
                self.ale.grayscale(&mut self.screens[1]);
            } else if t == k - 1 {
                self.ale.grayscale(&mut self.screens[0]);
            }
        }
        (reward, false)
    }

    fn truncated(&mut self) -> bool {
        self.ale.episode_frame() >= self.max_frames
    }

    /// Pool the two screens into the current resized frame.
    fn warp(&mut self) {
        let [a, b] = &mut self.screens;
        if self.opts.frame_skip > 1 {
            max_into(a, b);
        }
        self.resize.run(a, &mut self.frame);
    }

    /// Shift the stack and append the current frame (or fill it with the frame).
    fn push(&self, obs: &mut [u8], fill: bool) {
        let f = self.frame.len();
        if fill {
            for slot in obs.chunks_exact_mut(f) {
                slot.copy_from_slice(&self.frame);
            }
        } else {
            obs.copy_within(f.., 0);
            let end = obs.len();
            obs[end - f..].copy_from_slice(&self.frame);
        }
    }

    /// A real reset: a new game, then the noops; the screen as Gymnasium's reset leaves it.
    fn new_game(&mut self) {
        self.ale.reset_game();
        if self.opts.noop_max > 0 {
            let noops = self.rng.random_range(1..=self.opts.noop_max);
            for _ in 0..noops {
                self.ale.act(NOOP);
                if self.ale.game_over() {
                    self.ale.reset_game();
                }
            }
        }
        self.ale.grayscale(&mut self.screens[0]);
        self.screens[1].fill(0);
    }

    /// The reset below fire reset: a new game after a real end (or without episodic life),
    /// else one NOOP step that continues the game after a lost life.
    fn reset_below_fire(&mut self) {
        if !self.opts.episode_life || self.real_done || self.truncated() {
            self.new_game();
        } else {
            let (_, _, _, over) = self.step_once(NOOP);
            if over {
                self.new_game();
            }
        }
        self.lives = self.ale.lives();
        self.real_done = false;
    }

    /// One agent step of the chain below frame stacking: (reward, terminated, truncated,
    /// game over).
    fn step_once(&mut self, code: i32) -> (i32, bool, bool, bool) {
        let (reward, over) = self.skip(code);
        let mut terminated = over;
        if self.opts.episode_life {
            let lives = self.ale.lives();
            if lives < self.lives && lives > 0 {
                terminated = true;
            }
            self.lives = lives;
        }
        (reward, terminated, !over && self.truncated(), over)
    }
}

impl Env for Atari {
    type Elem = u8;

    fn spec(&self) -> &EnvSpec {
        &self.spec
    }

    fn reset(&mut self, seed: Option<u64>, obs: &mut [u8]) {
        if let Some(s) = seed {
            self.rng = ChaCha8Rng::seed_from_u64(s);
            // The seed takes effect on reload, as in ale-py.
            self.ale.load(s);
            self.real_done = true;
        }
        self.reset_below_fire();
        if self.opts.fire_reset && self.has_fire {
            // Baselines' FireResetEnv: FIRE, then action 2, resetting again after either
            // ends the episode.
            for code in [FIRE, self.ale.action_set()[2]] {
                let (_, terminated, _, over) = self.step_once(code);
                self.real_done = over;
                if terminated {
                    self.reset_below_fire();
                }
            }
        }
        self.warp();
        self.push(obs, true);
    }

    fn step(&mut self, action: Action<'_>, obs: &mut [u8]) -> Step {
        let Action::Discrete(a) = action else {
            panic!("Atari takes discrete actions, got {action:?}");
        };
        let code = self.ale.action_set()[a];
        let (reward, terminated, truncated, over) = self.step_once(code);
        self.real_done = over || truncated;
        self.warp();
        self.push(obs, false);
        let reward = if self.opts.clip_rewards {
            reward.signum()
        } else {
            reward
        };
        Step {
            reward: f64::from(reward),
            terminated,
            truncated,
        }
    }
}
