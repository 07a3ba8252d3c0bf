"""``pmi-reward train``: pair files or a dialogue source in, a saved scorer directory out.

pmi-reward train --config scorer/minilm --dialogues chitchat --output_dir outputs/scorer-minilm
"""

from __future__ import annotations

import json
import sys

from ..configs import parse_args
from ..data.records import json_safe
from ..training.job import ARGUMENTS, train_scorer
from .processes import single_process

# train's own --help line for EncoderSpec's quantize, whose shared help offers int8 and int8-block: training refuses
# both (``training.fit``: a saved scorer never records them and loads with float32 embeddings)
HELP_TEXTS = {
    "quantize": "a scoring choice (score, rerank, serve): train refuses any value but none, since a saved scorer "
    "never records it and loads with float32 embeddings",
}


def main(argv: list[str] | None = None) -> int:
    single_process("train")  # before anything loads: it has no multi-process path
    summary = train_scorer(*parse_args(ARGUMENTS, argv, prog="pmi-reward train", help_texts=HELP_TEXTS))
    print(json.dumps(json_safe(summary), indent=2, allow_nan=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
