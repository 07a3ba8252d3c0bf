"""The verl adapter, called exactly as verl calls a ``custom_reward_function`` (verl itself is not installed).

The calling code below is verl's, copied as it stands at b178a3c (v0.7.0 + 125 commits; the same at v0.7.0):
``verl/utils/import_utils.py`` ``load_module`` / ``load_extern_object`` load the file by path or ``pkg://``;
``verl/trainer/ppo/reward.py`` ``get_custom_reward_fn`` wraps it with ``reward_kwargs``; then
- the reward loop (default since 0.7): ``verl/experimental/reward_loop/reward_manager/naive.py``
  ``NaiveRewardManager.run_single``: one sample per call, keyword arguments, sync functions run in the event
  loop's default thread pool, many samples at once;
- legacy ``naive`` (``use_reward_loop: false``): ``verl/workers/reward_manager/naive.py``, a loop of calls;
- legacy ``batch``: ``verl/workers/reward_manager/batch.py`` ``BatchRewardManager.verify``, numpy object arrays.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import numpy as np
import pytest
import torch

import pmi_reward.rewards.verl as verl_adapter
from pmi_reward.data.conversation import clean_reply
from pmi_reward.rewards.options import RewardOptions
from pmi_reward.rewards.path import GroupError, RewardPath
from pmi_reward.rewards.remote import RemotePMIReward
from pmi_reward.rewards.reward import PMIReward

CONTEXT = "I love jazz.\nMe too!\nWho is your favourite?"
MESSAGES = [
    {"role": "user", "content": "I love jazz."},
    {"role": "assistant", "content": "Me too!"},
    {"role": "user", "content": "Who is your favourite?"},
]


# -- upstream loading code (verl @ b178a3c) -----------------------------------------------------------------------
def load_module(module_path: str) -> object:
    """``verl/utils/import_utils.py`` ``load_module`` (lines 87-128), ``module_name=None``."""
    if module_path.startswith("pkg://"):
        return importlib.import_module(module_path[len("pkg://") :].replace("/", "."))
    if module_path.startswith("file://"):
        module_path = module_path[len("file://") :]
    spec_name = f"custom_module_{hash(os.path.abspath(module_path))}"
    spec = importlib.util.spec_from_file_location(spec_name, module_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _call_with_kwargs(raw_fn, extra_kwargs, *args, **kwargs):
    """``verl/trainer/ppo/reward.py`` (lines 42-48): ``reward_kwargs`` override call-time kwargs."""
    merged_kwargs = {**kwargs, **extra_kwargs}
    return raw_fn(*args, **merged_kwargs)


def get_custom_reward_fn(path: str, name: str, reward_kwargs: dict):
    """``get_custom_reward_fn`` (lines 60-96) for a sync function."""
    raw_fn = getattr(load_module(path), name)
    return partial(_call_with_kwargs, raw_fn, dict(reward_kwargs))


def _row(extra_info) -> dict:
    """One row's ``non_tensor_batch`` as the RL dataset makes it from parquet."""
    return {"data_source": "chitchat", "reward_model": {"ground_truth": ""}, "extra_info": extra_info}


async def run_single(compute_score, row: dict, response_str: str, loop) -> dict:
    """``NaiveRewardManager.run_single`` (reward loop, lines 34-99) after decoding, without a reward model. The agent
    loop's ``extra_fields`` (``raw_prompt`` among them, agent_loop.py line 523) come as ``tool_extra_fields``."""
    data_source = row["data_source"]
    ground_truth = row["reward_model"]["ground_truth"]
    extra_info = row.get("extra_info", {})
    tool_extra_fields = row.get("tool_extra_fields")
    if tool_extra_fields is not None:
        extra_info.update(tool_extra_fields.items())
    extra_info["num_turns"] = None
    extra_info["rollout_reward_scores"] = {}
    result = await loop.run_in_executor(
        None,
        lambda: compute_score(
            data_source=data_source, solution_str=response_str, ground_truth=ground_truth, extra_info=extra_info
        ),
    )
    reward_extra_info = {}
    if isinstance(result, dict):
        score = result["score"]
        for key, value in result.items():
            reward_extra_info[key] = value
    else:
        score = result
        reward_extra_info["acc"] = score
    return {"reward_score": score, "reward_extra_info": reward_extra_info}


