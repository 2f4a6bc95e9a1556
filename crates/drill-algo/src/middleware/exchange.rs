//! Across processes (the Parallel runner, `drill train --parallel-workers N`):
//! [`ContextExchanger`] (transitions or rollouts and counters collector → learner, evaluation results
//! evaluator → learner), [`ModelExchanger`] (weights learner → collector and evaluator) and
//! [`FinishSync`] (one process finishing finishes them all).
//!
//! The learner's process decides when the run ends (stop value from the evaluator's
//! results, or limits) and owns the experiment folder; the others follow it. The learner may
//! be a data-parallel group (`policy.multi_gpu`): each learner has its own collectors and
//! channels (`context.K`, `model.K` for learner K > 0), and every step the learners agree
//! ([`Agreement`]) on the counters, the evaluator's results (which reach the lead) and whether
//! to stop, so that their collectives never part.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use drill_task::parallel::{PEER_JOINED, PEER_LEFT, PEER_READY};
use drill_task::{Mailbox, Middleware, OnlineRLContext, Task, TaskError, TaskHandle};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use std::cell::RefCell;

use super::roles::{Remote, Roles};
use super::{Collected, EpisodeReturns, EvalOutput, Interrupted, LastEval, task_err};
use crate::ddp::Ranks;
use crate::interrupt;
use crate::policy::Policy;

/// Event names on the bus.
const CONTEXT: &str = "context";
const EVAL: &str = "eval_output";
const MODEL: &str = "model";
const MODEL_EVAL: &str = "model_eval";
const FINISH: &str = "finish";
/// A collector joining a learner group asks every learner how many collectors it has (its
/// node id); each answers on [`loads`] `(k, live)`.
const JOINER_ASKS: &str = "joiner_asks";
/// The joiner then says which learner it feeds: `(node, k)`.
const JOINER_FEEDS: &str = "joiner_feeds";

/// How long a remote evaluator waits for the weights of the next evaluation point.
const EVAL_WAIT: Duration = Duration::from_secs(365 * 24 * 3600);

/// Learner `k`'s channel for `event` (its collectors' data, its weights): the plain name for
/// the first (or only) learner.
fn channel(event: &str, k: usize) -> String {
    match k {
        0 => event.to_string(),
        k => format!("{event}.{k}"),
    }
}

/// Where the learners answer joiner `node`'s [`JOINER_ASKS`].
fn loads(node: u32) -> String {
    format!("learner_loads.{node}")
}

/// What a collector sends the learner each step: its data `D` (DQN's [`Transitions`](super::Transitions), APPO's
/// [`Rollout`](crate::data::Rollout)) with the counters.
#[derive(Serialize, Deserialize)]
struct ContextMsg<D> {
    from: u32,
    seq: u64,
    env_steps: u64,
    episodes: u64,
    data: D,
    returns: EpisodeReturns,
}

/// The collector step the learner is answering this step (node, sequence number).
struct Answering(u32, u64);

/// Carries step data between processes (DI-engine's `ContextExchanger`); `D` is what the
/// collector puts into the ctx for the learner ([`Transitions`](super::Transitions) or a rollout). Each part is
/// switched on for the roles of this process:
/// - [`Self::send_trajectories`] (collector): this step's `D`, finished episodes
///   and env-step count go to the learner;
/// - [`Self::receive_trajectories`] (learner): waits for the next collector step and puts it
///   into the ctx (env-step count included);
/// - [`Self::send_eval`] (evaluator): this step's [`EvalOutput`] goes to the learner;
/// - [`Self::receive_eval`] (learner): evaluations that arrived go into the ctx (for
///   checkpoints and logs); one that reached the stop value finishes the run.
pub(crate) struct ContextExchanger<D> {
    send_traj: Option<(u32, String)>,
    seq: u64,
    recv_traj: Option<Mailbox<ContextMsg<D>>>,
    /// The collectors heard from so far.
    heard: BTreeSet<u32>,
    /// Collector steps received (by every learner of a group), by collector node; the lead
    /// logs them when the run ends.
    received: BTreeMap<u32, u64>,
    reported: bool,
    /// The collectors linked now, and why each that left did.
    collectors: Arc<Mutex<Collectors>>,
    send_eval: bool,
    recv_eval: Option<Mailbox<EvalOutput>>,
    /// A learner of a data-parallel group: every step agreed with the others.
    group: Option<Agreement>,
    timeout: Duration,
}

/// How the learners of a data-parallel group stay in step: a finish that another process asks
/// for (the evaluator's stop, a collector's or a signal) only sets `stop`, and each step every
/// learner brings its [`Share`] to one all-gather; they then finish together, or all train.
pub(crate) struct Agreement {
    ranks: Ranks,
    stop: Arc<AtomicBool>,
}

impl Agreement {
    /// The learners' group `ranks`; `stop` is set by [`FinishSync::agreed`].
    pub(crate) fn new(ranks: Ranks, stop: Arc<AtomicBool>) -> Self {
        Self { ranks, stop }
    }
}

/// A learner's part of a group step's agreement.
#[derive(Serialize, Deserialize, Default)]
struct Share {
    /// Collector data arrived (a step trains only if every learner has some), from this node.
    data: Option<u32>,
    env_steps: u64,
    episodes: u64,
    returns: EpisodeReturns,
    /// The evaluator's results (the lead's only: they reach it).
    evals: Vec<EvalOutput>,
    /// A stop was asked for here (the evaluator's stop value, another process's finish).
    stop: bool,
    interrupted: bool,
}

