//! Object collectives: any serde type, as bytes through the typed collectives.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{CommError, Result};

use super::ProcessGroup;

impl ProcessGroup {
    fn encode<T: Serialize>(op: &str, obj: &T) -> Result<Vec<u8>> {
        postcard::to_stdvec(obj).map_err(|e| CommError::Object {
            op: op.into(),
            detail: e.to_string(),
        })
    }

    fn decode<T: DeserializeOwned>(op: &str, bytes: &[u8]) -> Result<T> {
        postcard::from_bytes(bytes).map_err(|e| CommError::Object {
            op: op.into(),
            detail: e.to_string(),
        })
    }

    /// Send any serde value from `root` (which passes `Some`) to every rank.
    pub fn broadcast_object<T: Serialize + DeserializeOwned>(
        &self,
        obj: Option<&T>,
        root: usize,
    ) -> Result<T> {
        self.check_rank("broadcast_object", "root", root)?;
        let mut bytes = match (obj, self.inner.rank == root) {
            (Some(o), true) => Self::encode("broadcast_object", o)?,
            (None, true) => {
                return Err(CommError::usage(
                    "broadcast_object",
                    "the root must pass the object",
                ));
            }
            (_, false) => Vec::new(),
        };
        let mut len = [bytes.len() as i64];
        self.broadcast(&mut len, root)?;
        bytes.resize(len[0] as usize, 0);
        self.broadcast(&mut bytes, root)?;
        Self::decode("broadcast_object", &bytes)
    }

    fn gather_bytes(&self, mine: &[u8], root: Option<usize>) -> Result<Option<Vec<Vec<u8>>>> {
        let n = self.inner.size;
        let mut lens = vec![0i64; n];
        self.all_gather(&[mine.len() as i64], &mut lens)?;
        let max = *lens.iter().max().unwrap_or(&0) as usize;
        let mut padded = mine.to_vec();
        padded.resize(max, 0);
        let mut all = vec![0u8; max * n];
        match root {
            None => self.all_gather(&padded, &mut all)?,
            Some(r) => {
                let is_root = self.inner.rank == r;
                self.gather(&padded, is_root.then_some(&mut all[..]), r)?;
                if !is_root {
                    return Ok(None);
                }
            }
        }
        Ok(Some(
            lens.iter()
                .enumerate()
                .map(|(i, &l)| all[i * max..i * max + l as usize].to_vec())
                .collect(),
        ))
    }

    /// Every rank's value, in rank order, on every rank.
    pub fn all_gather_object<T: Serialize + DeserializeOwned>(&self, obj: &T) -> Result<Vec<T>> {
        let mine = Self::encode("all_gather_object", obj)?;
        let all = self.gather_bytes(&mine, None)?.expect("all ranks receive");
        all.iter()
            .map(|b| Self::decode("all_gather_object", b))
            .collect()
    }

    /// Every rank's value on `root` (`Some` there, `None` elsewhere).
    pub fn gather_object<T: Serialize + DeserializeOwned>(
        &self,
        obj: &T,
        root: usize,
    ) -> Result<Option<Vec<T>>> {
        self.check_rank("gather_object", "root", root)?;
        let mine = Self::encode("gather_object", obj)?;
        match self.gather_bytes(&mine, Some(root))? {
            None => Ok(None),
            Some(all) => all
                .iter()
                .map(|b| Self::decode("gather_object", b))
                .collect::<Result<_>>()
                .map(Some),
        }
    }

    /// Value `rank` of `root`'s list (one per rank) to each rank.
    pub fn scatter_object<T: Serialize + DeserializeOwned>(
        &self,
        objs: Option<&[T]>,
        root: usize,
    ) -> Result<T> {
        self.check_rank("scatter_object", "root", root)?;
        let n = self.inner.size;
        let encoded: Vec<Vec<u8>> = match (objs, self.inner.rank == root) {
            (Some(o), true) if o.len() == n => o
                .iter()
                .map(|x| Self::encode("scatter_object", x))
                .collect::<Result<_>>()?,
            (Some(o), true) => {
                return Err(CommError::usage(
                    "scatter_object",
                    format!("{} objects for a group of {n}", o.len()),
                ));
            }
            (None, true) => {
                return Err(CommError::usage(
                    "scatter_object",
                    "the root must pass one object per rank",
                ));
            }
            (_, false) => Vec::new(),
        };
        let lens: Vec<i64> = encoded.iter().map(|e| e.len() as i64).collect();
        let mut my_len = [0i64];
        self.scatter(
            (self.inner.rank == root).then_some(&lens[..]),
            &mut my_len,
            root,
        )?;
        let mut max = [lens.iter().copied().max().unwrap_or(0)];
        self.broadcast(&mut max, root)?;
        let max = max[0] as usize;
        let mut flat = Vec::new();
        if self.inner.rank == root {
            flat.reserve(max * n);
            for e in &encoded {
                flat.extend_from_slice(e);
                flat.resize(flat.len() + max - e.len(), 0);
            }
        }
        let mut mine = vec![0u8; max];
        self.scatter(
            (self.inner.rank == root).then_some(&flat[..]),
            &mut mine,
            root,
        )?;
        Self::decode("scatter_object", &mine[..my_len[0] as usize])
    }
}
