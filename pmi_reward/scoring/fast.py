"""The fast CPU path: the encoder run by ONNX Runtime, with its graph fusions and optional dynamic int8 weights.

Any transformers encoder that takes ``input_ids`` and ``attention_mask`` is exported once (torch's ONNX exporter)
to the hidden states the scorer pools, then ONNX Runtime fuses the graph (attention, layer norms, GELU: its
``ORT_ENABLE_ALL`` level). Two int8 choices replace the weight matrix products:

- ``quantize="int8"``: weights int8 per output channel, activations quantized on the fly with ONE scale per
  tensor (``onnxruntime.quantization.quantize_dynamic``; ``MatMulInteger``). The fastest on an AVX2 CPU, but
  MiniLM's activation outliers cost precision: ~0.17-0.25 nat of PMI noise per score (AUC kept).
- ``quantize="int8-block"``: weights 8-bit in blocks of ``BLOCK`` input rows per output column (a scale and a
  zero point each), run by ONNX Runtime's ``MatMulNBits`` at ``accuracy_level`` 4, which quantizes activations
  per token and per block of ``BLOCK`` channels at run time: an outlier channel coarsens only its own block.
  About 6x closer to float32 than ``int8`` (median PMI gap 0.026 nat on MiniLM), but whether it is faster than
  float32 depends on the CPU's ``MatMulNBits`` kernels (``benchmarks/RESULTS.md``).

The exported, fused and quantized graphs are cached under ``$PMI_REWARD_CACHE/onnx/<hash of the weights and
settings>``, so a machine pays for them once; a cached graph that ONNX Runtime cannot parse (cut short, emptied:
a disk error, a cache copied mid-write) is built again, with a warning. Needs ``pip install pmi-reward[fast]``
(onnxruntime, onnx). CPU only: on a GPU the torch backend in bfloat16 with large batches is the fast path.
"""

from __future__ import annotations

import copy
import fcntl
import hashlib
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .models import cache_root

__all__ = ["OnnxBackbone", "onnx_files"]

logger = logging.getLogger(__name__)

_OPSET = 17
# op types whose weights int8 replaces: every matrix product (ORT's fused Attention included)
_QUANTIZED_OPS = ["MatMul", "Attention", "Gemm"]
BLOCK = 16  # int8-block: input rows per weight scale, and channels per activation scale at run time (32: 91-93%
# of MiniLM PMI scores within 0.1 nat of float32, 16: 97.1%; benchmarks/RESULTS.md)
_FILES = {"none": "model.fused.onnx", "int8": "model.int8.onnx", "int8-block": f"model.int8-block{BLOCK}.onnx"}
_BUILD = re.compile(r"\.build-[a-z0-9_]{8}")  # onnx_files' temporary folders (mkdtemp's prefix and 8 characters)


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
    if any(p.dtype != torch.float32 for p in model.parameters()):  # ORT's graph and int8 operators are float32's
        model = copy.deepcopy(model).float()
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


