use std::fmt;

/// Storage type of a tensor: plain element types, ggml's block-quantized types and synaptix's own
/// block types (which only `.syn` bundles hold).
///
/// A block type packs `block_len()` consecutive elements of a row into `block_bytes()` bytes;
/// rows are always a whole number of blocks. Discriminants are the GGUF type ids; synaptix's own
/// types take ids from [`DType::SYNAPTIX_IDS`] on, which no GGUF file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum DType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2K = 10,
    Q3K = 11,
    Q4K = 12,
    Q5K = 13,
    Q6K = 14,
    Q8K = 15,
    IQ2XXS = 16,
    IQ2XS = 17,
    IQ3XXS = 18,
    IQ1S = 19,
    IQ4NL = 20,
    IQ3S = 21,
    IQ2S = 22,
    IQ4XS = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    IQ1M = 29,
    BF16 = 30,
    TQ1_0 = 34,
    TQ2_0 = 35,
    MXFP4 = 39,
    /// OCP Microscaling MXFP8: blocks of 32 E4M3 values sharing one E8M0 scale (docs/syn.md).
    MXFP8 = 1001,
    /// NVFP4: E2M1 values, an E4M3 scale per 16 and an FP32 scale per tensor, in blocks of 64
    /// that each repeat the tensor's scale (docs/syn.md).
    NVFP4 = 1002,
    /// SQ1 .. SQ8: synaptix's portable formats, super-blocks of 256 with `b`-bit codes as
    /// bit-planes and byte scales and offsets per 32 (docs/syn.md).
    SQ1 = 1011,
    SQ2 = 1012,
    SQ3 = 1013,
    SQ4 = 1014,
    SQ5 = 1015,
    SQ6 = 1016,
    SQ7 = 1017,
    SQ8 = 1018,
    /// The `.symb` directory format's INT4 groups (docs/symb.md) as blocks of 128: an f32 scale,
    /// then 64 bytes of 4-bit codes, the first of each pair in the high nibble;
    /// w = (code - 8) · scale.
    SYMB4 = 1020,
}

/// Elements per super-block of the k-quants and i-quants.
pub const QK_K: usize = 256;

impl DType {
    /// The first id of synaptix's own types (never read from or written to GGUF).
    pub const SYNAPTIX_IDS: u32 = 1000;

    pub const ALL: [DType; 43] = [
        DType::F32,
        DType::F16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q8_1,
        DType::Q2K,
        DType::Q3K,
        DType::Q4K,
        DType::Q5K,
        DType::Q6K,
        DType::Q8K,
        DType::IQ2XXS,
        DType::IQ2XS,
        DType::IQ3XXS,
        DType::IQ1S,
        DType::IQ4NL,
        DType::IQ3S,
        DType::IQ2S,
        DType::IQ4XS,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::F64,
        DType::IQ1M,
        DType::BF16,
        DType::TQ1_0,
        DType::TQ2_0,
        DType::MXFP4,
        DType::MXFP8,
        DType::NVFP4,
        DType::SQ1,
        DType::SQ2,
        DType::SQ3,
        DType::SQ4,
        DType::SQ5,
        DType::SQ6,
        DType::SQ7,
        DType::SQ8,
        DType::SYMB4,
    ];

    /// The dtype with this GGUF / ggml type id, if it is one we know.
    pub fn from_gguf_id(id: u32) -> Option<DType> {
        DType::ALL
            .iter()
            .copied()
            .find(|d| d.in_gguf() && *d as u32 == id)
    }

    /// The GGUF / ggml type id (for synaptix's own types, an id no GGUF reader knows: check
    /// [`DType::in_gguf`] before writing one).
    pub fn gguf_id(self) -> u32 {
        self as u32
    }

    /// Whether GGUF can hold the type (ggml's types; synaptix's own live only in `.syn`).
    pub fn in_gguf(self) -> bool {
        (self as u32) < Self::SYNAPTIX_IDS
    }

