//! Decode steps recorded once as CUDA graphs and replayed.
//!
//! A single-token decode step launches the same kernels with the same arguments at every
//! position (on each side of the one-pass attention limit, which decides whether the attention
//! scores kernel runs at all: recordings are kept per side), as long as what changes (the token
//! id, the position, the RoPE angles of the position) lives in fixed device buffers the kernels
//! read. Per cache, the first step runs eagerly and notes which RoPE configurations the model
//! uses; the second allocates the fixed input buffers, fills them and records the step into a
//! graph (intermediate activations become allocations owned by the graph); every later step
//! rewrites the inputs and replays the graph: one launch instead of hundreds, and no host work
//! between kernels. A step that cannot be recorded runs eagerly from then on.

use std::sync::{Arc, Mutex, MutexGuard};

use synaptix_kernels_cuda::{ops, CudaDevice, DeviceBuffer, StepGraph};

use synaptix_sample::DevicePick;

use crate::backend::DecodeStep;
use crate::{NnError, Result, Rope};

/// Most distinct penalty-window tokens a recorded step takes (more: the step runs eagerly).
pub(crate) const MAX_PENALTY_TOKENS: usize = 1024;

/// What a recorded step hands back: `[top_k]` ids and values (`[1]` id for greedy) and how
/// many there are.
pub(crate) struct PickBuffers {
    pub ids: DeviceBuffer<i32>,
    pub vals: DeviceBuffer<f32>,
    pub count: DeviceBuffer<i32>,
}

/// Fixed device buffers a recorded step reads its inputs from and writes its pick to.
pub(crate) struct StepInputs {
    /// `[1]`: the token.
    pub ids: DeviceBuffer<i32>,
    /// `[1]`: its position.
    pub pos: Arc<DeviceBuffer<i32>>,
    /// Per RoPE configuration, the position's `(cos, sin)` table `[n_rot / 2, 2]`.
    pub ropes: Vec<(Rope, Arc<DeviceBuffer<f32>>)>,
    /// `[MAX_PENALTY_TOKENS, 2]` (token, occurrences) pairs of the penalty window, and `[1]`
    /// how many are live.
    pub penalty_pairs: DeviceBuffer<i32>,
    pub penalty_count: DeviceBuffer<i32>,
    /// The pick.
    pub out: Mutex<PickBuffers>,
    /// The pick settings the recording was made with.
    pub pick: DevicePick,
}

impl StepInputs {
    fn new(dev: &CudaDevice, ropes: &[Rope], pick: &DevicePick) -> Result<StepInputs> {
        let k = pick.top_k.max(1);
        Ok(StepInputs {
            ids: dev.zeros(1)?,
            pos: Arc::new(dev.zeros(1)?),
            ropes: ropes
                .iter()
                .map(|r| Ok((r.clone(), Arc::new(dev.zeros(r.n_rot.max(2))?))))
                .collect::<Result<_>>()?,
            penalty_pairs: dev.zeros(2 * MAX_PENALTY_TOKENS)?,
            penalty_count: dev.zeros(1)?,
            out: Mutex::new(PickBuffers {
                ids: dev.zeros(k)?,
                vals: dev.zeros(k)?,
                count: dev.zeros(1)?,
            }),
            pick: pick.clone(),
        })
    }

    /// What the last run of the step picked (greedy: the id, its value unknown: NaN).
    fn picked(&self, dev: &CudaDevice) -> Result<Vec<(u32, f32)>> {
        let out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        read_pick(dev, &out, self.pick.top_k)
    }

    /// Writes the token, position and RoPE tables of `key`, and the penalty window of `pick`.
    fn write_step(&self, dev: &CudaDevice, key: DecodeStep, pick: &DevicePick) -> Result<()> {
        let position = i32::try_from(key.position).map_err(|_| {
            NnError::Kernel(synaptix_core::Error::ShapeMismatch {
                op: "decode step",
                detail: format!("position {}", key.position),
            })
        })?;
        dev.overwrite(&self.ids, &[key.token as i32])?;
        dev.overwrite(&self.pos, &[position])?;
        for (rope, table) in &self.ropes {
            dev.overwrite(table, &rope_table(rope, &[key.position]))?;
        }
        if let Some(p) = &pick.penalties {
            if !p.counts.is_empty() {
                dev.overwrite(&self.penalty_pairs, &penalty_pairs(&p.counts))?;
            }
            dev.overwrite(&self.penalty_count, &[p.counts.len() as i32])?;
        }
        Ok(())
    }
}

