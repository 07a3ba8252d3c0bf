"""The policy side is reproducible and leaves its caller's state alone: every chat prompt this package renders (the
sampler, PPO's rollouts, the KL, ``fit_prompts``, RFT/DPO's cut replies and TRL's SFT/DPO tokenization) pins the date
the Llama 3.x templates write, so the same seed samples the same replies on another day; and the sampler seeds its
batches inside a forked RNG scope, so its caller's torch RNG is as it was (its samples unchanged)."""

from __future__ import annotations

import copy
import datetime as dt
import importlib.resources

import numpy as np
import pytest
import torch
import transformers.utils.chat_template_utils as chat_template_utils
from conftest import tiny_fit_args
from trl import DPOConfig, SFTConfig

from pmi_reward.data.records import DataError
from pmi_reward.policy import rft
from pmi_reward.policy.cut_replies import prompt_ids
from pmi_reward.policy.divergence import reply_logprobs
from pmi_reward.policy.prompts import fit_prompts
from pmi_reward.policy.sampling import (
    CHAT_TEMPLATE_KWARGS,
    Replies,
    SamplingSettings,
    best_of_n,
    generate_replies,
    prompt_texts,
    render_prompts,
    sample_replies,
)

PINNED = "Today Date: 26 Jul 2024"
PROMPTS = [
    [{"role": "system", "content": "Reply briefly."}, {"role": "user", "content": "I love jazz. Who do you like?"}],
    [{"role": "user", "content": "We went hiking in the rain."}],
    "A: Any plans for the weekend?\nB:",
]
SETTINGS = SamplingSettings(max_new_tokens=6, batch_size=4, seed=5)  # 3 prompts x 2 samples: two seeded batches
# generate_replies(tiny_policy(0), smol_tokenizer, PROMPTS, n=2, settings=SETTINGS).tokens, recorded from the code
# before the RNG fork (c4db735): forking the RNG must not change a sample
RECORDED_TOKENS = [
    [[2573, 21828, 29795, 10104, 27221, 25106], [2045, 15550, 22338, 24823, 29262, 34791]],
    [[5798, 8160, 46610, 41231, 15532, 13661], [44967, 20936, 769, 47633, 27253, 39102]],
    [[45338, 39903, 9043, 9149, 22176, 40926], [12345, 45949, 31330, 48931, 20446, 12076]],
]


class _Clock(dt.datetime):
    """transformers' clock for the templates' ``strftime_now``, set to a day that is not the pinned one."""

    day = dt.datetime(2026, 11, 29)

    @classmethod
    def now(cls, tz=None):
        return cls.day


@pytest.fixture
def clock(monkeypatch):
    """Set the day the chat templates read: ``clock(offset)`` moves it ``offset`` days on from 29 Nov 2026."""
    monkeypatch.setattr(chat_template_utils, "datetime", _Clock)

    def move(offset: int) -> None:
        _Clock.day = dt.datetime(2026, 11, 29) + dt.timedelta(days=offset)

    move(0)
    return move


@pytest.fixture
def llama_tokenizer(smol_tokenizer):
    """SmolLM2's vocabulary with TRL's Llama 3.2 chat template, which writes today's date into the system header."""
    tok = copy.deepcopy(smol_tokenizer)
    tok.chat_template = (importlib.resources.files("trl") / "chat_templates" / "llama3_2.jinja").read_text()
    return tok


def test_the_llama3_date_is_pinned_and_the_same_seed_samples_the_same_replies_on_another_day(
    clock, llama_tokenizer, tiny_policy
):
    """Llama 3.1-3.3 templates write ``Today Date: <today>``: the sampler rendered another prompt each day, so the
    same seed, settings and weights sampled other replies (and evaluations could not be merged). The sampler, PPO's
    ``render_prompts`` and the KL's log-probabilities now read the same prompt, with the pinned date, every day."""
    tok, policy = llama_tokenizer, tiny_policy()
    chats = [[{"role": "user", "content": f"Do you like {w}? I went to a {w} concert."}] for w in ("jazz", "rock")]
    runs = []
    for offset in (0, 1):
        clock(offset)
        texts = prompt_texts(tok, chats)
        replies = generate_replies(policy, tok, chats, n=4, settings=SamplingSettings(max_new_tokens=8))
        ids = render_prompts(tok, chats, "cpu")["input_ids"]
        logprobs = reply_logprobs(policy, tok, chats, replies.tokens, temperature=0.8)
        runs.append((texts, replies.tokens, ids, logprobs))
    assert all(PINNED in t and "Nov 2026" not in t for t in runs[0][0])
    assert runs[0][0] == runs[1][0] and runs[0][1] == runs[1][1]
    assert torch.equal(runs[0][2], runs[1][2]) and np.array_equal(runs[0][3], runs[1][3])


def test_fit_prompts_checks_a_prompt_as_the_sampler_renders_it(smol_tokenizer):
    """``fit_prompts`` asks the template whether it accepts a prompt; it renders with the sampler's keywords, so a
    template that needs them (here one that refuses a prompt without a ``date_string``) is judged as it samples."""
    tok = copy.deepcopy(smol_tokenizer)
    tok.chat_template = (
        "{% if date_string is not defined %}{{ raise_exception('no date_string') }}{% endif %}"
        "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
    )
    chat = [{"role": "user", "content": "Hello there."}]
    assert fit_prompts([chat, "text"], tok) == [chat, "text"]
    assert prompt_texts(tok, [chat]) == ["user: Hello there.\nassistant: "]
    tok.chat_template = tok.chat_template.replace("date_string is not defined", "true")
    with pytest.raises(DataError, match="prompt 1: the policy's chat template refuses it: no date_string"):
        fit_prompts([chat], tok)


