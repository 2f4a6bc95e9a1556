//! The whole experiment tree ([`Config`]), loading, `--set` overrides and validation.

use crate::check::{Checker, MAX_ENVS, value_err};
use crate::{Common, ConfigError, DqnPolicy, PpoPolicy, SacPolicy};
use drill_env::atari::AtariOptions;
use serde::{Deserialize, Serialize, de::DeserializeOwned};

/// `[env]`: which environment and how many copies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EnvConfig {
    /// Gymnasium id, e.g. `CartPole-v0` (DI-engine's `env_id` is an alias).
    #[serde(alias = "env_id")]
    pub id: String,
    /// Environment copies the collector steps together.
    pub collector_env_num: usize,
    /// Environment copies the evaluator steps together.
    pub evaluator_env_num: usize,
    /// Episodes per evaluation; their mean return is compared with `stop_value`.
    pub n_evaluator_episode: usize,
    /// Stop training once an evaluation's mean return reaches this (omit: never).
    pub stop_value: Option<f64>,
    /// Worker threads stepping the collector's copies (1: step on the training thread; more
    /// only pays for expensive environments, such as Atari).
    pub env_threads: usize,
    /// Atari's wrapper chain: `frame_stack`, `noop_max`, `frame_skip`, `episode_life`,
    /// `fire_reset`, `clip_rewards`, `screen_size`, `full_action_space`, written in `[env]`
    /// itself (drill-env's [`AtariOptions`] documents each).
    pub atari: AtariOptions,
    /// Gymnasium ids (`gymnasium:NAME`): keyword arguments for `gymnasium.make`.
    pub kwargs: toml::Table,
    /// Gymnasium ids: `module:Class` (a `gym.Env` of your own) registered under NAME first.
    pub entry_point: Option<String>,
    /// Gymnasium ids: `sync` (every copy in the training process) or `async` (a subprocess
    /// per copy, for slow environments).
    pub vectorization: String,
}

impl Default for EnvConfig {
    fn default() -> Self {
        Self {
            id: "CartPole-v0".into(),
            collector_env_num: 8,
            evaluator_env_num: 5,
            n_evaluator_episode: 5,
            stop_value: None,
            env_threads: 1,
            atari: AtariOptions::default(),
            kwargs: toml::Table::new(),
            entry_point: None,
            vectorization: "sync".into(),
        }
    }
}

/// `[task]`: how `drill train --parallel-workers N` splits the pipeline over processes
/// (DI-engine's `ditask`). Roles are `collector`, `learner` and `evaluator`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TaskConfig {
    /// Worker processes when `--parallel-workers` is not given (0: one process, no split).
    pub workers: usize,
    /// How the workers are linked: `star` (through node 0, which relays), `mesh` (all to
    /// all) or `alone` (only `attach_to` links).
    pub topology: String,
    /// Label pattern (glob) → roles of the workers carrying a matching label, e.g.
    /// `"node.0" = ["collector", "learner"]`, `"node.1" = ["evaluator"]`.
    pub roles: std::collections::BTreeMap<String, Vec<String>>,
    /// Steps a remote collector may run ahead of the weights it acts with (0: lock-step).
    pub model_staleness: u64,
    /// Send a remote collector new weights every this many learner steps (1: every step).
    pub model_every: u64,
    /// Seconds a worker waits for another before giving up (a lost worker fails the wait at
    /// once): a learner for its collectors' data; a collector waits twice as long for its
    /// learner's answer (so that a learner left without collectors says so first), a remote
    /// evaluator for its next evaluation point as long as that takes, a collector joining a
    /// learner group for every learner's answer to which it should feed.
    pub timeout: f64,
    /// What carries events between the workers: `tcp` (direct links, the default) or `redis`
    /// (pub/sub on `redis_url`; DI-engine's `mq_type`; needs a build with `--features redis`).
    pub mq_type: String,
    /// The Redis server for `mq_type = "redis"`: `redis://[user@]host:port`; the password
    /// comes from `DRILL_REDIS_PASSWORD`, never the URL (which config.toml and the workers'
    /// command lines carry).
    pub redis_url: String,
    /// Log each middleware's mean time every this many task steps (DI-engine's StepTimer;
    /// 0: off). Applies to every `drill train`, split or not.
    pub step_timer: u64,
}

