//! [`ParamLayout`]: a burn module's float parameters as one flat `f32` buffer in visit order.

use std::ops::Range;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor, TensorData};

/// Where one parameter lives in the flat buffer.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSlot {
    /// Dotted path in the module tree, e.g. `encoder.0.weight`.
    pub name: String,
    /// Tensor shape.
    pub shape: Vec<usize>,
    /// First element in the flat buffer.
    pub offset: usize,
    /// Number of elements.
    pub len: usize,
    id: ParamId,
}

/// The float parameters of a module, in visit order, with their flat offsets.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamLayout {
    /// One slot per parameter tensor.
    pub slots: Vec<ParamSlot>,
    /// Total number of elements.
    pub len: usize,
}

struct Collect<'a> {
    path: Vec<String>,
    slots: Vec<ParamSlot>,
    len: usize,
    values: Option<&'a mut Vec<f32>>,
}

impl ModuleVisitor for Collect<'_> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }
    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let value = param.val();
        let shape = value.shape().to_vec();
        let len = shape.iter().product();
        let name = self
            .path
            .iter()
            .filter(|s| !s.is_empty())
            .cloned()
            .collect::<Vec<_>>()
            .join(".");
        self.slots.push(ParamSlot {
            name,
            shape,
            offset: self.len,
            len,
            id: param.id,
        });
        self.len += len;
        if let Some(values) = self.values.as_deref_mut() {
            let data = value.into_data().convert::<f32>();
            values.extend_from_slice(data.as_slice::<f32>().expect("f32 parameter"));
        }
    }
}

struct Write<'a> {
    slots: &'a [ParamSlot],
    next: usize,
    /// The new values, until the first parameter moves them onto its device as one tensor.
    values: Option<Vec<f32>>,
    /// That tensor: each parameter becomes a slice of it (no copy per parameter; on a GPU one
    /// upload, where an upload per parameter costs a round of driver calls each).
    flat: Option<Tensor<1>>,
}

impl ModuleMapper for Write<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let slot = &self.slots[self.next];
        self.next += 1;
        let shape: [usize; D] = slot
            .shape
            .clone()
            .try_into()
            .expect("rank matches the layout");
        let (values, flat) = (&mut self.values, &mut self.flat);
        param.map(|t| {
            let (device, grad) = (t.device(), t.is_require_grad());
            let value = flat
                .get_or_insert_with(|| {
                    let values = values.take().expect("values taken once");
                    let n = values.len();
                    Tensor::from_data(TensorData::new(values, [n]), &device.clone().inner())
                })
                .clone()
                .slice(slot.offset..slot.offset + slot.len)
                .reshape(shape);
            let value = if t.is_autodiff() {
                value.autodiff()
            } else {
                value
            };
            value.set_require_grad(grad)
        })
    }
}

impl ParamLayout {
    /// The layout of `module`'s float parameters.
    pub fn of<M: Module>(module: &M) -> Self {
        let mut c = Collect {
            path: vec![],
            slots: vec![],
            len: 0,
            values: None,
        };
        module.visit(&mut c);
        Self {
            slots: c.slots,
            len: c.len,
        }
    }

    /// The layout and a copy of the parameter values.
    pub(crate) fn with_values<M: Module>(module: &M) -> (Self, Vec<f32>) {
        let mut values = Vec::new();
        let mut c = Collect {
            path: vec![],
            slots: vec![],
            len: 0,
            values: Some(&mut values),
        };
        module.visit(&mut c);
        (
            Self {
                slots: c.slots,
                len: c.len,
            },
            values,
        )
    }

    /// Overwrite `module`'s parameters with `src` (same layout). Parameter ids are kept.
    pub fn write<M: Module>(&self, module: M, src: &[f32]) -> M {
        self.write_owned(module, src.to_vec())
    }

    /// [`Self::write`] from a buffer of its own: it becomes the parameters' storage on the CPU
    /// (each parameter a slice of it, no copy) and crosses in one transfer to a GPU.
    pub(crate) fn write_owned<M: Module>(&self, module: M, values: Vec<f32>) -> M {
        assert_eq!(
            values.len(),
            self.len,
            "flat buffer does not match the layout"
        );
        let mut w = Write {
            slots: &self.slots,
            next: 0,
            values: Some(values),
            flat: None,
        };
        module.map(&mut w)
    }