def reward_loop(compute_score, rows: list[dict], responses: list[str]) -> list[dict]:
    """The agent loop sends every finished sample to the reward loop on its own (agent_loop.py, lines 701-730)."""

    async def all_samples():
        loop = asyncio.get_running_loop()
        return await asyncio.gather(
            *(run_single(compute_score, r, s, loop) for r, s in zip(rows, responses, strict=True))
        )

    return asyncio.run(all_samples())


def legacy_naive(compute_score, rows: list[dict], responses: list[str]) -> list[float]:
    """``verl/workers/reward_manager/naive.py`` ``__call__`` (lines 59-101), the per-sample loop."""
    rewards = []
    for row, response_str in zip(rows, responses, strict=True):
        extra_info = row.get("extra_info", {})
        extra_info["num_turns"] = None
        extra_info["rollout_reward_scores"] = {}
        score = compute_score(
            data_source=row["data_source"],
            solution_str=response_str,
            ground_truth=row["reward_model"]["ground_truth"],
            extra_info=extra_info,
        )
        rewards.append(score["score"] if isinstance(score, dict) else score)
    return rewards


def legacy_batch(compute_score, rows: list[dict], responses: list[str], manager_kwargs: dict) -> list[float]:
    """``BatchRewardManager.verify`` + ``__call__`` (batch.py, lines 47-103): numpy object arrays in."""
    ground_truths = [row["reward_model"].get("ground_truth", None) for row in rows]
    data_sources = np.array([row["data_source"] for row in rows], dtype=object)
    extras = np.array([row["extra_info"] for row in rows], dtype=object)
    for i in range(len(rows)):
        extras[i]["rollout_reward_scores"] = {}
    scores = compute_score(
        data_sources=data_sources, solution_strs=responses, ground_truths=ground_truths, extra_infos=extras,
        **manager_kwargs,
    )  # fmt: skip
    return [score["score"] if isinstance(score, dict) else score for score in scores]


# -- tests ----------------------------------------------------------------------------------------------------------
PATHS = [verl_adapter.__file__, "pkg://pmi_reward.rewards.verl"]


@pytest.mark.parametrize("path", PATHS)
def test_signatures_follow_verl(path):
    module = load_module(path)
    assert list(inspect.signature(module.compute_score).parameters)[:4] == [
        "data_source", "solution_str", "ground_truth", "extra_info",
    ]  # fmt: skip
    assert list(inspect.signature(module.compute_score_batch).parameters)[:4] == [
        "data_sources", "solution_strs", "ground_truths", "extra_infos",
    ]  # fmt: skip
    assert not inspect.iscoroutinefunction(module.compute_score)  # the legacy naive manager cannot await


def _rows() -> list[dict]:
    return [
        _row({"context": CONTEXT, "index": 0}),
        _row({"messages": np.array(MESSAGES, dtype=object)}),  # parquet gives lists back as numpy arrays
        _row({"history": np.array(["I love jazz.", "Me too!", "Who is your favourite?"], dtype=object)}),
        _row({"prompt": CONTEXT}),
        _row({"index": 3, "split": "train"}),  # no conversation: empty_score, flagged
    ]


RESPONSES = ["Coltrane, for sure.", "Miles Davis.<|im_end|>", "ok", "", "Coltrane."]


def _expected(scorer, **options) -> list[float]:
    """PMIReward's rewards for ``_rows()`` and ``RESPONSES``; on ``spread_scorer`` the scored ones differ, so that a
    reward handed to the wrong row would show."""
    contexts = [CONTEXT] * 4 + [None]
    rewards = PMIReward(scorer, **options)(contexts, ["Coltrane, for sure.", "Miles Davis.", "ok", "", "Coltrane."])
    assert len({round(r, 4) for r in rewards[:3]}) == 3
    return rewards


