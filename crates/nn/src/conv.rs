//! 1-D convolution layers over time-major activations `[time, channels]`, loaded from the `Conv`
//! and `ConvTranspose` nodes of an ONNX graph: the weight and bias are the node's initializers
//! and the geometry (kernel, stride, dilation, padding, groups) its attributes, so a model file
//! names a layer by its weight or bias and never restates its hyperparameters. Dense, depthwise
//! (`group == channels`) and transposed convolutions; other group counts are refused.

use synaptix_bundle::onnx::{AttrValue, Node, OnnxFile};
pub use synaptix_kernels_cpu::conv::InputActivation;
use synaptix_kernels_cpu::conv::{
    conv1d_into, conv1d_residual, conv_transpose1d, depthwise_conv1d, ConvGeometry, ConvWeight,
    TransposedConvWeight,
};

use crate::{NnError, Result};

#[derive(Debug)]
enum ConvKind {
    /// Packed for the products.
    Dense(ConvWeight),
    /// `[c_out, 1, kernel]` as stored.
    Depthwise(Vec<f32>),
    /// Packed for the products.
    Transposed(TransposedConvWeight),
}

/// A convolution layer: `[t_in, c_in]` → `[t_out, c_out]`.
#[derive(Debug)]
pub struct Conv1d {
    kind: ConvKind,
    b: Option<Vec<f32>>,
    c_in: usize,
    c_out: usize,
    geometry: ConvGeometry,
}

fn graph_error(file: &OnnxFile, problem: String) -> NnError {
    NnError::OnnxGraph {
        source_name: file.path().display().to_string(),
        problem,
    }
}

/// An integer-list attribute of exactly one value (1-D), or `default` when absent.
fn one_int(file: &OnnxFile, node: &Node, name: &str, default: i64) -> Result<usize> {
    let v = match node.attribute(name) {
        None => default,
        Some(AttrValue::Ints(v)) if v.len() == 1 => v[0],
        Some(AttrValue::Int(v)) => *v,
        Some(other) => {
            return Err(graph_error(
                file,
                format!("node '{}': attribute {name} is {other:?}", node.name),
            ))
        }
    };
    usize::try_from(v)
        .ok()
        .filter(|&v| v <= 1 << 20)
        .ok_or_else(|| graph_error(file, format!("node '{}': {name} = {v}", node.name)))
}

impl Conv1d {
    /// The convolution whose weight initializer is `weight`.
    pub fn from_onnx_weight(file: &OnnxFile, weight: &str) -> Result<Conv1d> {
        Conv1d::from_onnx(file, 1, weight)
    }

    /// The convolution whose bias initializer is `bias` (for weights the exporter renamed, such
    /// as weight-normalised ones folded into `onnx::Conv_*` constants).
    pub fn from_onnx_bias(file: &OnnxFile, bias: &str) -> Result<Conv1d> {
        Conv1d::from_onnx(file, 2, bias)
    }

