//! MPI backend (feature `mpi`): rsmpi on the system's OpenMPI. Ranks come from mpirun/srun;
//! MPI cannot join a foreign rendezvous, so no store is used. f16/bf16 reductions are
//! computed in f32 (MPI has no half types); data movement of any dtype goes as bytes.

use std::sync::Arc;

use mpi::Threading;
use mpi::collective::SystemOperation;
use mpi::datatype::Equivalence;
use mpi::environment::Universe;
use mpi::topology::{Color, Communicator, SimpleCommunicator};
use mpi::traits::*;

use super::Backend;
use crate::dtype::{DType, Element, ReduceOp};
use crate::error::{CommError, Result};
use half::{bf16, f16};

/// A communicator with the universe kept alive (MPI_Finalize runs when the last one drops).
pub struct Mpi {
    comm: SimpleCommunicator,
    _universe: Arc<Universe>,
    local_rank: usize,
    local_size: usize,
}

// SAFETY: MPI is initialised with MPI_THREAD_SERIALIZED and drill-comm's executor runs one operation
// at a time per process, so moving the communicator between threads is allowed.
unsafe impl Send for Mpi {}

fn op_of(op: ReduceOp) -> SystemOperation {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => SystemOperation::sum(),
        ReduceOp::Prod => SystemOperation::product(),
        ReduceOp::Min => SystemOperation::min(),
        ReduceOp::Max => SystemOperation::max(),
    }
}

impl Mpi {
    /// Initialise MPI (once per process) and take MPI_COMM_WORLD.
    pub fn init() -> Result<Mpi> {
        // Open MPI built against an external PMIx (Debian's) cannot start under Slurm's PMI-2
        // and aborts inside MPI_Init: say so before, with the flag that works.
        if std::env::var("SLURM_MPI_TYPE").is_ok_and(|t| t == "pmi2") {
            let lib = mpi::environment::library_version().unwrap_or_default();
            if lib.contains("Open MPI") {
                return Err(CommError::Backend {
                    backend: "mpi",
                    detail: format!(
                        "started by `srun --mpi=pmi2`, but this build's MPI ({}) reaches Slurm through PMIx only: use `srun --mpi=pmix` (or DRILL_BACKEND=tcp for the embedded backend)",
                        lib.split(',').next().unwrap_or("Open MPI").trim()
                    ),
                });
            }
        }
        let (universe, level) =
            mpi::initialize_with_threading(Threading::Serialized).ok_or_else(|| {
                CommError::Backend {
                    backend: "mpi",
                    detail: "MPI was already initialised in this process".into(),
                }
            })?;
        if level < Threading::Serialized {
            return Err(CommError::Backend {
                backend: "mpi",
                detail: format!(
                    "the MPI library offers only {level:?} threading; drill needs Serialized"
                ),
            });
        }
        let comm = universe.world();
        let node = comm.split_shared(0);
        Ok(Mpi {
            local_rank: node.rank() as usize,
            local_size: node.size() as usize,
            comm,
            _universe: Arc::new(universe),
        })
    }

    /// Rank on this node.
    pub fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// Ranks on this node.
    pub fn local_size(&self) -> usize {
        self.local_size
    }

    fn reduce_typed<T: Element + Equivalence>(
        &self,
        buf: &mut [u8],
        op: ReduceOp,
        root: Option<usize>,
    ) {
        let x: &mut [T] = bytemuck::cast_slice_mut(buf);
        let send = x.to_vec();
        let n = self.comm.size() as usize;
        match root {
            None => {
                self.comm.all_reduce_into(&send[..], x, op_of(op));
                if op == ReduceOp::Avg {
                    T::div(x, n);
                }
            }
            Some(r) => {
                let p = self.comm.process_at_rank(r as i32);
                if self.comm.rank() as usize == r {
                    p.reduce_into_root(&send[..], x, op_of(op));
                    if op == ReduceOp::Avg {
                        T::div(x, n);
                    }
                } else {
                    p.reduce_into(&send[..], op_of(op));
                }
            }
        }
    }

    fn reduce_half<H: Element>(
        &self,
        buf: &mut [u8],
        op: ReduceOp,
        root: Option<usize>,
        to: fn(H) -> f32,
        from: fn(f32) -> H,
    ) {
        let h: &mut [H] = bytemuck::cast_slice_mut(buf);
        let mut f: Vec<f32> = h.iter().map(|&v| to(v)).collect();
        self.reduce_typed::<f32>(bytemuck::cast_slice_mut(&mut f), op, root);
        if root.is_none_or(|r| r == self.comm.rank() as usize) {
            h.iter_mut().zip(&f).for_each(|(d, &s)| *d = from(s));
        }
    }