@pytest.mark.parametrize("path", PATHS)
def test_reward_loop(spread_server, spread_scorer, path, caplog):
    fn = get_custom_reward_fn(path, "compute_score", {"url": spread_server.url, "empty_score": -1.0})
    with caplog.at_level(logging.DEBUG, logger="pmi_reward"):  # a warning the first time, then debug
        results = reward_loop(fn, _rows(), RESPONSES)
    expected = _expected(spread_scorer, empty_score=-1.0)
    assert [r["reward_score"] for r in results] == pytest.approx(expected, abs=1e-5)
    # verl makes a column of each result key, from the first sample's keys: every result has the same ones
    assert all(set(r["reward_extra_info"]) == {"score", "pmi_no_context"} for r in results)
    assert [r["reward_extra_info"]["pmi_no_context"] for r in results] == [0.0, 0.0, 0.0, 0.0, 1.0]
    assert "without a readable conversation in extra_info" in caplog.text and "'index', 'num_turns'" in caplog.text


def _agent_row(raw_prompt, extra_info: dict | None = None) -> dict:
    """A row of verl's standard data layout (the conversation in the ``prompt`` column, ``extra_info`` holding only
    what verl's data recipes put there) as the reward loop gets it: the agent loop keeps the row's ``raw_prompt``
    (``RLHFDataset.__getitem__``: the ``prompt`` column's messages) in its output's ``extra_fields``
    (``_agent_loop_postprocess``, agent_loop.py line 523) and hands them on as ``tool_extra_fields`` (line 721)."""
    return {**_row(extra_info or {"split": "train", "index": 0}), "tool_extra_fields": {"raw_prompt": raw_prompt}}


def test_reward_loop_reads_the_prompt_verl_passes(spread_server, spread_scorer):
    """verl >= 0.7's reward loop passes the row's prompt messages as ``extra_info["raw_prompt"]``; with only that, every
    row got empty_score (a constant reward). A conversation the row itself carries in ``extra_info`` comes first."""
    system = {"role": "system", "content": "Be nice."}
    parts = [{**m, "content": [{"type": "text", "text": m["content"]}]} for m in MESSAGES]  # a multimodal dataset
    rows = [
        _agent_row([system, *MESSAGES]),
        _agent_row(np.array([system, *MESSAGES], dtype=object)),  # non_tensor_batch values may be numpy arrays
        _agent_row([system, *parts]),
        _agent_row([system, {"role": "user", "content": "Hello?"}], {"context": CONTEXT}),  # the row's own first
        _agent_row([]),  # no conversation anywhere: empty_score, flagged
    ]
    fn = get_custom_reward_fn(PATHS[1], "compute_score", {"url": spread_server.url, "empty_score": -1.0})
    responses = ["Coltrane, for sure.", "Miles Davis.<|im_end|>", "ok", "Coltrane.", "Coltrane."]
    got = reward_loop(fn, rows, responses)
    expected = PMIReward(spread_scorer, empty_score=-1.0)([CONTEXT] * 4 + [None], [clean_reply(r) for r in responses])
    assert len({round(r, 4) for r in expected[:4]}) == 4  # the rows score apart: a mixed-up answer would show
    # row 3's raw_prompt ("Hello?") would score another reward than its own context, which comes first
    assert abs(PMIReward(spread_scorer)(["Hello?"], ["Coltrane."])[0] - expected[3]) > 1e-3
    assert [r["reward_score"] for r in got] == pytest.approx(expected, abs=1e-5)
    assert [r["reward_extra_info"]["pmi_no_context"] for r in got] == [0.0, 0.0, 0.0, 0.0, 1.0]
    assert verl_adapter.context_of(rows[3]["extra_info"]) == CONTEXT


