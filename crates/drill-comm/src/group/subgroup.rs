//! Sub-groups ([`ProcessGroup::new_group`]): their own backend over some of the ranks.

use std::sync::{Arc, Mutex};

use crate::error::{CommError, Result};

use super::{Inner, ProcessGroup};

impl ProcessGroup {
    /// A sub-group of `ranks` (ranks of this group). Every rank of this group must call it, in
    /// the same order as other `new_group` calls; ranks outside get `None`.
    pub fn new_group(&self, ranks: &[usize]) -> Result<Option<ProcessGroup>> {
        let mut sorted = ranks.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != ranks.len() || sorted.is_empty() {
            return Err(CommError::usage(
                "new_group",
                format!("ranks {ranks:?} must be non-empty and distinct"),
            ));
        }
        for &r in &sorted {
            self.check_rank("new_group", "rank", r)?;
        }
        let id = {
            let mut n = self
                .inner
                .world
                .next_id
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let id = *n;
            *n = n.wrapping_add(1);
            id
        };
        let name = format!("group{id}");
        let sub = self.sync(|b| b.new_group(&sorted, id, &name))?;
        Ok(sub.map(|b| ProcessGroup {
            inner: Arc::new(Inner {
                rank: b.rank(),
                size: b.size(),
                backend: Mutex::new(b),
                world: self.inner.world.clone(),
                name,
                global: sorted.iter().map(|&r| self.inner.global[r]).collect(),
            }),
        }))
    }
}
