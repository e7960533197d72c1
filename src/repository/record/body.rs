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
mod simd {
    use super::Chain;
    use std::arch::x86_64::*;

    /// Whether the CPU has SSSE3 (`pshufb`, `pmaddubsw`); detected once, then cached by std.
    /// Under Miri this follows the compile-time target features (SSE2 only by default), so Miri
    /// checks the scalar path unless run with `-C target-feature=+ssse3`.
    #[inline]
    pub(super) fn available() -> bool {
        is_x86_feature_detected!("ssse3")
    }

    /// Shuffle that packs four `[h,t,o,',']` lanes of 4 bytes into the text of four elements
    /// (the leading digits a number does not have are left out), and the text's length. Index:
    /// bit i set when element i is >= 10, bit 4+i when it is >= 100.
    static ENC_SHUF: [([u8; 16], u8); 256] = build_enc_shuf();

    const fn build_enc_shuf() -> [([u8; 16], u8); 256] {
        let mut t = [([0x80u8; 16], 0u8); 256];
        let mut idx = 0;
        while idx < 256 {
            let mut pos = 0;
            let mut i = 0;
            while i < 4 {
                let len = 1 + ((idx >> i) & 1) + ((idx >> (4 + i)) & 1);
                // Lane i holds [h, t, o, ','] at 4i..4i+4: take its last len + 1 bytes.
                let mut k = 3 - len;
                while k < 4 {
                    t[idx].0[pos] = (4 * i + k) as u8;
                    pos += 1;
                    k += 1;
                }
                i += 1;
            }
            t[idx].1 = pos as u8;
            idx += 1;
        }
        t
    }

    /// Writes `"n,"` for the body bytes in whole chunks of 16 into `buf` from `pos`. Returns the
    /// number of body bytes written and the position after the last comma.
    ///
    /// # Safety
    ///
    /// The CPU must have SSSE3: [`available`] returned true. (Out-of-bounds access is not a
    /// concern of the caller: every slice access is checked.)
    pub(super) unsafe fn encode(body: &[u8], buf: &mut [u8], pos: usize) -> (usize, usize) {
        // SAFETY: the caller guarantees SSSE3 (this function's contract).
        unsafe { encode_ssse3(body, buf, pos) }
    }

    #[target_feature(enable = "ssse3")]
    fn encode_ssse3(body: &[u8], buf: &mut [u8], mut pos: usize) -> (usize, usize) {
        let zero = _mm_setzero_si128();
        let ten = _mm_set1_epi16(10);
        let tenth = _mm_set1_epi16(6554); // mulhi(x, 6554) == x / 10 for x <= 255
        let ascii = _mm_set1_epi8(b'0' as i8);
        let comma = _mm_set1_epi8(b',' as i8);
        let mut done = 0;
        for chunk in body.chunks_exact(16) {
            let c: &[u8; 16] = chunk.try_into().unwrap_or(&[0; 16]);
            // SAFETY: `c` is 16 readable bytes; loadu has no alignment requirement.
            let v = unsafe { _mm_loadu_si128(c.as_ptr().cast()) };
            // Digits, in 16-bit lanes: q = v / 10, o = v % 10, h = q / 10, t = q % 10.
            let digits = |x: __m128i| {
                let q = _mm_mulhi_epu16(x, tenth);
                let o = _mm_sub_epi16(x, _mm_mullo_epi16(q, ten));
                let h = _mm_mulhi_epu16(q, tenth);
                let t = _mm_sub_epi16(q, _mm_mullo_epi16(h, ten));
                (h, t, o)
            };
            let (hl, tl, ol) = digits(_mm_unpacklo_epi8(v, zero));
            let (hh, th, oh) = digits(_mm_unpackhi_epi8(v, zero));
            let h = _mm_add_epi8(_mm_packus_epi16(hl, hh), ascii);
            let t = _mm_add_epi8(_mm_packus_epi16(tl, th), ascii);
            let o = _mm_add_epi8(_mm_packus_epi16(ol, oh), ascii);
            // Lanes of [h, t, o, ','], four elements per register.
            let ht_lo = _mm_unpacklo_epi8(h, t);
            let ht_hi = _mm_unpackhi_epi8(h, t);
            let oc_lo = _mm_unpacklo_epi8(o, comma);
            let oc_hi = _mm_unpackhi_epi8(o, comma);
            let lanes = [
                _mm_unpacklo_epi16(ht_lo, oc_lo),
                _mm_unpackhi_epi16(ht_lo, oc_lo),
                _mm_unpacklo_epi16(ht_hi, oc_hi),
                _mm_unpackhi_epi16(ht_hi, oc_hi),
            ];
            // v >= 10 and v >= 100 (unsigned): max(v, k) == v.
            let ge = |k: i8| {
                let kk = _mm_set1_epi8(k);
                _mm_movemask_epi8(_mm_cmpeq_epi8(_mm_max_epu8(v, kk), v)) as u32
            };
            let (ge10, ge100) = (ge(10), ge(100));
            for (g, lane) in lanes.into_iter().enumerate() {
                let idx = ((ge10 >> (4 * g)) & 15) | (((ge100 >> (4 * g)) & 15) << 4);
                let (shuf, len) = &ENC_SHUF[idx as usize];
                // SAFETY: `shuf` is 16 readable bytes.
                let mask = unsafe { _mm_loadu_si128(shuf.as_ptr().cast()) };
                let text = _mm_shuffle_epi8(lane, mask);
                // The caller reserved 4 bytes per body byte: the 16 bytes at `pos` are inside
                // the reservation of these 4 elements and the ones before them.
                let Some(dst) = buf.get_mut(pos..pos + 16) else {
                    return (done, pos);
                };
                // SAFETY: `dst` is 16 writable bytes; storeu has no alignment requirement.
                unsafe { _mm_storeu_si128(dst.as_mut_ptr().cast(), text) };
                pos += *len as usize;
            }
            done += 16;
        }
        (done, pos)
    }

