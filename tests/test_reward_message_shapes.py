"""The prompts and completions TRL 1.16 hands a reward, read as a user expects: chat-templated prompt strings (a
"standard" dataset built with ``apply_chat_template(tokenize=False, add_generation_prompt=True)``), completions TRL
parsed with its own response templates (``trl.chat_template_utils.parse_response``, as ``GRPOTrainer._generate``
calls it), and the ``think_unfinished_frac`` metric over them."""

import copy

import pytest
from conftest import http
from trl.chat_template_utils import (
    deepseek_r1_distill_chat_template,
    deepseek_r1_distill_template,
    gptoss_template,
    lfm2_2_5_template,
    parse_response,
    qwen3_5_template,
    qwen3_5_think_chat_template,
    qwen3_template,
)

from pmi_reward.rewards.diversity import DiversityReward
from pmi_reward.rewards.path import parsed_call, read_prompt, reasoning_cut
from pmi_reward.rewards.remote import RemotePMIReward
from pmi_reward.rewards.reward import PMIReward

CHAT = [
    {"role": "user", "content": "I just got back from a hiking trip."},
    {"role": "assistant", "content": "Oh nice, where did you go?"},
    {"role": "user", "content": "Yosemite, the views were amazing."},
]
REPLIES = ["Did you see Half Dome?", "That's interesting."]
UNFINISHED = "pmi_reward/think_unfinished_frac"


@pytest.fixture
def parsing_tokenizer(smol_tokenizer):
    """SmolLM2's tokenizer, a copy to set a chat and a response template on (``<think>`` is plain text to it, decoded
    back as written): TRL's parser reads the text the tokens decode to."""
    return copy.deepcopy(smol_tokenizer)


def _parse(tokenizer, response_template, text: str, prefix: list[int]) -> dict:
    """``text`` generated after ``prefix`` and parsed as ``GRPOTrainer._generate`` parses a completion."""
    tokenizer.response_template = response_template
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return parse_response(tokenizer, ids, prefix=prefix)


def _frac(reward, prompts, completions) -> tuple[list, float]:
    logged: dict = {}
    out = reward(prompts, completions, log_metric=logged.setdefault)
    return out, logged[UNFINISHED]


def test_a_chat_templated_prompt_string_reads_as_its_messages(smol_tokenizer, spread_scorer, spread_server):
    """Read line by line, a templated prompt's context was the template's markup around its last user message (the
    last 3 *lines*), its older turns lost; it now gives the messages' context and rewards, in process and remote."""
    templated = smol_tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert templated.startswith("<|im_start|>system") and templated.endswith("<|im_start|>assistant\n")
    reward = PMIReward(spread_scorer)
    answers = [[{"role": "assistant", "content": r}] for r in REPLIES]
    expected = "I just got back from a hiking trip.\nOh nice, where did you go?\nYosemite, the views were amazing."
    assert (
        reward.texts([templated] * 2, REPLIES).contexts == reward.texts([CHAT] * 2, answers).contexts == [expected] * 2
    )
    by_messages = reward([CHAT] * 2, answers)
    assert reward([templated] * 2, REPLIES) == pytest.approx(by_messages, abs=1e-5)
    remote = RemotePMIReward(spread_server.url, on_failure="raise").score_sync([templated] * 2, REPLIES)
    assert remote == pytest.approx(by_messages, abs=1e-4)
    # the system prompt the template wrote is a turn with include_system, as the messages' own would be
    with_system = PMIReward(spread_scorer, include_system=True, max_context_turns=4).texts([templated], REPLIES[:1])
    assert with_system.contexts[0].startswith("You are a helpful AI assistant named SmolLM")


def test_plain_string_prompts_still_read_one_turn_per_line(tiny_reward):
    """Untemplated strings keep their reading: a turn per line, a ``User:`` transcript's prefixes included."""
    plain = "I went hiking.\nWhere?\nYosemite!"
    transcript = "User: I went hiking.\nAssistant: Where?\nUser: Yosemite!"
    assert tiny_reward.texts([plain, transcript], ["Nice.", "Nice."]).contexts == [plain, transcript]


