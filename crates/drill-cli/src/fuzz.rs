//! The command line is input too: argument lists mutated from real ones, and the values the
//! commands parse themselves (`--sizes`, `--attach-to`), must parse or fail with a message,
//! never panic ([`drill_fuzz`]).

use clap::Parser;

use crate::Cli;
use crate::cmd::comm_bench::parse_sizes;
use crate::cmd::train::parallel::parse_attach;

#[global_allocator]
static ALLOC: drill_fuzz::CountingAlloc = drill_fuzz::CountingAlloc;

const DICT: &[&str] = &[
    "train",
    "eval",
    "bench",
    "env",
    "launch",
    "plot",
    "export",
    "--threads",
    "--seed",
    "--set",
    "--nproc-per-node",
    "--max-restarts",
    "--resume",
    "--sizes",
    "--iters",
    "--",
    "-q",
    "0",
    "-1",
    "18446744073709551616",
    "4294967295",
    "=",
    "1K,1M",
    "0=1,2",
    "policy.learn.batch_size=0",
];

/// Arguments are the input's NUL-separated (or, without NUL, space-separated) words.
fn args(b: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(b);
    let words: Vec<&str> = if text.contains('\0') {
        text.split('\0').collect()
    } else {
        text.split(' ').collect()
    };
    std::iter::once("drill")
        .chain(words)
        .map(str::to_string)
        .collect()
}

#[test]
fn command_lines() {
    let seeds: Vec<Vec<u8>> = [
        "train configs/cartpole_dqn.toml --seed 3 --set policy.learn.batch_size=32 --quiet",
        "train --resume runs/x --threads 2",
        "train configs/pong_ppo.toml --nproc-per-node 2 --max-restarts 1",
        "eval runs/x --episodes 5",
        "bench comm --sizes 1K,64K --iters 10",
        "bench learner --case nature-cnn-update --json",
        "env rollout PongNoFrameskip-v4 --steps 100 --out x.npz",
        "launch --nproc-per-node 2 -- drill train c.toml",
        "plot a b --out c.png",
        "export runs/x --out y",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    drill_fuzz::fuzz_with("command line", &seeds, DICT, |b| {
        let _ = Cli::try_parse_from(args(b));
    });
}

#[test]
fn argument_values() {
    let seeds: Vec<Vec<u8>> = ["1K,64K,1M", "64MiB", "4096", "0=1,2", "3=0"]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect();
    drill_fuzz::fuzz_with("argument values", &seeds, DICT, |b| {
        let s = String::from_utf8_lossy(b);
        let _ = parse_sizes(&s);
        let _ = parse_attach(&s, 4);
    });
}
