//! [`Roles`]: which parts of a pipeline this process runs (all of them, or its share under
//! `drill train --parallel-workers N`), and [`RolePlan`]: the `[task.roles]` assignment of a
//! parallel run, checked before anything starts.

use std::time::Duration;

use drill_config::{Config, TASK_ROLES};
use drill_task::{Labels, TaskError, TaskHandle};

use crate::context::TrainResult;
use crate::error::TrainError;

/// The parts of the pipeline this process runs. Built-in pipelines register only the
/// middlewares of these roles, plus the exchangers that reach the roles run elsewhere.
#[derive(Debug, Clone, PartialEq)]
pub struct Roles {
    /// Steps the environments and produces transitions.
    pub collector: bool,
    /// Trains, owns checkpoints and the experiment folder, decides when the run ends.
    pub learner: bool,
    /// Evaluates the learner's weights.
    pub evaluator: bool,
    /// Under the Parallel runner: how the processes cooperate (`None`: one process).
    pub remote: Option<Remote>,
}

/// How processes of a parallel run cooperate. Other crates get one only from
/// [`RolePlan::share`], so every parallel share passed the plan's checks.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Remote {
    /// This worker's node id.
    pub node: usize,
    /// This worker's place among the collector workers (seeds its environments and
    /// generator as a DDP rank's would be).
    pub collector_index: usize,
    /// Collector workers in the run (the evaluator is seeded after all of them).
    pub collectors: usize,
    /// The collector workers' nodes, in order (collector `i` feeds learner `i % learners`).
    pub collector_nodes: Vec<usize>,
    /// The learner workers' nodes, the lead first: one learner, or a data-parallel group
    /// (`policy.multi_gpu`) whose lead owns the experiment folder and feeds the evaluator.
    pub learners: Vec<usize>,
    /// Steps a collector may run ahead of the weights it acts with (`task.model_staleness`).
    pub model_staleness: u64,
    /// The learner sends a remote collector weights every this many steps
    /// (`task.model_every`).
    pub model_every: u64,
    /// Give up waiting for another process after this long (a lost one ends waits at once).
    pub timeout: Duration,
}

impl Remote {
    /// This worker's rank among the learners (`None`: not a learner).
    pub(crate) fn learner_rank(&self) -> Option<usize> {
        self.learners.iter().position(|&l| l == self.node)
    }

    /// The learner (its rank among the learners) that collector `index` of the role table
    /// feeds: collectors are dealt out in turn (one that joins a running group chooses its
    /// learner).
    pub(crate) fn learner_of(&self, index: usize) -> usize {
        index % self.learners.len().max(1)
    }

    /// The collector nodes that feed learner `rank`.
    pub(crate) fn collectors_of(&self, rank: usize) -> Vec<usize> {
        (self.collector_nodes.iter().enumerate())
            .filter(|&(i, _)| self.learner_of(i) == rank)
            .map(|(_, &n)| n)
            .collect()
    }
}

impl Roles {
    /// Everything in this process.
    pub fn all() -> Self {
        Self {
            collector: true,
            learner: true,
            evaluator: true,
            remote: None,
        }
    }

    /// The roles among `task`'s labels (`collector`, `learner`, `evaluator`), for a process of
    /// a parallel run.
    pub(crate) fn from_labels(task: &TaskHandle, remote: Remote) -> Result<Self, TaskError> {
        let has = |r: &str| task.match_labels(&[r]);
        Ok(Self {
            collector: has("collector")?,
            learner: has("learner")?,
            evaluator: has("evaluator")?,
            remote: Some(remote),
        })
    }

