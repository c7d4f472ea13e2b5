//! synaptix-sample: choosing the next token from logits.
//!
//! The chain follows llama.cpp's default order: repetition penalties over the last
//! `penalty_last_n` tokens, top-k, top-p, min-p, temperature, then a seeded draw. A temperature
//! of 0 (or below) is greedy: the arg-max after penalties, ties to the lowest id.

mod rng;

pub use rng::SplitMix64;

use std::collections::VecDeque;

/// Sampling settings. `Default` is greedy with no penalties.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    /// 0 or below: greedy.
    pub temperature: f32,
    /// 0: disabled.
    pub top_k: usize,
    /// 1.0: disabled.
    pub top_p: f32,
    /// 0.0: disabled.
    pub min_p: f32,
    /// 1.0: disabled. Positive logits are divided by it, negative ones multiplied.
    pub repeat_penalty: f32,
    /// Subtracted once from the logit of every token seen in the window.
    pub presence_penalty: f32,
    /// Subtracted per occurrence in the window.
    pub frequency_penalty: f32,
    /// Window of recent tokens the penalties look at (0: none).
    pub penalty_last_n: usize,
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            seed: 0,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SampleError {
    #[error("invalid sampler setting: {0}")]
    InvalidConfig(String),
    #[error("cannot sample from empty logits")]
    EmptyLogits,
}

impl SamplerConfig {
    pub fn validate(&self) -> Result<(), SampleError> {
        let bad = |m: &str| Err(SampleError::InvalidConfig(m.to_string()));
        if !self.temperature.is_finite() {
            return bad("temperature must be a finite number");
        }
        if !(0.0..=1.0).contains(&self.top_p) || self.top_p.is_nan() {
            return bad("top-p must be in [0, 1]");
        }
        if !(0.0..=1.0).contains(&self.min_p) || self.min_p.is_nan() {
            return bad("min-p must be in [0, 1]");
        }
        if !(self.repeat_penalty > 0.0 && self.repeat_penalty.is_finite()) {
            return bad("repeat penalty must be a positive number");
        }
        if !self.presence_penalty.is_finite() || !self.frequency_penalty.is_finite() {
            return bad("presence and frequency penalties must be finite");
        }
        Ok(())
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    /// True when a repetition, presence or frequency penalty changes the logits.
    pub fn has_penalties(&self) -> bool {
        self.penalty_last_n > 0
            && (self.repeat_penalty != 1.0
                || self.presence_penalty != 0.0
                || self.frequency_penalty != 0.0)
    }
}

/// A stateful sampler: remembers recent tokens for penalties and owns its random stream.
#[derive(Debug, Clone)]
pub struct Sampler {
    config: SamplerConfig,
    rng: SplitMix64,
    recent: VecDeque<u32>,
}

impl Sampler {
    pub fn new(config: SamplerConfig) -> Result<Sampler, SampleError> {
        config.validate()?;
        Ok(Sampler {
            rng: SplitMix64::new(config.seed),
            config,
            recent: VecDeque::new(),
        })
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.config
    }

    /// Records a token (prompt or generated) for the penalty window.
    pub fn accept(&mut self, token: u32) {
        if self.config.penalty_last_n == 0 {
            return;
        }
        if self.recent.len() == self.config.penalty_last_n {
            self.recent.pop_front();
        }
        self.recent.push_back(token);
    }

    pub fn reset(&mut self) {
        self.recent.clear();
        self.rng = SplitMix64::new(self.config.seed);
    }

    /// Picks the next token. `logits` is modified (penalties applied).
    pub fn sample(&mut self, logits: &mut [f32]) -> Result<u32, SampleError> {
        if logits.is_empty() {
            return Err(SampleError::EmptyLogits);
        }
        self.apply_penalties(logits);
        if self.config.is_greedy() {
            return Ok(argmax(logits));
        }
        let mut cands: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .filter(|(_, l)| !l.is_nan())
            .map(|(i, &l)| (i as u32, l))
            .collect();
        // Highest logit first, ties to the lowest id, so every filter below is deterministic.
        cands.sort_unstable_by(candidate_order);
        if self.config.top_k > 0 {
            cands.truncate(self.config.top_k);
        }
        self.pick(cands)
    }

