//! Osiris chunks, as a `Deliver` frame carries them (rabbitmq/osiris `src/osiris_log.erl`,
//! "Chunk format"): a 48-byte header (magic 0x5, version, chunk type, entry and record counts,
//! timestamp, epoch, first offset, CRC32 of the data, data and trailer lengths, bloom filter
//! size), an optional bloom filter, then the data entries: simple entries (one message each)
//! and sub-entry batches (several messages, possibly compressed).
//!
//! [`parse_chunk`] checks the header and the CRC32 of the data; [`Chunk::messages`] then
//! reads the entries one message at a time, never trusting a length it has not checked:
//! simple entries are borrowed from the chunk, sub-entry batches decompressed as they are read
//! (zstd streaming), so a chunk costs the memory of its largest message, not of its contents.
//! A chunk may hold at most [`CHUNK_BUDGET`] bytes of messages once decompressed, and a
//! message at most [`MAX_MESSAGE`]: a few KiB of zstd batch can announce gigabytes, and
//! RabbitMQ itself never looks inside a batch (docs/streams.md "Streams").

use crate::error::{Error, Result};
use std::borrow::Cow;
use std::io::Read;

/// Size of a chunk header, bytes.
pub const CHUNK_HEADER_LEN: usize = 48;

/// Chunk type of user messages; the tracking chunks (1, 2) carry none.
pub const CHUNK_USER: u8 = 0;

/// Largest message read from a chunk, bytes: RabbitMQ's largest `max_message_size` (512 MiB
/// is its hard limit; 128 MiB its default).
pub const MAX_MESSAGE: usize = 128 << 20;

/// Most message bytes one chunk may give once its sub-entry batches are decompressed. RabbitMQ
/// stores a batch as the publisher sent it (it never decompresses one) and a publish frame
/// holds at most `frame_max` (1 MiB by default) of compressed batch: a chunk beyond this is a
/// compression bomb, not data a stream client of RabbitMQ sends.
pub const CHUNK_BUDGET: u64 = 512 << 20;

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

impl ChunkHeader {
    /// The offset after the chunk's last message (`first_offset + num_records`).
    ///
    /// Errors: `Error::Stream` when it does not fit a u64 (a broker never sends that).
    pub fn next_offset(&self) -> Result<u64> {
        self.first_offset
            .checked_add(u64::from(self.num_records))
            .ok_or_else(|| {
                bad(format!(
                    "chunk at offset {} announces {} records: beyond the largest offset",
                    self.first_offset, self.num_records
                ))
            })
    }

    /// The offset of the chunk's last message, `None` when it holds none.
    pub fn last_offset(&self) -> Result<Option<u64>> {
        Ok(self
            .next_offset()?
            .checked_sub(1)
            .filter(|_| self.num_records > 0))
    }
}

/// A checked chunk: its header and its data entries (borrowed from the frame).
#[derive(Debug, Clone, Copy)]
pub struct Chunk<'a> {
    pub header: ChunkHeader,
    data: &'a [u8],
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

/// Checks one chunk (the bytes after a `Deliver` frame's subscription id): its header, that
/// its data is present, and the CRC32 of the data. The entries are read by
/// [`Chunk::messages`].
///
/// Errors: `Error::Stream` for a truncated chunk or a CRC32 mismatch.
pub fn parse_chunk(b: &[u8]) -> Result<Chunk<'_>> {
    let header = parse_header(b)?;
    header.next_offset()?;
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
    Ok(Chunk { header, data })
}

impl<'a> Chunk<'a> {
    /// The chunk's messages (AMQP 1.0 encoded), in offset order (`header.first_offset + i`);
    /// none for tracking chunks.
    ///
    /// Each item is a message or the error that ends the chunk: `Error::Stream` for entries or
    /// records that disagree with the header, an entry that runs past the data, a message over
    /// [`MAX_MESSAGE`] or a chunk over [`CHUNK_BUDGET`]; `Error::Compression` for a sub-entry
    /// batch compressed with a codec rmq-backup does not decode (gzip, snappy, lz4: only
    /// uncompressed and zstd batches are read) or that does not decompress to what it
    /// announces.
    pub fn messages(&self) -> Messages<'a> {
        self.messages_within(CHUNK_BUDGET)
    }

    /// [`Chunk::messages`] with another budget than [`CHUNK_BUDGET`] (tests).
    fn messages_within(&self, budget: u64) -> Messages<'a> {
        let user = self.header.chunk_type == CHUNK_USER;
        Messages {
            header: self.header,
            data: self.data,
            p: 0,
            entries_left: if user { self.header.num_entries } else { 0 },
            records: 0,
            budget,
            batch: None,
            failed: false,
            user,
        }
    }
}