def test_raw_prompt_reads_as_any_prompt(tiny_scorer):
    """``raw_prompt`` goes to the reward path as messages: its system message is a turn only with ``include_system``,
    and a chat-templated string is parsed rather than read one line per turn."""
    raw = np.array([{"role": "system", "content": "Be nice."}, *MESSAGES], dtype=object)
    context = verl_adapter.context_of({"split": "train", "index": 0, "raw_prompt": raw})
    for include_system, expected in ((False, CONTEXT), (True, "Be nice.\n" + CONTEXT)):
        texts = PMIReward(tiny_scorer, include_system=include_system, max_context_turns=4).texts([context], ["Hi."])
        assert texts.contexts == [expected]
    templated = "<|im_start|>system\nBe nice.<|im_end|>\n<|im_start|>user\nI love jazz.<|im_end|>\n"
    assert PMIReward(tiny_scorer).texts([verl_adapter.context_of({"raw_prompt": templated})], ["Hi."]).contexts == [
        "I love jazz."
    ]
    assert verl_adapter.context_of({"raw_prompt": np.array([], dtype=object), "prompt": ""}) is None


def test_a_raw_prompt_whose_template_opens_think_reads_the_reply_as_reasoning(tiny_scorer):
    """A templated ``raw_prompt`` whose generation prompt opens ``<think>`` (R1 distills, Qwen3.5): its ``<think>``
    was an assistant turn of the context, and a reply cut inside its reasoning was scored as an answer. Read as the
    reward path reads such a string, the opened block is the reply's: no turn, and a reply without ``</think>`` is
    unfinished reasoning (``empty_score``)."""
    opened = "<|im_start|>user\nI love jazz.<|im_end|>\n<|im_start|>assistant\n<think>\n"
    context = verl_adapter.context_of({"raw_prompt": opened})
    reward = PMIReward(tiny_scorer, empty_score=-5.0)
    assert reward.texts([context], ["Hi."]).contexts == ["I love jazz."]
    logged: dict = {}
    scores = reward(
        [context, context], ["They like jazz, so", "They like jazz.</think>Coltrane!"], log_metric=logged.setdefault
    )
    assert scores[0] == -5.0 and scores[1] != -5.0
    assert logged["pmi_reward/think_unfinished_frac"] == 0.5


def test_reward_loop_refuses_group_centring(reward_server):
    fn = get_custom_reward_fn(PATHS[1], "compute_score", {"url": reward_server.url, "center": "group"})
    with pytest.raises(GroupError, match="verl's reward loop"):
        reward_loop(fn, _rows()[:1], RESPONSES[:1])


def test_legacy_naive(spread_server, spread_scorer):
    fn = get_custom_reward_fn(PATHS[0], "compute_score", {"url": spread_server.url})
    assert legacy_naive(fn, _rows(), RESPONSES) == pytest.approx(_expected(spread_scorer), abs=1e-5)


@pytest.mark.parametrize("center", ["none", "group"])
def test_legacy_batch(spread_server, spread_scorer, center):
    """``custom_reward_function.reward_kwargs`` through the partial, ``reward_model.reward_kwargs`` from the manager."""
    fn = get_custom_reward_fn(PATHS[0], "compute_score_batch", {"url": spread_server.url})
    other = "Did you watch the match?"  # a second group, whose mean differs from the first's
    # verl repeats a row for each sample of its group: one conversation in one form (a group is keyed on the prompt as
    # given, so the forms of _rows() are four groups under center="group")
    first = _rows() if center == "none" else [*[_row({"context": CONTEXT})] * 4, _rows()[4]]
    rows = [*first, _row({"context": other}), _row({"context": other})]
    got = legacy_batch(fn, rows, [*RESPONSES, "Yes, what a goal!", "No."], {"center": center})
    contexts = [CONTEXT] * 4 + [None, other, other]
    replies = ["Coltrane, for sure.", "Miles Davis.", "ok", "", "Coltrane.", "Yes, what a goal!", "No."]
    raw = np.array(PMIReward(spread_scorer)(contexts, replies))
    scored = [0, 1, 2, 5, 6]
    assert len(set(np.round(raw[scored], 4))) == 5 and abs(raw[:3].mean() - raw[5:].mean()) > 1e-2
    assert got == pytest.approx(PMIReward(spread_scorer, center=center)(contexts, replies), abs=1e-5)
    if center == "group":  # the first four rows share a conversation: a group, centred on its scored replies
        expected = np.r_[raw[:3] - raw[:3].mean(), -5.0, -5.0, raw[5:] - raw[5:].mean()]
        assert got == pytest.approx(expected.tolist(), abs=1e-5)
    else:
        assert got == pytest.approx(raw.tolist(), abs=1e-5)


