//! Per-algorithm hyper-parameters: the `[policy]` table and its sub-tables. Each field's doc is
//! the reference for its key; defaults follow DI-engine's where it has one.

use serde::{Deserialize, Serialize};

use crate::check::{Checker, MAX_BATCH, MAX_WIDTH};

/// An observation shape as DI-engine writes it: a number (`obs_shape = 4`) or a list
/// (`obs_shape = [4, 84, 84]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Shape {
    /// A flat vector of this many values.
    Flat(usize),
    /// A shape, e.g. `[4, 84, 84]` (stacked frames, channels first).
    Dims(Vec<usize>),
}

impl Shape {
    /// The dimensions (`[n]` for a number).
    pub fn dims(&self) -> Vec<usize> {
        match self {
            Shape::Flat(n) => vec![*n],
            Shape::Dims(d) => d.clone(),
        }
    }
}

/// Which convolutional encoder a DQN builds for image observations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ConvKind {
    /// DI-engine's `ConvEncoder` from `encoder_hidden_size_list` (e.g. `[128, 128, 512]`).
    #[default]
    Ding,
    /// The Nature-DQN trunk (32-64-64 channels, 512 features); ignores the hidden sizes.
    Nature,
}

/// `[policy.eval]`: evaluation schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[derive(Default)]
pub struct EvalConfig {
    /// `[policy.eval.evaluator]`.
    pub evaluator: EvaluatorConfig,
}

/// `[policy.eval.evaluator]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EvaluatorConfig {
    /// Evaluate every this many train iterations (and once before training).
    pub eval_freq: u64,
}

impl Default for EvaluatorConfig {
    fn default() -> Self {
        Self { eval_freq: 1000 }
    }
}

/// `[policy.model]` for DQN: an encoder (an MLP for vectors, convolutions for frames) and a
/// (dueling) Q head.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DqnModel {
    /// Observation shape (`4`, or `[4, 84, 84]` for frames); taken from the environment when
    /// omitted (must match if given).
    pub obs_shape: Option<Shape>,
    /// Number of actions; taken from the environment when omitted (must match if given).
    pub action_shape: Option<usize>,
    /// Vectors: hidden layer sizes of the encoder MLP (ReLU after each). Frames: the three
    /// convolutions' channels, the last also the feature size (DI-engine's Atari:
    /// `[128, 128, 512]`).
    pub encoder_hidden_size_list: Vec<usize>,
    /// Dueling head: `Q = V + A - mean(A)`.
    pub dueling: bool,
    /// Frames: `ding` (DI-engine's ConvEncoder) or `nature` (the Nature-DQN trunk).
    pub encoder: ConvKind,
}

impl Default for DqnModel {
    fn default() -> Self {
        Self {
            obs_shape: None,
            action_shape: None,
            encoder_hidden_size_list: vec![128, 128, 64],
            dueling: true,
            encoder: ConvKind::Ding,
        }
    }
}

/// `[policy.learn]` for DQN.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DqnLearn {
    /// Gradient updates after each collect.
    pub update_per_collect: usize,
    /// Transitions per update.
    pub batch_size: usize,
    /// Adam learning rate.
    pub learning_rate: f64,
    /// Hard target update: copy the online net every this many train iterations.
    pub target_update_freq: u64,
    /// Soft target update instead: `target = theta * online + (1 - theta) * target` every
    /// iteration. Omit for hard updates.
    pub target_theta: Option<f64>,
    /// Treat terminal transitions as non-terminal (DI-engine's `ignore_done`).
    pub ignore_done: bool,
    /// Do not update before the buffer holds this many transitions (at least `batch_size`).
    pub learning_starts: usize,
}

impl Default for DqnLearn {
    fn default() -> Self {
        Self {
            update_per_collect: 3,
            batch_size: 64,
            learning_rate: 1e-3,
            target_update_freq: 100,
            target_theta: None,
            ignore_done: false,
            learning_starts: 0,
        }
    }
}

/// `[policy.collect]` for DQN.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DqnCollect {
    /// Transitions collected (over all collector envs) before each round of updates.
    pub n_sample: usize,
    /// Trajectory unroll length; DQN uses single transitions (1).
    pub unroll_len: usize,
}

impl Default for DqnCollect {
    fn default() -> Self {
        Self {
            n_sample: 8,
            unroll_len: 1,
        }
    }
}