    fn from_onnx(file: &OnnxFile, input: usize, name: &str) -> Result<Conv1d> {
        let node = file
            .graph
            .nodes
            .iter()
            .find(|n| {
                matches!(n.op_type.as_str(), "Conv" | "ConvTranspose")
                    && n.inputs.get(input).is_some_and(|i| i == name)
            })
            .ok_or_else(|| graph_error(file, format!("no convolution uses '{name}'")))?;
        let weight_name = &node.inputs[1];
        let shape: Vec<usize> = file
            .tensor(weight_name)
            .ok_or_else(|| NnError::MissingTensor {
                source_name: file.path().display().to_string(),
                name: weight_name.clone(),
            })?
            .dims
            .iter()
            .map(|&d| usize::try_from(d).unwrap_or(0))
            .collect();
        let [d0, d1, kernel] = shape[..] else {
            return Err(graph_error(
                file,
                format!("'{weight_name}' has shape {shape:?}, expected 3 dimensions"),
            ));
        };
        if let Some(AttrValue::String(pad)) = node.attribute("auto_pad") {
            if pad != "NOTSET" {
                return Err(graph_error(
                    file,
                    format!("node '{}': auto_pad {pad} is not supported", node.name),
                ));
            }
        }
        let pads = match node.attribute("pads") {
            None => vec![0, 0],
            Some(AttrValue::Ints(p)) if p.len() == 2 => p.clone(),
            Some(other) => {
                return Err(graph_error(
                    file,
                    format!("node '{}': pads {other:?}", node.name),
                ))
            }
        };
        let pad = |v: i64| {
            usize::try_from(v)
                .ok()
                .filter(|&v| v <= 1 << 20)
                .ok_or_else(|| graph_error(file, format!("node '{}': pad {v}", node.name)))
        };
        let geometry = ConvGeometry {
            kernel,
            stride: one_int(file, node, "strides", 1)?,
            dilation: one_int(file, node, "dilations", 1)?,
            pad_left: pad(pads[0])?,
            pad_right: pad(pads[1])?,
        };
        let groups = one_int(file, node, "group", 1)?;
        if kernel == 0 || geometry.stride == 0 || geometry.dilation == 0 || groups == 0 {
            return Err(graph_error(
                file,
                format!("node '{}': {geometry:?}, group {groups}", node.name),
            ));
        }
        if let Some(AttrValue::Ints(k)) = node.attribute("kernel_shape") {
            if k[..] != [kernel as i64] {
                return Err(graph_error(
                    file,
                    format!(
                        "node '{}': kernel_shape {k:?} vs weight {shape:?}",
                        node.name
                    ),
                ));
            }
        }
        let raw = file.f32_values(weight_name)?;
        let transposed = node.op_type == "ConvTranspose";
        let (kind, c_in, c_out) = if transposed {
            if groups != 1 || geometry.dilation != 1 {
                return Err(graph_error(
                    file,
                    format!("node '{}': grouped or dilated ConvTranspose", node.name),
                ));
            }
            let w = TransposedConvWeight::new(&raw, d0, d1, kernel, geometry.stride)?;
            (ConvKind::Transposed(w), d0, d1)
        } else if groups == 1 {
            (
                ConvKind::Dense(ConvWeight::new(&raw, d0, d1, kernel)?),
                d1,
                d0,
            )
        } else if d1 == 1 && groups == d0 {
            (ConvKind::Depthwise(raw), d0, d0)
        } else {
            return Err(graph_error(
                file,
                format!(
                    "node '{}': {groups} groups over weight {shape:?} (only 1 or one per channel)",
                    node.name
                ),
            ));
        };
        let b = match node.inputs.get(2).filter(|b| !b.is_empty()) {
            Some(bias) => {
                let b = file.f32_values(bias)?;
                if b.len() != c_out {
                    return Err(graph_error(
                        file,
                        format!("bias '{bias}' has {} values, expected {c_out}", b.len()),
                    ));
                }
                Some(b)
            }
            None => None,
        };
        Ok(Conv1d {
            kind,
            b,
            c_in,
            c_out,
            geometry,
        })
    }

    pub fn in_channels(&self) -> usize {
        self.c_in
    }

    pub fn out_channels(&self) -> usize {
        self.c_out
    }

    pub fn kernel(&self) -> usize {
        self.geometry.kernel
    }

    pub fn stride(&self) -> usize {
        self.geometry.stride
    }

    /// Pads so a stride-1 layer keeps the length, the extra zero after the input for an even
    /// span (PyTorch's "same"), for graphs that pad with a separate `Pad` node.
    pub fn set_same_padding(&mut self) {
        let span = self.geometry.dilation * (self.geometry.kernel - 1);
        self.geometry.pad_left = span / 2;
        self.geometry.pad_right = span - span / 2;
    }

