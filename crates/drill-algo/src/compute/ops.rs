//! drill's kernels as burn operations: the backend extension [`FastOps`], implemented for
//! `Flex` (forward) and `Autodiff<Flex>` (forward plus a hand-written backward pass, one
//! autodiff node per layer with its ReLU fused in); SyncBatchNorm's op, whose backward
//! all-reduces its sums ([`BatchStats`]). The backward passes hand each parameter gradient
//! they register to this thread's gradient sink, when a distributed trainer set one
//! ([`GradSink`]: the all-reduce overlapped with backward).
//!
//! Only `f32` tensors on the flex device come here (and, for a first layer, `u8` frames:
//! [`FastOps::fast_conv2d_frames`]); [`super::conv2d`] and [`super::linear`] send everything
//! else to burn's own operations.

use burn::backend::TensorMetadata;
use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::{FlexTensor, Layout};
use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::{Autodiff, Backend, Flex, backend_extension};
use burn::tensor::{Bytes, DType, Shape};
use drill_kernels::conv::{self, Geometry, Source};
use drill_kernels::dense::{self, Dims};
use drill_kernels::lstm;
use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// Layers as single backend operations (see the module docs).
#[backend_extension(Flex, Autodiff)]
pub(crate) trait FastOps: Backend {
    /// `conv2d(x, weight) + bias` at stride `(stride_h, stride_w)` (no padding, no dilation,
    /// one group), then ReLU when `relu`.
    fn fast_conv2d(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        stride_h: usize,
        stride_w: usize,
        relu: bool,
    ) -> FloatTensor<Self>;

    /// [`FastOps::fast_conv2d`] over `u8` frames `x` (an int tensor of dtype `U8`), each
    /// byte read as `b / 255` ([`drill_kernels::frames::value`]): a network's first layer without a
    /// float copy of its input. No gradient flows to `x`.
    fn fast_conv2d_frames(
        x: IntTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        stride_h: usize,
        stride_w: usize,
        relu: bool,
    ) -> FloatTensor<Self>;

    /// `x weight + bias` (`weight` is `[in, out]`, burn's `Linear` layout), then ReLU when
    /// `relu`.
    fn fast_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        relu: bool,
    ) -> FloatTensor<Self>;

    /// Batch normalisation's training forward over `x [n, c]` with the batch statistics in
    /// `stats` (computed by the caller, over every rank's rows): `(x - mean) * invstd * gamma
    /// + beta`. Its backward all-reduces the sums of `dy` and `dy * x_hat` over `stats.group`,
    /// so the input gradient has the other ranks' terms (torch's `SyncBatchNorm`).
    fn fast_batch_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        stats: BatchStats,
    ) -> FloatTensor<Self>;

    /// `x` itself. On the autodiff backend, while a gradient sink is set ([`sink_begin`]),
    /// `x`'s graph node is noted as parameter `slot`'s.
    fn fast_tag_param(x: FloatTensor<Self>, slot: usize) -> FloatTensor<Self>;

    /// An LSTM's recurrence over `steps` steps of `state0.dims()[0]` sequences
    /// ([`drill_kernels::lstm::forward`]): `xp [steps · rows, 4H]` the input's projection,
    /// `w_hh [H, 4H]`, `b_hh [4H]`, `state0 [rows, 2H]`, `keep` 0 after an episode's end;
    /// every step's `h` and `c` `[steps · rows, 2H]`. One autodiff node, backward through
    /// time.
    fn fast_lstm(
        xp: FloatTensor<Self>,
        w_hh: FloatTensor<Self>,
        b_hh: FloatTensor<Self>,
        state0: FloatTensor<Self>,
        keep: Vec<f32>,
    ) -> FloatTensor<Self>;
}

/// Where drill's backward ops hand the parameter gradients they register while a backward
/// pass runs on this thread: the gradient all-reduce overlapped with the backward pass
/// (`optim`'s trainer).
pub(crate) trait GradSink {
    /// Parameter `slot`'s gradient, as registered.
    fn written(&mut self, slot: usize, grad: &[f32]);
}

/// The sink of this thread's backward pass and its parameters' nodes.
struct Sink {
    /// Slot of each tagged parameter node ([`FastOps::fast_tag_param`]).
    slots: HashMap<NodeId, usize>,
    to: Rc<RefCell<dyn GradSink>>,
}

thread_local! {
    static SINK: RefCell<Option<Sink>> = const { RefCell::new(None) };
}

