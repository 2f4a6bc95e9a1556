//! [`FrameStore`]: each distinct frame of stacked image observations stored once. A replay
//! transition holds two stacks (`obs`, `next_obs`) of `k` frames, and consecutive transitions
//! share all but one frame, so storing frame ids instead of stacks cuts a 4x84x84 transition
//! from 56 kB to one frame (7 kB) and a few ids. Frames are found by content (a hash, then a
//! byte comparison, so sharing is always exact) and reference-counted: a frame's slot is
//! reused once no stored stack refers to it.
//!
//! The hash is a few lines of multiply-xor over 8-byte words written here: it only has to
//! spread frames over the map (equality is checked byte for byte), and it runs 8 times per
//! stored transition, where a general-purpose hasher would cost several times more.

use std::collections::HashMap;

/// Frames added to the store's allocation at a time.
const GROW: usize = 1024;

/// Frames of `frame` bytes, stored once each, with reference counts.
pub(crate) struct FrameStore {
    frame: usize,
    data: Vec<u8>,
    refs: Vec<u32>,
    hashes: Vec<u64>,
    free: Vec<u32>,
    /// Hash → a live slot with that hash.
    index: HashMap<u64, u32>,
}

fn hash(bytes: &[u8]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h = bytes.len() as u64;
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        h = (h ^ u64::from_le_bytes(w.try_into().unwrap())).wrapping_mul(K);
        h ^= h >> 29;
    }
    for &b in words.remainder() {
        h = (h ^ u64::from(b)).wrapping_mul(K);
    }
    h ^ (h >> 32)
}

impl FrameStore {
    /// An empty store of frames of `frame` bytes.
    pub(crate) fn new(frame: usize) -> Self {
        assert!(frame > 0);
        Self {
            frame,
            data: Vec::new(),
            refs: Vec::new(),
            hashes: Vec::new(),
            free: Vec::new(),
            index: HashMap::new(),
        }
    }

    /// Store (or find) each frame of `stack` (a multiple of the frame size) and take a
    /// reference to it; the ids go to `ids`, one per frame.
    pub(crate) fn insert(&mut self, stack: &[u8], ids: &mut [u32]) {
        assert_eq!(stack.len(), ids.len() * self.frame);
        for (f, id) in stack.chunks_exact(self.frame).zip(ids) {
            *id = self.insert_one(f);
        }
    }

    fn insert_one(&mut self, f: &[u8]) -> u32 {
        let h = hash(f);
        if let Some(&s) = self.index.get(&h)
            && self.get(s) == f
        {
            self.refs[s as usize] += 1;
            return s;
        }
        let s = match self.free.pop() {
            Some(s) => {
                let at = s as usize * self.frame;
                self.data[at..at + self.frame].copy_from_slice(f);
                s
            }
            None => {
                if self.data.len() == self.data.capacity() {
                    // Grow by a fixed number of frames: doubling would leave up to half of a
                    // large store unused.
                    self.data.reserve_exact(GROW * self.frame);
                    self.refs.reserve_exact(GROW);
                    self.hashes.reserve_exact(GROW);
                }
                self.data.extend_from_slice(f);
                self.refs.push(0);
                self.hashes.push(0);
                (self.refs.len() - 1) as u32
            }
        };
        self.refs[s as usize] = 1;
        self.hashes[s as usize] = h;
        self.index.insert(h, s);
        s
    }

    /// Drop one reference to each of `ids`; frames nobody refers to are freed.
    pub(crate) fn release(&mut self, ids: &[u32]) {
        for &s in ids {
            let r = &mut self.refs[s as usize];
            *r -= 1;
            if *r == 0 {
                let h = self.hashes[s as usize];
                if self.index.get(&h) == Some(&s) {
                    self.index.remove(&h);
                }
                self.free.push(s);
            }
        }
    }

    /// Frame `id`'s bytes.
    #[inline]
    pub(crate) fn get(&self, id: u32) -> &[u8] {
        let at = id as usize * self.frame;
        &self.data[at..at + self.frame]
    }

    /// Append the frames `ids` (one stack) to `out`.
    pub(crate) fn extend_stack(&self, ids: &[u32], out: &mut Vec<u8>) {
        for &id in ids {
            out.extend_from_slice(self.get(id));
        }
    }

    /// Frames referred to now.
    #[cfg(test)]
    pub(crate) fn live(&self) -> usize {
        self.refs.len() - self.free.len()
    }

    /// Every slot's bytes (`slots * frame`, freed slots included) and reference counts, as
    /// stored: what a replay file keeps.
    pub(crate) fn parts(&self) -> (&[u8], &[u32]) {
        (&self.data, &self.refs)
    }

    /// A store from [`Self::parts`]: hashes, index and free list are rebuilt.
    pub(crate) fn from_parts(frame: usize, data: Vec<u8>, refs: Vec<u32>) -> Self {
        assert!(frame > 0 && data.len() == refs.len() * frame);
        let mut s = Self {
            frame,
            hashes: vec![0; refs.len()],
            free: Vec::new(),
            index: HashMap::new(),
            data,
            refs,
        };
        for slot in 0..s.refs.len() {
            if s.refs[slot] == 0 {
                s.free.push(slot as u32);
            } else {
                let h = hash(s.get(slot as u32));
                s.hashes[slot] = h;
                s.index.insert(h, slot as u32);
            }
        }
        s
    }

    /// Bytes held: frame data, counts, hashes, the free list and the index.
    pub(crate) fn bytes(&self) -> usize {
        self.data.capacity()
            + self.refs.capacity() * 4
            + self.hashes.capacity() * 8
            + self.free.capacity() * 4
            + self.index.capacity() * (8 + 4 + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_frames_share_a_slot_and_freed_slots_are_reused() {
        let mut s = FrameStore::new(4);
        let mut a = [0u32; 3];
        s.insert(&[1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 1, 1], &mut a);
        assert_eq!(a[0], a[2]);
        assert_ne!(a[0], a[1]);
        assert_eq!(s.live(), 2);
        let mut b = [0u32; 1];
        s.insert(&[2, 2, 2, 2], &mut b);
        assert_eq!(b[0], a[1]);
        s.release(&a);
        assert_eq!(s.live(), 1, "frame 2 is still held by b");
        let mut c = [0u32; 1];
        s.insert(&[7, 7, 7, 7], &mut c);
        assert_eq!(c[0], a[0], "the freed slot is reused");
        assert_eq!(s.get(c[0]), &[7, 7, 7, 7]);
        assert_eq!(s.get(b[0]), &[2, 2, 2, 2]);
    }
}