impl<D: Serialize + DeserializeOwned + Send + Sync + 'static> ContextExchanger<D> {
    /// Nothing switched on yet; waits give up after `timeout` (a lost peer ends them at once).
    pub(crate) fn new(timeout: Duration) -> Self {
        Self {
            send_traj: None,
            seq: 0,
            recv_traj: None,
            heard: BTreeSet::new(),
            received: BTreeMap::new(),
            reported: false,
            collectors: Arc::default(),
            send_eval: false,
            recv_eval: None,
            group: None,
            timeout,
        }
    }

    /// Collector side, on node `node`, feeding learner `learner` (its rank among the
    /// learners).
    pub(crate) fn send_trajectories(mut self, node: usize, learner: usize) -> Self {
        self.send_traj = Some((node as u32, channel(CONTEXT, learner)));
        self
    }

    /// Learner side (learner `k` of `learners`), one collector step per learner step from
    /// the collectors on `nodes` and any that join and choose it ([`choose_learner`]), in
    /// arrival order; listens from now on (make it before the processes' barrier). Collectors
    /// that leave or join are logged; the learner goes on with the others, and with none left
    /// waits `timeout` for one to join.
    pub(crate) fn receive_trajectories(
        mut self,
        task: &TaskHandle,
        nodes: &[usize],
        (k, learners): (usize, usize),
    ) -> Self {
        self.recv_traj = Some(Mailbox::new(task.events(), &channel(CONTEXT, k)));
        self.collectors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .live = nodes.iter().map(|&n| n as u32).collect();
        let (c, t) = (self.collectors.clone(), task.clone());
        task.on(PEER_LEFT, move |e| {
            // Collectors leave a finished run: nothing to say.
            let Ok((node, why)) = e.decode::<(u32, String)>() else {
                return;
            };
            if t.finished() {
                return;
            }
            let mut c = c.lock().unwrap_or_else(|p| p.into_inner());
            if c.live.remove(&node) {
                let left = c.live.len();
                tracing::warn!(
                    "collector node {node} left ({why}); the run goes on with {left} collector{}",
                    if left == 1 { "" } else { "s" }
                );
                c.gone.push((node, why));
            }
        });
        let c = self.collectors.clone();
        if learners <= 1 {
            // Every collector that joins is this learner's.
            task.on(PEER_JOINED, move |e| {
                if let Ok(node) = e.decode::<u32>() {
                    joined(&c, node);
                }
            });
            return self;
        }
        // A group's joiner picks its learner ([`choose_learner`]) from every learner's answer.
        let bus = task.events().clone();
        task.on(JOINER_ASKS, move |e| {
            let Ok(node) = e.decode::<u32>() else {
                return;
            };
            let live = c.lock().unwrap_or_else(|p| p.into_inner()).live.len() as u32;
            if let Err(err) = bus.emit(&loads(node), &(k as u32, live)) {
                tracing::warn!("cannot answer collector node {node}, which joins: {err}");
            }
        });
        let c = self.collectors.clone();
        task.on(JOINER_FEEDS, move |e| {
            if let Ok((node, to)) = e.decode::<(u32, u32)>()
                && to as usize == k
            {
                joined(&c, node);
            }
        });
        self
    }

    /// Evaluator side.
    pub(crate) fn send_eval(mut self) -> Self {
        self.send_eval = true;
        self
    }

    /// Learner side; listens from now on.
    pub(crate) fn receive_eval(mut self, task: &TaskHandle) -> Self {
        self.recv_eval = Some(Mailbox::new(task.events(), EVAL));
        self
    }

    /// Learner side, as one of a data-parallel group: every step is agreed with the others.
    pub(crate) fn agreed(mut self, group: Agreement) -> Self {
        self.group = Some(group);
        self
    }
}

/// A split run's collectors as the learner knows them.
#[derive(Default)]
struct Collectors {
    live: BTreeSet<u32>,
    gone: Vec<(u32, String)>,
}

/// Put the evaluator's result `eval` into `ctx` (for checkpoints and logs); whether it
/// reached the stop value.
fn apply_eval(ctx: &mut OnlineRLContext, eval: EvalOutput) -> bool {
    ctx.eval_value = Some(eval.result.mean);
    ctx.last_eval_iter = Some(eval.train_iter);
    ctx.last_eval_value = Some(eval.result.mean);
    ctx.ext.keep(LastEval(eval.clone()));
    let stop = eval.stop;
    ctx.ext.insert(eval);
    stop
}

/// Collector `node` joined and feeds this learner.
fn joined(c: &Mutex<Collectors>, node: u32) {
    if c.lock()
        .unwrap_or_else(|p| p.into_inner())
        .live
        .insert(node)
    {
        tracing::info!("collector node {node} joined the run");
    }
}

/// A collector joining the group of `remote.learners` feeds the learner with the fewest
/// collectors now (the lowest rank among equals): a learner whose collectors left gets the
/// next one. Asks them all, picks, and tells them; its learner then sends it the weights.
fn choose_learner(task: &TaskHandle, remote: &Remote) -> Result<usize, TaskError> {
    let node = remote.node as u32;
    let answers = Mailbox::<(u32, u32)>::new(task.events(), &loads(node));
    let mut live: Vec<Option<u32>> = vec![None; remote.learners.len()];
    let deadline = Instant::now() + remote.timeout;
    task.emit(JOINER_ASKS, &node)?;
    while live.iter().any(Option::is_none) {
        let left = deadline.saturating_duration_since(Instant::now());
        match answers.recv(task, left.min(Duration::from_secs(1))) {
            Ok(Some((k, n))) => {
                if let Some(slot) = live.get_mut(k as usize) {
                    *slot = Some(n);
                }
            }
            // The run ended meanwhile: so does this collector's pipeline, at once.
            Ok(None) => return Ok(0),
            // Again after a second without an answer: a learner still starting had no one
            // listening yet.
            Err(TaskError::Timeout { .. }) if !left.is_zero() => task.emit(JOINER_ASKS, &node)?,
            Err(TaskError::Timeout { .. }) => {
                let silent: Vec<String> = (live.iter().zip(&remote.learners))
                    .filter(|(n, _)| n.is_none())
                    .map(|(_, node)| format!("node {node}"))
                    .collect();
                return Err(TaskError::msg(format!(
                    "collector node {node} joins a group of {} learners, but {} did not answer within {:?}",
                    live.len(),
                    silent.join(", "),
                    remote.timeout
                )));
            }
            Err(e) => return Err(e),
        }
    }
    let (k, n) = (live.iter().enumerate())
        .map(|(k, n)| (k, n.unwrap_or(u32::MAX)))
        .min_by_key(|&(k, n)| (n, k))
        .unwrap_or((0, 0));
    task.emit(JOINER_FEEDS, &(node, k as u32))?;
    tracing::info!(
        "joined the run: feeds learner {k} (node {}), which had {n} collector{}",
        remote.learners[k],
        if n == 1 { "" } else { "s" }
    );
    Ok(k)
}