impl Default for TaskConfig {
    fn default() -> Self {
        Self {
            workers: 0,
            topology: "star".into(),
            roles: std::collections::BTreeMap::new(),
            model_staleness: 1,
            model_every: 1,
            timeout: 120.0,
            mq_type: "tcp".into(),
            redis_url: "redis://127.0.0.1:6379".into(),
            step_timer: 0,
        }
    }
}

/// Roles a `[task.roles]` entry may name.
pub const TASK_ROLES: [&str; 3] = ["collector", "learner", "evaluator"];

/// `[policy]`: the algorithm, chosen by `policy.type`.
#[derive(Debug, Clone, PartialEq)]
pub enum Policy {
    /// `type = "dqn"`.
    Dqn(DqnPolicy),
    /// `type = "ppo"`.
    Ppo(PpoPolicy),
    /// `type = "appo"`: PPO's keys and network, trained from collectors that may act with
    /// older weights (V-trace).
    Appo(PpoPolicy),
    /// `type = "sac"`.
    Sac(SacPolicy),
}

impl Policy {
    /// `policy.type` as written in the config.
    pub fn kind(&self) -> &'static str {
        match self {
            Policy::Dqn(_) => "dqn",
            Policy::Ppo(_) => "ppo",
            Policy::Appo(_) => "appo",
            Policy::Sac(_) => "sac",
        }
    }

    /// The keys every algorithm shares (`policy.cuda`, `policy.precision`, the data-parallel
    /// keys).
    pub fn common(&self) -> &crate::Common {
        match self {
            Policy::Dqn(p) => &p.common,
            Policy::Ppo(p) | Policy::Appo(p) => &p.common,
            Policy::Sac(p) => &p.common,
        }
    }

    /// `policy.cuda`.
    pub fn cuda(&self) -> bool {
        self.common().cuda
    }

    /// `policy.precision`.
    pub fn precision(&self) -> crate::Precision {
        self.common().precision
    }

    /// `policy.multi_gpu`.
    pub fn multi_gpu(&self) -> bool {
        self.common().multi_gpu
    }

    /// `policy.eval.evaluator.eval_freq`.
    pub fn eval_freq(&self) -> u64 {
        match self {
            Policy::Dqn(p) => p.eval.evaluator.eval_freq,
            Policy::Ppo(p) | Policy::Appo(p) => p.eval.evaluator.eval_freq,
            Policy::Sac(p) => p.eval.evaluator.eval_freq,
        }
    }
}

/// The file layout: the top-level keys, generic over the policy table.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Raw<P> {
    exp_name: String,
    seed: u64,
    max_env_step: Option<u64>,
    max_train_iter: Option<u64>,
    env: EnvConfig,
    policy: P,
    task: TaskConfig,
}

impl<P: Default> Default for Raw<P> {
    fn default() -> Self {
        Self {
            exp_name: "drill_exp".into(),
            seed: 0,
            max_env_step: None,
            max_train_iter: None,
            env: EnvConfig::default(),
            policy: P::default(),
            task: TaskConfig::default(),
        }
    }
}

/// A validated experiment configuration with every default filled in.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Experiment name; the default experiment folder. When an override (`--seed`, `--set
    /// seed=`) changes the seed and not this name, the name's `_seedN` follows the seed.
    pub exp_name: String,
    /// Base seed: collector copy `i` gets `seed + i`, evaluator copies follow.
    pub seed: u64,
    /// Stop after this many collected env steps (omit: no limit).
    pub max_env_step: Option<u64>,
    /// Stop after this many train iterations (omit: no limit).
    pub max_train_iter: Option<u64>,
    /// `[env]`.
    pub env: EnvConfig,
    /// `[policy]`.
    pub policy: Policy,
    /// `[task]`.
    pub task: TaskConfig,
    /// Where it was read from, for error messages.
    pub source: String,
}

