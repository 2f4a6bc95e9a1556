//! Atari through the `drill` binary: `drill env list/rollout/show`, and a short `pong_ppo`
//! training through the real ALE. The tests needing ALE run with `--features atari` and ROMs
//! (`ALE_ROM_DIR`); without the feature the binary must say how to get Atari.

mod common;
use common::{drill, repo, text};

#[test]
fn env_list_names_classic_and_atari_ids() {
    let out = drill().args(["env", "list"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let ids = String::from_utf8_lossy(&out.stdout);
    for id in ["CartPole-v1", "PongNoFrameskip-v4", "ALE/SpaceInvaders-v5"] {
        assert!(ids.lines().any(|l| l == id), "{id} missing");
    }
}

#[cfg(not(feature = "atari"))]
#[test]
fn a_build_without_atari_says_how_to_get_it_naming_the_key() {
    let out = drill()
        .arg("train")
        .arg(repo().join("configs/pong_ppo.toml"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let t = text(&out);
    assert!(
        t.contains("env.id") && t.contains("--features atari"),
        "{t}"
    );
}

#[cfg(feature = "atari")]
#[test]
fn rollout_writes_numpy_arrays_and_show_a_png() {
    let tmp = tempfile::tempdir().unwrap();
    let npz = tmp.path().join("pong.npz");
    let out = drill()
        .args(["env", "rollout", "PongNoFrameskip-v4", "--seed", "1"])
        .args(["--actions", "0,1,2,3,4,5,0,1"])
        .arg("--out")
        .arg(&npz)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let bytes = std::fs::read(&npz).unwrap();
    assert_eq!(&bytes[..2], b"PK", "an npz is a zip");
    for name in [
        "obs.npy",
        "actions.npy",
        "rewards.npy",
        "terminated.npy",
        "truncated.npy",
    ] {
        assert!(
            bytes.windows(name.len()).any(|w| w == name.as_bytes()),
            "{name}"
        );
    }
    let (descr, shape) = obs_header(&npz);
    assert_eq!(descr, "'|u1'");
    assert_eq!(
        shape,
        [9, 4, 84, 84],
        "8 actions: 9 observations of 4x84x84 bytes"
    );

    let png = tmp.path().join("frames.png");
    let out = drill()
        .args([
            "env",
            "show",
            "BreakoutNoFrameskip-v4",
            "--steps",
            "10",
            "-o",
        ])
        .arg(&png)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(&std::fs::read(&png).unwrap()[1..4], b"PNG");

    let out = drill()
        .args([
            "env",
            "rollout",
            "PongNoFrameskip-v4",
            "--actions",
            "7",
            "--out",
        ])
        .arg(&npz)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out).contains("7 is not one of the 6 actions"),
        "{}",
        text(&out)
    );
}

/// `drill env rollout` takes the wrapper options from `--set env.KEY=VALUE`, over a config's
/// `[env]` table or drill's defaults, and names a key it does not know.
#[cfg(feature = "atari")]
#[test]
fn rollout_takes_wrapper_options_from_set_and_config() {
    let tmp = tempfile::tempdir().unwrap();
    let npz = tmp.path().join("pong.npz");
    let rollout = |extra: &[&str]| {
        drill()
            .args(["env", "rollout", "PongNoFrameskip-v4", "--steps", "3"])
            .args(extra)
            .arg("--out")
            .arg(&npz)
            .output()
            .unwrap()
    };
    let cases: [(&[&str], u64); 3] = [
        (&[], 4),
        (&["--set", "env.frame_stack=1"], 1),
        (
            &[
                "--config",
                "configs/pong_ppo.toml",
                "--set",
                "env.frame_stack=2",
            ],
            2,
        ),
    ];
    for (extra, stack) in cases {
        let extra: Vec<String> = extra
            .iter()
            .map(|a| match *a {
                "configs/pong_ppo.toml" => repo().join(a).display().to_string(),
                _ => a.to_string(),
            })
            .collect();
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let out = rollout(&extra);
        assert!(out.status.success(), "{extra:?}: {}", text(&out));
        assert_eq!(obs_header(&npz).1, [4, stack, 84, 84], "{extra:?}");
    }
    let out = rollout(&["--set", "env.nope=1"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("env.nope"), "{}", text(&out));
}

/// The dtype and shape of `obs` in the archive (read back with npyz).
#[cfg(feature = "atari")]
fn obs_header(npz: &std::path::Path) -> (String, Vec<u64>) {
    let mut a = npyz::npz::NpzArchive::open(npz).unwrap();
    let arr = a.by_name("obs").unwrap().unwrap();
    (arr.dtype().descr(), arr.shape().to_vec())
}

/// `pong_ppo.toml` for `steps` env steps into `exp`, evaluated on one whole game, with the
/// thread count left to drill.
#[cfg(feature = "atari")]
fn short_pong_ppo(exp: &std::path::Path, steps: u64, extra: &[&str]) -> std::process::Output {
    drill()
        .arg("train")
        .arg(repo().join("configs/pong_ppo.toml"))
        .args(["--quiet", "--exp-dir"])
        .arg(exp)
        .args(["--set", &format!("max_env_step={steps}")])
        .args(["--set", "env.evaluator_env_num=1"])
        .args(["--set", "env.n_evaluator_episode=1"])
        .args(extra)
        .env_remove("DRILL_THREADS")
        .output()
        .unwrap()
}

#[cfg(feature = "atari")]
#[test]
fn pong_ppo_trains_through_the_real_ale() {
    let tmp = tempfile::tempdir().unwrap();
    let exp = tmp.path().join("pong");
    let out = short_pong_ppo(&exp, 2048, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let r = common::result(&exp);
    assert!(r["env_steps"].as_u64().unwrap() >= 2048, "{r}");
    assert_eq!(r["train_iters"].as_u64().unwrap(), 32, "{r}");
    let ret = r["eval_reward_mean"].as_f64().unwrap();
    assert!((-21.0..=21.0).contains(&ret), "a whole game of Pong: {r}");
    assert!(exp.join("ckpt/final.safetensors").exists());
}

/// `policy.precision = "bf16"` through the real ALE: a few iterations train, the log says
/// which kernels ran, and a convolutional net gets every core by default.
#[cfg(feature = "atari")]
#[test]
fn pong_ppo_trains_in_bf16_on_every_core() {
    let tmp = tempfile::tempdir().unwrap();
    let exp = tmp.path().join("pong");
    let out = short_pong_ppo(&exp, 3072, &["--set", "policy.precision=\"bf16\""]);
    let log = text(&out);
    assert!(out.status.success(), "{log}");
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let threads = if cores == 1 {
        "1 thread".to_string()
    } else {
        format!("{cores} threads")
    };
    assert!(
        log.contains(&format!("(rank 0 of 1, {threads}, bf16 products (")),
        "{log}"
    );
    // A CPU without AVX-512 BF16 runs the portable kernel, and the log says it is slow.
    let native = std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|c| c.contains(" avx512_bf16"));
    assert_eq!(
        log.contains("bf16 products (Portable)"),
        !native,
        "AVX-512 BF16 in /proc/cpuinfo: {native}\n{log}"
    );
    assert_eq!(log.contains("has no AVX-512 BF16"), !native, "{log}");
    let r = common::result(&exp);
    assert_eq!(r["train_iters"].as_u64().unwrap(), 48, "{r}");
    let losses = std::fs::read_to_string(exp.join("metrics.jsonl")).unwrap();
    assert!(
        losses
            .lines()
            .filter(|l| l.contains("losses/total_loss"))
            .count()
            >= 3,
        "{losses}"
    );
}
