//! [`EnvError`]: what can go wrong building or stepping an environment, below every other
//! module of the crate.

/// Errors building an environment.
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    /// The id is not one of [`crate::ENV_IDS`].
    #[error("unknown environment id {id:?}; known ids: {known}")]
    UnknownId {
        /// The id asked for.
        id: String,
        /// The known ids, comma separated.
        known: String,
    },
    /// A vectorised environment needs at least one copy.
    #[error("a vectorised environment needs at least 1 copy, got 0")]
    NoCopies,
    /// An Atari id in a build without the `atari` feature.
    #[error(
        "{id} is an Atari game, but this drill was built without Atari: rebuild with `cargo build --release --features atari` (needs cmake; ALE is GPL-2.0)"
    )]
    AtariNotBuilt {
        /// The id asked for.
        id: String,
    },
    /// A `gymnasium:` id in a build without the `python` feature.
    #[error(
        "{id} is a Gymnasium environment, but this drill was built without Python: rebuild with `cargo build --release --features python` (needs python3-dev; the packages come from the active virtualenv)"
    )]
    PythonNotBuilt {
        /// The id asked for.
        id: String,
    },
    /// Python raised (in `gymnasium.make`, `reset` or `step`), or gave a wrong shape.
    #[error("{id}: Python raised:\n{message}")]
    Python {
        /// The id.
        id: String,
        /// The traceback and the exception.
        message: String,
    },
    /// A Gymnasium space drill cannot hold.
    #[error(
        "{id}: its {what} space is {space}; drill takes Box and Discrete {what}s (Box only for observations)"
    )]
    Space {
        /// The id.
        id: String,
        /// `observation` or `action`.
        what: &'static str,
        /// The space's class name.
        space: String,
    },
    /// An environment panicked (a bug, or something it needs gone, such as a ROM removed after
    /// the environment was made); the vector env holding it refuses every later call.
    #[error("{id}: the environment panicked: {message}")]
    Panicked {
        /// The id.
        id: String,
        /// The panic's message.
        message: String,
    },
    /// No ROM file for an Atari id.
    #[error("no ROM for {id}: {file} is in none of [{searched}]; {how}")]
    RomMissing {
        /// The id asked for.
        id: String,
        /// The ROM file name looked for.
        file: String,
        /// The folders searched, comma separated.
        searched: String,
        /// How to get ROMs.
        how: &'static str,
    },
}
