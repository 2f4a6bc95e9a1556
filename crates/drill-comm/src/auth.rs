//! Job authentication: every connection proves it knows the job's token (HMAC-SHA256
//! challenge-response both ways; the token never crosses the wire).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;

use crate::error::{CommError, Result};

const MAGIC: &[u8; 4] = b"DRIL";
const VERSION: u16 = 1;
/// Largest identity a connector may send.
pub const MAX_HELLO: usize = 256;
/// How long a handshake may take before the connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// The job's shared secret.
#[derive(Clone)]
pub struct Token(Vec<u8>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

impl Token {
    /// A token from its secret (as `DRILL_JOB_TOKEN` gives it).
    pub fn new(secret: &str) -> Token {
        Token(secret.as_bytes().to_vec())
    }

    /// A fresh random token (hex), as `drill launch` generates.
    pub fn generate() -> String {
        let mut b = [0u8; 16];
        rand::rng().fill_bytes(&mut b);
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    fn mac(&self, parts: &[&[u8]]) -> [u8; 32] {
        let mut m =
            <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("hmac takes any key length");
        for p in parts {
            m.update(p);
        }
        m.finalize().into_bytes().into()
    }
}

fn auth_err(peer: &str, detail: impl Into<String>) -> CommError {
    CommError::Auth {
        peer: peer.to_string(),
        detail: detail.into(),
    }
}

fn nonce() -> [u8; 32] {
    let mut n = [0u8; 32];
    rand::rng().fill_bytes(&mut n);
    n
}

/// Constant-time comparison.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Accepting side: challenge the connector, check its proof and identity, prove ourselves.
/// Returns the identity bytes the connector sent. Reads are bounded and time out.
pub fn accept(stream: &mut TcpStream, token: &Token) -> Result<Vec<u8>> {
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "?".into());
    let io = |e: std::io::Error| auth_err(&peer, format!("handshake I/O: {e}"));
    stream
        .set_read_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(io)?;
    stream
        .set_write_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(io)?;
    let ident = accept_on(stream, &peer, token)?;
    stream.set_read_timeout(None).map_err(io)?;
    stream.set_write_timeout(None).map_err(io)?;
    Ok(ident)
}

/// [`accept`]'s exchange on any byte stream (`peer` names it in errors).
pub(crate) fn accept_on(
    stream: &mut (impl Read + Write),
    peer: &str,
    token: &Token,
) -> Result<Vec<u8>> {
    let io = |e: std::io::Error| auth_err(peer, format!("handshake I/O: {e}"));
    let na = nonce();
    let mut hello = Vec::with_capacity(38);
    hello.extend_from_slice(MAGIC);
    hello.extend_from_slice(&VERSION.to_le_bytes());
    hello.extend_from_slice(&na);
    stream.write_all(&hello).map_err(io)?;
    let mut head = [0u8; 4 + 2 + 32 + 32 + 4];
    stream.read_exact(&mut head).map_err(io)?;
    if &head[..4] != MAGIC {
        return Err(auth_err(peer, "not a drill peer (bad magic)"));
    }
    let version = u16::from_le_bytes([head[4], head[5]]);
    if version != VERSION {
        return Err(auth_err(
            peer,
            format!("protocol version {version}, expected {VERSION}"),
        ));
    }
    let nc = &head[6..38];
    let mac_c = &head[38..70];
    let len = u32::from_le_bytes(head[70..74].try_into().unwrap()) as usize;
    if len > MAX_HELLO {
        return Err(auth_err(
            peer,
            format!("identity of {len} bytes (limit {MAX_HELLO})"),
        ));
    }
    let mut ident = vec![0u8; len];
    stream.read_exact(&mut ident).map_err(io)?;
    if !same(mac_c, &token.mac(&[b"drill-connect", &na, nc, &ident])) {
        return Err(auth_err(peer, "wrong job token (DRILL_JOB_TOKEN differs)"));
    }
    stream
        .write_all(&token.mac(&[b"drill-accept", &na, nc]))
        .map_err(io)?;
    Ok(ident)
}

/// Connecting side: answer the challenge with our identity and check the acceptor's proof.
pub fn connect(stream: &mut TcpStream, token: &Token, ident: &[u8]) -> Result<()> {
    assert!(ident.len() <= MAX_HELLO, "identity too long");
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "?".into());
    let io = |e: std::io::Error| {
        auth_err(
            &peer,
            format!("handshake I/O: {e} (the other side may have rejected our DRILL_JOB_TOKEN)"),
        )
    };
    stream
        .set_read_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(io)?;
    stream
        .set_write_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(io)?;
    connect_on(stream, &peer, token, ident)?;
    stream.set_read_timeout(None).map_err(io)?;
    stream.set_write_timeout(None).map_err(io)?;
    Ok(())
}

