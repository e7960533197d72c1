//! [`ZstdSink`]: one zstd frame written through a compression context that outlives its
//! segment. A segment writer takes a context from a small process-wide pool and gives it back
//! when its frame ends (or it is dropped), so a backup of many small segments does not build
//! and free a context (its tables and window, and with workers the thread pool) per segment:
//! a profile of 5,000 small queues showed `ZSTD_createCCtx` and its first-use allocations at
//! about 7% of the CPU.
//!
//! The frame is what `zstd::stream::write::Encoder` writes (the same library calls:
//! `ZSTD_compressStream2` with continue, flush and end), so readers see no difference.

use std::io::{self, Write};
use std::sync::Mutex;

use zstd::zstd_safe::zstd_sys::ZSTD_EndDirective;
use zstd::zstd_safe::{self, CCtx, CParameter, InBuffer, OutBuffer, ResetDirective};

/// Contexts kept for reuse at most: one per segment being written at once is the common
/// case (`backup.max_concurrent_queues`, default 4).
const POOL_MAX: usize = 8;

static POOL: Mutex<Vec<CCtx<'static>>> = Mutex::new(Vec::new());

fn zstd_err(code: usize) -> io::Error {
    io::Error::other(zstd_safe::get_error_name(code))
}

/// A context from the pool (or a new one), reset and set to `level` with `workers` worker
/// threads (0: compress on the caller's thread) and `job_size` bytes per job.
fn take(level: i32, workers: u32, job_size: u32) -> io::Result<CCtx<'static>> {
    let pooled = POOL.lock().ok().and_then(|mut pool| pool.pop());
    let mut cctx = match pooled {
        Some(c) => c,
        None => {
            CCtx::try_create().ok_or_else(|| io::Error::other("cannot allocate a zstd context"))?
        }
    };
    cctx.reset(ResetDirective::SessionAndParameters)
        .map_err(zstd_err)?;
    cctx.set_parameter(CParameter::CompressionLevel(level))
        .map_err(zstd_err)?;
    if workers > 0 {
        cctx.set_parameter(CParameter::NbWorkers(workers))
            .map_err(zstd_err)?;
        cctx.set_parameter(CParameter::JobSize(job_size))
            .map_err(zstd_err)?;
    }
    Ok(cctx)
}

/// Gives a context back to the pool (its session is reset when it is taken again).
fn give_back(cctx: CCtx<'static>) {
    if let Ok(mut pool) = POOL.lock() {
        if pool.len() < POOL_MAX {
            pool.push(cctx);
        }
    }
}

/// Writes one zstd frame into `W`.
pub(super) struct ZstdSink<W: Write> {
    cctx: Option<CCtx<'static>>,
    inner: Option<W>,
    out: Vec<u8>,
}

impl<W: Write> ZstdSink<W> {
    /// Starts a frame at `level` (1 to 22) with `workers` zstd worker threads.
    ///
    /// Errors: zstd's, for example for an invalid level.
    pub(super) fn new(inner: W, level: i32, workers: u32, job_size: u32) -> io::Result<Self> {
        Ok(ZstdSink {
            cctx: Some(take(level, workers, job_size)?),
            inner: Some(inner),
            out: Vec::with_capacity(CCtx::out_size()),
        })
    }

    /// Runs the context on `input` with `op` until the input is taken (and, for flush and
    /// end, until the context holds nothing more), writing what it produces.
    fn run(&mut self, input: &[u8], op: ZSTD_EndDirective) -> io::Result<()> {
        let (Some(cctx), Some(inner)) = (self.cctx.as_mut(), self.inner.as_mut()) else {
            return Err(io::Error::other("zstd frame already ended"));
        };
        let mut input = InBuffer::around(input);
        loop {
            self.out.clear();
            let left = cctx
                .compress_stream2(&mut OutBuffer::around(&mut self.out), &mut input, op)
                .map_err(zstd_err)?;
            inner.write_all(&self.out)?;
            let taken = input.pos == input.src.len();
            let done = match op {
                ZSTD_EndDirective::ZSTD_e_continue => taken,
                _ => taken && left == 0,
            };
            if done {
                return Ok(());
            }
        }
    }

    /// The frame's input compressed so far and the output produced for it, bytes
    /// (`ZSTD_getFrameProgression`: with workers, the input of jobs under way is not counted
    /// yet, so the two compare what is done).
    pub(super) fn progress(&self) -> (u64, u64) {
        self.cctx.as_ref().map_or((0, 0), |c| {
            let p = c.get_frame_progression();
            (p.consumed, p.produced)
        })
    }

    /// Ends the frame and returns the writer; the context goes back to the pool.
    ///
    /// Errors: zstd's, or the writer's.
    pub(super) fn finish(mut self) -> io::Result<W> {
        self.run(&[], ZSTD_EndDirective::ZSTD_e_end)?;
        if let Some(cctx) = self.cctx.take() {
            give_back(cctx);
        }
        self.inner
            .take()
            .ok_or_else(|| io::Error::other("zstd frame already ended"))
    }
}

impl<W: Write> Drop for ZstdSink<W> {
    fn drop(&mut self) {
        if let Some(cctx) = self.cctx.take() {
            give_back(cctx);
        }
    }
}

impl<W: Write> Write for ZstdSink<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.run(buf, ZSTD_EndDirective::ZSTD_e_continue)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.run(&[], ZSTD_EndDirective::ZSTD_e_flush)?;
        match self.inner.as_mut() {
            Some(w) => w.flush(),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data() -> Vec<u8> {
        let mut x = 88172645463325252u64;
        let mut v: Vec<u8> = b"some text that repeats ".repeat(50_000);
        v.extend((0..(3 << 20)).map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        }));
        v
    }

    #[test]
    fn frames_written_with_reused_contexts_decode_to_their_input() {
        let input = data();
        for workers in [0, 2] {
            for round in 0..3 {
                let mut sink = ZstdSink::new(Vec::new(), 3, workers, 1 << 20).unwrap();
                for piece in input.chunks(100_003) {
                    sink.write_all(piece).unwrap();
                }
                if round == 1 {
                    sink.flush().unwrap();
                }
                let frame = sink.finish().unwrap();
                assert!(frame.len() < input.len());
                assert_eq!(
                    zstd::decode_all(&frame[..]).unwrap(),
                    input,
                    "{workers} {round}"
                );
            }
        }
        // A context dropped mid-frame is reset before its next frame.
        let mut sink = ZstdSink::new(Vec::new(), 19, 0, 1 << 20).unwrap();
        sink.write_all(&input[..1000]).unwrap();
        drop(sink);
        let mut sink = ZstdSink::new(Vec::new(), 1, 0, 1 << 20).unwrap();
        sink.write_all(b"abc").unwrap();
        assert_eq!(
            zstd::decode_all(&sink.finish().unwrap()[..]).unwrap(),
            b"abc"
        );
    }
}
