"""pmi-reward: PMIScore as a reward for dialogue RL.

Train a scorer that estimates PMI(context; response) from frozen LM embeddings, score and rerank
replies with it, and use it as a TRL reward function for GRPO / RLOO / PPO fine-tuning.
"""

from .data import Dialogue, load_dialogues, split_dialogues
from .encoder import EncoderSpec, TextEncoder
from .head import HeadConfig, PMIHead
from .io import DataError
from .negatives import NegativeSpec, sample_negatives
from .pairs import PairSet, load_pairs
from .prompts import PromptTemplate, get_template
from .remote import RemotePMIReward
from .reward import PMIReward, RewardOptions
from .scorer import PMIScorer, ScorerLoadError
from .training import TrainConfig, train_head

__version__ = "0.1.0"
__all__ = [
    "DataError", "Dialogue", "EncoderSpec", "HeadConfig", "NegativeSpec", "PMIHead", "PMIReward", "PMIScorer", "PairSet",
    "PromptTemplate", "RemotePMIReward", "RewardOptions", "ScorerLoadError", "TextEncoder", "TrainConfig",
    "get_template", "load_dialogues", "load_pairs", "sample_negatives", "split_dialogues", "train_head",
]
