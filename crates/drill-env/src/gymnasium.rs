//! What `[env]` says of a Gymnasium id besides its name (`env.kwargs`, `env.entry_point`,
//! `env.vectorization`), registered per process before the id is built, as
//! `gymnasium.register` does in Python. Always compiled, so a config is checked the same way
//! in every build; the bridge that runs the env is `python/` (feature `python`).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// The prefix of ids that run a Gymnasium environment in Python (`gymnasium:LunarLander-v3`).
pub const GYMNASIUM: &str = "gymnasium:";

/// How the copies of a Gymnasium env run (`env.vectorization`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Vectorization {
    /// All copies in this process, one after the other (Gymnasium's `SyncVectorEnv`).
    #[default]
    Sync,
    /// One subprocess per copy (Gymnasium's `AsyncVectorEnv`), for slow environments.
    Async,
}

/// What `[env]` says about a Gymnasium id besides its name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PythonOptions {
    /// Keyword arguments for `gymnasium.make`, as a JSON object (`env.kwargs`).
    pub kwargs_json: String,
    /// `module:Class` registered under the id's name first (`env.entry_point`).
    pub entry_point: Option<String>,
    /// Sync or async copies (`env.vectorization`).
    pub vectorization: Vectorization,
}

fn options() -> &'static Mutex<HashMap<String, PythonOptions>> {
    static OPTIONS: OnceLock<Mutex<HashMap<String, PythonOptions>>> = OnceLock::new();
    OPTIONS.get_or_init(Default::default)
}

/// Make `id` (`gymnasium:NAME`) build with `opts` in this process, as `gymnasium.register`
/// does for Python; the config's `[env]` table is registered before anything is built.
pub fn register(id: &str, opts: PythonOptions) {
    options()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(id.to_string(), opts);
}

#[cfg(feature = "python")]
pub(crate) fn options_of(id: &str) -> PythonOptions {
    options()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(id)
        .cloned()
        .unwrap_or_default()
}