/// When an override changed the seed but not `exp_name`, the experiment folder follows the
/// seed: a trailing `_seedN` of `exp_name` becomes the new seed (`cartpole_seed0` with
/// `--seed 1` is `cartpole_seed1`), and a name without one gets `_seed<seed>` appended.
fn follow_seed(table: &mut toml::Table, before: (Option<toml::Value>, Option<toml::Value>)) {
    let (seed_before, name_before) = before;
    let Some(toml::Value::Integer(seed)) = table.get("seed").cloned() else {
        return;
    };
    if table.get("seed") == seed_before.as_ref() || table.get("exp_name") != name_before.as_ref() {
        return;
    }
    let name = match table.get("exp_name") {
        Some(toml::Value::String(n)) => n.clone(),
        _ => "drill_exp".to_string(),
    };
    let stem = match name.rsplit_once("_seed") {
        Some((stem, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => stem,
        _ => name.as_str(),
    };
    let renamed = format!("{stem}_seed{seed}");
    table.insert("exp_name".into(), toml::Value::String(renamed));
}

impl Config {
    /// Read `path`, apply `overrides` (`key.path=value`, value in TOML syntax or a bare string)
    /// and validate.
    pub fn load(path: &str, overrides: &[String]) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_string(),
            source,
        })?;
        Self::parse(&text, path, overrides)
    }

    /// Parse TOML `text` (named `source` in errors), apply `overrides` and validate.
    pub fn parse(text: &str, source: &str, overrides: &[String]) -> Result<Self, ConfigError> {
        let mut table: toml::Table = toml::from_str(text).map_err(|e| ConfigError::Syntax {
            file: source.to_string(),
            message: e.to_string(),
        })?;
        let before = (table.get("seed").cloned(), table.get("exp_name").cloned());
        for arg in overrides {
            apply_override(&mut table, arg)?;
        }
        follow_seed(&mut table, before);
        nest(&mut table, source)?;
        let kind = match table.get("policy").and_then(|p| p.get("type")) {
            None => "dqn".to_string(),
            Some(toml::Value::String(s)) => s.clone(),
            Some(other) => {
                return Err(value_err(
                    source,
                    "policy.type",
                    format!("expected a string, got {other}"),
                ));
            }
        };
        let config = match kind.as_str() {
            "dqn" => {
                let raw: Raw<DqnPolicy> = strict(table, source)?;
                Self::from_raw(raw, source, Policy::Dqn)
            }
            "ppo" => {
                let raw: Raw<PpoPolicy> = strict(table, source)?;
                Self::from_raw(raw, source, Policy::Ppo)
            }
            "appo" => {
                let mut raw: Raw<PpoPolicy> = strict(table, source)?;
                // Written out, so the resolved config names the clips in force.
                let l = &mut raw.policy.learn;
                let [rho, c, rho_pg] = l.vtrace_clips().map(|(_, v)| Some(v));
                (l.rho_clip_ratio, l.c_clip_ratio, l.rho_pg_clip_ratio) = (rho, c, rho_pg);
                Self::from_raw(raw, source, Policy::Appo)
            }
            "sac" => {
                let raw: Raw<SacPolicy> = strict(table, source)?;
                Self::from_raw(raw, source, Policy::Sac)
            }
            other => {
                return Err(value_err(
                    source,
                    "policy.type",
                    format!("unknown policy {other:?}; known: \"dqn\", \"ppo\", \"appo\", \"sac\""),
                ));
            }
        };
        config.validate()?;
        Ok(config)
    }

    fn from_raw<P>(raw: Raw<P>, source: &str, wrap: fn(P) -> Policy) -> Self {
        Self {
            exp_name: raw.exp_name,
            seed: raw.seed,
            max_env_step: raw.max_env_step,
            max_train_iter: raw.max_train_iter,
            env: raw.env,
            policy: wrap(raw.policy),
            task: raw.task,
            source: source.to_string(),
        }
    }

    /// The resolved configuration (every default written out) as TOML.
    pub fn to_toml(&self) -> String {
        fn raw<'a, P>(c: &'a Config, policy: &'a P) -> Raw<&'a P> {
            Raw {
                exp_name: c.exp_name.clone(),
                seed: c.seed,
                max_env_step: c.max_env_step,
                max_train_iter: c.max_train_iter,
                env: c.env.clone(),
                policy,
                task: c.task.clone(),
            }
        }
        let value = match &self.policy {
            Policy::Dqn(p) => toml::Table::try_from(raw(self, p)),
            Policy::Ppo(p) | Policy::Appo(p) => toml::Table::try_from(raw(self, p)),
            Policy::Sac(p) => toml::Table::try_from(raw(self, p)),
        };
        let mut table = value.expect("a validated config serialises");
        unnest(&mut table);
        toml::to_string(&table).expect("a validated config serialises")
    }

    /// An error about `path` in this config, for checks made by later layers (e.g. that the
    /// model's `obs_shape` matches the environment).
    pub fn error(&self, path: &str, message: impl Into<String>) -> ConfigError {
        value_err(&self.source, path, message.into())
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let mut c = Checker::new(&self.source);
        self.env.check(&mut c);
        c.check(
            self.max_env_step != Some(0),
            "max_env_step",
            "must be at least 1 (omit for no limit)",
        );
        c.check(
            self.max_train_iter != Some(0),
            "max_train_iter",
            "must be at least 1 (omit for no limit)",
        );
        c.at_least_1("policy.eval.evaluator.eval_freq", self.policy.eval_freq());
        self.policy.common().check(&mut c);
        match &self.policy {
            Policy::Dqn(p) => p.check(&mut c),
            Policy::Ppo(p) | Policy::Appo(p) => {
                p.check(&mut c, self.env.collector_env_num, self.max_env_step)
            }
            Policy::Sac(p) => p.check(&mut c),
        }
        self.task.check(&mut c);
        c.result()
    }
}

