//! `VecEnvCore`: one of drill's vector environments (`drill_env::make_vec_with`, same-step
//! auto-reset) stepped into numpy arrays the caller owns, the GIL released while the copies
//! step. `step` runs in the calling thread; `send` hands the step to a worker thread of this
//! object and returns at once, `recv` waits for it (envpool's asynchronous pair). The Python
//! class `drill.VecEnv` (python/drill/vector.py) builds the arrays and the Gymnasium API on it.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use drill_env::atari::AtariOptions;
use drill_env::{ActionBuf, ActionSpace, DynVecEnv, EnvError, EnvSpec, Obs};
use numpy::{PyArrayDyn, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors;

/// Every id drill can build (classic control, and Atari when built with it).
#[pyfunction]
pub fn env_ids() -> Vec<String> {
    drill_env::ids()
}

/// What the worker is asked to do, or has done.
enum Job {
    Idle,
    Reset(Option<u64>),
    Step,
    Done(Result<(), EnvError>),
    Quit,
}

struct State {
    env: Box<dyn DynVecEnv>,
    /// The actions of the next step.
    actions: ActionBuf,
    job: Job,
    /// The last job run was a reset: the step results (rewards, flags) are not its.
    reset_last: bool,
    /// The message of a panic in an earlier job: the copies may be half stepped, so every
    /// later job fails with it.
    panicked: Option<String>,
}

impl State {
    /// Run `job` on the copies; a panic is caught and returned as an error (on the worker
    /// thread it would otherwise leave `recv` waiting for ever).
    fn run(&mut self, job: &Job) -> Result<(), EnvError> {
        let failed = |st: &Self, message: String| EnvError::Panicked {
            id: st.env.spec().id.clone(),
            message,
        };
        if let Some(message) = &self.panicked {
            return Err(failed(self, message.clone()));
        }
        self.reset_last = matches!(job, Job::Reset(_));
        let (env, actions) = (&mut self.env, &self.actions);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match job {
            Job::Reset(seed) => env.reset(*seed).map(drop),
            Job::Step => env.step(actions.as_actions()),
            _ => Ok(()),
        }));
        r.unwrap_or_else(|payload| {
            let message = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic without a message".to_string());
            self.panicked = Some(message.clone());
            Err(failed(self, message))
        })
    }
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// drill's vector environment for Python (see the module docs).
#[pyclass(module = "drill._drill")]
pub struct VecEnvCore {
    shared: Arc<Shared>,
    spec: EnvSpec,
    num_envs: usize,
    worker: Option<JoinHandle<()>>,
    pending: bool,
}

/// The wrapper chain's options from keyword arguments (drill-env's [`AtariOptions`], the
/// same names and checks as a config's `[env]`); an unknown or bad one is named.
fn atari_options(id: &str, options: Option<&Bound<'_, PyDict>>) -> PyResult<AtariOptions> {
    let Some(options) = options else {
        return Ok(AtariOptions::default());
    };
    let mut given = serde_json::Map::new();
    for (k, v) in options.iter() {
        let key: String = k.extract()?;
        if drill_env::atari::parse_id(id).is_none() {
            return Err(PyTypeError::new_err(format!(
                "{id} takes no option {key:?} (the wrapper options are Atari's)"
            )));
        }
        let value = if let Ok(b) = v.cast::<pyo3::types::PyBool>() {
            serde_json::Value::Bool(b.is_true())
        } else if let Ok(n) = v.extract::<i64>() {
            serde_json::Value::from(n)
        } else {
            return Err(PyTypeError::new_err(format!(
                "{id}: option {key:?} must be a bool or an int, not {v}"
            )));
        };
        given.insert(key, value);
    }
    let opts: AtariOptions = serde_path_to_error::deserialize(serde_json::Value::Object(given))
        .map_err(|e| {
            let message = e.inner().to_string();
            if message.starts_with("unknown field") {
                PyTypeError::new_err(format!("{id}: {message}"))
            } else {
                PyValueError::new_err(format!(
                    "{id}: option {:?}: {message}",
                    e.path().to_string()
                ))
            }
        })?;
    opts.check()
        .map_err(|(key, why)| PyValueError::new_err(format!("{id}: option {key:?} {why}")))?;
    Ok(opts)
}

