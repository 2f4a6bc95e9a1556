//! Optimisation on flat parameter buffers.
//!
//! `ParamLayout` lays a burn module's float parameters out in one `f32` buffer in visit order
//! (the same on every process, unlike burn's random parameter ids). [`Trainer`] owns a model,
//! its flat parameters and an [`Adam`] state: `backward` → gradients copied into one flat
//! buffer (where a data-parallel all-reduce plugs in: `GradSync`, the DDP reducer, owned by
//! a [`Trainer`] made distributed; a single process on the CPU skips the copy and steps from
//! the backward pass's own buffers) → optional norm clipping → one fused Adam loop →
//! parameters written back into the module.
//!
//! Why not burn's `ModuleOptimizer`: its state is keyed by per-process random parameter ids
//! (awkward for resumable checkpoints and cross-rank agreement) and runs ~10 tensor ops per
//! parameter; the fused flat loop is cheaper on small nets (`drill bench learner` measures the
//! DQN update it serves) and its state saves as two plain tensors.

mod acting;
mod adam;
mod grad_sync;
mod layout;
mod overlap;
mod trainer;

pub(crate) use acting::ActingCopy;
pub use adam::Adam;
pub use grad_sync::DdpOptions;
pub(crate) use grad_sync::GradSync;
pub(crate) use layout::ParamLayout;
pub use trainer::Trainer;