impl EnvConfig {
    /// Check `[env]`'s values.
    fn check(&self, c: &mut Checker<'_>) {
        let e = self;
        c.check(!e.id.is_empty(), "env.id", "must name an environment");
        let gym = e.id.starts_with("gymnasium:");
        c.check(
            gym || e.entry_point.is_none(),
            "env.entry_point",
            "is for Gymnasium environments: set env.id = \"gymnasium:NAME\" (the name it is registered under)",
        );
        c.check(
            gym || e.kwargs.is_empty(),
            "env.kwargs",
            "is for Gymnasium environments (env.id = \"gymnasium:NAME\")",
        );
        c.check(
            e.entry_point.as_ref().is_none_or(|p| p.contains(':')),
            "env.entry_point",
            "must be \"module:Class\", e.g. \"my_pkg.my_env:MyEnv\"",
        );
        c.check(
            ["sync", "async"].contains(&e.vectorization.as_str()),
            "env.vectorization",
            "must be \"sync\" or \"async\"",
        );
        c.size(
            "env.collector_env_num",
            e.collector_env_num as u64,
            MAX_ENVS,
        );
        c.size(
            "env.evaluator_env_num",
            e.evaluator_env_num as u64,
            MAX_ENVS,
        );
        c.size(
            "env.n_evaluator_episode",
            e.n_evaluator_episode as u64,
            1_000_000,
        );
        c.size("env.env_threads", e.env_threads as u64, 1024);
        if let Err((key, message)) = e.atari.check() {
            c.check(false, &format!("env.{key}"), &message);
        }
        if let Some(v) = e.stop_value {
            c.check(v.is_finite(), "env.stop_value", "must be finite");
        }
    }
}

impl TaskConfig {
    /// Check `[task]`'s values.
    fn check(&self, c: &mut Checker<'_>) {
        let t = self;
        c.check(
            ["star", "mesh", "alone"].contains(&t.topology.as_str()),
            "task.topology",
            "must be \"star\", \"mesh\" or \"alone\"",
        );
        c.positive("task.timeout", t.timeout);
        c.at_least_1("task.model_every", t.model_every);
        c.check(
            ["tcp", "redis"].contains(&t.mq_type.as_str()),
            "task.mq_type",
            "must be \"tcp\" or \"redis\"",
        );
        c.check(
            !url_has_password(&t.redis_url),
            "task.redis_url",
            REDIS_PASSWORD_ADVICE,
        );
        for (label, roles) in &t.roles {
            let path = format!("task.roles.{label}");
            for r in roles {
                c.check(
                    TASK_ROLES.contains(&r.as_str()),
                    &path,
                    &format!(
                        "unknown role {r:?}; roles are \"collector\", \"learner\", \"evaluator\""
                    ),
                );
            }
            c.check(
                glob::Pattern::new(label).is_ok(),
                &path,
                "is not a valid label pattern",
            );
        }
    }
}

/// What a Redis URL with a password is told.
pub const REDIS_PASSWORD_ADVICE: &str = "carries a password: give it in the environment as \
    DRILL_REDIS_PASSWORD instead (a URL is written to config.toml and the workers' command lines)";

/// Whether a URL (`scheme://[user[:password]@]host...`) carries a password.
pub fn url_has_password(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    authority
        .rsplit_once('@')
        .and_then(|(user, _)| user.split_once(':'))
        .is_some_and(|(_, password)| !password.is_empty())
}