/// `array` as a mutable slice of `T` with `len` elements, or an error naming `what`.
fn slice_mut<'a, T: numpy::Element>(
    array: &'a Bound<'_, PyAny>,
    len: usize,
    what: &str,
) -> PyResult<numpy::PyReadwriteArrayDyn<'a, T>> {
    let a = array.cast::<PyArrayDyn<T>>().map_err(|_| {
        PyTypeError::new_err(format!(
            "{what}: expected a numpy array of {}",
            std::any::type_name::<T>()
        ))
    })?;
    if a.len() != len {
        return Err(PyValueError::new_err(format!(
            "{what}: {} elements, expected {len}",
            a.len()
        )));
    }
    let rw = a
        .try_readwrite()
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    Ok(rw)
}

/// Copy `obs` into the numpy array `out`.
fn write_obs(obs: Obs<'_>, out: &Bound<'_, PyAny>, what: &str) -> PyResult<()> {
    match obs {
        Obs::U8(x) => {
            let mut a = slice_mut::<u8>(out, x.len(), what)?;
            a.as_slice_mut()?.copy_from_slice(x);
        }
        Obs::F32(x) => {
            let mut a = slice_mut::<f32>(out, x.len(), what)?;
            a.as_slice_mut()?.copy_from_slice(x);
        }
    }
    Ok(())
}

impl VecEnvCore {
    fn idle(&self, what: &str) -> PyResult<()> {
        if self.pending {
            return Err(PyRuntimeError::new_err(format!(
                "{what}: a step sent with send() is still running; recv() it first"
            )));
        }
        Ok(())
    }

    /// Copy `actions` (numpy) into the state's action buffer, checked.
    fn set_actions(&self, actions: &Bound<'_, PyAny>) -> PyResult<()> {
        let n = self.num_envs;
        let wrong_count = |got: usize| {
            PyValueError::new_err(format!("actions: {got} given, expected one per copy ({n})"))
        };
        let mut st = self.shared.lock();
        match &self.spec.action_space {
            ActionSpace::Discrete(k) => {
                // Negative values become -1, then u32::MAX: out of range below, and named.
                let out = if let Ok(a) = actions.cast::<PyArrayDyn<i64>>() {
                    let a = a.readonly();
                    let a = a.as_slice()?;
                    if a.len() != n {
                        return Err(wrong_count(a.len()));
                    }
                    let out = st.actions.discrete_mut(n);
                    for (o, &x) in out.iter_mut().zip(a) {
                        *o = x.clamp(-1, u32::MAX as i64) as u32;
                    }
                    out
                } else if let Ok(a) = actions.cast::<PyArrayDyn<i32>>() {
                    let a = a.readonly();
                    let a = a.as_slice()?;
                    if a.len() != n {
                        return Err(wrong_count(a.len()));
                    }
                    let out = st.actions.discrete_mut(n);
                    for (o, &x) in out.iter_mut().zip(a) {
                        *o = x.max(-1) as u32;
                    }
                    out
                } else {
                    return Err(PyTypeError::new_err(
                        "actions: expected a numpy array of int64 or int32, one per copy",
                    ));
                };
                if let Some(i) = out.iter().position(|&a| a as usize >= *k) {
                    return Err(PyValueError::new_err(format!(
                        "actions[{i}] = {}: {} has actions 0..{}",
                        out[i] as i32,
                        self.spec.id,
                        k - 1
                    )));
                }
            }
            ActionSpace::Continuous { low, .. } => {
                let a = actions.cast::<PyArrayDyn<f32>>().map_err(|_| {
                    PyTypeError::new_err("actions: expected a numpy array of float32")
                })?;
                let a = a.readonly();
                let s = a.as_slice()?;
                if s.len() != n * low.len() {
                    return Err(PyValueError::new_err(format!(
                        "actions: {} values, expected {n} copies x {}",
                        s.len(),
                        low.len()
                    )));
                }
                st.actions.continuous_mut(n, low.len()).copy_from_slice(s);
            }
        }
        Ok(())
    }