impl<D: DeserializeOwned + Send + Sync + 'static> ContextExchanger<D> {
    /// A group learner's step: the evaluator's results that reached it (the lead), its
    /// collectors' next step (a wait a requested stop or a signal cuts short), then one
    /// all-gather of every learner's [`Share`]. Every learner then holds the summed counters,
    /// every collector's returns and the lead's evaluations; the step trains if every
    /// learner has data and nobody asked to stop, else every learner finishes now.
    fn forward_agreed(
        &mut self,
        ctx: &mut OnlineRLContext,
        task: &TaskHandle,
    ) -> Result<(), TaskError> {
        let Some(group) = &self.group else {
            return Ok(());
        };
        let (ranks, asked) = (group.ranks.clone(), group.stop.clone());
        let mut mine = Share::default();
        if let Some(m) = &self.recv_eval {
            while let Some(eval) = m.try_recv()? {
                mine.stop |= eval.stop;
                mine.evals.push(eval);
            }
        }
        let msg = match (&self.recv_traj, mine.stop) {
            (Some(m), false) => self.wait_cut(m, task, &asked)?,
            _ => None,
        };
        mine.stop |= asked.load(Ordering::SeqCst);
        mine.interrupted = interrupt::requested();
        let mut data = None;
        if let Some(msg) = msg {
            self.heard_from(msg.from);
            (mine.data, mine.env_steps, mine.episodes) =
                (Some(msg.from), msg.env_steps, msg.episodes);
            mine.returns = msg.returns;
            data = Some((Answering(msg.from, msg.seq), msg.data));
        }
        let (mut stop, mut interrupted) = (false, false);
        let (mut returns, mut evals) = (Vec::new(), Vec::new());
        for s in ranks.all_gather(mine).map_err(task_err)? {
            ctx.env_step += s.env_steps;
            ctx.env_episode += s.episodes;
            stop |= s.stop || s.interrupted || s.data.is_none();
            if let Some(from) = s.data {
                *self.received.entry(from).or_default() += 1;
            }
            interrupted |= s.interrupted;
            returns.extend(s.returns.0);
            evals.extend(s.evals);
        }
        ctx.ext.insert(EpisodeReturns(returns));
        for eval in evals {
            apply_eval(ctx, eval);
        }
        if interrupted {
            ctx.ext.insert(Interrupted);
        }
        if stop {
            // Together: no learner trains this step, and every one leaves its loop after it.
            task.finish();
        } else if let Some((answering, data)) = data {
            ctx.ext.insert(answering);
            ctx.ext.insert(data);
        }
        Ok(())
    }

    /// [`Mailbox::recv`] that also returns `None` once `stop` is set or a signal came (a
    /// group learner's finish waits for the others' agreement).
    fn wait_cut(
        &self,
        m: &Mailbox<ContextMsg<D>>,
        task: &TaskHandle,
        stop: &AtomicBool,
    ) -> Result<Option<ContextMsg<D>>, TaskError> {
        let deadline = Instant::now() + self.timeout;
        loop {
            if stop.load(Ordering::SeqCst) || interrupt::requested() {
                return Ok(None);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match m.recv(task, left.min(Duration::from_millis(20))) {
                Err(TaskError::Timeout { event, .. }) if left.is_zero() => {
                    return Err(self.none_left(TaskError::Timeout {
                        event,
                        timeout: self.timeout,
                    }));
                }
                Err(TaskError::Timeout { .. }) => {}
                other => return other.map_err(|e| self.none_left(e)),
            }
        }
    }
}

impl<D> ContextExchanger<D> {
    /// Log a collector heard from for the first time, beside others.
    fn heard_from(&mut self, from: u32) {
        if self.heard.insert(from) && self.heard.len() > 1 {
            tracing::info!(
                "collector node {from} sends its data too ({} collectors heard from)",
                self.heard.len()
            );
        }
    }

    /// The learner's wait for data failed: with no collector left, say so (who left and why)
    /// rather than only that nothing came.
    fn none_left(&self, e: TaskError) -> TaskError {
        let c = self.collectors.lock().unwrap_or_else(|p| p.into_inner());
        if !matches!(e, TaskError::Timeout { .. }) || !c.live.is_empty() {
            return e;
        }
        let gone: Vec<String> = c
            .gone
            .iter()
            .map(|(n, why)| format!("node {n}: {why}"))
            .collect();
        TaskError::msg(format!(
            "no collector left ({}) and none joined within {:?} (drill train CONFIG --join starts one)",
            gone.join("; "),
            self.timeout
        ))
    }
}

impl<D: Serialize + DeserializeOwned + Send + Sync + 'static> Middleware<OnlineRLContext>
    for ContextExchanger<D>
{
    fn name(&self) -> String {
        "context_exchanger".into()
    }

    fn forward(&mut self, ctx: &mut OnlineRLContext, task: &TaskHandle) -> Result<(), TaskError> {
        if self.group.is_some() {
            return self.forward_agreed(ctx, task);
        }
        if let Some(m) = &self.recv_traj
            && let Some(msg) = m.recv(task, self.timeout).map_err(|e| self.none_left(e))?
        {
            self.heard_from(msg.from);
            *self.received.entry(msg.from).or_default() += 1;
            ctx.env_step += msg.env_steps;
            ctx.env_episode += msg.episodes;
            ctx.ext.insert(Answering(msg.from, msg.seq));
            ctx.ext.insert(msg.data);
            ctx.ext.insert(msg.returns);
        }
        if let Some(m) = &self.recv_eval {
            while let Some(eval) = m.try_recv()? {
                if apply_eval(ctx, eval) {
                    task.finish();
                    // The rest is for the next step's checkpoint and log.
                    break;
                }
            }
        }
        Ok(())
    }

    fn backward(&mut self, ctx: &mut OnlineRLContext, task: &TaskHandle) -> Result<(), TaskError> {
        let lead = self.group.as_ref().is_none_or(|g| g.ranks.rank() == 0);
        if self.recv_traj.is_some() && lead && task.finished() && !self.reported {
            self.reported = true;
            let by: Vec<String> = (self.received.iter())
                .map(|(node, n)| format!("node {node}: {n}"))
                .collect();
            tracing::info!("collector steps received, by collector: {}", by.join(", "));
        }
        if let Some((from, to)) = &self.send_traj
            && let Some(data) = ctx.ext.remove::<D>()
        {
            let collected = ctx.ext.remove::<Collected>().unwrap_or_default();
            let msg = ContextMsg {
                from: *from,
                seq: self.seq,
                env_steps: collected.env_steps,
                episodes: collected.episodes,
                data,
                returns: ctx.ext.remove::<EpisodeReturns>().unwrap_or_default(),
            };
            task.emit(to, &msg)?;
            self.seq += 1;
        }
        if self.send_eval
            && let Some(eval) = ctx.ext.get::<EvalOutput>()
        {
            task.emit(EVAL, eval)?;
        }
        Ok(())
    }
}

