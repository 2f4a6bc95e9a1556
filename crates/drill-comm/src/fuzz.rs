//! Every decoder of bytes from another process, fuzzed ([`drill_fuzz`]): the store's request
//! and response frames, the embedded backend's data and control headers, the authenticated
//! handshake on both sides, and object collectives' payloads.

use std::io::{self, Read, Write};

use drill_fuzz::fuzz;

use crate::auth::{self, Token};
use crate::backend::OpCode;
use crate::backend::embedded::frame::{AbortReason, Control, HEADER, Header};
use crate::store::proto::{self, Op, Request};

#[global_allocator]
static ALLOC: drill_fuzz::CountingAlloc = drill_fuzz::CountingAlloc;

#[test]
fn store_requests() {
    let request = |op, keys: &[&str], args: &[&[u8]]| {
        Request {
            op,
            keys: keys.iter().map(|k| k.to_string()).collect(),
            args: args.iter().map(|a| a.to_vec()).collect(),
            timeout_ms: 30_000,
        }
        .encode()
    };
    let seeds = vec![
        request(Op::Set, &["rank/0/addr"], &[b"10.0.0.1:29500"]),
        request(Op::Get, &["k"], &[]),
        request(Op::Add, &["counter"], &[&7u64.to_le_bytes()]),
        request(Op::CompareSet, &["k"], &[b"old", b"new"]),
        request(Op::Wait, &["a", "b", "c"], &[]),
        request(Op::NumKeys, &[], &[]),
    ];
    fuzz("store request", &seeds, |b| {
        let _ = Request::decode(&mut &b[..]);
    });
}

#[test]
fn store_responses() {
    let response = |status, value: &[u8]| {
        let mut b = Vec::new();
        proto::write_response(&mut b, status, value).unwrap();
        b
    };
    let seeds = vec![
        response(proto::OK, b"value"),
        response(proto::TIMEOUT, b""),
        response(proto::MISSING, b""),
    ];
    fuzz("store response", &seeds, |b| {
        let _ = proto::read_response(&mut &b[..]);
    });
}

#[test]
fn frame_headers() {
    let expect = Header {
        op: OpCode::AllReduce,
        group: 0,
        seq: 41,
        len: 4096,
    };
    let seeds = vec![
        expect.encode().to_vec(),
        Control::Heartbeat.encode().to_vec(),
        Control::Goodbye.encode().to_vec(),
        Control::Abort {
            culprit: 1,
            reason: AbortReason::Silent,
        }
        .encode()
        .to_vec(),
    ];
    fuzz("embedded frame header", &seeds, |b| {
        let mut h = [0u8; HEADER];
        let n = b.len().min(HEADER);
        h[..n].copy_from_slice(&b[..n]);
        let _ = Header::check(&expect, &h);
        let _ = Control::decode(&h, 4);
    });
}

/// A byte stream that reads `input` and swallows what is written.
struct Replay<'a> {
    input: &'a [u8],
}

impl Read for Replay<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.input.read(buf)
    }
}

impl Write for Replay<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn handshakes() {
    let token = Token::new("fuzz");
    // What a connector sends (its MAC cannot match the acceptor's fresh nonce), and what an
    // acceptor sends (hello, then its proof).
    let mut connector = Vec::new();
    connector.extend_from_slice(b"DRIL");
    connector.extend_from_slice(&1u16.to_le_bytes());
    connector.extend_from_slice(&[7; 64]);
    connector.extend_from_slice(&6u32.to_le_bytes());
    connector.extend_from_slice(b"rank 1");
    let mut acceptor = Vec::new();
    acceptor.extend_from_slice(b"DRIL");
    acceptor.extend_from_slice(&1u16.to_le_bytes());
    acceptor.extend_from_slice(&[9; 64]);
    let seeds = vec![connector, acceptor];
    fuzz("handshake", &seeds, |b| {
        let _ = auth::accept_on(&mut Replay { input: b }, "fuzz", &token);
        let _ = auth::connect_on(&mut Replay { input: b }, "fuzz", &token, b"rank 0");
    });
}

#[test]
fn object_payloads() {
    // What drill's object collectives carry: addresses, names and counters.
    type Payload = (String, u16, Vec<String>, Option<Vec<u64>>);
    let value: Payload = (
        "10.0.0.1".into(),
        29500,
        vec!["host-a".into(), "host-b".into()],
        Some(vec![1, 2, 3]),
    );
    let seeds = vec![postcard::to_stdvec(&value).unwrap()];
    fuzz("object collective payload", &seeds, |b| {
        let _ = postcard::from_bytes::<Payload>(b);
    });
}
