//! The body array of the record format (SPEC.md: `body` is a JSON array of byte numbers,
//! `[12,255,0]`), written and parsed at memory speed for [`super::codec`].
//!
//! Encoding and decoding of the compact form (no whitespace) run 16 body bytes / 4 elements
//! per step with SSSE3 when the CPU has it (checked at run time), else with the scalar loops
//! here, which are always correct and are what the SIMD code must agree with. Anything that is
//! not the compact form of numbers 0..=255 makes [`parse_compact`] answer `None`; the caller then
//! uses its general parser or serde_json, so the accepted language stays serde_json's.

// ---------------------------------------------------------------------------------------------
// Encode
// ---------------------------------------------------------------------------------------------

/// Decimal text of each byte value followed by a comma, packed little-endian in a u32
/// (`"7,"` is `[b'7', b',', 0, 0]`), and its length in bytes.
static BYTE_TEXT: [(u32, u32); 256] = build_byte_text();

const fn build_byte_text() -> [(u32, u32); 256] {
    let mut t = [(0u32, 0u32); 256];
    let mut i = 0;
    while i < 256 {
        let mut bytes = [0u8; 4];
        let len;
        if i < 10 {
            bytes[0] = b'0' + i as u8;
            bytes[1] = b',';
            len = 2;
        } else if i < 100 {
            bytes[0] = b'0' + (i / 10) as u8;
            bytes[1] = b'0' + (i % 10) as u8;
            bytes[2] = b',';
            len = 3;
        } else {
            bytes[0] = b'0' + (i / 100) as u8;
            bytes[1] = b'0' + ((i / 10) % 10) as u8;
            bytes[2] = b'0' + (i % 10) as u8;
            bytes[3] = b',';
            len = 4;
        }
        t[i] = (u32::from_le_bytes(bytes), len);
        i += 1;
    }
    t
}

/// Appends the JSON of a body, exactly as serde_json writes it through `ser_body`: `null` when
/// empty, else `[b0,b1,...]` (compact, decimal, no leading zeros).
pub(super) fn write_body(body: &[u8], out: &mut Vec<u8>) {
    write_body_with(body, out, true);
}

/// [`write_body`], with SIMD only when `simd` is true (tests compare both paths).
pub(super) fn write_body_with(body: &[u8], out: &mut Vec<u8>, simd: bool) {
    if body.is_empty() {
        out.extend_from_slice(b"null");
        return;
    }
    let start = out.len();
    // '[' plus at most 4 bytes ("255,") per body byte; the last ',' becomes ']'.
    out.resize(start + 1 + body.len() * 4, 0);
    let buf = &mut out[start..];
    buf[0] = b'[';
    let mut pos = 1;
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if simd && simd::available() {
        // SAFETY: `available()` just returned true: the CPU has SSSE3.
        (done, pos) = unsafe { simd::encode(body, buf, pos) };
    }
    pos = write_scalar(&body[done..], buf, pos);
    buf[pos - 1] = b']';
    out.truncate(start + pos);
}

/// Writes `"n,"` for each byte of `body` into `buf` from `pos`; returns the position after the
/// last comma. `buf` has at least 4 bytes per body byte from `pos`.
fn write_scalar(body: &[u8], buf: &mut [u8], mut pos: usize) -> usize {
    for &b in body {
        let (text, len) = BYTE_TEXT[b as usize];
        buf[pos..pos + 4].copy_from_slice(&text.to_le_bytes());
        pos += len as usize;
    }
    pos
}

// ---------------------------------------------------------------------------------------------
// Decode
// ---------------------------------------------------------------------------------------------

const LO: u64 = 0x0101_0101_0101_0101;
const HI: u64 = 0x8080_8080_8080_8080;