    /// The gradients of parameters `slots` (adjacent in the flat buffer) into their place in
    /// `out`, or added there when `add`, in one transfer from `device`: flattened and
    /// concatenated there first, since on a GPU every read is a round trip (submit, wait, map).
    /// Zeros where a parameter got none.
    pub(crate) fn read_grads_fused(
        &self,
        slots: Range<usize>,
        grads: &mut GradientsParams,
        out: &mut [f32],
        add: bool,
        device: &Device,
    ) {
        let device = device.clone().inner();
        let parts: Vec<Tensor<1>> = slots
            .clone()
            .map(|i| {
                let slot = &self.slots[i];
                let n = [slot.len];
                match slot.shape.len() {
                    1 => grads.remove::<1>(slot.id),
                    2 => grads.remove::<2>(slot.id).map(|t| t.reshape(n)),
                    3 => grads.remove::<3>(slot.id).map(|t| t.reshape(n)),
                    4 => grads.remove::<4>(slot.id).map(|t| t.reshape(n)),
                    r => panic!("parameters of rank {r} are not supported"),
                }
                .unwrap_or_else(|| Tensor::zeros(n, &device))
            })
            .collect();
        let last = &self.slots[slots.end - 1];
        let dst = &mut out[self.slots[slots.start].offset..last.offset + last.len];
        let data = Tensor::cat(parts, 0).into_data().convert::<f32>();
        let g = data.as_slice::<f32>().expect("f32 gradient");
        if add {
            dst.iter_mut().zip(g).for_each(|(a, b)| *a += b);
        } else {
            dst.copy_from_slice(g);
        }
    }

    /// Move the gradients of `module`'s parameters into `out` (zeros where a parameter got
    /// none). Taking them out of `grads` lets the backend hand over the buffers without a copy.
    /// The parameter ids are those of the module this layout was taken from.
    pub(crate) fn read_grads(&self, grads: &mut GradientsParams, out: &mut [f32]) {
        assert_eq!(out.len(), self.len);
        for i in 0..self.slots.len() {
            self.read_grad(i, grads, out, false);
        }
    }

    /// Take every parameter's gradient out of `grads`, as the backward pass left it (none
    /// where a parameter got none), in slot order: no copy.
    pub(crate) fn take_grads(&self, grads: &mut GradientsParams) -> Vec<Option<TensorData>> {
        (self.slots.iter())
            .map(|slot| take_grad(slot, grads).map(|d| d.convert::<f32>()))
            .collect()
    }

    /// Move the gradient of parameter `i` into its place in `out` (zeros if it got none), or
    /// add it there when `add` (gradient accumulation).
    pub(crate) fn read_grad(
        &self,
        i: usize,
        grads: &mut GradientsParams,
        out: &mut [f32],
        add: bool,
    ) {
        let slot = &self.slots[i];
        let dst = &mut out[slot.offset..slot.offset + slot.len];
        match (take_grad(slot, grads), add) {
            (Some(d), false) => {
                dst.copy_from_slice(d.convert::<f32>().as_slice::<f32>().expect("f32 gradient"))
            }
            (Some(d), true) => {
                let d = d.convert::<f32>();
                let g = d.as_slice::<f32>().expect("f32 gradient");
                dst.iter_mut().zip(g).for_each(|(a, b)| *a += b);
            }
            (None, false) => dst.fill(0.0),
            (None, true) => {}
        }
    }
}

/// The gradient of `slot`'s parameter, taken out of `grads` as the backward pass left it.
fn take_grad(slot: &ParamSlot, grads: &mut GradientsParams) -> Option<TensorData> {
    match slot.shape.len() {
        1 => grads.remove::<1>(slot.id).map(Tensor::into_data),
        2 => grads.remove::<2>(slot.id).map(Tensor::into_data),
        3 => grads.remove::<3>(slot.id).map(Tensor::into_data),
        4 => grads.remove::<4>(slot.id).map(Tensor::into_data),
        r => panic!("parameters of rank {r} are not supported"),
    }
}