def test_settings_errors(reward_server, monkeypatch):
    monkeypatch.delenv("PMI_REWARD_URL", raising=False)
    monkeypatch.delenv("PMI_REWARD_SCORER", raising=False)
    with pytest.raises(ValueError, match="exactly one of url"):
        verl_adapter.compute_score("d", "x", None, {"context": "c"})
    with pytest.raises(ValueError, match="empty_score cannot be None"):
        verl_adapter.compute_score("d", "x", None, {"context": "c"}, url=reward_server.url, empty_score=None)
    with pytest.raises(ValueError, match="2 responses but 1 extra_infos"):
        verl_adapter.compute_score_batch(["d"], ["x", "y"], [None], [{}], url=reward_server.url)
    monkeypatch.setenv("PMI_REWARD_URL", reward_server.url)
    assert isinstance(verl_adapter.compute_score("d", "x", None, {"context": "c"})["score"], float)
    # reward_kwargs win over the environment ($PMI_REWARD_URL is what OpenRLHF's shim reads on the same workers):
    # a scorer given there was "exactly one of url or scorer" refused
    verl_adapter._load_reward.cache_clear()
    try:
        got = verl_adapter.compute_score("d", "x", None, {"context": "c"}, scorer="/no/such/scorer")
    except Exception as err:  # the kwargs' scorer was chosen: it does not exist
        assert "exactly one" not in str(err) and "no/such/scorer" in str(err)
    else:
        raise AssertionError(f"the environment's server answered {got}")
    finally:
        verl_adapter._load_reward.cache_clear()
    monkeypatch.setenv("PMI_REWARD_SCORER", "/no/such/scorer")
    with pytest.raises(ValueError, match=r"the environment \(\$PMI_REWARD_URL, \$PMI_REWARD_SCORER\) gave both"):
        verl_adapter.compute_score("d", "x", None, {"context": "c"})


def test_in_process_reward_is_safe_from_a_thread_pool(tiny_scorer):
    """The reward loop calls sync functions from many threads at once; PMIReward takes turns on its scorer."""
    reward = PMIReward(tiny_scorer)
    jobs = [([CONTEXT, f"ctx {i}"], [f"reply {i}", f"another {i} " * (i % 7)]) for i in range(32)]
    serial = [reward(*job) for job in jobs]
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(lambda job: reward(*job), jobs)) == serial


@pytest.mark.integration
def test_compute_score_with_a_local_scorer_dir(tmp_path):
    from pmi_reward.scoring.encoder import EncoderSpec, TextEncoder
    from pmi_reward.scoring.head import HeadConfig, PMIHead
    from pmi_reward.scoring.scorer import PMIScorer
    from pmi_reward.scoring.templates import TEMPLATES

    encoder = TextEncoder(EncoderSpec("minilm"), device="cpu")
    torch.manual_seed(0)
    PMIScorer(encoder, TEMPLATES["en"], PMIHead(HeadConfig(dim=encoder.dim))).save_pretrained(tmp_path / "s")
    fn = get_custom_reward_fn(PATHS[1], "compute_score", {"scorer": str(tmp_path / "s"), "device": "cpu"})
    got = reward_loop(fn, [_row({"context": CONTEXT})] * 4, ["Coltrane.", "Miles.", "ok", "Coltrane."])
    expected = PMIReward.from_pretrained(tmp_path / "s", device="cpu")(
        [CONTEXT] * 4, ["Coltrane.", "Miles.", "ok", "Coltrane."]
    )
    assert [r["reward_score"] for r in got] == pytest.approx(expected, abs=1e-6)