/// The sub-entry batch being read: its messages left and where they come from.
struct Batch<'a> {
    left: u16,
    /// Bytes the batch announces uncompressed and has not given yet.
    remaining: u64,
    source: BatchSource<'a>,
}

enum BatchSource<'a> {
    Plain(&'a [u8]),
    Zstd(Box<zstd::stream::read::Decoder<'a, &'a [u8]>>),
}

/// The messages of a chunk, read one at a time ([`Chunk::messages`]).
pub struct Messages<'a> {
    header: ChunkHeader,
    data: &'a [u8],
    p: usize,
    entries_left: u16,
    /// Messages given so far.
    records: u64,
    /// Message bytes the chunk may still give.
    budget: u64,
    batch: Option<Batch<'a>>,
    failed: bool,
    user: bool,
}

impl<'a> Iterator for Messages<'a> {
    type Item = Result<Cow<'a, [u8]>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let item = self.next_message().transpose();
        if matches!(item, Some(Err(_))) {
            self.failed = true;
        }
        item
    }
}

impl<'a> Messages<'a> {
    fn next_message(&mut self) -> Result<Option<Cow<'a, [u8]>>> {
        let m = self.read_message()?;
        // Never more than announced: offsets first_offset + i stay below next_offset().
        if m.is_some() && self.records > u64::from(self.header.num_records) {
            return Err(bad(format!(
                "chunk at offset {}: more records than the {} announced",
                self.header.first_offset, self.header.num_records
            )));
        }
        Ok(m)
    }

    fn read_message(&mut self) -> Result<Option<Cow<'a, [u8]>>> {
        loop {
            if let Some(batch) = self.batch.as_mut() {
                if batch.left > 0 {
                    batch.left -= 1;
                    let m = read_batch_message(batch, &mut self.budget, &self.header)?;
                    self.records += 1;
                    return Ok(Some(Cow::Owned(m)));
                }
                if batch.remaining != 0 || !batch_exhausted(batch) {
                    return Err(Error::Compression(format!(
                        "chunk at offset {}: a sub-entry batch holds more bytes than its messages",
                        self.header.first_offset
                    )));
                }
                self.batch = None;
            }
            if self.entries_left == 0 {
                return self.finish().map(|()| None);
            }
            self.entries_left -= 1;
            let h = self.header;
            let first = *self.data.get(self.p).ok_or_else(|| {
                bad(format!(
                    "chunk at offset {}: {} entries announced, the data ends after {}",
                    h.first_offset,
                    h.num_entries,
                    h.num_entries - self.entries_left - 1
                ))
            })?;
            if first & 0x80 == 0 {
                let size = (read_u32(self.data, self.p, &h)? & 0x7fff_ffff) as usize;
                let m = slice(self.data, self.p + 4, size, &h)?;
                self.p += 4 + size;
                spend(&mut self.budget, size, &h)?;
                self.records += 1;
                return Ok(Some(Cow::Borrowed(m)));
            }
            let codec = (first >> 4) & 0x7;
            let head = slice(self.data, self.p, 11, &h)?;
            let count = be_u16(head, 1);
            let uncompressed = u64::from(be_u32(head, 3));
            let size = be_u32(head, 7) as usize;
            let body = slice(self.data, self.p + 11, size, &h)?;
            self.p += 11 + size;
            if uncompressed > self.budget {
                return Err(over_budget(&h));
            }
            let source = match codec {
                0 => BatchSource::Plain(body),
                4 => BatchSource::Zstd(Box::new(zstd_decoder(body, &h)?)),
                other => return Err(unsupported_codec(other, &h)),
            };
            self.batch = Some(Batch {
                left: count,
                remaining: uncompressed,
                source,
            });
        }
    }

    /// After the last entry: the messages found must be the records announced.
    fn finish(&self) -> Result<()> {
        if self.user && self.records != u64::from(self.header.num_records) {
            return Err(bad(format!(
                "chunk at offset {}: {} records announced, {} found",
                self.header.first_offset, self.header.num_records, self.records
            )));
        }
        Ok(())
    }
}

