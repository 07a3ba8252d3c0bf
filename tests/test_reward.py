"""The TRL reward contract of PMIReward: lengths, chat and plain formats, odd inputs, shaping, pickling."""

import math
import pickle

import numpy as np
import pytest
import torch

from pmi_reward.data.conversation import completion_to_text, prompt_to_context
from pmi_reward.rewards.options import RewardOptions
from pmi_reward.rewards.path import GroupError
from pmi_reward.rewards.reward import PMIReward
from pmi_reward.scoring.head import HeadConfig, PMIHead
from pmi_reward.scoring.scorer import PMIScorer
from pmi_reward.scoring.templates import TEMPLATES


@pytest.fixture
def scorer(tiny_scorer):
    return tiny_scorer


CHAT_PROMPT = [
    {"role": "system", "content": "You are nice."},
    {"role": "user", "content": "I love jazz."},
    {"role": "assistant", "content": "Me too!"},
    {"role": "user", "content": "Who is your favourite?"},
]


def test_plain_and_chat_formats_give_the_same_scores(spread_scorer):
    reward = PMIReward(spread_scorer)
    assert reward.__name__ == "pmi_reward" and not isinstance(reward, torch.nn.Module)
    plain = reward(["I love jazz.\nMe too!\nWho is your favourite?"] * 2, ["Coltrane.", "Miles Davis"])
    assert abs(plain[0] - plain[1]) > 1e-3  # the replies score apart: a swapped or misread pair would show
    chat = reward(
        [CHAT_PROMPT] * 2,
        [[{"role": "assistant", "content": "Coltrane."}], [{"role": "assistant", "content": "Miles Davis"}]],
    )
    assert len(plain) == 2 and plain == pytest.approx(chat)
    assert all(isinstance(x, float) for x in plain)


