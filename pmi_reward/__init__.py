"""pmi-reward: PMIScore as a reward for dialogue RL.

Train a scorer that estimates PMI(context; response) from frozen LM embeddings, score and rerank
replies with it, and use it as a TRL reward function for GRPO / RLOO / PPO fine-tuning.

The subpackages are the pipeline's stages: ``data`` -> ``scoring`` -> ``training`` -> ``rewards`` ->
``serving``, with ``evaluation`` (metrics, baselines, studies), ``policy`` (RL on chat policies) and ``cli``
(the ``pmi-reward`` command) on top. The names below are the public API, imported on first use (PEP 562): importing
a submodule, as the ``pmi-reward`` console script does before it takes over Ctrl-C, does not wait for torch.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .data.dialogues import Dialogue, load_dialogues, split_dialogues
    from .data.negatives import NegativeSpec, sample_negatives
    from .data.pairs import PairSet, load_pairs
    from .data.records import DataError
    from .rewards.options import RewardOptions
    from .rewards.remote import RemotePMIReward
    from .rewards.reward import PMIReward
    from .scoring.encoder import EncoderSpec, TextEncoder
    from .scoring.head import HeadConfig, PMIHead
    from .scoring.scorer import PMIScorer, ScorerLoadError
    from .scoring.templates import PromptTemplate, get_template
    from .training.loop import TrainConfig, train_head

_WHERE = {
    "Dialogue": ".data.dialogues",
    "load_dialogues": ".data.dialogues",
    "split_dialogues": ".data.dialogues",
    "NegativeSpec": ".data.negatives",
    "sample_negatives": ".data.negatives",
    "PairSet": ".data.pairs",
    "load_pairs": ".data.pairs",
    "DataError": ".data.records",
    "RewardOptions": ".rewards.options",
    "RemotePMIReward": ".rewards.remote",
    "PMIReward": ".rewards.reward",
    "EncoderSpec": ".scoring.encoder",
    "TextEncoder": ".scoring.encoder",
    "HeadConfig": ".scoring.head",
    "PMIHead": ".scoring.head",
    "PMIScorer": ".scoring.scorer",
    "ScorerLoadError": ".scoring.scorer",
    "PromptTemplate": ".scoring.templates",
    "get_template": ".scoring.templates",
    "TrainConfig": ".training.loop",
    "train_head": ".training.loop",
}

__version__ = "0.1.0"
__all__ = [  # the names of _WHERE
    "DataError",
    "Dialogue",
    "EncoderSpec",
    "HeadConfig",
    "NegativeSpec",
    "PMIHead",
    "PMIReward",
    "PMIScorer",
    "PairSet",
    "PromptTemplate",
    "RemotePMIReward",
    "RewardOptions",
    "ScorerLoadError",
    "TextEncoder",
    "TrainConfig",
    "get_template",
    "load_dialogues",
    "load_pairs",
    "sample_negatives",
    "split_dialogues",
    "train_head",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use and kept here; a subpackage's name, the subpackage."""
    where = _WHERE.get(name)
    if where is None:
        if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
            # a subpackage, with the modules this package imported eagerly before (pmi_reward.data.pairs.join_turns)
            for module in dict.fromkeys(_WHERE.values()):
                importlib.import_module(module, __name__)
            return importlib.import_module(f".{name}", __name__)
        raise AttributeError(f"module 'pmi_reward' has no attribute {name!r}")
    value = getattr(importlib.import_module(where, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
