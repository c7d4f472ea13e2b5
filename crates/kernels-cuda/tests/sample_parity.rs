//! The GPU sampling kernels (`synaptix_kernels_cuda::sample`) against the CPU sampler's
//! arithmetic and candidate order, bit for bit: penalties against a replica of
//! `synaptix-sample`'s `apply_penalties`, top-k against the CPU's filter / sort / truncate on
//! logits full of exact ties, NaN, infinities and signed zeros. Outputs are poisoned before
//! each launch so that an unwritten element fails. Skips with a visible message where no GPU is
//! present; the seed is printed.

use std::collections::HashMap;

use synaptix_kernels_cuda::sample::{self, MAX_TOP_K};
use synaptix_kernels_cuda::{CudaDevice, DeviceBuffer};

mod common;
use common::*;

/// The CPU sampler's candidates: NaN filtered, highest logit first (`total_cmp`), ties to the
/// lowest id, truncated to k (crates/sample/src/lib.rs `Sampler::sample`).
fn cpu_top_k(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut cands: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .filter(|(_, l)| !l.is_nan())
        .map(|(i, &l)| (i as u32, l))
        .collect();
    cands.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    cands.truncate(k);
    cands
}

/// Logit patterns, each hard in its own way for a top-k.
#[derive(Debug, Clone, Copy)]
enum Pattern {
    /// Values on a coarse grid (hundreds of exact ties at every value), with NaN of both signs,
    /// -inf, +inf, -0.0 and +0.0 sprinkled in.
    CoarseGrid,
    /// Only values <= 0, with many -0.0 and +0.0: the top is all zeros, +0.0 before -0.0.
    NonPositive,
    /// Value = id % 1024: the large values gather in the same threads of every block (the
    /// kernels' slow paths: many candidates).
    Periodic,
    /// One value everywhere: the top k are the k lowest ids.
    AllEqual,
    /// Almost all NaN: fewer than k candidates (-inf among them).
    MostlyNan,
    /// Distinct values alternating sign, rising in magnitude with the id.
    Ramp,
}

const PATTERNS: [Pattern; 6] = [
    Pattern::CoarseGrid,
    Pattern::NonPositive,
    Pattern::Periodic,
    Pattern::AllEqual,
    Pattern::MostlyNan,
    Pattern::Ramp,
];

fn logits(rng: &mut Rng, pattern: Pattern, n: usize) -> Vec<f32> {
    let grid = |rng: &mut Rng| (rng.below(33) as f32 - 16.0) * 0.5;
    (0..n)
        .map(|i| match pattern {
            Pattern::CoarseGrid => match rng.below(200) {
                0..=3 => f32::NAN,
                4 => -f32::NAN,
                5 => f32::from_bits(0x7f80_0001), // a signalling NaN payload
                6..=8 => f32::NEG_INFINITY,
                9..=14 => 0.0,
                15..=20 => -0.0,
                21 if rng.below(500) == 0 => f32::INFINITY,
                _ => grid(rng),
            },
            Pattern::NonPositive => match rng.below(4) {
                0 => 0.0,
                1 => -0.0,
                _ => -(rng.below(16) as f32) * 0.25,
            },
            Pattern::Periodic => (i % 1024) as f32,
            Pattern::AllEqual => 1.5,
            Pattern::MostlyNan => match rng.below(1000) {
                0 => grid(rng),
                1 => f32::NEG_INFINITY,
                _ => f32::NAN,
            },
            Pattern::Ramp => {
                if i % 2 == 0 {
                    i as f32
                } else {
                    -(i as f32)
                }
            }
        })
        .collect()
}

/// Runs the GPU top-k on `x` and checks it against [`cpu_top_k`] bit for bit.
fn check_top_k(dev: &CudaDevice, x: &[f32], dx: &DeviceBuffer<f32>, k: usize, what: &str) {
    let mut ids = dev.upload(&vec![-1i32; k]).unwrap();
    let mut vals = dev.upload(&vec![f32::NAN; k]).unwrap();
    let mut count = dev.upload(&[-1i32]).unwrap();
    sample::top_k(dev, dx, k, &mut ids, &mut vals, &mut count).unwrap();
    let want = cpu_top_k(x, k);
    let count = dev.download(&count).unwrap()[0];
    let ids = dev.download(&ids).unwrap();
    let vals = dev.download(&vals).unwrap();
    assert_eq!(count as usize, want.len(), "{what}: count");
    for (r, &(id, v)) in want.iter().enumerate() {
        assert!(
            ids[r] == id as i32 && vals[r].to_bits() == v.to_bits(),
            "{what}: rank {r}: gpu ({}, {:?} = {:#010x}), cpu ({id}, {v:?} = {:#010x}); \
             first ranks gpu {:?} cpu {:?}",
            ids[r],
            vals[r],
            vals[r].to_bits(),
            v.to_bits(),
            &ids[..(r + 3).min(ids.len())],
            want.iter().take(r + 3).map(|c| c.0).collect::<Vec<_>>(),
        );
    }
    // The GPU writes nothing past the count.
    for r in want.len()..k {
        assert!(ids[r] == -1 && vals[r].is_nan(), "{what}: rank {r} written");
    }
}

