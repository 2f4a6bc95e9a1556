//! [`CkptSaver`]: `best` and `latest` checkpoints at each evaluation, `final` at the end.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use drill_task::{Middleware, OnlineRLContext, TaskError, TaskHandle};
use rand_chacha::ChaCha8Rng;

use super::exchange::eval_point;
use super::{EvalOutput, Outputs, task_err};
use crate::checkpoint::{Checkpoint, TRAIN_SECONDS, rng_state};
use crate::data::{ReplayBuffer, Stamp, replay_path};
use crate::ddp::Ranks;
use crate::policy::Policy;

/// Training time across a run and the runs it continues: each checkpoint says how long
/// training took to reach it (`train_seconds`, this run's time and that of the checkpoint it
/// continued from), so a run stopped and continued with `--resume` reports its whole time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TrainClock {
    start: Instant,
    before: Option<f64>,
}

impl TrainClock {
    /// Started now, continuing `resume` if there is one. A checkpoint written before the
    /// count existed (or with a value that is not a finite, non-negative number) leaves the
    /// total unknown.
    pub(crate) fn start(resume: Option<&Checkpoint>) -> Self {
        let before = match resume {
            None => Some(0.0),
            Some(ck) => {
                let before = ck.train_seconds();
                if before.is_none() {
                    tracing::info!(
                        "{} holds no valid `{TRAIN_SECONDS}`: result.json's total_wall_seconds will be null",
                        ck.path.display()
                    );
                }
                before
            }
        };
        Self {
            start: Instant::now(),
            before,
        }
    }

    /// `(this run's seconds, the total with the runs it continues)`, from one reading.
    pub(crate) fn seconds(&self) -> (f64, Option<f64>) {
        let run = self.start.elapsed().as_secs_f64();
        (run, self.before.map(|b| b + run))
    }
}

/// Writes `best` (when an evaluation improves on the best so far) and `latest` after every
/// evaluation, and `final` when the task finishes; each the policy's state dict with the
/// counters, the training time ([`TrainClock`]), the algorithm and every rank's generator
/// state, so a run resumes where it stopped. Rank 0 writes; under
/// DDP every rank takes part (the generator states are gathered).
///
/// With the evaluator in another process ([`Self::remote_eval`]), the weights evaluated are
/// older than the learner's: a snapshot is taken at each multiple of `eval_freq` and the one
/// the result refers to becomes `best`.
pub(crate) struct CkptSaver<'a, P> {
    out: &'a Outputs<'a>,
    policy: &'a RefCell<P>,
    ranks: Ranks,
    rng: &'a RefCell<ChaCha8Rng>,
    clock: TrainClock,
    best: f64,
    snapshots: Option<(u64, BTreeMap<u64, Checkpoint>)>,
    /// The train iteration the last step started at (for [`eval_point`]).
    prev_iter: Option<u64>,
    replay: Option<(&'a RefCell<ReplayBuffer>, PathBuf)>,
    final_saved: bool,
}

/// Snapshots kept while their evaluation is pending.
const MAX_SNAPSHOTS: usize = 16;

impl<'a, P: Policy> CkptSaver<'a, P> {
    /// Save `policy`'s state dict into `out`, stamped with `clock`'s training time.
    pub(crate) fn new(
        out: &'a Outputs<'a>,
        policy: &'a RefCell<P>,
        ranks: Ranks,
        rng: &'a RefCell<ChaCha8Rng>,
        clock: TrainClock,
    ) -> Self {
        Self {
            out,
            policy,
            ranks,
            rng,
            clock,
            best: f64::NEG_INFINITY,
            snapshots: None,
            prev_iter: None,
            replay: None,
            final_saved: false,
        }
    }

    /// With `final`, every rank also saves its replay buffer into the checkpoint folder
    /// `ckpt_dir` (`drill train --save-replay`), stamped with the same counters.
    pub(crate) fn save_replay(
        mut self,
        buffer: &'a RefCell<ReplayBuffer>,
        ckpt_dir: PathBuf,
    ) -> Self {
        self.replay = Some((buffer, ckpt_dir));
        self
    }

    fn write_replay(&self, env_steps: u64, train_iters: u64) -> Result<(), TaskError> {
        let Some((buffer, dir)) = &self.replay else {
            return Ok(());
        };
        let t = Instant::now();
        let path = replay_path(dir, self.ranks.rank());
        let buffer = buffer.borrow();
        let stamp = Stamp {
            env_steps,
            train_iters,
            world_size: self.ranks.world(),
        };
        drill_exp::durable::create_dir_all(dir).map_err(|e| {
            task_err(crate::error::TrainError::io(
                format!("cannot create {}", dir.display()),
                e,
            ))
        })?;
        let bytes = buffer.save(&path, stamp).map_err(task_err)?;
        tracing::info!(
            "replay buffer saved: {} transitions, {:.1} MB in {:.2} s → {}",
            buffer.len(),
            bytes as f64 / 1e6,
            t.elapsed().as_secs_f64(),
            path.display()
        );
        Ok(())
    }

    /// The evaluator runs in another process on the weights of every `eval_freq`-th
    /// iteration: keep snapshots for `best`.
    pub(crate) fn remote_eval(mut self, eval_freq: u64) -> Self {
        self.snapshots = Some((eval_freq.max(1), BTreeMap::new()));
        self
    }

    fn rngs(&self) -> Result<Vec<String>, TaskError> {
        let mine = rng_state(&self.rng.borrow());
        self.ranks.gather(mine).map_err(task_err)
    }

