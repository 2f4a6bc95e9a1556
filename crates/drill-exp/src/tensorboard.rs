//! [`EventWriter`]: TensorBoard scalar event files (TFRecord framing, `Event` protobuf).
//!
//! Written by hand (about 80 lines) rather than through a crate: the maintained options pull in
//! a protobuf code generator or image stacks for what is a fixed 4-field message.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn length_delimited(field: u8, bytes: &[u8], out: &mut Vec<u8>) {
    out.push((field << 3) | 2);
    varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

/// Appends scalar summaries to one `events.out.tfevents.*` file.
pub struct EventWriter {
    out: BufWriter<File>,
    buf: Vec<u8>,
    value: Vec<u8>,
    summary: Vec<u8>,
}

impl EventWriter {
    /// Create a new event file in `dir` (created if missing).
    pub fn create(dir: &Path) -> std::io::Result<Self> {
        crate::durable::create_dir_all(dir)?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "drill".into());
        let path = dir.join(format!(
            "events.out.tfevents.{}.{host}.{}",
            now.as_secs(),
            std::process::id()
        ));
        let mut w = Self {
            out: BufWriter::new(File::create(path)?),
            buf: vec![],
            value: vec![],
            summary: vec![],
        };
        let mut event = Vec::new();
        event.push(0x09);
        event.extend_from_slice(&now.as_secs_f64().to_le_bytes());
        length_delimited(3, b"brain.Event:2", &mut event);
        w.record(&event)?;
        Ok(w)
    }

    fn record(&mut self, data: &[u8]) -> std::io::Result<()> {
        write_record(&mut self.out, data)
    }

    /// Append one scalar.
    pub fn scalar(
        &mut self,
        tag: &str,
        value: f32,
        step: i64,
        wall_time: f64,
    ) -> std::io::Result<()> {
        self.value.clear();
        length_delimited(1, tag.as_bytes(), &mut self.value);
        self.value.push(0x15);
        self.value.extend_from_slice(&value.to_le_bytes());
        self.summary.clear();
        length_delimited(1, &self.value, &mut self.summary);
        self.buf.clear();
        self.buf.push(0x09);
        self.buf.extend_from_slice(&wall_time.to_le_bytes());
        self.buf.push(0x10);
        varint(step as u64, &mut self.buf);
        length_delimited(5, &self.summary, &mut self.buf);
        let event = std::mem::take(&mut self.buf);
        let r = self.record(&event);
        self.buf = event;
        r
    }

    /// Flush buffered events to the file.
    pub fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// One record: length, its masked CRC, the data, the data's masked CRC (TFRecord framing).
fn write_record(out: &mut impl Write, data: &[u8]) -> std::io::Result<()> {
    let len = (data.len() as u64).to_le_bytes();
    out.write_all(&len)?;
    out.write_all(&masked_crc(&len).to_le_bytes())?;
    out.write_all(data)?;
    out.write_all(&masked_crc(data).to_le_bytes())
}

/// Read back `(tag, step, value)` scalars from an event file, checking every CRC: the inverse
/// of [`EventWriter`], used by tests and `drill plot`.
pub fn read_scalars(path: &Path) -> std::io::Result<Vec<(String, i64, f32)>> {
    scalars_in(&std::fs::read(path)?, path)
}

/// [`read_scalars`] of an event file's bytes (`path` names it in errors).
fn scalars_in(data: &[u8], path: &Path) -> std::io::Result<Vec<(String, i64, f32)>> {
    let bad = |m: &str| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{}: {m}", path.display()),
        )
    };
    let mut out = vec![];
    let mut at = 0;
    while at < data.len() {
        let header = data
            .get(at..at + 12)
            .ok_or_else(|| bad("truncated record header"))?;
        let len = u64::from_le_bytes(header[..8].try_into().unwrap());
        if masked_crc(&header[..8]) != u32::from_le_bytes(header[8..12].try_into().unwrap()) {
            return Err(bad("length CRC mismatch"));
        }
        let end = usize::try_from(len)
            .ok()
            .and_then(|len| (at + 12).checked_add(len))
            .filter(|&end| end + 4 <= data.len())
            .ok_or_else(|| bad("truncated record"))?;
        let body = &data[at + 12..end];
        let crc = &data[end..end + 4];
        if masked_crc(body) != u32::from_le_bytes(crc.try_into().unwrap()) {
            return Err(bad("data CRC mismatch"));
        }
        at = end + 4;
        if let Some(s) = parse_event(body) {
            out.push(s);
        }
    }
    Ok(out)
}

