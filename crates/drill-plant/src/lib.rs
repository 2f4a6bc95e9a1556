//! Bugs planted on purpose, for the fault campaign (`drill-cli/tests/chaos.rs`) to show that
//! its checks catch each of them: a check that no bug can fail proves nothing.
//!
//! Built with the feature `on` (`cargo test --features drill-cli/plant`), a process plants
//! the bugs named in `DRILL_PLANT` (comma-separated [`Bug::name`]s; the launcher's ranks
//! inherit it). Without the feature, which is every build a user makes, [`planted`] is a
//! constant `false` and the planted branches compile away.

/// The bugs that can be planted, each at one place in the code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bug {
    /// A restarted or resumed run starts from scratch, ignoring its checkpoints
    /// (`drill-algo/src/resume.rs`).
    RestartIgnoresCheckpoint,
    /// `drill train --resume` never starts training (`drill-algo/src/resume.rs`).
    ResumeHangs,
    /// A whole-file save writes the file in place, without the temporary file and rename
    /// (`drill-exp/src/durable.rs`).
    CheckpointInPlace,
    /// The shared-memory segments of a rank's links are never removed
    /// (`drill-comm/src/backend/embedded/connect.rs`).
    LeakedShm,
    /// Rank 1 of a data-parallel job exits with status 0 after 1.5 s of training
    /// (`drill-algo/src/runner.rs`).
    RankExitsEarly,
    /// Errors about a lost peer say "a peer", not which rank or node (the launcher's
    /// message, drill-comm's error, the split run's router).
    ErrorNamesNoRank,
}

impl Bug {
    /// Every bug, in the order the campaign plants them.
    pub const ALL: [Bug; 6] = [
        Bug::RestartIgnoresCheckpoint,
        Bug::ResumeHangs,
        Bug::CheckpointInPlace,
        Bug::LeakedShm,
        Bug::RankExitsEarly,
        Bug::ErrorNamesNoRank,
    ];

    /// The name `DRILL_PLANT` takes.
    pub const fn name(self) -> &'static str {
        match self {
            Bug::RestartIgnoresCheckpoint => "restart_ignores_checkpoint",
            Bug::ResumeHangs => "resume_hangs",
            Bug::CheckpointInPlace => "checkpoint_in_place",
            Bug::LeakedShm => "leaked_shm",
            Bug::RankExitsEarly => "rank_exits_early",
            Bug::ErrorNamesNoRank => "error_names_no_rank",
        }
    }
}

/// Whether `bug` is planted in this process.
#[cfg(feature = "on")]
pub fn planted(bug: Bug) -> bool {
    std::env::var("DRILL_PLANT").is_ok_and(|v| v.split(',').any(|b| b.trim() == bug.name()))
}

/// Whether `bug` is planted in this process: never, in a build without the feature `on`.
#[cfg(not(feature = "on"))]
#[inline(always)]
pub const fn planted(_bug: Bug) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_distinct() {
        let mut names: Vec<_> = Bug::ALL.iter().map(|b| b.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Bug::ALL.len());
    }

    #[cfg(not(feature = "on"))]
    #[test]
    fn nothing_is_planted_without_the_feature() {
        // SAFETY: set_var races only with threads reading the environment; the one other
        // test of this binary reads none.
        unsafe { std::env::set_var("DRILL_PLANT", "leaked_shm") };
        assert!(Bug::ALL.iter().all(|b| !planted(*b)));
    }
}
