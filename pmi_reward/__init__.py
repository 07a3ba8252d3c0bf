"""pmi-reward: PMIScore as a reward for dialogue RL.

Train a scorer that estimates PMI(context; response) from frozen LM embeddings, score and rerank
replies with it, and use it as a TRL reward function for GRPO / RLOO / PPO fine-tuning.

The subpackages are the pipeline's stages: ``data`` -> ``scoring`` -> ``training`` -> ``rewards`` ->
``serving``, with ``evaluation`` (metrics, baselines, studies), ``policy`` (RL on chat policies) and ``cli``
(the ``pmi-reward`` command) on top. The names below are the public API.
"""

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

__version__ = "0.1.0"
__all__ = [
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