/// Index of the first `c` in `s` at or after `from`, 8 bytes at a time.
fn find_byte(s: &[u8], from: usize, c: u8) -> Option<usize> {
    let pattern = LO * u64::from(c);
    let mut i = from;
    while let Some(chunk) = s.get(i..i + 8) {
        let mut arr = [0u8; 8];
        arr.copy_from_slice(chunk);
        let t = u64::from_le_bytes(arr) ^ pattern;
        // High bit exactly at the bytes equal to `c` (no carries between bytes).
        let eq = !(((t & !HI) + !HI) | t) & HI;
        if eq != 0 {
            return Some(i + (eq.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    s.get(i..)?.iter().position(|&b| b == c).map(|k| i + k)
}

/// One element of a compact body array at `i`: a number 0..=255 in strict JSON syntax followed
/// by a separator byte. Returns the value, the separator's index and the separator, or `None`
/// when the bytes are not such an element (or fewer than 4 bytes remain).
#[inline(always)]
fn compact_element(s: &[u8], i: usize) -> Option<(u8, usize, u8)> {
    let w = s.get(i..i + 4)?;
    let d0 = w[0].wrapping_sub(b'0') as u32;
    let d1 = w[1].wrapping_sub(b'0') as u32;
    let d2 = w[2].wrapping_sub(b'0') as u32;
    // Digit count and value without branches: random bodies make the count unpredictable,
    // and a mispredicted branch per byte costs more than the arithmetic.
    let two = (d1 <= 9) as u32;
    let three = two & (d2 <= 9) as u32;
    let v2 = d0 * 10 + d1;
    let v3 = v2 * 10 + d2;
    let mut v = d0 ^ ((d0 ^ v2) & two.wrapping_neg());
    v ^= (v ^ v3) & three.wrapping_neg();
    let len = (1 + two + three) as usize;
    if (d0 > 9) | ((d0 == 0) & (two == 1)) | (v > 255) {
        return None;
    }
    Some((v as u8, i + len, w[len & 3]))
}

/// Most independent chains [`parse_compact`] splits an array into.
const CHAINS: usize = 4;

/// One chain of [`parse_compact`]: a run of elements from `p` whose last separator is at
/// `last` (a comma, or the closing `]` for the last chain), written to `out` from `k`.
struct Chain<'a> {
    p: usize,
    last: usize,
    out: &'a mut [u8],
    k: usize,
    done: bool,
}

/// Parses a compact body array (`[1,22,255]`, no whitespace) whose first element starts at `a`.
/// Returns the bytes and the index after `]`, or `None` when the array is not in this form
/// (the general parser then decides).
///
/// Parsing one number depends on the previous number's length, a serial chain of several
/// cycles; the array is therefore split at commas into up to [`CHAINS`] parts parsed in the
/// same loop, independent chains (4 elements per step each with SIMD, then one at a time for
/// what SIMD left).
pub(super) fn parse_compact(s: &[u8], a: usize) -> Option<(Vec<u8>, usize)> {
    parse_compact_with(s, a, true)
}

/// [`parse_compact`], with SIMD only when `simd` is true (tests compare both paths).
pub(super) fn parse_compact_with(s: &[u8], a: usize, simd: bool) -> Option<(Vec<u8>, usize)> {
    let end = a + memchr::memchr(b']', s.get(a..)?)?;
    let n = match end - a {
        0..64 => 1,
        64..512 => 2,
        _ => CHAINS,
    };
    // Chain j covers [starts[j], lasts[j]]: split at the first comma after each j/n of the text.
    let mut starts = [a; CHAINS];
    let mut lasts = [end; CHAINS];
    let mut used = 1;
    for j in 1..n {
        let from = (a + (end - a) * j / n).max(starts[used - 1] + 1);
        match find_byte(&s[..end], from, b',') {
            Some(c) => {
                lasts[used - 1] = c;
                starts[used] = c + 1;
                used += 1;
            }
            None => break,
        }
    }
    lasts[used - 1] = end;
    // Every element takes at least two characters (a digit and a separator), which bounds each
    // chain's count; each writes into its own part of one buffer, then the parts are joined.
    let mut caps = [0usize; CHAINS];
    for j in 0..used {
        caps[j] = (lasts[j] + 1 - starts[j]) / 2 + 1;
    }
    let caps = &caps[..used];
    let mut buf = vec![0u8; caps.iter().sum()];
    let mut chains: Vec<Chain> = Vec::with_capacity(used);
    let mut rest: &mut [u8] = &mut buf;
    for j in 0..used {
        let (out, tail) = rest.split_at_mut(caps[j]);
        rest = tail;
        chains.push(Chain {
            p: starts[j],
            last: lasts[j],
            out,
            k: 0,
            done: false,
        });
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `decode` runs only after `available()` returned true: the CPU has SSSE3.
    if simd && simd::available() && !unsafe { simd::decode(s, &mut chains) } {
        return None;
    }
    // What is left of each chain, one element per chain per round.
    match chains.as_mut_slice() {
        [a, b, c, d] => scalar_chains(s, [a, b, c, d])?,
        [a, b, c] => scalar_chains(s, [a, b, c])?,
        [a, b] => scalar_chains(s, [a, b])?,
        [a] => scalar_chains(s, [a])?,
        _ => return None,
    }
    let mut counts = [0usize; CHAINS];
    for (count, c) in counts.iter_mut().zip(&chains) {
        *count = c.k;
    }
    drop(chains);
    let (mut from, mut to) = (0, 0);
    for (cap, count) in caps.iter().zip(counts) {
        buf.copy_within(from..from + count, to);
        from += cap;
        to += count;
    }
    // Not shrunk: a reallocation would copy the whole body again (the spare capacity, about
    // 0.8 of the body for random bytes, lives only as long as the record).
    buf.truncate(to);
    Some((buf, end + 1))
}

/// Parses the rest of each chain one element at a time, the chains in turn (independent work
/// for the CPU to overlap), with positions and counts in locals. `None` when some chain is not
/// compact numbers 0..=255 separated by commas and ending exactly at its `last`.
#[inline(always)]
fn scalar_chains<const N: usize>(s: &[u8], mut chains: [&mut Chain; N]) -> Option<()> {
    let mut p = [0usize; N];
    let mut k = [0usize; N];
    let mut last = [0usize; N];
    let mut on = [true; N];
    for (j, c) in chains.iter().enumerate() {
        (p[j], k[j], last[j], on[j]) = (c.p, c.k, c.last, !c.done);
    }
    loop {
        let mut any = false;
        for j in 0..N {
            if on[j] {
                any = true;
                let (v, sep, sep_byte) = compact_element(s, p[j])?;
                if sep > last[j] || (sep < last[j] && sep_byte != b',') {
                    return None;
                }
                *chains[j].out.get_mut(k[j])? = v;
                k[j] += 1;
                p[j] = sep + 1;
                on[j] = sep != last[j];
            }
        }
        if !any {
            break;
        }
    }
    for (j, c) in chains.iter_mut().enumerate() {
        (c.p, c.k, c.done) = (p[j], k[j], true);
    }
    Some(())
}

// ---------------------------------------------------------------------------------------------
// SSSE3
// ---------------------------------------------------------------------------------------------

#[cfg(target_arch = "x86_64")]
mod simd;
