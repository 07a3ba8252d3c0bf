"""The chat LM's zero-shot PMI: cached scoring equals a plain forward pass, and the score is conditional - marginal."""

import copy

import numpy as np
import pytest
import torch

from pmi_reward.evaluation.baselines.lm_pmi import LMPMIConfig, LMPMIScorer, end_of_turn

CONTEXT = "I just got back from Japan\nOh nice, how was it?\nAmazing, the food was great"
REPLIES = ["What did you eat there?", "ok", "I love Japanese food, did you try the ramen in Tokyo?"]


def reference_log_likelihood(model, prefix: list[int], reply: list[int]) -> float:
    """log p(reply | prefix) from one forward pass over the whole text, no cache, no padding."""
    ids = torch.tensor([prefix + reply])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
    return float(logp[len(prefix) - 1 :].gather(-1, ids[0, len(prefix) :, None]).sum())


@pytest.fixture
def scorer(tiny_policy, smol_tokenizer):
    # batches of 2: the three replies of different lengths span two batches, padded on the right
    return LMPMIScorer(LMPMIConfig(batch_size=2), model=tiny_policy(0), tokenizer=smol_tokenizer)


def test_cached_batched_likelihoods_equal_a_plain_forward_pass(scorer):
    for context in (CONTEXT, None):
        prefix = scorer.prefix(context)
        got = scorer._log_likelihoods(prefix, [scorer.reply_ids(r) for r in REPLIES])
        want = [reference_log_likelihood(scorer.model, prefix, scorer.reply_ids(r)) for r in REPLIES]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_long_replies_are_cut_and_batches_stay_within_the_token_budget(tiny_policy, smol_tokenizer):
    """A reply of thousands of words (the held-out set has one) is judged on its first ``max_reply_tokens``
    tokens, and no pass holds more than ``max_batch_tokens`` padded tokens: the memory stays bounded."""
    config = LMPMIConfig(max_batch_tokens=40, max_reply_tokens=24)
    scorer = LMPMIScorer(config, model=tiny_policy(0), tokenizer=smol_tokenizer)
    long = " ".join(["words"] * 500)
    ids = scorer.reply_ids(long)
    assert len(ids) == 24 and ids[-1] != smol_tokenizer.convert_tokens_to_ids("<|im_end|>")
    replies = [scorer.reply_ids(r) for r in [*REPLIES, long, "ok", "sure thing"]]
    batches = scorer._batches(replies)
    assert sorted(i for b in batches for i in b) == list(range(len(replies)))
    assert all(len(b) * max(len(replies[i]) for i in b) <= 40 or len(b) == 1 for b in batches)
    prefix = scorer.prefix(CONTEXT)
    want = [reference_log_likelihood(scorer.model, prefix, r) for r in replies]
    np.testing.assert_allclose(scorer._log_likelihoods(prefix, replies), want, rtol=1e-5, atol=1e-4)


def test_score_is_the_conditional_minus_the_marginal_log_likelihood(scorer):
    contexts = [CONTEXT] * len(REPLIES) + ["Hi\nHello, how are you?"]
    replies = REPLIES + [REPLIES[0]]
    pmi = scorer.score(contexts, replies)
    for c, r, s in zip(contexts, replies, pmi, strict=True):
        ids = scorer.reply_ids(r)
        want = reference_log_likelihood(scorer.model, scorer.prefix(c), ids)
        want -= reference_log_likelihood(scorer.model, scorer.prefix(None), ids)
        assert s == pytest.approx(want, abs=1e-3)
    assert pmi[0] != pytest.approx(pmi[-1], abs=1e-3)  # the same reply after another context scores otherwise
    assert scorer.reply_ids(REPLIES[1])[-1] == scorer.tokenizer.convert_tokens_to_ids("<|im_end|>")
    scorer.config.per_token = True
    per_token = scorer.score(contexts, replies)
    np.testing.assert_allclose(per_token, pmi / [len(scorer.reply_ids(r)) for r in replies], rtol=1e-5)


def test_the_context_is_the_policy_s_chat_with_the_newest_turn_the_user_s(scorer):
    text = scorer.tokenizer.decode(scorer.prefix(CONTEXT))
    assert text.index("user\nI just got back") < text.index("assistant\nOh nice") < text.index("user\nAmazing")
    assert text.endswith("<|im_start|>assistant\n")
    assert "Japan" not in scorer.tokenizer.decode(scorer.prefix(None))


def test_mismatched_inputs_raise(scorer):
    with pytest.raises(ValueError, match="2 contexts but 1 responses"):
        scorer.score([CONTEXT, CONTEXT], ["ok"])


@pytest.mark.integration
def test_the_real_lm_puts_a_specific_answer_above_generic_and_off_topic_replies():
    scorer = LMPMIScorer()
    specific, generic, off_topic = scorer.score([CONTEXT] * 3, [REPLIES[2], "That's interesting.", "My car broke."])
    assert specific > generic + 5 and specific > off_topic + 5
    assert abs(generic) < 3  # a generic reply is about as likely with the context as without


