import copy
import hashlib
import json

import numpy as np
import pytest
import torch

from pmi_reward.evaluation.baselines.kde import KDEConfig, KDEScorer
from pmi_reward.evaluation.baselines.meep import MEEPConfig, MEEPScorer, parse_score
from pmi_reward.evaluation.metrics import pearson, roc_auc


def test_kde_recovers_a_known_log_density_ratio():
    # p+ = N(+m, I), p- = N(-m, I): log p+/p- = 2 m.x, linear in x
    rng = np.random.default_rng(0)
    m = np.array([0.6, -0.4, 0.3, 0.0])
    pos, neg = rng.normal(size=(1500, 4)) + m, rng.normal(size=(3000, 4)) - m
    kde = KDEScorer(KDEConfig(n_components=4, bandwidth=0.5)).fit(pos, neg)
    test_pos, test_neg = rng.normal(size=(400, 4)) + m, rng.normal(size=(400, 4)) - m
    x = np.vstack([test_pos, test_neg])
    est = kde.score(x)
    assert est.dtype == np.float32 and est.shape == (800,)
    assert pearson(est, 2 * x @ m) > 0.85
    assert roc_auc(kde.score(test_pos), kde.score(test_neg)) > 0.75
    # PCA keeps at most what the data has
    assert KDEScorer(KDEConfig(n_components=128)).fit(pos, neg).pca.n_components_ == 4
    with pytest.raises(ValueError):
        KDEScorer().fit(pos, neg[:, :3])


@pytest.mark.parametrize(
    "text, expected",
    [
        ("85", 85.0),
        ("Score: 85/100", 85.0),
        ("I'd say 70.", 70.0),
        ("85%", 85.0),
        ("8/10", 80.0),
        ("8 out of 10", 80.0),
        ("4.5/5", 90.0),
        ("On a 0-100 scale: 62", 62.0),
        ("Rating (1 to 10 is too coarse): 75", 75.0),
        ("SmolLM2 says 40", 40.0),
        ("150, no wait, 90", 90.0),
        ("0", 0.0),
        ("100!", 100.0),
        # cut at the token limit before the denominator: the scale is unknown, so the number is no score
        (" 3.8 / ", None),
        ("7 out of", None),
        ("70, or 3.5 /", 70.0),
        ("85 outstanding", 85.0),
        ("75 out of a possible 100", 75.0),
        ("85 out of a hundred", 85.0),
    ],
)
def test_parse_score_reads_loose_answers(text, expected):
    assert parse_score(text) == (None if expected is None else pytest.approx(expected))


@pytest.mark.parametrize("text", ["", "garbage", "very engaging!", "-5", "250", "11/10", None, "Score: /100"])
def test_parse_score_gives_none_without_a_usable_number(text):
    assert parse_score(text) is None


def test_meep_scores_the_mean_of_the_parsed_samples_and_falls_back_per_row(tiny_policy, smol_tokenizer):
    """A row's score is the mean of its samples that parse (the others are left out, not counted as 0); a row none of
    whose samples parses gets ``fallback``; parse_rate is the share of all samples that parsed."""
    meep = MEEPScorer(
        MEEPConfig(n_samples=3, batch_size=2, fallback=37.5), model=tiny_policy(0), tokenizer=smol_tokenizer
    )
    contexts, responses = ["Hi there!", "I like tea.\nMe too.", ""], ["Hello!", "Green or black?", "Hm."]
    given = [["80", "x", "60/100"], ["junk"] * 3, ["8/10", "Score: 90", "4.5/5"]]
    by_prompt = dict(zip(meep.prompts(contexts, responses), given, strict=True))
    meep._sample = lambda prompts, generator: [by_prompt[p] for p in prompts]
    scores = meep.score(contexts, responses)
    assert scores.dtype == np.float32 and scores.tolist() == pytest.approx([70.0, 37.5, (80 + 90 + 90) / 3])
    assert meep.parse_rate == pytest.approx(5 / 9)
    assert meep.score(contexts[1:2], responses[1:2]).tolist() == [37.5] and meep.parse_rate == 0.0


