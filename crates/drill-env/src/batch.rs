//! Batches of observations and actions as they move through a pipeline: [`ObsBuf`] (owned
//! observations; their borrowed view [`Obs`] lives with the element types in `base.rs`),
//! [`Actions`] (borrowed, as a vector env steps them), [`ActionBuf`] (owned actions of any
//! space). One design for classic control and image environments: the element type travels
//! with the data, the per-observation shape with the [`crate::ObsSpace`].

use crate::{Action, ActionSpace, Dtype, Obs};

/// A batch of actions, one per copy (continuous ones flattened, `act_dim` values per copy).
#[derive(Debug, Clone, Copy)]
pub enum Actions<'a> {
    /// One discrete action index per copy.
    Discrete(&'a [u32]),
    /// `num_envs * act_dim` values, copy-major.
    Continuous(&'a [f32]),
}

/// An owned batch of observations (see [`Obs`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum ObsBuf {
    /// Float observations.
    F32(Vec<f32>),
    /// Byte observations.
    U8(Vec<u8>),
}

impl Default for ObsBuf {
    fn default() -> Self {
        ObsBuf::F32(Vec::new())
    }
}

impl ObsBuf {
    /// An empty buffer of `dtype`.
    pub fn new(dtype: Dtype) -> Self {
        match dtype {
            Dtype::F32 => ObsBuf::F32(Vec::new()),
            Dtype::U8 => ObsBuf::U8(Vec::new()),
        }
    }

    /// `len` zero elements of `dtype`.
    pub fn zeros(dtype: Dtype, len: usize) -> Self {
        match dtype {
            Dtype::F32 => ObsBuf::F32(vec![0.0; len]),
            Dtype::U8 => ObsBuf::U8(vec![0; len]),
        }
    }

    /// Borrow it.
    pub fn as_obs(&self) -> Obs<'_> {
        match self {
            ObsBuf::F32(x) => Obs::F32(x),
            ObsBuf::U8(x) => Obs::U8(x),
        }
    }

    /// Elements held.
    pub fn len(&self) -> usize {
        self.as_obs().len()
    }

    /// Nothing held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drop the contents, keep the allocation and the element type.
    pub fn clear(&mut self) {
        match self {
            ObsBuf::F32(x) => x.clear(),
            ObsBuf::U8(x) => x.clear(),
        }
    }

    /// Grow (with zeros) or shrink to `len` elements, keeping the allocation.
    pub fn resize(&mut self, len: usize) {
        match self {
            ObsBuf::F32(x) => x.resize(len, 0.0),
            ObsBuf::U8(x) => x.resize(len, 0),
        }
    }

    /// Append `obs` (same element type; panics otherwise, a caller bug).
    pub fn extend(&mut self, obs: Obs<'_>) {
        match (self, obs) {
            (ObsBuf::F32(x), Obs::F32(o)) => x.extend_from_slice(o),
            (ObsBuf::U8(x), Obs::U8(o)) => x.extend_from_slice(o),
            (me, o) => panic!("appending {:?} observations to {:?}", o.dtype(), me.dtype()),
        }
    }

    /// Overwrite elements `at..at + obs.len()` with `obs` (same element type).
    pub fn write(&mut self, at: usize, obs: Obs<'_>) {
        match (self, obs) {
            (ObsBuf::F32(x), Obs::F32(o)) => x[at..at + o.len()].copy_from_slice(o),
            (ObsBuf::U8(x), Obs::U8(o)) => x[at..at + o.len()].copy_from_slice(o),
            (me, o) => panic!("writing {:?} observations into {:?}", o.dtype(), me.dtype()),
        }
    }

    /// Drop the first `n` elements.
    pub fn drain_front(&mut self, n: usize) {
        match self {
            ObsBuf::F32(x) => drop(x.drain(..n)),
            ObsBuf::U8(x) => drop(x.drain(..n)),
        }
    }

    /// Its element type.
    pub fn dtype(&self) -> Dtype {
        self.as_obs().dtype()
    }
}

/// An owned batch of actions, one per env copy or transition.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum ActionBuf {
    /// One index each.
    Discrete(Vec<u32>),
    /// `dim` values each, row-major.
    Continuous {
        /// Values per action.
        dim: usize,
        /// `len * dim` values.
        values: Vec<f32>,
    },
}

impl Default for ActionBuf {
    fn default() -> Self {
        ActionBuf::Discrete(Vec::new())
    }
}

impl ActionBuf {
    /// `n` zero actions of `space`.
    pub fn for_space(space: &ActionSpace, n: usize) -> Self {
        match space {
            ActionSpace::Discrete(_) => ActionBuf::Discrete(vec![0; n]),
            ActionSpace::Continuous { low, .. } => ActionBuf::Continuous {
                dim: low.len(),
                values: vec![0.0; n * low.len()],
            },
        }
    }

    /// Actions held.
    pub fn len(&self) -> usize {
        match self {
            ActionBuf::Discrete(a) => a.len(),
            ActionBuf::Continuous { dim, values } => values.len() / dim.max(&1),
        }
    }

