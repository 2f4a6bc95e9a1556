//! [`ConfigError`]: every way a configuration can be rejected, each naming its culprit.

/// A configuration that cannot be used, with the file, key path or override at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML.
    #[error("{file}: not valid TOML: {message}")]
    Syntax {
        /// The file (or `<string>`).
        file: String,
        /// The parser's message, with line and column.
        message: String,
    },
    /// A `--set` argument that is not `key.path=value`.
    #[error("bad override {arg:?}: {message}")]
    Override {
        /// The argument as given.
        arg: String,
        /// What is wrong with it.
        message: String,
    },
    /// A key that no part of the configuration knows.
    #[error("{file}: unknown key `{path}`{}", nearest.as_ref().map(|n| format!(" (did you mean `{n}`?)")).unwrap_or_default())]
    UnknownKey {
        /// The file.
        file: String,
        /// Full dotted path of the unknown key.
        path: String,
        /// The closest valid key at that level, if one is close.
        nearest: Option<String>,
    },
    /// A key whose value has the wrong type or is out of range.
    #[error("{file}: bad value for `{path}`: {message}")]
    Value {
        /// The file.
        file: String,
        /// Full dotted path of the key.
        path: String,
        /// What is wrong.
        message: String,
    },
}