    /// Decoding of four elements whose lengths are l0..l3 (1..=3), indexed by
    /// `l0 | l1 << 2 | l2 << 4 | l3 << 6`, as four vectors (one cache line):
    /// - `shuf`: moves each element's digits into 4-byte lanes `[0, h, t, o]` (absent digits 0);
    /// - `span`: 0xFF on the bytes of the four elements and their commas (each must be a digit
    ///   or a comma);
    /// - `lead`: 0xFF on the first digit of each element of two or more digits (a '0' there is
    ///   a leading zero);
    /// - `limit`: the largest value a lane may hold, 255, or -1 for an index with a zero length
    ///   (not four elements), so that every value exceeds it.
    #[repr(C, align(64))]
    struct DecPattern {
        shuf: [u8; 16],
        span: [u8; 16],
        lead: [u8; 16],
        limit: [i32; 4],
    }

    static DEC_PAT: [DecPattern; 256] = build_dec_pat();

    const fn build_dec_pat() -> [DecPattern; 256] {
        let mut t = [const {
            DecPattern {
                shuf: [0x80; 16],
                span: [0; 16],
                lead: [0; 16],
                limit: [-1; 4],
            }
        }; 256];
        let mut idx = 0;
        while idx < 256 {
            let mut start = 0;
            let mut ok = true;
            let mut i = 0;
            while i < 4 {
                let len = (idx >> (2 * i)) & 3;
                if len == 0 {
                    ok = false;
                    break;
                }
                // Lane i: [0x80, h, t, o], the digits right-aligned.
                let mut k = 0;
                while k < len {
                    t[idx].shuf[4 * i + 3 - k] = (start + len - 1 - k) as u8;
                    k += 1;
                }
                // The element's digits and its comma.
                let mut b = start;
                while b <= start + len {
                    t[idx].span[b] = 0xFF;
                    b += 1;
                }
                if len >= 2 {
                    t[idx].lead[start] = 0xFF;
                }
                start += len + 1;
                i += 1;
            }
            if ok {
                t[idx].limit = [255; 4];
            } else {
                t[idx].shuf = [0x80; 16];
                t[idx].span = [0; 16];
                t[idx].lead = [0; 16];
            }
            idx += 1;
        }
        t
    }

    /// The [`DEC_PAT`] index of the first four elements of a window, by the window's comma
    /// mask (bit i set when byte i is a comma) up to and including the fourth comma.
    static DEC_IDX: [u8; 65536] = build_dec_idx();

    const fn build_dec_idx() -> [u8; 65536] {
        let mut t = [0u8; 65536];
        let mut m = 0;
        while m < 65536 {
            let mut idx = 0;
            let mut prev = 0; // start of the current element
            let mut found = 0;
            let mut bit = 0;
            while bit < 16 && found < 4 {
                if m & (1 << bit) != 0 {
                    let len = bit - prev;
                    if len == 0 || len > 3 {
                        break; // leaves idx with a zero length: invalid
                    }
                    idx |= len << (2 * found);
                    found += 1;
                    prev = bit + 1;
                }
                bit += 1;
            }
            t[m] = if found == 4 { idx as u8 } else { 0 };
            m += 1;
        }
        t
    }

