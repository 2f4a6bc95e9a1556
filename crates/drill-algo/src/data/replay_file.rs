//! A [`ReplayBuffer`] saved with the final checkpoint (`drill train --save-replay`) and
//! restored on resume, so an off-policy run goes on without a cold buffer. One safetensors
//! file per rank (`ckpt/replay_rank{R}.safetensors`, [`path_for`]) holding the arrays as
//! stored: `u8` frames once each with their ids, `u8`/`f32` observations, actions, rewards,
//! flags and priorities; its metadata names the checkpoint it belongs to ([`Stamp`]).
//! Written to a temporary file and renamed; read through a memory map, so a restore holds no
//! second copy of a large buffer.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use drill_env::{Action, ActionBuf, Dtype, Obs, ObsBuf};
use drill_exp::{Checkpoint, CheckpointError};
use safetensors::SafeTensors;
use safetensors::tensor::{Dtype as StDtype, TensorView};

use super::frame_store::FrameStore;
use super::replay::{ObsStore, Priorities, ReplayBuffer};
use super::{SumTree, Transition};

/// The `format` metadata entry of a replay file.
const FORMAT: &str = "drill-replay-1";

/// Rank `rank`'s replay file in the checkpoint folder `ckpt_dir`.
pub fn path_for(ckpt_dir: &Path, rank: usize) -> PathBuf {
    ckpt_dir.join(format!("replay_rank{rank}.safetensors"))
}

/// Which checkpoint a saved buffer belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// Env steps of the run when saved.
    pub env_steps: u64,
    /// Train iterations when saved.
    pub train_iters: u64,
    /// Ranks of the run (each saves its own buffer).
    pub world_size: usize,
}

fn bytes_f32(v: &[f32]) -> &[u8] {
    bytemuck::cast_slice(v)
}

/// One named array of the file.
fn view<'a>(
    path: &Path,
    name: &str,
    dtype: StDtype,
    shape: Vec<usize>,
    data: &'a [u8],
) -> Result<(String, TensorView<'a>), CheckpointError> {
    let v = TensorView::new(dtype, shape, data).map_err(|e| CheckpointError::Format {
        path: path.to_path_buf(),
        message: format!("{name}: {e}"),
    })?;
    Ok((name.to_string(), v))
}

/// The replay file at `path` mapped into memory, and its metadata.
fn open(path: &Path) -> Result<(memmap2::Mmap, HashMap<String, String>), CheckpointError> {
    let file = std::fs::File::open(path).map_err(|source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    // SAFETY: the file is in this run's own checkpoint folder and is only read here;
    // nothing truncates it while it is mapped.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let (_, header) = SafeTensors::read_metadata(&map).map_err(|e| CheckpointError::Format {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let meta = header.metadata().clone().unwrap_or_default();
    Ok((map, meta))
}

/// The stamp in a replay file's metadata.
fn stamp(path: &Path, meta: &HashMap<String, String>) -> Result<Stamp, CheckpointError> {
    let num = |key: &str| -> Result<u64, CheckpointError> {
        meta.get(key)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| CheckpointError::Mismatch {
                path: path.to_path_buf(),
                message: format!("not a replay file: no numeric metadata {key}"),
            })
    };
    Ok(Stamp {
        env_steps: num("env_steps")?,
        train_iters: num("train_iters")?,
        world_size: num("world_size")? as usize,
    })
}

/// The stamp of the replay file at `path` (only its header is read).
pub(crate) fn stamp_of(path: &Path) -> Result<Stamp, CheckpointError> {
    stamp(path, &open(path)?.1)
}

/// A mapped replay file being read: its arrays and metadata, each checked as it is taken.
struct Reader<'a> {
    path: &'a Path,
    st: SafeTensors<'a>,
    meta: &'a HashMap<String, String>,
}