/// Hand the parameter gradients that drill's ops register on this thread to `to`, until
/// [`sink_end`]; the parameters are tagged after this ([`super::tag_params`]).
pub(crate) fn sink_begin(to: Rc<RefCell<dyn GradSink>>) {
    SINK.with(|s| {
        *s.borrow_mut() = Some(Sink {
            slots: HashMap::new(),
            to,
        })
    });
}

/// Stop handing gradients over (releases the sink).
pub(crate) fn sink_end() {
    SINK.with(|s| s.borrow_mut().take());
}

/// Parameter node `id`'s gradient `grad` was registered: to the sink, when one is set and
/// `id` is a tagged parameter's.
fn sink_written(id: NodeId, grad: &[f32]) {
    let to = SINK.with(|s| {
        let s = s.borrow();
        let s = s.as_ref()?;
        s.slots.get(&id).map(|&slot| (slot, s.to.clone()))
    });
    if let Some((slot, to)) = to {
        to.borrow_mut().written(slot, grad);
    }
}

/// A batch normalisation's statistics over every rank's rows, and the group its backward
/// reduces over ([`FastOps::fast_batch_norm`]).
#[derive(Clone, Debug)]
pub(crate) struct BatchStats {
    /// Per-feature mean.
    pub(crate) mean: Vec<f32>,
    /// Per-feature `1 / sqrt(var + eps)`.
    pub(crate) invstd: Vec<f32>,
    /// Rows over every rank.
    pub(crate) total: f64,
    /// The ranks whose rows the statistics cover (`None`: this rank's only).
    pub(crate) group: Option<drill_comm::ProcessGroup>,
    /// Where the backward leaves an all-reduce's error (a backward cannot return one); the
    /// layer reports it.
    pub(crate) failed: std::sync::Arc<std::sync::Mutex<Option<drill_comm::CommError>>>,
}

fn geometry(x: &FlexTensor, weight: &FlexTensor, stride: [usize; 2]) -> Geometry {
    geometry_of(&x.shape(), &weight.shape(), stride)
}

fn geometry_of(x: &Shape, weight: &Shape, stride: [usize; 2]) -> Geometry {
    let [batch, c_in, h, w] = x.dims();
    let [c_out, wc_in, kh, kw] = weight.dims();
    assert_eq!(
        c_in, wc_in,
        "conv2d: input has {c_in} channels, the weight {wc_in}"
    );
    assert!(
        h >= kh && w >= kw,
        "conv2d: a {h}x{w} input is smaller than the {kh}x{kw} kernel"
    );
    Geometry {
        batch,
        c_in,
        h,
        w,
        c_out,
        kh,
        kw,
        sh: stride[0],
        sw: stride[1],
    }
}

fn dims(x: &FlexTensor, weight: &FlexTensor) -> Dims {
    let [n, d_in] = x.shape().dims();
    let [w_in, d_out] = weight.shape().dims();
    assert_eq!(
        d_in, w_in,
        "linear: input has {d_in} features, the weight {w_in}"
    );
    Dims { n, d_in, d_out }
}

/// The tensor's `f32` values in row-major order (copied only when not contiguous already).
fn values(t: &FlexTensor) -> Cow<'_, [f32]> {
    elements(t, DType::F32, "drill's CPU kernels take f32 tensors")
}

/// The frame bytes of a `U8` tensor in row-major order (copied only when not contiguous
/// already).
fn frame_bytes(t: &FlexTensor) -> Cow<'_, [u8]> {
    elements(t, DType::U8, "a convolution over frames takes a u8 tensor")
}

/// The tensor's elements of type `E` (its dtype `dtype`, else panic with `what`) in
/// row-major order, copied only when not contiguous already.
fn elements<'t, E: burn::tensor::Element + bytemuck::Pod>(
    t: &'t FlexTensor,
    dtype: DType,
    what: &str,
) -> Cow<'t, [E]> {
    assert_eq!(t.dtype(), dtype, "{what}");
    match t.as_slice::<E>() {
        Some(s) if t.is_contiguous() => Cow::Borrowed(s),
        _ => Cow::Owned(
            t.to_contiguous()
                .as_slice::<E>()
                .expect("a contiguous tensor of its own dtype")
                .to_vec(),
        ),
    }
}

fn tensor(v: Vec<f32>, shape: impl Into<Shape>) -> FlexTensor {
    FlexTensor::new(
        Bytes::from_elems(v),
        Layout::contiguous(shape.into()),
        DType::F32,
    )
}