    /// Parses groups of four elements, each followed by a comma, from the start of every
    /// chain, one group per chain per round. Each chain stops before a window without four
    /// commas or whose fourth comma is not before the chain's `last` (the scalar loop then
    /// continues from there). Returns false when some group parsed was not four compact numbers
    /// 0..=255 (the bytes written are then meaningless and the array is not compact).
    ///
    /// What a group is checked for is gathered in one vector and tested once at the end, so
    /// that a step has no branch but the one that ends the chain.
    ///
    /// # Safety
    ///
    /// The CPU must have SSSE3: [`available`] returned true. (Out-of-bounds access is not a
    /// concern of the caller: every slice access is checked.)
    pub(super) unsafe fn decode(s: &[u8], chains: &mut [Chain]) -> bool {
        // SAFETY: the caller guarantees SSSE3 (this function's contract).
        unsafe { decode_ssse3(s, chains) }
    }

    #[target_feature(enable = "ssse3")]
    fn decode_ssse3(s: &[u8], chains: &mut [Chain]) -> bool {
        let mut bad = _mm_setzero_si128();
        if let [a, b, c, d] = chains {
            run4(s, [a, b, c, d], &mut bad);
        } else if let [a, b] = chains {
            run4(s, [a, b], &mut bad);
        } else {
            chains.iter_mut().for_each(|c| run4(s, [c], &mut bad));
        }
        _mm_movemask_epi8(bad) == 0
    }

    /// Steps the `N` chains in turn until each has stopped. Positions, counts and outputs are
    /// copied to locals so that they stay in registers (the loop over `0..N` is unrolled).
    #[inline]
    #[target_feature(enable = "ssse3")]
    fn run4<const N: usize>(s: &[u8], chains: [&mut Chain; N], bad: &mut __m128i) {
        let mut p = [0usize; N];
        let mut k = [0usize; N];
        let mut last = [0usize; N];
        for (j, c) in chains.iter().enumerate() {
            (p[j], k[j], last[j]) = (c.p, c.k, c.last);
        }
        let mut outs = chains.map(|c| c);
        let mut acc = *bad;
        // While every chain has 16 bytes before its `last`, a group is always whole and inside
        // the chain (each step advances 16 bytes at most): no test but the count. What a step
        // could not parse goes into `acc` (a window without four commas selects an invalid
        // pattern).
        loop {
            let mut rounds = usize::MAX;
            for j in 0..N {
                rounds = rounds.min(last[j].saturating_sub(p[j]) / 16);
            }
            if rounds == 0 {
                break;
            }
            for _ in 0..rounds {
                for j in 0..N {
                    let (vals, next) = group(s, p[j], &mut acc);
                    let Some(dst) = outs[j].out.get_mut(k[j]..k[j] + 4) else {
                        // Only text that is not compact numbers gets here (runs of commas):
                        // a valid group takes at least 8 bytes of text for its 4 bytes, and a
                        // chain's output has room for one byte per 2 bytes of text.
                        *bad = _mm_set1_epi8(-1);
                        return;
                    };
                    dst.copy_from_slice(&vals.to_le_bytes());
                    p[j] = next;
                    k[j] += 4;
                }
            }
        }
        // The rest, a step at a time with the ends tested.
        let mut on = [true; N];
        loop {
            let mut any = false;
            for j in 0..N {
                if on[j] {
                    let (vals, next) = step4(s, p[j], last[j], &mut acc);
                    match outs[j].out.get_mut(k[j]..k[j] + 4) {
                        Some(dst) if next != 0 => {
                            dst.copy_from_slice(&vals.to_le_bytes());
                            p[j] = next;
                            k[j] += 4;
                            any = true;
                        }
                        _ => on[j] = false,
                    }
                }
            }
            if !any {
                break;
            }
        }
        *bad = acc;
        for (j, c) in outs.iter_mut().enumerate() {
            (c.p, c.k) = (p[j], k[j]);
        }
    }