impl<'a> Reader<'a> {
    fn new(
        path: &'a Path,
        map: &'a [u8],
        meta: &'a HashMap<String, String>,
    ) -> Result<Self, CheckpointError> {
        let st = SafeTensors::deserialize(map).map_err(|e| CheckpointError::Format {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        Ok(Reader { path, st, meta })
    }

    /// The file does not hold what this run needs: `message` says what.
    fn mismatch(&self, message: String) -> CheckpointError {
        CheckpointError::Mismatch {
            path: self.path.to_path_buf(),
            message,
        }
    }

    /// A metadata entry.
    fn get(&self, key: &str) -> Result<&'a str, CheckpointError> {
        self.meta
            .get(key)
            .map(String::as_str)
            .ok_or_else(|| self.mismatch(format!("not a replay file: no metadata {key}")))
    }

    /// A numeric metadata entry.
    fn num(&self, key: &str) -> Result<usize, CheckpointError> {
        self.get(key)?
            .parse()
            .map_err(|_| self.mismatch(format!("metadata {key} is not a number")))
    }

    /// The bytes of array `name`, which must be `dtype` and `shape`.
    fn tensor(
        &self,
        name: &str,
        dtype: StDtype,
        shape: &[usize],
    ) -> Result<&'a [u8], CheckpointError> {
        let view = self
            .st
            .tensor(name)
            .map_err(|_| self.mismatch(format!("missing tensor {name}")))?;
        if view.dtype() != dtype || view.shape() != shape {
            return Err(self.mismatch(format!(
                "tensor {name} is {:?} {:?}, expected {dtype:?} {shape:?}",
                view.dtype(),
                view.shape()
            )));
        }
        Ok(view.data())
    }

