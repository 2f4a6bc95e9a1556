//! Atari 2600 games through the Arcade Learning Environment, with DI-engine's wrapper chain.
//!
//! Ids, as DI-engine and Gymnasium users know them:
//! - `<Game>NoFrameskip-v4` (e.g. `PongNoFrameskip-v4`): no sticky actions, truncated after
//!   400 000 frames (Gymnasium's `max_episode_steps` of the unskipped env);
//! - `ALE/<Game>-v5`: sticky actions (`repeat_action_probability` 0.25), truncated after
//!   108 000 frames.
//!
//! Both go through the same chain (noop reset, max-and-skip 4, episodic life, fire reset,
//! 84x84 grayscale with `INTER_AREA`, reward clipping, frame stack 4), each step switchable
//! through [`AtariOptions`]; observations are `u8` stacks `[4, 84, 84]`. The minimal action
//! set is used unless `full_action_space`. `<Game>` is the ROM name in CamelCase
//! (`space_invaders` → `SpaceInvaders`); [`GAMES`] lists the 76 games ALE 0.6 supports.
//!
//! The emulator is ALE 0.6 from the `ale-sys` crate, which vendors its C++ (GPL-2.0) and links
//! it statically: it is behind the `atari` cargo feature (needs `cmake`), so a default drill
//! build stays MIT/Apache-2.0 while a build with `--features atari` is a combined work under
//! the GPL. ROMs are not shipped: see [`roms`].

#[cfg(feature = "atari")]
mod ale;
#[cfg(feature = "atari")]
mod env;
mod options;
#[cfg(feature = "atari")]
pub mod resize;
pub mod roms;

#[cfg(feature = "atari")]
pub use env::Atari;
pub use options::AtariOptions;

/// The games ALE 0.6 supports, by ROM name (`<name>.bin`).
pub const GAMES: [&str; 76] = [
    "adventure",
    "air_raid",
    "alien",
    "amidar",
    "assault",
    "asterix",
    "asteroids",
    "atlantis",
    "bank_heist",
    "battle_zone",
    "beam_rider",
    "berzerk",
    "bowling",
    "boxing",
    "breakout",
    "carnival",
    "centipede",
    "chopper_command",
    "crazy_climber",
    "defender",
    "demon_attack",
    "donkey_kong",
    "double_dunk",
    "elevator_action",
    "enduro",
    "fishing_derby",
    "freeway",
    "frogger",
    "frostbite",
    "galaxian",
    "gopher",
    "gravitar",
    "hero",
    "ice_hockey",
    "jamesbond",
    "journey_escape",
    "kaboom",
    "kangaroo",
    "keystone_kapers",
    "king_kong",
    "koolaid",
    "krull",
    "kung_fu_master",
    "laser_gates",
    "lost_luggage",
    "montezuma_revenge",
    "mr_do",
    "ms_pacman",
    "name_this_game",
    "phoenix",
    "pitfall",
    "pong",
    "pooyan",
    "private_eye",
    "qbert",
    "riverraid",
    "road_runner",
    "robotank",
    "seaquest",
    "sir_lancelot",
    "skiing",
    "solaris",
    "space_invaders",
    "star_gunner",
    "tennis",
    "tetris",
    "time_pilot",
    "trondead",
    "turmoil",
    "tutankham",
    "up_n_down",
    "venture",
    "video_pinball",
    "wizard_of_wor",
    "yars_revenge",
    "zaxxon",
];

/// What an Atari id asks of the emulator.
#[derive(Clone, Debug, PartialEq)]
pub struct AtariId {
    /// ROM name, e.g. `pong`.
    pub game: &'static str,
    /// Sticky-action probability.
    pub repeat_action_probability: f32,
    /// Emulated frames after which a game is truncated.
    pub max_frames: u32,
}

/// `space_invaders` → `SpaceInvaders`.
pub fn camel(game: &str) -> String {
    game.split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// The Atari id `id` names, if it is one.
pub fn parse_id(id: &str) -> Option<AtariId> {
    let (name, v5) = if let Some(rest) = id.strip_prefix("ALE/") {
        (rest.strip_suffix("-v5")?, true)
    } else {
        (id.strip_suffix("NoFrameskip-v4")?, false)
    };
    let game = GAMES.iter().find(|g| camel(g) == name)?;
    Some(AtariId {
        game,
        repeat_action_probability: if v5 { 0.25 } else { 0.0 },
        max_frames: if v5 { 108_000 } else { 400_000 },
    })
}

/// Every Atari id: `<Game>NoFrameskip-v4` and `ALE/<Game>-v5` per game.
pub fn ids() -> Vec<String> {
    GAMES
        .iter()
        .flat_map(|g| {
            let c = camel(g);
            [format!("{c}NoFrameskip-v4"), format!("ALE/{c}-v5")]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_name_gymnasium_spellings() {
        assert_eq!(parse_id("PongNoFrameskip-v4").unwrap().game, "pong");
        assert_eq!(
            parse_id("ALE/SpaceInvaders-v5").unwrap(),
            AtariId {
                game: "space_invaders",
                repeat_action_probability: 0.25,
                max_frames: 108_000
            }
        );
        for id in [
            "MontezumaRevengeNoFrameskip-v4",
            "ALE/UpNDown-v5",
            "ALE/Jamesbond-v5",
        ] {
            assert!(parse_id(id).is_some(), "{id}");
        }
        for id in [
            "Pong-v4",
            "PongNoFrameskip-v5",
            "ALE/Pong-v4",
            "FooNoFrameskip-v4",
        ] {
            assert!(parse_id(id).is_none(), "{id}");
        }
        let all = ids();
        assert_eq!(all.len(), 152);
        assert!(all.iter().all(|i| parse_id(i).is_some()));
    }
}
