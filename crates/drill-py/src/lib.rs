//! `drill._drill`, the native half of the Python package `drill` (python/drill: the public
//! API, its docs and type stubs live there):
//!
//! - [`vector`]: `VecEnvCore`, drill's vector environments stepped into numpy arrays the
//!   caller owns (what `drill.make_vec` wraps as a Gymnasium `VectorEnv`);
//! - [`training`]: `train` and `train_rank`, a whole `drill train` run in this process (or
//!   its ranks started as processes), the GIL released while it runs;
//! - [`policy`]: `Policy`, a trained policy loaded for inference (`drill.load`);
//! - [`errors`]: drill's errors as Python exceptions carrying drill's message; [`spaces`]:
//!   the spec's facts the getters share.

mod errors;
mod policy;
mod spaces;
mod training;
mod vector;

use pyo3::prelude::*;

/// The native module.
#[pymodule]
fn _drill(m: &Bound<'_, PyModule>) -> PyResult<()> {
    training::init_logging();
    errors::add(m)?;
    m.add_class::<vector::VecEnvCore>()?;
    m.add_class::<policy::Policy>()?;
    m.add_function(wrap_pyfunction!(training::train, m)?)?;
    m.add_function(wrap_pyfunction!(training::launch, m)?)?;
    m.add_function(wrap_pyfunction!(vector::env_ids, m)?)?;
    m.add("ATARI", cfg!(feature = "atari"))?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
