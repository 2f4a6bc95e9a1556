//! Gymnasium environments from Python (feature `python`): `env.id = "gymnasium:NAME"` runs
//! NAME (any registered id, or the class `env.entry_point` names) inside drill through
//! PyO3's embedded CPython.
//!
//! - The interpreter is the one drill was linked against; the packages are those of the
//!   active virtualenv (`VIRTUAL_ENV`) or of the interpreter `DRILL_PYTHON` names, added to
//!   `sys.path` once per process.
//! - [`PyVecEnv`] steps Gymnasium's vector env (`make_vec`, `sync` or `async` subprocess
//!   workers) with one call per step, in Gymnasium's SAME_STEP auto-reset mode, which is
//!   drill's own ([`crate::VecEnv`]); observations, rewards and flags come back as contiguous
//!   numpy arrays and are copied once into drill's buffers through the buffer protocol.
//! - Box and Discrete spaces map to drill's ([`ObsSpace`], [`ActionSpace`]); other spaces
//!   are refused with their name. A Python exception becomes [`EnvError::Python`] with the
//!   traceback and the id, never a panic.
//!
//! The Python half is `drill_gym.py`, next to this file.

use std::sync::OnceLock;

use pyo3::buffer::{Element, PyBuffer};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::gymnasium::{GYMNASIUM as PREFIX, Vectorization, options_of};
use crate::{ActionSpace, Actions, Dtype, DynVecEnv, EnvError, EnvSpec, Obs, ObsBuf, ObsSpace};

/// `EnvError::Python` with the exception's traceback.
fn error(py: Python<'_>, id: &str, e: PyErr) -> EnvError {
    let trace = e
        .traceback(py)
        .and_then(|t| t.format().ok())
        .unwrap_or_default();
    EnvError::Python {
        id: id.to_string(),
        message: format!("{trace}{e}"),
    }
}

/// Puts the virtualenv's packages on `sys.path` and makes subprocess workers start the
/// virtualenv's interpreter (the embedding program is not one).
const SETUP: &std::ffi::CStr = cr#"
import glob, os, site, subprocess, sys
python = os.environ.get("DRILL_PYTHON")
venv = os.environ.get("VIRTUAL_ENV")
if python:
    out = subprocess.check_output([python, "-c", "import site; print('\\n'.join(site.getsitepackages()))"])
    dirs = out.decode().split()
elif venv:
    dirs = glob.glob(os.path.join(venv, "lib", "python*", "site-packages"))
    python = os.path.join(venv, "bin", "python")
else:
    dirs = []
for d in dirs:
    site.addsitedir(d)
if python:
    sys.executable = python
    import multiprocessing
    multiprocessing.set_executable(python)
"#;