def test_meep_samples_from_a_shared_prefill_and_falls_back(tiny_policy, smol_tokenizer, tmp_path):
    model, chat_tokenizer = tiny_policy(0).eval(), smol_tokenizer
    config = MEEPConfig(n_samples=3, max_new_tokens=4, batch_size=2, fallback=50.0)
    cache = tmp_path / "meep.jsonl"
    meep = MEEPScorer(config, model=model, tokenizer=chat_tokenizer, cache_file=cache)
    contexts, responses = ["Hi there!", "I like tea.\nMe too.", ""], ["Hello!", "Green or black?", "Hm."]
    answers = meep.answers(meep.prompts(contexts, responses))
    assert [len(a) for a in answers] == [3, 3, 3] and all(isinstance(t, str) for a in answers for t in a)
    scores = meep.score(contexts, responses)  # an untrained model answers garbage: the fallback, never NaN
    assert scores.shape == (3,) and np.isfinite(scores).all() and 0.0 <= meep.parse_rate <= 1.0
    parsed = [[v for v in map(parse_score, a) if v is not None] for a in answers]
    assert scores.tolist() == pytest.approx([np.mean(p) if p else 50.0 for p in parsed])
    # greedy decoding from the shared cache matches transformers' own generate()
    greedy = MEEPScorer(
        MEEPConfig(n_samples=2, temperature=0.0, max_new_tokens=5), model=model, tokenizer=chat_tokenizer
    )
    prompts = greedy.prompts(contexts[:2], responses[:2])
    ours = greedy.answers(prompts)
    enc = chat_tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    ref = model.generate(**enc, max_new_tokens=5, do_sample=False, pad_token_id=chat_tokenizer.pad_token_id)
    texts = chat_tokenizer.batch_decode(ref[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    assert [a[0] for a in ours] == texts and [a[1] for a in ours] == texts
    # answers are cached on disk: a new scorer reuses them without generating
    again = MEEPScorer(config, model=model, tokenizer=chat_tokenizer, cache_file=cache)
    again._sample = None  # would fail if called
    assert again.answers(meep.prompts(contexts, responses)) == answers


class _Scripted(torch.nn.Module):
    """The tiny policy's passes (so its cache), with logits that write ``script`` one token a pass."""

    def __init__(self, model, script: list[int]) -> None:
        super().__init__()
        self.model, self.script, self.passes = model, script, 0

    def forward(self, **inputs):
        out = self.model(**inputs)
        logits = torch.full_like(out.logits, -1e4)
        logits[:, -1, self.script[min(self.passes, len(self.script) - 1)]] = 0.0
        self.passes += 1
        out.logits = logits
        return out


def test_meep_answers_stop_at_the_template_s_end_of_turn_where_eos_differs(tiny_policy, smol_tokenizer):
    """A chat model ends its answer with the token its template closes turns with (Gemma's <end_of_turn>, Qwen base
    tokenizers' <|im_end|>), not always eos: sampling stops there too, so what it writes after the turn (here
    " 85", as if it went on in a new turn) is not read as its score. Stand-in: SmolLM2's tokenizer with its eos set
    to <|endoftext|>."""
    odd = copy.deepcopy(smol_tokenizer)
    odd.eos_token = "<|endoftext|>"
    script = [odd.convert_tokens_to_ids("<|im_end|>"), *odd(" 85", add_special_tokens=False)["input_ids"]]
    config = MEEPConfig(n_samples=2, temperature=0.0, max_new_tokens=6, fallback=50.0)
    meep = MEEPScorer(config, model=_Scripted(tiny_policy(0), script), tokenizer=odd)
    assert meep.answers(meep.prompts(["Hi there!"], ["Hello!"])) == [["", ""]]
    assert meep.score(["Hi there!"], ["Hello!"]).tolist() == [50.0]


def test_meep_cached_answers_are_keyed_by_where_sampling_stops(tiny_policy, smol_tokenizer):
    """Answers cached before sampling stopped at the template's end of turn ran past it where eos differs: they are
    not served to a scorer that stops there; where eos is the end of turn (SmolLM2) the key is the one it was."""
    odd = copy.deepcopy(smol_tokenizer)
    odd.eos_token = "<|endoftext|>"
    config = MEEPConfig(n_samples=1, temperature=0.0, max_new_tokens=4)
    plain = MEEPScorer(config, model=tiny_policy(0), tokenizer=copy.deepcopy(smol_tokenizer))
    moved = MEEPScorer(config, model=tiny_policy(0), tokenizer=odd)
    c = config
    old = json.dumps([c.model, c.dtype, c.n_samples, c.temperature, c.max_new_tokens, c.seed])
    assert plain._key("p") == hashlib.sha1((old + "p").encode("utf-8")).hexdigest()
    assert moved._key("p") != plain._key("p")
