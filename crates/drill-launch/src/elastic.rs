//! Elastic membership (`--nnodes MIN:MAX`): torchrun's dynamic rendezvous over drill's
//! authenticated store. The job runs in rounds; each round's nodes are agreed in the store,
//! and any change ends the round and starts the next one from the run's newest checkpoint:
//!
//! - a node lost (its ranks fail, or its launcher sends no heartbeat for
//!   `keep_alive_interval * keep_alive_max_attempt`): the round ends, the survivors meet in the
//!   next one, which closes as soon as every node of the last round has rejoined or is known
//!   gone, and go on with the new world size if at least MIN remain (else they wait up to
//!   `join_timeout` for others, then end naming who left and when);
//! - a node that arrives while a round runs (started late, or back after a cut or a freeze)
//!   waits for the next round and asks for it: every rank is sent SIGINT, so drill train saves
//!   a checkpoint at its current step and exits, and the next round starts from it with the
//!   newcomer; a node that would make more than MAX is refused by name;
//! - the first round closes when MAX nodes came, or `last_call_timeout` after MIN did.
//!
//! Node ranks keep the last round's order (the nodes that stay come first), so rank 0 and
//! the experiment folder it writes stay on the same host unless that host leaves. A round
//! that ended in a rank's failure counts against `--max-restarts` only when every node of the
//! round came back (a node that left explains the failure: a membership change is free). The
//! node hosting the store must stay: the store is the job's memory.
//!
//! Store keys (under the job's prefix): `latest` (the newest closed round), `round{R}/join`
//! (arrivals), `round{R}/node/{I}` (arrival I's [`Entry`]), `round{R}/closed` (the
//! [`Decision`]), `round{R}/failed`, `round{R}/done`, `hb/{ID}` (heartbeats), `gone/{ID}` (why a
//! node left on its own), `refused`, `refused/{K}`, `finished`.

use std::time::{Duration, Instant, SystemTime};

use drill_comm::store::{Heartbeat, Liveness};
use drill_comm::{Store, Token};

use crate::rendezvous::{Placement, Rendezvous, text};
use crate::workers::{self, Failure, Peers, RoundEnd, Signals, Stop};
use crate::{LaunchConfig, LaunchError, Outcome};

/// `--nnodes MIN:MAX` and the timeouts of `--rdzv-conf` (torchrun's names).
#[derive(Clone, Debug, PartialEq)]
pub struct Elastic {
    /// Fewest nodes the job trains with.
    pub min_nodes: usize,
    /// Most nodes the job admits.
    pub max_nodes: usize,
    /// How long a round may wait for MIN nodes (`join_timeout`, torchrun's 600 s).
    pub join_timeout: Duration,
    /// How long the first round waits for more nodes once MIN came (`last_call_timeout`,
    /// torchrun's 30 s).
    pub last_call: Duration,
    /// Heartbeat period (`keep_alive_interval`).
    pub keep_alive: Duration,
    /// Heartbeats missed before a node counts as gone (`keep_alive_max_attempt`).
    pub keep_alive_misses: u32,
}

impl Elastic {
    /// MIN:MAX with the default timeouts. Heartbeats are tighter than torchrun's (5 s times
    /// 3): a lost host is noticed by its peers' collectives within seconds anyway.
    pub fn new(min_nodes: usize, max_nodes: usize) -> Elastic {
        Elastic {
            min_nodes,
            max_nodes,
            join_timeout: Duration::from_secs(600),
            last_call: Duration::from_secs(30),
            keep_alive: Duration::from_secs(1),
            keep_alive_misses: 5,
        }
    }

