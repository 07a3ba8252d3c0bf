"""``pmi-reward score`` and ``rerank``: the embedding cache is chosen as ``train`` chooses it (``--cache_dir``,
``--no_cache``, by default ``$PMI_REWARD_CACHE/embeddings``), and ``rerank`` shows a progress bar while it scores
many candidates, on stderr only: its stdout is its output (the ranked table, or one JSON line with ``--output``)."""

from __future__ import annotations

import json

import pytest

from pmi_reward.cli.main import main
from pmi_reward.rewards.rerank import rerank_many
from pmi_reward.scoring.cache import EmbeddingCache

CONTEXT = "I went hiking last weekend.\nWhere did you go?\nYosemite, up to Half Dome."
# more than one scorer call of the reward's (batch_size 256): the bar is drawn from two calls on
MANY = [f"Reply number {i}: did you see the falls?" for i in range(300)]


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    """``$PMI_REWARD_CACHE`` in the test's folder (the default cache goes there, not to the user's home), with bars
    allowed whatever the environment says."""
    home = tmp_path / "cache-home"
    monkeypatch.setenv("PMI_REWARD_CACHE", str(home))
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    return home


def _cached(folder) -> int:
    """How many embeddings the cache in ``folder`` holds (0: none, or no cache file there)."""
    if not (folder / "embeddings.sqlite").exists():
        return 0
    cache = EmbeddingCache(folder)
    try:
        return len(cache)
    finally:
        cache.close()


def _score_argv(scorer_dir, tmp_path, *flags: str) -> list[str]:
    rows = tmp_path / "pairs.jsonl"
    rows.write_text(json.dumps({"context": CONTEXT, "response": "Did you see Half Dome?"}) + "\n")
    out = tmp_path / "scored.jsonl"
    return ["score", "--scorer", str(scorer_dir), "--input", str(rows), "--output", str(out), "--overwrite", *flags]


def _rerank_argv(scorer_dir, *flags: str) -> list[str]:
    return ["rerank", "--scorer", str(scorer_dir), "--context", CONTEXT, "--candidates", "Nice.", "Half Dome?", *flags]


@pytest.mark.parametrize("command", ["score", "rerank"])
def test_the_cache_folder_given_is_the_one_written(command, tiny_scorer_dir, tmp_path, cache_home, capsys):
    """``--cache_dir`` reaches the scorer (its embeddings land there, none in the default folder); without it they
    land in ``$PMI_REWARD_CACHE/embeddings`` as ``train``'s and ``evaluate``'s do; ``--no_cache`` writes none."""

    def argv(*flags: str) -> list[str]:
        if command == "score":
            return _score_argv(tiny_scorer_dir, tmp_path, *flags)
        return _rerank_argv(tiny_scorer_dir, *flags)

    given, default = tmp_path / "my-cache", cache_home / "embeddings"
    assert main(argv("--cache_dir", str(given))) == 0
    assert _cached(given) > 0
    assert not default.exists()
    assert main(argv()) == 0
    assert _cached(default) == _cached(given)  # the same texts embedded: the same entries, in the default folder
    for name in ("embeddings.sqlite", "embeddings.sqlite-wal", "embeddings.sqlite-shm"):
        for folder in (given, default):
            (folder / name).unlink(missing_ok=True)
    assert main(argv("--no_cache")) == 0
    assert not any(given.iterdir()) and not any(default.iterdir())
    capsys.readouterr()


@pytest.mark.parametrize("command", ["score", "rerank"])
def test_cache_dir_and_no_cache_together_are_refused(command, tmp_path, capsys):
    """Both given: one would be dropped without a word; refused before anything loads (exit 2, one line)."""
    argv = [command, "--scorer", str(tmp_path / "none"), "--cache_dir", str(tmp_path / "c"), "--no_cache"]
    argv += ["--input", "in.csv", "--output", str(tmp_path / "o.csv")] if command == "score" else ["--context", "hi"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--cache_dir" in err and "--no_cache" in err and "not both" in err
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("command", ["score", "rerank"])
def test_help_reads_as_trains(command, capsys):
    """The cache options read the same in every command that takes them (``train``'s help text)."""

    def help_text(name: str) -> str:
        with pytest.raises(SystemExit):
            main([name, "--help"])
        return " ".join(capsys.readouterr().out.split())

    mine, trains = help_text(command), help_text("train")
    for option in (
        "--cache_dir CACHE_DIR, --cache-dir CACHE_DIR embedding cache folder (default: $PMI_REWARD_CACHE/embeddings; "
        "~/.cache/pmi_reward/embeddings where $PMI_REWARD_CACHE is unset)",
        "--no_cache [NO_CACHE], --no-cache [NO_CACHE] do not read or write the embedding cache (default: False)",
    ):
        assert option in trains and option in mine


def test_rerank_progress_goes_to_stderr_never_stdout(tiny_scorer_dir, tmp_path, cache_home, capsys):
    """Many candidates: a bar on stderr, stdout only the ranked table; ``--no_progress``: no bar; with ``--output``
    stdout is its one JSON line."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"context": CONTEXT, "candidates": MANY}) + "\n")
    base = ["rerank", "--scorer", str(tiny_scorer_dir), "--input", str(rows)]  # the cache: in cache_home
    assert main(base) == 0
    captured = capsys.readouterr()
    assert "reranking" in captured.err and "300/300" in captured.err
    assert "reranking" not in captured.out and "\r" not in captured.out and "%|" not in captured.out
    lines = captured.out.splitlines()
    assert lines[0] == "   PMI  reply" and len(lines) == 1 + len(MANY)
    assert sorted(line[8:] for line in lines[1:]) == sorted(MANY)

    assert main([*base, "--no_progress"]) == 0
    quiet = capsys.readouterr()
    assert "reranking" not in quiet.err and quiet.out == captured.out

    out = tmp_path / "ranked.jsonl"
    assert main([*base, "--output", str(out)]) == 0
    written = capsys.readouterr()
    assert "300/300" in written.err
    assert json.loads(written.out) == {"rows": 1, "output": str(out)}


def test_rerank_many_progress_gives_the_same_values(spread_scorer, capsys, monkeypatch):
    """The bar changes nothing but stderr, strict or not; few candidates (one scorer call) draw no bar."""
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    contexts, candidates = [CONTEXT, "Did you watch the match?"], [MANY[:150], [*MANY[150:], ""]]
    for strict in (False, True):
        plain = rerank_many(spread_scorer, contexts, candidates, strict=strict)
        assert "reranking" not in capsys.readouterr().err
        shown = rerank_many(spread_scorer, contexts, candidates, strict=strict, progress=True)
        captured = capsys.readouterr()
        assert shown == plain
        assert "reranking" in captured.err and "300/300" in captured.err and captured.out == ""
    rerank_many(spread_scorer, [CONTEXT], [MANY[:3]], progress=True)
    assert "reranking" not in capsys.readouterr().err
