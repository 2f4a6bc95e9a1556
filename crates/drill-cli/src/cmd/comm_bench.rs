//! `drill bench comm`: verified collective timings (nccl-tests' algbw/busbw), run under
//! `drill launch` or mpirun.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Instant;

use anyhow::{Context, bail};
use drill_comm::{BackendKind, InitOptions, ProcessGroup, ReduceOp};

/// Operations the benchmark knows.
pub const OPS: [&str; 10] = [
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "gather",
    "scatter",
    "reduce_scatter",
    "send_recv",
    "barrier",
    "tcp_stream",
];
const DEFAULT_SIZES: [usize; 5] = [1 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20];

/// Parse `1024,1M,64MiB` style sizes.
pub fn parse_sizes(s: &str) -> anyhow::Result<Vec<usize>> {
    s.split(',')
        .map(|t| {
            let t = t.trim().to_ascii_lowercase();
            let (num, mul) = match t.trim_end_matches("ib").trim_end_matches('b') {
                x if x.ends_with('k') => (x[..x.len() - 1].to_string(), 1usize << 10),
                x if x.ends_with('m') => (x[..x.len() - 1].to_string(), 1 << 20),
                x if x.ends_with('g') => (x[..x.len() - 1].to_string(), 1 << 30),
                x => (x.to_string(), 1),
            };
            num.parse::<usize>()
                .ok()
                .and_then(|n| n.checked_mul(mul))
                .with_context(|| format!("--sizes: {t:?} is not a size"))
        })
        .collect()
}

fn bus_factor(op: &str, n: usize) -> f64 {
    let n = n as f64;
    match op {
        "all_reduce" => 2.0 * (n - 1.0) / n,
        "all_gather" | "reduce_scatter" => (n - 1.0) / n,
        _ => 1.0,
    }
}

/// `Err` naming the first element of rank `r`'s reduced `buf` that is not the sum over the
/// `n` ranks of their `val(rank, element)`.
fn check_sums(
    op: &str,
    size: usize,
    r: usize,
    n: usize,
    buf: &[f32],
    val: impl Fn(usize, usize) -> f32,
) -> anyhow::Result<()> {
    for (i, &x) in buf.iter().enumerate() {
        let want: f32 = (0..n).map(|q| val(q, i)).sum();
        if x != want {
            bail!("{op} {size} B: rank {r} element {i} is {x}, expected {want}");
        }
    }
    Ok(())
}