/// [`connect`]'s exchange on any byte stream (`peer` names it in errors).
pub(crate) fn connect_on(
    stream: &mut (impl Read + Write),
    peer: &str,
    token: &Token,
    ident: &[u8],
) -> Result<()> {
    // No answer in time is not a refusal: the other side may not be accepting yet (its
    // rendezvous is slower than ours) or the network loses packets. Callers retry an I/O
    // error until their own deadline, and give up at once on an authentication error.
    let io = |e: std::io::Error| {
        if matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ) {
            CommError::io(
                format!("handshake with {peer}: no answer within {HANDSHAKE_TIMEOUT:?}"),
                e,
            )
        } else {
            auth_err(
                peer,
                format!(
                    "handshake I/O: {e} (the other side may have rejected our DRILL_JOB_TOKEN)"
                ),
            )
        }
    };
    let mut hello = [0u8; 38];
    stream.read_exact(&mut hello).map_err(io)?;
    if &hello[..4] != MAGIC || u16::from_le_bytes([hello[4], hello[5]]) != VERSION {
        return Err(auth_err(peer, "not a drill endpoint of this version"));
    }
    let na = &hello[6..38];
    let nc = nonce();
    let mut msg = Vec::with_capacity(74 + ident.len());
    msg.extend_from_slice(MAGIC);
    msg.extend_from_slice(&VERSION.to_le_bytes());
    msg.extend_from_slice(&nc);
    msg.extend_from_slice(&token.mac(&[b"drill-connect", na, &nc, ident]));
    msg.extend_from_slice(&(ident.len() as u32).to_le_bytes());
    msg.extend_from_slice(ident);
    stream.write_all(&msg).map_err(io)?;
    let mut mac_a = [0u8; 32];
    stream.read_exact(&mut mac_a).map_err(io)?;
    if !same(&mac_a, &token.mac(&[b"drill-accept", na, &nc])) {
        return Err(auth_err(peer, "the other side does not know the job token"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A stream whose reads find nothing before their timeout.
    struct Silent;

    impl Read for Silent {
        fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
            Err(std::io::ErrorKind::WouldBlock.into())
        }
    }

    impl Write for Silent {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// An acceptor that does not answer in time is an I/O error (callers retry it), not a
    /// refusal (they give up on that).
    #[test]
    fn no_answer_in_time_is_retryable_not_a_refusal() {
        let e = connect_on(&mut Silent, "10.0.0.1:1", &Token::new("t"), b"rank 1").unwrap_err();
        assert!(matches!(e, CommError::Io { .. }), "{e}");
        assert!(e.to_string().contains("no answer within 5s"), "{e}");
    }

    fn pair(server_token: &str, client_token: &str) -> (Result<Vec<u8>>, Result<()>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let st = Token::new(server_token);
        let h = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            accept(&mut s, &st)
        });
        let mut c = TcpStream::connect(addr).unwrap();
        let r = connect(&mut c, &Token::new(client_token), b"rank 1");
        drop(c);
        (h.join().unwrap(), r)
    }

    #[test]
    fn same_token_authenticates_both_ways() {
        let (a, c) = pair("s3cret", "s3cret");
        assert_eq!(a.unwrap(), b"rank 1");
        c.unwrap();
    }

    #[test]
    fn wrong_token_is_refused_on_both_sides() {
        let (a, c) = pair("s3cret", "guess");
        assert!(a.unwrap_err().to_string().contains("wrong job token"));
        assert!(c.is_err());
    }

    #[test]
    fn garbage_is_refused_without_panic() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let h = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            accept(&mut s, &Token::new("t"))
        });
        let mut c = TcpStream::connect(addr).unwrap();
        let mut hello = [0u8; 38];
        c.read_exact(&mut hello).unwrap();
        c.write_all(
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\nxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
        )
        .unwrap();
        assert!(
            h.join()
                .unwrap()
                .unwrap_err()
                .to_string()
                .contains("bad magic")
        );
    }
}
