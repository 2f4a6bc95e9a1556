//! Hosts made of Linux namespaces (`scripts/netns_hosts.sh`), removed on drop.

use std::process::Command;

use super::repo;

/// A set of namespace hosts: host K is `SET-hK` at 10.77.0.(K+1).
pub struct Hosts {
    /// The set's name (`DRILL_NETNS_SET`).
    pub set: String,
}

impl Hosts {
    /// `n` hosts in a set named after `tag` and this process.
    pub fn up(n: usize, tag: &str) -> Hosts {
        let hosts = Hosts {
            set: format!("d{tag}{}", std::process::id() % 10000),
        };
        let out = hosts
            .script()
            .args(["up", &n.to_string()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "netns_hosts.sh up: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        hosts
    }

    /// `netns_hosts.sh` for this set.
    pub fn script(&self) -> Command {
        let mut c = Command::new(repo().join("scripts/netns_hosts.sh"));
        c.env("DRILL_NETNS_SET", &self.set);
        c
    }

    /// `netns_hosts.sh HOW HOST [ARGS]` (cut, restore, freeze, thaw, loss), which must succeed.
    pub fn link(&self, host: usize, how: &str, args: &[&str]) {
        let out = self
            .script()
            .args([how, &host.to_string()])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{how} {host}: {out:?}");
    }

    /// A command run on `host` (its network, /dev/shm, /etc/hosts and hostname).
    pub fn on(&self, host: usize, program: &str) -> Command {
        let mut c = self.script();
        c.args(["exec", &host.to_string(), program]);
        c
    }

    /// Every process on `host` but the one holding its namespaces, with its state letter from
    /// `/proc/PID/stat` (`T`: stopped); processes gone while being read are left out.
    #[allow(dead_code)]
    pub fn processes(&self, host: usize) -> Vec<(u32, char)> {
        let holder = std::fs::read_to_string(format!("/run/drill-netns/{}/h{host}.pid", self.set))
            .unwrap_or_else(|e| panic!("host {host} of {}: {e}", self.set));
        let holder = holder.trim();
        let mnt = std::fs::read_link(format!("/proc/{holder}/ns/mnt")).unwrap();
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let name = entry.file_name();
            let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            if pid.to_string() == holder
                || std::fs::read_link(format!("/proc/{pid}/ns/mnt"))
                    .ok()
                    .as_ref()
                    != Some(&mnt)
            {
                continue;
            }
            // The state follows the command name, which is in parentheses and may hold spaces.
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            if let Some(state) = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].trim().chars().next())
            {
                found.push((pid, state));
            }
        }
        found
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        let _ = self.script().arg("down").status();
    }
}

/// Check, in the output `all` of a job with 2 ranks on each of hosts 0 and 1 of `set`, that
/// every rank used shared memory with the other rank of its host and TCP with the far ones.
pub fn assert_shm_inside_tcp_between(all: &str, set: &str) {
    for (rank, shm, tcp) in [
        (0, "[1]", "[2, 3]"),
        (1, "[0]", "[2, 3]"),
        (2, "[3]", "[0, 1]"),
        (3, "[2]", "[0, 1]"),
    ] {
        let want = format!(
            "rank {rank} on host {set}-h{} (10.77.0.{}:",
            rank / 2,
            rank / 2 + 1
        );
        let line = all
            .lines()
            .find(|l| l.contains(&want))
            .unwrap_or_else(|| panic!("no connection line for rank {rank}:\n{all}"));
        assert!(
            line.contains(&format!(
                "shared memory with ranks {shm}, TCP with ranks {tcp}"
            )),
            "{line}"
        );
    }
}
