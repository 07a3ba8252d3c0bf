"""Generic replies (``GENERIC_PROBES``) score near 0 or below under a scorer trained with the recommended
setting on real text, and below the true replies: the promise the README makes to reward users."""

from __future__ import annotations

import numpy as np
import pytest

from pmi_reward.data.dialogues import load_dialogues
from pmi_reward.data.negatives import NegativeSpec
from pmi_reward.data.pairs import PairSet
from pmi_reward.evaluation.generic import GENERIC_PROBES
from pmi_reward.scoring.encoder import EncoderSpec, TextEncoder
from pmi_reward.scoring.head import HeadConfig
from pmi_reward.scoring.templates import TEMPLATES
from pmi_reward.training.fit import fit_scorer
from pmi_reward.training.loop import TrainConfig


@pytest.mark.integration
def test_generic_replies_score_near_zero_or_below_and_under_true_replies():
    dialogues = load_dialogues("chitchat")
    train = PairSet.from_dialogues(dialogues[:150], 3, max_pairs_per_dialogue=4)
    val = PairSet.from_dialogues(dialogues[150:200], 3, max_pairs_per_dialogue=2)
    encoder = TextEncoder(EncoderSpec("minilm"))
    scorer, _ = fit_scorer(
        train,
        val,
        encoder,
        TEMPLATES["en"],
        TrainConfig(epochs=20, patience=4, seed=0),
        HeadConfig(line_turns=3),
        NegativeSpec(k_random=3, k_in_dialogue=0, k_context=1),
        progress=False,
    )
    contexts = val.context_texts[:40]
    true = scorer.score(contexts, val.response_texts[:40])
    generic = scorer.score([c for c in contexts for _ in GENERIC_PROBES], list(GENERIC_PROBES) * len(contexts))
    generic = generic.reshape(len(contexts), len(GENERIC_PROBES))
    assert np.isfinite(generic).all()
    assert generic.mean() < 0.25, generic.mean(axis=0)
    assert generic.mean() < true.mean() - 1.0, (generic.mean(), true.mean())