    /// Elements per block (1 for plain element types).
    pub fn block_len(self) -> usize {
        use DType::*;
        match self {
            F32 | F16 | BF16 | F64 | I8 | I16 | I32 | I64 => 1,
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | IQ4NL | MXFP4 | MXFP8 => 32,
            Q2K | Q3K | Q4K | Q5K | Q6K | Q8K | IQ2XXS | IQ2XS | IQ3XXS | IQ1S | IQ3S | IQ2S
            | IQ4XS | IQ1M | TQ1_0 | TQ2_0 => QK_K,
            NVFP4 => 64,
            SQ1 | SQ2 | SQ3 | SQ4 | SQ5 | SQ6 | SQ7 | SQ8 => QK_K,
            SYMB4 => 128,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        use DType::*;
        match self {
            F32 | I32 => 4,
            F16 | BF16 | I16 => 2,
            F64 | I64 => 8,
            I8 => 1,
            Q4_0 => 18,
            Q4_1 => 20,
            Q5_0 => 22,
            Q5_1 => 24,
            Q8_0 => 34,
            Q8_1 => 36,
            Q2K => 84,
            Q3K => 110,
            Q4K => 144,
            Q5K => 176,
            Q6K => 210,
            Q8K => 292,
            IQ2XXS => 66,
            IQ2XS => 74,
            IQ3XXS => 98,
            IQ1S => 50,
            IQ4NL => 18,
            IQ3S => 110,
            IQ2S => 82,
            IQ4XS => 136,
            IQ1M => 56,
            TQ1_0 => 54,
            TQ2_0 => 66,
            MXFP4 => 17,
            MXFP8 => 33,
            NVFP4 => 40,
            // 20-byte header, then b u32 bit-planes for each of 8 sub-blocks.
            SQ1 | SQ2 | SQ3 | SQ4 | SQ5 | SQ6 | SQ7 | SQ8 => 20 + 32 * self.sq_bits().unwrap_or(0),
            SYMB4 => 68,
        }
    }

    /// The code width of SQ1 .. SQ8.
    pub fn sq_bits(self) -> Option<usize> {
        use DType::*;
        Some(match self {
            SQ1 => 1,
            SQ2 => 2,
            SQ3 => 3,
            SQ4 => 4,
            SQ5 => 5,
            SQ6 => 6,
            SQ7 => 7,
            SQ8 => 8,
            _ => return None,
        })
    }

    /// True for ggml's block-quantized types.
    pub fn is_quantized(self) -> bool {
        self.block_len() > 1
    }

    /// Bytes needed for `elements` values, or `None` when `elements` is not a whole number of
    /// blocks or the size overflows.
    pub fn bytes_for(self, elements: u64) -> Option<u64> {
        let block = self.block_len() as u64;
        if !elements.is_multiple_of(block) {
            return None;
        }
        (elements / block).checked_mul(self.block_bytes() as u64)
    }

    /// Bits per weight, for reports.
    pub fn bits_per_weight(self) -> f64 {
        self.block_bytes() as f64 * 8.0 / self.block_len() as f64
    }

    /// ggml's name for the type (`q4_K`, `f16`, ...), as GGUF tools print it.
    pub fn name(self) -> &'static str {
        use DType::*;
        match self {
            F32 => "f32",
            F16 => "f16",
            BF16 => "bf16",
            F64 => "f64",
            I8 => "i8",
            I16 => "i16",
            I32 => "i32",
            I64 => "i64",
            Q4_0 => "q4_0",
            Q4_1 => "q4_1",
            Q5_0 => "q5_0",
            Q5_1 => "q5_1",
            Q8_0 => "q8_0",
            Q8_1 => "q8_1",
            Q2K => "q2_K",
            Q3K => "q3_K",
            Q4K => "q4_K",
            Q5K => "q5_K",
            Q6K => "q6_K",
            Q8K => "q8_K",
            IQ2XXS => "iq2_xxs",
            IQ2XS => "iq2_xs",
            IQ3XXS => "iq3_xxs",
            IQ1S => "iq1_s",
            IQ4NL => "iq4_nl",
            IQ3S => "iq3_s",
            IQ2S => "iq2_s",
            IQ4XS => "iq4_xs",
            IQ1M => "iq1_m",
            TQ1_0 => "tq1_0",
            TQ2_0 => "tq2_0",
            MXFP4 => "mxfp4",
            MXFP8 => "mxfp8",
            NVFP4 => "nvfp4",
            SQ1 => "sq1",
            SQ2 => "sq2",
            SQ3 => "sq3",
            SQ4 => "sq4",
            SQ5 => "sq5",
            SQ6 => "sq6",
            SQ7 => "sq7",
            SQ8 => "sq8",
            SYMB4 => "symb4",
        }
    }

    /// Parses ggml's name, case-insensitively (`Q4_K`, `q4_k`, `f16`).
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL
            .iter()
            .copied()
            .find(|d| d.name().eq_ignore_ascii_case(name))
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_are_unique() {
        for d in DType::ALL.into_iter().filter(|d| d.in_gguf()) {
            assert_eq!(DType::from_gguf_id(d.gguf_id()), Some(d));
        }
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()), Some(d));
        }
        assert_eq!(
            DType::from_gguf_id(4),
            None,
            "id 4 (old Q4_2) was removed from ggml"
        );
        assert_eq!(DType::from_gguf_id(1000), None);
        assert_eq!(
            DType::from_gguf_id(DType::MXFP8 as u32),
            None,
            "synaptix's own types are not GGUF ids"
        );
        assert!(!DType::MXFP8.in_gguf() && DType::MXFP4.in_gguf());
    }

    #[test]
    fn byte_sizes() {
        assert_eq!(DType::Q4K.bytes_for(4096), Some(16 * 144));
        assert_eq!(DType::Q8_0.bytes_for(33), None);
        assert_eq!(DType::F32.bytes_for(u64::MAX), None);
        assert!((DType::Q4_0.bits_per_weight() - 4.5).abs() < 1e-9);
    }
}