def test_a_template_opened_think_block_is_read_per_sample(spread_scorer):
    """An R1-distill prompt ends with ``<think>\\n``: its completion is the rest of that block, so one cut before
    ``</think>`` is unfinished reasoning (empty, counted), as the server reads it, while a plain prompt's reply in the
    same call is scored as written. The opened tag is no context turn, even with ``strip_think`` off."""
    opened = (
        "<\uff5cbegin\u2581of\u2581sentence\uff5c><\uff5cUser\uff5c>I went hiking in Yosemite."
        "<\uff5cAssistant\uff5c><think>\n"
    )
    cut = "The user went hiking. I should ask about"
    reward = PMIReward(spread_scorer)
    out, frac = _frac(reward, [opened, opened, "I went hiking in Yosemite."], [cut, f"{cut}.\n</think>\n\nNice!", cut])
    alone = reward(["I went hiking in Yosemite."] * 2, ["Nice!", cut])
    assert out == pytest.approx([-5.0, *alone], abs=1e-5) and frac == pytest.approx(1 / 3)
    batch = reward.texts([opened], [cut])
    assert batch.contexts == ["I went hiking in Yosemite."] and batch.replies == [""]
    assert PMIReward(spread_scorer, strip_think=False).texts([opened], [cut]).contexts == ["I went hiking in Yosemite."]
    # the diversity reward reads the replies alike: two cut reasonings that open alike are empty answers, not twins
    assert DiversityReward()([opened] * 2, [cut, cut]) == [0.0, 0.0]


def test_a_parsed_reply_with_empty_reasoning_is_scored_under_think_opened(parsing_tokenizer, spread_scorer):
    """Qwen3.5's thinking template opens ``<think>`` in the generation prompt, so users set ``think_opened``. TRL's
    parser leaves out an empty ``reasoning_content``: a reply that closed its block at once looked like a plain decode
    and scored ``empty_score``, counted unfinished. TRL parses every completion of a call or none, so the call decides.
    """
    tok = parsing_tokenizer
    tok.chat_template = qwen3_5_think_chat_template
    prompt = [{"role": "user", "content": "I just got back from a hiking trip to Yosemite."}]
    prefix = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    assert tok.decode(prefix).endswith("<|im_start|>assistant\n<think>\n")
    outputs = [
        "The user went hiking.\n</think>\n\nDid you see Half Dome?<|im_end|>",
        "\n</think>\n\nDid you see Half Dome?<|im_end|>",  # empty reasoning
        "The user went hiking and I should ask",  # cut inside the reasoning
    ]
    completions = [[_parse(tok, qwen3_5_template, o, prefix)] for o in outputs]
    assert "reasoning_content" not in completions[1][0] and completions[1][0]["content"] == "Did you see Half Dome?"
    out, frac = _frac(PMIReward(spread_scorer, think_opened=True), [prompt] * 3, completions)
    assert out[1] == pytest.approx(out[0], abs=1e-5) and out[0] != -5.0 and out[2] == -5.0
    assert frac == pytest.approx(1 / 3)
    # the diversity reward reads them as PMI does: two answers that open alike, and an empty one
    assert DiversityReward(think_opened=True)([prompt] * 3, completions) == [-0.5, -0.5, 0.0]