/// The gradient through a ReLU whose output was `y`: `dy` where `y > 0`, else 0; masked in
/// place when `dy`'s buffer is its own (as a gradient consumed from the graph is), else into
/// a new one.
fn through_relu(mut dy: FlexTensor, y: Option<&FlexTensor>) -> FlexTensor {
    let Some(y) = y else { return dy };
    let y = values(y);
    let mask = |g: f32, y: f32| if y > 0.0 || y.is_nan() { g } else { 0.0 };
    let whole = dy.is_contiguous() && dy.layout().start_offset() == 0;
    if let Some(g) = dy
        .try_storage_mut::<f32>()
        .filter(|g| whole && g.len() == y.len())
    {
        super::par_zip(g, &y, |g, y| *g = mask(*g, y));
        return dy;
    }
    let dz = values(&dy)
        .iter()
        .zip(y.iter())
        .map(|(g, y)| mask(*g, *y))
        .collect();
    tensor(dz, dy.shape())
}

impl FastOps for Flex {
    fn fast_conv2d(
        x: FlexTensor,
        weight: FlexTensor,
        bias: FlexTensor,
        stride_h: usize,
        stride_w: usize,
        relu: bool,
    ) -> FlexTensor {
        let g = geometry(&x, &weight, [stride_h, stride_w]);
        let (x, weight, bias) = (values(&x), values(&weight), values(&bias));
        let y = conv::forward(Source::F32(&x), &weight, &bias, &g, relu);
        tensor(y, [g.batch, g.c_out, g.oh(), g.ow()])
    }

    fn fast_conv2d_frames(
        x: FlexTensor,
        weight: FlexTensor,
        bias: FlexTensor,
        stride_h: usize,
        stride_w: usize,
        relu: bool,
    ) -> FlexTensor {
        let g = geometry(&x, &weight, [stride_h, stride_w]);
        let (x, weight, bias) = (frame_bytes(&x), values(&weight), values(&bias));
        let y = conv::forward(Source::Frames(&x), &weight, &bias, &g, relu);
        tensor(y, [g.batch, g.c_out, g.oh(), g.ow()])
    }

    fn fast_linear(x: FlexTensor, weight: FlexTensor, bias: FlexTensor, relu: bool) -> FlexTensor {
        let d = dims(&x, &weight);
        let w = values(&weight);
        let y = match super::packed_weights::packed(&weight, &w, (d.n, d.d_in, d.d_out)) {
            Some(p) => dense::forward_packed(&values(&x), &p, &values(&bias), d, relu),
            None => dense::forward(&values(&x), &w, &values(&bias), d, relu),
        };
        tensor(y, [d.n, d.d_out])
    }

    fn fast_batch_norm(
        x: FlexTensor,
        gamma: FlexTensor,
        beta: FlexTensor,
        stats: BatchStats,
    ) -> FlexTensor {
        let shape = x.shape();
        let (_, y) = batch_norm(&values(&x), &values(&gamma), &values(&beta), &stats);
        tensor(y, shape)
    }

    fn fast_tag_param(x: FlexTensor, _slot: usize) -> FlexTensor {
        x
    }

    fn fast_lstm(
        xp: FlexTensor,
        w_hh: FlexTensor,
        b_hh: FlexTensor,
        state0: FlexTensor,
        keep: Vec<f32>,
    ) -> FlexTensor {
        let s = lstm_shape(&xp, &state0);
        let (y, _) = lstm::forward(
            &values(&xp),
            &values(&w_hh),
            &values(&b_hh),
            &values(&state0),
            &keep,
            s,
        );
        tensor(y, [s.steps * s.rows, 2 * s.hidden])
    }
}

/// The recurrence's sizes from its input projection `[steps · rows, 4H]` and initial state
/// `[rows, 2H]`.
fn lstm_shape(xp: &FlexTensor, state0: &FlexTensor) -> lstm::Shape {
    let [n, g] = xp.shape().dims();
    let [rows, w] = state0.shape().dims();
    assert!(
        rows > 0 && n.is_multiple_of(rows) && g == 2 * w,
        "lstm: input projection [{n}, {g}] against initial state [{rows}, {w}]"
    );
    lstm::Shape {
        steps: n / rows,
        rows,
        hidden: w / 2,
    }
}

/// The backward pass through time of [`FastOps::fast_lstm`].
#[derive(Debug)]
struct LstmBackward;

