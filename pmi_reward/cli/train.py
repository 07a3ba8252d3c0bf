"""``pmi-reward train``: pair files or a dialogue source in, a saved scorer directory out.

pmi-reward train --config scorer/minilm --dialogues chitchat --output_dir outputs/scorer-minilm
"""

from __future__ import annotations

import json
import sys

from ..configs import parse_args
from ..data.records import json_safe
from ..training.job import ARGUMENTS, train_scorer


def main(argv: list[str] | None = None) -> int:
    summary = train_scorer(*parse_args(ARGUMENTS, argv, prog="pmi-reward train"))
    print(json.dumps(json_safe(summary), indent=2, allow_nan=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
