"""How far the en study's published split files share dialogues: rows of validation and test whose ``dialog_key``
is also in an earlier split. The files are disjoint by row, not by dialogue; every study figure uses them as
published.

python recipes/empirical/split_overlap.py ../shared/data/pmiscore/datasets/empirical/en
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pmi_reward.data.records import read_records, require_text

sys.path.append(str(Path(__file__).resolve().parents[1]))  # recipes/: the scripts' shared input check (run by path)
from recipe_inputs import STUDY_DATA, require_inputs  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="a folder with train.csv, val.csv and test.csv")
    args = parser.parse_args(argv)
    expected = f"FOLDER should be datasets/empirical/<lang> of {STUDY_DATA}"
    require_inputs(parser.prog, expected, ["train.csv", "val.csv", "test.csv"], args.folder)
    keys = {}
    for split in ("train", "val", "test"):
        path = args.folder / f"{split}.csv"
        keys[split] = require_text(read_records(path), path, "dialog_key")
    for split, earlier in (("val", ["train"]), ("test", ["train"]), ("test", ["val"])):
        seen = {k for e in earlier for k in keys[e]}
        shared = sum(k in seen for k in keys[split])
        print(f"{split}: {shared} of {len(keys[split])} rows have a dialog_key that is also in {'/'.join(earlier)}")


if __name__ == "__main__":
    main()