/// What [`LstmBackward`] keeps: the output, the gates, `W_hh`, the initial state, the mask,
/// the sizes.
type LstmState = (
    Vec<f32>,
    lstm::Saved,
    Vec<f32>,
    Vec<f32>,
    Vec<f32>,
    lstm::Shape,
);

impl Backward<Flex, 4> for LstmBackward {
    type State = LstmState;

    fn backward(self, ops: Ops<Self::State, 4>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_xp, node_w, node_b, node_s0] = ops.parents;
        let dy: FlexTensor = grads.consume::<Flex>(&ops.node);
        let (y, saved, w_hh, state0, keep, s) = ops.state;
        let g = lstm::backward(&values(&dy), &y, &saved, &w_hh, &state0, &keep, s);
        let h = s.hidden;
        register_params(
            grads,
            [node_w, node_b].map(|n| n.map(|n| n.id)),
            (g.w_hh, g.b_hh),
            Shape::new([h, 4 * h]),
        );
        if let Some(node) = node_xp {
            grads.register::<Flex>(node.id, tensor(g.xp, [s.steps * s.rows, 4 * h]));
        }
        if let Some(node) = node_s0 {
            grads.register::<Flex>(node.id, tensor(g.state0, [s.rows, 2 * h]));
        }
    }
}

/// Which layer a [`LayerBackward`] differentiates.
#[derive(Debug, Clone, Copy)]
enum Layer {
    Conv { stride: [usize; 2] },
    Linear,
}

/// The backward pass of one layer: weight and bias gradients from the saved input, the input
/// gradient from the saved weight (each only when its parent wants it), through the fused
/// ReLU's saved output.
#[derive(Debug)]
struct LayerBackward;

impl Backward<Flex, 3> for LayerBackward {
    /// Input, weight, the layer, and the output when a ReLU was fused in.
    type State = (NodeId, NodeId, Layer, Option<FlexTensor>);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, ck: &mut Checkpointer) {
        let [node_x, node_w, node_b] = ops.parents;
        let dy: FlexTensor = grads.consume::<Flex>(&ops.node);
        let (x_id, w_id, layer, relu_out) = ops.state;
        let x: FlexTensor = ck.retrieve_node_output(x_id);
        let weight: FlexTensor = ck.retrieve_node_output(w_id);
        let dz = through_relu(dy, relu_out.as_ref());
        let dz = values(&dz);
        let (params, dx) = match layer {
            Layer::Conv { stride } => {
                let g = geometry(&x, &weight, stride);
                let params = (node_w.is_some() || node_b.is_some())
                    .then(|| conv::backward_params(Source::F32(&values(&x)), &dz, &g));
                let dx = node_x
                    .is_some()
                    .then(|| conv::backward_input(&values(&weight), &dz, &g));
                (params, dx)
            }
            Layer::Linear => {
                let d = dims(&x, &weight);
                let params = (node_w.is_some() || node_b.is_some())
                    .then(|| dense::backward_params(&values(&x), &dz, d));
                let dx = node_x
                    .is_some()
                    .then(|| dense::backward_input(&values(&weight), &dz, d));
                (params, dx)
            }
        };
        if let Some(params) = params {
            register_params(
                grads,
                [node_w, node_b].map(|n| n.map(|n| n.id)),
                params,
                weight.shape(),
            );
        }
        if let (Some(node), Some(dx)) = (node_x, dx) {
            grads.register::<Flex>(node.id, tensor(dx, x.shape()));
        }
    }
}

/// The backward pass of a convolution over frames ([`FastOps::fast_conv2d_frames`]): weight
/// and bias gradients from the saved frames, through the fused ReLU's saved output; the
/// frames take none.
#[derive(Debug)]
struct FramesBackward;

impl Backward<Flex, 2> for FramesBackward {
    /// The frames, the weight's shape, the stride, and the output when a ReLU was fused in.
    type State = (FlexTensor, Shape, [usize; 2], Option<FlexTensor>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_w, node_b] = ops.parents;
        let dy: FlexTensor = grads.consume::<Flex>(&ops.node);
        let (x, w_shape, stride, relu_out) = ops.state;
        let g = geometry_of(&x.shape(), &w_shape, stride);
        let dz = through_relu(dy, relu_out.as_ref());
        let params = conv::backward_params(Source::Frames(&frame_bytes(&x)), &values(&dz), &g);
        register_params(
            grads,
            [node_w, node_b].map(|n| n.map(|n| n.id)),
            params,
            w_shape,
        );
    }
}

