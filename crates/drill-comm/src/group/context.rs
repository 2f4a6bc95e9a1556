//! [`DistContext`]: the scoped guard around the world group.

use crate::error::Result;

use super::{InitOptions, ProcessGroup};

/// DI-engine's DDPContext: initialises the world group on creation and tears it down in
/// order when dropped (goodbye to peers, store kept until every rank is done).
pub struct DistContext {
    group: ProcessGroup,
}

impl DistContext {
    /// Join the job described by the environment.
    pub fn new() -> Result<DistContext> {
        Self::with(InitOptions::default())
    }

    /// Join with explicit options.
    pub fn with(opts: InitOptions) -> Result<DistContext> {
        Ok(DistContext {
            group: ProcessGroup::init(opts)?,
        })
    }

    /// The world group.
    pub fn group(&self) -> &ProcessGroup {
        &self.group
    }
}

impl std::ops::Deref for DistContext {
    type Target = ProcessGroup;
    fn deref(&self) -> &ProcessGroup {
        &self.group
    }
}
