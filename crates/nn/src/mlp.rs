use std::sync::OnceLock;

use half::f16;

use crate::{record, Backend, Linear, Result, Tap, VarBuilder};

/// The gate activation of a gated MLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU: `silu(gate) * up` (Llama, Qwen).
    Silu,
    /// GeGLU with the tanh approximation: `gelu(gate) * up` (Gemma).
    GeluTanh,
}

/// `down(act(gate(x)) * up(x))`.
pub struct GatedMlp<B: Backend> {
    pub gate: Linear<B>,
    pub up: Linear<B>,
    pub down: Linear<B>,
    pub activation: Activation,
}

impl<B: Backend> GatedMlp<B> {
    /// Loads `ffn_gate`, `ffn_up`, `ffn_down` under `vb`.
    pub fn load(
        be: &B,
        vb: &VarBuilder,
        dim: usize,
        hidden: usize,
        activation: Activation,
    ) -> Result<Self> {
        Ok(GatedMlp {
            gate: Linear::load(be, vb, "ffn_gate", hidden, dim)?,
            up: Linear::load(be, vb, "ffn_up", hidden, dim)?,
            down: Linear::load(be, vb, "ffn_down", dim, hidden)?,
            activation,
        })
    }

    /// `x: [rows, dim]` -> `[rows, dim]`; `name` prefixes tapped intermediates.
    pub fn forward(
        &self,
        be: &B,
        x: &B::Tensor,
        name: &str,
        tap: &mut dyn Tap,
    ) -> Result<B::Tensor> {
        let [gate, up] = Linear::forward_many(be, x, [&self.gate, &self.up])?;
        self.forward_projected(be, gate, up, name, tap)
    }

    /// [`GatedMlp::forward`] from the gate and up projections.
    pub fn forward_projected(
        &self,
        be: &B,
        gate: B::Tensor,
        up: B::Tensor,
        name: &str,
        tap: &mut dyn Tap,
    ) -> Result<B::Tensor> {
        let act = self.activate_projected(be, gate, up, name, tap)?;
        self.down.forward(be, &act)
    }

    /// `act(gate(x)) * up(x)`: everything before `down`.
    pub fn activate(
        &self,
        be: &B,
        x: &B::Tensor,
        name: &str,
        tap: &mut dyn Tap,
    ) -> Result<B::Tensor> {
        let [gate, up] = Linear::forward_many(be, x, [&self.gate, &self.up])?;
        self.activate_projected(be, gate, up, name, tap)
    }

    /// [`GatedMlp::activate`] from the gate and up projections.
    pub fn activate_projected(
        &self,
        be: &B,
        gate: B::Tensor,
        up: B::Tensor,
        name: &str,
        tap: &mut dyn Tap,
    ) -> Result<B::Tensor> {
        record(be, tap, name, "ffn_gate", &gate)?;
        record(be, tap, name, "ffn_up", &up)?;
        let act = be.glu_for(&gate, &up, self.activation, &self.down.weight)?;
        record(be, tap, name, "ffn_act", &act)?;
        Ok(act)
    }
}

/// GELU (tanh approximation) exactly as ggml's CPU backend evaluates it: the input rounded to
/// f16, the result looked up in a table of f16 values, saturating outside ±10.
pub fn gelu_tanh_f16_table(x: f32) -> f32 {
    if x <= -10.0 {
        return 0.0;
    }
    if x >= 10.0 {
        return x;
    }
    gelu_f16_table()[f16::from_f32(x).to_bits() as usize].to_f32()
}

/// ggml's table: the GELU of every f16 value, rounded to f16, indexed by the input's bits.
/// The CUDA backend uploads this same table, so both backends agree exactly.
pub fn gelu_f16_table() -> &'static [f16] {
    &gelu_f16_table_padded()[..1 << 16]
}

/// [`gelu_f16_table`] and one zero entry after it, so that a 4-byte gather of the last entry
/// stays inside.
pub(crate) fn gelu_f16_table_padded() -> &'static [f16] {
    static TABLE: OnceLock<Vec<f16>> = OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|bits| f16::from_f32(gelu_tanh(f16::from_bits(bits).to_f32())))
            .chain([f16::ZERO])
            .collect()
    })
}

/// `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`.
pub fn gelu_tanh(x: f32) -> f32 {
    #[allow(clippy::excessive_precision)]
    const SQRT_2_OVER_PI: f32 = 0.797_884_560_802_865_4;
    const COEF_A: f32 = 0.044715;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + COEF_A * x * x)).tanh())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gelu_table_tracks_formula() {
        for i in -300..300 {
            let x = i as f32 * 0.037;
            let (a, b) = (gelu_tanh_f16_table(x), gelu_tanh(x));
            assert!((a - b).abs() <= 2e-3 * b.abs().max(1.0), "{x}: {a} vs {b}");
        }
        assert_eq!(gelu_tanh_f16_table(-11.0), 0.0);
        assert_eq!(gelu_tanh_f16_table(12.5), 12.5);
    }
}