    /// Copy the last step's results into the caller's arrays; returns how many copies
    /// finished an episode.
    fn write_step(
        &self,
        st: &State,
        obs: &Bound<'_, PyAny>,
        rewards: &Bound<'_, PyAny>,
        terminated: &Bound<'_, PyAny>,
        truncated: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        let n = self.num_envs;
        write_obs(st.env.obs(), obs, "obs")?;
        let mut rewards = slice_mut::<f32>(rewards, n, "rewards")?;
        let mut terminated = slice_mut::<bool>(terminated, n, "terminated")?;
        let mut truncated = slice_mut::<bool>(truncated, n, "truncated")?;
        if st.reset_last {
            rewards.as_slice_mut()?.fill(0.0);
            terminated.as_slice_mut()?.fill(false);
            truncated.as_slice_mut()?.fill(false);
            return Ok(0);
        }
        rewards.as_slice_mut()?.copy_from_slice(st.env.rewards());
        terminated
            .as_slice_mut()?
            .copy_from_slice(st.env.terminated());
        truncated
            .as_slice_mut()?
            .copy_from_slice(st.env.truncated());
        Ok(st
            .env
            .terminated()
            .iter()
            .zip(st.env.truncated())
            .filter(|(a, b)| **a || **b)
            .count())
    }

    fn start_worker(&mut self) {
        if self.worker.is_some() {
            return;
        }
        let shared = Arc::clone(&self.shared);
        self.worker = Some(
            std::thread::Builder::new()
                .name("drill-vecenv".into())
                .spawn(move || {
                    loop {
                        let mut st = shared.lock();
                        while matches!(st.job, Job::Idle | Job::Done(_)) {
                            st = shared.changed.wait(st).unwrap_or_else(|p| p.into_inner());
                        }
                        let job = std::mem::replace(&mut st.job, Job::Idle);
                        if matches!(job, Job::Quit) {
                            return;
                        }
                        let r = st.run(&job);
                        st.job = Job::Done(r);
                        shared.changed.notify_all();
                    }
                })
                .expect("cannot start the vector env's worker thread"),
        );
    }

    fn post(&mut self, job: Job) {
        self.start_worker();
        self.shared.lock().job = job;
        self.shared.changed.notify_all();
        self.pending = true;
    }
}

