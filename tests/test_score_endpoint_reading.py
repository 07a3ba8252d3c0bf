"""The server's ``/score`` reads a pair as ``pmi-reward score``, ``PMIReward`` and ``/rerank`` read it.

Before, ``/score`` only cut texts to ``max_chars``: a whole dialogue was scored as context (not the scorer's newest
``context_turns`` lines), a reply's ``<think>`` block was scored with its answer, and a blank context got a number
where every other entry point gives null (review 29, oddtext finding 1). ``RemotePMIReward`` reads its texts before
it calls ``/score``; read again by the server they must score the same, and ``"as_given": true`` scores pairs as they
are sent (a client that read them under other settings).
"""

from __future__ import annotations

import json
import math

import pytest
from conftest import http

from pmi_reward.cli.main import main
from pmi_reward.rewards.options import RewardOptions
from pmi_reward.rewards.path import RewardPath
from pmi_reward.rewards.remote import RemotePMIReward
from pmi_reward.rewards.reward import PMIReward
from pmi_reward.scoring.scorer import PMIScorer
from pmi_reward.serving.server import RewardServer, ServerConfig

LONG = "I moved to Paris.\nNice!\nI hate the metro.\nWhy?\nIt is always late.\nSo what do you do?"  # 6 turns
ROWS = [
    (LONG, "I cycle to work now."),
    (
        "I love jazz.",
        "<think>The user likes jazz; I should ask about musicians, records and concerts.</think>"
        "Who is your favourite player?",
    ),
    ("   \n\t ", "hello there"),  # whitespace only: no context
    ("", "hello there"),
    ("I love jazz.", "<think>still thinking about"),  # unfinished reasoning: no reply
    ("<think>plan a reply</think>I love jazz.\nWho do you like?", "Coltrane!"),  # reasoning in a context line
    ("What did you cook tonight?", "Pasta with basil."),
]


def _score(url: str, rows: list[tuple[str, str]], **extra) -> list[float | None]:
    status, answer = http(url, "POST", "/score", {"pairs": [{"context": c, "response": r} for c, r in rows], **extra})
    assert status == 200, answer
    return answer["scores"]


def _same(got: list[float | None], expected: list[float | None], abs_tol: float = 1e-5) -> None:
    """None in the same places, the numbers equal up to float32 noise (the server batches pairs its own way)."""
    assert [g is None for g in got] == [e is None for e in expected], (got, expected)
    assert [0.0 if g is None else g for g in got] == pytest.approx(
        [0.0 if e is None else e for e in expected], abs=abs_tol
    )


def test_score_reads_pairs_as_pmireward_rerank_and_the_cli(spread_server, spread_scorer, tmp_path, monkeypatch):
    contexts, responses = [c for c, _ in ROWS], [r for _, r in ROWS]
    score = _score(spread_server.url, ROWS)
    in_process = PMIReward(spread_scorer, empty_score=None)(contexts, responses)
    rerank = [
        http(spread_server.url, "POST", "/rerank", {"context": c, "candidates": [r]})[1]["scores"][0] for c, r in ROWS
    ]
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"context": c, "response": r}) + "\n" for c, r in ROWS))
    monkeypatch.setattr(PMIScorer, "from_pretrained", lambda *args, **kwargs: spread_scorer)
    out = tmp_path / "scored.jsonl"
    argv = ["score", "--scorer", str(tmp_path), "--input", str(rows), "--output", str(out), "--progress", "false"]
    assert main(argv) == 0
    cli = [json.loads(line)["pmi"] for line in out.read_text().splitlines()]

    _same(score, in_process)
    _same(score, rerank)
    _same(score, cli, abs_tol=1e-5)
    assert score[2] is None and score[3] is None  # a blank context is no context, as everywhere else
    assert score[4] is None  # the reply is unfinished reasoning
    # the reading is what moved the scores: the newest 3 of the 6 turns, the answer without its reasoning
    assert spread_scorer.context_turns == 3
    newest = spread_scorer.score(["Why?\nIt is always late.\nSo what do you do?"], [ROWS[0][1]])
    whole = spread_scorer.score([LONG], [ROWS[0][1]])
    assert score[0] == pytest.approx(float(newest[0]), abs=1e-5) and abs(float(whole[0] - newest[0])) > 1e-3
    answer = spread_scorer.score(["I love jazz."], ["Who is your favourite player?"])
    with_reasoning = spread_scorer.score(["I love jazz."], [ROWS[1][1]])
    assert score[1] == pytest.approx(float(answer[0]), abs=1e-5) and abs(float(with_reasoning[0] - answer[0])) > 1e-3
    assert all(s is None or math.isfinite(s) for s in score)


