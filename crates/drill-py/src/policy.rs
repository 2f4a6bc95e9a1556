//! `Policy`: a trained policy loaded for inference ([`drill_algo::inference::Loaded`]),
//! mapping numpy batches of observations to actions, Q-values or state values, and handing
//! out its tensors in PyTorch's layout under DI-engine's names.

use std::path::PathBuf;

use drill_env::{ActionBuf, ActionSpace, Dtype, Obs};
use numpy::{PyArray1, PyArray2, PyArrayDyn, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors;

/// A trained policy (see the module docs).
#[pyclass(module = "drill._drill", unsendable)]
pub struct Policy {
    loaded: drill_algo::inference::Loaded,
    out: ActionBuf,
}

impl Policy {
    /// Run `f` on the observations in `obs` (a numpy batch of the env's dtype and shape,
    /// or one observation); returns how many there were.
    fn with_obs<R>(
        &mut self,
        obs: &Bound<'_, PyAny>,
        f: impl FnOnce(&mut drill_algo::inference::Loaded, Obs<'_>, usize) -> R,
    ) -> PyResult<R> {
        let spec = &self.loaded.spec;
        let dim = spec.obs_dim();
        let shape = &spec.obs.shape;
        let check = |got: &[usize]| -> PyResult<usize> {
            let (n, rest) = if got == shape.as_slice() {
                (1, got)
            } else if got.len() == shape.len() + 1 {
                (got[0], &got[1..])
            } else {
                (0, got)
            };
            if rest != shape.as_slice() {
                return Err(PyValueError::new_err(format!(
                    "observations of shape {got:?}: {} takes {shape:?} or [n, {}]",
                    spec.id,
                    shape
                        .iter()
                        .map(usize::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
            Ok(n)
        };
        match spec.obs.dtype {
            Dtype::U8 => {
                let a = obs.cast::<PyArrayDyn<u8>>().map_err(|_| {
                    PyTypeError::new_err(format!("{}: observations must be uint8", spec.id))
                })?;
                let n = check(a.shape())?;
                let a = a.readonly();
                let s = a.as_slice()?;
                debug_assert_eq!(s.len(), n * dim);
                Ok(f(&mut self.loaded, Obs::U8(s), n))
            }
            Dtype::F32 => {
                let a = obs.cast::<PyArrayDyn<f32>>().map_err(|_| {
                    PyTypeError::new_err(format!("{}: observations must be float32", spec.id))
                })?;
                let n = check(a.shape())?;
                let a = a.readonly();
                let s = a.as_slice()?;
                Ok(f(&mut self.loaded, Obs::F32(s), n))
            }
        }
    }
}

#[pymethods]
impl Policy {
    /// Load an experiment folder (its newest checkpoint) or a checkpoint file (`config`:
    /// the config it was trained with, by default its folder's config.toml).
    #[new]
    #[pyo3(signature = (path, config=None))]
    fn new(path: PathBuf, config: Option<PathBuf>) -> PyResult<Self> {
        let device = burn::tensor::Device::flex();
        let loaded = drill_algo::inference::Loaded::open(&path, config.as_deref(), &device)
            .map_err(errors::train)?;
        let out = ActionBuf::for_space(&loaded.spec.action_space, 0);
        Ok(Policy { loaded, out })
    }

    /// The algorithm: "dqn", "ppo" or "sac".
    #[getter]
    fn kind(&self) -> &'static str {
        self.loaded.config.policy.kind()
    }

    /// The environment id it was trained on.
    #[getter]
    fn env_id(&self) -> &str {
        &self.loaded.spec.id
    }

    /// The shape of one observation.
    #[getter]
    fn obs_shape(&self) -> Vec<usize> {
        self.loaded.spec.obs.shape.clone()
    }

    /// The observations' numpy dtype name: "uint8" (frames) or "float32".
    #[getter]
    fn obs_dtype(&self) -> &'static str {
        crate::spaces::dtype_name(self.loaded.spec.obs.dtype)
    }

    /// Number of discrete actions (None for a continuous space).
    #[getter]
    fn n_actions(&self) -> Option<usize> {
        crate::spaces::n_actions(&self.loaded.spec.action_space)
    }

    /// The action count (discrete) or the action's dimension (continuous).
    #[getter]
    fn action_dim(&self) -> usize {
        self.loaded.spec.action_space.dim()
    }

    /// The checkpoint loaded.
    #[getter]
    fn checkpoint(&self) -> PathBuf {
        self.loaded.checkpoint.path.clone()
    }

    /// The config it was trained with, as TOML.
    #[getter]
    fn config(&self) -> String {
        self.loaded.config.to_toml()
    }

    /// Deterministic actions for a batch of observations (int64 indices, or float32
    /// `[n, dim]`), as `drill eval` takes them.
    fn act<'py>(&mut self, py: Python<'py>, obs: &Bound<'py, PyAny>) -> PyResult<Py<PyAny>> {
        let mut out = std::mem::take(&mut self.out);
        self.with_obs(obs, |l, o, _| l.act(o, &mut out))?;
        let arr: Py<PyAny> = match (&out, &self.loaded.spec.action_space) {
            (ActionBuf::Discrete(a), _) => PyArray1::from_iter(py, a.iter().map(|&x| i64::from(x)))
                .into_any()
                .unbind(),
            (ActionBuf::Continuous { dim, values }, ActionSpace::Continuous { .. }) => {
                PyArray1::from_slice(py, values)
                    .reshape([values.len() / dim.max(&1), *dim])?
                    .into_any()
                    .unbind()
            }
            _ => unreachable!("the policy acts in its env's action space"),
        };
        self.out = out;
        Ok(arr)
    }

    /// Whether the policy is recurrent: [`Self::act`] steps a state per row of the batch.
    #[getter]
    fn recurrent(&self) -> bool {
        self.loaded.recurrent()
    }

    /// A recurrent policy's state to zeros for the rows `rows` (their episodes ended), or
    /// for every row.
    #[pyo3(signature = (rows=None))]
    fn reset(&mut self, rows: Option<Vec<usize>>) {
        self.loaded.reset(rows.as_deref());
    }

    /// DQN's Q-values, float32 `[n, actions]`.
    fn q_values<'py>(
        &mut self,
        py: Python<'py>,
        obs: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let (q, n) = self.with_obs(obs, |l, o, n| (l.q_values(o), n))?;
        let q = q.map_err(errors::train)?;
        PyArray1::from_vec(py, q).reshape([n, self.loaded.spec.action_space.dim()])
    }

    /// PPO's state values, float32 `[n]`.
    fn values<'py>(
        &mut self,
        py: Python<'py>,
        obs: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<f32>>> {
        let v = self.with_obs(obs, |l, o, _| l.values(o))?;
        Ok(PyArray1::from_vec(py, v.map_err(errors::train)?))
    }

    /// The policy's tensors in PyTorch's layout under DI-engine's names (what `drill
    /// export` writes): name → float32 numpy array.
    fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let state = self.loaded.torch_state().map_err(errors::train)?;
        let d = PyDict::new(py);
        for (name, (shape, values)) in state {
            d.set_item(name, PyArray1::from_vec(py, values).reshape(shape)?)?;
        }
        Ok(d)
    }
}
