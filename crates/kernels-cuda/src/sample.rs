//! The GPU part of sampling, so that logits never cross to the host: repetition penalties on
//! the logits in place, and the top-k candidates (ids and exact values) in the CPU sampler's
//! order. Kernels in `kernels/sample.cu`; only `k` ids and values (and a count) come back.

use cudarc::driver::LaunchConfig;

use crate::launch::Launch;
use crate::ops::{check, i32_arg};
use crate::{CudaDevice, DeviceBuffer, Result};

/// Largest `k` [`top_k`] accepts.
pub const MAX_TOP_K: usize = 256;

/// Threads of every top-k block (the kernels are written for exactly this many).
const TOPK_THREADS: u32 = 1024;

/// The most composites the merge stage takes (16 per thread of its one block).
const MERGE_MAX: usize = 16 * TOPK_THREADS as usize;

/// Threads per block of the penalty kernel, and its most blocks (the pair list is short).
const PENALTY_THREADS: u32 = 256;
const PENALTY_MAX_BLOCKS: usize = 64;

/// Applies the CPU sampler's repetition, frequency and presence penalties to `logits` in place,
/// bit for bit: for every listed token `l = if l <= 0 { l * repeat } else { l / repeat }`, then
/// `l -= count as f32 * frequency + presence` (f32, each operation rounded, no fused
/// multiply-add).
///
/// - `pairs: [capacity * 2]` i32: `(token id, occurrences)` pairs, the distinct tokens of the
///   penalty window with their counts (every id at most once; ids outside `0 .. logits.len()`
///   are skipped, as the CPU skips them).
/// - `count: [>= 1]` i32: element 0 is the number of live pairs, read by the kernel (clamped to
///   `0 ..= capacity`), so that a recorded graph can be replayed with another window: refill
///   `pairs` and `count` (e.g. with [`CudaDevice::overwrite`]) before each replay.
///
/// The launch shape depends on `capacity` only.
pub fn apply_penalties(
    dev: &CudaDevice,
    logits: &mut DeviceBuffer<f32>,
    pairs: &DeviceBuffer<i32>,
    count: &DeviceBuffer<i32>,
    repeat: f32,
    frequency: f32,
    presence: f32,
) -> Result<()> {
    const OP: &str = "apply_penalties";
    check(OP, pairs.len().is_multiple_of(2), || {
        format!("pairs buffer of {} i32, not (id, count) pairs", pairs.len())
    })?;
    check(OP, !count.is_empty(), || "empty count buffer".into())?;
    let capacity = pairs.len() / 2;
    let n32 = i32_arg(OP, "n", logits.len())?;
    let cap32 = i32_arg(OP, "pair capacity", capacity)?;
    let blocks = capacity
        .div_ceil(PENALTY_THREADS as usize)
        .clamp(1, PENALTY_MAX_BLOCKS) as u32;
    let f = dev.function("sample", "apply_penalties_f32")?;
    let mut l = Launch::new(dev, &f);
    l.arg(logits)
        .arg(n32)
        .arg(pairs)
        .arg(count)
        .arg(cap32)
        .arg(repeat)
        .arg(frequency)
        .arg(presence);
    // SAFETY: the kernel reads count[0], then pairs[2p], pairs[2p + 1] for p below that count
    // clamped to `capacity` (inside `pairs`), and touches logits[id] only for 0 <= id < n.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (PENALTY_THREADS, 1, 1),
            shared_mem_bytes: 0,
        })
    }?;
    Ok(())
}

/// Elements per thread of the partial stage (1, 4, 8 or 16: the kernels instantiated) and the
/// number of its blocks, for `n` logits and `k`: one block for up to 8192 logits, else blocks
/// of 8192 (16384 when `blocks * k` would exceed what the merge stage takes).
fn partial_plan(n: usize, k: usize) -> (usize, usize) {
    let per_thread = match n.div_ceil(TOPK_THREADS as usize) {
        0..=1 => 1,
        2..=4 => 4,
        _ if n.div_ceil(8 * TOPK_THREADS as usize) * k <= MERGE_MAX => 8,
        _ => 16,
    };
    (per_thread, n.div_ceil(per_thread * TOPK_THREADS as usize))
}

/// Elements per thread of the merge stage for `m` composites (`m <= MERGE_MAX`).
fn merge_plan(m: usize) -> usize {
    match m.div_ceil(TOPK_THREADS as usize) {
        0..=1 => 1,
        2..=4 => 4,
        5..=8 => 8,
        _ => 16,
    }
}

