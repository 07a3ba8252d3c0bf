"""The batcher bounds a batch by the characters its scorer tokenizes: a long text through the encoder's window, and a
text the call holds for several pairs (a ``/rerank`` context) once. Counted whole for every pair, a 100k-character
context shared by 4,096 candidates made 4,096 batches of one pair, each tokenizing the context again (50 s, then a
503 at ``--request_timeout``). Texts the encoder still reads whole keep bounding a batch, as ``max_batch_chars`` is
meant to (how long a small request waits behind a large one)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import http

from pmi_reward.rewards import batching
from pmi_reward.rewards.batching import MicroBatcher, _Reading
from pmi_reward.scoring.encoder import WINDOW_CHARS_PER_TOKEN, EncoderSpec, TextEncoder
from pmi_reward.scoring.head import HeadConfig, PMIHead
from pmi_reward.scoring.scorer import PMIScorer
from pmi_reward.scoring.templates import TEMPLATES

HIKE = "I just got back from a hiking trip in Yosemite, the views were amazing. "
LONG_CONTEXT = (HIKE * 1400)[-100_000:]  # 100k characters: the encoder reads its last 1,024 (max_length 64)
CANDIDATES = [f"Did you see Half Dome? ({i:03d})" for i in range(300)]  # all of one length
WINDOW = WINDOW_CHARS_PER_TOKEN * 64  # the tiny encoders' max_length


class Recording:
    """A scorer that records the pairs of each call it is given and passes the call on (``inner``), or scores 0."""

    def __init__(self, inner=None, max_length: int = 64, input_mode: str = "pair") -> None:
        self.inner, self.batches = inner, []
        if inner is None:  # a stand-in with what the batcher reads of a PMIScorer
            self.encoder, self.input_mode = SimpleNamespace(spec=SimpleNamespace(max_length=max_length)), input_mode

    def score(self, contexts, responses, progress=False):
        self.batches.append(len(contexts))
        return np.zeros(len(contexts)) if self.inner is None else self.inner.score(contexts, responses)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def batched(scorer, contexts, responses, **limits) -> tuple[np.ndarray, list[int]]:
    """The scores of one request and the pairs of each scorer call it took."""
    recording = scorer if isinstance(scorer, Recording) else Recording(scorer)
    batcher = MicroBatcher(recording, max_wait_ms=50, **limits)
    try:
        return batcher.score(contexts, responses, timeout=120), recording.batches
    finally:
        batcher.close(10)


def test_a_long_context_shared_by_many_candidates_fills_each_batch(spread_scorer):
    """300 candidates of one 100k-character context (over the 64k ``max_batch_chars``): two batches, as many pairs
    as ``max_batch_pairs`` allows, with the scores of one direct call (was 300 batches of one pair)."""
    contexts = [LONG_CONTEXT] * len(CANDIDATES)
    scores, batches = batched(spread_scorer, contexts, CANDIDATES, max_batch_pairs=256)
    assert batches == [256, 44]
    np.testing.assert_allclose(scores, spread_scorer.score(contexts, CANDIDATES), atol=1e-4)
    assert np.unique(scores.round(4)).size > 1  # the scores differ from pair to pair: each was matched to its own


def test_a_served_rerank_of_a_long_context_is_one_batch(reward_server):
    """``/rerank`` sends its context once: 64 candidates of a 100k-character context are one encoder call."""
    before = http(reward_server.url, "GET", "/health")[1]["batcher"]["batches"]
    status, answer = http(
        reward_server.url, "POST", "/rerank", {"context": LONG_CONTEXT, "candidates": CANDIDATES[:64]}
    )
    assert status == 200 and len(answer["ranked"]) == 64
    assert http(reward_server.url, "GET", "/health")[1]["batcher"]["batches"] == before + 1


def test_replies_read_through_their_window_are_counted_so(spread_scorer):
    """Six distinct replies of 20k characters of words: the encoder reads 1,024 characters of each, and one batch
    holds them all under a 45k budget (was three batches of two)."""
    replies = [f"{i} " + "we walked " * 2000 for i in range(6)]
    assert batched(spread_scorer, ["hi"] * 6, replies, max_batch_pairs=64, max_batch_chars=45_000)[1] == [6]


def test_texts_the_encoder_reads_whole_still_bound_a_batch(spread_scorer):
    """Replies of words over MiniLM's 100-character word limit (one [UNK] token each): the window holds too few tokens,
    so the encoder tokenizes each 19.4k-character reply whole, and they are counted whole: two per 45k batch."""
    replies = [(f"{i}" + "y" * 120 + " ") * 160 for i in range(6)]
    assert batched(spread_scorer, ["hi"] * 6, replies, max_batch_pairs=64, max_batch_chars=45_000)[1] == [2, 2, 2]
    contexts = [(f"{i}" + "y" * 120 + " ") * 160 for i in range(6)]  # contexts alike, and one of them six times
    assert batched(spread_scorer, contexts, ["hi"] * 6, max_batch_pairs=64, max_batch_chars=45_000)[1] == [2, 2, 2]
    assert batched(spread_scorer, contexts[:1] * 6, ["hi"] * 6, max_batch_pairs=64, max_batch_chars=45_000)[1] == [6]


class TokenizerLog:
    """A tokenizer that records every text it is given."""

    def __init__(self, tokenizer) -> None:
        self.__dict__.update(tokenizer=tokenizer, texts=[])

    def __call__(self, texts, *args, **kwargs):
        self.texts.extend([texts] if isinstance(texts, str) else texts)
        return self.tokenizer(texts, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


@pytest.fixture(scope="module", params=["minilm", "smollm2-135m-instruct"])
def logged_scorers(request):
    """Pair-input scorers with and without line features (3 lines) on tiny encoders (max_length 64) whose tokenizer
    (MiniLM's WordPiece, SmolLM2's byte-level BPE) records the texts given to it."""
    from transformers import BertConfig, BertModel, LlamaConfig, LlamaModel

    from pmi_reward.scoring.models import load_tokenizer

    tokenizer = load_tokenizer(request.param)
    out = []
    for line_turns in (0, 3):
        torch.manual_seed(0)
        body = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
        if request.param == "minilm":
            model = BertModel(BertConfig(vocab_size=len(tokenizer), max_position_embeddings=128, **body))
        else:
            config = LlamaConfig(vocab_size=len(tokenizer), num_key_value_heads=2, max_position_embeddings=128, **body)
            model = LlamaModel(config)
        spec = EncoderSpec(model="tiny", pooling="mean", max_length=64, encode_batch_size=8)
        encoder = TextEncoder(spec, cache=None, device="cpu", model=model.eval(), tokenizer=tokenizer)
        encoder.tokenizer = TokenizerLog(encoder.tokenizer)
        head = PMIHead(HeadConfig(dim=encoder.dim, line_turns=line_turns))
        out.append(PMIScorer(encoder, TEMPLATES["en"], head))
    return out


TEXTS = {
    "words": (HIKE * 1500, True),
    "words, a turn per line": ("\n".join([HIKE * 300] * 4), True),
    "one long word": ("x" * 50_000, False),
    "words of 121 characters": (("y" * 120 + " ") * 400, False),  # MiniLM: one [UNK] each; SmolLM2: many tokens
    "punctuation": ("!! " * 30_000, False),
    "CJK": ("你好世界" * 10_000, False),
    "words parted by a space and a line break": ("word \n" * 10_000, False),  # a context's lines lose their spaces
    "an older line read whole": ("x" * 30_000 + "\n" + HIKE * 300, False),  # a context's window is its newest line
}


@pytest.mark.parametrize("name", list(TEXTS))
def test_a_text_is_counted_no_less_than_the_encoder_tokenizes(logged_scorers, name):
    """Scored as a context or as a reply, no text given to the tokenizer for it is longer than its count (what a
    batch is bounded by), and a text of many short words is counted as its window, whatever the tokenizer."""
    text, windowed = TEXTS[name]
    for scorer in logged_scorers:
        log, reading = scorer.encoder.tokenizer, _Reading.of(scorer)
        for side, counted in (("context", reading.context(text)), ("response", reading.response(text))):
            log.texts.clear()
            if side == "context":
                scorer.score([text], ["ok"])
            else:
                scorer.score(["hi"], [text])
            where = (side, scorer.head.config.line_turns)
            assert counted >= max(map(len, log.texts)), where
            if windowed:  # a context's lines are read too: up to 3 windows
                assert counted <= WINDOW * (3 if side == "context" else 1), where
            if side == "response" and "line break" in name:  # a reply's line breaks are spaces: read through a window
                assert counted <= WINDOW, where


def test_prompt_input_counts_a_shared_context_with_each_distinct_pair():
    """Prompt input reads a context with each reply (as one text): it is counted for every distinct pair, and a pair
    given twice once."""
    stand_in = Recording(input_mode="prompt")
    per_pair = _Reading.of(stand_in).context(LONG_CONTEXT) + len(CANDIDATES[0])
    assert WINDOW // 2 < per_pair - len(CANDIDATES[0]) <= WINDOW
    contexts = [LONG_CONTEXT] * 40
    batches = batched(stand_in, contexts, CANDIDATES[:40], max_batch_pairs=256, max_batch_chars=10 * per_pair + 5)[1]
    assert batches == [10, 10, 10, 10]
    same = batched(Recording(input_mode="prompt"), contexts, CANDIDATES[:1] * 40, max_batch_chars=10 * per_pair)[1]
    assert same == [40]


def test_a_shared_context_is_counted_again_in_each_scoring_block(monkeypatch):
    """The scorer encodes each ``SCORE_BLOCK`` pairs of a call apart: a shared context is counted once per block."""
    monkeypatch.setattr(batching, "SCORE_BLOCK", 4)
    stand_in = Recording()
    context = _Reading.of(stand_in).context(LONG_CONTEXT)
    limit = 2 * context + 8 * len(CANDIDATES[0])
    assert batched(stand_in, [LONG_CONTEXT] * 20, CANDIDATES[:20], max_batch_chars=limit)[1] == [8, 8, 4]


def test_a_scorer_without_an_encoder_has_every_pair_counted_whole():
    """A stand-in scorer (no encoder ``max_length``): its texts are counted whole for every pair, as before."""

    class Plain:
        def __init__(self) -> None:
            self.batches: list[int] = []

        def score(self, contexts, responses, progress=False):
            self.batches.append(len(contexts))
            return np.zeros(len(contexts))

    plain = Plain()
    batcher = MicroBatcher(plain, max_wait_ms=50, max_batch_chars=250)
    try:
        batcher.score(["c" * 100] * 3, ["hello"] * 3, timeout=30)
    finally:
        batcher.close(10)
    assert plain.batches == [2, 1]
