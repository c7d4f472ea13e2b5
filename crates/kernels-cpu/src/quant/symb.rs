//! SYMB4: the `.symb` directory format's INT4 groups (docs/symb.md) as row blocks.
//!
//! A `.symb` INT4 file keeps one f32 scale per group of 128 values of the flattened tensor and
//! the codes after all the scales. Where a row is a whole number of groups (every matrix whose
//! inner dimension is a multiple of 128), each group becomes one 68-byte block: the f32 scale
//! (little-endian), then the 64 code bytes as the file has them, the first value of each pair in
//! the high nibble. A value is `(code - 8) · scale`, exactly as the file means it.
//!
//! Activations stay f32. The dot product keeps eight lane sums a block (lane l: elements l,
//! l + 8, ... in turn), adds them as MXFP8's kernel does, multiplies by the scale and adds the
//! block's term to the row's sum in block order; the AVX2 kernel computes the same operations
//! in the same order, so the two agree bit for bit.

use super::QuantizedActs;

/// Values per block (the `.symb` group size).
pub(crate) const QK: usize = 128;
/// Bytes per block: the f32 scale and 64 code bytes.
pub(crate) const BLOCK_BYTES: usize = 4 + QK / 2;

#[inline(always)]
pub(crate) fn block_scale(block: &[u8]) -> f32 {
    f32::from_le_bytes([block[0], block[1], block[2], block[3]])
}

/// The signed value of element `i` of a block's codes.
#[inline(always)]
fn code(codes: &[u8], i: usize) -> i32 {
    let byte = codes[i / 2];
    let nibble = if i.is_multiple_of(2) {
        byte >> 4
    } else {
        byte & 0x0f
    };
    nibble as i32 - 8
}

pub(crate) fn dequantize_symb4(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(QK)) {
        let scale = block_scale(block);
        let codes = &block[4..];
        for (i, o) in out.iter_mut().enumerate() {
            *o = code(codes, i) as f32 * scale;
        }
    }
}

/// One weight row (SYMB4 blocks) dotted with f32 activations (see the module notes).
pub(crate) fn dot_symb4(w: &[u8], a: &QuantizedActs) -> f32 {
    let mut sum = 0f32;
    for (block, x) in w.chunks_exact(BLOCK_BYTES).zip(a.vals.chunks_exact(QK)) {
        let codes = &block[4..];
        let mut lanes = [0f32; 8];
        for c in 0..QK / 8 {
            for (l, lane) in lanes.iter_mut().enumerate() {
                *lane += code(codes, 8 * c + l) as f32 * x[8 * c + l];
            }
        }
        let block_sum = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6]))
            + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
        sum += block_sum * block_scale(block);
    }
    sum
}

/// `x` (whole blocks) in SYMB4 as `.symb`'s encoder writes a group: scale = absmax / 7 (1 for an
/// all-zero group), code = clamp(round-half-even(x / scale), -8, 7) + 8.
pub(crate) fn quantize_symb4(x: &[f32], out: &mut Vec<u8>) {
    for group in x.chunks_exact(QK) {
        let (scale, codes) = encode_group(group);
        out.extend_from_slice(&scale.to_le_bytes());
        out.extend_from_slice(&codes);
    }
}

/// One group of up to 128 values (a short tail is padded with zeros): its scale and 64 code
/// bytes.
pub fn encode_group(group: &[f32]) -> (f32, [u8; QK / 2]) {
    let amax = group.iter().fold(0f32, |m, v| m.max(v.abs()));
    let scale = if amax > 0.0 { amax / 7.0 } else { 1.0 };
    let mut codes = [0u8; QK / 2];
    for (i, byte) in codes.iter_mut().enumerate() {
        let nibble = |j: usize| -> u8 {
            let v = group.get(j).copied().unwrap_or(0.0);
            ((v / scale).round_ties_even().clamp(-8.0, 7.0) as i32 + 8) as u8
        };
        *byte = (nibble(2 * i) << 4) | nibble(2 * i + 1);
    }
    (scale, codes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_encodes_as_the_format_says() {
        let mut g = [0f32; QK];
        g[0] = 7.0;
        g[1] = -7.0;
        g[2] = 0.5; // ties to even: 0
        g[3] = 1.5; // 2
        g[4] = 2.5; // 2
        g[5] = -3.4;
        let (scale, codes) = encode_group(&g);
        assert_eq!(scale, 1.0);
        assert_eq!(codes[0], (15 << 4) | 1);
        assert_eq!(codes[1], (8 << 4) | 10);
        assert_eq!(codes[2], (10 << 4) | 5);
        assert!(codes[3..].iter().all(|&b| b == 0x88));
        let (zero_scale, zero_codes) = encode_group(&[0.0; QK]);
        assert_eq!(zero_scale, 1.0);
        assert!(zero_codes.iter().all(|&b| b == 0x88));
    }

    #[test]
    fn blocks_dequantize_to_what_was_encoded_within_half_a_step() {
        let mut rng = crate::testutil::Rng::new(7);
        let x = rng.normal_vec(4 * QK, 1.0);
        let mut blocks = Vec::new();
        quantize_symb4(&x, &mut blocks);
        assert_eq!(blocks.len(), 4 * BLOCK_BYTES);
        let mut back = vec![0f32; x.len()];
        dequantize_symb4(&blocks, &mut back);
        for (g, (xs, bs)) in x.chunks(QK).zip(back.chunks(QK)).enumerate() {
            let scale = block_scale(&blocks[g * BLOCK_BYTES..]);
            for (a, b) in xs.iter().zip(bs) {
                assert!((a - b).abs() <= scale * 0.5 + 1e-6, "{a} vs {b}");
            }
        }
    }
}
