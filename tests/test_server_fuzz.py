"""Property-based bad input for every endpoint: arbitrary JSON, wrong types, mismatched lengths, huge, binary.

Whatever arrives, the server answers a 4xx with a message or a complete 200, never a 5xx, and keeps serving.
Run with ``-s`` to see how many requests of each kind were sent.
"""

import math
from collections import Counter

import pytest
from conftest import http
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SENT: Counter = Counter()
FUZZ = settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True, database=None
)

CLEAN = st.one_of(
    st.text(max_size=40),
    st.text(st.characters(codec="utf-8", exclude_categories=()), max_size=20),
    st.sampled_from(["", " \n\t ", "\x00\x01", "🙂" * 50, "x" * 20_000]),
)
TEXT = st.one_of(
    CLEAN, st.text(st.characters(codec=None, exclude_categories=()), max_size=20), st.characters(categories=["Cs"])
)  # a lone surrogate
TEMPLATED = st.builds(
    lambda u, a: f"<|im_start|>user\n{u}<|im_end|>\n<|im_start|>assistant\n{a}<|im_end|>", CLEAN, CLEAN
)
MOSTLY_CLEAN = st.one_of(CLEAN, CLEAN, CLEAN, TEXT)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)
MESSAGES = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "system", "tool", "x"]), "content": st.one_of(TEXT, JSON)}
    ),
    max_size=4,
)
HUGE = st.sampled_from(
    [
        {"pairs": [{"context": "x" * 300_000, "response": "y"}]},
        {"pairs": [{"context": "a", "response": "b"}] * 65},
        {"query": ["q"] * 65},
        {"context": "c", "candidates": ["r"] * 65},
    ]
)

SCORE = st.one_of(
    JSON,
    HUGE,
    st.fixed_dictionaries(
        {
            "pairs": st.one_of(
                JSON,
                st.lists(
                    st.one_of(
                        JSON,
                        st.fixed_dictionaries({"context": st.one_of(TEXT, JSON), "response": st.one_of(TEXT, JSON)}),
                    ),
                    max_size=6,
                ),
            )
        }
    ),
)
GET_REWARD = st.one_of(
    JSON,
    HUGE,
    st.fixed_dictionaries(
        {"query": st.one_of(JSON, st.lists(st.one_of(TEXT, TEMPLATED), max_size=5))},
        optional={
            "prompts": st.one_of(JSON, st.lists(st.one_of(TEXT, st.none()), max_size=5)),
            "labels": st.one_of(JSON, st.lists(JSON, max_size=5)),
        },
    ),
)
RERANK = st.one_of(
    JSON,
    HUGE,
    st.fixed_dictionaries(
        {
            "context": st.one_of(TEXT, MESSAGES, JSON),
            "candidates": st.one_of(JSON, st.lists(st.one_of(TEXT, MESSAGES), max_size=5)),
        },
        optional={"top_k": st.one_of(st.integers(-2, 8), JSON)},
    ),
)


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    lines = [f"  {path} -> {status}: {n}" for (path, status), n in sorted(SENT.items())]
    print(f"\nserver fuzz: {sum(SENT.values())} requests\n" + "\n".join(lines))


def _check(server, path: str, body, expect_len) -> None:
    status, answer = http(server.url, "POST", path, body)
    SENT[(path, status)] += 1
    assert status < 500, answer
    assert isinstance(answer, dict)
    if status >= 400:
        assert answer["status"] == status and isinstance(answer["error"], str) and answer["error"]
        return
    n, values = expect_len(body), answer[{"/score": "scores", "/get_reward": "rewards", "/rerank": "scores"}[path]]
    assert len(values) == n
    assert all(v is None or (isinstance(v, float) and math.isfinite(v)) for v in values)
    if path == "/get_reward":
        assert len(answer["scores"]) == n and all(0 <= s <= 1 for s in answer["scores"])


@FUZZ
@given(body=SCORE)
def test_score_survives_anything(reward_server, body):
    _check(reward_server, "/score", body, lambda b: len(b["pairs"]))