/// What a pick wrote to `out`: `[(id, NaN)]` for greedy (`top_k` 0), else the candidates.
pub(crate) fn read_pick(
    dev: &CudaDevice,
    out: &PickBuffers,
    top_k: usize,
) -> Result<Vec<(u32, f32)>> {
    if top_k == 0 {
        let id = dev.download(&out.ids)?[0] as u32;
        return Ok(vec![(id, f32::NAN)]);
    }
    let n = (dev.download(&out.count)?[0].max(0) as usize).min(top_k);
    let (ids, vals) = (dev.download(&out.ids)?, dev.download(&out.vals)?);
    Ok(ids[..n]
        .iter()
        .zip(&vals[..n])
        .map(|(&i, &v)| (i as u32, v))
        .collect())
}

/// `(token, occurrences)` pairs flattened for the penalty kernel.
pub(crate) fn penalty_pairs(counts: &[(u32, u32)]) -> Vec<i32> {
    counts
        .iter()
        .flat_map(|&(t, n)| [t.min(i32::MAX as u32) as i32, n.min(i32::MAX as u32) as i32])
        .collect()
}

/// The `(cos, sin)` pairs of `rope` at each of `positions`, `[positions, n_rot / 2, 2]`, from
/// the CPU code so that both backends rotate by identical values.
pub(crate) fn rope_table(rope: &Rope, positions: &[usize]) -> Vec<f32> {
    let half = rope.n_rot / 2;
    let (mut cos, mut sin) = (vec![0f32; half], vec![0f32; half]);
    let mut table = Vec::with_capacity(positions.len() * half * 2);
    for &p in positions {
        rope.angles(p, &mut cos, &mut sin);
        for (c, s) in cos.iter().zip(&sin) {
            table.push(*c);
            table.push(*s);
        }
    }
    table
}

/// What the backend's ops do while a step runs.
#[derive(Default)]
pub(crate) enum Mode {
    /// Ordinary eager work.
    #[default]
    Eager,
    /// Eager, noting the RoPE configurations the step uses.
    Survey(Vec<Rope>),
    /// Being recorded: inputs come from these fixed buffers, the token goes to `out`.
    Record(Arc<StepInputs>),
}

enum Phase {
    /// Ran once eagerly; uses these RoPE configurations.
    Surveyed(Vec<Rope>),
    Recorded {
        graph: StepGraph,
        inputs: Arc<StepInputs>,
    },
    /// Could not be recorded: always eager.
    Eager,
}

/// Recorded steps (per cache and pick settings), most recent last; older ones are dropped.
const MAX_RECORDED: usize = 4;

/// What a recording is specific to: the cache (its buffers), the pick settings baked into the
/// launches (top-k, penalty factors; the window's counts are inputs), and whether attention
/// takes the one-pass decode kernel alone (positions below
/// `ops::attention_one_pass_max`, where the scores launch is left out).
#[derive(Debug, Clone, PartialEq)]
struct Signature {
    cache_id: u64,
    top_k: usize,
    penalties: Option<[u32; 3]>,
    one_pass_attention: bool,
}

impl Signature {
    fn of(key: DecodeStep, pick: &DevicePick) -> Signature {
        Signature {
            cache_id: key.cache_id,
            top_k: pick.top_k,
            penalties: pick.penalties.as_ref().map(|p| {
                [
                    p.repeat.to_bits(),
                    p.frequency.to_bits(),
                    p.presence.to_bits(),
                ]
            }),
            one_pass_attention: key.position < ops::attention_one_pass_max(),
        }
    }
}

#[derive(Default)]
pub(crate) struct Replay {
    mode: Mutex<Mode>,
    steps: Mutex<Vec<(Signature, Phase)>>,
}

impl Replay {
    pub(crate) fn mode(&self) -> MutexGuard<'_, Mode> {
        // A poisoned lock only means a panic elsewhere; the mode itself is always valid.
        self.mode.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_mode(&self, mode: Mode) -> Mode {
        std::mem::replace(&mut *self.mode(), mode)
    }

