//! Osiris chunks, as a `Deliver` frame carries them (rabbitmq/osiris `src/osiris_log.erl`,
//! "Chunk format"): a 48-byte header (magic 0x5, version, chunk type, entry and record counts,
//! timestamp, epoch, first offset, CRC32 of the data, data and trailer lengths, bloom filter
//! size), an optional bloom filter, then the data entries: simple entries (one message each)
//! and sub-entry batches (several messages, possibly compressed).
//!
//! [`parse_chunk`] checks the CRC32 and every length before it trusts them, and gives the
//! messages (AMQP 1.0 encoded) with their offsets.

use crate::error::{Error, Result};

/// Size of a chunk header, bytes.
pub const CHUNK_HEADER_LEN: usize = 48;

/// Chunk type of user messages; the tracking chunks (1, 2) carry none.
pub const CHUNK_USER: u8 = 0;

/// Largest uncompressed sub-entry batch accepted, bytes (a garbage length must not allocate).
const MAX_BATCH_BYTES: usize = 512 << 20;

/// The header of a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHeader {
    pub chunk_type: u8,
    pub num_entries: u16,
    /// Messages in the chunk (a sub-entry batch counts its messages).
    pub num_records: u32,
    /// When the chunk was written, epoch ms.
    pub timestamp: i64,
    pub epoch: u64,
    /// Offset of the chunk's first message.
    pub first_offset: u64,
    pub crc: u32,
    pub data_len: u32,
    pub trailer_len: u32,
    pub bloom_len: u8,
}

/// A parsed chunk: its header and its messages, in offset order (`header.first_offset + i`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub header: ChunkHeader,
    /// The AMQP 1.0 encoded messages (none for tracking chunks).
    pub messages: Vec<Vec<u8>>,
}

fn be_u16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
fn be_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn be_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

fn bad(msg: String) -> Error {
    Error::Stream(msg)
}

/// Reads a chunk header from the first 48 bytes of `b`.
///
/// Errors: `Error::Stream` when `b` is shorter than a header or the magic is not 0x5.
pub fn parse_header(b: &[u8]) -> Result<ChunkHeader> {
    if b.len() < CHUNK_HEADER_LEN {
        return Err(bad(format!(
            "truncated chunk: {} bytes, a header alone takes {CHUNK_HEADER_LEN}",
            b.len()
        )));
    }
    if b[0] >> 4 != 0x5 {
        return Err(bad(format!(
            "not a chunk: magic {:#x}, expected 0x5",
            b[0] >> 4
        )));
    }
    Ok(ChunkHeader {
        chunk_type: b[1],
        num_entries: be_u16(b, 2),
        num_records: be_u32(b, 4),
        timestamp: be_u64(b, 8) as i64,
        epoch: be_u64(b, 16),
        first_offset: be_u64(b, 24),
        crc: be_u32(b, 32),
        data_len: be_u32(b, 36),
        trailer_len: be_u32(b, 40),
        bloom_len: b[44],
    })
}