fn over_budget(h: &ChunkHeader) -> Error {
    bad(format!(
        "chunk at offset {}: its messages take more than {} MiB once decompressed; rmq-backup reads at most that much per chunk (a compression bomb, or a chunk no RabbitMQ stream client writes)",
        h.first_offset,
        CHUNK_BUDGET >> 20
    ))
}

fn spend(budget: &mut u64, n: usize, h: &ChunkHeader) -> Result<()> {
    if n > MAX_MESSAGE {
        return Err(bad(format!(
            "chunk at offset {}: a message of {n} bytes; rmq-backup reads messages of at most {} MiB",
            h.first_offset,
            MAX_MESSAGE >> 20
        )));
    }
    *budget = budget.checked_sub(n as u64).ok_or_else(|| over_budget(h))?;
    Ok(())
}

/// One message of a sub-entry batch: its 4-byte length, then its bytes, checked against what
/// the batch announced and the chunk's budget before anything is allocated.
fn read_batch_message(batch: &mut Batch, budget: &mut u64, h: &ChunkHeader) -> Result<Vec<u8>> {
    let short = || {
        Error::Compression(format!(
            "chunk at offset {}: a sub-entry batch ends before its messages do",
            h.first_offset
        ))
    };
    let mut len = [0u8; 4];
    read_exact(&mut batch.source, &mut len, h)?;
    let n = u32::from_be_bytes(len) as usize;
    batch.remaining = batch
        .remaining
        .checked_sub(4 + n as u64)
        .ok_or_else(short)?;
    spend(budget, n, h)?;
    let mut m = vec![0u8; n];
    read_exact(&mut batch.source, &mut m, h)?;
    Ok(m)
}

fn read_exact(source: &mut BatchSource, out: &mut [u8], h: &ChunkHeader) -> Result<()> {
    match source {
        BatchSource::Plain(rest) => {
            if rest.len() < out.len() {
                return Err(Error::Compression(format!(
                    "chunk at offset {}: a sub-entry batch ends before its messages do",
                    h.first_offset
                )));
            }
            let (head, tail) = rest.split_at(out.len());
            out.copy_from_slice(head);
            *rest = tail;
            Ok(())
        }
        BatchSource::Zstd(d) => d.read_exact(out).map_err(|e| {
            Error::Compression(format!(
                "chunk at offset {}: zstd sub-entry batch does not decompress to what it announces: {e}",
                h.first_offset
            ))
        }),
    }
}

/// Largest zstd window a sub-entry batch may use (log2: 16 MiB). A frame may ask its decoder
/// for a window of up to 2 GiB; stream clients compress batches of at most a few MiB.
const ZSTD_WINDOW_LOG_MAX: u32 = 24;

fn zstd_decoder<'a>(
    body: &'a [u8],
    h: &ChunkHeader,
) -> Result<zstd::stream::read::Decoder<'a, &'a [u8]>> {
    let failed = |e: std::io::Error| {
        Error::Compression(format!(
            "chunk at offset {}: zstd sub-entry batch: {e}",
            h.first_offset
        ))
    };
    let mut d = zstd::stream::read::Decoder::with_buffer(body).map_err(failed)?;
    d.window_log_max(ZSTD_WINDOW_LOG_MAX).map_err(failed)?;
    Ok(d)
}