    /// `x: [t_in, c_in]` → `([t_out, c_out], t_out)`.
    pub fn forward(&self, x: &[f32], t_in: usize) -> Result<(Vec<f32>, usize)> {
        let b = self.b.as_deref();
        let g = self.geometry;
        Ok(match &self.kind {
            ConvKind::Dense(w) => {
                let t_out = g.output_len(t_in).unwrap_or(0);
                let mut y = vec![0f32; t_out * self.c_out];
                let t_out =
                    conv1d_into(x, t_in, w, b, g, InputActivation::Identity, &mut y, false)?;
                (y, t_out)
            }
            ConvKind::Depthwise(w) => depthwise_conv1d(x, t_in, self.c_in, w, b, g)?,
            ConvKind::Transposed(w) => {
                conv_transpose1d(x, t_in, w, b, g, InputActivation::Identity)?
            }
        })
    }

    /// An upsampling (transposed) convolution of `act(x)`: `([t_out, c_out], t_out)`.
    pub fn upsample_activated(
        &self,
        x: &[f32],
        t_in: usize,
        act: InputActivation,
    ) -> Result<(Vec<f32>, usize)> {
        match &self.kind {
            ConvKind::Transposed(w) => Ok(conv_transpose1d(
                x,
                t_in,
                w,
                self.b.as_deref(),
                self.geometry,
                act,
            )?),
            _ => Err(NnError::Kernel(synaptix_core::Error::ShapeMismatch {
                op: "conv_transpose1d",
                detail: "not a transposed convolution".into(),
            })),
        }
    }

    fn same_length(&self, t: usize, t_out: usize) -> Result<()> {
        if t_out != t {
            return Err(NnError::Kernel(synaptix_core::Error::ShapeMismatch {
                op: "conv1d (same length)",
                detail: format!("{t} steps in, {t_out} out"),
            }));
        }
        Ok(())
    }

    fn dense(&self) -> Result<&ConvWeight> {
        match &self.kind {
            ConvKind::Dense(w) => Ok(w),
            _ => Err(NnError::Kernel(synaptix_core::Error::ShapeMismatch {
                op: "conv1d",
                detail: "a fused form of a depthwise or transposed convolution".into(),
            })),
        }
    }

    /// [`Conv1d::forward`] for layers that keep the length (stride 1, `pad_left + pad_right`
    /// equal to the dilated kernel's span minus one).
    pub fn forward_same(&self, x: &[f32], t: usize) -> Result<Vec<f32>> {
        let (y, t_out) = self.forward(x, t)?;
        self.same_length(t, t_out)?;
        Ok(y)
    }

    /// `conv(act(x))` of a dense, length-keeping convolution, the activation applied as the
    /// input is read.
    pub fn forward_activated(&self, x: &[f32], t: usize, act: InputActivation) -> Result<Vec<f32>> {
        let w = self.dense()?;
        let mut y = vec![0f32; t * self.c_out];
        let t_out = conv1d_into(
            x,
            t,
            w,
            self.b.as_deref(),
            self.geometry,
            act,
            &mut y,
            false,
        )?;
        self.same_length(t, t_out)?;
        Ok(y)
    }

    /// `out += conv(act(x))` of a dense, length-keeping convolution.
    pub fn add_forward(
        &self,
        x: &[f32],
        t: usize,
        act: InputActivation,
        out: &mut [f32],
    ) -> Result<()> {
        let w = self.dense()?;
        let t_out = self.geometry.output_len(t).unwrap_or(0);
        self.same_length(t, t_out)?;
        conv1d_into(x, t, w, self.b.as_deref(), self.geometry, act, out, true)?;
        Ok(())
    }

    /// The residual step `x += conv(act(x))` in place.
    pub fn residual(&self, x: &mut [f32], t: usize, act: InputActivation) -> Result<()> {
        let w = self.dense()?;
        Ok(conv1d_residual(
            x,
            t,
            w,
            self.b.as_deref(),
            self.geometry,
            act,
        )?)
    }
}