/// Whether a remote evaluator gets the weights of train iteration `iter` (and the learner
/// keeps a snapshot of them): a multiple of `freq`, or the first iteration past one since
/// `prev`, the iteration of the learner's step before (an update of many gradient steps
/// may jump over the multiples).
pub(crate) fn eval_point(iter: u64, prev: Option<u64>, freq: u64) -> bool {
    iter.is_multiple_of(freq) || prev.is_some_and(|p| iter / freq > p / freq)
}

/// The learner's weights as sent to the other processes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ModelUpdate {
    /// Updates done when sent.
    pub train_iter: u64,
    /// Env steps the learner had received.
    pub env_step: u64,
    /// Flat parameters in visit order (empty: unchanged since the last update).
    pub params: Vec<f32>,
    /// The collector step this update answers: (node, its sequence number).
    pub answered: Option<(u32, u64)>,
}

enum Side {
    Send {
        /// The weights last sent to the collectors, for those that join (none before the
        /// learner's first step: its collectors act with the initial weights).
        newest: Arc<Mutex<Option<ModelUpdate>>>,
        collectors: bool,
        /// Which learner this is, of how many: its collectors' channel, and whether it (the
        /// lead, 0) feeds the evaluator.
        learner: (usize, usize),
        every: u64,
        steps: u64,
        eval_freq: u64,
        sent_iter: Option<u64>,
        eval_iter: Option<u64>,
        prev_iter: u64,
    },
    Collector {
        models: Mailbox<ModelUpdate>,
        node: u32,
        staleness: u64,
        sent: u64,
        answered: u64,
        /// Joined the running job: wait for the learner's weights before the first step.
        joined: bool,
    },
    Evaluator {
        models: Mailbox<ModelUpdate>,
    },
}

/// What a group learner heard of a collector that joins.
#[derive(Clone, Copy, PartialEq)]
enum Heard {
    /// It listens ([`PEER_READY`]).
    Ready,
    /// It chose this learner ([`JOINER_FEEDS`]).
    Feeds,
    /// It chose another learner.
    Elsewhere,
}

/// `now` heard of joiner `node`: with both that it listens and that it chose this learner,
/// `send` it the weights; a joiner is kept only until both of its events came.
fn heard(seen: &Mutex<BTreeMap<u32, Heard>>, node: u32, now: Heard, send: &dyn Fn(u32)) {
    let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
    match (seen.remove(&node), now) {
        (Some(Heard::Ready), Heard::Feeds) | (Some(Heard::Feeds), Heard::Ready) => {
            drop(seen);
            send(node);
        }
        (Some(Heard::Ready), Heard::Elsewhere) | (Some(Heard::Elsewhere), Heard::Ready) => {}
        (_, now) => {
            seen.insert(node, now);
        }
    }
}

/// Moves weights from the learner to the processes that act (DI-engine's `ModelExchanger`):
/// the learner's [`Policy::weights`] into the others' [`Policy::load_weights`].
pub(crate) struct ModelExchanger<'a, P> {
    side: Side,
    policy: &'a RefCell<P>,
    timeout: Duration,
}

impl<'a, P: Policy> ModelExchanger<'a, P> {
    /// Learner side, after the learner: every step sends the collector (when `collectors`:
    /// it runs in another process) an update, with the weights when they changed, and the
    /// evaluator the weights at every `eval_freq`-th iteration ([`eval_point`]; the learner
    /// starts at iteration `start_iter`).
    pub(crate) fn sender(
        eval_freq: u64,
        start_iter: u64,
        collectors: bool,
        policy: &'a RefCell<P>,
        timeout: Duration,
    ) -> Self {
        Self {
            policy,
            side: Side::Send {
                newest: Arc::default(),
                collectors,
                learner: (0, 1),
                every: 1,
                steps: 0,
                eval_freq: eval_freq.max(1),
                sent_iter: None,
                eval_iter: None,
                prev_iter: start_iter,
            },
            timeout,
        }
    }

    /// Sender side: a collector that joins the running job is sent the newest weights once it
    /// listens ([`PEER_READY`]) and, in a group, has chosen this learner ([`JOINER_FEEDS`]),
    /// at once (from the thread that hears it: the learner may be waiting for rollouts, and
    /// the newcomer for weights); before the learner's first step, an update without weights
    /// (act with the initial ones, as the run's own collectors do).
    pub(crate) fn take_joiners(self, task: &TaskHandle, start_iter: u64) -> Self {
        if let Side::Send {
            newest,
            learner: (k, learners),
            ..
        } = &self.side
        {
            let (newest, bus) = (newest.clone(), task.events().clone());
            let (k, learners, to) = (*k, *learners, channel(MODEL, *k));
            let send = Arc::new(move |node: u32| {
                let newest = newest.lock().unwrap_or_else(|p| p.into_inner());
                let none = ModelUpdate {
                    train_iter: start_iter,
                    env_step: 0,
                    params: Vec::new(),
                    answered: None,
                };
                if let Err(err) = bus.emit(&to, newest.as_ref().unwrap_or(&none)) {
                    tracing::warn!("cannot send collector node {node} its weights: {err}");
                }
            });
            if learners <= 1 {
                task.on(PEER_READY, move |e| {
                    send(e.decode::<u32>().unwrap_or(u32::MAX))
                });
                return self;
            }
            // Either may come first (they are separate events); the second sends.
            let seen: Arc<Mutex<BTreeMap<u32, Heard>>> = Arc::default();
            let (s, first) = (send.clone(), seen.clone());
            task.on(PEER_READY, move |e| {
                if let Ok(node) = e.decode::<u32>() {
                    heard(&first, node, Heard::Ready, &*s);
                }
            });
            task.on(JOINER_FEEDS, move |e| {
                if let Ok((node, to)) = e.decode::<(u32, u32)>() {
                    let now = match to as usize == k {
                        true => Heard::Feeds,
                        false => Heard::Elsewhere,
                    };
                    heard(&seen, node, now, &*send);
                }
            });
        }
        self
    }

    /// Sender side: learner `k` of a data-parallel group of `learners`: its own collectors'
    /// channel; only the lead (`k = 0`) sends the evaluator weights.
    pub(crate) fn of_learner(mut self, k: usize, learners: usize) -> Self {
        if let Side::Send { learner, .. } = &mut self.side {
            *learner = (k, learners.max(1));
        }
        self
    }