/// True when the batch's source has nothing left.
fn batch_exhausted(batch: &mut Batch) -> bool {
    match &mut batch.source {
        BatchSource::Plain(rest) => rest.is_empty(),
        BatchSource::Zstd(d) => matches!(d.read(&mut [0u8; 1]), Ok(0)),
    }
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

/// Codecs of sub-entry batches (osiris / stream clients): 0 none, 1 gzip, 2 snappy, 3 lz4,
/// 4 zstd; rmq-backup reads 0 and 4.
fn unsupported_codec(codec: u8, h: &ChunkHeader) -> Error {
    Error::Compression(format!(
        "chunk at offset {}: sub-entry batch compressed with {} (codec {codec}); rmq-backup reads uncompressed and zstd batches only",
        h.first_offset,
        match codec {
            1 => "gzip",
            2 => "snappy",
            3 => "lz4",
            _ => "an unknown codec",
        }
    ))
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

    /// Every message of a chunk, or the first error.
    fn read_all(b: &[u8]) -> Result<(ChunkHeader, Vec<Vec<u8>>)> {
        let c = parse_chunk(b)?;
        let messages = c
            .messages()
            .map(|m| m.map(|m| m.into_owned()))
            .collect::<Result<Vec<_>>>()?;
        Ok((c.header, messages))
    }

    fn msgs(n: usize) -> Vec<Vec<u8>> {
        (0..n).map(|i| vec![i as u8; i]).collect()
    }

    #[test]
    fn simple_entries_come_out_in_order() {
        let entries: Vec<Vec<Vec<u8>>> = msgs(5).into_iter().map(|m| vec![m]).collect();
        let (h, messages) = read_all(&make_chunk(42, &entries, 0xff)).unwrap();
        assert_eq!(h.first_offset, 42);
        assert_eq!(h.num_records, 5);
        assert_eq!(h.timestamp, 1_700_000_000_000);
        assert_eq!(messages, msgs(5));
    }

    #[test]
    fn sub_entry_batches_plain_and_zstd_are_read() {
        for codec in [0u8, 4] {
            let (_, messages) = read_all(&make_chunk(0, &[msgs(3), msgs(4)], codec)).unwrap();
            let mut want = msgs(3);
            want.extend(msgs(4));
            assert_eq!(messages, want, "codec {codec}");
        }
    }

    #[test]
    fn a_codec_we_do_not_decode_is_a_clear_error() {
        let mut c = make_chunk(7, &[msgs(2)], 0);
        // Rewrite the batch's codec to gzip (1); the CRC covers the data, so fix it too.
        c[CHUNK_HEADER_LEN] = 0x80 | (1 << 4);
        let crc = crc32fast::hash(&c[CHUNK_HEADER_LEN..]);
        c[32..36].copy_from_slice(&crc.to_be_bytes());
        let e = read_all(&c).unwrap_err().to_string();
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
        let e = read_all(&flipped).unwrap_err().to_string();
        assert!(e.contains("CRC32 mismatch"), "{e}");
        // Every truncation is an error, never a panic.
        for n in 0..good.len() {
            assert!(read_all(&good[..n]).is_err(), "{n} bytes");
        }
        let mut magic = good.clone();
        magic[0] = 0x40;
        assert!(read_all(&magic).unwrap_err().to_string().contains("magic"));
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
                let _ = read_all(&b);
            }
        }
    }

    /// A zstd sub-entry batch announcing `announced` bytes, made of `count` messages of
    /// `size` zero bytes (compressed as they are written: nothing this large is ever in
    /// memory).
    fn zstd_batch(count: usize, size: usize, announced: u32) -> Vec<u8> {
        use std::io::Write;
        let mut z = zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap();
        let zeros = vec![0u8; size];
        for _ in 0..count {
            z.write_all(&(size as u32).to_be_bytes()).unwrap();
            z.write_all(&zeros).unwrap();
        }
        let body = z.finish().unwrap();
        let mut data = vec![0x80 | (4 << 4)];
        data.extend_from_slice(&(count as u16).to_be_bytes());
        data.extend_from_slice(&announced.to_be_bytes());
        data.extend_from_slice(&(body.len() as u32).to_be_bytes());
        data.extend_from_slice(&body);
        data
    }

    /// A user chunk at offset 7 of `batches` (entries) holding `records` messages.
    fn chunk_of(batches: &[Vec<u8>], records: usize) -> Vec<u8> {
        let data = batches.concat();
        let mut c = vec![0x50, CHUNK_USER];
        c.extend_from_slice(&(batches.len() as u16).to_be_bytes());
        c.extend_from_slice(&(records as u32).to_be_bytes());
        c.extend_from_slice(&[0u8; 16]);
        c.extend_from_slice(&7u64.to_be_bytes());
        c.extend_from_slice(&crc32fast::hash(&data).to_be_bytes());
        c.extend_from_slice(&(data.len() as u32).to_be_bytes());
        c.extend_from_slice(&[0u8; 8]);
        c.extend_from_slice(&data);
        c
    }

    fn zstd_bomb(count: usize, size: usize, announced: u32) -> Vec<u8> {
        chunk_of(&[zstd_batch(count, size, announced)], count)
    }

    #[test]
    fn a_batch_announcing_more_than_the_budget_is_refused_before_it_is_read() {
        let bomb = zstd_bomb(4, 1 << 10, u32::MAX);
        assert!(bomb.len() < 200, "{} bytes announce 4 GiB", bomb.len());
        let e = read_all(&bomb).unwrap_err().to_string();
        assert!(
            e.starts_with("Stream protocol error: chunk at offset 7: its messages take more than 512 MiB once decompressed"),
            "{e}"
        );
    }

    #[test]
    fn a_chunk_is_read_lazily_up_to_its_budget() {
        // Two batches of 6 messages of 1 MiB: 12 MiB from a few KiB, read one message at a
        // time; a budget of 10 MiB takes the first batch, not the second.
        let size = 1 << 20;
        let batch = zstd_batch(6, size, 6 * (size as u32 + 4));
        let bomb = chunk_of(&[batch.clone(), batch], 12);
        assert!(bomb.len() < 4 << 10, "{} bytes", bomb.len());
        let c = parse_chunk(&bomb).unwrap();
        let mut it = c.messages_within(10 * (size as u64));
        for i in 0..6 {
            let m = it.next().unwrap().unwrap();
            assert_eq!(m.len(), size, "message {i}");
        }
        let e = it.next().unwrap().unwrap_err().to_string();
        assert!(e.contains("once decompressed"), "{e}");
        assert!(it.next().is_none(), "an error ends the chunk");
    }

    #[test]
    fn a_batch_that_lies_about_its_size_is_refused() {
        // Announces less than it holds, then more.
        for announced in [1000u32, 3 * 1028 + 1] {
            let e = read_all(&zstd_bomb(3, 1024, announced))
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with("Compression error: chunk at offset 7: "),
                "{announced}: {e}"
            );
        }
        assert_eq!(read_all(&zstd_bomb(3, 1024, 3 * 1028)).unwrap().1.len(), 3);
    }

    #[test]
    fn simple_entries_are_borrowed_not_copied() {
        let entries: Vec<Vec<Vec<u8>>> = msgs(3).into_iter().map(|m| vec![m]).collect();
        let chunk = make_chunk(0, &entries, 0xff);
        let c = parse_chunk(&chunk).unwrap();
        assert!(c.messages().all(|m| matches!(m, Ok(Cow::Borrowed(_)))));
    }

    #[test]
    fn a_chunk_never_gives_more_records_than_it_announces() {
        let mut c = make_chunk(u64::MAX - 3, &[msgs(3)], 0);
        // Announce 2 records for a batch of 3.
        c[4..8].copy_from_slice(&2u32.to_be_bytes());
        let chunk = parse_chunk(&c).unwrap();
        let got: Vec<_> = chunk.messages().collect();
        assert_eq!(got.len(), 3);
        assert!(got[..2].iter().all(|m| m.is_ok()));
        let e = got[2].as_ref().unwrap_err().to_string();
        assert!(e.contains("more records than the 2 announced"), "{e}");
    }

    #[test]
    fn offsets_beyond_u64_are_an_error() {
        let mut c = make_chunk(u64::MAX - 1, &[msgs(3)], 0);
        let e = parse_chunk(&c).unwrap_err().to_string();
        assert!(e.contains("beyond the largest offset"), "{e}");
        c[24..32].copy_from_slice(&(u64::MAX - 3).to_be_bytes());
        let h = parse_chunk(&c).unwrap().header;
        assert_eq!(h.last_offset().unwrap(), Some(u64::MAX - 1));
    }
}