fn read_varint(b: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*at)?;
        *at += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Some(v);
        }
    }
    None
}

/// Fields of a message as (field number, wire type, payload range or value).
fn fields(b: &[u8]) -> Option<Vec<(u64, &[u8], u64)>> {
    let mut at = 0;
    let mut out = vec![];
    while at < b.len() {
        let key = read_varint(b, &mut at)?;
        let (field, wire) = (key >> 3, key & 7);
        match wire {
            0 => out.push((field, &b[0..0], read_varint(b, &mut at)?)),
            1 => {
                out.push((field, b.get(at..at + 8)?, 0));
                at += 8;
            }
            2 => {
                let len = usize::try_from(read_varint(b, &mut at)?).ok()?;
                let end = at.checked_add(len)?;
                out.push((field, b.get(at..end)?, 0));
                at = end;
            }
            5 => {
                out.push((field, b.get(at..at + 4)?, 0));
                at += 4;
            }
            _ => return None,
        }
    }
    Some(out)
}

fn parse_event(b: &[u8]) -> Option<(String, i64, f32)> {
    let event = fields(b)?;
    let step = event.iter().find(|f| f.0 == 2).map_or(0, |f| f.2 as i64);
    let summary = event.iter().find(|f| f.0 == 5)?.1;
    let value = fields(summary)?.into_iter().find(|f| f.0 == 1)?.1;
    let vf = fields(value)?;
    let tag = String::from_utf8(vf.iter().find(|f| f.0 == 1)?.1.to_vec()).ok()?;
    let v = f32::from_le_bytes(vf.iter().find(|f| f.0 == 2)?.1.try_into().ok()?);
    Some((tag, step, v))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Event files from anywhere (`drill plot` reads what it is given), fuzzed: whole files,
    /// and event records inside valid framing (the CRCs recomputed, so the protobuf parser is
    /// reached).
    /// An event file in `dir` holding two scalars, the second at `step`.
    fn two_scalars(dir: &Path, step: i64) -> std::path::PathBuf {
        let mut w = EventWriter::create(dir).unwrap();
        w.scalar("charts/episodic_return", 195.5, 1234, 1.0)
            .unwrap();
        w.scalar("losses/td_loss", -0.25, step, 2.0).unwrap();
        w.flush().unwrap();
        std::fs::read_dir(dir)
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path()
    }

    #[test]
    fn fuzz_hostile_event_files() {
        let dir = tempfile::tempdir().unwrap();
        let file = two_scalars(dir.path(), 99);
        let bytes = std::fs::read(&file).unwrap();
        drill_fuzz::fuzz(
            "tensorboard event file",
            std::slice::from_ref(&bytes),
            |b| {
                let _ = scalars_in(b, &file);
            },
        );
        let first_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let body = bytes[12..12 + first_len].to_vec();
        drill_fuzz::fuzz("tensorboard event record", &[body], |b| {
            let mut rec = Vec::new();
            write_record(&mut rec, b).unwrap();
            let _ = scalars_in(&rec, &file);
        });
    }

    #[test]
    fn crc_matches_tensorflow_and_scalars_round_trip() {
        assert_eq!(
            crc32c::crc32c(b"123456789"),
            0xe306_9283,
            "CRC-32C check value"
        );
        let dir = tempfile::tempdir().unwrap();
        let file = two_scalars(dir.path(), 1 << 40);
        assert!(
            file.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("events.out.tfevents.")
        );
        let s = read_scalars(&file).unwrap();
        assert_eq!(
            s,
            vec![
                ("charts/episodic_return".into(), 1234, 195.5),
                ("losses/td_loss".into(), 1 << 40, -0.25)
            ]
        );
        // Corruption is detected.
        let mut bytes = std::fs::read(&file).unwrap();
        let n = bytes.len();
        bytes[n - 6] ^= 1;
        std::fs::write(&file, bytes).unwrap();
        assert!(
            read_scalars(&file)
                .unwrap_err()
                .to_string()
                .contains("CRC mismatch")
        );
    }
}
