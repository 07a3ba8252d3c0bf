"""``samples.jsonl`` and ``samples.md`` are UTF-8 whatever the locale: replies are written raw
(``ensure_ascii=False``), so a locale's encoding (ASCII under ``LC_ALL=C``) could not write a non-ASCII reply."""

import os
import subprocess
import sys

import pytest

from pmi_reward.policy.samples import read_samples

ROUND_TRIP = """
import sys
from pathlib import Path
from pmi_reward.policy.samples import read_samples, write_records

out = Path(sys.argv[1])
replies = ["Caf\\u00e9 \\U0001F600", "one\\u2028two\\x85three"]
rec = {"context": "Hi \\u00e0 bient\\u00f4t", "base": [{"reply": r, "pmi": {"j": 0.1}, "tokens": 3, "cut": False}
                                                      for r in replies]}
write_records(out, [rec, rec], 1)
contexts, _, back = read_samples(out / "samples.jsonl")
assert contexts == [rec["context"]] * 2 and back["base"].texts == [replies] * 2, back["base"].texts
print("ok")
"""


def test_samples_round_trip_under_an_ascii_locale(tmp_path):
    """Under LC_ALL=C (no UTF-8 mode) write_records raised UnicodeEncodeError on a non-ASCII reply, at the end of
    an evaluation, leaving samples.jsonl empty; read_samples could not read such a file back."""
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"}
    env.pop("PYTHONIOENCODING", None)
    run = subprocess.run([sys.executable, "-c", ROUND_TRIP, str(tmp_path)], env=env, capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]
    md = (tmp_path / "samples.md").read_text(encoding="utf-8")
    assert "Caf\u00e9 \U0001f600" in md


def test_a_samples_file_that_is_not_utf8_is_named(tmp_path):
    path = tmp_path / "samples.jsonl"
    path.write_bytes(b'{"context": "caf\xe9", "base": []}\n')
    with pytest.raises(ValueError, match="samples.jsonl: not UTF-8 text"):
        read_samples(path)
