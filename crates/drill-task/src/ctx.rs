//! The per-step context: [`Context`], DI-engine's [`OnlineRLContext`] and a typed
//! [`Extensions`] map for user data.

use std::any::{Any, TypeId};
use std::collections::HashMap;

/// A step's context. [`Context::renew`] turns the last step's context into the next one:
/// fields marked to keep survive, everything else is reset.
pub trait Context: Default + Send + Sync + 'static {
    /// Prepare for the next step.
    fn renew(&mut self);
}

/// Values keyed by their type, each either kept across steps or dropped at the next renew.
#[derive(Default)]
pub struct Extensions {
    map: HashMap<TypeId, (Box<dyn Any + Send + Sync>, bool)>,
}

impl Extensions {
    /// Store `value` for this step only.
    pub fn insert<T: Any + Send + Sync>(&mut self, value: T) {
        self.map.insert(TypeId::of::<T>(), (Box::new(value), false));
    }

    /// Store `value` and carry it to later steps (DI-engine's `ctx.keep`).
    pub fn keep<T: Any + Send + Sync>(&mut self, value: T) {
        self.map.insert(TypeId::of::<T>(), (Box::new(value), true));
    }

    /// The value of type `T`, if set.
    pub fn get<T: Any + Send + Sync>(&self) -> Option<&T> {
        self.map.get(&TypeId::of::<T>())?.0.downcast_ref()
    }

    /// The value of type `T`, mutably, if set.
    pub fn get_mut<T: Any + Send + Sync>(&mut self) -> Option<&mut T> {
        self.map.get_mut(&TypeId::of::<T>())?.0.downcast_mut()
    }

    /// Take the value of type `T` out.
    pub fn remove<T: Any + Send + Sync>(&mut self) -> Option<T> {
        let (b, _) = self.map.remove(&TypeId::of::<T>())?;
        b.downcast().ok().map(|b| *b)
    }

    /// Drop what was not kept.
    pub fn renew(&mut self) {
        self.map.retain(|_, (_, keep)| *keep);
    }
}

impl std::fmt::Debug for Extensions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Extensions({} values)", self.map.len())
    }
}

/// DI-engine's `OnlineRLContext`: counters kept across steps (`total_step`, `env_step`,
/// `env_episode`, `train_iter`, `last_eval_iter`, `last_eval_value`), the rest fresh each step.
#[derive(Debug, Default)]
pub struct OnlineRLContext {
    /// Steps the task has run (kept).
    pub total_step: u64,
    /// Env steps collected (kept).
    pub env_step: u64,
    /// Episodes finished (kept).
    pub env_episode: u64,
    /// Gradient updates done (kept).
    pub train_iter: u64,
    /// `train_iter` at the last evaluation (kept; `None` before the first).
    pub last_eval_iter: Option<u64>,
    /// Mean return of the last evaluation (kept).
    pub last_eval_value: Option<f64>,
    /// This step's evaluation result, if one ran.
    pub eval_value: Option<f64>,
    /// Scalars a learner produced this step (loss, q, ...).
    pub train_output: Vec<(String, f64)>,
    /// User data by type.
    pub ext: Extensions,
}

impl Context for OnlineRLContext {
    fn renew(&mut self) {
        self.total_step += 1;
        self.eval_value = None;
        self.train_output.clear();
        self.ext.renew();
    }
}