    /// Parses the four elements at `p` when the 16 bytes there hold four commas, the fourth
    /// before `last`: returns their bytes and the start of the next element, or `(0, 0)`
    /// (nothing parsed). Sets bytes of `bad` unless the four are 1 to 3 digit numbers 0..=255
    /// without leading zeros.
    #[inline]
    #[target_feature(enable = "ssse3")]
    fn step4(s: &[u8], p: usize, last: usize, bad: &mut __m128i) -> (u32, usize) {
        let Some(w) = s.get(p..p + 16) else {
            return (0, 0);
        };
        // SAFETY: `w` is 16 readable bytes; loadu has no alignment requirement.
        let v = unsafe { _mm_loadu_si128(w.as_ptr().cast()) };
        let m = comma_mask(v);
        // The fourth comma.
        let m3 = clear_lowest(clear_lowest(clear_lowest(m)));
        if m3 == 0 || p + m3.trailing_zeros() as usize >= last {
            return (0, 0);
        }
        parse4(v, m, p, bad)
    }

    /// [`step4`] for a window known to end before the chain's `last`: the four elements are
    /// parsed whatever they are. A window without four commas is parsed as the first 16 bytes
    /// and sets `bad` (its comma positions select an invalid pattern).
    #[inline]
    #[target_feature(enable = "ssse3")]
    fn group(s: &[u8], p: usize, bad: &mut __m128i) -> (u32, usize) {
        let Some(w) = s.get(p..p + 16) else {
            *bad = _mm_set1_epi8(-1);
            return (0, p + 16);
        };
        // SAFETY: `w` is 16 readable bytes; loadu has no alignment requirement.
        let v = unsafe { _mm_loadu_si128(w.as_ptr().cast()) };
        parse4(v, comma_mask(v), p, bad)
    }

    /// Bit i set when byte i of `v` is a comma.
    #[inline]
    #[target_feature(enable = "ssse3")]
    fn comma_mask(v: __m128i) -> u32 {
        _mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8(b',' as i8))) as u32
    }

    #[inline(always)]
    fn clear_lowest(m: u32) -> u32 {
        m & m.wrapping_sub(1)
    }

    /// The four elements of window `v` (at `p`, comma mask `m`): their bytes and the start of
    /// the next element; bytes of `bad` set when they are not four compact numbers 0..=255.
    /// With fewer than four commas, the group is taken to end at byte 15 (and is bad).
    #[inline]
    #[target_feature(enable = "ssse3")]
    fn parse4(v: __m128i, m: u32, p: usize, bad: &mut __m128i) -> (u32, usize) {
        let m3 = clear_lowest(clear_lowest(clear_lowest(m))) | 1 << 15;
        let c3 = m3.trailing_zeros() as usize;
        let span = m3 ^ (m3 - 1); // bits 0..=c3
        let comma = _mm_cmpeq_epi8(v, _mm_set1_epi8(b',' as i8));
        let pat = &DEC_PAT[DEC_IDX[(m & span) as usize] as usize];
        // SAFETY: the pattern's fields are 16 readable bytes each.
        let (shuf, in_span, lead, limit) = unsafe {
            (
                _mm_loadu_si128(pat.shuf.as_ptr().cast()),
                _mm_loadu_si128(pat.span.as_ptr().cast()),
                _mm_loadu_si128(pat.lead.as_ptr().cast()),
                _mm_loadu_si128(pat.limit.as_ptr().cast()),
            )
        };
        let d = _mm_sub_epi8(v, _mm_set1_epi8(b'0' as i8));
        let digit = _mm_cmpeq_epi8(_mm_min_epu8(d, _mm_set1_epi8(9)), d);
        let zero = _mm_cmpeq_epi8(d, _mm_setzero_si128());
        let lanes = _mm_shuffle_epi8(d, shuf);
        let weights = _mm_set1_epi32(i32::from_le_bytes([0, 100, 10, 1]));
        let pairs = _mm_maddubs_epi16(lanes, weights);
        let vals = _mm_madd_epi16(pairs, _mm_set1_epi16(1));
        // A byte of the four that is neither a digit nor a comma, a leading zero, a value over
        // 255 (or any value, for comma positions that are not four elements of 1 to 3 digits).
        let not_text = _mm_andnot_si128(_mm_or_si128(digit, comma), in_span);
        let leading_zero = _mm_and_si128(zero, lead);
        let too_big = _mm_cmpgt_epi32(vals, limit);
        *bad = _mm_or_si128(
            *bad,
            _mm_or_si128(not_text, _mm_or_si128(leading_zero, too_big)),
        );
        let packed = _mm_packus_epi16(_mm_packs_epi32(vals, vals), _mm_setzero_si128());
        (_mm_cvtsi128_si32(packed) as u32, p + c3 + 1)
    }
}
