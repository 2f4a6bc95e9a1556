//! What the launcher says when it passes an interrupt on: ranks that stop on it (exit 130,
//! as `drill train` does) leave the job interrupted; ranks that all exit 0 had finished when
//! it came (`finished`), which is how `drill train` tells a run that Ctrl-C stopped from one
//! that ended as Ctrl-C came.

use std::path::Path;
use std::time::{Duration, Instant};

use drill_launch::{LaunchConfig, Outcome};

fn config(script: String) -> LaunchConfig {
    LaunchConfig {
        nproc_per_node: 2,
        nnodes: 1,
        node_rank: Some(0),
        master_addr: "127.0.0.1".into(),
        master_port: drill_comm::spawn::free_port(),
        rdzv_endpoint: None,
        rdzv_id: "interrupt".into(),
        max_restarts: 0,
        monitor_interval: Duration::from_millis(20),
        grace: Duration::from_secs(5),
        log_dir: None,
        timeout: Duration::from_secs(60),
        program: "sh".into(),
        args: vec!["-c".into(), script],
        env: Vec::new(),
        bind: None,
        elastic: None,
        optional: Vec::new(),
    }
}

#[test]
fn an_interrupt_says_whether_the_ranks_had_finished() {
    let dir = std::env::temp_dir().join(format!("drill-launch-interrupt-{}", std::process::id()));
    for (exit, finished) in [(0, true), (130, false)] {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // Each rank says it is ready once its trap is set; the interrupt comes after both.
        let script = format!(
            "trap 'exit {exit}' INT; touch {}/ready-$RANK; while :; do sleep 0.05; done",
            dir.display()
        );
        let cfg = config(script);
        let job = std::thread::spawn(move || drill_launch::launch(&cfg));
        let ready = |r: usize| Path::new(&dir).join(format!("ready-{r}")).exists();
        let start = Instant::now();
        while !(ready(0) && ready(1)) {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the ranks never started"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        // SAFETY: kill(2) touches no memory; the launcher's handler records the signal.
        unsafe { libc::kill(libc::getpid(), libc::SIGINT) };
        let outcome = job.join().unwrap().unwrap();
        // `drill launch` itself ends with 128 + the signal either way (torchrun's convention
        // for any command): only `drill train`, whose ranks stop early on it, reads `finished`.
        assert_eq!(outcome.exit_code(), 130);
        match outcome {
            Outcome::Interrupted {
                signal,
                finished: f,
            } => {
                assert_eq!(signal, libc::SIGINT);
                assert_eq!(f, finished, "ranks exiting {exit}");
            }
            _ => panic!("ranks exiting {exit} after the interrupt: not an interrupted job"),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