/// Parses one chunk (the bytes after a `Deliver` frame's subscription id): header, CRC32 of
/// the data, entries. Tracking chunks give no messages.
///
/// Errors: `Error::Stream` for a truncated chunk, a CRC32 mismatch, entries or records that
/// disagree with the header, or an entry that runs past the data; `Error::Compression` for a
/// sub-entry batch compressed with a codec rmq-backup does not decode (gzip, snappy, lz4: only
/// uncompressed and zstd batches are read) or that does not decompress.
pub fn parse_chunk(b: &[u8]) -> Result<Chunk> {
    let header = parse_header(b)?;
    let start = CHUNK_HEADER_LEN + header.bloom_len as usize;
    let end = start
        .checked_add(header.data_len as usize)
        .filter(|&e| e <= b.len())
        .ok_or_else(|| {
            bad(format!(
                "truncated chunk at offset {}: {} data bytes announced, {} present",
                header.first_offset,
                header.data_len,
                b.len().saturating_sub(start)
            ))
        })?;
    let data = &b[start..end];
    let crc = crc32fast::hash(data);
    if crc != header.crc {
        return Err(bad(format!(
            "chunk at offset {}: CRC32 mismatch (header {:#010x}, data {crc:#010x})",
            header.first_offset, header.crc
        )));
    }
    if header.chunk_type != CHUNK_USER {
        return Ok(Chunk {
            header,
            messages: Vec::new(),
        });
    }
    let mut messages = Vec::with_capacity((header.num_records as usize).min(data.len() / 4 + 1));
    let mut p = 0usize;
    for _ in 0..header.num_entries {
        let first = *data.get(p).ok_or_else(|| {
            bad(format!(
                "chunk at offset {}: {} entries announced, the data ends after {}",
                header.first_offset,
                header.num_entries,
                messages.len()
            ))
        })?;
        if first & 0x80 == 0 {
            let size = (read_u32(data, p, &header)? & 0x7fff_ffff) as usize;
            messages.push(slice(data, p + 4, size, &header)?.to_vec());
            p += 4 + size;
        } else {
            let codec = (first >> 4) & 0x7;
            let head = slice(data, p, 11, &header)?;
            let count = be_u16(head, 1) as usize;
            let uncompressed = be_u32(head, 3) as usize;
            let size = be_u32(head, 7) as usize;
            let body = slice(data, p + 11, size, &header)?;
            let plain = decompress(codec, body, uncompressed, &header)?;
            let mut q = 0usize;
            for _ in 0..count {
                let len = read_u32(&plain, q, &header)? as usize;
                messages.push(slice(&plain, q + 4, len, &header)?.to_vec());
                q += 4 + len;
            }
            p += 11 + size;
        }
    }
    if messages.len() != header.num_records as usize {
        return Err(bad(format!(
            "chunk at offset {}: {} records announced, {} found",
            header.first_offset,
            header.num_records,
            messages.len()
        )));
    }
    Ok(Chunk { header, messages })
}

fn read_u32(b: &[u8], at: usize, h: &ChunkHeader) -> Result<u32> {
    Ok(be_u32(slice(b, at, 4, h)?, 0))
}

fn slice<'a>(b: &'a [u8], at: usize, len: usize, h: &ChunkHeader) -> Result<&'a [u8]> {
    at.checked_add(len)
        .filter(|&e| e <= b.len())
        .map(|e| &b[at..e])
        .ok_or_else(|| {
            bad(format!(
                "chunk at offset {}: an entry of {len} bytes runs past the data",
                h.first_offset
            ))
        })
}

/// The messages of a sub-entry batch, uncompressed. Codecs (osiris / stream clients): 0 none,
/// 1 gzip, 2 snappy, 3 lz4, 4 zstd.
fn decompress(codec: u8, body: &[u8], uncompressed: usize, h: &ChunkHeader) -> Result<Vec<u8>> {
    match codec {
        0 => Ok(body.to_vec()),
        4 => {
            if uncompressed > MAX_BATCH_BYTES {
                return Err(Error::Compression(format!(
                    "chunk at offset {}: a sub-entry batch announces {uncompressed} bytes uncompressed",
                    h.first_offset
                )));
            }
            let out = zstd::bulk::decompress(body, uncompressed).map_err(|e| {
                Error::Compression(format!(
                    "chunk at offset {}: zstd sub-entry batch does not decompress: {e}",
                    h.first_offset
                ))
            })?;
            if out.len() != uncompressed {
                return Err(Error::Compression(format!(
                    "chunk at offset {}: zstd sub-entry batch gave {} bytes, {uncompressed} announced",
                    h.first_offset,
                    out.len()
                )));
            }
            Ok(out)
        }
        other => Err(Error::Compression(format!(
            "chunk at offset {}: sub-entry batch compressed with {} (codec {other}); rmq-backup reads uncompressed and zstd batches only",
            h.first_offset,
            match other {
                1 => "gzip",
                2 => "snappy",
                3 => "lz4",
                _ => "an unknown codec",
            }
        ))),
    }
}