def test_in_a_parsed_call_a_template_that_parses_cut_reasoning_as_content_has_it_scored(
    parsing_tokenizer, spread_scorer
):
    """The documented trade-off: the R1 distills' response template (as Nemotron 3's) parses reasoning cut before
    ``</think>`` as plain ``content``; in a call whose other replies show the parse, it is scored as written."""
    tok = parsing_tokenizer
    tok.chat_template = deepseek_r1_distill_chat_template
    prompt = [{"role": "user", "content": "I went hiking."}]
    prefix = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    cut = "The user went hiking and I should"
    completions = [
        [_parse(tok, deepseek_r1_distill_template, "x</think>\n\nWhere did you go?", prefix)],
        [_parse(tok, deepseek_r1_distill_template, cut, prefix)],
    ]
    assert completions[1] == [{"role": "assistant", "content": cut}]
    out, frac = _frac(PMIReward(spread_scorer, think_opened=True), [prompt] * 2, completions)
    assert out == pytest.approx(PMIReward(spread_scorer)([prompt] * 2, ["Where did you go?", cut]), abs=1e-5)
    assert frac == 0.0


@pytest.mark.parametrize(
    ("response_template", "prefix", "output"),
    [
        (
            gptoss_template,
            "<|start|>user<|message|>I went hiking.<|end|><|start|>assistant",
            "<|channel|>analysis<|message|>The user went hiking and I should ask where",
        ),
        (
            lfm2_2_5_template,
            "<|im_start|>user\nI went hiking.<|im_end|>\n<|im_start|>assistant\n",
            "<think>The user went hiking and I should ask where",
        ),
    ],
    ids=["gpt-oss", "lfm2.5"],
)
def test_reasoning_cut_in_a_thinking_field_counts_as_unfinished(
    parsing_tokenizer, tiny_reward, response_template, prefix, output
):
    """gpt-oss's and LFM2.5's parses put the reasoning in ``thinking``: a reply cut inside it was emptied but not
    counted in ``think_unfinished_frac`` (0.0 while every reply was emptied)."""
    tok = parsing_tokenizer
    parsed = _parse(tok, response_template, output, tok(prefix, add_special_tokens=False)["input_ids"])
    assert parsed["thinking"] and parsed["content"] == ""
    out, frac = _frac(tiny_reward, [[{"role": "user", "content": "I went hiking."}]], [[parsed]])
    assert out == [-5.0] and frac == 1.0


def test_only_a_tool_run_cut_in_its_last_reasoning_counts_as_unfinished(parsing_tokenizer, spread_scorer):
    """A Qwen3 tool run that ends on the tool's result (its answer cut, or out of tool-calling turns) finished its
    reasoning: it was counted as unfinished because its call message holds ``reasoning_content``. So did one that ends
    on its own call (TRL 1.16's ``_tool_call_loop`` rolls back a tool result that would pass
    ``max_completion_length``). A run whose last assistant message is reasoning with no content still counts; one with
    a final answer is scored on it."""
    tok = parsing_tokenizer
    call = _parse(
        tok,
        qwen3_template,
        '<think>\nI need the weather.\n</think>\n\n<tool_call>\n{"name": "w", "arguments": {}}\n</tool_call><|im_end|>',
        [],
    )
    assert call["reasoning_content"] and call["tool_calls"] and call["content"] == ""
    result = {"role": "tool", "name": "w", "content": "sunny"}
    cut_again = _parse(tok, qwen3_template, "<think>\nIt is sunny, so I should say", [])
    answered = _parse(tok, qwen3_template, "<think>\nSunny.\n</think>\n\nIt is sunny there!<|im_end|>", [])
    prompt = [{"role": "user", "content": "How is the weather in Yosemite?"}]
    reward = PMIReward(spread_scorer)
    runs = [[call], [call, result], [call, result, cut_again], [call, result, answered]]
    out, frac = _frac(reward, [prompt] * 4, runs)
    assert out[:3] == [-5.0, -5.0, -5.0] and frac == pytest.approx(1 / 4)  # the cut reasoning alone
    assert out[3] == pytest.approx(reward([prompt], ["It is sunny there!"])[0], abs=1e-5)
    assert [reasoning_cut(run) for run in runs] == [False, False, True, False]