/// One measured operation: verify, then time `iters` runs (the slowest rank's time counts).
fn bench_one(
    pg: &ProcessGroup,
    op: &str,
    size: usize,
    iters: usize,
    tcp: &mut Option<TcpStream>,
) -> anyhow::Result<Vec<f64>> {
    let (n, r) = (pg.world_size(), pg.rank());
    let count = size / 4;
    let val = |rank: usize, i: usize| ((rank + i) % 7) as f32;
    let mut buf: Vec<f32> = (0..count).map(|i| val(r, i)).collect();
    let mut out = vec![0f32; count * n];
    let mut part = vec![0f32; count / n.max(1)];
    let full: Vec<f32> = (0..part.len() * n).map(|i| val(r, i)).collect();
    let scattered: Vec<f32> = (0..part.len() * n).map(|i| val(0, i)).collect();
    let mut ack = [0f32; 1];
    let mut run = |verify: bool| -> anyhow::Result<()> {
        match op {
            "all_reduce" => {
                if verify {
                    buf.iter_mut().enumerate().for_each(|(i, x)| *x = val(r, i));
                }
                pg.all_reduce(&mut buf, ReduceOp::Sum)?;
                if verify {
                    check_sums("all_reduce", size, r, n, &buf, val)?;
                }
            }
            "broadcast" => {
                if verify && r != 0 {
                    buf.iter_mut().for_each(|x| *x = -1.0);
                }
                pg.broadcast(&mut buf, 0)?;
                if verify && let Some(i) = (0..count).find(|&i| buf[i] != val(0, i)) {
                    bail!(
                        "broadcast {size} B: rank {r} element {i} is {}, expected {}",
                        buf[i],
                        val(0, i)
                    );
                }
            }
            "all_gather" => {
                pg.all_gather(&buf, &mut out)?;
                if verify
                    && let Some(i) =
                        (0..count * n).find(|&i| out[i] != val(i / count.max(1), i % count.max(1)))
                {
                    bail!("all_gather {size} B: rank {r} element {i} is wrong");
                }
            }
            "reduce_scatter" => {
                pg.reduce_scatter(&full, &mut part, ReduceOp::Sum)?;
                if verify {
                    for (j, &x) in part.iter().enumerate() {
                        let i = r * part.len() + j;
                        let want: f32 = (0..n).map(|q| val(q, i)).sum();
                        if x != want {
                            bail!(
                                "reduce_scatter {size} B: rank {r} element {j} is {x}, expected {want}"
                            );
                        }
                    }
                }
            }
            "reduce" => {
                if verify {
                    buf.iter_mut().enumerate().for_each(|(i, x)| *x = val(r, i));
                }
                pg.reduce(&mut buf, ReduceOp::Sum, 0)?;
                if verify && r == 0 {
                    check_sums("reduce", size, r, n, &buf, val)?;
                }
            }
            "gather" => {
                pg.gather(&buf, (r == 0).then_some(&mut out[..]), 0)?;
                if verify
                    && r == 0
                    && let Some(i) =
                        (0..count * n).find(|&i| out[i] != val(i / count.max(1), i % count.max(1)))
                {
                    bail!("gather {size} B: element {i} is wrong");
                }
            }
            "scatter" => {
                // Block q of rank 0's buffer is rank q's.
                pg.scatter((r == 0).then_some(&scattered[..]), &mut part, 0)?;
                if verify
                    && let Some(j) =
                        (0..part.len()).find(|&j| part[j] != val(0, r * part.len() + j))
                {
                    bail!("scatter {size} B: rank {r} element {j} is wrong");
                }
            }
            "send_recv" => {
                // Ranks 0 and 1 (the others wait): a message there and an ack back.
                if r == 0 {
                    pg.send(&buf, 1, 7)?;
                    pg.recv(&mut ack, 1, 8)?;
                } else if r == 1 {
                    if verify {
                        buf.iter_mut().for_each(|x| *x = -1.0);
                    }
                    pg.recv(&mut buf, 0, 7)?;
                    pg.send(&ack, 0, 8)?;
                    if verify && let Some(i) = (0..count).find(|&i| buf[i] != val(0, i)) {
                        bail!("send_recv {size} B: element {i} is wrong");
                    }
                }
            }
            "barrier" => pg.barrier()?,
            "tcp_stream" => {
                let bytes: &mut [u8] = bytemuck_bytes(&mut buf);
                match (r, tcp.as_mut()) {
                    (0, Some(s)) => {
                        s.write_all(bytes)?;
                        s.read_exact(&mut [0u8; 1])?;
                    }
                    (1, Some(s)) => {
                        s.read_exact(bytes)?;
                        s.write_all(&[1])?;
                    }
                    (0 | 1, None) => bail!("tcp_stream: no stream between ranks 0 and 1"),
                    _ => {}
                }
            }
            other => bail!("unknown op {other:?}; known: {}", OPS.join(", ")),
        }
        Ok(())
    };
    run(true).with_context(|| format!("verifying {op} at {size} bytes"))?;
    pg.barrier()?;
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        run(false)?;
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    // The operation takes as long as its slowest rank.
    pg.all_reduce(&mut times, ReduceOp::Max)?;
    Ok(times)
}

fn bytemuck_bytes(v: &mut [f32]) -> &mut [u8] {
    let len = std::mem::size_of_val(v);
    // SAFETY: the same memory, exclusively borrowed for the result's lifetime, seen as
    // `len` bytes; u8 has no alignment or validity requirement.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), len) }
}

