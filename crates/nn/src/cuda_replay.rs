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

use synaptix_kernels_cuda::{ops, CudaDevice, DeviceBuffer, Readback, StepGraph};

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
    /// `[1]`: the token. A greedy step writes its pick here, so that the next replay can run
    /// on it without the host (see `Replay::decode_step`).
    pub ids: Mutex<DeviceBuffer<i32>>,
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
    /// Where greedy picks come back to the host: slot `position % 2`.
    readback: Readback,
}

impl StepInputs {
    fn new(dev: &CudaDevice, ropes: &[Rope], pick: &DevicePick) -> Result<StepInputs> {
        let k = pick.top_k.max(1);
        Ok(StepInputs {
            ids: Mutex::new(dev.zeros(1)?),
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
            readback: dev.readback(2)?,
        })
    }

    fn ids(&self) -> MutexGuard<'_, DeviceBuffer<i32>> {
        // A poisoned lock only means a panic elsewhere; the buffer itself is always valid.
        self.ids.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues the copy of the greedy pick the step just queued wrote, into `slot`.
    fn queue_readback(&self, slot: usize) -> Result<()> {
        Ok(self.readback.enqueue(slot, &self.ids())?)
    }

    /// What the last run of the step picked (greedy: the id, its value unknown: NaN).
    fn picked(&self, dev: &CudaDevice) -> Result<Vec<(u32, f32)>> {
        if self.pick.top_k == 0 {
            self.queue_readback(0)?;
            return Ok(vec![(self.readback.wait(0)? as u32, f32::NAN)]);
        }
        let out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        read_pick(dev, &out, self.pick.top_k)
    }

    /// Writes the token, position and RoPE tables of `key`, and the penalty window of `pick`.
    fn write_step(&self, dev: &CudaDevice, key: DecodeStep, pick: &DevicePick) -> Result<()> {
        dev.overwrite(&self.ids(), &[key.token as i32])?;
        self.write_position(dev, key.position)?;
        if let Some(p) = &pick.penalties {
            if !p.counts.is_empty() {
                dev.overwrite(&self.penalty_pairs, &penalty_pairs(&p.counts))?;
            }
            dev.overwrite(&self.penalty_count, &[p.counts.len() as i32])?;
        }
        Ok(())
    }

    /// Writes the position and its RoPE tables (in stream order: after the work queued before).
    fn write_position(&self, dev: &CudaDevice, position: usize) -> Result<()> {
        let as_i32 = i32::try_from(position).map_err(|_| {
            NnError::Kernel(synaptix_core::Error::ShapeMismatch {
                op: "decode step",
                detail: format!("position {position}"),
            })
        })?;
        dev.overwrite(&self.pos, &[as_i32])?;
        for (rope, table) in &self.ropes {
            dev.overwrite(table, &rope_table(rope, &[position]))?;
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

/// A greedy step launched before it was asked for, on the device's pick of the step before.
struct Ahead {
    sig: Signature,
    position: usize,
    /// The pick it runs on.
    token: u32,
}

#[derive(Default)]
pub(crate) struct Replay {
    mode: Mutex<Mode>,
    steps: Mutex<Vec<(Signature, Phase)>>,
    ahead: Mutex<Option<Ahead>>,
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
        let ahead = self.ahead.lock().unwrap_or_else(|e| e.into_inner()).take();
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
            Phase::Recorded { graph, inputs } if pick.top_k == 0 => {
                // Greedy: the pick comes back through slot `position % 2`. When the caller
                // continues on it, the next step is queued before this one's pick is read, on
                // the pick the device left in the token buffer: the device goes from step to
                // step without waiting for the host.
                let launched = key.follows
                    && ahead.is_some_and(|a| {
                        a.sig == sig && a.position == key.position && a.token == key.token
                    });
                if !launched {
                    inputs.write_step(dev, key, pick)?;
                    graph.launch()?;
                    inputs.queue_readback(key.position % 2)?;
                }
                let next = key.position + 1;
                let next_sig = Signature::of(
                    DecodeStep {
                        position: next,
                        ..key
                    },
                    pick,
                );
                let go_ahead = key.continues && next_sig == sig && !ahead_disabled();
                if go_ahead {
                    inputs.write_position(dev, next)?;
                    graph.launch()?;
                    inputs.queue_readback(next % 2)?;
                }
                let token = inputs.readback.wait(key.position % 2)? as u32;
                if go_ahead {
                    *self.ahead.lock().unwrap_or_else(|e| e.into_inner()) = Some(Ahead {
                        sig,
                        position: next,
                        token,
                    });
                }
                Ok(vec![(token, f32::NAN)])
            }
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

/// `SYNAPTIX_NO_AHEAD=1` (for comparisons): no greedy step is launched before it is asked for.
fn ahead_disabled() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(|| std::env::var_os("SYNAPTIX_NO_AHEAD").is_some())
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