def test_log_likelihoods_are_cached_on_disk_and_reused(tiny_policy, smol_tokenizer, tmp_path):
    cache = tmp_path / "lm.jsonl"
    first = LMPMIScorer(LMPMIConfig(), model=tiny_policy(0), tokenizer=smol_tokenizer, cache_file=cache)
    pmi = first.score([CONTEXT] * 2, REPLIES[:2])
    assert len(cache.read_text().splitlines()) == 4  # two replies, with and without the context
    # another model under the same setting would score otherwise: equal scores mean they came from the file
    again = LMPMIScorer(LMPMIConfig(), model=tiny_policy(1), tokenizer=smol_tokenizer, cache_file=cache)
    np.testing.assert_array_equal(again.score([CONTEXT] * 2, REPLIES[:2]), pmi)
    fresh = LMPMIScorer(LMPMIConfig(), model=tiny_policy(1), tokenizer=smol_tokenizer)
    assert not np.allclose(fresh.score([CONTEXT] * 2, REPLIES[:2]), pmi)


def test_an_lm_it_loads_goes_to_the_default_device(tiny_policy, smol_tokenizer, tmp_path, monkeypatch):
    """The chat LM that a judge loads by name lands where ``default_device`` says (the GPU where there is one; the
    meta device stands in for it here), as the policies and the trained scorers do: it stayed on the CPU before."""
    from pmi_reward.evaluation.baselines import lm_pmi

    tiny_policy(0).save_pretrained(tmp_path)
    monkeypatch.setattr(lm_pmi, "default_device", lambda device=None: torch.device("meta"))
    scorer = LMPMIScorer(LMPMIConfig(model=str(tmp_path)), tokenizer=smol_tokenizer)
    assert {p.device.type for p in scorer.model.parameters()} == {"meta"}


@pytest.mark.parametrize("system_prompt", ["", None])
def test_no_system_prompt_scores_the_marginal_after_the_assistant_header(tiny_policy, smol_tokenizer, system_prompt):
    """With no system prompt, p(r) is read after the assistant's header alone (templates refuse an empty chat),
    and the score is still conditional minus marginal."""
    scorer = LMPMIScorer(LMPMIConfig(system_prompt=system_prompt), model=tiny_policy(0), tokenizer=smol_tokenizer)
    assert smol_tokenizer.decode(scorer.prefix(None)) == "<|im_start|>assistant\n"
    got = scorer.score([CONTEXT], [REPLIES[0]])
    reply = scorer.reply_ids(REPLIES[0])
    want = reference_log_likelihood(scorer.model, scorer.prefix(CONTEXT), reply) - reference_log_likelihood(
        scorer.model, scorer.prefix(None), reply
    )
    np.testing.assert_allclose(got, [want], rtol=1e-4, atol=1e-3)


def test_a_reply_closes_with_the_template_s_end_of_turn_where_eos_differs(tiny_policy, smol_tokenizer):
    """Gemma's tokenizer ends assistant turns with <end_of_turn> but its eos is <eos> (Qwen's base ones: <|im_end|>
    and <|endoftext|>): the reply is scored with the token the chat template writes after it, the one the model
    learnt to write there, not with eos. Stand-in: SmolLM2's ChatML tokenizer with its eos set to <|endoftext|>.
    SmolLM2 itself (eos <|im_end|>, the template's end) closes replies as before."""
    odd = copy.deepcopy(smol_tokenizer)
    odd.eos_token = "<|endoftext|>"
    im_end = smol_tokenizer.convert_tokens_to_ids("<|im_end|>")
    shipped = LMPMIScorer(LMPMIConfig(), model=tiny_policy(0), tokenizer=smol_tokenizer)
    scorer = LMPMIScorer(LMPMIConfig(), model=tiny_policy(0), tokenizer=odd)
    assert scorer.reply_ids(REPLIES[0])[-1] == im_end and odd.eos_token_id != im_end
    assert scorer.reply_ids(REPLIES[0]) == shipped.reply_ids(REPLIES[0])
    assert end_of_turn(smol_tokenizer) == smol_tokenizer.eos_token == "<|im_end|>"
    np.testing.assert_allclose(scorer.score([CONTEXT], [REPLIES[0]]), shipped.score([CONTEXT], [REPLIES[0]]))


@pytest.mark.parametrize(
    "template",
    [
        None,  # a text-only tokenizer: apply_chat_template raises
        "{{ raise_exception('Conversations must start with a system turn') }}",
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}",  # writes no token after a reply
    ],
)
def test_end_of_turn_falls_back_to_eos_without_a_template_that_closes_the_reply(smol_tokenizer, template):
    tokenizer = copy.deepcopy(smol_tokenizer)
    tokenizer.eos_token = "<|endoftext|>"
    tokenizer.chat_template = template
    assert end_of_turn(tokenizer) == "<|endoftext|>"