/// The `k` (1 ..= 256) largest values of `x`, in the CPU sampler's candidate order: value
/// descending by `f32::total_cmp` (so +0.0 before -0.0, -inf last), ties to the lowest id, NaN
/// excluded. Writes `out_ids[..c]` (i32), `out_vals[..c]` (the exact values) and
/// `out_count[0] = c`, where c = k, or the number of non-NaN values when fewer; elements past
/// c are left as they were.
///
/// Two launches whose shapes depend on `n` and `k` only (graph-capturable): `ceil(n / (1024 E))`
/// blocks of 1024 threads (E = 1, 4, 8 or 16 logits per thread) each select the top k of their
/// slice into a scratch buffer of `blocks * k` u64, then one block of 1024 threads selects from
/// those. `n` may be up to 16384 * floor(16384 / k) (1 Mi for k = 256).
pub fn top_k(
    dev: &CudaDevice,
    x: &DeviceBuffer<f32>,
    k: usize,
    out_ids: &mut DeviceBuffer<i32>,
    out_vals: &mut DeviceBuffer<f32>,
    out_count: &mut DeviceBuffer<i32>,
) -> Result<()> {
    const OP: &str = "top_k";
    let n = x.len();
    check(OP, (1..=MAX_TOP_K).contains(&k), || {
        format!("k = {k}, outside 1 ..= {MAX_TOP_K}")
    })?;
    check(OP, n > 0, || "no logits".into())?;
    check(OP, out_ids.len() >= k && out_vals.len() >= k, || {
        format!(
            "outputs of {} ids and {} values for k = {k}",
            out_ids.len(),
            out_vals.len()
        )
    })?;
    check(OP, !out_count.is_empty(), || "empty count buffer".into())?;
    let (per_thread, blocks) = partial_plan(n, k);
    let m = blocks * k;
    check(OP, m <= MERGE_MAX, || {
        format!("{n} logits are too many for k = {k} ({blocks} partial blocks)")
    })?;
    let n32 = i32_arg(OP, "n", n)?;
    let k32 = i32_arg(OP, "k", k)?;
    let m32 = i32_arg(OP, "blocks * k", m)?;
    // SAFETY: the partial kernel writes all `k` entries of each of its `blocks` blocks (the
    // selected composites, then zeros) before the merge kernel, later on the stream, reads them.
    let mut partial = unsafe { dev.uninit::<u64>(m) }?;

    let f = dev.function("sample", &format!("topk_partial_f32_e{per_thread}"))?;
    let mut l = Launch::new(dev, &f);
    l.arg(x).arg(n32).arg(k32).arg(&mut partial);
    // SAFETY: block b reads x[i] for i < n only and writes partial[b * k .. (b + 1) * k], inside
    // the `blocks * k` allocated; 32 KiB of static shared memory, under the 48 KiB default.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (TOPK_THREADS, 1, 1),
            shared_mem_bytes: 0,
        })
    }?;

    let f = dev.function("sample", &format!("topk_merge_e{}", merge_plan(m)))?;
    let mut l = Launch::new(dev, &f);
    l.arg(&partial)
        .arg(m32)
        .arg(k32)
        .arg(out_ids)
        .arg(out_vals)
        .arg(out_count);
    // SAFETY: one block reads partial[..m] (merge_plan(m) * 1024 >= m per-thread slots, the
    // rest zero) and writes ids and values at ranks < k (both hold >= k) and count[0].
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (TOPK_THREADS, 1, 1),
            shared_mem_bytes: 0,
        })
    }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_fit_the_instantiated_kernels() {
        for k in [1, 2, 40, 255, 256] {
            for n in [
                1,
                1000,
                1024,
                1025,
                4096,
                4097,
                8192,
                151_936,
                262_144,
                1 << 20,
            ] {
                let (e, blocks) = partial_plan(n, k);
                assert!([1, 4, 8, 16].contains(&e));
                assert!(blocks * e * TOPK_THREADS as usize >= n, "n {n} k {k}");
                if e < 8 {
                    assert_eq!(blocks, 1);
                }
                let m = blocks * k;
                if m <= MERGE_MAX {
                    assert!(merge_plan(m) * TOPK_THREADS as usize >= m);
                } else {
                    assert!(n > 1 << 19, "n {n} k {k} refused");
                }
            }
        }
        assert_eq!(partial_plan(151_936, 40), (8, 19));
        assert_eq!(merge_plan(19 * 40), 1);
        assert_eq!(partial_plan(1 << 20, 256), (16, 64));
    }
}