    /// Array `name` of `f32`s, which must be `shape`.
    fn f32s(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, CheckpointError> {
        Ok(bytemuck::pod_collect_to_vec(self.tensor(
            name,
            StDtype::F32,
            shape,
        )?))
    }
}

impl ReplayBuffer {
    /// Write the buffer to `path` (a temporary file, then renamed) stamped with `stamp`;
    /// returns the file's size in bytes.
    pub fn save(&self, path: &Path, stamp: Stamp) -> Result<u64, CheckpointError> {
        let (len, d) = (self.len, self.obs_dim);
        let mut meta: BTreeMap<&str, String> = BTreeMap::new();
        meta.insert("format", FORMAT.into());
        meta.insert("capacity", self.capacity.to_string());
        meta.insert("len", len.to_string());
        meta.insert("next", self.next.to_string());
        meta.insert("obs_dim", d.to_string());
        meta.insert("obs_dtype", format!("{:?}", self.dtype));
        meta.insert("env_steps", stamp.env_steps.to_string());
        meta.insert("train_iters", stamp.train_iters.to_string());
        meta.insert("world_size", stamp.world_size.to_string());
        let leaves: Vec<f64>;
        let mut views: Vec<(String, TensorView<'_>)> = Vec::new();
        match &self.store {
            ObsStore::Rows { obs, next_obs } => {
                for (name, buf) in [("obs", obs), ("next_obs", next_obs)] {
                    match buf {
                        ObsBuf::F32(v) => views.push(view(
                            path,
                            name,
                            StDtype::F32,
                            vec![len, d],
                            bytes_f32(&v[..len * d]),
                        )?),
                        ObsBuf::U8(v) => {
                            views.push(view(path, name, StDtype::U8, vec![len, d], &v[..len * d])?)
                        }
                    }
                }
            }
            ObsStore::Frames { frames, k, ids } => {
                let (data, refs) = frames.parts();
                let frame = d / k;
                meta.insert("stack", k.to_string());
                views.push(view(
                    path,
                    "frames",
                    StDtype::U8,
                    vec![refs.len(), frame],
                    data,
                )?);
                views.push(view(
                    path,
                    "frame_refs",
                    StDtype::U32,
                    vec![refs.len()],
                    bytemuck::cast_slice(refs),
                )?);
                views.push(view(
                    path,
                    "frame_ids",
                    StDtype::U32,
                    vec![len, 2 * k],
                    bytemuck::cast_slice(&ids[..len * 2 * k]),
                )?);
            }
        }
        match &self.actions {
            ActionBuf::Discrete(a) => views.push(view(
                path,
                "actions",
                StDtype::U32,
                vec![len],
                bytemuck::cast_slice(&a[..len]),
            )?),
            ActionBuf::Continuous { dim, values } => views.push(view(
                path,
                "actions",
                StDtype::F32,
                vec![len, *dim],
                bytes_f32(&values[..len * dim]),
            )?),
        }
        views.push(view(
            path,
            "rewards",
            StDtype::F32,
            vec![len],
            bytes_f32(&self.rewards[..len]),
        )?);
        views.push(view(
            path,
            "dones",
            StDtype::F32,
            vec![len],
            bytes_f32(&self.dones[..len]),
        )?);
        views.push(view(
            path,
            "discounts",
            StDtype::F32,
            vec![len],
            bytes_f32(&self.discounts[..len]),
        )?);
        if let Some(p) = &self.priorities {
            meta.insert("priority_alpha", p.alpha.to_string());
            meta.insert("priority_max", p.max.to_string());
            leaves = (0..len).map(|i| p.tree.get(i)).collect();
            views.push(view(
                path,
                "priorities",
                StDtype::F64,
                vec![len],
                bytemuck::cast_slice(&leaves),
            )?);
        }
        let meta: HashMap<String, String> =
            meta.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        let io = |source| CheckpointError::Io {
            path: path.to_path_buf(),
            source,
        };
        let size: u64 = views.iter().map(|(_, v)| v.data().len() as u64).sum();
        drill_exp::durable::write_atomic_with(path, size, |tmp| {
            safetensors::serialize_to_file(views, Some(meta), tmp).map_err(|e| match e {
                safetensors::SafeTensorError::IoError(source) => source,
                e => std::io::Error::other(format!("not serialisable: {e}")),
            })
        })
        .map_err(io)?;
        Ok(std::fs::metadata(path).map_err(io)?.len())
    }

    /// Replace the contents with the buffer saved at `path` and return its stamp. The file
    /// must hold the same kind of observations and actions; with another capacity the newest
    /// transitions that fit are kept (their priorities start at the maximum, as new ones do).
    pub fn restore(&mut self, path: &Path) -> Result<Stamp, CheckpointError> {
        let (map, meta) = open(path)?;
        let r = Reader::new(path, &map, &meta)?;
        if r.get("format")? != FORMAT {
            return Err(r.mismatch(format!(
                "replay file format {:?}, this drill reads {FORMAT:?}",
                r.get("format")?
            )));
        }
        let stamp = stamp(path, &meta)?;
        let (capacity, len, next) = self.check_sizes(&r)?;
        let mut saved = ReplayBuffer {
            capacity,
            obs_dim: self.obs_dim,
            dtype: self.dtype,
            len,
            next,
            store: self.read_store(&r, len, capacity)?,
            actions: match &self.actions {
                ActionBuf::Discrete(_) => ActionBuf::Discrete(bytemuck::pod_collect_to_vec(
                    r.tensor("actions", StDtype::U32, &[len])?,
                )),
                ActionBuf::Continuous { dim, .. } => ActionBuf::Continuous {
                    dim: *dim,
                    values: r.f32s("actions", &[len, *dim])?,
                },
            },
            rewards: r.f32s("rewards", &[len])?,
            dones: r.f32s("dones", &[len])?,
            discounts: r.f32s("discounts", &[len])?,
            priorities: None,
        };
        saved.priorities = self.read_priorities(&r, len, capacity)?;
        match &mut saved.actions {
            ActionBuf::Discrete(a) => a.resize(capacity, 0),
            ActionBuf::Continuous { dim, values } => values.resize(capacity * *dim, 0.0),
        }
        for v in [&mut saved.rewards, &mut saved.dones, &mut saved.discounts] {
            v.resize(capacity, 0.0);
        }
        if capacity == self.capacity {
            *self = saved;
        } else {
            tracing::info!(
                "{}: saved with capacity {capacity}, this run's is {}; keeping the newest {} transitions",
                path.display(),
                self.capacity,
                len.min(self.capacity)
            );
            self.take_newest(&saved);
        }
        Ok(stamp)
    }

    /// The file's observations checked against this buffer's; its capacity, length and next
    /// slot, checked to fit one another.
    fn check_sizes(&self, r: &Reader<'_>) -> Result<(usize, usize, usize), CheckpointError> {
        let (capacity, len, next) = (r.num("capacity")?, r.num("len")?, r.num("next")?);
        let dtype = format!("{:?}", self.dtype);
        let stack = self.stack();
        let saved_stack = r.meta.get("stack").map(|s| s.parse().unwrap_or(0));
        if r.num("obs_dim")? != self.obs_dim || r.get("obs_dtype")? != dtype || saved_stack != stack
        {
            return Err(r.mismatch(format!(
                "holds {} observations of {} values{}, this run's env gives {dtype} observations of {}{}",
                r.get("obs_dtype")?,
                r.num("obs_dim")?,
                saved_stack.map_or(String::new(), |k| format!(" in stacks of {k}")),
                self.obs_dim,
                stack.map_or(String::new(), |k| format!(" in stacks of {k}")),
            )));
        }
        if len > capacity || next >= capacity.max(1) {
            return Err(r.mismatch(format!(
                "len {len} / next {next} do not fit capacity {capacity}"
            )));
        }
        Ok((capacity, len, next))
    }

    /// Frames per stacked observation (`None`: observations stored as rows).
    fn stack(&self) -> Option<usize> {
        match &self.store {
            ObsStore::Rows { .. } => None,
            ObsStore::Frames { k, .. } => Some(*k),
        }
    }

    /// The saved observations, grown to `capacity`: rows, or frames with their ids.
    fn read_store(
        &self,
        r: &Reader<'_>,
        len: usize,
        capacity: usize,
    ) -> Result<ObsStore, CheckpointError> {
        let d = self.obs_dim;
        let Some(k) = self.stack() else {
            let rows = |name: &str| -> Result<ObsBuf, CheckpointError> {
                let mut buf = match self.dtype {
                    Dtype::F32 => ObsBuf::F32(r.f32s(name, &[len, d])?),
                    Dtype::U8 => ObsBuf::U8(r.tensor(name, StDtype::U8, &[len, d])?.to_vec()),
                };
                buf.resize(capacity * d);
                Ok(buf)
            };
            return Ok(ObsStore::Rows {
                obs: rows("obs")?,
                next_obs: rows("next_obs")?,
            });
        };
        let frame = d / k;
        let slots =
            r.st.tensor("frame_refs")
                .map_err(|_| r.mismatch("missing tensor frame_refs".into()))?
                .shape()
                .first()
                .copied()
                .unwrap_or(0);
        let refs: Vec<u32> =
            bytemuck::pod_collect_to_vec(r.tensor("frame_refs", StDtype::U32, &[slots])?);
        let data = r.tensor("frames", StDtype::U8, &[slots, frame])?.to_vec();
        let mut ids: Vec<u32> =
            bytemuck::pod_collect_to_vec(r.tensor("frame_ids", StDtype::U32, &[len, 2 * k])?);
        if ids.iter().any(|&id| id as usize >= slots) {
            return Err(r.mismatch("a frame id points past the stored frames".into()));
        }
        ids.resize(capacity * 2 * k, 0);
        Ok(ObsStore::Frames {
            frames: FrameStore::from_parts(frame, data, refs),
            k,
            ids,
        })
    }

    /// With prioritized replay: the saved priorities (a file saved from uniform replay gives
    /// every transition the top priority).
    fn read_priorities(
        &self,
        r: &Reader<'_>,
        len: usize,
        capacity: usize,
    ) -> Result<Option<Priorities>, CheckpointError> {
        let Some(p) = &self.priorities else {
            return Ok(None);
        };
        let mut tree = SumTree::new(capacity);
        let mut max = p.max;
        if r.st.tensor("priorities").is_ok() {
            let leaves: Vec<f64> =
                bytemuck::pod_collect_to_vec(r.tensor("priorities", StDtype::F64, &[len])?);
            for (i, &l) in leaves.iter().enumerate() {
                tree.set(i, l);
            }
            max = r
                .meta
                .get("priority_max")
                .and_then(|m| m.parse().ok())
                .unwrap_or(max);
        } else {
            for i in 0..len {
                tree.set(i, max.powf(p.alpha));
            }
        }
        Ok(Some(Priorities {
            tree,
            alpha: p.alpha,
            max,
        }))
    }

    /// The replay buffer `[policy.other.replay_buffer]` (`rb`) asks for, for these spaces; on
    /// resume, rank `rank`'s buffer saved beside
    /// the checkpoint with it (`--save-replay`) is restored.
    pub fn from_config(
        rb: &drill_config::ReplayBufferConfig,
        spec: &drill_env::EnvSpec,
        resume: Option<&Checkpoint>,
        rank: usize,
        world: usize,
    ) -> Result<ReplayBuffer, crate::error::TrainError> {
        let (size, obs, actions) = (rb.replay_buffer_size, &spec.obs, &spec.action_space);
        let mut buffer = if rb.priority {
            ReplayBuffer::prioritized(size, obs, actions, rb.priority_alpha)
        } else {
            ReplayBuffer::new(size, obs, actions)
        };
        if let Some(ck) = resume {
            buffer.resume_from(ck, rank, world)?;
        }
        Ok(buffer)
    }

    /// On resume from `ck`: restore rank `rank`'s buffer saved beside it with the same
    /// counters and world size (said in the log); a missing or older file leaves the buffer
    /// empty, with a warning for an older one.
    pub(crate) fn resume_from(
        &mut self,
        ck: &Checkpoint,
        rank: usize,
        world_size: usize,
    ) -> Result<(), CheckpointError> {
        let Some(dir) = ck.path.parent() else {
            return Ok(());
        };
        let path = path_for(dir, rank);
        if !path.is_file() {
            return Ok(());
        }
        let want = Stamp {
            env_steps: ck.counter("env_steps")?,
            train_iters: ck.counter("train_iters")?,
            world_size,
        };
        let have = stamp_of(&path)?;
        if have != want {
            tracing::warn!(
                "{} was saved at train iteration {} (env step {}, {} rank(s)), but this run resumes from {} at train iteration {} (env step {}, {} rank(s)): starting with an empty replay buffer",
                path.display(),
                have.train_iters,
                have.env_steps,
                have.world_size,
                ck.path.display(),
                want.train_iters,
                want.env_steps,
                want.world_size
            );
            return Ok(());
        }
        let t = std::time::Instant::now();
        self.restore(&path)?;
        tracing::info!(
            "replay buffer restored: {} transitions from {} in {:.2} s",
            self.len,
            path.display(),
            t.elapsed().as_secs_f64()
        );
        Ok(())
    }

    /// Push `other`'s transitions, oldest first, keeping the newest that fit.
    fn take_newest(&mut self, other: &ReplayBuffer) {
        let order: Vec<usize> = if other.len < other.capacity {
            (0..other.len).collect()
        } else {
            (other.next..other.capacity).chain(0..other.next).collect()
        };
        let skip = order.len().saturating_sub(self.capacity);
        let d = other.obs_dim;
        let (mut o, mut n) = (ObsBuf::new(other.dtype), ObsBuf::new(other.dtype));
        for &i in &order[skip..] {
            o.clear();
            n.clear();
            match &other.store {
                ObsStore::Rows { obs, next_obs } => {
                    o.extend(obs.as_obs().rows(i..i + 1, d));
                    n.extend(next_obs.as_obs().rows(i..i + 1, d));
                }
                ObsStore::Frames { frames, k, ids } => {
                    let (ObsBuf::U8(ov), ObsBuf::U8(nv)) = (&mut o, &mut n) else {
                        unreachable!("frame buffers hold u8 observations");
                    };
                    let slot = &ids[i * 2 * k..(i + 1) * 2 * k];
                    frames.extend_stack(&slot[..*k], ov);
                    frames.extend_stack(&slot[*k..], nv);
                }
            }
            let (obs, next_obs): (Obs<'_>, Obs<'_>) = (o.as_obs(), n.as_obs());
            let action: Action<'_> = other.actions.get(i);
            self.push(&Transition {
                obs,
                action,
                reward: other.rewards[i],
                next_obs,
                done: other.dones[i] != 0.0,
                discount: other.discounts[i],
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Batch;
    use drill_env::{ActionSpace, ObsSpace};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn push_vectors(b: &mut ReplayBuffer, n: usize) {
        for v in 0..n {
            let (o, x) = ([v as f32, -(v as f32)], [v as f32 + 1.0, 0.5]);
            b.push(&Transition {
                obs: Obs::F32(&o),
                action: Action::Discrete(v % 3),
                reward: v as f32,
                next_obs: Obs::F32(&x),
                done: v % 7 == 0,
                discount: 0.99,
            });
        }
    }

    fn same_samples(a: &ReplayBuffer, b: &ReplayBuffer) {
        let (mut x, mut y) = (Batch::default(), Batch::default());
        let (mut r1, mut r2) = (ChaCha8Rng::seed_from_u64(5), ChaCha8Rng::seed_from_u64(5));
        for _ in 0..10 {
            a.sample(32, 0.4, &mut r1, &mut x);
            b.sample(32, 0.4, &mut r2, &mut y);
            assert_eq!(x.indices, y.indices);
            assert_eq!(x.obs, y.obs);
            assert_eq!(x.next_obs, y.next_obs);
            assert_eq!(x.actions, y.actions);
            assert_eq!(x.rewards, y.rewards);
            assert_eq!(x.dones, y.dones);
            assert_eq!(x.discounts, y.discounts);
            assert_eq!(x.weights, y.weights);
        }
    }

    const STAMP: Stamp = Stamp {
        env_steps: 1234,
        train_iters: 56,
        world_size: 1,
    };

    #[test]
    fn a_prioritized_vector_buffer_comes_back_exactly_with_its_ring_position() {
        let dir = tempfile::tempdir().unwrap();
        let (obs, act) = (ObsSpace::vector(2), ActionSpace::Discrete(3));
        let mut a = ReplayBuffer::prioritized(50, &obs, &act, 0.6);
        push_vectors(&mut a, 73);
        let idx: Vec<usize> = (0..50).collect();
        let td: Vec<f32> = (0..50).map(|i| (i % 9) as f32 * 0.3).collect();
        a.update_priorities(&idx, &td);
        let path = path_for(dir.path(), 0);
        let bytes = a.save(&path, STAMP).unwrap();
        assert!(bytes > 50 * 4 * 4, "{bytes} bytes");
        assert_eq!(stamp_of(&path).unwrap(), STAMP);
        let mut b = ReplayBuffer::prioritized(50, &obs, &act, 0.6);
        assert_eq!(b.restore(&path).unwrap(), STAMP);
        assert_eq!((b.len, b.next), (50, 23));
        same_samples(&a, &b);
        // Both go on alike: the next push overwrites the same (oldest) slot.
        push_vectors(&mut a, 5);
        push_vectors(&mut b, 5);
        same_samples(&a, &b);
    }

    #[test]
    fn frame_buffers_keep_each_frame_once_and_sample_the_same_stacks() {
        let dir = tempfile::tempdir().unwrap();
        let space = ObsSpace {
            shape: vec![4, 10, 10],
            dtype: Dtype::U8,
        };
        let act = ActionSpace::Discrete(6);
        let mut a = ReplayBuffer::new(300, &space, &act);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut frame = || -> Vec<u8> { (0..100).map(|_| rng.random()).collect() };
        let mut stack = frame().repeat(4);
        for t in 0..500 {
            let mut next = stack[100..].to_vec();
            next.extend(frame());
            a.push(&Transition {
                obs: Obs::U8(&stack),
                action: Action::Discrete(t % 6),
                reward: 1.0,
                next_obs: Obs::U8(&next),
                done: t % 40 == 39,
                discount: 0.99,
            });
            stack = if t % 40 == 39 {
                frame().repeat(4)
            } else {
                next
            };
        }
        let path = path_for(dir.path(), 3);
        let bytes = a.save(&path, STAMP).unwrap();
        // A naive copy would hold 2 stacks of 400 bytes per transition.
        assert!(bytes < 300 * 800 / 3, "{bytes} bytes");
        let mut b = ReplayBuffer::new(300, &space, &act);
        b.restore(&path).unwrap();
        same_samples(&a, &b);
        let mut c = ReplayBuffer::new(300, &ObsSpace::vector(400), &act);
        let e = c.restore(&path).unwrap_err().to_string();
        assert!(
            e.contains("replay_rank3.safetensors") && e.contains("stacks of 4"),
            "{e}"
        );
    }

    /// Replay files come from disk (`--resume` of a `--save-replay` run), fuzzed: a restore
    /// gives the buffer or an error, and a buffer it accepts samples without a panic.
    #[test]
    fn fuzz_hostile_replay_files() {
        let dir = tempfile::tempdir().unwrap();
        let (obs, act) = (ObsSpace::vector(2), ActionSpace::Discrete(3));
        let mut vectors = ReplayBuffer::prioritized(20, &obs, &act, 0.6);
        push_vectors(&mut vectors, 27);
        let frames_space = ObsSpace {
            shape: vec![2, 3, 3],
            dtype: Dtype::U8,
        };
        let mut frames = ReplayBuffer::new(12, &frames_space, &act);
        let mut stack = vec![1u8; 18];
        for t in 0..15u8 {
            let mut next = stack[9..].to_vec();
            next.extend([t; 9]);
            frames.push(&Transition {
                obs: Obs::U8(&stack),
                action: Action::Discrete(t as usize % 3),
                reward: 1.0,
                next_obs: Obs::U8(&next),
                done: t % 5 == 4,
                discount: 0.99,
            });
            stack = next;
        }
        let path = path_for(dir.path(), 0);
        let mut seeds = Vec::new();
        for buffer in [&vectors, &frames] {
            buffer.save(&path, STAMP).unwrap();
            seeds.push(std::fs::read(&path).unwrap());
        }
        let mut batch = Batch::default();
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        drill_fuzz::fuzz("replay file", &seeds, |b| {
            std::fs::write(&path, b).unwrap();
            let mut v = ReplayBuffer::prioritized(20, &obs, &act, 0.6);
            if v.restore(&path).is_ok() && !v.is_empty() {
                v.sample(4, 0.4, &mut rng, &mut batch);
            }
            let mut f = ReplayBuffer::new(12, &frames_space, &act);
            if f.restore(&path).is_ok() && !f.is_empty() {
                f.sample(4, 0.4, &mut rng, &mut batch);
            }
        });
    }

    #[test]
    fn another_capacity_keeps_the_newest_transitions() {
        let dir = tempfile::tempdir().unwrap();
        let (obs, act) = (ObsSpace::vector(2), ActionSpace::Discrete(3));
        let mut a = ReplayBuffer::new(40, &obs, &act);
        push_vectors(&mut a, 90);
        let path = path_for(dir.path(), 0);
        a.save(&path, STAMP).unwrap();
        let mut b = ReplayBuffer::new(10, &obs, &act);
        b.restore(&path).unwrap();
        assert_eq!(b.len(), 10);
        let mut rewards = b.rewards.clone();
        rewards.sort_by(f32::total_cmp);
        assert_eq!(rewards, (80..90).map(|v| v as f32).collect::<Vec<_>>());
        let mut c = ReplayBuffer::new(100, &obs, &act);
        c.restore(&path).unwrap();
        assert_eq!((c.len(), c.next), (40, 40));
        assert_eq!(c.rewards[0], 50.0, "oldest first");
    }

    #[test]
    fn resume_restores_only_the_file_of_the_same_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let (obs, act) = (ObsSpace::vector(2), ActionSpace::Discrete(3));
        let mut a = ReplayBuffer::new(40, &obs, &act);
        push_vectors(&mut a, 30);
        a.save(&path_for(dir.path(), 1), STAMP).unwrap();
        let mut ck = Checkpoint {
            path: dir.path().join("final.safetensors"),
            ..Default::default()
        };
        ck.meta.insert("env_steps".into(), "1234".into());
        ck.meta.insert("train_iters".into(), "56".into());
        let mut b = ReplayBuffer::new(40, &obs, &act);
        b.resume_from(&ck, 1, 1).unwrap();
        assert_eq!(b.len(), 30);
        let mut other_rank = ReplayBuffer::new(40, &obs, &act);
        other_rank.resume_from(&ck, 0, 1).unwrap();
        assert!(other_rank.is_empty(), "rank 0 saved nothing");
        ck.meta.insert("train_iters".into(), "57".into());
        let mut stale = ReplayBuffer::new(40, &obs, &act);
        stale.resume_from(&ck, 1, 1).unwrap();
        assert!(stale.is_empty(), "a file of another checkpoint is not used");
    }
}