/// `[policy.other.eps]`: epsilon-greedy exploration, driven by collected env steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EpsConfig {
    /// `exp`: `end + (start - end) * exp(-t / decay)` (DI-engine); `linear`: from start to end
    /// over `decay` steps.
    #[serde(rename = "type")]
    pub kind: EpsKind,
    /// Epsilon at step 0.
    pub start: f64,
    /// Final epsilon.
    pub end: f64,
    /// Decay constant in env steps.
    pub decay: f64,
}

/// The shape of the epsilon schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EpsKind {
    /// Exponential decay.
    Exp,
    /// Linear decay, then constant.
    Linear,
}

impl Default for EpsConfig {
    fn default() -> Self {
        Self {
            kind: EpsKind::Exp,
            start: 0.95,
            end: 0.1,
            decay: 10000.0,
        }
    }
}

/// `[policy.other.replay_buffer]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReplayBufferConfig {
    /// Capacity in transitions (oldest overwritten first).
    pub replay_buffer_size: usize,
    /// Prioritized replay (proportional, with importance-sampling weights).
    pub priority: bool,
    /// Priority exponent alpha.
    pub priority_alpha: f64,
    /// Importance-sampling exponent beta.
    pub priority_beta: f64,
}

impl Default for ReplayBufferConfig {
    fn default() -> Self {
        Self {
            replay_buffer_size: 10000,
            priority: false,
            priority_alpha: 0.6,
            priority_beta: 0.4,
        }
    }
}

/// `[policy.other]` for DQN.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DqnOther {
    /// `[policy.other.eps]`.
    pub eps: EpsConfig,
    /// `[policy.other.replay_buffer]`.
    pub replay_buffer: ReplayBufferConfig,
}

/// The `[policy]` keys every algorithm shares: written in `[policy]` itself, held in each
/// algorithm's struct as `common` (the config tree moves them in and out).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Common {
    /// Run on CUDA (needs a binary built with `--features cuda`).
    pub cuda: bool,
    /// Precision of the large matrix products on the CPU: `f32`, or `bf16` (operands rounded
    /// to bfloat16, f32 accumulation, f32 weights and Adam state; faster only where the CPU
    /// has AVX-512 BF16).
    pub precision: Precision,
    /// Data-parallel training across ranks (DI-engine's name; `ddp` is an alias).
    #[serde(alias = "ddp")]
    pub multi_gpu: bool,
    /// With `multi_gpu`: divide batch_size and n_sample by the world size (rounded up) so the
    /// global batch stays the same (DI-engine's `to_ddp_config`).
    pub ddp_split_batch: bool,
    /// DDP gradient bucket cap in MiB (torch's `bucket_cap_mb`).
    pub ddp_bucket_cap_mb: f64,
    /// With `multi_gpu`: check every this many optimizer steps that parameters are
    /// bit-identical on every rank (0: never).
    pub ddp_check_every: u64,
}

impl Common {
    /// Check the shared keys' values.
    pub(crate) fn check(&self, c: &mut Checker<'_>) {
        c.positive("policy.ddp_bucket_cap_mb", self.ddp_bucket_cap_mb);
        c.check(
            !(self.cuda && self.precision == Precision::Bf16),
            "policy.precision",
            "is \"bf16\", which drill's CPU kernels compute; on the GPU (policy.cuda = true) keep \"f32\"",
        );
    }
}

impl Default for Common {
    fn default() -> Self {
        Self {
            cuda: false,
            precision: Precision::F32,
            multi_gpu: false,
            ddp_split_batch: false,
            ddp_bucket_cap_mb: 25.0,
            ddp_check_every: 0,
        }
    }
}

/// `[policy]` with `type = "dqn"`: DQN as DI-engine does it (dueling, double, n-step).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DqnPolicy {
    /// Always `dqn` here.
    #[serde(rename = "type")]
    pub kind: String,
    /// The keys every algorithm shares (written in `[policy]` itself).
    pub common: Common,
    /// Reward discount gamma.
    pub discount_factor: f64,
    /// n of the n-step return.
    pub nstep: usize,
    /// `[policy.model]`.
    pub model: DqnModel,
    /// `[policy.learn]`.
    pub learn: DqnLearn,
    /// `[policy.collect]`.
    pub collect: DqnCollect,
    /// `[policy.eval]`.
    pub eval: EvalConfig,
    /// `[policy.other]`.
    pub other: DqnOther,
}