#[pymethods]
impl VecEnvCore {
    /// `num_envs` copies of `id`, copy `i` seeded `seed + i` at the first reset,
    /// stepped on `num_threads` threads; `options` are the Atari wrapper chain's.
    #[new]
    #[pyo3(signature = (id, num_envs, seed, num_threads, options=None))]
    fn new(
        id: &str,
        num_envs: usize,
        seed: u64,
        num_threads: usize,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let opts = atari_options(id, options)?;
        let env = drill_env::make_vec_with(id, num_envs, seed, num_threads.max(1), &opts)
            .map_err(errors::env)?;
        let spec = env.spec().clone();
        Ok(VecEnvCore {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    env,
                    actions: ActionBuf::for_space(&spec.action_space, num_envs),
                    job: Job::Idle,
                    reset_last: false,
                    panicked: None,
                }),
                changed: Condvar::new(),
            }),
            spec,
            num_envs,
            worker: None,
            pending: false,
        })
    }

    /// The id it was made from.
    #[getter]
    fn id(&self) -> &str {
        &self.spec.id
    }

    /// Copies stepped together.
    #[getter]
    fn num_envs(&self) -> usize {
        self.num_envs
    }

    /// The shape of one observation.
    #[getter]
    fn obs_shape(&self) -> Vec<usize> {
        self.spec.obs.shape.clone()
    }

    /// The observations' numpy dtype name: "uint8" (frames) or "float32".
    #[getter]
    fn obs_dtype(&self) -> &'static str {
        crate::spaces::dtype_name(self.spec.obs.dtype)
    }

    /// Number of discrete actions (None for a continuous space).
    #[getter]
    fn n_actions(&self) -> Option<usize> {
        crate::spaces::n_actions(&self.spec.action_space)
    }

    /// The continuous action box, (low, high) (None for a discrete space).
    #[getter]
    fn action_box(&self) -> Option<(Vec<f32>, Vec<f32>)> {
        match &self.spec.action_space {
            ActionSpace::Discrete(_) => None,
            ActionSpace::Continuous { low, high } => Some((low.clone(), high.clone())),
        }
    }

    /// The registered episode step limit, if any.
    #[getter]
    fn max_episode_steps(&self) -> Option<u32> {
        self.spec.max_episode_steps
    }

    /// Gymnasium's reward threshold, if it defines one.
    #[getter]
    fn reward_threshold(&self) -> Option<f64> {
        self.spec.reward_threshold
    }

    /// Reset every copy (seeded `seed + i`, or continuing each copy's stream), writing the
    /// observations into `obs`.
    #[pyo3(signature = (seed, obs))]
    fn reset(&mut self, py: Python<'_>, seed: Option<u64>, obs: &Bound<'_, PyAny>) -> PyResult<()> {
        self.idle("reset")?;
        let shared = Arc::clone(&self.shared);
        py.detach(move || shared.lock().run(&Job::Reset(seed)))
            .map_err(errors::env)?;
        write_obs(self.shared.lock().env.obs(), obs, "obs")
    }

    /// Step every copy with `actions` (int64/int32 indices, or float32 `[n, dim]`),
    /// auto-resetting finished ones; writes the results into the arrays and returns how
    /// many copies finished an episode (then `finals` has their last observations).
    fn step(
        &mut self,
        py: Python<'_>,
        actions: &Bound<'_, PyAny>,
        obs: &Bound<'_, PyAny>,
        rewards: &Bound<'_, PyAny>,
        terminated: &Bound<'_, PyAny>,
        truncated: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        self.idle("step")?;
        self.set_actions(actions)?;
        let shared = Arc::clone(&self.shared);
        py.detach(move || shared.lock().run(&Job::Step))
            .map_err(errors::env)?;
        let st = self.shared.lock();
        self.write_step(&st, obs, rewards, terminated, truncated)
    }

    /// Start a step with `actions` on this object's worker thread and return at once;
    /// `recv` collects it.
    fn send(&mut self, actions: &Bound<'_, PyAny>) -> PyResult<()> {
        self.idle("send")?;
        self.set_actions(actions)?;
        self.post(Job::Step);
        Ok(())
    }

    /// Start a reset on the worker thread; `recv` collects it (its rewards and flags zero).
    #[pyo3(signature = (seed=None))]
    fn send_reset(&mut self, seed: Option<u64>) -> PyResult<()> {
        self.idle("send_reset")?;
        self.post(Job::Reset(seed));
        Ok(())
    }

    /// Wait for what `send` (or `send_reset`) started and write its results, as `step`.
    fn recv(
        &mut self,
        py: Python<'_>,
        obs: &Bound<'_, PyAny>,
        rewards: &Bound<'_, PyAny>,
        terminated: &Bound<'_, PyAny>,
        truncated: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        if !self.pending {
            return Err(PyRuntimeError::new_err(
                "recv: nothing was sent (call send(actions) or async_reset() first)",
            ));
        }
        let shared = Arc::clone(&self.shared);
        let result = py.detach(move || {
            let mut st = shared.lock();
            while !matches!(st.job, Job::Done(_)) {
                st = shared.changed.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            match std::mem::replace(&mut st.job, Job::Idle) {
                Job::Done(r) => r,
                _ => unreachable!("the loop waited for Done"),
            }
        });
        self.pending = false;
        result.map_err(errors::env)?;
        let st = self.shared.lock();
        self.write_step(&st, obs, rewards, terminated, truncated)
    }

    /// The last step's finished episodes: the last observation of every copy's transition
    /// (pre-reset where an episode ended), and the return and length of the episodes that
    /// ended (valid where terminated or truncated).
    fn finals(
        &self,
        final_obs: &Bound<'_, PyAny>,
        returns: &Bound<'_, PyAny>,
        lengths: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        self.idle("finals")?;
        let st = self.shared.lock();
        let n = self.num_envs;
        write_obs(st.env.final_obs(), final_obs, "final_obs")?;
        slice_mut::<f64>(returns, n, "returns")?
            .as_slice_mut()?
            .copy_from_slice(st.env.final_returns());
        let mut l = slice_mut::<i64>(lengths, n, "lengths")?;
        for (o, &x) in l.as_slice_mut()?.iter_mut().zip(st.env.final_lengths()) {
            *o = i64::from(x);
        }
        Ok(())
    }

    /// Stop the worker thread (also when the object is dropped).
    fn close(&mut self) {
        if let Some(w) = self.worker.take() {
            self.shared.lock().job = Job::Quit;
            self.shared.changed.notify_all();
            let _ = w.join();
        }
        self.pending = false;
    }
}

impl Drop for VecEnvCore {
    fn drop(&mut self) {
        self.close();
    }
}
