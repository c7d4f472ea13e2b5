#!/usr/bin/env python3
"""Writes tests/fixtures/onnx/piper_joe_summary.json from the Piper voice en_US joe (medium),
read with the reference `onnx` package (pip install onnx), for crates/bundle/tests/onnx_reader.rs.

    scripts/fetch-models.sh piper-en-us-joe-medium
    python3 scripts/reference/make_onnx_goldens.py [path/to/en_US-joe-medium.onnx]
"""
import collections
import json
import os
import sys

import numpy as np
import onnx
from onnx import numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
cache = os.environ.get("SYNAPTIX_MODELS") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "synaptix", "models")
path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    cache, "piper-en-us-joe-medium", "en_US-joe-medium.onnx")
m = onnx.load(path)
g = m.graph


def dims(vi):
    t = vi.type.tensor_type
    out = []
    for d in t.shape.dim:
        if d.HasField("dim_value"):
            out.append(d.dim_value)
        elif d.HasField("dim_param"):
            out.append(d.dim_param)
        else:
            out.append(None)
    return {"name": vi.name, "elem_type": onnx.TensorProto.DataType.Name(t.elem_type), "shape": out}


hist = collections.Counter(n.op_type for n in g.node)
inits = list(g.initializer)
# ~10 initializers spread over the list, plus the largest one.
picks = sorted(set(list(range(0, len(inits), max(1, len(inits) // 10)))[:10]
                   + [max(range(len(inits)), key=lambda i: int(np.prod(inits[i].dims)))]))
samples = []
for i in picks:
    t = inits[i]
    a = numpy_helper.to_array(t)
    entry = {"index": i, "name": t.name, "data_type": onnx.TensorProto.DataType.Name(t.data_type),
             "dims": list(t.dims), "raw_bytes": len(t.raw_data)}
    if a.dtype.kind == "f":
        f = a.astype(np.float32).ravel()
        entry["sum_f64"] = float(f.astype(np.float64).sum())
        entry["first4"] = [float(x) for x in f[:4]]
    else:
        entry["sum_i64"] = int(a.astype(np.int64).sum())
    samples.append(entry)
n_const = sum(1 for n in g.node if n.op_type == "Constant")
out = {
    "file": os.path.basename(path),
    "ir_version": m.ir_version,
    "producer_name": m.producer_name,
    "producer_version": m.producer_version,
    "opsets": [{"domain": o.domain, "version": o.version} for o in m.opset_import],
    "graph_name": g.name,
    "inputs": [dims(v) for v in g.input],
    "outputs": [dims(v) for v in g.output],
    "n_nodes": len(g.node),
    "op_types": dict(sorted(hist.items())),
    "n_constant_nodes": n_const,
    "n_initializers": len(inits),
    "initializer_types": dict(sorted(collections.Counter(
        onnx.TensorProto.DataType.Name(t.data_type) for t in inits).items())),
    "initializer_raw_bytes": sum(len(t.raw_data) for t in inits),
    "n_subgraph_nodes": sum(len(a.g.node) for n in g.node for a in n.attribute if a.type == onnx.AttributeProto.GRAPH),
    "initializers": samples,
}
dst = os.path.join(ROOT, "tests", "fixtures", "onnx", "piper_joe_summary.json")
with open(dst, "w") as f:
    json.dump(out, f, indent=1)
    f.write("\n")
print(f"wrote {dst}: {len(g.node)} nodes, {len(inits)} initializers")
