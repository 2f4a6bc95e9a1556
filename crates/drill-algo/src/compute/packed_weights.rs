//! Packings of large dense-layer weights that are read again unchanged: the acting copy's (a
//! `pong_ppo` rollout runs 128 forward passes of a batch of 8 through the same 3136 x 512
//! weight), a DQN target net's. A product of a few rows through such a weight reads all of
//! it from memory on every call (a product of few rows):
//! - in f32 it copies each depth step of the weight into a buffer first (rows 2 KB apart,
//!   read in place, fall into a few cache sets); kept as contiguous panels
//!   (`gemm::panels`), the weight streams straight into the product, same bits;
//! - in bf16 precision the product stays in f32, because packing the weight for every call
//!   costs what bf16 saves; packed once and kept, each call streams half the bytes in bf16.
//!
//! A weight is known by its storage: burn-flex tensors share an `Arc` of bytes and copy it
//! before any write while it is shared, so bytes this cache holds a reference to can neither
//! change nor be freed and reused. A weight is packed the third time it is seen: a training
//! net's weight, new after every update, is seen once or twice (double DQN's two forward
//! passes) and never packed. A weight that only the cache still holds is dropped, and the
//! least recently used of [`ENTRIES`] for a new one.

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::Bytes;
use drill_kernels::dense::{self, Packing};
use drill_kernels::precision::{self, Level};
use std::sync::{Arc, Mutex};

/// Weights remembered at once: a collector's and an evaluator's acting copies, a target net,
/// with room for one more.
pub(crate) const ENTRIES: usize = 4;

/// Sights of a weight after which it is packed.
const PACK_AT: u32 = 3;

/// One weight seen: its storage and view, the precision it was seen in (`None`: f32), its
/// sights, and its packing once it has one.
struct Entry {
    data: Arc<Bytes>,
    layout: Layout,
    precision: Option<Level>,
    seen: u32,
    packed: Option<Arc<Packing>>,
    used: u64,
}

/// The remembered weights and a clock for their last use.
static CACHE: Mutex<(Vec<Entry>, u64)> = Mutex::new((Vec::new(), 0));

/// For a dense layer over `m` rows whose product reads its weight once a call (a few rows
/// through a weight larger than L2: [`dense::reads_weight_once`]), the kept packing of
/// `weight` (its `values`, `k x n`) for this process's precision: the kept one, or a new one
/// at the weight's third sight (`PACK_AT`). `None` for other layers and before that. The packing
/// runs outside the lock, on the rayon pool (a caller outside the pool that held the lock
/// could otherwise wait on workers waiting on the lock).
pub(crate) fn packed(
    weight: &FlexTensor,
    values: &[f32],
    (m, k, n): (usize, usize, usize),
) -> Option<Arc<Packing>> {
    if !dense::reads_weight_once(m, k, n) {
        return None;
    }
    let precision = precision::enabled().then(Level::current);
    let data = weight.data_arc();
    let same = |e: &Entry| {
        Arc::ptr_eq(&e.data, &data) && e.layout == *weight.layout() && e.precision == precision
    };
    {
        let mut guard = CACHE.lock().unwrap_or_else(|e| e.into_inner());
        let (entries, clock) = &mut *guard;
        *clock += 1;
        let now = *clock;
        entries.retain(|e| Arc::strong_count(&e.data) > 1);
        match entries.iter_mut().find(|e| same(e)) {
            Some(e) => {
                e.used = now;
                e.seen += 1;
                if let Some(p) = &e.packed {
                    return Some(p.clone());
                }
                if e.seen < PACK_AT {
                    return None;
                }
            }
            None => {
                if entries.len() == ENTRIES {
                    let oldest = (0..entries.len())
                        .min_by_key(|&i| entries[i].used)
                        .expect("ENTRIES > 0");
                    entries.swap_remove(oldest);
                }
                entries.push(Entry {
                    data: data.clone(),
                    layout: weight.layout().clone(),
                    precision,
                    seen: 1,
                    packed: None,
                    used: now,
                });
                return None;
            }
        }
    }
    let packed = Arc::new(Packing::new(values, (k, n), precision));
    let mut guard = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(e) = guard.0.iter_mut().find(|e| same(e)) {
        e.packed.get_or_insert_with(|| packed.clone());
    }
    Some(packed)
}