    fn build(&self) -> Checkpoint {
        self.policy.borrow().state_dict()
    }
}

impl<P: Policy> Middleware<OnlineRLContext> for CkptSaver<'_, P> {
    fn name(&self) -> String {
        "ckpt_saver".into()
    }

    fn forward(&mut self, ctx: &mut OnlineRLContext, _: &TaskHandle) -> Result<(), TaskError> {
        let prev = self.prev_iter.replace(ctx.train_iter);
        if let Some((freq, snaps)) = &mut self.snapshots
            && eval_point(ctx.train_iter, prev, *freq)
            && !snaps.contains_key(&ctx.train_iter)
        {
            // Stamped with the time now: when `best` is chosen from it, that is later.
            let snap = timed(self.policy.borrow().state_dict(), &self.clock);
            snaps.insert(ctx.train_iter, snap);
            while snaps.len() > MAX_SNAPSHOTS {
                snaps.pop_first();
            }
        }
        let Some(eval) = ctx.ext.get::<EvalOutput>().cloned() else {
            return Ok(());
        };
        let rngs = self.rngs()?;
        if self.ranks.rank() != 0 {
            return Ok(());
        }
        if eval.result.mean > self.best {
            self.best = eval.result.mean;
            let evaluated = match &mut self.snapshots {
                Some((_, snaps)) => snaps.remove(&eval.train_iter),
                None => Some(self.build()),
            };
            match evaluated {
                Some(ck) => {
                    let ck = stamp(ck, eval.env_step, eval.train_iter, P::NAME, &rngs);
                    let ck = timed(ck, &self.clock);
                    self.out.checkpoint("best", ck).map_err(task_err)?;
                }
                None => tracing::warn!(
                    "no snapshot of train iteration {} left for the best checkpoint",
                    eval.train_iter
                ),
            }
        }
        if let Some((_, snaps)) = &mut self.snapshots {
            snaps.retain(|&iter, _| iter > eval.train_iter);
        }
        let (env_step, iter) = (ctx.env_step, ctx.train_iter);
        let (policy, clock) = (self.policy, &self.clock);
        self.out
            .checkpoint_with("latest", &mut || {
                let ck = policy.borrow().state_dict();
                timed(stamp(ck, env_step, iter, P::NAME, &rngs), clock)
            })
            .map_err(task_err)
    }

    fn backward(&mut self, ctx: &mut OnlineRLContext, task: &TaskHandle) -> Result<(), TaskError> {
        if !task.finished() || self.final_saved {
            return Ok(());
        }
        self.final_saved = true;
        self.write_replay(ctx.env_step, ctx.train_iter)?;
        let rngs = self.rngs()?;
        if self.ranks.rank() == 0 {
            let ck = stamp(self.build(), ctx.env_step, ctx.train_iter, P::NAME, &rngs);
            let ck = timed(ck, &self.clock);
            self.out.checkpoint("final", ck).map_err(task_err)?;
        }
        Ok(())
    }
}

/// `ck` with the counters, algorithm and generator states a resume needs.
fn stamp(mut ck: Checkpoint, env_step: u64, iter: u64, algo: &str, rngs: &[String]) -> Checkpoint {
    ck.meta.insert("env_steps".into(), env_step.to_string());
    ck.meta.insert("train_iters".into(), iter.to_string());
    ck.meta.insert("algo".into(), algo.into());
    ck.meta.insert("world_size".into(), rngs.len().to_string());
    for (r, s) in rngs.iter().enumerate() {
        ck.meta.insert(format!("rng.{r}"), s.clone());
    }
    ck
}

/// `ck` with the training time so far ([`TrainClock`]), unless it already holds one (a
/// snapshot stamped when it was taken). Nothing when the total is unknown.
fn timed(mut ck: Checkpoint, clock: &TrainClock) -> Checkpoint {
    if let (_, Some(total)) = clock.seconds() {
        ck.meta
            .entry(TRAIN_SECONDS.into())
            .or_insert_with(|| format!("{total:.3}"));
    }
    ck
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_seconds(value: Option<&str>) -> Checkpoint {
        let mut ck = Checkpoint::default();
        if let Some(v) = value {
            ck.meta.insert(TRAIN_SECONDS.into(), v.into());
        }
        ck
    }

    /// A fresh run's total is its own time; a continued run adds its checkpoint's; a
    /// checkpoint without a valid count leaves the total unknown, and stamps nothing.
    #[test]
    fn the_clock_adds_the_time_its_checkpoint_carries() {
        let fresh = TrainClock::start(None);
        let (run, total) = fresh.seconds();
        assert_eq!(total, Some(run));

        let continued = TrainClock::start(Some(&with_seconds(Some("12.5"))));
        let (run, total) = continued.seconds();
        assert_eq!(total, Some(12.5 + run));
        let stamped = timed(Checkpoint::default(), &continued);
        let written: f64 = stamped.meta[TRAIN_SECONDS].parse().unwrap();
        assert!((12.5..13.5).contains(&written), "{written}");
        // A snapshot keeps the time it was taken at.
        assert_eq!(
            timed(with_seconds(Some("3.000")), &continued).meta[TRAIN_SECONDS],
            "3.000"
        );

        for bad in [None, Some("soon"), Some("-1"), Some("NaN"), Some("inf")] {
            let clock = TrainClock::start(Some(&with_seconds(bad)));
            assert_eq!(clock.seconds().1, None, "{bad:?}");
            assert!(
                !timed(Checkpoint::default(), &clock)
                    .meta
                    .contains_key(TRAIN_SECONDS)
            );
        }
    }
}