/// Run the comm benchmark on this rank.
pub fn run(
    backend: Option<&str>,
    ops: Option<&str>,
    sizes: Option<&str>,
    iters: Option<usize>,
    json: bool,
) -> anyhow::Result<()> {
    let backend = backend
        .map(|b| {
            BackendKind::parse(b)
                .with_context(|| format!("--backend {b:?}: expected tcp, mpi or nccl"))
        })
        .transpose()?;
    let pg = ProcessGroup::init(InitOptions {
        backend,
        ..Default::default()
    })
    .context("joining the job (run under `drill launch` or mpirun)")?;
    let ops: Vec<String> = match ops {
        None | Some("all") => OPS
            .iter()
            .filter(|o| !matches!(**o, "tcp_stream" | "send_recv") || pg.world_size() >= 2)
            .map(|s| s.to_string())
            .collect(),
        Some(list) => list.split(',').map(|s| s.trim().to_string()).collect(),
    };
    for o in &ops {
        if !OPS.contains(&o.as_str()) {
            bail!("--ops: unknown op {o:?}; known: {}", OPS.join(", "));
        }
    }
    let sizes = match sizes {
        Some(s) => parse_sizes(s)?,
        None => DEFAULT_SIZES.to_vec(),
    };
    let (n, r) = (pg.world_size(), pg.rank());
    // Every rank parsed the same list, so every rank refuses it alike (none waits on another).
    if let Some(&small) = sizes.iter().find(|&&s| s < 4 * n) {
        bail!(
            "--sizes: {small} bytes is under one f32 element per rank ({} bytes with {n} ranks)",
            4 * n
        );
    }
    let mut tcp = None;
    if ops.iter().any(|o| o == "tcp_stream") && n >= 2 {
        // A plain TCP stream between ranks 0 and 1 (the single-stream limit), on the address
        // rank 0 reaches the store from: loopback on one host, the network between hosts.
        if r == 0 {
            let ip = pg
                .store()
                .and_then(|s| s.local_ip())
                .filter(|ip| !ip.is_unspecified())
                .map_or_else(|| "127.0.0.1".to_string(), |ip| ip.to_string());
            let l = TcpListener::bind((ip.as_str(), 0))?;
            pg.broadcast_object(Some(&(ip, l.local_addr()?.port())), 0)?;
            tcp = Some(l.accept()?.0);
        } else {
            let (ip, port): (String, u16) = pg.broadcast_object(None, 0)?;
            if r == 1 {
                tcp = Some(TcpStream::connect((ip.as_str(), port))?);
            }
        }
        if let Some(s) = &tcp {
            s.set_nodelay(true)?;
        }
    }
    if r == 0 && !json {
        println!(
            "# drill bench comm: backend {}, {} ranks; times are medians over iterations of the slowest rank",
            pg.backend_name(),
            n
        );
        println!(
            "{:<15} {:>12} {:>7} {:>11} {:>11} {:>11} {:>10} {:>10}",
            "op", "bytes", "iters", "median_us", "min_us", "max_us", "algbw_GB/s", "busbw_GB/s"
        );
    }
    for op in &ops {
        let op_sizes: Vec<usize> = if op == "barrier" {
            vec![0]
        } else {
            sizes.clone()
        };
        for &size in &op_sizes {
            let size = size / (4 * n) * (4 * n);
            let it = iters.unwrap_or_else(|| (200_000_000 / size.max(1 << 14)).clamp(5, 2000));
            let mut times = bench_one(&pg, op, size, it, &mut tcp)?;
            if r != 0 {
                continue;
            }
            times.sort_by(f64::total_cmp);
            let med = times[times.len() / 2];
            let algbw = if size == 0 {
                0.0
            } else {
                size as f64 / (med * 1e-6) / 1e9
            };
            let busbw = algbw * bus_factor(op, n);
            if json {
                println!(
                    r#"{{"op":"{op}","backend":"{}","world_size":{n},"size_bytes":{size},"iters":{it},"median_us":{med:.3},"min_us":{:.3},"max_us":{:.3},"algbw_gbps":{algbw:.4},"busbw_gbps":{busbw:.4}}}"#,
                    pg.backend_name(),
                    times[0],
                    times[times.len() - 1]
                );
            } else {
                println!(
                    "{op:<15} {size:>12} {it:>7} {med:>11.2} {:>11.2} {:>11.2} {algbw:>10.3} {busbw:>10.3}",
                    times[0],
                    times[times.len() - 1]
                );
            }
        }
    }
    Ok(())
}