    /// The periodic variant (sender side): the collector gets new weights only every `k`
    /// steps (the updates in between carry none, so its staleness is counted alike); for
    /// large models on slow links. The evaluator's weights are unaffected.
    pub(crate) fn every(mut self, k: u64) -> Self {
        if let Side::Send { every, .. } = &mut self.side {
            *every = k.max(1);
        }
        self
    }

    /// Collector side (node `node`, fed by learner `learner`), before the collector: loads the
    /// newest weights; a collector more than `staleness` of its steps ahead of the learner's
    /// answers to them waits (0: lock-step, every step acts with the weights trained on
    /// everything it collected before).
    pub(crate) fn collector(
        task: &TaskHandle,
        (node, learner): (usize, usize),
        staleness: u64,
        policy: &'a RefCell<P>,
        timeout: Duration,
    ) -> Self {
        Self {
            policy,
            side: Side::Collector {
                models: Mailbox::new(task.events(), &channel(MODEL, learner)),
                node: node as u32,
                staleness,
                sent: 0,
                answered: 0,
                joined: task.match_labels(&["joined"]).unwrap_or(false),
            },
            timeout,
        }
    }

    /// Evaluator side, before the evaluator: waits for the weights of the next `eval_freq`-th
    /// iteration and sets `train_iter` / `env_step` to theirs.
    pub(crate) fn evaluator(task: &TaskHandle, policy: &'a RefCell<P>, timeout: Duration) -> Self {
        Self {
            policy,
            side: Side::Evaluator {
                models: Mailbox::new(task.events(), MODEL_EVAL),
            },
            timeout,
        }
    }
}

impl<P: Policy> Middleware<OnlineRLContext> for ModelExchanger<'_, P> {
    fn name(&self) -> String {
        "model_exchanger".into()
    }

    fn forward(&mut self, ctx: &mut OnlineRLContext, task: &TaskHandle) -> Result<(), TaskError> {
        match &mut self.side {
            Side::Send {
                newest,
                collectors,
                learner: (k, _),
                every,
                steps,
                eval_freq,
                sent_iter,
                eval_iter,
                prev_iter,
            } => {
                if task.finished() {
                    return Ok(());
                }
                let iter = ctx.train_iter;
                let due = (*steps).is_multiple_of(*every);
                *steps += 1;
                let changed = *sent_iter != Some(iter) && due;
                let for_eval = *k == 0
                    && eval_point(iter, Some(*prev_iter), *eval_freq)
                    && *eval_iter != Some(iter);
                *prev_iter = iter;
                let weights = if (changed && *collectors) || for_eval {
                    self.policy.borrow().weights()
                } else {
                    Vec::new()
                };
                let mut update = ModelUpdate {
                    train_iter: iter,
                    env_step: ctx.env_step,
                    params: weights,
                    answered: ctx.ext.get::<Answering>().map(|a| (a.0, a.1)),
                };
                if for_eval {
                    task.emit(MODEL_EVAL, &update)?;
                    *eval_iter = Some(iter);
                }
                if *collectors {
                    if !changed {
                        update.params.clear();
                    }
                    task.emit(&channel(MODEL, *k), &update)?;
                    if changed {
                        update.answered = None;
                        *newest.lock().unwrap_or_else(|p| p.into_inner()) = Some(update);
                    }
                }
                if changed {
                    *sent_iter = Some(iter);
                }
            }
            Side::Collector {
                models,
                node,
                staleness,
                sent,
                answered,
                joined,
            } => {
                let me = *node;
                let take = |u: ModelUpdate, newest: &mut Option<ModelUpdate>, acked: &mut u64| {
                    if let Some((n, seq)) = u.answered
                        && n == me
                    {
                        *acked = (*acked).max(seq + 1);
                    }
                    if !u.params.is_empty() {
                        *newest = Some(u);
                    }
                };
                let (mut newest, mut heard) = (None, false);
                while let Some(u) = models.try_recv()? {
                    take(u, &mut newest, answered);
                    heard = true;
                }
                // Joined a running job: its first rollout is collected with the learner's
                // weights (sent when it said it listens), not the initial ones.
                while *joined && !heard {
                    match models.recv(task, self.timeout)? {
                        Some(u) => take(u, &mut newest, answered),
                        None => return Ok(()),
                    }
                    heard = true;
                }
                *joined = false;
                while *sent > *answered + *staleness {
                    match models.recv(task, self.timeout)? {
                        Some(u) => take(u, &mut newest, answered),
                        None => return Ok(()),
                    }
                }
                if let Some(u) = newest {
                    self.policy.borrow_mut().load_weights(&u.params);
                    ctx.train_iter = u.train_iter;
                    // A learner resumed from a checkpoint is ahead: continue its schedule.
                    ctx.env_step = ctx.env_step.max(u.env_step);
                }
                *sent += 1;
            }
            Side::Evaluator { models } => {
                if let Some(u) = models.recv(task, self.timeout)? {
                    self.policy.borrow_mut().load_weights(&u.params);
                    ctx.train_iter = u.train_iter;
                    ctx.env_step = u.env_step;
                }
            }
        }
        Ok(())
    }
}

/// Register first: when this process finishes, every other process does too; when another
/// finishes, this one does (the wait it may be in returns).
pub(crate) struct FinishSync {
    remote: Arc<AtomicBool>,
    announced: bool,
}

impl FinishSync {
    /// Listen for the others' finish from now on.
    pub(crate) fn new(task: &TaskHandle) -> Self {
        let remote = Arc::new(AtomicBool::new(false));
        let (r, h) = (remote.clone(), task.clone());
        task.on(FINISH, move |_| {
            r.store(true, Ordering::SeqCst);
            h.finish();
        });
        Self {
            remote,
            announced: false,
        }
    }

    /// A learner of a data-parallel group: another process's finish only sets `asked`; the
    /// learners finish together at their next agreement ([`Agreement`]).
    pub(crate) fn agreed(task: &TaskHandle, asked: Arc<AtomicBool>) -> Self {
        let remote = Arc::new(AtomicBool::new(false));
        let r = remote.clone();
        task.on(FINISH, move |_| {
            r.store(true, Ordering::SeqCst);
            asked.store(true, Ordering::SeqCst);
        });
        Self {
            remote,
            announced: false,
        }
    }
}