def test_context_extraction():
    assert prompt_to_context(CHAT_PROMPT) == "I love jazz.\nMe too!\nWho is your favourite?"
    assert prompt_to_context(CHAT_PROMPT, include_system=True).startswith("You are nice.\n")
    assert prompt_to_context(CHAT_PROMPT, max_turns=1) == "Who is your favourite?"
    parts = [{"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "image"}]}]
    assert prompt_to_context(parts) == "hello"
    assert prompt_to_context(42) is None
    assert completion_to_text([{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]) == "a b"
    assert completion_to_text(None) is None


ODD = [
    "",
    "   \n\t",
    None,
    "x" * 50_000,
    "🙂🎉🔥" * 100,
    "我喜欢爵士乐，你呢？",
    "\x00\x01 control",
    12345,
    [{"role": "assistant"}],
    [{"role": "assistant", "content": None}],
    {"weird": "dict"},
    "ok",
]


def test_odd_inputs_never_raise_never_nan_and_stay_bounded(scorer):
    reward = PMIReward(scorer, empty_score=-3.0)
    prompts = ["hi there"] * len(ODD) + [None, "", "x" * 50_000, [{"role": "user", "content": "🙂"}]]
    completions = ODD + ["fine"] * 4
    out = reward(prompts, completions)
    assert len(out) == len(completions)
    assert all(isinstance(x, float) and math.isfinite(x) and abs(x) <= 20 for x in out)
    empty_like = [0, 1, 2, 7, 8, 9, 10, 12]  # empty, whitespace, None, int, no content, None content, dict, None prompt
    assert all(out[i] == -3.0 for i in empty_like)
    assert out[3] != -3.0 and out[5] != -3.0  # long and Chinese replies are scored


def test_none_policy_returns_none_for_unscorable(scorer):
    out = PMIReward(scorer, empty_score=None)(["a", "a"], ["", "real reply"])
    assert out[0] is None and isinstance(out[1], float)


def test_group_centering_scale_and_clip(spread_scorer):
    prompts = ["ctx one"] * 3 + ["ctx two"] * 3
    completions = ["a reply", "another reply", "yet another", "b", "c c", "d d d"]
    raw = np.array(PMIReward(spread_scorer)(prompts, completions))
    # distinct scores, and groups of different means: centring on the whole call's mean would show
    assert len(set(np.round(raw, 4))) == 6 and abs(raw[:3].mean() - raw[3:].mean()) > 1e-2
    centred = np.array(PMIReward(spread_scorer, center="group", scale=2.0)(prompts, completions))
    expected = 2 * np.r_[raw[:3] - raw[:3].mean(), raw[3:] - raw[3:].mean()]
    np.testing.assert_allclose(centred, expected, atol=1e-5)
    cut = float(np.median(raw))  # some rewards above the clip, some below
    clipped = np.array(PMIReward(spread_scorer, clip=cut)(prompts, completions))
    np.testing.assert_allclose(clipped, np.clip(raw, -cut, cut), atol=1e-6)
    assert (raw > cut).any() and (raw < cut).any()
    both = np.array(PMIReward(spread_scorer, center="group", scale=2.0, clip=0.2)(prompts, completions))
    np.testing.assert_allclose(both, np.clip(expected, -0.2, 0.2), atol=1e-5)  # centred and scaled, then clipped
    assert (np.abs(expected) > 0.2).any() and (np.abs(expected) < 0.2).any()


def test_group_centring_refuses_a_lonely_completion(scorer):
    """A prompt with one completion in the call would get 0.0 whatever its reply: refused, saying why."""
    reward = PMIReward(scorer, center="group")
    with pytest.raises(GroupError, match=r"1 of the 3 samples .*first: sample 2.*center='none'"):
        reward(["a", "a", "b"], ["x", "y", "z"])
    with pytest.raises(GroupError, match="OpenRLHF >= 0.9.1"):
        reward(["a"], ["x"])
    assert reward(["a", "a", None], ["x", "", "z"])[1:] == [-5.0, -5.0]  # an empty reply is still its group's


def test_group_centring_groups_prompts_as_given_not_as_the_scorer_reads_them(spread_scorer):
    """Groups were keyed on the scored context, so prompts that differ only in what the reward drops (the system
    prompt, turns older than max_context_turns, text beyond max_chars) merged into one group, centred on a mixed
    mean, and a prompt with a single completion escaped the GroupError. Each prompt as given is its own group, in
    TRL's interleaved order too, and in ``rerank_many``."""
    from pmi_reward.rewards.rerank import rerank_many

    reward = PMIReward(spread_scorer, center="group", max_context_turns=1, max_chars=40)
    hi = {"role": "user", "content": "I love jazz."}
    alike = [
        [{"role": "system", "content": "You are a pirate."}, hi],
        [{"role": "system", "content": "You are a poet."}, hi],
        [{"role": "user", "content": "Hello!"}, {"role": "assistant", "content": "Hi."}, hi],
        "An older turn, long enough to be cut off.\n" + "I love jazz.",
        "Another older turn, also cut off by max_chars.\n" + "I love jazz.",
    ]
    assert len(set(reward.texts(alike, ["x"] * 5).contexts)) == 1  # the scorer reads them all alike
    replies = ["Coltrane!", "Me too.", "Which album?", "Nice", "Who?", "Same", "Bebop?", "Miles", "Ok", "Hm"]
    prompts = alike * 2  # interleaved, as TRL orders a batch: prompt i's samples are i and i + 5
    raw = np.array(PMIReward(spread_scorer, max_context_turns=1, max_chars=40)(prompts, replies))
    expected = raw - np.tile((raw[:5] + raw[5:]) / 2, 2)
    assert np.abs(expected - (raw - raw.mean())).max() > 1e-3  # centring on the merged group would show
    np.testing.assert_allclose(reward(prompts, replies), expected, atol=1e-5)
    with pytest.raises(GroupError, match="5 of the 5 samples"):
        reward(alike, replies[:5])
    odd = [{"role": "user", "content": "I love jazz.", 1: "a key JSON cannot sort"}]  # grouped by its context
    assert reward([odd, odd], replies[:2]) == pytest.approx(raw[:2] - raw[:2].mean(), abs=1e-5)
    ranked = rerank_many(reward, alike[:2], [replies[:2], replies[5:7]])
    assert [sum(score for _, score in r) for r in ranked] == pytest.approx([0.0, 0.0], abs=1e-5)


def test_group_centring_refuses_several_processes(scorer, monkeypatch):
    """Under several processes TRL hands each its own slice of the batch, and a group's completions can be split:
    centring each part on its own mean flipped advantages (or raised on a part of one). Refused, saying why."""
    import pmi_reward.rewards.path as path

    reward = PMIReward(scorer, center="group")
    both = reward(["a", "a"], ["x", "y"])
    monkeypatch.setattr(path, "world_size", lambda: 2)
    with pytest.raises(GroupError, match=r"2 processes each score their own slice.*center='none'"):
        reward(["a", "a"], ["x", "y"])
    assert PMIReward(scorer)(["a", "a"], ["x", "y"]) != both  # center='none' is unaffected


def test_think_blocks_are_not_scored(spread_scorer):
    reward = PMIReward(spread_scorer)
    logged = {}
    out = reward(
        ["I love jazz."] * 4,
        [
            "<think>\nThey like jazz.\n</think>\n\nColtrane!",
            "Coltrane!",
            "<think>hmm, jazz",
            [{"content": "</think>Coltrane!"}],
        ],
        log_metric=lambda k, v: logged.setdefault(k, v),
    )
    # the answer is scored (the same pair, equal but for float sums that differ by batch row on some CPUs: ~2e-7);
    # unfinished reasoning is empty
    assert out[0] == pytest.approx(out[1], abs=1e-6) and out[3] == pytest.approx(out[1], abs=1e-6) and out[2] == -5.0
    assert logged["pmi_reward/think_unfinished_frac"] == 0.25
    kept = PMIReward(spread_scorer, strip_think=False)
    assert kept.texts(["I love jazz."], ["<think>x</think>Coltrane!"]).replies == ["<think>x</think>Coltrane!"]
    # the option off: the reasoning is part of the reply and moves its score, so the scores above did strip it
    assert abs(kept(["I love jazz."], ["<think>\nThey like jazz.\n</think>\n\nColtrane!"])[0] - out[1]) > 1e-3
    opened = PMIReward(spread_scorer, think_opened=True)(["I love jazz."] * 2, ["hmm</think>Coltrane!", "hmm, jazz"])
    # the template opened the block: no </think> means unfinished
    assert opened == pytest.approx([out[1], -5.0], abs=1e-5)
    history = [{"role": "user", "content": "I love jazz."}, {"role": "assistant", "content": "<think>x</think>Me too!"}]
    stripped = reward([history], ["Coltrane!"])
    assert stripped == pytest.approx(reward(["I love jazz.\nMe too!"], ["Coltrane!"]), abs=1e-5)
    assert abs(stripped[0] - kept([history], ["Coltrane!"])[0]) > 1e-3  # kept, the reasoning moves the score
    # a user's literal <think> is their words, not reasoning: it cut the conversation, the turn answered included
    asked = [
        {"role": "user", "content": "My parser chokes on the <think> tag."},
        {"role": "assistant", "content": "Which parser?"},
        {"role": "user", "content": "BeautifulSoup."},
    ]
    assert reward.texts([asked], ["Try a regex."]).contexts == [
        "My parser chokes on the <think> tag.\nWhich parser?\nBeautifulSoup."
    ]


def test_a_string_prompts_reasoning_goes_before_its_turns_are_cut(scorer):
    """In a text prompt, think blocks went after the cut to the last turns: a block opened before the cut left its
    reasoning as turns, and a closed one spanning it cost a real turn. The text reads as the same chat does."""
    reward = PMIReward(scorer, max_context_turns=3)
    chat = [
        {"role": "user", "content": "I went hiking."},
        {"role": "assistant", "content": "<think>\nr1 private\nr2 private\n</think>Where did you go?"},
        {"role": "user", "content": "Yosemite!"},
    ]
    text = "I went hiking.\n<think>\nr1 private\nr2 private\n</think>Where did you go?\nYosemite!"
    expected = ["I went hiking.\nWhere did you go?\nYosemite!"]
    assert reward.texts([text], ["Nice"]).contexts == reward.texts([chat], ["Nice"]).contexts == expected


def test_completions_trl_parsed_into_reasoning_and_answer_score_their_answer(spread_scorer):
    """TRL 1.16 decodes conversational completions with the tokenizer's ``parse_response`` when it has a response
    template: the reasoning goes to ``reasoning_content``, ``content`` holds the answer alone. With think_opened every
    finished answer read as unfinished reasoning (empty_score), as did the diversity reward's. A parsed message is its
    answer; one without an answer is unfinished; in a call TRL did not parse, a reply still needs its ``</think>``
    (TRL parses every completion of a call or none)."""
    from pmi_reward.rewards.diversity import DiversityReward

    prompts = ["I love jazz."] * 2
    parsed_call = [
        [{"role": "assistant", "reasoning_content": "They like jazz.", "content": "Coltrane!"}],
        [{"role": "assistant", "reasoning_content": "They like jazz, so"}],  # cut inside its reasoning
    ]
    raw_call = [
        "They like jazz.\n</think>\n\nColtrane!",  # the same, not parsed: the closing tag says where it ends
        [{"role": "assistant", "content": "They like jazz, so"}],  # not parsed, no </think>: unfinished
    ]
    alone = PMIReward(spread_scorer)(prompts[:1], ["They like jazz, so"])[0]
    for opened in (True, False):
        logged: dict = {}
        parsed = PMIReward(spread_scorer, think_opened=opened)(prompts, parsed_call, log_metric=logged.setdefault)
        assert parsed[0] != -5.0 and parsed[1] == -5.0
        assert logged["pmi_reward/think_unfinished_frac"] == 0.5
        logged.clear()
        raw = PMIReward(spread_scorer, think_opened=opened)(prompts, raw_call, log_metric=logged.setdefault)
        assert raw[0] == pytest.approx(parsed[0], abs=1e-6)
        assert raw[1] == (-5.0 if opened else pytest.approx(alone, abs=1e-6))
        assert logged["pmi_reward/think_unfinished_frac"] == (0.5 if opened else 0.0)
    parsed = [[{"role": "assistant", "reasoning_content": r, "content": "Me too I do"}] for r in ("x", "y")]
    cut = [{"role": "assistant", "reasoning_content": "z"}]
    alike = DiversityReward(think_opened=True)(["I love jazz."] * 3, [*parsed, cut])
    assert alike == [-0.5, -0.5, 0.0]  # the answers open alike; the unfinished one is an empty answer, not unreadable


def test_only_replies_ending_inside_a_think_block_count_as_unfinished(scorer):
    logged: dict = {}
    out = PMIReward(scorer)(
        ["I love jazz."] * 2, ["<think>done</think>", "<think>still thinking"], log_metric=logged.setdefault
    )
    assert out == [-5.0, -5.0]  # both have no answer to score
    assert logged["pmi_reward/think_unfinished_frac"] == 0.5  # only the second ends inside its block


def test_samples_without_context_are_flagged(scorer, caplog):
    logged = {}
    with caplog.at_level("DEBUG", logger="pmi_reward"):
        out = PMIReward(scorer)([None, 42, "ctx"], ["a", "b", "c"], log_metric=lambda k, v: logged.setdefault(k, v))
    assert out[:2] == [-5.0, -5.0] and logged["pmi_reward/no_context_frac"] == pytest.approx(2 / 3)
    assert "2 of 3 samples have no readable context (first: sample 0)" in caplog.text


def test_prompts_without_turns_have_no_context(scorer):
    """A prompt with nothing to condition on (only a system message, blank, no messages) was scored against an
    empty context: an out-of-distribution PMI a policy could exploit. It gets empty_score and is flagged."""
    logged = {}
    system_only = [{"role": "system", "content": "Be brief."}]
    out = PMIReward(scorer)(
        [system_only, "   ", [], "I love jazz."],
        ["a", "b", "c", "Coltrane!"],
        log_metric=lambda k, v: logged.setdefault(k, v),
    )
    assert out[:3] == [-5.0] * 3 and out[3] != -5.0
    assert logged["pmi_reward/no_context_frac"] == pytest.approx(3 / 4)


def test_log_metric_receives_batch_stats(scorer, spread_scorer):
    """The metrics a trainer logs, by value: the raw PMI mean is the mean of the scorer's own scores (before
    shaping) over the scored replies, and clipped_frac the share of them the clip bounds. A raw mean of the shaped
    rewards, or a clipped share that stayed 0, passed when only their presence was checked."""
    logged = {}
    reward = PMIReward(scorer, clip=0.1)
    reward(
        ["c"] * 4,
        ["", "a", "b", "c d"],
        log_metric=lambda k, v: logged.setdefault(k, v),
        trainer_state=None,
        log_extra=lambda *a: None,
        completion_ids=[[1]] * 4,
        extra_col=[1] * 4,
    )
    assert logged["pmi_reward/empty_frac"] == 0.25
    # tiny_scorer gives these pairs the 20.0 cap, so every one of the 3 scored replies is clipped at 0.1
    assert logged["pmi_reward/raw_pmi_mean"] == pytest.approx(20.0, abs=1e-3)
    assert logged["pmi_reward/clipped_frac"] == 1.0
    # the reward's own wall time, which the training scripts report as its share of a step
    assert logged["pmi_reward/seconds"] > 0 and reward.seconds == logged["pmi_reward/seconds"]
    # scores apart, a clip between them: the raw mean is the unclipped scores', the share strictly between 0 and 1
    prompts, replies = ["I love jazz."] * 4, ["Coltrane.", "Miles Davis", "zzz", "Who?"]
    raw = np.asarray(PMIReward(spread_scorer)(prompts, replies))
    assert len(set(np.round(raw, 4))) == 4
    clip = float(np.sort(np.abs(raw))[1] + np.sort(np.abs(raw))[2]) / 2  # two below it, two above
    logged.clear()
    shaped = PMIReward(spread_scorer, clip=clip)(prompts, replies, log_metric=lambda k, v: logged.setdefault(k, v))
    assert shaped == pytest.approx(np.clip(raw, -clip, clip).tolist())
    assert logged["pmi_reward/raw_pmi_mean"] == pytest.approx(float(raw.mean()), abs=1e-6)
    assert abs(float(raw.mean()) - float(np.mean(shaped))) > 1e-3  # the shaped mean would not pass for it
    assert logged["pmi_reward/clipped_frac"] == 0.5


def test_mismatched_lengths_and_bad_options(scorer):
    with pytest.raises(ValueError, match="got 2 prompts but 1 completions"):  # a caller bug is not silent
        PMIReward(scorer)(["a", "b"], ["x"])
    with pytest.raises(ValueError, match="center"):
        RewardOptions(center="mean")
    with pytest.raises(ValueError, match="empty_score"):
        RewardOptions(empty_score=float("nan"))
    for turns in (0, -1):  # 0 read every turn, -1 dropped the oldest
        with pytest.raises(ValueError, match="max_context_turns must be >= 1"):
            RewardOptions(max_context_turns=turns)


def test_constructors_never_write_the_callers_options(scorer):
    """max_context_turns=None means "as the scorer was trained": each reward resolves it into its own copy."""
    from pmi_reward.serving.server import RewardServer, ServerConfig

    options = RewardOptions(center="group")
    reward = PMIReward(scorer, options)
    assert options.max_context_turns is None and reward.options.max_context_turns == scorer.context_turns == 3
    server = RewardServer(scorer, ServerConfig(port=0), options)
    try:
        assert options.max_context_turns is None and server.api.options.max_context_turns == 3
    finally:
        server.close()
    assert PMIReward(scorer, RewardOptions(max_context_turns=1)).options.max_context_turns == 1  # an explicit count


def test_a_failing_batch_is_rescored_pair_by_pair(scorer, monkeypatch):
    reward = PMIReward(scorer)
    real = scorer.score

    def flaky(contexts, responses, progress=False):
        if len(responses) > 1 or responses[0] == "boom":
            raise RuntimeError("encoder failure")
        return real(contexts, responses)

    monkeypatch.setattr(scorer, "score", flaky)
    out = reward(["c", "c", "c"], ["fine", "boom", "also fine"])
    assert out[1] == -5.0 and out[0] != -5.0 and out[2] != -5.0


def test_a_call_whose_pairs_all_fail_logs_no_nan(scorer, monkeypatch):
    """Every scorable pair failing (encoder error, or a server answering null) gives empty_score and logs no NaN
    metric: TRL averages a step's metric values, so one NaN would blank the metric for the whole step."""

    def broken(contexts, responses, progress=False):
        raise RuntimeError("encoder failure")

    monkeypatch.setattr(scorer, "score", broken)
    logged = {}
    out = PMIReward(scorer, clip=1.0)(["c", "c"], ["a", "b"], log_metric=lambda k, v: logged.setdefault(k, v))
    assert out == [-5.0, -5.0]
    assert all(math.isfinite(v) for v in logged.values()), logged


@pytest.mark.integration
def test_pickle_round_trip_on_minilm(tmp_path):
    from pmi_reward.scoring.encoder import EncoderSpec, TextEncoder

    enc = TextEncoder(EncoderSpec("minilm"), device="cpu")
    torch.manual_seed(0)
    scorer = PMIScorer(enc, TEMPLATES["en"], PMIHead(HeadConfig(dim=enc.dim)), context_turns=2)
    reward = PMIReward(scorer, center="group", name="pmi_custom")
    clone = pickle.loads(pickle.dumps(reward))
    assert clone.__name__ == "pmi_custom" and clone.options == reward.options
    assert clone.options.max_context_turns == 2
    args = (["a\nb\nc", "a\nb\nc"], ["x y", "z"])
    assert clone(*args) == pytest.approx(reward(*args))


@pytest.mark.parametrize("invisible", ["\u200b", "\x00", "\ufeff", "\u2060", "\xad", " \u200b\u200d\t", "\u3164"])
def test_invisible_replies_are_rewarded_as_empty(scorer, invisible):
    """Replies of only zero-width, control or blank characters tokenize like an empty one: ``empty_score``, not the
    -1.93 they scored (above "That's interesting.")."""
    reward = PMIReward(scorer, empty_score=-5.0)
    rewards = reward(["I love jazz."] * 3, [invisible, "", "Me too! Coltrane?\u200b"])
    assert rewards[:2] == [-5.0, -5.0] and rewards[2] != -5.0


@pytest.mark.parametrize("blank", ["\ufffd\ufffd", " \ufffd \ufffd\n", "\ufffd\u200b\ufffd", "\u1734", "\u1734 \ufffd"])
def test_replacement_character_replies_are_rewarded_as_empty(spread_scorer, blank):
    """U+FFFD (what a byte-level policy's incomplete UTF-8 decodes to) and U+1734 show as characters, but MiniLM's
    tokenizer drops them: a reply of nothing else was scored as an empty reply, above real ones under the trained
    scorer. It gets ``empty_score``; a reply with words beside one is scored."""
    assert spread_scorer.encoder.tokenizer.tokenize(blank) == []
    reward = PMIReward(spread_scorer, empty_score=-5.0)
    rewards = reward(["I love jazz."] * 3, [blank, "", "Coltrane\ufffd"])
    assert rewards[:2] == [-5.0, -5.0] and rewards[2] != -5.0


def test_numpy_arrays_are_accepted_as_inputs(spread_scorer):
    """TRL datasets (and verl's parquet rows) can hand numpy arrays of strings or of chat messages."""
    reward = PMIReward(spread_scorer)
    expected = reward(["I love jazz.", "Hi"], ["Me too!", "Hello"])
    assert abs(expected[0] - expected[1]) > 1e-3  # the pairs score apart: a reordered array would show
    assert reward(np.array(["I love jazz.", "Hi"]), np.array(["Me too!", "Hello"])) == expected
    chats = np.array([np.array([{"role": "user", "content": p}], dtype=object) for p in ("I love jazz.", "Hi")])
    replies = np.empty(2, dtype=object)
    replies[:] = [[{"role": "assistant", "content": "Me too!"}], [{"role": "assistant", "content": "Hello"}]]
    assert reward(prompts=chats, completions=replies) == expected


def test_from_pretrained_takes_the_scorers_loading_options_and_checks_names_before_loading(
    tiny_scorer_dir, monkeypatch
):
    """Every keyword went to RewardOptions, so revision, token, dtype or backend (docs/serving.md gives them) failed
    with "RewardOptions.__init__() got an unexpected keyword", after the scorer had loaded."""
    from pmi_reward.scoring.scorer import PMIScorer

    seen = {}
    load = PMIScorer.from_pretrained

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return load(*args, **{k: v for k, v in kwargs.items() if k not in ("revision", "token")})

    monkeypatch.setattr(PMIScorer, "from_pretrained", spy)
    reward = PMIReward.from_pretrained(
        tiny_scorer_dir, revision="main", token=False, dtype="float32", local_files_only=True, empty_score=-1.0
    )
    assert reward.options.empty_score == -1.0 and reward.scorer.encoder.spec.dtype == "float32"
    assert {"revision": "main", "token": False, "dtype": "float32", "local_files_only": True}.items() <= seen.items()
    seen.clear()
    with pytest.raises(TypeError, match=r"unexpected arguments \['revison'\]; loading takes \['revision'"):
        PMIReward.from_pretrained(tiny_scorer_dir, revison="main")
    with pytest.raises(TypeError, match="either options or keyword options"):
        PMIReward.from_pretrained(tiny_scorer_dir, options=RewardOptions(), clip=1.0)
    assert not seen  # refused before anything loaded


def test_a_pickled_reward_keeps_the_length_baseline_it_loaded(tiny_scorer_dir, tmp_path, monkeypatch):
    """The copy re-read its baseline from the path as given (``--length_baseline`` is often relative): a worker in
    another folder raised FileNotFoundError, and one whose file had been refitted since scored with another baseline.
    It carries the baseline it ran with, as RemotePMIReward does."""
    import json

    run, worker = tmp_path / "run", tmp_path / "worker"
    run.mkdir()
    worker.mkdir()
    (run / "baseline.json").write_text(json.dumps({"lengths": [1, 5, 10], "pmi": [0.1, 0.5, 1.0], "counts": [9] * 3}))
    monkeypatch.chdir(run)
    reward = PMIReward.from_pretrained(tiny_scorer_dir, device="cpu", length_baseline="baseline.json")
    blob = pickle.dumps(reward)
    (run / "baseline.json").write_text(json.dumps({"lengths": [1, 2], "pmi": [7.0, 8.0], "counts": [1, 1]}))
    args = (["I love jazz.\nMe too!"] * 2, ["Coltrane, surely.", "Miles Davis and his quintet of the sixties."])
    for folder in (worker, run):  # a worker elsewhere; here, after a refit
        monkeypatch.chdir(folder)
        clone = pickle.loads(blob)
        assert clone.length_baseline == reward.length_baseline and clone.options == reward.options
        assert clone(*args) == pytest.approx(reward(*args))


def test_a_pickled_reward_whose_encoder_is_missing_fails_once_naming_it(tiny_scorer_dir, tmp_path):
    """Every error rebuilding the scorer was taken for an unusable embedding cache: a warning blaming the cache, the
    encoder loaded a second time without one, and the same error raised twice (one during the other's handling)."""
    import json
    import shutil
    import warnings

    root = tmp_path / "copy"
    shutil.copytree(tiny_scorer_dir.parent, root)
    config = json.loads((root / "scorer" / "config.json").read_text())
    config["encoder"]["model"] = str(root / "encoder")
    (root / "scorer" / "config.json").write_text(json.dumps(config))
    blob = pickle.dumps(PMIReward.from_pretrained(root / "scorer", device="cpu", cache_dir=tmp_path / "emb"))
    shutil.rmtree(root / "encoder")
    with warnings.catch_warnings(record=True) as caught, pytest.raises(FileNotFoundError, match="encoder") as error:
        warnings.simplefilter("always")
        pickle.loads(blob)
    assert not [w for w in caught if "cache" in str(w.message)]
    assert error.value.__context__ is None  # raised once, not again while handling itself