    fn reduce_any(&self, buf: &mut [u8], dtype: DType, op: ReduceOp, root: Option<usize>) {
        // Empty Rust slices share one dangling address, which MPI rejects as aliased buffers;
        // every rank has the same (zero) size, so there is nothing to do.
        if buf.is_empty() {
            return;
        }
        match dtype {
            DType::F32 => self.reduce_typed::<f32>(buf, op, root),
            DType::F64 => self.reduce_typed::<f64>(buf, op, root),
            DType::I32 => self.reduce_typed::<i32>(buf, op, root),
            DType::I64 => self.reduce_typed::<i64>(buf, op, root),
            DType::U8 => self.reduce_typed::<u8>(buf, op, root),
            DType::F16 => self.reduce_half::<f16>(buf, op, root, f16::to_f32, f16::from_f32),
            DType::BF16 => self.reduce_half::<bf16>(buf, op, root, bf16::to_f32, bf16::from_f32),
        }
    }
}

impl Backend for Mpi {
    fn name(&self) -> &'static str {
        "mpi"
    }

    fn rank(&self) -> usize {
        self.comm.rank() as usize
    }

    fn size(&self) -> usize {
        self.comm.size() as usize
    }

    fn broadcast(&mut self, buf: &mut [u8], root: usize) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        self.comm.process_at_rank(root as i32).broadcast_into(buf);
        Ok(())
    }

    fn all_reduce(&mut self, buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
        self.reduce_any(buf, dtype, op, None);
        Ok(())
    }

    fn reduce(&mut self, buf: &mut [u8], dtype: DType, op: ReduceOp, root: usize) -> Result<()> {
        self.reduce_any(buf, dtype, op, Some(root));
        Ok(())
    }

    fn all_gather(&mut self, send: &[u8], recv: &mut [u8]) -> Result<()> {
        if send.is_empty() {
            return Ok(());
        }
        self.comm.all_gather_into(send, recv);
        Ok(())
    }

    fn gather(&mut self, send: &[u8], recv: &mut [u8], root: usize) -> Result<()> {
        if send.is_empty() {
            return Ok(());
        }
        let p = self.comm.process_at_rank(root as i32);
        if self.rank() == root {
            p.gather_into_root(send, recv);
        } else {
            p.gather_into(send);
        }
        Ok(())
    }

    fn scatter(&mut self, send: &[u8], recv: &mut [u8], root: usize) -> Result<()> {
        if recv.is_empty() {
            return Ok(());
        }
        let p = self.comm.process_at_rank(root as i32);
        if self.rank() == root {
            p.scatter_into_root(send, recv);
        } else {
            p.scatter_into(recv);
        }
        Ok(())
    }

    fn reduce_scatter(
        &mut self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        if recv.is_empty() {
            return Ok(());
        }
        // Reduce the whole buffer (in an aligned copy), keep our block: correct for every dtype.
        let mut aligned = vec![0u64; send.len().div_ceil(8)];
        let all = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut aligned)[..send.len()];
        all.copy_from_slice(send);
        self.reduce_any(all, dtype, op, None);
        let r = self.rank();
        recv.copy_from_slice(&all[r * recv.len()..(r + 1) * recv.len()]);
        Ok(())
    }

    fn barrier(&mut self) -> Result<()> {
        self.comm.barrier();
        Ok(())
    }

    fn send(&mut self, buf: &[u8], dst: usize, tag: u32) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        self.comm
            .process_at_rank(dst as i32)
            .send_with_tag(buf, tag as i32);
        Ok(())
    }

    fn recv(&mut self, buf: &mut [u8], src: usize, tag: u32) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let status = self
            .comm
            .process_at_rank(src as i32)
            .receive_into_with_tag(buf, tag as i32);
        let got = status.count(u8::equivalent_datatype()) as usize;
        if got != buf.len() {
            return Err(CommError::Protocol {
                op: "recv".into(),
                group: "mpi".into(),
                rank: src,
                detail: format!("{got} bytes where {} were expected", buf.len()),
            });
        }
        Ok(())
    }

    fn new_group(
        &mut self,
        ranks: &[usize],
        _id: u16,
        _name: &str,
    ) -> Result<Option<Box<dyn Backend>>> {
        let member = ranks.contains(&self.rank());
        let color = if member {
            Color::with_value(0)
        } else {
            Color::undefined()
        };
        Ok(self.comm.split_by_color(color).map(|comm| {
            Box::new(Mpi {
                comm,
                _universe: self._universe.clone(),
                local_rank: self.local_rank,
                local_size: self.local_size,
            }) as Box<dyn Backend>
        }))
    }
}