def test_a_tool_run_without_reasoning_shows_the_parse_under_think_opened(spread_scorer):
    """``tool_calls`` alone marks a parsed call: a run whose messages hold no reasoning field (a template that opens no
    block, or a parser that left the empty one out) is read on its ``content``, and so is every completion of that
    call; read as raw decodes under ``think_opened``, both answers (no ``</think>``) were emptied."""
    tool_call = {"type": "function", "function": {"name": "w", "arguments": {}}}
    completions = [
        [
            {"role": "assistant", "tool_calls": [tool_call], "content": ""},
            {"role": "tool", "name": "w", "content": "sunny"},
            {"role": "assistant", "content": "It is sunny there!"},
        ],
        [{"role": "assistant", "content": "Did you see Half Dome?"}],
    ]
    assert parsed_call(completions) and not parsed_call(completions[1:])
    prompts = [[{"role": "user", "content": "How is the weather in Yosemite?"}]] * 2
    reward = PMIReward(spread_scorer, think_opened=True)
    assert reward.texts(prompts, completions).replies == ["It is sunny there!", "Did you see Half Dome?"]
    out, frac = _frac(reward, prompts, completions)
    plain = PMIReward(spread_scorer)(prompts, ["It is sunny there!", "Did you see Half Dome?"])
    assert out == pytest.approx(plain, abs=1e-5) and -5.0 not in out and frac == 0.0


# R1-Zero's prompt: plain text (no chat template) that opens the reply's think block
R1_ZERO = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant first thinks about the "
    "reasoning process in the mind and then provides the user with the answer.\n"
    "User: I just got back from hiking in Yosemite. Assistant: <think>"
)


def test_a_plain_prompt_ending_in_think_opens_the_reply_in_process_and_on_the_server(spread_scorer, spread_server):
    """The server's ``split_query`` opened the block of any prompt ending in ``<think>``; ``PMIReward`` only of a
    templated one: a reply cut in its reasoning was scored as the answer in process, emptied and counted on the server.
    One rule now (``prompt_opens_think``): in process, remote (``/score``) and ``/get_reward`` read the same context
    (without the opened tag) and reply. A ``<think>`` with a user's words after it opens nothing, on the server too (it
    emptied every reply)."""
    from pmi_reward.data.conversation import split_query
    from pmi_reward.rewards.options import RewardOptions
    from pmi_reward.serving.server import RewardServer, ServerConfig

    cut = " The user went hiking. I should ask which trail they took and whether"
    finished = f"{cut}\n</think>\n\nDid you see Half Dome?"
    prompts, completions = [R1_ZERO, R1_ZERO], [cut, finished]
    assert read_prompt(R1_ZERO) == (R1_ZERO.removesuffix("<think>"), True)
    reward = PMIReward(spread_scorer)
    batch = reward.texts(prompts, completions)
    assert batch.replies == ["", "Did you see Half Dome?"] and batch.unfinished_think == 1
    # the opened tag is no context turn, with strip_think off too
    assert PMIReward(spread_scorer, strip_think=False).texts(prompts, completions).contexts == batch.contexts
    assert all("<think>" not in c and c.endswith("Assistant:") for c in batch.contexts)
    out, frac = _frac(reward, prompts, completions)
    assert out[0] == -5.0 and out[1] != -5.0 and frac == 0.5
    remote = RemotePMIReward(spread_server.url, on_failure="raise")
    assert remote.score_sync(prompts, completions) == pytest.approx(out, abs=1e-4)
    server = RewardServer(spread_scorer, ServerConfig(port=0), RewardOptions()).start()
    try:
        body = {"query": [p + c for p, c in zip(prompts, completions, strict=True)], "prompts": prompts}
        status, answer = http(server.url, "POST", "/get_reward", body)
    finally:
        server.close()
    assert status == 200 and answer["rewards"] == pytest.approx(out, abs=1e-4)
    literal = "How do I use the <think> tag in my prompts?"
    assert read_prompt(literal) == (literal, False)
    assert split_query(f"{literal} You put the reasoning inside it.", literal)[1] == "You put the reasoning inside it."
