//! Every decoder of bytes from another process, fuzzed ([`drill_fuzz`]): the TCP router's
//! event frames, the Redis transport's frames (with `--features redis`), and event payloads.

use drill_fuzz::fuzz;

use crate::events::Event;
use crate::parallel::router;

#[global_allocator]
static ALLOC: drill_fuzz::CountingAlloc = drill_fuzz::CountingAlloc;

fn event(name: &str, payload: &[u8]) -> Event {
    Event {
        name: name.into(),
        payload: payload.to_vec(),
    }
}

#[test]
fn router_frames() {
    let mut two = router::frame(1, &event("learn_output", &[1, 2, 3, 4]));
    two.extend(router::frame(0, &event("finish", &[])));
    let seeds = vec![
        router::frame(0, &event("collect_output", &[9; 40])),
        two,
        vec![0, 0, 0, 0],
        vec![1, 0, 0, 0],
    ];
    fuzz("task router frame", &seeds, |b| {
        let mut r = b;
        while let Ok(router::Frame::Event(..) | router::Frame::Heartbeat) =
            router::read_frame(&mut r)
        {}
    });
}

#[cfg(feature = "redis")]
#[test]
fn redis_frames() {
    use crate::parallel::redis::{Frame, Kind};
    let frame = |kind| postcard::to_allocvec(&Frame { from: 2, kind }).unwrap();
    let seeds = vec![
        frame(Kind::Event {
            name: "weights".into(),
            payload: vec![5; 32],
        }),
        frame(Kind::Heartbeat),
        frame(Kind::Bye),
    ];
    fuzz("task redis frame", &seeds, |b| {
        let _ = postcard::from_bytes::<Frame>(b);
    });
}

#[test]
fn event_payloads() {
    // The shapes the pipelines send: weights, counters, batches of transitions.
    type Payload = (
        u64,
        Vec<f32>,
        Vec<(Vec<u8>, u32, f32, bool)>,
        Option<String>,
    );
    let value: Payload = (
        17,
        vec![0.5; 8],
        vec![(vec![3; 16], 2, 1.0, false)],
        Some("ok".into()),
    );
    let seeds = vec![postcard::to_stdvec(&value).unwrap()];
    fuzz("task event payload", &seeds, |b| {
        let _ = event("x", b).decode::<Payload>();
    });
}