    /// The inputs of the step being recorded, if one is.
    pub(crate) fn recording(&self) -> Option<Arc<StepInputs>> {
        match &*self.mode() {
            Mode::Record(inputs) => Some(inputs.clone()),
            _ => None,
        }
    }

    /// Notes that the running step uses `rope` (when surveying).
    pub(crate) fn note_rope(&self, rope: &Rope) {
        if let Mode::Survey(ropes) = &mut *self.mode() {
            if !ropes.iter().any(|r| same_rope(r, rope)) {
                ropes.push(rope.clone());
            }
        }
    }

    /// Runs one decode step: eagerly, recorded, or as a replay (see the module docs).
    pub(crate) fn decode_step(
        &self,
        dev: &CudaDevice,
        key: DecodeStep,
        pick: &DevicePick,
        step: &mut dyn FnMut() -> Result<Vec<(u32, f32)>>,
    ) -> Result<Vec<(u32, f32)>> {
        if pick
            .penalties
            .as_ref()
            .is_some_and(|p| p.counts.len() > MAX_PENALTY_TOKENS)
        {
            return step();
        }
        let sig = Signature::of(key, pick);
        let mut steps = self.steps.lock().unwrap_or_else(|e| e.into_inner());
        let Some(at) = steps.iter().position(|(s, _)| *s == sig) else {
            self.set_mode(Mode::Survey(Vec::new()));
            let picked = step();
            let Mode::Survey(ropes) = self.set_mode(Mode::Eager) else {
                unreachable!("only decode_step changes the mode")
            };
            if picked.is_ok() {
                if steps.len() == MAX_RECORDED {
                    steps.remove(0);
                }
                steps.push((sig, Phase::Surveyed(ropes)));
            }
            return picked;
        };
        match &mut steps[at].1 {
            Phase::Eager => step(),
            Phase::Recorded { graph, inputs } => {
                inputs.write_step(dev, key, pick)?;
                graph.launch()?;
                inputs.picked(dev)
            }
            Phase::Surveyed(ropes) => {
                let ropes = std::mem::take(ropes);
                match self.record(dev, key, pick, &ropes, step) {
                    Ok((picked, graph, inputs)) => {
                        steps[at].1 = Phase::Recorded { graph, inputs };
                        Ok(picked)
                    }
                    Err(_) => {
                        // Nothing of the attempted recording ran: run the step for real.
                        steps[at].1 = Phase::Eager;
                        step()
                    }
                }
            }
        }
    }

    /// Records `step` with its inputs in fixed buffers, then launches the recording once.
    #[allow(clippy::type_complexity)]
    fn record(
        &self,
        dev: &CudaDevice,
        key: DecodeStep,
        pick: &DevicePick,
        ropes: &[Rope],
        step: &mut dyn FnMut() -> Result<Vec<(u32, f32)>>,
    ) -> Result<(Vec<(u32, f32)>, StepGraph, Arc<StepInputs>)> {
        let inputs = Arc::new(StepInputs::new(dev, ropes, pick)?);
        inputs.write_step(dev, key, pick)?;
        dev.synchronize()?;
        dev.begin_capture()?;
        self.set_mode(Mode::Record(inputs.clone()));
        let ran = step();
        self.set_mode(Mode::Eager);
        // End the capture whatever happened, so the stream works again.
        let graph = dev.end_capture();
        ran?;
        let mut graph = graph?.ok_or_else(|| {
            NnError::Kernel(synaptix_core::Error::ShapeMismatch {
                op: "decode step",
                detail: "empty recording".into(),
            })
        })?;
        graph.launch()?;
        let picked = inputs.picked(dev)?;
        Ok((picked, graph, inputs))
    }
}

pub(crate) fn same_rope(a: &Rope, b: &Rope) -> bool {
    a.n_rot == b.n_rot
        && a.base.to_bits() == b.base.to_bits()
        && a.freq_scale.to_bits() == b.freq_scale.to_bits()
        && a.style == b.style
        && a.freq_factors
            .as_ref()
            .map(|f| f.iter().map(|v| v.to_bits()).collect::<Vec<_>>())
            == b.freq_factors
                .as_ref()
                .map(|f| f.iter().map(|v| v.to_bits()).collect::<Vec<_>>())
}
