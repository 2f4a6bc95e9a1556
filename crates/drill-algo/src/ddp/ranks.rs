//! [`Ranks`]: the data-parallel group as the pipeline sees it (nothing when training alone).

use drill_comm::{ProcessGroup, ReduceOp};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::TrainError;

/// The DDP process group, or none (world size 1). Every method is a collective under DDP:
/// call it on every rank at the same point.
#[derive(Clone, Default)]
pub struct Ranks(Option<ProcessGroup>);

impl Ranks {
    /// Train alone.
    pub fn alone() -> Self {
        Self(None)
    }

    /// `pg` when it has more than one rank.
    pub fn new(pg: Option<ProcessGroup>) -> Self {
        Self(pg.filter(|pg| pg.world_size() > 1))
    }

    /// The group, when data-parallel.
    pub fn group(&self) -> Option<&ProcessGroup> {
        self.0.as_ref()
    }

    /// This rank (0 alone).
    pub fn rank(&self) -> usize {
        self.0.as_ref().map_or(0, ProcessGroup::rank)
    }

    /// Ranks (1 alone).
    pub fn world(&self) -> usize {
        self.0.as_ref().map_or(1, ProcessGroup::world_size)
    }

    /// Sum `values` over ranks, in place.
    pub fn sum(&self, values: &mut [i64]) -> Result<(), TrainError> {
        if let Some(pg) = &self.0 {
            pg.all_reduce(values, ReduceOp::Sum)?;
        }
        Ok(())
    }

    /// Average `values` over ranks, in place (learner statistics before logging).
    pub fn mean(&self, values: &mut [f32]) -> Result<(), TrainError> {
        if let Some(pg) = &self.0 {
            pg.all_reduce(values, ReduceOp::Avg)?;
        }
        Ok(())
    }

    /// Rank 0's `local` decision on every rank, so control flow that runs collectives never
    /// branches differently across ranks.
    pub(crate) fn rank0_decides(&self, local: bool) -> Result<bool, TrainError> {
        let mut v = [u8::from(local)];
        if let Some(pg) = &self.0 {
            pg.broadcast(&mut v, 0)?;
        }
        Ok(v[0] == 1)
    }

    /// Whether to stop, the same on every rank: rank 0's `reached` (its limits) or an
    /// `interrupted` on any rank; and whether it was an interrupt. One collective.
    pub fn stop(&self, reached: bool, interrupted: bool) -> Result<(bool, bool), TrainError> {
        let mut v = [
            i64::from(reached && self.rank() == 0),
            i64::from(interrupted),
        ];
        if let Some(pg) = &self.0 {
            pg.all_reduce(&mut v, ReduceOp::Max)?;
        }
        Ok((v[0] == 1 || v[1] == 1, v[1] == 1))
    }

    /// Every rank's `mine`, on every rank, in rank order.
    pub fn all_gather<T: Serialize + DeserializeOwned>(
        &self,
        mine: T,
    ) -> Result<Vec<T>, TrainError> {
        Ok(match &self.0 {
            Some(pg) => pg.all_gather_object(&mine)?,
            None => vec![mine],
        })
    }

    /// Every rank's `mine`, on rank 0 (empty elsewhere).
    pub fn gather<T: Serialize + DeserializeOwned>(&self, mine: T) -> Result<Vec<T>, TrainError> {
        Ok(match &self.0 {
            Some(pg) => pg.gather_object(&mine, 0)?.unwrap_or_default(),
            None => vec![mine],
        })
    }
}