PROMPTS = [
    LONG,
    "<think>plan</think>I love jazz.\nWho do you like?",
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "I got a dog\nyesterday."},
        {"role": "assistant", "content": "<think>ask about it</think>What breed?"},
        {"role": "user", "content": "A beagle."},
        {"role": "assistant", "content": "Cute!"},
        {"role": "user", "content": "He chews everything."},
    ],
    "   ",
    "What did you cook tonight?",
    [{"role": "user", "content": "I love jazz."}],
]
COMPLETIONS = [
    "I cycle to work now, mostly along the river.",
    "<think>they like jazz</think>Who is your favourite player?",
    [{"role": "assistant", "content": "<think>puppies chew</think>Try a chew toy."}],
    "hello there",
    "They all go to bed early.</think>Pasta with basil.",
    [{"role": "assistant", "reasoning_content": "jazz again", "content": "Coltrane!"}],
]


@pytest.mark.parametrize(
    "options",
    [
        RewardOptions(),
        RewardOptions(think_opened=True),
        RewardOptions(include_system=True),
        RewardOptions(max_context_turns=2),
        RewardOptions(max_context_turns=3, max_chars=30),  # contexts cut inside a line, replies inside a word
        RewardOptions(center="group", empty_score=None),
    ],
    ids=["defaults", "think-opened", "system", "two-turns", "max-chars-30", "group-none"],
)
def test_remote_rewards_are_unchanged_by_the_servers_reading(spread_server, spread_scorer, options):
    """``RemotePMIReward`` sends texts it has read already (turns cut, reasoning gone, ``max_chars`` cut); the
    server's reading of them changes nothing: the rewards are ``PMIReward``'s, and each pair scores as sent."""
    prompts, completions = PROMPTS, COMPLETIONS
    if options.center == "group":
        prompts, completions = [PROMPTS[0]] * 3 + [PROMPTS[2]] * 3, COMPLETIONS[:3] + COMPLETIONS[3:]
    local = PMIReward(spread_scorer, options)(prompts, completions)
    remote = RemotePMIReward(spread_server.url, options, on_failure="raise").score_sync(prompts, completions)
    _same(remote, local)
    assert sum(r is not None for r in remote) >= 3
    sent = RewardPath(options.resolved(spread_scorer.context_turns)).texts(prompts, completions)
    pairs = list(zip(*sent.pairs(), strict=True))
    _same(_score(spread_server.url, pairs), _score(spread_server.url, pairs, as_given=True))


def test_score_reads_with_the_servers_turns_and_reasoning_settings(spread_scorer):
    """A server started with ``--max_context_turns 2 --strip_think false --think_opened true``: ``/score`` reads as
    its ``/rerank`` does (two turns, reasoning scored), but a response is a whole reply (no prompt says a block was
    opened), so a ``RemotePMIReward`` with the server's settings gets ``PMIReward``'s rewards."""
    options = RewardOptions(max_context_turns=2, strip_think=False, think_opened=True)
    server = RewardServer(spread_scorer, ServerConfig(port=0), options).start()
    try:
        rows = [(LONG, "I cycle to work now."), ("I love jazz.", "<think>hmm</think>Coltrane!"), ("Hi", "Hello!")]
        got = _score(server.url, rows)
        expected = spread_scorer.score(
            ["It is always late.\nSo what do you do?", "I love jazz.", "Hi"], [r for _, r in rows]
        )
        _same(got, expected.tolist())
        remote_options = RewardOptions(max_context_turns=2, strip_think=False)
        remote = RemotePMIReward(server.url, remote_options, on_failure="raise").score_sync(PROMPTS, COMPLETIONS)
        _same(remote, PMIReward(spread_scorer, remote_options)(PROMPTS, COMPLETIONS))
    finally:
        server.close()


def test_as_given_scores_pairs_as_sent(spread_server, spread_scorer):
    """``"as_given": true``: only the ``max_chars`` cut, as ``/score`` read before; for a client that read its texts
    under other settings (here: every turn, reasoning kept, a user's literal ``<think>``), whose texts the server's
    reading would change."""
    options = RewardOptions(max_context_turns=8, strip_think=False)
    prompts = [LONG, [{"role": "user", "content": "What is the <think> tag for?"}], "I love jazz.", "Hi"]
    completions = ["I cycle to work now.", "It marks reasoning.", "<think>hmm</think>Coltrane!", "\u200b"]
    sent = RewardPath(options).texts(prompts, completions)
    pairs = list(zip(*sent.pairs(), strict=True))
    assert [c for c, _ in pairs] == [LONG, "What is the <think> tag for?", "I love jazz."]  # as the client read them
    expected = spread_scorer.score(*sent.pairs()).tolist()
    _same(_score(spread_server.url, pairs, as_given=True), expected)
    blank = float(spread_scorer.score(["   "], ["hello"])[0])  # scored as sent, as /score did before
    _same(_score(spread_server.url, [("   ", "hello"), ("Hi", "\u200b")], as_given=True), [blank, None])
    status, answer = http(spread_server.url, "POST", "/score", {"pairs": [], "as_given": "yes"})
    assert status == 422 and "'as_given' must be true or false, got str" in answer["error"]