impl Default for DqnPolicy {
    fn default() -> Self {
        Self {
            kind: "dqn".into(),
            common: Common::default(),
            discount_factor: 0.97,
            nstep: 1,
            model: DqnModel::default(),
            learn: DqnLearn::default(),
            collect: DqnCollect::default(),
            eval: EvalConfig::default(),
            other: DqnOther::default(),
        }
    }
}

impl DqnPolicy {
    /// Check DQN's values under `[policy]`.
    pub(crate) fn check(&self, c: &mut Checker<'_>) {
        let p = self;
        c.unit("policy.discount_factor", p.discount_factor);
        c.size("policy.nstep", p.nstep as u64, 1000);
        c.hidden(
            "policy.model.encoder_hidden_size_list",
            &p.model.encoder_hidden_size_list,
        );
        c.off_policy_learn(p.learn.batch_size, p.learn.update_per_collect);
        c.positive("policy.learn.learning_rate", p.learn.learning_rate);
        c.at_least_1(
            "policy.learn.target_update_freq",
            p.learn.target_update_freq,
        );
        if let Some(theta) = p.learn.target_theta {
            c.unit("policy.learn.target_theta", theta);
        }
        c.size(
            "policy.collect.n_sample",
            p.collect.n_sample as u64,
            1 << 30,
        );
        c.check(
            p.collect.unroll_len == 1,
            "policy.collect.unroll_len",
            "DQN uses single transitions: must be 1",
        );
        let eps = &p.other.eps;
        c.check(
            (0.0..=1.0).contains(&eps.start),
            "policy.other.eps.start",
            "must be in [0, 1]",
        );
        c.check(
            (0.0..=1.0).contains(&eps.end),
            "policy.other.eps.end",
            "must be in [0, 1]",
        );
        c.positive("policy.other.eps.decay", eps.decay);
        let rb = &p.other.replay_buffer;
        c.holds_a_batch(rb.replay_buffer_size, p.learn.batch_size);
        c.check(
            rb.priority_alpha >= 0.0,
            "policy.other.replay_buffer.priority_alpha",
            "must be >= 0",
        );
        c.check(
            (0.0..=1.0).contains(&rb.priority_beta),
            "policy.other.replay_buffer.priority_beta",
            "must be in [0, 1]",
        );
    }
}

/// `policy.precision`: the arithmetic of the large matrix products (convolutions and wide
/// dense layers) on the CPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// f32 throughout.
    #[default]
    F32,
    /// Operands rounded to bfloat16 (round to nearest even), products accumulated in f32:
    /// Intel AMX tiles or AVX-512 BF16 dot products where the CPU has them, the same
    /// arithmetic in portable code elsewhere. Weights, gradients and Adam state stay f32.
    Bf16,
}

/// How PPO's Gaussian policy gets its standard deviation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SigmaType {
    /// A learned log-std per action dimension, independent of the state.
    Independent,
    /// A log-std output by the actor head, conditioned on the state.
    Conditioned,
}

/// Hidden-layer activation of PPO's MLPs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    /// ReLU (DI-engine's default; cheap on CPU).
    Relu,
    /// tanh (CleanRL's choice; burn-flex computes it with scalar libm, ~10x slower here).
    Tanh,
}

/// `[policy.model]` for PPO: actor and critic MLPs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PpoModel {
    /// Observation size; from the environment when omitted.
    pub obs_shape: Option<Shape>,
    /// Action count (discrete) or dimension (continuous); from the environment when omitted.
    pub action_shape: Option<usize>,
    /// Hidden sizes of the actor's and the critic's MLPs (separate networks).
    pub encoder_hidden_size_list: Vec<usize>,
    /// Activation after each hidden layer.
    pub activation: Activation,
    /// Continuous actions: how the standard deviation is produced.
    pub sigma_type: SigmaType,
    /// Continuous actions: initial log standard deviation.
    pub init_log_std: f64,
    /// Hidden size of an LSTM core between the encoder (the image trunk, or the
    /// observations) and the actor's and critic's MLPs (CleanRL's ppo_atari_lstm: 128);
    /// omitted: no recurrent core.
    pub lstm_hidden_size: Option<usize>,
}

impl Default for PpoModel {
    fn default() -> Self {
        Self {
            obs_shape: None,
            action_shape: None,
            encoder_hidden_size_list: vec![64, 64],
            activation: Activation::Relu,
            sigma_type: SigmaType::Independent,
            init_log_std: 0.0,
            lstm_hidden_size: None,
        }
    }
}