def block_quantize(weight: np.ndarray, block: int = BLOCK) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A (K, N) float matrix as ``MatMulNBits`` stores 8-bit weights: (N, K/block, block) uint8 codes, (N, K/block)
    float32 scales and uint8 zero points; K is zero-padded to whole blocks. Asymmetric per block, with 0 always
    representable: ``weight[k, n] ~= (codes[n, k // block, k % block] - zero[n, b]) * scale[n, b]``, b = k // block.
    """
    k, n = weight.shape
    blocks = -(-k // block)
    w = np.zeros((blocks * block, n), dtype=np.float32)
    w[:k] = weight
    w = w.T.reshape(n, blocks, block)
    low, high = np.minimum(w.min(-1), 0.0), np.maximum(w.max(-1), 0.0)
    scale = ((high - low) / 255.0).astype(np.float32)
    scale[scale == 0] = 1.0
    zero = np.clip(np.rint(-low / scale), 0, 255)
    codes = np.clip(np.rint(w / scale[..., None]) + zero[..., None], 0, 255)
    return codes.astype(np.uint8), scale, zero.astype(np.uint8)


def _quantize_blocks(source: Path, target: Path, block: int = BLOCK) -> None:
    """Every MatMul with a constant 2-D weight becomes ``MatMulNBits`` (bits 8, ``accuracy_level`` 4: int8 dot
    products with activations quantized per token and block at run time); activation-by-activation products
    (attention scores) stay float32."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(source))
    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    nodes, used = [], set()
    for node in graph.node:
        weight = weights.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
        if weight is None or len(weight.dims) != 2:
            nodes.append(node)
            used.update(node.input)
            continue
        array = numpy_helper.to_array(weight).astype(np.float32)
        codes, scale, zero = block_quantize(array, block)
        base = f"{node.name or node.output[0]}.q8"
        graph.initializer.extend(
            [
                numpy_helper.from_array(codes, f"{base}.codes"),
                numpy_helper.from_array(scale, f"{base}.scales"),
                numpy_helper.from_array(zero, f"{base}.zero_points"),
            ]
        )
        nodes.append(
            helper.make_node(
                "MatMulNBits",
                [node.input[0], f"{base}.codes", f"{base}.scales", f"{base}.zero_points"],
                list(node.output),
                name=base,
                domain="com.microsoft",
                K=array.shape[0],
                N=array.shape[1],
                bits=8,
                block_size=block,
                accuracy_level=4,
            )
        )
        used.add(node.input[0])
    del graph.node[:]
    graph.node.extend(nodes)
    kept = [t for t in graph.initializer if t.name in used or t.name not in weights]
    dropped = {t.name for t in graph.initializer} - {t.name for t in kept}
    del graph.initializer[:]
    graph.initializer.extend(kept)
    inputs = [i for i in graph.input if i.name not in dropped]  # older exports list weights as graph inputs too
    del graph.input[:]
    graph.input.extend(inputs)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    onnx.save(model, str(target))


_FileId = tuple[int, int, int]  # a file's (st_dev, st_ino, st_mtime_ns): which file is at a path


def _file_id(path: Path) -> _FileId | None:
    """Which file is at ``path`` now, None where none is."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns


def onnx_files(model: nn.Module, layer: int, quantize: str, *, damaged: _FileId | None = None) -> Path:
    """The cached graph for ``model`` (exported, fused and, for ``int8``/``int8-block``, quantized on first use,
    under a lock, in a temporary ``.build-*`` folder). A build killed outright (SIGKILL, the OOM killer) leaves that
    folder, the exported model (hundreds of MB): under the lock no build of this directory is live, so any found is
    removed (mkdtemp's name: the prefix and 8 of ``[a-z0-9_]``; nothing else of the directory matches).

    ``damaged``: the ``_file_id`` of the cached graph found unreadable, built again (replaced in one rename) unless
    another process did so already (another file is at its path by the time the lock is held)."""
    if quantize not in _FILES:
        raise ValueError(f"quantize must be one of {tuple(_FILES)}, got {quantize!r}")
    directory = cache_root() / "onnx" / _weights_hash(model, layer)
    name = _FILES[quantize]
    if damaged is None and (directory / name).is_file():
        return directory / name
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for stale in directory.iterdir():
            if _BUILD.fullmatch(stale.name) and stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale, ignore_errors=True)
        if (directory / name).is_file() and (damaged is None or _file_id(directory / name) != damaged):
            return directory / name
        tmp = Path(tempfile.mkdtemp(dir=directory, prefix=".build-"))
        try:
            _export(model, layer, tmp / "model.onnx")
            _fuse(tmp / "model.onnx", tmp / "model.fused.onnx")
            if quantize == "int8":
                _quantize(tmp / "model.fused.onnx", tmp / name)
            elif quantize == "int8-block":
                _quantize_blocks(tmp / "model.fused.onnx", tmp / name)
            os.replace(tmp / name, directory / name)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return directory / name


def _unparsable(err: Exception, path: Path) -> bool:
    """Whether ONNX Runtime's ``err`` opening the cached graph ``path`` says the file is damaged (cut short: its
    protobuf does not parse; emptied; gone) rather than anything else (a graph it cannot run: raised as it is)."""
    if type(err).__name__ in ("InvalidProtobuf", "NoSuchFile"):
        return True
    try:
        return os.stat(path).st_size == 0  # an empty file: "No graph was found in the protobuf"
    except OSError:
        return True


class OnnxBackbone:
    """Hidden states of a token batch from an ONNX Runtime session (CPU), as float32 torch tensors."""

    def __init__(self, model: nn.Module, layer: int = -1, quantize: str = "none", threads: int | None = None) -> None:
        try:
            import onnxruntime as ort
        except ImportError:
            raise ImportError(
                "backend='onnx' needs ONNX Runtime: pip install 'pmi-reward[fast]' (onnxruntime, onnx)"
            ) from None
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = threads or torch.get_num_threads()
        options.inter_op_num_threads = 1
        self.path = onnx_files(model, layer, quantize)
        found = _file_id(self.path)  # before the read: another process's rebuild is not taken for the damage
        try:
            self.session = ort.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])
            return
        except Exception as err:  # ONNX Runtime's errors (InvalidProtobuf, ...) derive from Exception alone
            if not _unparsable(err, self.path):
                raise
            cause = " ".join(str(err).split())
        logger.warning("%s: damaged ONNX export (%s); building it again", self.path, cause)
        try:
            self.path = onnx_files(model, layer, quantize, damaged=found)
            self.session = ort.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])
        except Exception as err:  # a cache it cannot write, or a graph that does not read even built afresh
            if not isinstance(err, OSError) and not _unparsable(err, self.path):
                raise
            raise OSError(
                f"{self.path}: damaged ONNX export ({cause}), not rebuilt ({' '.join(str(err).split())}); delete "
                f"{self.path.parent} to rebuild it"
            ) from err

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        feeds = {
            "input_ids": np.ascontiguousarray(input_ids.cpu().numpy(), dtype=np.int64),
            "attention_mask": np.ascontiguousarray(attention_mask.cpu().numpy(), dtype=np.int64),
        }
        return torch.from_numpy(self.session.run(None, feeds)[0])