    /// The roles taken, by name (`collector`, `learner`, `evaluator`).
    pub fn names(&self) -> Vec<&'static str> {
        [
            (self.collector, "collector"),
            (self.learner, "learner"),
            (self.evaluator, "evaluator"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect()
    }

    /// The collector runs in another process.
    pub(crate) fn collector_elsewhere(&self) -> bool {
        self.remote.is_some() && !self.collector
    }

    /// The evaluator runs in another process.
    pub(crate) fn evaluator_elsewhere(&self) -> bool {
        self.remote.is_some() && !self.evaluator
    }

    /// The learner runs in another process.
    pub(crate) fn learner_elsewhere(&self) -> bool {
        self.remote.is_some() && !self.learner
    }

    /// This process is the learner, or the lead of the learners' group (rank 0): it owns the
    /// experiment folder, talks to the evaluator and returns the run's result.
    pub fn lead_learner(&self) -> bool {
        self.learner
            && self
                .remote
                .as_ref()
                .is_none_or(|r| r.learner_rank() == Some(0))
    }

    /// Which collector this process is among how many, for seeding its environments and
    /// generator as a DDP rank's: its place among the collector workers when split over
    /// processes, else its `rank` of `world`.
    pub(crate) fn slot(&self, rank: usize, world: usize) -> (usize, usize) {
        self.remote
            .as_ref()
            .map_or((rank, world), |r| (r.collector_index, r.collectors.max(1)))
    }
}

/// Which of a parallel run's workers take which role (`[task.roles]`: label pattern → roles,
/// matched against each worker's labels `distributed`, `node.N` and any extra), checked: the
/// evaluator on exactly one worker, the learner on one (or, with `policy.multi_gpu`, on
/// several that train as one data-parallel group, each fed by its own collectors, the
/// evaluator then on a worker of its own), collectors
/// on one or more (on the learner's worker only if no other collects and it learns alone),
/// and the evaluator's worker collecting only if it is the learner's (a remote evaluator waits
/// for weights; a collector beside it would starve the learner). Errors name `task.roles`.
#[derive(Debug, Clone, PartialEq)]
pub struct RolePlan {
    collectors: Vec<usize>,
    learners: Vec<usize>,
    evaluator: usize,
}

impl RolePlan {
    /// Check `config`'s roles over `workers` workers carrying `extra` labels besides their own.
    pub fn new(config: &Config, extra: &[String], workers: usize) -> Result<Self, TrainError> {
        let mut owners: Vec<Vec<usize>> = vec![Vec::new(); TASK_ROLES.len()];
        for node in 0..workers {
            let roles = Self::roles_of(config, &Self::labels(node, extra))?;
            for (k, role) in TASK_ROLES.iter().enumerate() {
                if roles.iter().any(|r| r == role) {
                    owners[k].push(node);
                }
            }
        }
        let bad = |message: String| -> TrainError { config.error("task.roles", message).into() };
        let on = |nodes: &[usize]| match nodes {
            [] => "no worker takes it".to_string(),
            _ => format!("nodes {nodes:?} take it"),
        };
        let [collectors, learners, evaluator] = [&owners[0], &owners[1], &owners[2]];
        let group = config.policy.multi_gpu();
        for (role, nodes) in [("learner", learners), ("evaluator", evaluator)] {
            if nodes.len() == 1 || (role == "learner" && group && !nodes.is_empty()) {
                continue;
            }
            let several = match role {
                "learner" if nodes.len() > 1 => {
                    " (several learners train as one data-parallel group only with `policy.multi_gpu = true`)"
                }
                _ => "",
            };
            return Err(bad(format!(
                "the {role} role must run on exactly one of the {workers} workers, but {}{several} (e.g. \"node.0\" = [\"collector\", \"learner\"], \"node.1\" = [\"evaluator\"])",
                on(nodes)
            )));
        }
        if collectors.is_empty() {
            return Err(bad(format!(
                "no worker of the {workers} takes the collector role"
            )));
        }
        let lead = learners[0];
        if learners.len() > 1 && learners.contains(&evaluator[0]) {
            return Err(bad(format!(
                "the evaluator runs on node {}, one of the learners {learners:?}: beside a data-parallel group of learners it needs a worker of its own",
                evaluator[0]
            )));
        }
        if evaluator[0] != lead && collectors.contains(&evaluator[0]) {
            return Err(bad(format!(
                "the evaluator's worker (node {}) may also collect only if it is the learner's: give the evaluator a worker of its own or put it with the learner",
                evaluator[0]
            )));
        }
        if let Some(l) = learners.iter().find(|l| collectors.contains(l))
            && (collectors.len() > 1 || learners.len() > 1)
        {
            return Err(bad(format!(
                "the learner's worker (node {l}) collects too, so no other worker may collect or learn: nodes {collectors:?} take the collector role, nodes {learners:?} the learner role"
            )));
        }
        if collectors.len() < learners.len() {
            return Err(bad(format!(
                "{} learners need a collector each, but only nodes {collectors:?} collect",
                learners.len()
            )));
        }
        Ok(Self {
            collectors: collectors.clone(),
            learners: learners.clone(),
            evaluator: evaluator[0],
        })
    }