def test_smollm2_prompts_render_as_before(smol_tokenizer):
    """SmolLM2's template writes no date: the pinned keyword leaves every prompt as it rendered without it."""
    chats = [p for p in PROMPTS if not isinstance(p, str)] + [
        [
            {"role": "system", "content": "Be kind."},
            {"role": "assistant", "content": "Hi!"},
            {"role": "user", "content": "Hello. Any news?"},
        ]
    ]
    plain = [smol_tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats]
    assert prompt_texts(smol_tokenizer, chats) == plain
    assert plain[0] == (
        "<|im_start|>system\nReply briefly.<|im_end|>\n<|im_start|>user\nI love jazz. Who do you like?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert prompt_ids(smol_tokenizer, chats[1]) == list(
        smol_tokenizer.apply_chat_template(chats[1], tokenize=True, return_dict=True, add_generation_prompt=True)[
            "input_ids"
        ]
    )
    assert dict(CHAT_TEMPLATE_KWARGS) == {"date_string": "26 Jul 2024"}
    with pytest.raises(TypeError):
        CHAT_TEMPLATE_KWARGS["date_string"] = "1 Jan 2000"  # read-only: one date for every caller


def test_rft_and_dpo_train_on_the_prompt_the_sampler_rendered(tmp_path, clock, smol_tokenizer, tiny_policy):
    """RFT's SFT and DPO rows are tokenized by TRL (finished replies) and by ``cut_replies`` (cut ones): both render
    the chat prompt with the pinned date, as the sampler did, not with the day the round trains on. (SmolLM2's
    template with a Llama-3 date line: on SmolLM2's vocabulary the Llama template's header merges into the reply.)"""
    tok = copy.deepcopy(smol_tokenizer)
    tok.chat_template = (
        '{%- if date_string is not defined %}{%- set date_string = strftime_now("%d %b %Y") %}{%- endif %}'
        "{{ '<|im_start|>system\nToday Date: ' + date_string + '<|im_end|>\n' }}" + smol_tokenizer.chat_template
    )
    chat = [{"role": "user", "content": "I love pizza."}]
    sampled = tok(prompt_texts(tok, [chat])[0], add_special_tokens=False)["input_ids"]
    assert PINNED in tok.decode(sampled)
    cut = tok(" So do I, especially with", add_special_tokens=False)["input_ids"]
    done = tok(" Me too!", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    replies = Replies([[" So do I, especially with", " Me too!"]], [[cut, done]], [[True, False]])
    captured = []

    def keep(trainer):
        captured.append(trainer.train_dataset)
        return trainer.model

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rft.CutRepliesSFTTrainer, "train", keep)
        patch.setattr(rft.CutRepliesDPOTrainer, "train", keep)
        for best in (0, 1):  # the cut reply kept, then the finished one (TRL's tokens alone)
            scores = np.array([[1.0, 0.0] if best == 0 else [0.0, 1.0]])
            kept = rft.select_best([chat], replies, scores, drop_truncated=False)
            rft._sft(tiny_policy(), tok, kept, tiny_fit_args(str(tmp_path / "sft"), SFTConfig), None)
        pairs = rft.select_pairs([chat], replies, np.array([[-7.0, 1.0]]), drop_truncated=False)
        rft._dpo(tiny_policy(), tok, pairs, tiny_fit_args(str(tmp_path / "dpo"), DPOConfig), None, tiny_policy())
    sft_cut, sft_done, dpo = (data[0] for data in captured)
    assert sft_cut["input_ids"] == sampled + cut and sft_done["input_ids"][: len(sampled)] == sampled
    assert dpo["prompt_ids"] == sampled and dpo["rejected_ids"] == cut  # the pair kept: both replies after one prompt
    assert all("chat_template_kwargs" not in data.column_names for data in captured)


def test_samples_are_those_the_code_before_the_rng_fork_drew(tiny_policy, smol_tokenizer):
    """Forking the RNG changes no sample: a fixed seed draws the replies recorded from the code before it."""
    replies = generate_replies(tiny_policy(), smol_tokenizer, PROMPTS, n=2, settings=SETTINGS)
    assert replies.tokens == RECORDED_TOKENS


@pytest.mark.parametrize("call", ["generate_replies", "sample_replies", "best_of_n"])
def test_sampling_leaves_the_callers_rng_as_it_was(call, tiny_policy, smol_tokenizer, tiny_scorer):
    """The sampler seeds each batch with ``torch.manual_seed``; that left the process's RNG at a fixed state, so every
    draw after a call (a shuffled DataLoader's epoch order, dropout) was the same whatever the caller had seeded. The
    caller's next draws are now those it would have drawn without the call."""
    policy, tok = tiny_policy(), smol_tokenizer
    runs = {
        "generate_replies": lambda: generate_replies(policy, tok, PROMPTS, n=2, settings=SETTINGS),
        "sample_replies": lambda: sample_replies(policy, tok, PROMPTS, n=2, settings=SETTINGS),
        "best_of_n": lambda: best_of_n(tiny_scorer, policy, tok, "I love jazz.", n=3, settings=SETTINGS),
    }
    for seed in (1, 2):
        torch.manual_seed(seed)
        expected = torch.rand(4)
        torch.manual_seed(seed)
        runs[call]()
        assert torch.equal(torch.rand(4), expected)