/// `x_hat = (x - mean) * invstd` and `y = x_hat * gamma + beta`, row-major `[n, c]`.
fn batch_norm(x: &[f32], gamma: &[f32], beta: &[f32], s: &BatchStats) -> (Vec<f32>, Vec<f32>) {
    let c = gamma.len();
    let x_hat: Vec<f32> = x
        .iter()
        .enumerate()
        .map(|(i, &v)| (v - s.mean[i % c]) * s.invstd[i % c])
        .collect();
    let y = x_hat
        .iter()
        .enumerate()
        .map(|(i, &h)| h * gamma[i % c] + beta[i % c])
        .collect();
    (x_hat, y)
}

/// The backward pass of [`FastOps::fast_batch_norm`]: `gamma`'s and `beta`'s gradients from
/// this rank's rows (DDP averages them), the input's through the statistics of every rank's
/// rows (torch's `SyncBatchNorm` backward): `dx = gamma * invstd * (dy - sum(dy) / N - x_hat
/// * sum(dy * x_hat) / N)`, the sums and `N` over the group.
#[derive(Debug)]
struct BatchNormBackward;

impl Backward<Flex, 3> for BatchNormBackward {
    /// `x_hat`, `gamma`'s values, the statistics.
    type State = (Vec<f32>, Vec<f32>, BatchStats);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x, node_gamma, node_beta] = ops.parents;
        let dy_t: FlexTensor = grads.consume::<Flex>(&ops.node);
        let shape = dy_t.shape();
        let dy = values(&dy_t);
        let (x_hat, gamma, stats) = ops.state;
        let c = gamma.len();
        // This rank's sums of dy and dy * x_hat per feature, side by side.
        let mut sums = vec![0f64; 2 * c];
        for (i, (&g, &h)) in dy.iter().zip(&x_hat).enumerate() {
            sums[i % c] += f64::from(g);
            sums[c + i % c] += f64::from(g) * f64::from(h);
        }
        let local = |range: std::ops::Range<usize>| -> Vec<f32> {
            sums[range].iter().map(|&v| v as f32).collect()
        };
        for (node, range) in [(node_gamma, c..2 * c), (node_beta, 0..c)] {
            if let Some(node) = node {
                let g = local(range);
                sink_written(node.id, &g);
                grads.register::<Flex>(node.id, tensor(g, [c]));
            }
        }
        let Some(node) = node_x else { return };
        if let Some(group) = &stats.group
            && let Err(e) = group.all_reduce(&mut sums, drill_comm::ReduceOp::Sum)
        {
            tracing::error!("SyncBatchNorm's backward all-reduce failed: {e}");
            *stats.failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
        }
        let n = stats.total;
        let dx = dy
            .iter()
            .zip(&x_hat)
            .enumerate()
            .map(|(i, (&g, &h))| {
                let j = i % c;
                let centred = f64::from(g) - sums[j] / n - f64::from(h) * sums[c + j] / n;
                (f64::from(gamma[j] * stats.invstd[j]) * centred) as f32
            })
            .collect();
        grads.register::<Flex>(node.id, tensor(dx, shape));
    }
}

/// Register a layer's weight gradient `dw` (of shape `w_shape`) and bias gradient `db` for
/// the weight and bias nodes that want them.
fn register_params(
    grads: &mut Gradients,
    [node_w, node_b]: [Option<NodeId>; 2],
    (dw, db): (Vec<f32>, Vec<f32>),
    w_shape: Shape,
) {
    if let Some(id) = node_w {
        sink_written(id, &dw);
        grads.register::<Flex>(id, tensor(dw, w_shape));
    }
    if let Some(id) = node_b {
        sink_written(id, &db);
        let n = db.len();
        grads.register::<Flex>(id, tensor(db, [n]));
    }
}

/// A layer's input, weight and bias on the autodiff device.
type Inputs<C> = (
    FloatTensor<Autodiff<Flex, C>>,
    FloatTensor<Autodiff<Flex, C>>,
    FloatTensor<Autodiff<Flex, C>>,
);