    /// The labels worker `node` has (as the Parallel runner gives them): `distributed`,
    /// `node.N`, `extra`, and `DRILL_LABELS`.
    pub fn labels(node: usize, extra: &[String]) -> Labels {
        let mut labels = Labels::new(["distributed".to_string(), format!("node.{node}")]);
        for l in extra {
            labels.insert(l.clone());
        }
        if let Ok(list) = std::env::var("DRILL_LABELS") {
            labels.extend_from_list(&list);
        }
        labels
    }

    /// The roles `[task.roles]` gives a worker with `labels`.
    pub(crate) fn roles_of(config: &Config, labels: &Labels) -> Result<Vec<String>, TrainError> {
        let mut roles = Vec::new();
        for (pattern, rs) in &config.task.roles {
            if labels
                .matches(&[pattern])
                .map_err(|e| config.error(&format!("task.roles.{pattern}"), e.to_string()))?
            {
                roles.extend(rs.iter().cloned());
            }
        }
        Ok(roles)
    }

    /// The workers that collect.
    pub fn collectors(&self) -> &[usize] {
        &self.collectors
    }

    /// The learner's worker (the lead of the learners' group).
    pub fn learner(&self) -> usize {
        self.learners[0]
    }

    /// The learners' workers, the lead first.
    pub fn learners(&self) -> &[usize] {
        &self.learners
    }

    /// The evaluator's worker.
    pub fn evaluator(&self) -> usize {
        self.evaluator
    }

    /// The share of a worker that joined the running job (`drill train --join`): a collector
    /// whatever `[task.roles]` says, seeded by its node id (after every worker's index, so no
    /// other collector's streams), its task labelled `collector`.
    pub fn joined(&self, config: &Config, task: &TaskHandle) -> Roles {
        task.insert_label("collector".to_string());
        let node = node_of(task).unwrap_or(usize::MAX);
        Roles {
            collector: true,
            learner: false,
            evaluator: false,
            remote: Some(Remote {
                node,
                collector_index: node,
                collectors: self.collectors.len(),
                collector_nodes: self.collectors.clone(),
                learners: self.learners.clone(),
                model_staleness: config.task.model_staleness,
                model_every: config.task.model_every,
                timeout: Duration::from_secs_f64(config.task.timeout),
            }),
        }
    }

