//! drill's errors as Python exceptions: `drill.Error` and, under it, `ConfigError` (a bad key or
//! value, its key path in the message) and `EnvError` (an unknown id, a missing ROM, copies
//! that panicked); the message is drill's own.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    _drill,
    Error,
    PyException,
    "An error drill reported; the message is drill's."
);
create_exception!(
    _drill,
    ConfigError,
    Error,
    "A config that cannot run: the message names the key path and the file."
);
create_exception!(
    _drill,
    EnvError,
    Error,
    "An environment that cannot be built (an unknown id, a missing ROM, a bad option) or whose copies panicked."
);

/// Register the exception types on the module.
pub(crate) fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("Error", py.get_type::<Error>())?;
    m.add("EnvError", py.get_type::<EnvError>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    Ok(())
}

/// A training-side error as the matching Python exception.
pub(crate) fn train(e: drill_algo::TrainError) -> PyErr {
    use drill_algo::TrainError as T;
    match &e {
        T::Config(_) => ConfigError::new_err(e.to_string()),
        T::Env(_) => EnvError::new_err(e.to_string()),
        _ => Error::new_err(e.to_string()),
    }
}

/// An environment error as `drill.EnvError`.
pub(crate) fn env(e: drill_env::EnvError) -> PyErr {
    EnvError::new_err(e.to_string())
}