    /// The draw after penalties and top-k: top-p, min-p, temperature, then the seeded draw.
    /// `cands` must be in [`candidate_order`], already cut to `top_k` (a device may have
    /// chosen them: the draw is then the same as [`Sampler::sample`]'s).
    pub fn pick(&mut self, mut cands: Vec<(u32, f32)>) -> Result<u32, SampleError> {
        if cands.is_empty() {
            return Err(SampleError::EmptyLogits);
        }
        if self.config.top_p < 1.0 {
            let probs = softmax(&cands, 1.0);
            let mut cum = 0.0;
            let mut keep = cands.len();
            for (i, p) in probs.iter().enumerate() {
                cum += p;
                if cum >= self.config.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            cands.truncate(keep.max(1));
        }
        if self.config.min_p > 0.0 {
            // p_i >= min_p * p_max  <=>  l_i >= l_max + ln(min_p)
            let threshold = cands[0].1 + self.config.min_p.ln();
            let keep = cands.iter().take_while(|c| c.1 >= threshold).count();
            cands.truncate(keep.max(1));
        }
        let probs = softmax(&cands, self.config.temperature);
        let r = self.rng.next_f64();
        let mut cum = 0.0;
        for (c, p) in cands.iter().zip(&probs) {
            cum += p;
            if r < cum {
                return Ok(c.0);
            }
        }
        Ok(cands[cands.len() - 1].0)
    }

    /// The distinct tokens of the penalty window with their counts, by token id: what a
    /// device needs to apply the penalties itself.
    pub fn penalty_counts(&self) -> Vec<(u32, u32)> {
        let mut counts: Vec<(u32, u32)> = Vec::new();
        let mut sorted: Vec<u32> = self.recent.iter().copied().collect();
        sorted.sort_unstable();
        for t in sorted {
            match counts.last_mut() {
                Some((last, n)) if *last == t => *n += 1,
                _ => counts.push((t, 1)),
            }
        }
        counts
    }

    fn apply_penalties(&self, logits: &mut [f32]) {
        if let Some(p) = self.penalties() {
            apply_penalties(logits, &p);
        }
    }

    /// The penalties of the next draw (`None` when the settings change nothing).
    pub fn penalties(&self) -> Option<Penalties> {
        let c = &self.config;
        c.has_penalties().then(|| Penalties {
            counts: self.penalty_counts(),
            repeat: c.repeat_penalty,
            frequency: c.frequency_penalty,
            presence: c.presence_penalty,
        })
    }

    /// What a device can do of the next draw, so that only a few candidates cross to the host
    /// (`None`: the whole distribution is needed): greedy (with penalties), or top-k up to
    /// [`MAX_DEVICE_TOP_K`] followed by [`Sampler::pick`] on the host.
    pub fn device_pick(&self) -> Option<DevicePick> {
        let c = &self.config;
        let top_k = if c.is_greedy() {
            0
        } else if (1..=MAX_DEVICE_TOP_K).contains(&c.top_k) {
            c.top_k
        } else {
            return None;
        };
        Some(DevicePick {
            top_k,
            penalties: self.penalties(),
        })
    }
}

/// Repetition, frequency and presence penalties over a window of recent tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct Penalties {
    /// Distinct tokens of the window and how often each occurs.
    pub counts: Vec<(u32, u32)>,
    /// Positive logits are divided by it, negative ones multiplied.
    pub repeat: f32,
    /// Subtracted per occurrence.
    pub frequency: f32,
    /// Subtracted once.
    pub presence: f32,
}

/// Applies `p` to the logits of its tokens (ids past the end are ignored).
pub fn apply_penalties(logits: &mut [f32], p: &Penalties) {
    for &(t, n) in &p.counts {
        let Some(l) = logits.get_mut(t as usize) else {
            continue;
        };
        if *l <= 0.0 {
            *l *= p.repeat;
        } else {
            *l /= p.repeat;
        }
        *l -= n as f32 * p.frequency + p.presence;
    }
}

/// Largest top-k a device is asked for.
pub const MAX_DEVICE_TOP_K: usize = 256;

/// The part of a draw a device does on the logits: penalties, then the arg-max (`top_k` 0)
/// or the `top_k` best candidates in [`candidate_order`].
#[derive(Debug, Clone, PartialEq)]
pub struct DevicePick {
    pub top_k: usize,
    pub penalties: Option<Penalties>,
}

impl DevicePick {
    /// Greedy, no penalties.
    pub const GREEDY: DevicePick = DevicePick {
        top_k: 0,
        penalties: None,
    };