/// Run `forward` on the inner tensors and record a [`LayerBackward`] node when any input is
/// tracked.
fn layer<C: CheckpointStrategy>(
    (x, weight, bias): Inputs<C>,
    kind: Layer,
    relu: bool,
    forward: impl FnOnce(FlexTensor, FlexTensor, FlexTensor) -> FlexTensor,
) -> FloatTensor<Autodiff<Flex, C>> {
    let prep = LayerBackward
        .prepare::<C>([x.node(), weight.node(), bias.node()])
        .compute_bound()
        .stateful();
    match prep {
        OpsKind::Tracked(mut prep) => {
            let x_id = prep.checkpoint(&x);
            let w_id = prep.checkpoint(&weight);
            let y = forward(
                x.into_primitive(),
                weight.into_primitive(),
                bias.into_primitive(),
            );
            let saved = relu.then(|| y.clone());
            prep.finish((x_id, w_id, kind, saved), y)
        }
        OpsKind::UnTracked(prep) => prep.finish(forward(
            x.into_primitive(),
            weight.into_primitive(),
            bias.into_primitive(),
        )),
    }
}

impl<C: CheckpointStrategy> FastOps for Autodiff<Flex, C> {
    fn fast_conv2d(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        stride_h: usize,
        stride_w: usize,
        relu: bool,
    ) -> FloatTensor<Self> {
        let stride = [stride_h, stride_w];
        layer::<C>(
            (x, weight, bias),
            Layer::Conv { stride },
            relu,
            |x, w, b| Flex::fast_conv2d(x, w, b, stride_h, stride_w, relu),
        )
    }

    fn fast_conv2d_frames(
        x: IntTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        stride_h: usize,
        stride_w: usize,
        relu: bool,
    ) -> FloatTensor<Self> {
        let forward = |x, w, b| Flex::fast_conv2d_frames(x, w, b, stride_h, stride_w, relu);
        let prep = FramesBackward
            .prepare::<C>([weight.node(), bias.node()])
            .compute_bound()
            .stateful();
        match prep {
            OpsKind::Tracked(prep) => {
                let w_shape = weight.shape();
                let y = forward(x.clone(), weight.into_primitive(), bias.into_primitive());
                let saved = relu.then(|| y.clone());
                prep.finish((x, w_shape, [stride_h, stride_w], saved), y)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(forward(x, weight.into_primitive(), bias.into_primitive()))
            }
        }
    }

    fn fast_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        relu: bool,
    ) -> FloatTensor<Self> {
        layer::<C>((x, weight, bias), Layer::Linear, relu, |x, w, b| {
            Flex::fast_linear(x, w, b, relu)
        })
    }

    fn fast_batch_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        stats: BatchStats,
    ) -> FloatTensor<Self> {
        let prep = BatchNormBackward
            .prepare::<C>([x.node(), gamma.node(), beta.node()])
            .compute_bound()
            .stateful();
        let (x, gamma, beta) = (
            x.into_primitive(),
            gamma.into_primitive(),
            beta.into_primitive(),
        );
        let shape = x.shape();
        let gamma = values(&gamma).into_owned();
        let (x_hat, y) = batch_norm(&values(&x), &gamma, &values(&beta), &stats);
        let y = tensor(y, shape);
        match prep {
            OpsKind::Tracked(prep) => prep.finish((x_hat, gamma, stats), y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        }
    }

    fn fast_lstm(
        xp: FloatTensor<Self>,
        w_hh: FloatTensor<Self>,
        b_hh: FloatTensor<Self>,
        state0: FloatTensor<Self>,
        keep: Vec<f32>,
    ) -> FloatTensor<Self> {
        let prep = LstmBackward
            .prepare::<C>([xp.node(), w_hh.node(), b_hh.node(), state0.node()])
            .compute_bound()
            .stateful();
        let (xp, w_hh, b_hh, state0) = (
            xp.into_primitive(),
            w_hh.into_primitive(),
            b_hh.into_primitive(),
            state0.into_primitive(),
        );
        let s = lstm_shape(&xp, &state0);
        let (w, s0) = (values(&w_hh).into_owned(), values(&state0).into_owned());
        let (y, saved) = lstm::forward(&values(&xp), &w, &values(&b_hh), &s0, &keep, s);
        let out = tensor(y.clone(), [s.steps * s.rows, 2 * s.hidden]);
        match prep {
            OpsKind::Tracked(prep) => prep.finish((y, saved, w, s0, keep, s), out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }

    fn fast_tag_param(x: FloatTensor<Self>, slot: usize) -> FloatTensor<Self> {
        SINK.with(|s| {
            if let Some(s) = s.borrow_mut().as_mut() {
                s.slots.insert(x.id(), slot);
            }
        });
        x
    }
}