impl Middleware<OnlineRLContext> for FinishSync {
    fn name(&self) -> String {
        "finish_sync".into()
    }

    fn forward(&mut self, _: &mut OnlineRLContext, _: &TaskHandle) -> Result<(), TaskError> {
        Ok(())
    }

    fn backward(&mut self, _: &mut OnlineRLContext, task: &TaskHandle) -> Result<(), TaskError> {
        if task.finished() && !self.announced && !self.remote.load(Ordering::SeqCst) {
            self.announced = true;
            task.emit(FINISH, &())?;
        }
        Ok(())
    }
}

/// The learner's sender of a split run (after the learner): weights to the collectors when
/// they run elsewhere (every `task.model_every` steps, and at once to one that joins), and to a
/// remote evaluator at every `eval_freq`-th iteration from `start_iter` on.
pub(crate) fn learner_sender<'a, P: Policy>(
    handle: &TaskHandle,
    roles: &Roles,
    remote: &Remote,
    (eval_freq, start_iter): (u64, u64),
    policy: &'a RefCell<P>,
) -> ModelExchanger<'a, P> {
    let collectors = roles.collector_elsewhere();
    let k = remote.learner_rank().unwrap_or(0);
    ModelExchanger::sender(eval_freq, start_iter, collectors, policy, remote.timeout)
        .of_learner(k, remote.learners.len())
        .every(remote.model_every)
        .take_joiners(handle, start_iter)
}

