"""The OpenRLHF and verl examples of ``docs/serving.md`` against the upstream argument names.

``tests/data/upstream/`` holds what upstream accepts, read from its source at the revisions named there:
OpenRLHF's ``train_ppo_ray.py`` options (v0.11.0 and v0.9.0) and verl's composed PPO config keys and reward-manager
registries (b178a3c, after v0.7.0; v0.6.1). Each OpenRLHF command is parsed by an argparse parser rebuilt from
those options (an unknown option is an error, as upstream); each verl override must name a key of the config
(or add one with ``+``, as Hydra requires), and its reward manager must be one the chosen path registers.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "serving.md").read_text(encoding="utf-8")
UPSTREAM = ROOT / "tests" / "data" / "upstream"
OPENRLHF = json.loads((UPSTREAM / "openrlhf_train_ppo_ray.json").read_text())
VERL = json.loads((UPSTREAM / "verl_ppo_trainer.json").read_text())
VERL_CURRENT, VERL_06 = VERL["b178a3c (v0.7.0 + 125)"], VERL["v0.6.1"]


def _blocks(language: str, marker: str) -> list[str]:
    """The fenced ``language`` blocks of the doc whose first line is the comment ``marker``."""
    blocks = re.findall(rf"```{language}\n(.*?)```", DOC, re.S)
    return [b for b in blocks if b.startswith(f"# {marker}")]


def _parser(version: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"train_ppo_ray {version}", exit_on_error=False, add_help=False)
    for name, how in OPENRLHF[version]["options"].items():
        if how in ("store_true", "store_false"):
            parser.add_argument(name, action=how)
        elif how.startswith("nargs:"):
            nargs = how.split(":", 1)[1]
            parser.add_argument(name, nargs=int(nargs) if nargs.isdigit() else nargs)
        else:
            parser.add_argument(name)
    return parser


def _openrlhf_args(block: str) -> list[str]:
    """The arguments after ``-m openrlhf.cli.train_ppo_ray`` in a (line-continued) shell command."""
    words = shlex.split(block.replace("\\\n", " "), comments=True)
    return words[words.index("openrlhf.cli.train_ppo_ray") + 1 :]


def _parse(version: str, args: list[str]) -> argparse.Namespace:
    namespace, unknown = _parser(version).parse_known_args(args)
    if unknown:
        raise argparse.ArgumentError(None, f"unrecognized arguments: {' '.join(unknown)}")
    return namespace


@pytest.mark.parametrize(
    ("marker", "version", "other"),
    [("OpenRLHF >= 0.10.2", "v0.11.0", "v0.9.0"), ("OpenRLHF <= 0.10.1", "v0.9.0", "v0.11.0")],
)
def test_openrlhf_commands_parse_with_their_release(marker, version, other):
    (block,) = _blocks("bash", marker)
    args = _openrlhf_args(block)
    parsed = vars(_parse(version, args))
    url = parsed.get("reward.remote_url") or parsed.get("remote_rm_url")
    assert url == "http://rm-host:5000/get_reward"
    assert (parsed.get("algo.advantage.estimator") or parsed.get("advantage_estimator")) == "group_norm"
    # with group_norm OpenRLHF clips z-scores (within 2.5 for 8 samples): a clip range there did nothing
    assert parsed.get("reward.clip_range") is None and parsed.get("reward_clip_range") is None
    with pytest.raises(argparse.ArgumentError, match="unrecognized arguments"):
        _parse(other, args)  # the names changed in v0.10.2: neither release takes the other's command


def _overrides(block: str) -> dict[str, str]:
    words = shlex.split(block.replace("\\\n", " "), comments=True)
    return dict(w.split("=", 1) for w in words if "=" in w)


def test_verl_reward_loop_overrides_name_real_keys():
    (block,) = _blocks("bash", "verl >= 0.7: reward loop")
    overrides = _overrides(block)
    keys = set(VERL_CURRENT["config_keys"])
    for key in overrides:
        if key.startswith("+"):
            assert key[1:] not in keys, f"{key}: an existing key takes no '+' (Hydra refuses it)"
            assert key.startswith("+custom_reward_function.reward_kwargs.")
        else:
            assert key in keys, f"{key}: not in verl's config"
    manager = overrides.get("reward_model.reward_manager", "naive")  # verl's default
    assert manager in VERL_CURRENT["reward_loop_managers"]
    assert overrides.get("reward_model.use_reward_loop", "true") == "true"
    assert overrides["custom_reward_function.name"] == "compute_score"
    assert "center" not in " ".join(overrides)  # the reward loop cannot centre: one response per call
    path = overrides["custom_reward_function.path"]
    module = importlib.import_module(path.removeprefix("pkg://"))  # verl's load_module does this for pkg://
    assert callable(module.compute_score)


def _flat(tree: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and not key.endswith("reward_kwargs"):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def test_verl_legacy_batch_config_names_real_keys():
    (block,) = _blocks("yaml", "verl legacy batch manager")
    config = _flat(yaml.safe_load(block))
    assert config["reward_model.use_reward_loop"] is False  # the only way to the batch manager in verl >= 0.7
    assert "reward_model.use_reward_loop" in VERL_CURRENT["config_keys"]
    assert "reward_model.use_reward_loop" not in VERL_06["config_keys"]  # hence "leave this line out on 0.6"
    for release in (VERL_CURRENT, VERL_06):
        assert config["reward_model.reward_manager"] in release["legacy_managers"]
        assert {"reward_model.reward_manager", "custom_reward_function.path", "custom_reward_function.name"} <= set(
            release["config_keys"]
        )
    assert config["reward_model.reward_manager"] not in VERL_CURRENT["reward_loop_managers"]
    assert config["custom_reward_function.name"] == "compute_score_batch"
    kwargs = config["custom_reward_function.reward_kwargs"]
    assert isinstance(kwargs, dict) and kwargs["center"] == "group" and kwargs["url"].startswith("http")