/// Keys written in a table itself but held in a struct of their own, defined once where
/// others use it too: (table, the field holding them, the keys). The shared `[policy]` keys
/// ([`Common`]: one struct for every algorithm) and Atari's options in `[env]` (drill-env's
/// [`AtariOptions`], which `drill env` and Python's `make_vec` read as well). The keys are
/// the structs' own fields (as they serialise), and `ddp`, `multi_gpu`'s alias.
fn nested() -> [(&'static str, &'static str, Vec<String>); 2] {
    fn fields<T: Serialize + Default>() -> Vec<String> {
        let table = toml::Table::try_from(T::default()).expect("a default serialises");
        table.keys().cloned().collect()
    }
    let mut common = fields::<Common>();
    common.push("ddp".into());
    [
        ("policy", "common", common),
        ("env", "atari", fields::<AtariOptions>()),
    ]
}

/// Move each [`nested`] group's keys into the table its struct reads them from; a config
/// that writes the holding table itself (`policy.common`) has an unknown key.
fn nest(table: &mut toml::Table, source: &str) -> Result<(), ConfigError> {
    for (name, field, keys) in nested() {
        let Some(toml::Value::Table(t)) = table.get_mut(name) else {
            continue;
        };
        if t.contains_key(field) {
            return Err(ConfigError::UnknownKey {
                file: source.to_string(),
                path: format!("{name}.{field}"),
                nearest: None,
            });
        }
        let mut group = toml::Table::new();
        for key in keys {
            if let Some(v) = t.remove(&key) {
                group.insert(key, v);
            }
        }
        t.insert(field.to_string(), toml::Value::Table(group));
    }
    Ok(())
}

/// The inverse of [`nest`] for writing: each group's keys back in their table, where the
/// holding field was.
fn unnest(table: &mut toml::Table) {
    for (name, field, _) in nested() {
        let Some(toml::Value::Table(t)) = table.get_mut(name) else {
            continue;
        };
        let mut out = toml::Table::new();
        for (key, value) in std::mem::take(t) {
            match value {
                toml::Value::Table(group) if key == field => out.extend(group),
                value => {
                    out.insert(key, value);
                }
            }
        }
        *t = out;
    }
}

/// An error's key path as the config writes it: a [`nested`] group's holding field dropped;
/// `expected`, the keys an unknown key could have meant, with the group's keys in its place.
fn written_path(path: String, expected: &mut Vec<String>) -> String {
    for (name, field, keys) in nested() {
        let holder = format!("{name}.{field}");
        if path
            .rsplit_once('.')
            .is_some_and(|(parent, _)| parent == name)
        {
            expected.retain(|k| k != field);
            expected.extend(keys);
        }
        if path == holder {
            return name.to_string();
        }
        if let Some(rest) = path.strip_prefix(&format!("{holder}.")) {
            return format!("{name}.{rest}");
        }
    }
    path
}

/// Deserialize with every unknown key and bad value reported by its full key path.
fn strict<T: DeserializeOwned>(table: toml::Table, source: &str) -> Result<T, ConfigError> {
    serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|err| {
        let message = err.inner().to_string();
        let unknown = parse_unknown_field(&message);
        let mut expected = unknown.as_ref().map(|u| u.1.clone()).unwrap_or_default();
        let path = written_path(err.path().to_string(), &mut expected);
        if let Some((field, _)) = unknown {
            // The path ends with the unknown key itself.
            let parent = path.rsplit_once('.').map_or("", |(parent, _)| parent);
            let full = if parent.is_empty() {
                field.clone()
            } else {
                format!("{parent}.{field}")
            };
            let nearest = expected
                .iter()
                .map(|k| (strsim::damerau_levenshtein(&field, k), k))
                .filter(|(d, k)| *d <= 3.max(k.len() / 3))
                .min()
                .map(|(_, k)| {
                    if parent.is_empty() {
                        k.to_string()
                    } else {
                        format!("{parent}.{k}")
                    }
                });
            ConfigError::UnknownKey {
                file: source.to_string(),
                path: full,
                nearest,
            }
        } else {
            let message = message
                .split(" for key ")
                .next()
                .unwrap_or(&message)
                .to_string();
            ConfigError::Value {
                file: source.to_string(),
                path,
                message,
            }
        }
    })
}