/// drill's Python module (`drill_gym.py`), imported once per process.
fn module(py: Python<'_>) -> PyResult<Bound<'_, PyModule>> {
    static MODULE: OnceLock<Py<PyModule>> = OnceLock::new();
    if let Some(m) = MODULE.get() {
        return Ok(m.bind(py).clone());
    }
    py.run(SETUP, None, None)?;
    let m = PyModule::from_code(
        py,
        pyo3::ffi::c_str!(include_str!("drill_gym.py")),
        c"drill_gym.py",
        c"drill_gym",
    )?;
    let _ = MODULE.set(m.clone().unbind());
    Ok(m)
}

/// A space as `drill_gym._space` describes it.
type SpaceDesc = (String, Vec<usize>, String, Vec<f32>, Vec<f32>, usize, i64);

fn obs_space(id: &str, d: SpaceDesc) -> Result<ObsSpace, EnvError> {
    match (d.0.as_str(), d.2.as_str()) {
        ("box", "u8") => Ok(ObsSpace {
            shape: d.1,
            dtype: Dtype::U8,
        }),
        ("box", _) => Ok(ObsSpace {
            shape: if d.1.is_empty() { vec![1] } else { d.1 },
            dtype: Dtype::F32,
        }),
        (kind, name) => Err(EnvError::Space {
            id: id.to_string(),
            what: "observation",
            space: if kind == "discrete" {
                "Discrete".into()
            } else {
                name.to_string()
            },
        }),
    }
}

fn action_space(id: &str, d: SpaceDesc) -> Result<ActionSpace, EnvError> {
    match d.0.as_str() {
        "discrete" => Ok(ActionSpace::Discrete(d.5)),
        "box" => Ok(ActionSpace::Continuous {
            low: d.3,
            high: d.4,
        }),
        _ => Err(EnvError::Space {
            id: id.to_string(),
            what: "action",
            space: d.2,
        }),
    }
}

/// What `drill_gym._describe` returns.
type Description = (SpaceDesc, SpaceDesc, Option<u32>, Option<f64>);

fn spec_from(id: &str, d: Description) -> Result<EnvSpec, EnvError> {
    Ok(EnvSpec {
        id: id.to_string(),
        obs: obs_space(id, d.0)?,
        action_space: action_space(id, d.1)?,
        max_episode_steps: d.2,
        reward_threshold: d.3,
    })
}

/// The spec of `gymnasium:NAME` (one copy is made to read its spaces).
pub fn spec(id: &str) -> Result<EnvSpec, EnvError> {
    let name = &id[PREFIX.len()..];
    let opts = options_of(id);
    let got = Python::attach(|py| {
        module(py)
            .and_then(|m| {
                m.getattr("spec")?
                    .call1((name, &opts.kwargs_json, opts.entry_point.as_deref()))
            })
            .and_then(|r| r.extract::<Description>())
            .map_err(|e| error(py, id, e))
    })?;
    spec_from(id, got)
}

/// `n` copies of a Gymnasium env stepped through its vector API.
pub struct PyVecEnv {
    spec: EnvSpec,
    n: usize,
    env: Py<PyAny>,
    first_seed: Option<u64>,
    obs: ObsBuf,
    final_obs: ObsBuf,
    rewards: Vec<f32>,
    flags: Vec<u8>,
    terminated: Vec<bool>,
    truncated: Vec<bool>,
    running_return: Vec<f64>,
    running_length: Vec<u32>,
    final_return: Vec<f64>,
    final_length: Vec<u32>,
    /// The numpy array drill writes each step's actions into.
    actions: Py<PyAny>,
    discrete: Vec<i64>,
    continuous: Vec<f32>,
    rewards_f64: Vec<f64>,
    ended: Vec<u32>,
    finals: ObsBuf,
}

/// Build `n` copies of `id` (`gymnasium:NAME`); copy `i` is seeded `seed + i` on the first
/// reset, as drill's own envs are.
pub fn make_vec(id: &str, n: usize, seed: u64) -> Result<PyVecEnv, EnvError> {
    let name = &id[PREFIX.len()..];
    let opts = options_of(id);
    let mode = match opts.vectorization {
        Vectorization::Sync => "sync",
        Vectorization::Async => "async",
    };
    let env = Python::attach(|py| {
        module(py)
            .and_then(|m| {
                m.getattr("Vec")?.call1((
                    name,
                    n,
                    mode,
                    &opts.kwargs_json,
                    opts.entry_point.as_deref(),
                ))
            })
            .and_then(|env| {
                let described = env.getattr("description")?.extract::<Description>()?;
                Ok((env.unbind(), described))
            })
            .map_err(|e| error(py, id, e))
    })?;
    let (env, described) = env;
    // The vector env's own spaces: no extra copy is made to read them.
    let spec = spec_from(id, described).inspect_err(|_| {
        Python::attach(|py| {
            let _ = env.bind(py).call_method0("close");
        })
    })?;
    let actions = Python::attach(|py| {
        env.bind(py)
            .getattr("actions")
            .map(Bound::unbind)
            .map_err(|e| error(py, id, e))
    })?;
    let d = spec.obs_dim();
    Ok(PyVecEnv {
        n,
        env,
        first_seed: Some(seed),
        obs: ObsBuf::zeros(spec.obs.dtype, n * d),
        final_obs: ObsBuf::zeros(spec.obs.dtype, n * d),
        rewards: vec![0.0; n],
        flags: vec![0; n],
        terminated: vec![false; n],
        truncated: vec![false; n],
        running_return: vec![0.0; n],
        running_length: vec![0; n],
        final_return: vec![0.0; n],
        final_length: vec![0; n],
        actions,
        discrete: vec![0; n],
        continuous: vec![0.0; n * spec.action_space.dim()],
        rewards_f64: vec![0.0; n],
        ended: Vec::new(),
        finals: ObsBuf::new(spec.obs.dtype),
        spec,
    })
}

/// Copy the contiguous numpy array `a` into `out` (same element count, or a clear error).
fn copy_into<T: Element + Copy>(
    py: Python<'_>,
    a: &Bound<'_, PyAny>,
    out: &mut [T],
) -> PyResult<()> {
    let buf = PyBuffer::<T>::get(a)?;
    buf.copy_to_slice(py, out)
}

fn copy_obs(py: Python<'_>, a: &Bound<'_, PyAny>, out: &mut ObsBuf) -> PyResult<()> {
    match out {
        ObsBuf::F32(v) => copy_into(py, a, v),
        ObsBuf::U8(v) => copy_into(py, a, v),
    }
}

impl PyVecEnv {
    /// Write the actions into the env's array, step, and copy what comes back.
    fn call_step(&mut self, py: Python<'_>, discrete: bool) -> PyResult<()> {
        let actions = self.actions.bind(py);
        if discrete {
            PyBuffer::<i64>::get(actions)?.copy_from_slice(py, &self.discrete)?;
        } else {
            PyBuffer::<f32>::get(actions)?.copy_from_slice(py, &self.continuous)?;
        }
        let r = self.env.bind(py).call_method0("step")?;
        let r = r.cast::<PyTuple>()?;
        copy_obs(py, &r.get_item(0)?, &mut self.obs)?;
        self.final_obs.clone_from(&self.obs);
        let finals = r.get_item(1)?;
        if !finals.is_none() {
            let ids = finals.get_item(0)?;
            self.ended
                .resize(PyBuffer::<u32>::get(&ids)?.item_count(), 0);
            copy_into(py, &ids, &mut self.ended)?;
            let d = self.spec.obs_dim();
            self.finals.resize(self.ended.len() * d);
            copy_obs(py, &finals.get_item(1)?, &mut self.finals)?;
            for (k, &i) in self.ended.iter().enumerate() {
                let row = self.finals.as_obs().rows(k..k + 1, d);
                self.final_obs.write(i as usize * d, row);
            }
        }
        copy_into(py, &r.get_item(2)?, &mut self.rewards_f64)?;
        for (r, &x) in self.rewards.iter_mut().zip(&self.rewards_f64) {
            *r = x as f32;
        }
        copy_into(py, &r.get_item(3)?, &mut self.flags)?;
        for (t, &f) in self.terminated.iter_mut().zip(&self.flags) {
            *t = f != 0;
        }
        copy_into(py, &r.get_item(4)?, &mut self.flags)?;
        for (t, &f) in self.truncated.iter_mut().zip(&self.flags) {
            *t = f != 0;
        }
        Ok(())
    }
}

impl DynVecEnv for PyVecEnv {
    fn spec(&self) -> &EnvSpec {
        &self.spec
    }

    fn num_envs(&self) -> usize {
        self.n
    }

    fn reset(&mut self, seed: Option<u64>) -> Result<Obs<'_>, EnvError> {
        let seed = seed.or(self.first_seed.take());
        self.first_seed = None;
        Python::attach(|py| {
            let obs = self.env.bind(py).call_method1("reset", (seed,))?;
            copy_obs(py, &obs, &mut self.obs)
        })
        .map_err(|e| Python::attach(|py| error(py, &self.spec.id, e)))?;
        self.final_obs.clone_from(&self.obs);
        self.running_return.fill(0.0);
        self.running_length.fill(0);
        Ok(self.obs.as_obs())
    }

    fn step(&mut self, actions: Actions<'_>) -> Result<(), EnvError> {
        let discrete = match (actions, &self.spec.action_space) {
            (Actions::Discrete(a), _) => {
                assert_eq!(a.len(), self.n, "one discrete action per copy");
                for (d, &x) in self.discrete.iter_mut().zip(a) {
                    *d = i64::from(x);
                }
                true
            }
            (Actions::Continuous(a), ActionSpace::Continuous { low, high }) => {
                // Clipped to the box, as drill's own envs do (Gymnasium's ClipAction).
                assert_eq!(a.len(), self.continuous.len(), "act_dim values per copy");
                let dim = low.len();
                for (k, (c, &x)) in self.continuous.iter_mut().zip(a).enumerate() {
                    *c = x.clamp(low[k % dim], high[k % dim]);
                }
                false
            }
            (Actions::Continuous(_), ActionSpace::Discrete(_)) => {
                panic!(
                    "continuous actions for {}, which has discrete ones",
                    self.spec.id
                )
            }
        };
        Python::attach(|py| {
            self.call_step(py, discrete)
                .map_err(|e| error(py, &self.spec.id, e))
        })?;
        for i in 0..self.n {
            crate::vector::tally(
                (&mut self.running_return[i], &mut self.running_length[i]),
                (&mut self.final_return[i], &mut self.final_length[i]),
                self.rewards_f64[i],
                self.terminated[i] || self.truncated[i],
            );
        }
        Ok(())
    }

    fn obs(&self) -> Obs<'_> {
        self.obs.as_obs()
    }
    fn final_obs(&self) -> Obs<'_> {
        self.final_obs.as_obs()
    }
    fn rewards(&self) -> &[f32] {
        &self.rewards
    }
    fn terminated(&self) -> &[bool] {
        &self.terminated
    }
    fn truncated(&self) -> &[bool] {
        &self.truncated
    }
    fn final_returns(&self) -> &[f64] {
        &self.final_return
    }
    fn final_lengths(&self) -> &[u32] {
        &self.final_length
    }
}

impl Drop for PyVecEnv {
    fn drop(&mut self) {
        Python::attach(|py| {
            if let Err(e) = self.env.bind(py).call_method0("close") {
                eprintln!("warning: closing {}: {e}", self.spec.id);
            }
        });
    }
}