#[test]
fn top_k_matches_cpu_order_bit_for_bit() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    for n in [1000, 151_936] {
        for pattern in PATTERNS {
            let x = logits(&mut rng, pattern, n);
            let dx = dev.upload(&x).unwrap();
            for k in [1, 2, 40, MAX_TOP_K] {
                check_top_k(&dev, &x, &dx, k, &format!("n {n} {pattern:?} k {k}"));
            }
        }
    }
}

#[test]
fn top_k_odd_sizes_and_few_candidates() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    // Sizes around the kernels' block boundaries (1024 and 8192 logits per block), a Llama-3
    // and a Gemma-3 vocabulary.
    for n in [1, 3, 255, 1024, 1025, 4097, 8192, 8193, 128_256, 262_144] {
        let mut x: Vec<f32> = (0..n).map(|_| (rng.uniform() * 6.0).round()).collect();
        if n > 10 {
            x[n / 2] = f32::NAN;
            x[n - 1] = 100.0;
        }
        let dx = dev.upload(&x).unwrap();
        for k in [1, 7, 40, 200, MAX_TOP_K] {
            check_top_k(&dev, &x, &dx, k, &format!("n {n} k {k}"));
        }
    }
    // All NaN: nothing written, count 0.
    let x = vec![f32::NAN; 5000];
    check_top_k(&dev, &x, &dev.upload(&x).unwrap(), 40, "all NaN");
}

#[test]
fn top_k_is_deterministic_on_replay() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    let x = logits(&mut rng, Pattern::CoarseGrid, 151_936);
    let dx = dev.upload(&x).unwrap();
    let mut ids = dev.zeros::<i32>(40).unwrap();
    let mut vals = dev.zeros::<f32>(40).unwrap();
    let mut count = dev.zeros::<i32>(1).unwrap();
    let mut first = None;
    for _ in 0..20 {
        sample::top_k(&dev, &dx, 40, &mut ids, &mut vals, &mut count).unwrap();
        let got = (
            dev.download(&ids).unwrap(),
            dev.download(&vals)
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>(),
        );
        assert_eq!(first.get_or_insert_with(|| got.clone()), &got);
    }
}

/// The CPU sampler's penalty arithmetic (crates/sample/src/lib.rs `apply_penalties`), over the
/// window's distinct tokens and their counts.
fn cpu_penalties(
    logits: &mut [f32],
    counts: &HashMap<u32, u32>,
    repeat: f32,
    frequency: f32,
    presence: f32,
) {
    for (&t, &n) in counts {
        let Some(l) = logits.get_mut(t as usize) else {
            continue;
        };
        if *l <= 0.0 {
            *l *= repeat;
        } else {
            *l /= repeat;
        }
        *l -= n as f32 * frequency + presence;
    }
}

/// (id, count) pairs of a window, flattened, in the map's order.
fn pairs_of(counts: &HashMap<u32, u32>) -> Vec<i32> {
    counts
        .iter()
        .flat_map(|(&t, &n)| [t as i32, n as i32])
        .collect()
}