/// Builds a chunk (for tests): a user chunk of `entries`, each either one message (simple
/// entry) or a batch (sub-entry batch, codec 0 or 4).
#[cfg(test)]
pub(crate) fn make_chunk(first_offset: u64, entries: &[Vec<Vec<u8>>], batch_codec: u8) -> Vec<u8> {
    let mut data = Vec::new();
    let mut records = 0u32;
    for e in entries {
        if e.len() == 1 && batch_codec == 0xff {
            data.extend_from_slice(&(e[0].len() as u32).to_be_bytes());
            data.extend_from_slice(&e[0]);
        } else {
            let mut plain = Vec::new();
            for m in e {
                plain.extend_from_slice(&(m.len() as u32).to_be_bytes());
                plain.extend_from_slice(m);
            }
            let body = if batch_codec == 4 {
                zstd::bulk::compress(&plain, 3).unwrap()
            } else {
                plain.clone()
            };
            data.push(0x80 | ((batch_codec & 0x7) << 4));
            data.extend_from_slice(&(e.len() as u16).to_be_bytes());
            data.extend_from_slice(&(plain.len() as u32).to_be_bytes());
            data.extend_from_slice(&(body.len() as u32).to_be_bytes());
            data.extend_from_slice(&body);
        }
        records += e.len() as u32;
    }
    let mut c = vec![0x50, CHUNK_USER];
    c.extend_from_slice(&(entries.len() as u16).to_be_bytes());
    c.extend_from_slice(&records.to_be_bytes());
    c.extend_from_slice(&1_700_000_000_000i64.to_be_bytes());
    c.extend_from_slice(&1u64.to_be_bytes());
    c.extend_from_slice(&first_offset.to_be_bytes());
    c.extend_from_slice(&crc32fast::hash(&data).to_be_bytes());
    c.extend_from_slice(&(data.len() as u32).to_be_bytes());
    c.extend_from_slice(&0u32.to_be_bytes());
    c.extend_from_slice(&[0u8; 4]);
    c.extend_from_slice(&data);
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgs(n: usize) -> Vec<Vec<u8>> {
        (0..n).map(|i| vec![i as u8; i]).collect()
    }

    #[test]
    fn simple_entries_come_out_in_order() {
        let entries: Vec<Vec<Vec<u8>>> = msgs(5).into_iter().map(|m| vec![m]).collect();
        let c = parse_chunk(&make_chunk(42, &entries, 0xff)).unwrap();
        assert_eq!(c.header.first_offset, 42);
        assert_eq!(c.header.num_records, 5);
        assert_eq!(c.header.timestamp, 1_700_000_000_000);
        assert_eq!(c.messages, msgs(5));
    }

    #[test]
    fn sub_entry_batches_plain_and_zstd_are_read() {
        for codec in [0u8, 4] {
            let c = parse_chunk(&make_chunk(0, &[msgs(3), msgs(4)], codec)).unwrap();
            let mut want = msgs(3);
            want.extend(msgs(4));
            assert_eq!(c.messages, want, "codec {codec}");
        }
    }

    #[test]
    fn a_codec_we_do_not_decode_is_a_clear_error() {
        let mut c = make_chunk(7, &[msgs(2)], 0);
        // Rewrite the batch's codec to gzip (1); the CRC covers the data, so fix it too.
        c[CHUNK_HEADER_LEN] = 0x80 | (1 << 4);
        let crc = crc32fast::hash(&c[CHUNK_HEADER_LEN..]);
        c[32..36].copy_from_slice(&crc.to_be_bytes());
        let e = parse_chunk(&c).unwrap_err().to_string();
        assert!(
            e.starts_with(
                "Compression error: chunk at offset 7: sub-entry batch compressed with gzip"
            ),
            "{e}"
        );
    }

    #[test]
    fn a_damaged_chunk_is_refused() {
        let good = make_chunk(9, &[msgs(3)], 0);
        let mut flipped = good.clone();
        *flipped.last_mut().unwrap() ^= 1;
        let e = parse_chunk(&flipped).unwrap_err().to_string();
        assert!(e.contains("CRC32 mismatch"), "{e}");
        // Every truncation is an error, never a panic.
        for n in 0..good.len() {
            assert!(parse_chunk(&good[..n]).is_err(), "{n} bytes");
        }
        let mut magic = good.clone();
        magic[0] = 0x40;
        assert!(parse_chunk(&magic)
            .unwrap_err()
            .to_string()
            .contains("magic"));
    }

    #[test]
    fn garbage_never_panics() {
        let mut x = 0x1234_5678_9abc_def0u64;
        for len in [0usize, 10, 47, 48, 49, 100, 1000] {
            for _ in 0..200 {
                let mut b: Vec<u8> = (0..len)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x as u8
                    })
                    .collect();
                if len >= 48 {
                    b[0] = 0x50;
                    // A CRC that matches, so the entry parser sees the garbage.
                    let dl = (len - 48) as u32;
                    b[36..40].copy_from_slice(&dl.to_be_bytes());
                    b[44] = 0;
                    let crc = crc32fast::hash(&b[48..]);
                    b[32..36].copy_from_slice(&crc.to_be_bytes());
                    b[1] = 0;
                }
                let _ = parse_chunk(&b);
            }
        }
    }
}
