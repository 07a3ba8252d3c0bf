"""The fast CPU path: the encoder run by ONNX Runtime, with its graph fusions and optional dynamic int8 weights.

Any transformers encoder that takes ``input_ids`` and ``attention_mask`` is exported once (torch's ONNX exporter)
to the hidden states the scorer pools, then ONNX Runtime fuses the graph (attention, layer norms, GELU: its
``ORT_ENABLE_ALL`` level) and, with ``quantize="int8"``, stores the matrix weights as int8 per output channel
and quantizes activations on the fly (``onnxruntime.quantization.quantize_dynamic``). The exported, fused and
quantized graphs are cached under ``$PMI_REWARD_CACHE/onnx/<hash of the weights and settings>``, so a machine
pays for them once. Needs ``pip install pmi-reward[fast]`` (onnxruntime, onnx). CPU only: on a GPU the torch
backend in bfloat16 with large batches is the fast path.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .models import cache_root

__all__ = ["OnnxBackbone", "onnx_files"]

_OPSET = 17
# op types whose weights int8 replaces: every matrix product (ORT's fused Attention included)
_QUANTIZED_OPS = ["MatMul", "Attention", "Gemm"]


class _Hidden(nn.Module):
    """The backbone reduced to what the scorer reads: ids and mask in, one layer's hidden states out."""

    def __init__(self, model: nn.Module, layer: int) -> None:
        super().__init__()
        self.model, self.layer = model, layer

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=self.layer != -1)
        return out.last_hidden_state if self.layer == -1 else out.hidden_states[self.layer]


def _weights_hash(model: nn.Module, layer: int) -> str:
    """What identifies an export: the weights, the layer read, and the versions that shape the graph."""
    import onnxruntime

    h = hashlib.sha1(f"{type(model).__name__}|{layer}|{torch.__version__}|{onnxruntime.__version__}".encode())
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()[:20]


def _export(model: nn.Module, layer: int, path: Path) -> None:
    """The backbone as an ONNX graph with dynamic batch and sequence axes (legacy TorchScript exporter: the new
    one needs onnxscript and gives ORT's fusions patterns they do not all recognise)."""
    wrapper = _Hidden(model, layer).eval()
    example = (torch.ones(2, 8, dtype=torch.long), torch.ones(2, 8, dtype=torch.long))
    axes = {0: "batch", 1: "tokens"}
    with torch.inference_mode():
        torch.onnx.export(
            wrapper,
            example,
            str(path),
            input_names=["input_ids", "attention_mask"],
            output_names=["hidden"],
            dynamic_axes={"input_ids": axes, "attention_mask": axes, "hidden": axes},
            opset_version=_OPSET,
            dynamo=False,
        )


def _fuse(source: Path, target: Path) -> None:
    """ONNX Runtime's offline graph optimization (fusions at the extended level, which stay portable across
    CPUs), saved so that quantization sees the fused matrix products."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(target)
    ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])


def _quantize(source: Path, target: Path) -> None:
    """Dynamic int8: weights per output channel (what keeps BERT-style FFN outputs accurate), activations per
    tensor at run time."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        str(source),
        str(target),
        op_types_to_quantize=_QUANTIZED_OPS,
        per_channel=True,
        weight_type=QuantType.QInt8,
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )


def onnx_files(model: nn.Module, layer: int, quantize: str) -> Path:
    """The cached graph for ``model`` (exported, fused and, for ``int8``, quantized on first use, under a lock)."""
    directory = cache_root() / "onnx" / _weights_hash(model, layer)
    name = "model.int8.onnx" if quantize == "int8" else "model.fused.onnx"
    if (directory / name).is_file():
        return directory / name
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (directory / name).is_file():
            return directory / name
        tmp = Path(tempfile.mkdtemp(dir=directory, prefix=".build-"))
        try:
            _export(model, layer, tmp / "model.onnx")
            _fuse(tmp / "model.onnx", tmp / "model.fused.onnx")
            if quantize == "int8":
                _quantize(tmp / "model.fused.onnx", tmp / name)
            os.replace(tmp / name, directory / name)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return directory / name


class OnnxBackbone:
    """Hidden states of a token batch from an ONNX Runtime session (CPU), as float32 torch tensors."""

    def __init__(self, model: nn.Module, layer: int = -1, quantize: str = "none", threads: int | None = None) -> None:
        try:
            import onnxruntime as ort
        except ImportError:
            raise ImportError(
                "backend='onnx' needs ONNX Runtime: pip install 'pmi-reward[fast]' (onnxruntime, onnx)"
            ) from None
        self.path = onnx_files(model, layer, quantize)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = threads or torch.get_num_threads()
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        feeds = {
            "input_ids": np.ascontiguousarray(input_ids.cpu().numpy(), dtype=np.int64),
            "attention_mask": np.ascontiguousarray(attention_mask.cpu().numpy(), dtype=np.int64),
        }
        return torch.from_numpy(self.session.run(None, feeds)[0])
