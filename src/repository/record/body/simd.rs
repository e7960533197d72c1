//! The SSSE3 paths of the body codec ([`super`]): 16 body bytes written, or 4 elements parsed,
//! per step; they must agree with the scalar loops of the parent, which the tests check.

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