/// `[policy.learn]` for PPO.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PpoLearn {
    /// Passes over each collected batch.
    pub epoch_per_collect: usize,
    /// Minibatch size.
    pub batch_size: usize,
    /// Adam learning rate.
    pub learning_rate: f64,
    /// Anneal the learning rate linearly to 0 over `max_env_step`.
    pub lr_anneal: bool,
    /// Weight of the value loss.
    pub value_weight: f64,
    /// Weight of the entropy bonus.
    pub entropy_weight: f64,
    /// Surrogate clip epsilon.
    pub clip_ratio: f64,
    /// Clip the value update around the old value (by `clip_ratio`).
    pub value_clip: bool,
    /// Normalise advantages per minibatch.
    pub adv_norm: bool,
    /// Clip the global gradient norm to this value (0: off).
    pub grad_clip_value: f64,
    /// Stop an update's epochs early when the approximate KL exceeds this (0: off).
    pub target_kl: f64,
    /// Scale rewards by the running standard deviation of the discounted return (SB3's and
    /// CleanRL's `NormalizeReward`); helps where returns are large, e.g. Pendulum.
    pub reward_norm: bool,
    /// APPO: V-trace's rho-bar, the clip of the importance weight in the value targets'
    /// temporal differences (DI-engine's IMPALA name); 1 when omitted. PPO refuses it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rho_clip_ratio: Option<f64>,
    /// APPO: V-trace's c-bar, the clip of the traces' importance weights; 1 when omitted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub c_clip_ratio: Option<f64>,
    /// APPO: the clip of the importance weight of the policy gradient's advantage; 1 when
    /// omitted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rho_pg_clip_ratio: Option<f64>,
}

impl PpoLearn {
    /// The V-trace clips (APPO), by their config names, each 1 where omitted.
    pub fn vtrace_clips(&self) -> [(&'static str, f64); 3] {
        [
            ("rho_clip_ratio", self.rho_clip_ratio.unwrap_or(1.0)),
            ("c_clip_ratio", self.c_clip_ratio.unwrap_or(1.0)),
            ("rho_pg_clip_ratio", self.rho_pg_clip_ratio.unwrap_or(1.0)),
        ]
    }
}

impl Default for PpoLearn {
    fn default() -> Self {
        Self {
            epoch_per_collect: 10,
            batch_size: 64,
            learning_rate: 3e-4,
            lr_anneal: false,
            value_weight: 0.5,
            entropy_weight: 0.0,
            clip_ratio: 0.2,
            value_clip: true,
            adv_norm: true,
            grad_clip_value: 0.5,
            target_kl: 0.0,
            reward_norm: false,
            rho_clip_ratio: None,
            c_clip_ratio: None,
            rho_pg_clip_ratio: None,
        }
    }
}

/// `[policy.collect]` for PPO.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PpoCollect {
    /// Transitions collected (over all collector envs) per update; a multiple of
    /// `env.collector_env_num`.
    pub n_sample: usize,
    /// Reward discount gamma.
    pub discount_factor: f64,
    /// GAE lambda (PPO); the traces' lambda of V-trace (APPO, DI-engine IMPALA's `lambda_`).
    pub gae_lambda: f64,
}

impl Default for PpoCollect {
    fn default() -> Self {
        Self {
            n_sample: 1024,
            discount_factor: 0.99,
            gae_lambda: 0.95,
        }
    }
}

/// `[policy]` with `type = "ppo"`: clipped PPO for discrete and continuous actions; with
/// `type = "appo"` the same keys (and the V-trace clips in `[policy.learn]`) for asynchronous
/// PPO, whose collectors may act with older weights.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PpoPolicy {
    /// `ppo` or `appo`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The keys every algorithm shares (written in `[policy]` itself).
    pub common: Common,
    /// `[policy.model]`.
    pub model: PpoModel,
    /// `[policy.learn]`.
    pub learn: PpoLearn,
    /// `[policy.collect]`.
    pub collect: PpoCollect,
    /// `[policy.eval]`.
    pub eval: EvalConfig,
}

impl Default for PpoPolicy {
    fn default() -> Self {
        Self {
            kind: "ppo".into(),
            common: Common::default(),
            model: PpoModel::default(),
            learn: PpoLearn::default(),
            collect: PpoCollect::default(),
            eval: EvalConfig::default(),
        }
    }
}

