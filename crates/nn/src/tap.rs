/// Receives named intermediates during a forward pass (`blk.3.attn_out`, shape `[rows, cols]`),
/// so a port can be compared with its reference layer by layer.
pub trait Tap {
    /// True when `name` is wanted; lets models skip work for unwanted tensors.
    fn wants(&self, name: &str) -> bool;
    fn record(&mut self, name: &str, rows: usize, cols: usize, data: &[f32]);
}

/// The tap that records nothing.
pub struct NoTap;

impl Tap for NoTap {
    fn wants(&self, _: &str) -> bool {
        false
    }
    fn record(&mut self, _: &str, _: usize, _: usize, _: &[f32]) {}
}