    /// None held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drop the contents, keep the kind and allocation.
    pub fn clear(&mut self) {
        match self {
            ActionBuf::Discrete(a) => a.clear(),
            ActionBuf::Continuous { values, .. } => values.clear(),
        }
    }

    /// Action `i`.
    pub fn get(&self, i: usize) -> Action<'_> {
        match self {
            ActionBuf::Discrete(a) => Action::Discrete(a[i] as usize),
            ActionBuf::Continuous { dim, values } => {
                Action::Continuous(&values[i * dim..(i + 1) * dim])
            }
        }
    }

    /// Append one action (of the same kind; panics otherwise, a caller bug).
    pub fn push(&mut self, a: Action<'_>) {
        match (self, a) {
            (ActionBuf::Discrete(v), Action::Discrete(i)) => v.push(i as u32),
            (ActionBuf::Continuous { values, .. }, Action::Continuous(x)) => {
                values.extend_from_slice(x)
            }
            (me, a) => panic!("pushing {a:?} onto {}", me.kind()),
        }
    }

    /// Append every action of `other` (same kind).
    pub fn extend(&mut self, other: &ActionBuf) {
        match (self, other) {
            (ActionBuf::Discrete(v), ActionBuf::Discrete(o)) => v.extend_from_slice(o),
            (ActionBuf::Continuous { values, .. }, ActionBuf::Continuous { values: o, .. }) => {
                values.extend_from_slice(o)
            }
            (me, o) => panic!("appending {} actions to {}", o.kind(), me.kind()),
        }
    }

    /// `n` discrete actions to overwrite (made discrete and resized as needed).
    pub fn discrete_mut(&mut self, n: usize) -> &mut [u32] {
        if !matches!(self, ActionBuf::Discrete(_)) {
            *self = ActionBuf::Discrete(Vec::new());
        }
        let ActionBuf::Discrete(a) = self else {
            unreachable!()
        };
        a.resize(n, 0);
        a
    }

    /// `n` continuous actions of `dim` values to overwrite (made continuous and resized as
    /// needed).
    pub fn continuous_mut(&mut self, n: usize, dim: usize) -> &mut [f32] {
        match self {
            ActionBuf::Continuous { dim: d, .. } if *d == dim => {}
            _ => {
                *self = ActionBuf::Continuous {
                    dim,
                    values: Vec::new(),
                }
            }
        }
        let ActionBuf::Continuous { values, .. } = self else {
            unreachable!()
        };
        values.resize(n * dim, 0.0);
        values
    }

    /// Drop the first `n` actions.
    pub fn drain_front(&mut self, n: usize) {
        match self {
            ActionBuf::Discrete(a) => drop(a.drain(..n)),
            ActionBuf::Continuous { dim, values } => drop(values.drain(..n * *dim)),
        }
    }

    /// An empty buffer of the same kind.
    pub fn empty_like(&self) -> Self {
        match self {
            ActionBuf::Discrete(_) => ActionBuf::Discrete(Vec::new()),
            ActionBuf::Continuous { dim, .. } => ActionBuf::Continuous {
                dim: *dim,
                values: Vec::new(),
            },
        }
    }

    /// View as [`Actions`] for [`crate::DynVecEnv::step`].
    pub fn as_actions(&self) -> Actions<'_> {
        match self {
            ActionBuf::Discrete(a) => Actions::Discrete(a),
            ActionBuf::Continuous { values, .. } => Actions::Continuous(values),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            ActionBuf::Discrete(_) => "discrete",
            ActionBuf::Continuous { .. } => "continuous",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn obs_rows_extend_and_write_keep_the_element_type() {
        let mut b = ObsBuf::new(Dtype::U8);
        b.extend(Obs::U8(&[1, 2, 3, 4, 5, 6]));
        assert_eq!(b.as_obs().rows(1..3, 2), Obs::U8(&[3, 4, 5, 6]));
        b.write(2, Obs::U8(&[9, 9]));
        b.drain_front(2);
        assert_eq!(b, ObsBuf::U8(vec![9, 9, 5, 6]));
        let mut f = Vec::new();
        b.as_obs().extend_f32(&mut f);
        assert_eq!(f, [9.0, 9.0, 5.0, 6.0]);
    }

    #[test]
    fn action_buffers_of_both_kinds() {
        let space = ActionSpace::Continuous {
            low: vec![-1.0; 2],
            high: vec![1.0; 2],
        };
        let mut a = ActionBuf::for_space(&space, 3);
        assert_eq!(a.len(), 3);
        a.clear();
        a.push(Action::Continuous(&[0.5, -0.5]));
        assert!(matches!(a.get(0), Action::Continuous(x) if x == [0.5, -0.5]));
        let mut d = ActionBuf::for_space(&ActionSpace::Discrete(4), 0);
        d.push(Action::Discrete(3));
        d.extend(&ActionBuf::Discrete(vec![1]));
        assert_eq!(d, ActionBuf::Discrete(vec![3, 1]));
    }
}