impl PpoPolicy {
    /// Check PPO's values under `[policy]` (`n_sample` against the env copies, `lr_anneal`
    /// against `max_env_step`).
    pub(crate) fn check(
        &self,
        c: &mut Checker<'_>,
        collector_env_num: usize,
        max_env_step: Option<u64>,
    ) {
        let p = self;
        let written = [
            p.learn.rho_clip_ratio,
            p.learn.c_clip_ratio,
            p.learn.rho_pg_clip_ratio,
        ];
        for ((key, clip), written) in p.learn.vtrace_clips().into_iter().zip(written) {
            let path = format!("policy.learn.{key}");
            if p.kind == "appo" {
                c.positive(&path, clip);
            } else {
                c.check(
                    written.is_none(),
                    &path,
                    "is a V-trace clip of APPO (`type = \"appo\"`); PPO trains each rollout with the weights that collected it and has none",
                );
            }
        }
        // Empty is allowed: the heads read the observations (or an image trunk's
        // features) directly, as CleanRL's ppo_atari.
        c.widths(
            "policy.model.encoder_hidden_size_list",
            &p.model.encoder_hidden_size_list,
        );
        c.check(
            p.model.init_log_std.is_finite(),
            "policy.model.init_log_std",
            "must be finite",
        );
        if let Some(h) = p.model.lstm_hidden_size {
            c.size("policy.model.lstm_hidden_size", h as u64, 1 << 14);
        }
        c.size(
            "policy.learn.epoch_per_collect",
            p.learn.epoch_per_collect as u64,
            1 << 20,
        );
        c.size(
            "policy.learn.batch_size",
            p.learn.batch_size as u64,
            MAX_BATCH,
        );
        c.positive("policy.learn.learning_rate", p.learn.learning_rate);
        c.check(
            p.learn.value_weight >= 0.0,
            "policy.learn.value_weight",
            "must be >= 0",
        );
        c.check(
            p.learn.entropy_weight >= 0.0,
            "policy.learn.entropy_weight",
            "must be >= 0",
        );
        c.positive("policy.learn.clip_ratio", p.learn.clip_ratio);
        c.check(
            p.learn.grad_clip_value >= 0.0,
            "policy.learn.grad_clip_value",
            "must be >= 0 (0: off)",
        );
        c.check(
            p.learn.target_kl >= 0.0,
            "policy.learn.target_kl",
            "must be >= 0 (0: off)",
        );
        c.check(
            !p.learn.lr_anneal || max_env_step.is_some(),
            "policy.learn.lr_anneal",
            "needs max_env_step to anneal over",
        );
        c.unit("policy.collect.discount_factor", p.collect.discount_factor);
        c.check(
            (0.0..=1.0).contains(&p.collect.gae_lambda),
            "policy.collect.gae_lambda",
            "must be in [0, 1]",
        );
        c.check(
            p.collect.n_sample >= collector_env_num
                && p.collect.n_sample.checked_rem(collector_env_num) == Some(0),
            "policy.collect.n_sample",
            &format!(
                "must be a positive multiple of env.collector_env_num ({})",
                collector_env_num
            ),
        );
        c.check(
            p.learn.batch_size <= p.collect.n_sample,
            "policy.learn.batch_size",
            &format!(
                "must not exceed policy.collect.n_sample ({})",
                p.collect.n_sample
            ),
        );
        let steps = p.collect.n_sample / collector_env_num.max(1);
        if p.model.lstm_hidden_size.is_some() && steps > 0 {
            // A recurrent minibatch is whole sequences, each an env copy's rollout.
            c.check(
                p.learn.batch_size.is_multiple_of(steps),
                "policy.learn.batch_size",
                &format!(
                    "must be a multiple of the steps each env copy rolls out (policy.collect.n_sample / env.collector_env_num = {steps}): an LSTM policy trains on whole sequences"
                ),
            );
        }
    }
}

/// `[policy.model]` for SAC: a squashed-Gaussian actor and twin Q critics (DI-engine's `QAC`
/// with `action_space = "reparameterization"`, `twin_critic = true`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SacModel {
    /// Observation size; from the environment when omitted.
    pub obs_shape: Option<Shape>,
    /// Action dimension; from the environment when omitted.
    pub action_shape: Option<usize>,
    /// Width of the actor's two hidden layers.
    pub actor_head_hidden_size: usize,
    /// Width of each critic's two hidden layers.
    pub critic_head_hidden_size: usize,
}

impl Default for SacModel {
    fn default() -> Self {
        Self {
            obs_shape: None,
            action_shape: None,
            actor_head_hidden_size: 128,
            critic_head_hidden_size: 128,
        }
    }
}