def test_concurrent_first_calls_load_the_scorer_once(tiny_scorer, monkeypatch):
    """verl's reward loop calls compute_score from a thread pool; an unguarded cache miss loaded one scorer per
    thread at once (N copies on the device)."""
    import threading
    import time

    loads, lock = [], threading.Lock()

    def slow_load(*args, **kwargs):
        time.sleep(0.2)
        with lock:
            loads.append(1)
        return tiny_scorer

    monkeypatch.setattr(verl_adapter.PMIScorer, "from_pretrained", slow_load)
    verl_adapter._load_reward.cache_clear()
    with ThreadPoolExecutor(8) as pool:
        scores = list(
            pool.map(
                lambda i: verl_adapter.compute_score("d", f"reply {i}", None, {"context": CONTEXT}, scorer="s-once"),
                range(8),
            )
        )
    verl_adapter._load_reward.cache_clear()
    assert len(loads) == 1 and all(isinstance(s["score"], float) for s in scores)


def test_an_empty_context_field_is_no_conversation(tiny_scorer, monkeypatch):
    """A row whose context is blank is scored as missing (empty_score, flagged), not against an empty context."""
    monkeypatch.setattr(verl_adapter.PMIScorer, "from_pretrained", lambda *a, **k: tiny_scorer)
    verl_adapter._load_reward.cache_clear()
    blank = verl_adapter.compute_score("d", "Coltrane!", None, {"context": "  "}, scorer="s-blank")
    system_only = verl_adapter.compute_score(
        "d", "Coltrane!", None, {"prompt": [{"role": "system", "content": "Be brief."}]}, scorer="s-blank"
    )
    verl_adapter._load_reward.cache_clear()
    assert blank == {"score": -5.0, "pmi_no_context": 1.0} and system_only["score"] == -5.0


def test_rows_without_a_readable_turn_are_flagged_as_the_reward_path_reads_them(tiny_scorer, monkeypatch, caplog):
    """``pmi_no_context`` was ``context_of(...) is None``: a row whose conversation the reward path cannot read (a
    system message alone, an image-only user turn, a lone surrogate) got ``empty_score`` and the path's "no readable
    context" warning, but the flag said 0. The flag and the adapter's warning now follow the path's own reading."""
    monkeypatch.setattr(verl_adapter.PMIScorer, "from_pretrained", lambda *a, **k: tiny_scorer)
    monkeypatch.setattr(verl_adapter, "_warned", [])
    verl_adapter._load_reward.cache_clear()
    infos = [
        {"messages": [{"role": "system", "content": "You are helpful."}]},
        {"raw_prompt": np.array([{"role": "user", "content": [{"type": "image"}]}], dtype=object)},
        {"context": "\ud800"},
        {"messages": [{"role": "user", "content": "I love jazz."}]},
        {"split": "train"},
    ]
    with caplog.at_level(logging.WARNING, logger="pmi_reward.rewards.verl"):
        batch = verl_adapter.compute_score_batch(["d"] * 5, ["Me too, Coltrane!"] * 5, [None] * 5, infos, scorer="s-nc")
        one = [verl_adapter.compute_score("d", "Me too, Coltrane!", None, info, scorer="s-nc") for info in infos]
    verl_adapter._load_reward.cache_clear()
    assert [r["pmi_no_context"] for r in batch] == [1.0, 1.0, 1.0, 0.0, 1.0] and one == batch
    assert [r["score"] for r in batch if r["pmi_no_context"]] == [-5.0] * 4 and batch[3]["score"] != -5.0
    assert "4 of 5 responses come without a readable conversation" in caplog.text and "['messages']" in caplog.text