    /// This worker's share: its task is labelled with its roles, which are returned with how
    /// it cooperates with the others.
    pub fn share(&self, config: &Config, task: &TaskHandle) -> Result<Roles, TrainError> {
        for r in Self::roles_of(config, &task.labels())? {
            task.insert_label(r);
        }
        let node = node_of(task)
            .ok_or_else(|| TrainError::Task(TaskError::msg("a worker without a node.N label")))?;
        let remote = Remote {
            node,
            collector_index: self.collectors.iter().position(|&c| c == node).unwrap_or(0),
            collectors: self.collectors.len(),
            collector_nodes: self.collectors.clone(),
            learners: self.learners.clone(),
            model_staleness: config.task.model_staleness,
            model_every: config.task.model_every,
            timeout: Duration::from_secs_f64(config.task.timeout),
        };
        Ok(Roles::from_labels(task, remote)?)
    }
}

/// A pipeline that may be split over processes, run whole in this one: `train_roles` with
/// every role on a task of its own.
pub(crate) fn in_one_process(
    train_roles: impl FnOnce(TaskHandle, &Roles) -> Result<Option<TrainResult>, TrainError>,
) -> Result<TrainResult, TrainError> {
    let task = drill_task::Task::<drill_task::OnlineRLContext>::new();
    train_roles(task.handle().clone(), &Roles::all())?
        .ok_or_else(|| TrainError::Task(TaskError::msg("the learner returns the result")))
}

/// The worker's node id, from its `node.N` label.
fn node_of(task: &TaskHandle) -> Option<usize> {
    task.labels()
        .iter()
        .find_map(|l| l.strip_prefix("node.")?.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(roles: &str) -> Config {
        let text = format!("[env]\nid = \"CartPole-v0\"\n[task.roles]\n{roles}");
        Config::parse(&text, "t.toml", &[]).unwrap()
    }

    #[test]
    fn a_plan_is_checked_before_anything_starts() {
        let ok =
            config("\"node.0\" = [\"collector\", \"learner\"]\n\"node.1\" = [\"evaluator\"]\n");
        let plan = RolePlan::new(&ok, &[], 2).unwrap();
        assert_eq!(
            (plan.collectors(), plan.learner(), plan.evaluator()),
            (&[0][..], 0, 1)
        );
        let two_learners = config("\"node.*\" = [\"collector\", \"learner\", \"evaluator\"]\n");
        let e = RolePlan::new(&two_learners, &[], 2)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`task.roles`") && e.contains("the learner role must run on exactly one"),
            "{e}"
        );
        let starved =
            config("\"node.0\" = [\"learner\"]\n\"node.1\" = [\"collector\", \"evaluator\"]\n");
        let e = RolePlan::new(&starved, &[], 2).unwrap_err().to_string();
        assert!(e.contains("the evaluator's worker (node 1)"), "{e}");
    }

    /// Several learners only as a data-parallel group (`policy.multi_gpu`), each with a
    /// collector of its own and the evaluator apart; collectors are dealt out in turn.
    #[test]
    fn several_learners_form_a_group_each_fed_by_its_own_collectors() {
        let with = |roles: &str, group: bool| {
            let text = format!(
                "[env]\nid = \"CartPole-v0\"\n[policy]\ntype = \"appo\"\nmulti_gpu = {group}\n[task.roles]\n{roles}"
            );
            let config = Config::parse(&text, "t.toml", &[]).unwrap();
            RolePlan::new(&config, &[], 6).map_err(|e| e.to_string())
        };
        let two = "\"node.[012]\" = [\"collector\"]\n\"node.[34]\" = [\"learner\"]\n\"node.5\" = [\"evaluator\"]\n";
        let e = with(two, false).unwrap_err();
        assert!(
            e.contains("nodes [3, 4] take it") && e.contains("multi_gpu"),
            "{e}"
        );
        let plan = with(two, true).unwrap();
        assert_eq!((plan.learners(), plan.learner()), (&[3, 4][..], 3));
        let remote = |node| Remote {
            node,
            collector_index: 0,
            collectors: 3,
            collector_nodes: plan.collectors().to_vec(),
            learners: plan.learners().to_vec(),
            model_staleness: 0,
            model_every: 1,
            timeout: Duration::from_secs(1),
        };
        let (lead, other) = (remote(3), remote(4));
        assert_eq!(
            (lead.learner_rank(), other.learner_rank()),
            (Some(0), Some(1))
        );
        assert_eq!(lead.collectors_of(0), [0, 2]);
        assert_eq!(other.collectors_of(1), [1]);
        assert_eq!(remote(0).learner_rank(), None);
        for (roles, says) in [
            (
                "\"node.[01]\" = [\"collector\"]\n\"node.[234]\" = [\"learner\"]\n\"node.5\" = [\"evaluator\"]\n",
                "3 learners need a collector each",
            ),
            (
                "\"node.[01]\" = [\"collector\"]\n\"node.[23]\" = [\"learner\"]\n\"node.3\" = [\"evaluator\"]\n",
                "needs a worker of its own",
            ),
            (
                "\"node.[0123]\" = [\"collector\"]\n\"node.[34]\" = [\"learner\"]\n\"node.5\" = [\"evaluator\"]\n",
                "(node 3) collects too",
            ),
        ] {
            let e = with(roles, true).unwrap_err();
            assert!(
                e.contains("`task.roles`") && e.contains(says),
                "{says}: {e}"
            );
        }
    }
}
