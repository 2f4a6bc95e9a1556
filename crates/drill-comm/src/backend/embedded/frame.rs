//! The 16-byte header in front of every message between two ranks, and its validation.
//!
//! Data frames carry the operation, the group, the operation's sequence number and the exact
//! payload length; a receiver knows all four in advance and rejects anything else, so a
//! stranger's or a confused peer's bytes can never make it allocate, hang or misread.

use super::super::OpCode;

/// Header size in bytes.
pub const HEADER: usize = 16;

const DATA: u8 = 0xD1;
const ABORT: u8 = 0xA5;
const GOODBYE: u8 = 0x6B;
const HEARTBEAT: u8 = 0x48;

/// A data frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The collective (or point-to-point) this message belongs to.
    pub op: OpCode,
    /// The group's id (0 = world).
    pub group: u16,
    /// The group's operation counter (the tag for point-to-point).
    pub seq: u32,
    /// Payload length in bytes.
    pub len: u64,
}

impl Header {
    /// Encode.
    pub fn encode(&self) -> [u8; HEADER] {
        let mut b = [0u8; HEADER];
        b[0] = DATA;
        b[1] = self.op as u8;
        b[2..4].copy_from_slice(&self.group.to_le_bytes());
        b[4..8].copy_from_slice(&self.seq.to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Check received bytes against what this side expects; the error says what differs.
    pub fn check(expected: &Header, b: &[u8; HEADER]) -> Result<(), String> {
        if b[0] != DATA {
            return Err(format!(
                "frame type 0x{:02x} where a data frame was expected",
                b[0]
            ));
        }
        let op = OpCode::from_u8(b[1]).ok_or_else(|| format!("unknown operation code {}", b[1]))?;
        let group = u16::from_le_bytes([b[2], b[3]]);
        let seq = u32::from_le_bytes(b[4..8].try_into().unwrap());
        let len = u64::from_le_bytes(b[8..16].try_into().unwrap());
        if op != expected.op || group != expected.group {
            return Err(format!(
                "it is in {} of group {} while this rank is in {} of group {}: collectives were called in different orders",
                op.name(),
                group,
                expected.op.name(),
                expected.group
            ));
        }
        if seq != expected.seq {
            let what = if op == OpCode::P2p {
                "tag"
            } else {
                "operation number"
            };
            return Err(format!(
                "{what} {seq} where {} was expected (calls out of step)",
                expected.seq
            ));
        }
        if len != expected.len {
            return Err(format!(
                "{len} bytes where {} were expected: buffer sizes differ between ranks",
                expected.len
            ));
        }
        Ok(())
    }
}

/// Frames on the control connection (liveness, failure notices and orderly exit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    /// The sender is alive (sent every [`crate::store::HEARTBEAT_EVERY`]).
    Heartbeat,
    /// The sender shuts down in order.
    Goodbye,
    /// The sender gave up on `culprit` for `reason`.
    Abort {
        /// Global rank blamed.
        culprit: u32,
        /// Why (see [`AbortReason`]).
        reason: AbortReason,
    },
}

/// Why a rank gave up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum AbortReason {
    /// The culprit's connection closed or reset.
    Lost = 1,
    /// The culprit did not answer in time.
    Timeout = 2,
    /// The culprit sent malformed data.
    Protocol = 3,
    /// Nothing was heard from the culprit for the heartbeat timeout.
    Silent = 4,
}

impl AbortReason {
    /// Words for messages.
    pub fn describe(self) -> &'static str {
        match self {
            AbortReason::Lost => "its connection was lost",
            AbortReason::Timeout => "it did not answer in time",
            AbortReason::Protocol => "it sent malformed data",
            AbortReason::Silent => {
                "nothing heard from it for the heartbeat timeout: the network link to it is cut, its process is stopped (SIGSTOP) or its host is frozen"
            }
        }
    }
}

impl Control {
    /// Encode.
    pub fn encode(&self) -> [u8; HEADER] {
        let mut b = [0u8; HEADER];
        match *self {
            Control::Heartbeat => b[0] = HEARTBEAT,
            Control::Goodbye => b[0] = GOODBYE,
            Control::Abort { culprit, reason } => {
                b[0] = ABORT;
                b[1] = reason as u8;
                b[4..8].copy_from_slice(&culprit.to_le_bytes());
            }
        }
        b
    }

    /// Decode; anything unknown is an error.
    pub fn decode(b: &[u8; HEADER], world: usize) -> Result<Control, String> {
        match b[0] {
            HEARTBEAT if b[1..].iter().all(|&x| x == 0) => Ok(Control::Heartbeat),
            GOODBYE if b[1..].iter().all(|&x| x == 0) => Ok(Control::Goodbye),
            ABORT => {
                let reason = match b[1] {
                    1 => AbortReason::Lost,
                    2 => AbortReason::Timeout,
                    3 => AbortReason::Protocol,
                    4 => AbortReason::Silent,
                    r => return Err(format!("unknown abort reason {r}")),
                };
                let culprit = u32::from_le_bytes(b[4..8].try_into().unwrap());
                if culprit as usize >= world {
                    return Err(format!("abort names rank {culprit} of a world of {world}"));
                }
                Ok(Control::Abort { culprit, reason })
            }
            t => Err(format!("unknown control frame type 0x{t:02x}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn h() -> Header {
        Header {
            op: OpCode::AllReduce,
            group: 0,
            seq: 7,
            len: 4096,
        }
    }

    #[test]
    fn mismatches_are_explained() {
        let ok = h();
        assert!(Header::check(&ok, &ok.encode()).is_ok());
        let e = Header::check(
            &ok,
            &Header {
                op: OpCode::Broadcast,
                ..ok
            }
            .encode(),
        )
        .unwrap_err();
        assert!(
            e.contains("broadcast") && e.contains("different orders"),
            "{e}"
        );
        let e = Header::check(&ok, &Header { len: 8, ..ok }.encode()).unwrap_err();
        assert!(e.contains("buffer sizes differ"), "{e}");
        let e = Header::check(&ok, &Header { seq: 8, ..ok }.encode()).unwrap_err();
        assert!(e.contains("out of step"), "{e}");
        let c = Control::Abort {
            culprit: 3,
            reason: AbortReason::Timeout,
        };
        assert_eq!(Control::decode(&c.encode(), 4), Ok(c));
        assert!(Control::decode(&c.encode(), 3).is_err());
        for c in [Control::Heartbeat, Control::Goodbye] {
            assert_eq!(Control::decode(&c.encode(), 1), Ok(c));
        }
    }

    proptest! {
        #[test]
        fn random_headers_are_rejected_not_trusted(bytes in proptest::array::uniform16(any::<u8>())) {
            // Only the exact expected header passes; nothing panics.
            let ok = Header::check(&h(), &bytes).is_ok();
            prop_assert_eq!(ok, bytes == h().encode());
            let _ = Control::decode(&bytes, 4);
        }

        #[test]
        fn any_header_round_trips(op in 0u8..20, group: u16, seq: u32, len: u64) {
            if let Some(op) = OpCode::from_u8(op) {
                let x = Header { op, group, seq, len };
                prop_assert!(Header::check(&x, &x.encode()).is_ok());
            }
        }
    }
}