def _mixed_infos() -> list[dict]:
    """``extra_info`` of rows the flags must tell apart: read as they are, a system message skipped, none at all, a
    system message alone, and a lone surrogate in the oldest of four turns, which only the scorer's
    ``max_context_turns`` (3, learnt from the server by a remote reward on its first call) cuts away."""
    system = {"role": "system", "content": "Be nice."}
    return [
        {"context": CONTEXT, "index": 0},
        {"raw_prompt": np.array([system, *MESSAGES], dtype=object)},
        {"split": "train", "index": 2},
        {"messages": [system]},
        {"history": np.array(["\ud800", *CONTEXT.split("\n")], dtype=object)},
        {"messages": np.array(MESSAGES[:2], dtype=object)},
    ]


MIXED_RESPONSES = ["Coltrane, for sure.", "Miles Davis.<|im_end|>", "Monk.", "Coltrane.", "Monk!", "Me too."]


@pytest.mark.parametrize("where", ["scorer", "url"])
def test_a_call_builds_its_texts_once(where, spread_scorer, spread_server, monkeypatch):
    """compute_score_batch (and so compute_score) built the reward texts twice per call: once to score, once more
    only to learn which rows had no context (reading and cutting every context and reply again)."""
    built = []
    texts = RewardPath.texts
    monkeypatch.setattr(RewardPath, "texts", lambda self, *a: built.append(1) or texts(self, *a))
    monkeypatch.setattr(verl_adapter.PMIScorer, "from_pretrained", lambda *a, **k: spread_scorer)
    kwargs = {"scorer": "s-once-texts"} if where == "scorer" else {"url": spread_server.url}
    verl_adapter._load_reward.cache_clear()
    try:
        infos, n = _mixed_infos(), len(MIXED_RESPONSES)
        batch = verl_adapter.compute_score_batch(["d"] * n, MIXED_RESPONSES, [None] * n, infos, **kwargs)
        assert len(built) == 1 and [r["pmi_no_context"] for r in batch] == [0.0, 0.0, 1.0, 1.0, 0.0, 0.0]
        built.clear()
        verl_adapter.compute_score("d", MIXED_RESPONSES[0], None, infos[0], **kwargs)
        assert len(built) == 1
    finally:
        verl_adapter._load_reward.cache_clear()