@FUZZ
@given(body=GET_REWARD)
def test_get_reward_survives_anything(reward_server, body):
    _check(reward_server, "/get_reward", body, lambda b: len(b["query"]))


@FUZZ
@given(body=RERANK)
def test_rerank_survives_anything(reward_server, body):
    _check(reward_server, "/rerank", body, lambda b: len(b["candidates"]))


def _has_surrogate(*texts) -> bool:
    return any(0xD800 <= ord(ch) <= 0xDFFF for t in texts if isinstance(t, str) for ch in t)


def _well_typed(server, path: str, body: dict, texts: list, key: str) -> None:
    """A well-formed body is answered 200 with one float per item, unless a text holds a lone surrogate (422); on
    /score, a pair the reward path cannot read (no visible context or reply) scores null."""
    status, answer = http(server.url, "POST", path, body)
    SENT[(f"{path} well-typed", status)] += 1
    assert status == (422 if _has_surrogate(*texts) else 200), answer
    if status == 200:
        assert len(answer[key]) == len(texts) // (2 if path == "/score" else 1)
        if path == "/score":  # read as the reward path reads it: a pair without a context or a reply scores null
            valid = server.api.pair_path.texts(texts[0::2], texts[1::2]).valid
            shown = [i in valid for i in range(len(answer[key]))]
        else:
            shown = [True] * len(answer[key])
        assert all(isinstance(x, float) == show for x, show in zip(answer[key], shown, strict=True))


@FUZZ
@given(pairs=st.lists(st.tuples(MOSTLY_CLEAN, MOSTLY_CLEAN), max_size=8))
def test_well_typed_unicode_is_scored(reward_server, pairs):
    body = {"pairs": [{"context": c, "response": r} for c, r in pairs]}
    _well_typed(reward_server, "/score", body, [t for p in pairs for t in p], "scores")


@FUZZ
@given(queries=st.lists(st.one_of(MOSTLY_CLEAN, TEMPLATED), max_size=6), with_prompts=st.booleans())
def test_well_typed_queries_get_one_reward_each(reward_server, queries, with_prompts):
    body = {"query": queries, "prompts": [q[: len(q) // 2] for q in queries] if with_prompts else None}
    _well_typed(reward_server, "/get_reward", body, queries, "rewards")


@FUZZ
@given(
    path=st.sampled_from(["/score", "/get_reward", "/rerank", "/health", "/x"]),
    data=st.binary(max_size=300),
    method=st.sampled_from(["POST", "GET", "PUT"]),
)
def test_any_bytes_get_an_answer(reward_server, path, data, method):
    status, answer = http(reward_server.url, method, path, data)
    SENT[(f"{method} {path} (bytes)", status)] += 1
    assert status < 500 and isinstance(answer, dict)


HOSTILE = [
    ("/score", b"{not json"),
    ("/score", b"\xff\xfe\xfa"),
    ("/score", b'{"pairs": [{"context": "\\ud800", "response": "x"}]}'),
    ("/score", {"pairs": [{"context": "x" * 300_000, "response": "y"}]}),
    ("/get_reward", {"query": [None], "prompts": 5}),
    ("/rerank", {"context": "[" * 600 + "]" * 600, "candidates": [{"role": "x"}], "top_k": -1}),
]


def test_the_server_is_still_healthy_and_never_answered_5xx(reward_server):
    """On its own too: hostile requests of its own first, each answered 4xx, then the server's own count of what it
    answered (the fuzz tests' requests included, when they ran) holds no 5xx."""
    for path, body in HOSTILE:
        status, answer = http(reward_server.url, "POST", path, body)
        SENT[(f"{path} hostile", status)] += 1
        assert 400 <= status < 500 and answer["status"] == status and answer["error"], (path, answer)
    status, health = http(reward_server.url, "GET", "/health")
    assert status == 200 and health["status"] == "ok"
    assert sum(n for code, n in health["responses"].items() if 400 <= int(code) < 500) >= len(HOSTILE)  # counted
    assert not [code for code in health["responses"] if int(code) >= 500]