    /// Apply `--rdzv-conf KEY=VALUE,...` (seconds; `keep_alive_max_attempt` a count).
    pub fn configure(&mut self, conf: &str) -> Result<(), String> {
        for item in conf.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| format!("--rdzv-conf {item:?}: expected KEY=VALUE"))?;
            let secs = || match v.parse::<f64>() {
                Ok(s) if s.is_finite() && s > 0.0 => Ok(Duration::from_secs_f64(s)),
                _ => Err(format!("--rdzv-conf {k}={v}: expected positive seconds")),
            };
            match k {
                "join_timeout" | "timeout" => self.join_timeout = secs()?,
                "last_call_timeout" => self.last_call = secs()?,
                "keep_alive_interval" => self.keep_alive = secs()?,
                "keep_alive_max_attempt" => {
                    self.keep_alive_misses =
                        v.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                            format!("--rdzv-conf {k}={v}: expected a positive count")
                        })?
                }
                _ => {
                    return Err(format!(
                        "--rdzv-conf {k}: unknown key (known: join_timeout, last_call_timeout, keep_alive_interval, keep_alive_max_attempt)"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Silence after which a node counts as gone.
    fn dead_after(&self) -> Duration {
        self.keep_alive * self.keep_alive_misses
    }

    /// `MIN:MAX` as written.
    fn range(&self) -> String {
        format!("{}:{}", self.min_nodes, self.max_nodes)
    }
}

/// `--nnodes` (`N`, or `MIN:MAX`: elastic) and `--rdzv-conf` (`conf`, only for an elastic
/// job): the node count (MAX) and the elastic range with its settings.
pub fn parse_nnodes(s: &str, conf: &str) -> Result<(usize, Option<Elastic>), String> {
    let (n, mut elastic) = parse_range(s)?;
    match &mut elastic {
        Some(el) => el.configure(conf)?,
        None if !conf.is_empty() => {
            return Err("--rdzv-conf is for an elastic job (--nnodes MIN:MAX)".into());
        }
        None => {}
    }
    Ok((n, elastic))
}

/// `--nnodes` alone.
fn parse_range(s: &str) -> Result<(usize, Option<Elastic>), String> {
    let num = |t: &str| {
        t.trim()
            .parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("--nnodes {s:?}: expected N or MIN:MAX, positive numbers"))
    };
    match s.split_once(':') {
        None => Ok((num(s)?, None)),
        Some((lo, hi)) => {
            let (lo, hi) = (num(lo)?, num(hi)?);
            if lo > hi {
                return Err(format!("--nnodes {s}: MIN is above MAX"));
            }
            Ok((hi, Some(Elastic::new(lo, hi))))
        }
    }
}

/// One node's arrival at a round.
#[derive(Clone, Debug, PartialEq)]
struct Entry {
    /// Unique per launcher: host name, process id and a random part.
    id: String,
    /// The host's name, for people.
    name: String,
    /// Ranks it brings.
    nproc: usize,
    /// Its node rank in the round before, if it was in it.
    prev: Option<usize>,
}

impl Entry {
    fn encode(&self) -> String {
        let prev = self.prev.map_or("-".into(), |p| p.to_string());
        format!("{}\t{}\t{}\t{prev}", self.id, self.name, self.nproc)
    }

    fn decode(s: &str) -> Option<Entry> {
        let mut f = s.split('\t');
        Some(Entry {
            id: f.next()?.into(),
            name: f.next()?.into(),
            nproc: f.next()?.parse().ok()?,
            prev: f.next()?.parse().ok(),
        })
    }
}

/// How a round closed: its nodes in node-rank order, the ones refused, the last round's nodes
/// that did not come back (and why), failures counted so far.
#[derive(Clone, Debug, Default, PartialEq)]
struct Decision {
    members: Vec<Entry>,
    refused: Vec<Entry>,
    left: Vec<(Entry, String)>,
    failures: usize,
}

impl Decision {
    fn encode(&self) -> String {
        let mut s = format!("f\t{}\n", self.failures);
        for m in &self.members {
            s.push_str(&format!("m\t{}\n", m.encode()));
        }
        for m in &self.refused {
            s.push_str(&format!("r\t{}\n", m.encode()));
        }
        for (m, why) in &self.left {
            s.push_str(&format!("l\t{}\t{why}\n", m.encode()));
        }
        s
    }

    fn decode(s: &str) -> Option<Decision> {
        let mut d = Decision::default();
        for line in s.lines() {
            let (kind, rest) = line.split_once('\t')?;
            match kind {
                "f" => d.failures = rest.parse().ok()?,
                "m" => d.members.push(Entry::decode(rest)?),
                "r" => d.refused.push(Entry::decode(rest)?),
                "l" => {
                    let (e, why) = rest.rsplit_once('\t')?;
                    d.left.push((Entry::decode(e)?, why.into()));
                }
                _ => return None,
            }
        }
        Some(d)
    }

    fn names(&self) -> String {
        self.members
            .iter()
            .map(|m| m.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The time of day of `t`, UTC, for messages (`HH:MM:SS UTC`).
fn clock(t: SystemTime) -> String {
    let s = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    format!("{:02}:{:02}:{:02} UTC", s / 3600 % 24, s / 60 % 60, s % 60)
}

/// This launcher in the elastic job: its identity, its heartbeat, its view of the others.
struct Node<'a> {
    cfg: &'a LaunchConfig,
    el: &'a Elastic,
    rdzv: &'a Rendezvous,
    store: Store,
    me: Entry,
    /// The other launchers' heartbeats, as this one saw them.
    live: Liveness,
    /// This launcher's heartbeat, until it leaves.
    beat: Option<Heartbeat>,
    /// Refusals already said.
    refusals_seen: i64,
}

impl<'a> Node<'a> {
    fn start(
        cfg: &'a LaunchConfig,
        el: &'a Elastic,
        rdzv: &'a Rendezvous,
        token: &str,
    ) -> Result<Node<'a>, LaunchError> {
        let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "?".into());
        // A fresh RandomState is randomly keyed: its empty hash is a random number.
        let nonce = {
            use std::hash::{BuildHasher, Hasher};
            std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish()
                & 0xffff_ffff
        };
        // Named host:pid, as torchrun names its agents: two launchers on one host stay apart.
        let name = format!("{name}:{}", std::process::id());
        let id = format!("{name}:{nonce:08x}");
        // Its own connection: a heartbeat must not wait behind a request of the main loop.
        let prefix = format!("launch/{}", cfg.rdzv_id);
        let hb = Store::connect(&rdzv.host, rdzv.port, &Token::new(token), cfg.timeout)?
            .with_prefix(&prefix)
            .with_reply_slack(Duration::from_secs(2));
        let beat = Heartbeat::every(hb, format!("hb/{id}"), el.keep_alive);
        Ok(Node {
            cfg,
            el,
            rdzv,
            store: rdzv.store.clone(),
            me: Entry {
                id,
                name,
                nproc: cfg.nproc_per_node,
                prev: None,
            },
            live: Liveness::with_bound(rdzv.store.clone(), el.dead_after()),
            beat: Some(beat),
            refusals_seen: 0,
        })
    }

    /// Why node `id` counts as gone, if it does: its own word (`gone/{id}`), or a heartbeat
    /// silent past the limit (since when). An unreachable store says nothing of it.
    fn gone(&mut self, id: &str) -> Option<String> {
        if let Some(why) = text(&self.store, &format!("gone/{id}")) {
            return Some(why);
        }
        let silent = self.live.silent(&format!("hb/{id}")).ok()??;
        Some(format!(
            "no heartbeat since {}",
            clock(SystemTime::now() - silent)
        ))
    }

    /// Say why this node leaves (read by the others as it goes) and stop its heartbeat.
    fn leave(&mut self, why: &str) {
        let _ = self.store.set(
            &format!("gone/{}", self.me.id),
            format!("{why} at {}", clock(SystemTime::now())).as_bytes(),
        );
        self.beat.take();
    }

    /// Round `r`'s decision, if it closed.
    fn decision(&self, r: usize) -> Result<Option<Decision>, LaunchError> {
        let k = format!("round{r}/closed");
        if !self.store.check(&[&k])? {
            return Ok(None);
        }
        let v = self.store.get(&k)?;
        Decision::decode(&String::from_utf8_lossy(&v))
            .map(Some)
            .ok_or_else(|| LaunchError::Usage(format!("rendezvous: round {r}'s record is corrupt")))
    }

    /// The arrivals at round `r` so far (an arrival whose entry is not written yet is left
    /// for the next look).
    fn arrivals(&self, r: usize) -> Result<Vec<Entry>, LaunchError> {
        let n = self.store.add(&format!("round{r}/join"), 0)?;
        let mut out = Vec::new();
        for i in 0..n {
            let k = format!("round{r}/node/{i}");
            if self.store.check(&[&k])?
                && let Some(e) = Entry::decode(&String::from_utf8_lossy(&self.store.get(&k)?))
                && !out.iter().any(|o: &Entry| o.id == e.id)
            {
                // Once per node: an arrival retried after a lost reply is the same node.
                out.push(e);
            }
        }
        Ok(out)
    }

    /// Meet the other nodes in round `r` (or a later one, when `r` closes without this
    /// node): the decision of the round this node is in, and that round; `None` when the
    /// job finished first. Refused (more than MAX) or below MIN for `join_timeout`: an error
    /// naming the nodes.
    fn join(&mut self, mut r: usize) -> Result<Option<(usize, Decision)>, LaunchError> {
        let started = Instant::now();
        let mut said = false;
        loop {
            match self.join_from(&mut r, started) {
                // Behind a cut link the store is out of reach: keep trying until the join
                // timeout (an arrival sent twice counts once: arrivals are told apart by id).
                Err(LaunchError::Comm(_)) if self.store_host_ended() => {
                    self.leave("the store's host ended");
                    return Err(LaunchError::Usage(format!(
                        "the rendezvous store at {}:{} refuses connections: the launcher hosting it has ended (the job finished or failed while host {} was away), so this host cannot rejoin",
                        self.rdzv.host, self.rdzv.port, self.me.name
                    )));
                }
                Err(LaunchError::Comm(e)) if started.elapsed() < self.el.join_timeout => {
                    if !said {
                        eprintln!(
                            "drill launch: rendezvous store at {}:{} out of reach ({e}); trying again",
                            self.rdzv.host, self.rdzv.port
                        );
                        said = true;
                    }
                    std::thread::sleep(Duration::from_millis(500));
                }
                other => return other,
            }
        }
    }

    /// Whether the store's host answers but nothing listens on the store's port: its
    /// launcher has ended (a cut link or a frozen host time out instead).
    fn store_host_ended(&self) -> bool {
        use std::net::ToSocketAddrs;
        let Some(addr) = (self.rdzv.host.as_str(), self.rdzv.port)
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
        else {
            return false;
        };
        matches!(
            std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused
        )
    }

    /// [`Node::join`] from round `*r`, which it advances as rounds close without this node.
    fn join_from(
        &mut self,
        next: &mut usize,
        started: Instant,
    ) -> Result<Option<(usize, Decision)>, LaunchError> {
        'rounds: loop {
            let r = *next;
            if self.finished()? {
                return Ok(None);
            }
            if self.me.prev.is_none() && r > 0 {
                // A newcomer: refused if the running round is full.
                if let Some(d) = self.decision(r - 1)?
                    && d.members.len() >= self.el.max_nodes
                    && !self.done(r - 1, d.members.len())?
                {
                    return Err(self.refuse(&d));
                }
            }
            let i = self.store.add(&format!("round{r}/join"), 1)? - 1;
            self.store
                .set(&format!("round{r}/node/{i}"), self.me.encode().as_bytes())?;
            let mut min_at: Option<Instant> = None;
            loop {
                if let Some(d) = self.decision(r)? {
                    if d.members.iter().any(|m| m.id == self.me.id) {
                        return Ok(Some((r, d)));
                    }
                    if d.refused.iter().any(|m| m.id == self.me.id) {
                        return Err(self.refuse(&d));
                    }
                    // Closed without this node: it waits for the next round.
                    self.me.prev = None;
                    *next = r + 1;
                    continue 'rounds;
                }
                self.try_close(r, &mut min_at)?;
                if self.finished()? {
                    return Ok(None);
                }
                if started.elapsed() >= self.el.join_timeout {
                    return Err(self.below_min(r)?);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// Close round `r` if it can be: MIN nodes are there and either every node of the round
    /// before has rejoined or is gone, or (the first round) MAX came or the last call passed.
    fn try_close(&mut self, r: usize, min_at: &mut Option<Instant>) -> Result<(), LaunchError> {
        let arrived = self.arrivals(r)?;
        if arrived.len() < self.el.min_nodes {
            return Ok(());
        }
        let first_at = *min_at.get_or_insert_with(Instant::now);
        let before = match r {
            0 => None,
            _ => self.decision(r - 1)?,
        };
        let mut left = Vec::new();
        let ready = match &before {
            None => arrived.len() >= self.el.max_nodes || first_at.elapsed() >= self.el.last_call,
            Some(d) => {
                let mut all = true;
                for m in &d.members {
                    if arrived.iter().any(|a| a.id == m.id) {
                        continue;
                    }
                    match self.gone(&m.id) {
                        Some(why) => left.push((m.clone(), why)),
                        None => all = false,
                    }
                }
                all
            }
        };
        if !ready {
            return Ok(());
        }
        let mut order: Vec<(usize, Entry)> = arrived.into_iter().enumerate().collect();
        // The nodes that stay keep their order; newcomers follow in order of arrival.
        order.sort_by_key(|(i, e)| (e.prev.unwrap_or(usize::MAX), *i));
        let mut members: Vec<Entry> = order.into_iter().map(|(_, e)| e).collect();
        let refused = members.split_off(members.len().min(self.el.max_nodes));
        let failures = before.as_ref().map_or(0, |d| d.failures)
            + usize::from(r > 0 && left.is_empty() && self.failed_text(r - 1).is_some());
        let d = Decision {
            members,
            refused,
            left,
            failures,
        };
        self.store
            .compare_set(&format!("round{r}/closed"), b"", d.encode().as_bytes())?;
        self.store.set("latest", r.to_string().as_bytes())?;
        Ok(())
    }

    /// Round `r`'s failure report, if any.
    fn failed_text(&self, r: usize) -> Option<String> {
        text(&self.store, &format!("round{r}/failed"))
    }

    /// Whether round `r`'s `n` nodes all finished it.
    fn done(&self, r: usize, n: usize) -> Result<bool, LaunchError> {
        Ok(self.store.add(&format!("round{r}/done"), 0)? as usize >= n)
    }

    fn finished(&self) -> Result<bool, LaunchError> {
        Ok(self.store.check(&["finished"])?)
    }

    /// The error of a node refused because the job has MAX nodes; the running nodes are told.
    fn refuse(&mut self, d: &Decision) -> LaunchError {
        let why = format!(
            "host {} refused: job {:?} already has {} node(s) ({}), the most --nnodes {} admits",
            self.me.name,
            self.cfg.rdzv_id,
            d.members.len(),
            d.names(),
            self.el.range()
        );
        if let Ok(k) = self.store.add("refused", 1) {
            let _ = self
                .store
                .set(&format!("refused/{}", k - 1), why.as_bytes());
        }
        self.leave("refused");
        LaunchError::Usage(why)
    }

    /// The error of a round that did not reach MIN nodes in `join_timeout`.
    fn below_min(&mut self, r: usize) -> Result<LaunchError, LaunchError> {
        let arrived = self.arrivals(r)?;
        let names: Vec<&str> = arrived.iter().map(|e| e.name.as_str()).collect();
        let mut left = Vec::new();
        if r > 0
            && let Some(d) = self.decision(r - 1)?
        {
            for m in d
                .members
                .iter()
                .filter(|m| !arrived.iter().any(|a| a.id == m.id))
            {
                let why = self
                    .gone(&m.id)
                    .unwrap_or_else(|| "alive but did not rejoin".into());
                left.push(format!("{} ({why})", m.name));
            }
        }
        let left = if left.is_empty() {
            String::new()
        } else {
            format!("; left since round {}: {}", r - 1, left.join(", "))
        };
        self.leave("below the minimum");
        Ok(LaunchError::Usage(format!(
            "round {r}: only {} node(s) ({}) of the {} --nnodes {} needs joined within {:?}{left}",
            arrived.len(),
            names.join(", "),
            self.el.min_nodes,
            self.el.range(),
            self.el.join_timeout
        )))
    }

    /// The job is over: nodes still waiting to join learn it, and the hosting node keeps the
    /// store up until the round's `n` nodes have finished.
    fn finish(&self, r: usize, n: usize) {
        let _ = self.store.set("finished", b"1");
        self.rdzv.finish_nodes(r, n);
    }
}

impl Drop for Node<'_> {
    fn drop(&mut self) {
        if self.beat.is_some() {
            self.leave("its launcher ended");
        }
    }
}

/// The other nodes while round `round` runs: failures, arrivals, silence.
struct Watch<'n, 'a> {
    node: &'n mut Node<'a>,
    round: usize,
    members: Vec<Entry>,
    last_beat_check: Instant,
    /// When the store last answered.
    store_seen: Instant,
}

impl Peers for Watch<'_, '_> {
    fn report_failure(&self, what: &str) {
        let _ = self.node.store.compare_set(
            &format!("round{}/failed", self.round),
            b"",
            what.as_bytes(),
        );
    }

    fn poll(&mut self) -> Option<Stop> {
        let node = &mut *self.node;
        if let Some(f) = node.failed_text(self.round) {
            return Some(Stop::Failed(f));
        }
        let refused = node.store.add("refused", 0);
        if refused.is_ok() {
            self.store_seen = Instant::now();
        } else if self.store_seen.elapsed() >= node.el.dead_after() {
            // This node is cut off, or the store's host is gone: either way the round is
            // over; the next rendezvous keeps trying the store until the join timeout.
            return Some(Stop::Failed(format!(
                "the rendezvous store at {}:{} has not answered since {}",
                node.rdzv.host,
                node.rdzv.port,
                clock(SystemTime::now() - self.store_seen.elapsed())
            )));
        }
        if let Ok(n) = refused
            && n > node.refusals_seen
        {
            for k in node.refusals_seen..n {
                if let Ok(v) = node.store.get(&format!("refused/{k}")) {
                    eprintln!("drill launch: {}", String::from_utf8_lossy(&v));
                }
            }
            node.refusals_seen = n;
        }
        if let Ok(next) = node.arrivals(self.round + 1)
            && let Some(e) = next.first()
        {
            return Some(Stop::Change(format!("host {} asks to join", e.name)));
        }
        if self.last_beat_check.elapsed() >= Duration::from_millis(500) {
            self.last_beat_check = Instant::now();
            for (n, m) in self.members.iter().enumerate() {
                if m.id == node.me.id {
                    continue;
                }
                if let Some(why) = node.gone(&m.id) {
                    let what = format!("host {} (node {n}) is gone: {why}", m.name);
                    self.report_failure(&what);
                    return Some(Stop::Failed(what));
                }
            }
        }
        None
    }
}

/// Run the elastic job to its end (`cfg.elastic` is set, `cfg.rdzv_endpoint` given).
pub(crate) fn run(
    cfg: &LaunchConfig,
    el: &Elastic,
    token: &str,
    signals: &Signals,
) -> Result<Outcome, LaunchError> {
    let rdzv = Rendezvous::join(cfg, token)?;
    let mut node = Node::start(cfg, el, &rdzv, token)?;
    // A node arriving at a running job meets it in the round after the newest closed one.
    let mut round = match node.store.check(&["latest"])? {
        true => {
            String::from_utf8_lossy(&node.store.get("latest")?)
                .parse::<usize>()
                .unwrap_or(0)
                + 1
        }
        false => 0,
    };
    let mut last_failure: Option<Failure> = None;
    loop {
        let Some((r, d)) = node.join(round)? else {
            // A node back from a cut or a freeze after the others had finished.
            eprintln!(
                "drill launch: job {:?} finished before host {} could rejoin it",
                cfg.rdzv_id, node.me.name
            );
            node.leave("the job finished");
            return Ok(Outcome::Success { restarts: 0 });
        };
        let me = d
            .members
            .iter()
            .position(|m| m.id == node.me.id)
            .unwrap_or(0);
        let offset: usize = d.members[..me].iter().map(|m| m.nproc).sum();
        let world: usize = d.members.iter().map(|m| m.nproc).sum();
        for (m, why) in &d.left {
            eprintln!("drill launch: round {r}: host {} left ({why})", m.name);
        }
        eprintln!(
            "drill launch: round {r}: {} node(s) ({}), {world} rank(s); this host is node {me} (--nnodes {})",
            d.members.len(),
            d.names(),
            el.range()
        );
        if d.failures > cfg.max_restarts {
            let failure = last_failure.take().unwrap_or_else(|| Failure {
                rank: None,
                node_rank: me,
                pid: 0,
                status: None,
                log: None,
                remote: node.failed_text(r.saturating_sub(1)),
            });
            eprintln!(
                "drill launch: giving up after {} failed round(s) (--max-restarts {})",
                d.failures, cfg.max_restarts
            );
            node.leave("out of restarts");
            return Ok(Outcome::Failed {
                failure,
                restarts: d.failures - 1,
            });
        }
        let placement = Placement {
            node_rank: me,
            rank_offset: offset,
            world_size: world,
            master_addr: rdzv.host.clone(),
            master_port: rdzv.port,
        };
        let mut watch = Watch {
            node: &mut node,
            round: r,
            members: d.members.clone(),
            last_beat_check: Instant::now(),
            store_seen: Instant::now(),
        };
        match workers::run_round(cfg, &placement, token, r, &mut watch, signals)? {
            RoundEnd::Success | RoundEnd::Changed(true) => {
                node.finish(r, d.members.len());
                node.leave("the job finished");
                return Ok(Outcome::Success {
                    restarts: d.failures,
                });
            }
            RoundEnd::Interrupted(signal, finished) => {
                node.leave("interrupted");
                return Ok(Outcome::Interrupted { signal, finished });
            }
            RoundEnd::Failed(f) => {
                eprintln!("drill launch: {f}");
                last_failure = Some(f);
            }
            RoundEnd::Changed(false) => {}
        }
        node.me.prev = Some(me);
        round = r + 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nnodes_and_rdzv_conf_parse_or_name_what_is_wrong() {
        assert_eq!(parse_nnodes("3", "").unwrap(), (3, None));
        let (n, el) = parse_nnodes("2:3", "").unwrap();
        assert_eq!(
            (n, el.clone().map(|e| (e.min_nodes, e.max_nodes))),
            (3, Some((2, 3)))
        );
        assert!(
            parse_nnodes("3:2", "")
                .unwrap_err()
                .contains("MIN is above MAX")
        );
        assert!(parse_nnodes("0:2", "").unwrap_err().contains("positive"));
        assert!(
            parse_nnodes("2", "join_timeout=3")
                .unwrap_err()
                .contains("--rdzv-conf is for an elastic job")
        );
        let (_, tuned) = parse_nnodes("1:2", "last_call_timeout=4").unwrap();
        assert_eq!(tuned.unwrap().last_call, Duration::from_secs(4));
        let mut el = el.unwrap();
        el.configure("join_timeout=20, last_call_timeout=0.5,keep_alive_max_attempt=3")
            .unwrap();
        assert_eq!(el.join_timeout, Duration::from_secs(20));
        assert_eq!(el.last_call, Duration::from_millis(500));
        assert_eq!(el.dead_after(), Duration::from_secs(3));
        assert!(el.configure("join=3").unwrap_err().contains("unknown key"));
        assert!(
            el.configure("join_timeout=-1")
                .unwrap_err()
                .contains("positive seconds")
        );
    }

    #[test]
    fn a_decision_reads_back_as_written() {
        let e = |id: &str, prev| Entry {
            id: id.into(),
            name: format!("host-{id}"),
            nproc: 2,
            prev,
        };
        let d = Decision {
            members: vec![e("a", Some(0)), e("c", None)],
            refused: vec![e("d", None)],
            left: vec![(e("b", Some(1)), "no heartbeat since 10:00:00 UTC".into())],
            failures: 2,
        };
        assert_eq!(Decision::decode(&d.encode()), Some(d));
    }
}