@pytest.mark.parametrize("where", ["scorer", "url"])
def test_scores_and_flags_are_the_reward_path_s_own(where, spread_scorer, spread_server, monkeypatch):
    """Each result is, bit for bit, the reward's own reward for the row and its path's no-context flag, the flags read
    with the setting the rewards were computed with: a fresh remote reward learns ``max_context_turns`` from the
    server in its first call, and only with it is the surrogate row (4) readable (scored, not flagged)."""
    monkeypatch.setattr(verl_adapter.PMIScorer, "from_pretrained", lambda *a, **k: spread_scorer)
    kwargs = {"scorer": "s-own"} if where == "scorer" else {"url": spread_server.url}
    options = RewardOptions(empty_score=-1.0)
    infos, n = _mixed_infos(), len(MIXED_RESPONSES)
    contexts, replies = [verl_adapter.context_of(i) for i in infos], [clean_reply(r) for r in MIXED_RESPONSES]

    def expected(rows: slice) -> list[dict]:
        """What the reward itself says for ``rows`` (a reward of its own, fresh as the adapter's)."""
        if where == "url":
            remote = RemotePMIReward(spread_server.url, options, on_failure="raise")
            scores, reward = remote.score_sync(contexts[rows], replies[rows]), remote
        else:
            reward = PMIReward(spread_scorer, options)
            scores = reward(contexts[rows], replies[rows])
        missing = reward.texts(contexts[rows], replies[rows]).no_context
        return [{"score": s, "pmi_no_context": float(i in missing)} for i, s in enumerate(scores)]

    verl_adapter._load_reward.cache_clear()  # a fresh remote reward: it learns max_context_turns in this call
    try:
        batch = verl_adapter.compute_score_batch(
            ["d"] * n, MIXED_RESPONSES, [None] * n, infos, empty_score=-1.0, **kwargs
        )
        verl_adapter._load_reward.cache_clear()
        one = [
            verl_adapter.compute_score("d", r, None, i, empty_score=-1.0, **kwargs)
            for i, r in zip(infos, MIXED_RESPONSES, strict=True)
        ]
    finally:
        verl_adapter._load_reward.cache_clear()
    assert batch == expected(slice(None))
    assert one == [expected(slice(i, i + 1))[0] for i in range(n)]
    assert [r["pmi_no_context"] for r in batch] == [0.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    assert batch[4]["score"] != -1.0 and len({r["score"] for r in batch}) == 5  # the scored rows score apart


def test_the_missing_conversation_warning_is_recorded_once(monkeypatch):
    """``_warned`` grew by one entry on every call with a row lacking a conversation: for a whole run."""
    monkeypatch.setattr(verl_adapter, "_warned", [])
    for _ in range(50):
        verl_adapter._warn_missing({"index": 0}, 1, 1)
    assert verl_adapter._warned == [True]


def test_misspelt_reward_kwargs_are_warned_about_once(reward_server, monkeypatch, caplog):
    """A misspelt ``reward_kwargs`` key (``emtpy_score``, ``clip_range``, ``centre``) was dropped without a word; it
    is now named in a warning (once), not refused, and none of the keywords verl passes itself is warned about."""
    monkeypatch.setattr(verl_adapter, "_unknown_warned", set(), raising=False)
    typos = {"emtpy_score": -1.0, "clip_range": 2.0, "centre": "group"}
    verl_own = {"reward_router_address": "127.0.0.1:1", "reward_model_tokenizer": object(), "strict_box_verify": False}
    fn = get_custom_reward_fn(PATHS[0], "compute_score", {"url": reward_server.url, "clip": 2.0, **typos})
    with caplog.at_level(logging.WARNING, logger="pmi_reward.rewards.verl"):
        first = fn(data_source="d", solution_str="Coltrane.", ground_truth="", extra_info={"context": CONTEXT})
        again = fn(
            data_source="d", solution_str="Coltrane.", ground_truth="", extra_info={"context": CONTEXT}, **verl_own
        )
    warnings = [r.getMessage() for r in caplog.records if "unknown keyword" in r.getMessage()]
    # one warning, from the first call: the second's verl keywords are not unknown
    assert len(warnings) == 1 and "'centre', 'clip_range', 'emtpy_score' (" in warnings[0], warnings
    assert first == again and isinstance(first["score"], float)


def test_a_hub_scorer_can_be_pinned_from_reward_kwargs(monkeypatch, caplog):
    """revision, token, hub_cache_dir and local_files_only were "unknown keywords" (warned about and dropped): the
    worker loaded the Hub repo's main, whatever the config pinned."""
    monkeypatch.delenv("PMI_REWARD_URL", raising=False)
    monkeypatch.delenv("PMI_REWARD_SCORER", raising=False)
    import logging

    monkeypatch.setattr(verl_adapter, "_unknown_warned", set())
    pinned = {"revision": "v1", "token": False, "hub_cache_dir": "/tmp/hub", "local_files_only": True}
    with caplog.at_level(logging.WARNING, logger="pmi_reward.rewards.verl"):
        settings = verl_adapter._settings({"scorer": "org/scorer", **pinned, "dtype": "float32", "revison": "v1"})
    assert dict(settings[4]) == {**pinned, "dtype": "float32"}
    warned = [r.getMessage() for r in caplog.records if "revison" in r.getMessage()]  # the check itself is on
    assert len(warned) == 1 and not any("'revision'" in m or "'token'" in m for m in warned)