/// Split serde's "unknown field `x`, expected one of `a`, `b`" into (`x`, [a, b]).
fn parse_unknown_field(message: &str) -> Option<(String, Vec<String>)> {
    let rest = message.strip_prefix("unknown field `")?;
    let (field, rest) = rest.split_once('`')?;
    let expected = rest
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect();
    Some((field.to_string(), expected))
}

fn apply_override(table: &mut toml::Table, arg: &str) -> Result<(), ConfigError> {
    let bad = |message: &str| ConfigError::Override {
        arg: arg.to_string(),
        message: message.to_string(),
    };
    let (key, value) = arg
        .split_once('=')
        .ok_or_else(|| bad("expected KEY=VALUE, e.g. policy.learn.batch_size=128"))?;
    let parts: Vec<&str> = key.trim().split('.').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(bad("empty key segment"));
    }
    let value = value.trim();
    let value = match toml::from_str::<toml::Table>(&format!("v = {value}")) {
        Ok(mut t) => t.remove("v").expect("parsed key"),
        Err(_) => toml::Value::String(value.to_string()),
    };
    let mut node = table;
    for (i, part) in parts[..parts.len() - 1].iter().enumerate() {
        let entry = node
            .entry(part.to_string())
            .or_insert_with(|| toml::Value::Table(Default::default()));
        node = entry.as_table_mut().ok_or_else(|| {
            bad(&format!(
                "`{}` is a value, not a table",
                parts[..=i].join(".")
            ))
        })?;
    }
    node.insert(parts[parts.len() - 1].to_string(), value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DQN: &str = r#"
exp_name = "t"
[env]
id = "CartPole-v0"
stop_value = 195
[policy]
type = "dqn"
[policy.learn]
batch_size = 64
"#;

    fn err(text: &str, overrides: &[&str]) -> String {
        let o: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        Config::parse(text, "t.toml", &o).unwrap_err().to_string()
    }

    #[test]
    fn a_password_in_a_url_is_seen() {
        assert!(url_has_password("redis://:pw@h:6379"));
        assert!(url_has_password("redis://u:pw@h:6379/0"));
        assert!(!url_has_password("redis://u@h:6379"));
        assert!(!url_has_password("redis://h:6379/0?x=a:b@c"));
        assert!(!url_has_password("redis://127.0.0.1:6379"));
    }

    #[test]
    fn the_experiment_name_follows_an_overridden_seed() {
        let name = |text: &str, o: &[&str]| {
            let o: Vec<String> = o.iter().map(|s| s.to_string()).collect();
            Config::parse(text, "t.toml", &o).unwrap().exp_name
        };
        let seeded = DQN.replace("exp_name = \"t\"", "exp_name = \"cp_seed0\"");
        assert_eq!(name(&seeded, &[]), "cp_seed0");
        assert_eq!(name(&seeded, &["seed=1"]), "cp_seed1");
        assert_eq!(name(&seeded, &["seed=0"]), "cp_seed0");
        assert_eq!(name(DQN, &["seed=7"]), "t_seed7");
        assert_eq!(name(&seeded, &["seed=3", "exp_name=mine"]), "mine");
        let odd = DQN.replace("exp_name = \"t\"", "exp_name = \"a_seedling\"");
        assert_eq!(name(&odd, &["seed=2"]), "a_seedling_seed2");
    }

    #[test]
    fn unknown_keys_name_their_path_and_nearest_key() {
        let e = err(DQN, &["policy.learn.batchsize=3"]);
        assert_eq!(
            e,
            "t.toml: unknown key `policy.learn.batchsize` (did you mean `policy.learn.batch_size`?)"
        );
        let e = err(DQN, &["policy.lern.batch_size=3"]);
        assert_eq!(
            e,
            "t.toml: unknown key `policy.lern` (did you mean `policy.learn`?)"
        );
        let e = err(DQN, &["exp_nme=x"]);
        assert_eq!(
            e,
            "t.toml: unknown key `exp_nme` (did you mean `exp_name`?)"
        );
        for kind in ["dqn", "ppo", "appo", "sac"] {
            let e = err(
                DQN,
                &[&format!("policy.type={kind}"), "policy.multigpu=true"],
            );
            assert_eq!(
                e,
                "t.toml: unknown key `policy.multigpu` (did you mean `policy.multi_gpu`?)"
            );
        }
        let e = err(DQN, &["env.frame_stak=2"]);
        assert_eq!(
            e,
            "t.toml: unknown key `env.frame_stak` (did you mean `env.frame_stack`?)"
        );
        let e = err(DQN, &["env.atari.frame_stack=2"]);
        assert_eq!(e, "t.toml: unknown key `env.atari`");
        let e = err(DQN, &["policy.common.cuda=true"]);
        assert_eq!(e, "t.toml: unknown key `policy.common`");
        let e = err(DQN, &["env.zzzzzzzzzzzz=1"]);
        assert_eq!(e, "t.toml: unknown key `env.zzzzzzzzzzzz`");
        let e = err(DQN, &["policy.other.eps.strat=0.5"]);
        assert!(
            e.contains("`policy.other.eps.strat` (did you mean `policy.other.eps.start`?)"),
            "{e}"
        );
    }

    #[test]
    fn bad_values_name_their_path() {
        let e = err(DQN, &["policy.learn.batch_size=-1"]);
        assert!(
            e.starts_with("t.toml: bad value for `policy.learn.batch_size`"),
            "{e}"
        );
        let e = err(DQN, &["env.screen_size=\"big\""]);
        assert!(
            e.starts_with("t.toml: bad value for `env.screen_size`"),
            "{e}"
        );
        let e = err(DQN, &["env.frame_stack=0"]);
        assert_eq!(
            e,
            "t.toml: bad value for `env.frame_stack`: must be 1..=64, got 0"
        );
        let e = err(DQN, &["policy.ddp_check_every=-1"]);
        assert!(
            e.starts_with("t.toml: bad value for `policy.ddp_check_every`"),
            "{e}"
        );
        let e = err(DQN, &["policy.ddp_bucket_cap_mb=0"]);
        assert!(
            e.starts_with("t.toml: bad value for `policy.ddp_bucket_cap_mb`"),
            "{e}"
        );
        let e = err(DQN, &["policy.cuda=true", "policy.precision=bf16"]);
        assert!(
            e.starts_with("t.toml: bad value for `policy.precision`: is \"bf16\""),
            "{e}"
        );
        let e = err(DQN, &["policy.learn.learning_rate=0"]);
        assert_eq!(
            e,
            "t.toml: bad value for `policy.learn.learning_rate`: must be a positive number, got 0"
        );
        let e = err(DQN, &["policy.other.eps.type=cosine"]);
        assert!(
            e.starts_with("t.toml: bad value for `policy.other.eps.type`"),
            "{e}"
        );
        let e = err(DQN, &["policy.type=td3"]);
        assert!(
            e.contains(
                "`policy.type`: unknown policy \"td3\"; known: \"dqn\", \"ppo\", \"appo\", \"sac\""
            ),
            "{e}"
        );
        let e = err(DQN, &["policy.type=sac", "policy.learn.target_theta=2"]);
        assert!(e.contains("`policy.learn.target_theta`"), "{e}");
        let e = err(DQN, &["policy.other.replay_buffer.replay_buffer_size=10"]);
        assert!(
            e.contains("replay_buffer_size`: must hold at least one batch (64)"),
            "{e}"
        );
        let e = err(
            "[env]\nid = \"CartPole-v1\"\ncollector_env_num = 3\n[policy]\ntype = \"ppo\"\n",
            &[],
        );
        assert!(e.contains("`policy.collect.n_sample`: must be a positive multiple of env.collector_env_num (3)"), "{e}");
        // Found by the fuzzer: no envs at all is an error naming the key, not a division by 0.
        let e = err(
            "[env]\nid = \"CartPole-v1\"\n[policy]\ntype = \"ppo\"\n",
            &["env.collector_env_num=0"],
        );
        assert!(e.contains("`env.collector_env_num`"), "{e}");
        let e = err("[env\nid=1", &[]);
        assert!(e.starts_with("t.toml: not valid TOML"), "{e}");
        let e = err(DQN, &["policy.learn"]);
        assert!(e.starts_with("bad override \"policy.learn\""), "{e}");
        let e = err(DQN, &["exp_name.x=1"]);
        assert!(e.contains("`exp_name` is a value, not a table"), "{e}");
    }

    /// Every shipped config loads, and its resolved tree (`to_toml`, as written to the
    /// experiment folder) loads back to the same config.
    #[test]
    fn shipped_configs_load_and_round_trip() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let c = Config::load(path.to_str().unwrap(), &[]).unwrap();
            let again = Config::parse(&c.to_toml(), &c.source, &[]).unwrap();
            assert_eq!(again, c, "{}", path.display());
            n += 1;
        }
        assert!(n >= 10, "{n} configs in {}", dir.display());
    }

    #[test]
    fn overrides_defaults_aliases_and_round_trip() {
        let o = vec![
            "policy.learn.batch_size=128".to_string(),
            "env.id=CartPole-v1".to_string(),
        ];
        let c = Config::parse(DQN, "t.toml", &o).unwrap();
        let alias = Config::parse(&DQN.replace("id = ", "env_id = "), "t.toml", &[]).unwrap();
        assert_eq!(alias.env.id, "CartPole-v0");
        let Policy::Dqn(p) = &c.policy else {
            panic!("dqn")
        };
        assert_eq!(p.learn.batch_size, 128);
        assert_eq!(c.env.id, "CartPole-v1");
        assert_eq!(p.model.encoder_hidden_size_list, vec![128, 128, 64]);
        assert_eq!(c.env.stop_value, Some(195.0));
        let again = Config::parse(&c.to_toml(), "t.toml", &[]).unwrap();
        assert_eq!(again, c);
        let atari = ["env.noop_max=7".to_string(), "env.fire_reset=false".into()];
        let a = Config::parse(DQN, "t.toml", &atari).unwrap();
        assert_eq!((a.env.atari.noop_max, a.env.atari.fire_reset), (7, false));
        assert!(
            a.to_toml()
                .contains("\nenv_threads = 1\nframe_stack = 4\nnoop_max = 7\n")
        );
        let ddp = Config::parse(DQN, "t.toml", &["policy.ddp=true".into()]).unwrap();
        assert!(ddp.policy.multi_gpu());
        // The shared keys, one struct flattened into each algorithm's table.
        for kind in ["dqn", "ppo", "appo", "sac"] {
            let o = [
                format!("policy.type={kind}"),
                "policy.ddp_bucket_cap_mb=8".into(),
                "policy.precision=bf16".into(),
            ];
            let c = Config::parse(DQN, "t.toml", &o).unwrap();
            assert_eq!(c.policy.common().ddp_bucket_cap_mb, 8.0, "{kind}");
            assert_eq!(c.policy.precision(), crate::Precision::Bf16, "{kind}");
            let text = c.to_toml();
            let head = format!("[policy]\ntype = \"{kind}\"\ncuda = false\nprecision = \"bf16\"\n");
            assert!(text.contains(&head), "{text}");
            assert!(!text.contains("common"), "{text}");
            assert_eq!(Config::parse(&text, "t.toml", &[]).unwrap(), c);
        }
    }

    #[test]
    fn appo_has_the_vtrace_clips_and_ppo_refuses_them() {
        let appo = "[env]\nid = \"CartPole-v1\"\n[policy]\ntype = \"appo\"\n";
        let c = Config::parse(appo, "t.toml", &["policy.learn.c_clip_ratio=0.5".into()]).unwrap();
        let Policy::Appo(p) = &c.policy else {
            panic!("an APPO config: {c:?}")
        };
        assert_eq!(
            p.learn.vtrace_clips().map(|(_, v)| v),
            [1.0, 0.5, 1.0],
            "omitted clips are 1"
        );
        let text = c.to_toml();
        assert!(
            text.contains("rho_clip_ratio = 1.0\nc_clip_ratio = 0.5\nrho_pg_clip_ratio = 1.0"),
            "{text}"
        );
        assert_eq!(Config::parse(&text, "t.toml", &[]).unwrap(), c);
        let e = Config::parse(appo, "t.toml", &["policy.learn.rho_clip_ratio=0".into()])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`policy.learn.rho_clip_ratio`: must be a positive number"),
            "{e}"
        );
        let ppo = appo.replace("appo", "ppo");
        let e = Config::parse(
            &ppo,
            "t.toml",
            &["policy.learn.rho_pg_clip_ratio=1.0".into()],
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("`policy.learn.rho_pg_clip_ratio`: is a V-trace clip of APPO"),
            "{e}"
        );
        let plain = Config::parse(&ppo, "t.toml", &[]).unwrap().to_toml();
        assert!(!plain.contains("clip_ratio = 1.0\nc_clip"), "{plain}");
    }
}