/// A split run's exchangers (DI-engine's `ContextExchanger` and `ModelExchanger`) for the
/// roles of this process: the learner receives the collectors' data `D` and the evaluator's
/// results from the roles that run elsewhere; a collector or evaluator sends them and
/// receives the learner's weights into `policy`. A learner of a data-parallel group (`ranks`,
/// the learners' group) receives from its own collectors and agrees every step with the
/// others; only the lead hears the evaluator.
pub(crate) fn use_exchangers<'a, D, P>(
    task: &mut Task<'a, OnlineRLContext>,
    handle: &TaskHandle,
    (roles, ranks): (&Roles, &Ranks),
    remote: &Remote,
    policy: &'a RefCell<P>,
) -> Result<(), TaskError>
where
    D: Serialize + DeserializeOwned + Send + Sync + 'static,
    P: Policy,
{
    let timeout = remote.timeout;
    let grouped = roles.learner && ranks.world() > 1;
    let asked = Arc::new(AtomicBool::new(false));
    task.use_mw(match grouped {
        true => FinishSync::agreed(handle, asked.clone()),
        false => FinishSync::new(handle),
    });
    let mut x = ContextExchanger::<D>::new(timeout);
    if roles.learner {
        let k = remote.learner_rank().unwrap_or(0);
        if roles.collector_elsewhere() {
            let (mine, n) = (remote.collectors_of(k), remote.learners.len());
            x = x.receive_trajectories(handle, &mine, (k, n));
        }
        if roles.evaluator_elsewhere() && k == 0 {
            x = x.receive_eval(handle);
        }
        if grouped {
            x = x.agreed(Agreement::new(ranks.clone(), asked));
        }
    } else {
        // A collector waits for its learner longer than a learner waits for its collectors
        // (a learner, or a group's learner, left without any), so that the learner's own
        // error names the cause first.
        let learner_wait = 2 * timeout;
        if roles.collector {
            let joins = handle.match_labels(&["joined"]).unwrap_or(false);
            let learner = match remote.learners.len() {
                n if joins && n > 1 => choose_learner(handle, remote)?,
                _ => remote.learner_of(remote.collector_index),
            };
            x = x.send_trajectories(remote.node, learner);
            task.use_mw(ModelExchanger::collector(
                handle,
                (remote.node, learner),
                remote.model_staleness,
                policy,
                learner_wait,
            ));
        }
        if roles.evaluator {
            // However long `eval_freq` iterations take (a learner that fails or is lost ends
            // the wait at once; the learner's own waits are bounded).
            x = x.send_eval();
            task.use_mw(ModelExchanger::evaluator(handle, policy, EVAL_WAIT));
        }
    }
    task.use_mw(x);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::middleware::Transitions;
    use crate::middleware::probe::Probe;
    use drill_env::{ActionBuf, ObsBuf};
    use drill_task::{Context, Task, TaskHandle};

    fn collector_step(task: &mut Task<'_, OnlineRLContext>) {
        task.step().unwrap();
        task.ctx_mut().renew();
    }

    #[test]
    fn trajectories_and_counters_reach_the_learner_in_order() {
        let bus_owner = Task::<OnlineRLContext>::new();
        let h = bus_owner.handle().clone();
        let mut collector = Task::<OnlineRLContext>::with_handle(h.clone());
        collector.use_mw(
            ContextExchanger::<Transitions>::new(Duration::from_secs(1)).send_trajectories(3, 0),
        );
        collector.use_fn("fake_collector", |ctx, _| {
            let k = ctx.env_step as f32;
            ctx.env_step += 8;
            ctx.env_episode += 1;
            ctx.ext.insert(Collected {
                env_steps: 8,
                episodes: 1,
            });
            ctx.ext.insert(Transitions {
                obs_dim: 1,
                obs: ObsBuf::F32(vec![k]),
                actions: ActionBuf::Discrete(vec![1]),
                ..Transitions::default()
            });
            ctx.ext
                .insert(EpisodeReturns(vec![(k.into(), ctx.env_step)]));
            Ok(())
        });
        let mut learner = Task::<OnlineRLContext>::with_handle(h.clone());
        learner.use_mw(
            ContextExchanger::<Transitions>::new(Duration::from_millis(50)).receive_trajectories(
                &h,
                &[3],
                (0, 1),
            ),
        );
        collector_step(&mut collector);
        collector_step(&mut collector);
        for expect in [0.0, 8.0] {
            learner.step().unwrap();
            let ctx = learner.ctx_mut();
            assert_eq!(
                ctx.ext.get::<Transitions>().unwrap().obs,
                ObsBuf::F32(vec![expect])
            );
            assert_eq!(
                ctx.ext.get::<EpisodeReturns>().unwrap().0[0].0,
                f64::from(expect)
            );
            ctx.renew();
        }
        assert_eq!((learner.ctx().env_step, learner.ctx().env_episode), (16, 2));
        let e = learner.step().unwrap_err().to_string();
        assert!(
            e.contains("context_exchanger") && e.contains("\"context\""),
            "{e}"
        );
    }

    /// A collector process's pipeline on `h`: weights in, a fake collection, context out.
    fn fake_collector<'a>(
        h: &TaskHandle,
        node: usize,
        staleness: u64,
        probe: &'a RefCell<Probe>,
    ) -> Task<'a, OnlineRLContext> {
        let mut c = Task::<OnlineRLContext>::with_handle(h.clone());
        c.use_mw(ModelExchanger::collector(
            h,
            (node, 0),
            staleness,
            probe,
            Duration::from_millis(30),
        ));
        c.use_fn("fake_collector", |ctx, _| {
            ctx.ext.insert(Transitions::default());
            Ok(())
        });
        c.use_mw(
            ContextExchanger::<Transitions>::new(Duration::from_secs(1)).send_trajectories(node, 0),
        );
        c
    }

    /// The learner process's pipeline on `h`: contexts in, a fake update, weights out.
    fn fake_learner(h: &TaskHandle) -> Task<'static, OnlineRLContext> {
        let mut l = Task::<OnlineRLContext>::with_handle(h.clone());
        l.use_mw(
            ContextExchanger::<Transitions>::new(Duration::from_millis(30)).receive_trajectories(
                h,
                &[1, 2],
                (0, 1),
            ),
        );
        l.use_fn("fake_learner", |ctx, _| {
            ctx.train_iter += 1;
            Ok(())
        });
        let probe = Box::leak(Box::new(RefCell::new(Probe::new(1, 0))));
        l.use_mw(ModelExchanger::sender(
            1000,
            0,
            true,
            probe,
            Duration::from_secs(1),
        ));
        l
    }

    #[test]
    fn a_collector_runs_at_most_staleness_steps_ahead_of_the_answers_to_it() {
        for staleness in [0u64, 1] {
            let owner = Task::<OnlineRLContext>::new();
            let h = owner.handle().clone();
            let probe = RefCell::new(Probe::new(1, 0));
            let mut collector = fake_collector(&h, 1, staleness, &probe);
            let mut learner = fake_learner(&h);
            for _ in 0..=staleness {
                collector_step(&mut collector);
            }
            let e = collector.step().unwrap_err().to_string();
            assert!(e.contains("\"model\""), "staleness {staleness}: {e}");
            learner.step().unwrap();
            collector_step(&mut collector);
            assert_eq!(
                probe.borrow().loaded,
                [1.0],
                "the newest weights are loaded"
            );
            assert_eq!(collector.ctx().train_iter, 1);
        }
    }

    #[test]
    fn with_two_collectors_each_waits_for_the_answer_to_its_own_step() {
        let owner = Task::<OnlineRLContext>::new();
        let h = owner.handle().clone();
        let (pa, pb) = (
            RefCell::new(Probe::new(1, 0)),
            RefCell::new(Probe::new(1, 0)),
        );
        let mut a = fake_collector(&h, 1, 0, &pa);
        let mut b = fake_collector(&h, 2, 0, &pb);
        let mut learner = fake_learner(&h);
        collector_step(&mut a);
        collector_step(&mut b);
        learner.step().unwrap();
        learner.ctx_mut().renew();
        collector_step(&mut a);
        let e = b.step().unwrap_err().to_string();
        assert!(e.contains("\"model\""), "b's step is not answered yet: {e}");
        learner.step().unwrap();
        collector_step(&mut b);
        let (la, lb) = (&pa.borrow().loaded, &pb.borrow().loaded);
        assert_eq!((la.len(), lb.len()), (1, 1));
        assert_eq!(lb[0], 2.0, "b loads the newest weights");
    }

    #[test]
    fn the_periodic_variant_sends_weights_every_k_steps() {
        let owner = Task::<OnlineRLContext>::new();
        let h = owner.handle().clone();
        let got = Mailbox::<ModelUpdate>::new(h.events(), MODEL);
        let probe = RefCell::new(Probe::new(1, 0));
        let mut learner = Task::<OnlineRLContext>::with_handle(h.clone());
        learner.use_fn("fake_learner", |ctx, _| {
            ctx.train_iter += 1;
            Ok(())
        });
        let sender = ModelExchanger::sender(1000, 0, true, &probe, Duration::from_secs(1));
        learner.use_mw(sender.every(3));
        learner.run(Some(7)).unwrap();
        let with: Vec<bool> = std::iter::from_fn(|| got.try_recv().unwrap())
            .map(|u| !u.params.is_empty())
            .collect();
        assert_eq!(with, [true, false, false, true, false, false, true]);
    }

    /// Learner `k`'s collector data at a step: env steps, and the returns of episodes ended.
    type Feed = fn(usize, usize) -> Option<(u64, Vec<(f64, u64)>)>;
    /// What a learner holds after a step: env steps, returns, data, finished, last evaluation.
    type Seen = (u64, usize, bool, bool, Option<f64>);

    /// Two learners of one data-parallel group, each in a thread with its own bus (as in its
    /// own process), on a real two-rank group: `feed` puts this step's collector data on
    /// learner `k`'s channel (env steps, returns) and `finish` another process's finish;
    /// returns, per step, the learner's env-step count, returns seen, whether it trains
    /// (data in the context), whether it finished and the evaluation it holds.
    fn learner_group(feed: Feed, finish: fn(usize, usize) -> bool, steps: usize) -> Vec<Vec<Seen>> {
        use drill_comm::{BackendKind, InitInfo, InitOptions, ProcessGroup};
        let port = drill_comm::spawn::free_port();
        let learners: Vec<_> = (0..2)
            .map(|k| {
                std::thread::spawn(move || {
                    let mut info = InitInfo::explicit(k, 2, "127.0.0.1", port);
                    info.token = Some("learner-group-test".into());
                    let pg = ProcessGroup::init(InitOptions {
                        backend: Some(BackendKind::Embedded),
                        shm: Some(false),
                        info: Some(info),
                        ..InitOptions::default()
                    })
                    .unwrap();
                    let ranks = Ranks::new(Some(pg));
                    let owner = Task::<OnlineRLContext>::new();
                    let h = owner.handle().clone();
                    let asked = Arc::new(AtomicBool::new(false));
                    let mut learner = Task::<OnlineRLContext>::with_handle(h.clone());
                    learner.use_mw(FinishSync::agreed(&h, asked.clone()));
                    let mut x = ContextExchanger::<Transitions>::new(Duration::from_millis(300))
                        .receive_trajectories(&h, &[10 + k], (k, 2));
                    if k == 0 {
                        x = x.receive_eval(&h);
                    }
                    learner.use_mw(x.agreed(Agreement::new(ranks, asked)));
                    let mut seen = Vec::new();
                    for step in 0..steps {
                        if let Some((env_steps, returns)) = feed(k, step) {
                            let msg = ContextMsg {
                                from: (10 + k) as u32,
                                seq: step as u64,
                                env_steps,
                                episodes: returns.len() as u64,
                                data: Transitions::default(),
                                returns: EpisodeReturns(returns),
                            };
                            h.emit(&channel(CONTEXT, k), &msg).unwrap();
                        }
                        if finish(k, step) {
                            h.emit(FINISH, &()).unwrap();
                        }
                        if k == 0 && step == 0 {
                            let result = crate::eval::EvalResult {
                                mean: 7.0,
                                std: 0.0,
                                returns: vec![7.0],
                            };
                            let eval = EvalOutput {
                                train_iter: 0,
                                env_step: 0,
                                result,
                                stop: false,
                            };
                            h.emit(EVAL, &eval).unwrap();
                        }
                        learner.step().unwrap();
                        let ctx = learner.ctx_mut();
                        let returns = ctx.ext.get::<EpisodeReturns>().map_or(0, |r| r.0.len());
                        let trains = ctx.ext.get::<Transitions>().is_some();
                        let done = h.finished();
                        seen.push((ctx.env_step, returns, trains, done, ctx.last_eval_value));
                        ctx.renew();
                        if done {
                            break;
                        }
                    }
                    seen
                })
            })
            .collect();
        learners.into_iter().map(|t| t.join().unwrap()).collect()
    }

    /// Each learner hears only its own collectors, yet every learner holds the summed counters,
    /// every collector's returns and the lead's evaluation; a finish asked of one learner (here
    /// from another process, while the other has data) ends the same step on both, with
    /// neither training on it.
    #[test]
    fn a_learner_group_sums_its_counters_and_finishes_together() {
        let feed = |k: usize, step: usize| match (k, step) {
            (0, _) => Some((8, vec![])),
            (1, 0) => Some((16, vec![(1.0, 16)])),
            _ => None,
        };
        let seen = learner_group(feed, |k, step| k == 1 && step == 1, 5);
        for (k, s) in seen.iter().enumerate() {
            assert_eq!(
                s,
                &[
                    (24, 1, true, false, Some(7.0)),
                    (32, 0, false, true, Some(7.0))
                ],
                "learner {k}"
            );
        }
    }

    #[test]
    fn one_finish_finishes_the_others() {
        let owner = Task::<OnlineRLContext>::new();
        let h = owner.handle().clone();
        let mut a = Task::<OnlineRLContext>::with_handle(h.clone());
        a.use_mw(FinishSync::new(&h));
        let seen = Arc::new(AtomicBool::new(false));
        let s = seen.clone();
        h.on(FINISH, move |_| s.store(true, Ordering::SeqCst));
        a.use_fn("stop", |_, t| {
            t.finish();
            Ok(())
        });
        a.run(None).unwrap();
        assert!(seen.load(Ordering::SeqCst), "finish announced");
    }

    #[test]
    fn a_joiner_is_sent_its_weights_once_whichever_it_says_first() {
        let sent = std::cell::RefCell::new(Vec::new());
        let send = |node: u32| sent.borrow_mut().push(node);
        let seen = Mutex::default();
        heard(&seen, 6, Heard::Ready, &send);
        heard(&seen, 7, Heard::Feeds, &send);
        assert!(sent.borrow().is_empty(), "neither has said both yet");
        heard(&seen, 6, Heard::Ready, &send);
        assert!(sent.borrow().is_empty(), "the same twice is not both");
        heard(&seen, 6, Heard::Feeds, &send);
        heard(&seen, 7, Heard::Ready, &send);
        // Another learner's joiners, either way round.
        heard(&seen, 8, Heard::Elsewhere, &send);
        heard(&seen, 9, Heard::Ready, &send);
        heard(&seen, 8, Heard::Ready, &send);
        heard(&seen, 9, Heard::Elsewhere, &send);
        assert_eq!(*sent.borrow(), [6, 7]);
        assert!(
            seen.lock().unwrap().is_empty(),
            "nothing kept once both came"
        );
    }

    /// A joiner asks both learners of a group on one bus (learner 0 with 2 collectors,
    /// learner 1 with 1) and feeds learner 1, which alone hears it joined; with learner 1
    /// silent, the joiner's error names it; one that starts listening late is asked again.
    #[test]
    fn a_joiner_feeds_the_learner_with_the_fewest_collectors() {
        let owner = Task::<OnlineRLContext>::new();
        let h = owner.handle().clone();
        let joiner = || Remote {
            node: 20,
            collector_index: 20,
            collectors: 3,
            collector_nodes: vec![10, 11, 12],
            learners: vec![1, 2],
            model_staleness: 0,
            model_every: 1,
            timeout: Duration::from_millis(300),
        };
        let zero = ContextExchanger::<Transitions>::new(Duration::from_secs(1))
            .receive_trajectories(&h, &[10, 12], (0, 2));
        let err = choose_learner(&h, &joiner()).unwrap_err().to_string();
        assert!(
            err.contains(
                "collector node 20 joins a group of 2 learners, but node 2 did not answer"
            ),
            "{err}"
        );
        // Learner 1 listens only after the first question: asked again, it answers.
        let late =
            std::thread::spawn({
                let h = h.clone();
                move || {
                    std::thread::sleep(Duration::from_millis(300));
                    ContextExchanger::<Transitions>::new(Duration::from_secs(1))
                        .receive_trajectories(&h, &[11], (1, 2))
                }
            });
        let patient = Remote {
            timeout: Duration::from_secs(5),
            ..joiner()
        };
        assert_eq!(choose_learner(&h, &patient).unwrap(), 1);
        let one = late.join().unwrap();
        let live = |x: &ContextExchanger<Transitions>| x.collectors.lock().unwrap().live.clone();
        assert_eq!(live(&zero), [10, 12].into());
        assert_eq!(live(&one), [11, 20].into());
        // Now even, the next one feeds the lower rank.
        assert_eq!(
            choose_learner(
                &h,
                &Remote {
                    node: 21,
                    ..joiner()
                }
            )
            .unwrap(),
            0
        );
    }
}
