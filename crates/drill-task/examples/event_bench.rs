//! Event round trip and 1 MiB model exchange between 2 processes (Parallel runner, star).
//! `cargo run --release -p drill-task --example event_bench [-- ITERS]`; node 0 prints medians.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use drill_task::parallel::{Parallel, Topology};
use drill_task::{OnlineRLContext, TaskError};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), TaskError> {
    let iters: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    Parallel::runner(2)
        .topology(Topology::Star)
        .run::<OnlineRLContext>(|task| {
            let h = task.handle().clone();
            let (tx, rx) = mpsc::channel::<()>();
            if h.match_labels(&["node.1"])? {
                let h2 = h.clone();
                h.on("ping", move |e| h2.emit("pong", &e.payload[..]).unwrap());
                let h3 = h.clone();
                h.on("model", move |_| h3.emit("ack", &()).unwrap());
                h.on("stop", move |_| tx.send(()).unwrap());
                h.barrier()?;
                rx.recv_timeout(Duration::from_secs(300))
                    .map_err(|_| TaskError::msg("no stop from node 0"))?;
                return Ok(());
            }
            let tx2 = tx.clone();
            h.on("pong", move |_| tx.send(()).unwrap());
            h.on("ack", move |_| tx2.send(()).unwrap());
            h.barrier()?;
            let wait = || {
                rx.recv_timeout(Duration::from_secs(10))
                    .map_err(|_| TaskError::msg("no reply from node 1"))
            };
            let small = [7u8; 16];
            let mut rtt = Vec::new();
            for i in 0..iters + 200 {
                let t = Instant::now();
                h.emit("ping", &small[..])?;
                wait()?;
                if i >= 200 {
                    rtt.push(t.elapsed().as_secs_f64() * 1e6);
                }
            }
            let model = vec![0.5f32; 262_144];
            let mut xfer = Vec::new();
            for i in 0..(iters / 20).max(20) + 5 {
                let t = Instant::now();
                h.emit("model", &model)?;
                wait()?;
                if i >= 5 {
                    xfer.push(t.elapsed().as_secs_f64() * 1e3);
                }
            }
            println!(
                "event round trip, 16 B payload, TCP loopback: median {:.1} us over {iters}",
                median(rtt)
            );
            println!(
                "model exchange, 1 MiB f32 state dict + ack: median {:.3} ms over {}",
                median(xfer.clone()),
                xfer.len()
            );
            h.emit("stop", &())?;
            Ok(())
        })
}