/// `[policy.learn]` for SAC.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SacLearn {
    /// Gradient updates after each collect.
    pub update_per_collect: usize,
    /// Transitions per update.
    pub batch_size: usize,
    /// Adam learning rate of the critics.
    pub learning_rate_q: f64,
    /// Adam learning rate of the actor.
    pub learning_rate_policy: f64,
    /// Adam learning rate of the temperature (with `auto_alpha`).
    pub learning_rate_alpha: f64,
    /// Soft target update `target = theta * online + (1 - theta) * target`, every update.
    pub target_theta: f64,
    /// Reward discount gamma.
    pub discount_factor: f64,
    /// Learn the temperature towards the entropy target `-action_dim`.
    pub auto_alpha: bool,
    /// The temperature at the start (fixed without `auto_alpha`).
    pub init_alpha: f64,
    /// Treat terminal transitions as non-terminal (DI-engine's `ignore_done`).
    pub ignore_done: bool,
}

impl Default for SacLearn {
    fn default() -> Self {
        Self {
            update_per_collect: 1,
            batch_size: 128,
            learning_rate_q: 1e-3,
            learning_rate_policy: 1e-3,
            learning_rate_alpha: 3e-4,
            target_theta: 0.005,
            discount_factor: 0.99,
            auto_alpha: true,
            init_alpha: 0.2,
            ignore_done: false,
        }
    }
}

/// `[policy.collect]` for SAC.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SacCollect {
    /// Transitions collected (over all collector envs) before each round of updates.
    pub n_sample: usize,
}

impl Default for SacCollect {
    fn default() -> Self {
        Self { n_sample: 10 }
    }
}

/// `[policy.other]` for SAC.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SacOther {
    /// `[policy.other.replay_buffer]` (uniform replay; `priority` is not supported).
    pub replay_buffer: ReplayBufferConfig,
}

/// `[policy]` with `type = "sac"`: soft actor-critic for continuous actions (twin Q, learned
/// temperature), as DI-engine's `SACPolicy`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SacPolicy {
    /// Always `sac` here.
    #[serde(rename = "type")]
    pub kind: String,
    /// The keys every algorithm shares (written in `[policy]` itself).
    pub common: Common,
    /// Uniformly random actions for this many env steps before the actor acts.
    pub random_collect_size: u64,
    /// `[policy.model]`.
    pub model: SacModel,
    /// `[policy.learn]`.
    pub learn: SacLearn,
    /// `[policy.collect]`.
    pub collect: SacCollect,
    /// `[policy.eval]`.
    pub eval: EvalConfig,
    /// `[policy.other]`.
    pub other: SacOther,
}

impl Default for SacPolicy {
    fn default() -> Self {
        Self {
            kind: "sac".into(),
            common: Common::default(),
            random_collect_size: 1000,
            model: SacModel::default(),
            learn: SacLearn::default(),
            collect: SacCollect::default(),
            eval: EvalConfig::default(),
            other: SacOther::default(),
        }
    }
}

impl SacPolicy {
    /// Check SAC's values under `[policy]`.
    pub(crate) fn check(&self, c: &mut Checker<'_>) {
        let p = self;
        c.size(
            "policy.model.actor_head_hidden_size",
            p.model.actor_head_hidden_size as u64,
            MAX_WIDTH,
        );
        c.size(
            "policy.model.critic_head_hidden_size",
            p.model.critic_head_hidden_size as u64,
            MAX_WIDTH,
        );
        c.off_policy_learn(p.learn.batch_size, p.learn.update_per_collect);
        c.positive("policy.learn.learning_rate_q", p.learn.learning_rate_q);
        c.positive(
            "policy.learn.learning_rate_policy",
            p.learn.learning_rate_policy,
        );
        c.positive(
            "policy.learn.learning_rate_alpha",
            p.learn.learning_rate_alpha,
        );
        c.unit("policy.learn.target_theta", p.learn.target_theta);
        c.unit("policy.learn.discount_factor", p.learn.discount_factor);
        c.positive("policy.learn.init_alpha", p.learn.init_alpha);
        c.size(
            "policy.collect.n_sample",
            p.collect.n_sample as u64,
            1 << 30,
        );
        let rb = &p.other.replay_buffer;
        c.check(
            !rb.priority,
            "policy.other.replay_buffer.priority",
            "SAC samples uniformly: must be false",
        );
        c.holds_a_batch(rb.replay_buffer_size, p.learn.batch_size);
    }
}