    /// The pick on host logits (what a device computes): `[(arg-max, its logit)]` for greedy,
    /// else the `top_k` best non-NaN candidates in [`candidate_order`].
    pub fn on_host(&self, logits: &mut [f32]) -> Vec<(u32, f32)> {
        if let Some(p) = &self.penalties {
            apply_penalties(logits, p);
        }
        if self.top_k == 0 {
            let i = argmax(logits);
            return logits
                .get(i as usize)
                .map(|&v| vec![(i, v)])
                .unwrap_or_default();
        }
        let mut cands: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .filter(|(_, l)| !l.is_nan())
            .map(|(i, &l)| (i as u32, l))
            .collect();
        cands.sort_unstable_by(candidate_order);
        cands.truncate(self.top_k);
        cands
    }
}

/// The order of sampling candidates `(id, logit)`: highest logit first (`total_cmp`), ties to
/// the lowest id.
pub fn candidate_order(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// Index of the largest logit; the lowest index wins ties; NaNs are never chosen unless all are.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    best as u32
}

fn softmax(cands: &[(u32, f32)], temperature: f32) -> Vec<f64> {
    let max = cands[0].1 as f64;
    let t = temperature as f64;
    let e: Vec<f64> = cands
        .iter()
        .map(|c| ((c.1 as f64 - max) / t).exp())
        .collect();
    let z: f64 = e.iter().sum();
    e.into_iter().map(|v| v / z).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits() -> Vec<f32> {
        vec![1.0, 3.0, 2.5, -1.0, 3.0, 0.0]
    }

    #[test]
    fn greedy_is_argmax_with_lowest_id_on_ties() {
        let mut s = Sampler::new(SamplerConfig::default()).unwrap();
        assert_eq!(s.sample(&mut logits()).unwrap(), 1);
    }

    #[test]
    fn repeat_penalty_moves_greedy_choice() {
        let mut s = Sampler::new(SamplerConfig {
            repeat_penalty: 2.0,
            ..Default::default()
        })
        .unwrap();
        s.accept(1);
        s.accept(4);
        // 3.0 / 2 = 1.5 for ids 1 and 4: id 2 (2.5) wins.
        assert_eq!(s.sample(&mut logits()).unwrap(), 2);
        // A negative logit is multiplied, pushing it further down.
        let mut l = vec![-1.0, -2.0];
        let mut s = Sampler::new(SamplerConfig {
            repeat_penalty: 3.0,
            ..Default::default()
        })
        .unwrap();
        s.accept(0);
        assert_eq!(s.sample(&mut l).unwrap(), 1);
        assert_eq!(l[0], -3.0);
    }

    #[test]
    fn frequency_and_presence_penalties() {
        let cfg = SamplerConfig {
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            ..Default::default()
        };
        let mut s = Sampler::new(cfg).unwrap();
        for t in [1, 1, 2] {
            s.accept(t);
        }
        let mut l = logits();
        s.sample(&mut l).unwrap();
        assert_eq!(l[1], 3.0 - 0.5 - 0.5);
        assert_eq!(l[2], 2.5 - 0.25 - 0.5);
        assert_eq!(l[4], 3.0);
    }

    #[test]
    fn penalty_window_forgets_old_tokens() {
        let cfg = SamplerConfig {
            repeat_penalty: 10.0,
            penalty_last_n: 2,
            ..Default::default()
        };
        let mut s = Sampler::new(cfg).unwrap();
        for t in [1, 5, 5] {
            s.accept(t);
        }
        let mut l = logits();
        s.sample(&mut l).unwrap();
        assert_eq!(l[1], 3.0, "token 1 left the window");
        assert_eq!(l[5], 0.0);
    }

    #[test]
    fn top_k_one_is_greedy_and_seeds_reproduce() {
        let cfg = SamplerConfig {
            temperature: 1.0,
            top_k: 1,
            seed: 9,
            ..Default::default()
        };
        let mut s = Sampler::new(cfg).unwrap();
        for _ in 0..20 {
            assert_eq!(s.sample(&mut logits()).unwrap(), 1);
        }
        let cfg = SamplerConfig {
            temperature: 1.5,
            seed: 42,
            ..Default::default()
        };
        let draw = |cfg: &SamplerConfig| {
            let mut s = Sampler::new(cfg.clone()).unwrap();
            (0..50)
                .map(|_| s.sample(&mut logits()).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(&cfg), draw(&cfg));
        let other = draw(&SamplerConfig {
            seed: 43,
            ..cfg.clone()
        });
        assert_ne!(draw(&cfg), other);
    }

    #[test]
    fn top_p_and_min_p_restrict_support() {
        // Probabilities at T=1: ids 1 and 4 dominate; top-p 0.5 keeps only id 1 (ties to lowest).
        let cfg = SamplerConfig {
            temperature: 1.0,
            top_p: 0.3,
            seed: 1,
            ..Default::default()
        };
        let mut s = Sampler::new(cfg).unwrap();
        for _ in 0..50 {
            assert_eq!(s.sample(&mut logits()).unwrap(), 1);
        }
        // min-p 0.5: keeps logits >= 3 + ln 0.5 = 2.31: ids 1, 4, 2.
        let cfg = SamplerConfig {
            temperature: 1.0,
            min_p: 0.5,
            seed: 3,
            ..Default::default()
        };
        let mut s = Sampler::new(cfg).unwrap();
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..300 {
            seen.insert(s.sample(&mut logits()).unwrap());
        }
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![1, 2, 4]);
    }

    #[test]
    fn sampling_follows_the_distribution() {
        let cfg = SamplerConfig {
            temperature: 1.0,
            seed: 7,
            ..Default::default()
        };
        let mut s = Sampler::new(cfg).unwrap();
        let base = [0.0f32, (3.0f32).ln()]; // p = 0.25, 0.75
        let n = 20000;
        let ones = (0..n)
            .filter(|_| s.sample(&mut base.to_vec()).unwrap() == 1)
            .count();
        let frac = ones as f64 / n as f64;
        assert!((frac - 0.75).abs() < 0.02, "{frac}");
    }

    #[test]
    fn invalid_settings_are_rejected() {
        assert!(Sampler::new(SamplerConfig {
            top_p: 1.5,
            ..Default::default()
        })
        .is_err());
        assert!(Sampler::new(SamplerConfig {
            repeat_penalty: 0.0,
            ..Default::default()
        })
        .is_err());
        assert!(Sampler::new(SamplerConfig {
            temperature: f32::NAN,
            ..Default::default()
        })
        .is_err());
        let mut s = Sampler::new(SamplerConfig::default()).unwrap();
        assert_eq!(s.sample(&mut []), Err(SampleError::EmptyLogits));
    }

    /// The split draw (a device's `DevicePick`, then `pick` on the host) chooses exactly what
    /// `sample` chooses, for greedy and top-k settings with and without penalties.
    #[test]
    fn device_pick_then_pick_equals_sample() {
        let configs = [
            SamplerConfig::default(),
            SamplerConfig {
                repeat_penalty: 1.3,
                frequency_penalty: 0.2,
                presence_penalty: 0.1,
                ..Default::default()
            },
            SamplerConfig {
                temperature: 0.8,
                top_k: 40,
                top_p: 0.9,
                min_p: 0.05,
                seed: 7,
                ..Default::default()
            },
            SamplerConfig {
                temperature: 1.1,
                top_k: 5,
                repeat_penalty: 1.5,
                presence_penalty: 0.5,
                seed: 3,
                ..Default::default()
            },
        ];
        for config in configs {
            let (mut whole, mut split) = (
                Sampler::new(config.clone()).unwrap(),
                Sampler::new(config.clone()).unwrap(),
            );
            let mut state = 12345u64;
            for step in 0..50 {
                let logits: Vec<f32> = (0..300)
                    .map(|_| {
                        state = state
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        ((state >> 40) % 64) as f32 / 8.0 - 4.0
                    })
                    .collect();
                let a = whole.sample(&mut logits.clone()).unwrap();
                let pick = split
                    .device_pick()
                    .expect("greedy and small top-k run on a device");
                let cands = pick.on_host(&mut logits.clone());
                let b = if config.is_greedy() {
                    cands[0].0
                } else {
                    split.pick(cands).unwrap()
                };
                assert_eq!(a, b, "{config:?} step {step}");
                whole.accept(a);
                split.accept(b);
            }
        }
    }
}