#[test]
fn penalties_match_cpu_bit_for_bit() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    let n = 151_936;
    for (repeat, frequency, presence) in [
        (1.3f32, 0.37f32, 0.11f32),
        (1.1, 0.0, 0.0),
        (1.0, 0.05, 0.6),
        (1.0, 0.0, 0.0),
        (0.7, -0.3, 1.7),
    ] {
        let mut x: Vec<f32> = (0..n)
            .map(|i| match i % 97 {
                0 => 0.0,
                1 => -0.0,
                2 => f32::NAN,
                3 => f32::NEG_INFINITY,
                _ => rng.uniform() * 20.0,
            })
            .collect();
        // A 256-token window: repeats (a small id range), zero / NaN / -inf logits among the
        // penalised ones (ids 0 .. 4 of the pattern above), and ids past the vocabulary.
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for j in 0..256u32 {
            let t = match j % 16 {
                0 => n as u32 + j,
                1 => (j % 5) * 97 + (j % 4),
                2..=9 => rng.below(300) as u32,
                _ => rng.below(n as u64) as u32,
            };
            *counts.entry(t).or_default() += 1;
        }
        let pairs = pairs_of(&counts);
        // Room for 512 pairs, of which `counts.len()` are live.
        let mut padded = pairs.clone();
        padded.resize(1024, 7);
        let dpairs = dev.upload(&padded).unwrap();
        let dcount = dev.upload(&[counts.len() as i32]).unwrap();
        let mut dx = dev.upload(&x).unwrap();
        sample::apply_penalties(&dev, &mut dx, &dpairs, &dcount, repeat, frequency, presence)
            .unwrap();
        cpu_penalties(&mut x, &counts, repeat, frequency, presence);
        let got = dev.download(&dx).unwrap();
        for (i, (g, w)) in got.iter().zip(&x).enumerate() {
            // NaN stays NaN (the GPU's NaN results carry the canonical payload, not the CPU's).
            assert!(
                g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                "id {i} (repeat {repeat}, frequency {frequency}, presence {presence}): \
                 gpu {g:?} cpu {w:?}"
            );
        }
    }
}

#[test]
fn penalties_read_the_live_count_on_the_device() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    let n = 5000;
    let x: Vec<f32> = (0..n).map(|_| rng.uniform() * 5.0).collect();
    let mut dx = dev.upload(&x).unwrap();
    // Capacity 64 pairs, refilled in place between launches as before the replay of a
    // recorded graph; only the first `live` (clamped to the capacity) may be applied.
    let dpairs = dev.upload(&[0i32; 128]).unwrap();
    let dcount = dev.upload(&[0i32]).unwrap();
    let mut want = x.clone();
    for (round, live) in [(0u32, 10usize), (1, 64), (2, 0), (3, 1000)] {
        let list: Vec<(u32, u32)> = (0..64u32).map(|j| (j * 71 + round, 1 + j % 3)).collect();
        let flat: Vec<i32> = list
            .iter()
            .flat_map(|&(t, c)| [t as i32, c as i32])
            .collect();
        dev.overwrite(&dpairs, &flat).unwrap();
        dev.overwrite(&dcount, &[live as i32]).unwrap();
        sample::apply_penalties(&dev, &mut dx, &dpairs, &dcount, 1.25, 0.5, 0.25).unwrap();
        let applied: HashMap<u32, u32> = list.iter().copied().take(live).collect();
        cpu_penalties(&mut want, &applied, 1.25, 0.5, 0.25);
        let got = dev.download(&dx).unwrap();
        assert!(
            got.iter()
                .zip(&want)
                .all(|(g, w)| g.to_bits() == w.to_bits()),
            "round {round}, {live} live pairs"
        );
    }
}

#[test]
fn bad_arguments_are_errors_not_launches() {
    let Some((dev, _)) = device() else { return };
    let dx = dev.upload(&vec![1f32; 1000]).unwrap();
    let mut ids = dev.upload(&vec![-1i32; 300]).unwrap();
    let mut vals = dev.upload(&vec![f32::NAN; 300]).unwrap();
    let mut count = dev.upload(&[-1i32]).unwrap();
    for k in [0, MAX_TOP_K + 1, 300] {
        assert!(
            sample::top_k(&dev, &dx, k, &mut ids, &mut vals, &mut count).is_err(),
            "k = {k}"
        );
    }
    let mut short_ids = dev.upload(&[0i32; 39]).unwrap();
    let mut short_vals = dev.upload(&[0f32; 39]).unwrap();
    assert!(sample::top_k(&dev, &dx, 40, &mut short_ids, &mut vals, &mut count).is_err());
    assert!(sample::top_k(&dev, &dx, 40, &mut ids, &mut short_vals, &mut count).is_err());
    // Too many logits for one merge block at k = 256 (more than 16384 * 64).
    let huge = dev.zeros::<f32>(16_384 * 64 + 1).unwrap();
    assert!(sample::top_k(&dev, &huge, MAX_TOP_K, &mut ids, &mut vals, &mut count).is_err());
    // Nothing was launched: the outputs are untouched.
    assert_eq!(dev.download(&count).unwrap(), vec![-1]);
    assert!(dev.download(&vals).unwrap().iter().all(|v| v.is_nan()));

    let mut dx = dev.upload(&[1f32; 10]).unwrap();
    let odd_pairs = dev.upload(&[1i32, 2, 3]).unwrap();
    let dcount = dev.upload(&[1i32]).unwrap();
    assert!(sample::apply_penalties(&dev, &mut dx, &odd_pairs, &dcount, 1.1, 0.0, 0.0).is_err());
}
