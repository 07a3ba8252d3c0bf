"""Options: one dataclass per concept, YAML configs that parse into the commands' dataclasses, shipped configs."""

import dataclasses
import importlib
import importlib.util
import inspect
import math
import os
import pkgutil
from pathlib import Path

import pytest
from conftest import load_recipe

import pmi_reward
from pmi_reward.cli.main import COMMANDS, main
from pmi_reward.configs import _list_only, config_path, parse_args, shipped_configs
from pmi_reward.data.negatives import NegativeSpec
from pmi_reward.rewards.options import RewardOptions
from pmi_reward.scoring.encoder import EncoderSpec
from pmi_reward.scoring.head import HeadConfig
from pmi_reward.scoring.templates import PromptTemplate
from pmi_reward.training.loop import TrainConfig

ROOT = Path(__file__).resolve().parents[1]


def _package_dataclasses() -> list[type]:
    found = {}
    for info in pkgutil.walk_packages(pmi_reward.__path__, "pmi_reward."):
        module = importlib.import_module(info.name)
        for _, obj in inspect.getmembers(module, dataclasses.is_dataclass):
            if inspect.isclass(obj) and obj.__module__.startswith("pmi_reward"):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return list(found.values())


@pytest.mark.parametrize(
    ("concept", "fields"),
    [
        (NegativeSpec, {"k_random", "k_in_dialogue", "k_context"}),
        (HeadConfig, {"hidden", "cap", "pair_product"}),
        (EncoderSpec, {"normalize", "max_length", "layer"}),  # (score and serve may override a saved batch size)
        (RewardOptions, {"center", "scale", "clip", "empty_score", "include_system", "max_chars"}),
        # (weight_decay is the scorer's optimizer's here and the policy's in PPOConfig, by TRL's name, as GRPOConfig's)
        (TrainConfig, {"objective", "lr", "epochs", "patience", "checkpoint_dir"}),
        (PromptTemplate, {"pair_template", "context_template", "response_template"}),
    ],
)
def test_each_concept_is_declared_in_one_dataclass(concept, fields):
    """A newcomer changes a default (e.g. the number of random negatives) in exactly one place. Fields a class
    declares itself: a subclass of TRL's SFTConfig inherits TRL's own ``max_length`` (sequence length), another
    concept of the same name."""
    declaring = [cls for cls in _package_dataclasses() if fields & set(inspect.get_annotations(cls))]
    assert declaring == [concept], [f"{c.__module__}.{c.__qualname__}" for c in declaring]


def test_saved_artefacts_are_frozen():
    for cls in (EncoderSpec, HeadConfig, PromptTemplate, NegativeSpec, RewardOptions):
        assert cls.__dataclass_params__.frozen, cls


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_subcommand_builds_its_parser(command, capsys):
    """Each command's dataclasses have unique field names (argparse refuses two options of one name)."""
    if command == "prepare-models":
        return  # takes model names, no options
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0 and "--config" in capsys.readouterr().out


def test_shipped_configs_resolve_by_name_or_path(tmp_path):
    assert {"scorer/minilm", "scorer/smollm2", "evaluate/paper", "demo/grpo", "demo/evaluate"} <= set(shipped_configs())
    assert config_path("scorer/minilm") == config_path("scorer/minilm.yaml")
    assert Path(config_path("scorer/minilm")).parent.parent == Path(pmi_reward.__file__).parent / "configs"
    own = tmp_path / "mine.yaml"
    own.write_text("k_random: 2\n")
    assert config_path(str(own)) == str(own)
    with pytest.raises(FileNotFoundError, match="no shipped config of that name .*scorer/minilm"):
        config_path("scorer/nope")


def _arguments(name: str):
    """(dataclasses, extra required flags) of each config's command."""
    from trl import GRPOConfig, ModelConfig, RLOOConfig

    from pmi_reward.evaluation.scorer_report import EvaluateArguments
    from pmi_reward.evaluation.study import ARGUMENTS as STUDY
    from pmi_reward.policy import evaluate, ppo, rft, trainers
    from pmi_reward.training.job import ARGUMENTS as TRAIN

    trl = (trainers.ScriptArguments, RewardOptions)
    scorer_recipe = (load_recipe("recipes/scorer/run.py").ScorerRecipeArguments, HeadConfig, NegativeSpec, TrainConfig)
    methods = {
        "grpo": (*trl, GRPOConfig, ModelConfig),
        "rloo": (*trl, RLOOConfig, ModelConfig),
        "ppo": ppo.ARGUMENTS,
        "rft": rft.ARGUMENTS,
        "dpo": rft.DPO_ARGUMENTS,
        "evaluate": evaluate.ARGUMENTS,
    }
    recipe = "recipes/smollm2-135m/"
    if name.startswith(("demo/scorers/", recipe + "scorers/")):
        return TRAIN, []
    if name.startswith((recipe + "tune/", recipe + "final/")):
        return methods[Path(name).stem.split("-")[0]], []  # final/dpo-d.yaml: a trial's settings of `dpo` (final.sh)
    return {
        "scorer/minilm": (TRAIN, []),
        "scorer/smollm2": (TRAIN, []),
        "scorer/recommended": (TRAIN, []),
        "evaluate/paper": ((EvaluateArguments, NegativeSpec), ["--scorer", "s", "--input", "i.csv"]),
        "demo/grpo": ((*trl, GRPOConfig, ModelConfig), []),
        "demo/evaluate": (evaluate.ARGUMENTS, []),
        "recipes/smollm2-135m/grpo/config_cpu.yaml": ((*trl, GRPOConfig, ModelConfig), []),
        "recipes/smollm2-135m/rloo/config_cpu.yaml": ((*trl, RLOOConfig, ModelConfig), []),
        "recipes/smollm2-135m/ppo/config_cpu.yaml": (ppo.ARGUMENTS, []),
        "recipes/smollm2-135m/evaluate.yaml": (evaluate.ARGUMENTS, []),
        "recipes/synthetic/config.yaml": ((load_recipe("recipes/synthetic/run.py").SyntheticData, *STUDY), []),
        "recipes/empirical/en.yaml": ((load_recipe("recipes/empirical/run.py").EmpiricalData, *STUDY), []),
        "recipes/empirical/zh.yaml": ((load_recipe("recipes/empirical/run.py").EmpiricalData, *STUDY), []),
        "recipes/quality/en.yaml": ((load_recipe("recipes/quality/run.py").QualityArguments, NegativeSpec), []),
        "recipes/scorer/lines.yaml": (scorer_recipe, []),
        "recipes/scorer/scaling.yaml": (scorer_recipe, []),
        "recipes/scorer/finetune.yaml": (scorer_recipe, []),
        "recipes/scorer/cross.yaml": (scorer_recipe, []),
    }[name]


CONFIGS = [*shipped_configs()] + [
    str(p.relative_to(ROOT)) for p in sorted((ROOT / "recipes").rglob("*.yaml")) if "accelerate" not in str(p)
]


@pytest.mark.parametrize("name", CONFIGS)
def test_every_config_parses_into_its_commands_dataclasses(name, monkeypatch):
    """YAML keys follow the dataclasses' field names (a renamed field would leave a key unknown)."""
    monkeypatch.chdir(ROOT)
    types, extra = _arguments(name)
    parsed = parse_args(types, ["--config", name, *extra])
    assert len(parsed) == len(types)
    negatives = [p for p in parsed if isinstance(p, NegativeSpec)]
    if name.startswith("recipes/") and name.endswith(("config.yaml", "en.yaml", "zh.yaml")):
        assert negatives == [NegativeSpec(3, 0, 0)]  # the paper's study protocol, set in the recipe's YAML
    if name == "scorer/recommended":
        assert negatives == [NegativeSpec(k_random=8, k_in_dialogue=0, k_context=1)]  # make scorer's mix


def test_the_default_mix_is_not_restated_in_configs():
    """Changing NegativeSpec's default changes every command that does not ask for another mix on purpose: the
    paper's protocol (``evaluate/paper``) and the recommended scorer (8 random replies, chosen on validation)."""
    import yaml

    on_purpose = {"evaluate/paper": {"k_random", "k_in_dialogue", "k_context"}, "scorer/recommended": {"k_random"}}
    for name in shipped_configs():
        keys = set(yaml.safe_load(Path(config_path(name)).read_text()))
        assert not keys & {"k_random", "k_in_dialogue", "k_context"} - on_purpose.get(name, set()), name


def test_a_trailing_config_and_unknown_model_names_are_user_errors(capsys):
    """A bare trailing --config crashed TRL's parser with an IndexError traceback; prepare-models "resolved" a typo
    or a flag as a Hub id and exited 0 having prepared nothing."""
    assert main(["evaluate", "--scorer", "s", "--input", "p.csv", "--config"]) == 2
    assert "--config needs a file or a shipped config name" in capsys.readouterr().err
    assert main(["prepare-models", "minilmm"]) == 2
    assert "minilmm: not a shipped model" in capsys.readouterr().err
    assert main(["prepare-models", "--help"]) == 0 and "shipped:" in capsys.readouterr().out


@dataclasses.dataclass
class _Options:
    tuned: list[str] = dataclasses.field(default_factory=list)
    hidden: list[int] | None = None
    samples: int = 2
    kl: bool = True
    note: str | None = None


def test_yaml_values_read_as_the_same_flags_would(tmp_path, monkeypatch):
    """argparse applies nargs and None-checks to flags only: a YAML scalar for a list option was read letter by letter
    (``tuned: outputs/run`` -> 'o', 'u', ...; ``hidden: 256`` crashed), and a YAML null reached an int or bool option
    as None (``kl: null`` turned the KL off)."""
    config = tmp_path / "c.yaml"
    config.write_text("tuned: outputs/run\nhidden: 256\nnote: null\n")
    (opts,) = parse_args([_Options], ["--config", str(config)])
    assert (opts.tuned, opts.hidden, opts.note) == (["outputs/run"], [256], None)
    # a string of its own is left alone where the option takes one (transformers' optim_target_modules: all-linear)
    assert _list_only(list[str] | None) and not _list_only(str | list[str] | None) and not _list_only(str)
    (opts,) = parse_args([_Options], [f"--config={config}", "--tuned", "a", "b"])  # argparse's other spelling
    assert opts.tuned == ["a", "b"] and opts.hidden == [256]
    for key in ("samples", "kl"):
        config.write_text(f"{key}: null\n")
        with pytest.raises(ValueError, match=f"--config {config}: {key}: null, but this option takes a"):
            parse_args([_Options], ["--config", str(config)])
    with pytest.raises(ValueError, match="not used"):  # an abbreviated flag is not taken for another (--tune: --tuned)
        parse_args([_Options], ["--tune", "x"])
    # transformers' parser read options from <program>.args beside the program, over the YAML's
    monkeypatch.setattr("sys.argv", [str(tmp_path / "tool")])
    (tmp_path / "tool.args").write_text("--samples 9")
    assert parse_args([_Options], []) == (_Options(),)


def test_study_dtypes_are_one_or_one_per_model():
    from pmi_reward.evaluation.study.runner import StudyArguments

    with pytest.raises(ValueError, match="one for all models or one per model"):
        StudyArguments(models=["minilm", "smollm2"], dtypes=["bfloat16", "float32", "float16"])
    # a model listed twice (e.g. at two dtypes): its runs are labelled by model and would merge into one row
    with pytest.raises(ValueError, match="'minilm' is listed twice"):
        StudyArguments(models=["minilm", "minilm"], dtypes=["float32", "bfloat16"])


def _imported_stages(node, parts: tuple[str, ...]) -> list[str]:
    """The top-level packages of pmi_reward that an import statement in the module at ``parts`` (its path under
    pmi_reward/) reaches: relative (``from ..policy import x``, ``from .. import policy``) or absolute
    (``from pmi_reward.policy import x``, ``from pmi_reward import policy``, ``import pmi_reward.policy.x``)."""
    import ast

    if isinstance(node, ast.Import):
        return [alias.name.split(".")[1] for alias in node.names if alias.name.startswith("pmi_reward.")]
    if not isinstance(node, ast.ImportFrom):
        return []
    module = [name for name in (node.module or "").split(".") if name]
    if node.level:
        dotted = [*list(parts[:-1])[: len(parts) - node.level], *module]
    elif module[:1] == ["pmi_reward"]:
        dotted = module[1:]
    else:
        return []
    return dotted[:1] if dotted else [alias.name for alias in node.names]


def test_imports_follow_the_stages():
    """CONTRIBUTING.md: a stage imports earlier stages, never later ones (data, scoring, training, rewards, serving,
    evaluation, policy, cli), by relative or absolute import; an import only for type hints (under TYPE_CHECKING)
    is no import."""
    import ast
    from pathlib import Path

    order = ["data", "scoring", "training", "rewards", "serving", "evaluation", "policy", "cli"]
    root = Path(__file__).resolve().parents[1] / "pmi_reward"
    later = []
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).parts
        if len(parts) < 2 or parts[0] not in order:
            continue
        tree = ast.parse(path.read_text())
        typing_only = {
            id(n)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
            for n in ast.walk(node)
        }
        for node in ast.walk(tree):
            for target in [] if id(node) in typing_only else _imported_stages(node, parts):
                if target in order and order.index(target) > order.index(parts[0]):
                    later.append(f"{path.relative_to(root)}:{node.lineno} imports {target}")
    assert not later, later


def test_the_study_scripts_print_their_help():
    """The empirical and synthetic recipes parse the study's options: argparse reads a help text's bare "%" as a
    format directive, and "95% intervals" made their --help crash."""
    from transformers import HfArgumentParser

    from pmi_reward.evaluation.study import ARGUMENTS

    assert "95% intervals" in HfArgumentParser(ARGUMENTS).format_help()


@dataclasses.dataclass
class _Typed:
    samples: int = 2
    hidden: int | None = None
    lr: float = 0.1
    kl: bool = True
    name: str = "run"
    best_of_n: list[int] = dataclasses.field(default_factory=list)
    scales: list[float] | None = None


def test_yaml_numbers_are_converted_and_checked_as_their_flags_are(tmp_path, capsys):
    """argparse converts a string default only: ``k_random: 1.5`` in YAML reached the code as a float (a TypeError
    after the scorer loaded) where ``--k_random 1.5`` was refused at once. A YAML value now goes through the option's
    type as its flag does, and a wrong one is refused by the option's name."""
    config = tmp_path / "c.yaml"
    config.write_text("samples: 3\nhidden: 256\nlr: 1\nkl: 0\nname: 2024\nbest_of_n: [4, '8']\nscales: 2\n")
    (opts,) = parse_args([_Typed], ["--config", str(config)])
    assert opts == _Typed(samples=3, hidden=256, lr=1.0, kl=False, name="2024", best_of_n=[4, 8], scales=[2.0])
    assert type(opts.lr) is float and type(opts.scales[0]) is float
    config.write_text("lr: .inf\nhidden: null\nkl: true\n")
    (opts,) = parse_args([_Typed], ["--config", str(config)])
    assert (opts.lr, opts.hidden, opts.kl) == (math.inf, None, True)
    for yaml_text, flag in (
        ("samples: 1.5", "--samples"),
        ("hidden: 2.0", "--hidden"),
        ("samples: true", "--samples"),
        ("lr: [1, 2]", "--lr"),
        ("kl: 2", "--kl"),
    ):
        config.write_text(yaml_text + "\n")
        with pytest.raises(SystemExit) as exit_:
            parse_args([_Typed], ["--config", str(config)])
        assert exit_.value.code == 2 and f"argument {flag}" in capsys.readouterr().err, yaml_text
    config.write_text("best_of_n: [4, 1.5]\n")
    with pytest.raises(ValueError, match=rf"--config {config}: best_of_n: invalid int value: 1.5"):
        parse_args([_Typed], ["--config", str(config)])
    # the command: one line and exit code 2 before the scorer loads
    config.write_text("k_random: 1.5\n")
    with pytest.raises(SystemExit) as exit_:
        main(["evaluate", "--config", str(config), "--scorer", str(tmp_path / "none"), "--input", "i.csv"])
    assert exit_.value.code == 2
    assert "argument --k_random/--k-random: invalid int value: '1.5'" in capsys.readouterr().err


def test_config_files_are_checked_by_name(tmp_path, capsys, monkeypatch):
    """An empty config alone was refused (by TRL, without saying how to fix it) and accepted in a merge of several;
    a misspelt key was refused by TRL's message, which named neither the file nor the option meant."""
    empty, other, typo, listed = (tmp_path / n for n in ("empty.yaml", "k2.yaml", "typo.yaml", "list.yaml"))
    empty.write_text("# nothing set\n")
    other.write_text("k_random: 2\n")
    typo.write_text("k_random: 2\nk_randm: 3\nkconext: 1\n")
    listed.write_text("- k_random: 2\n")
    run = ["evaluate", "--scorer", str(tmp_path / "none"), "--input", "i.csv"]
    for configs, message in (
        ([empty], f"--config {empty}: the file is empty; expected a mapping"),
        ([empty, other], f"--config {empty}: the file is empty; expected a mapping"),
        ([other, empty], f"--config {empty}: the file is empty; expected a mapping"),
        ([listed], f"--config {listed}: the file holds a list; expected a mapping"),
        (
            [other, typo],
            f"--config {typo}: no option of this command is named 'k_randm' (did you mean 'k_random'?), 'kconext' "
            "(did you mean 'k_context'?)",
        ),
    ):
        argv = [*run, *(arg for c in configs for arg in ("--config", str(c)))]
        assert main(argv) == 2, configs
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
    monkeypatch.setenv("PMI_REWARD_TEST_VAR", "0")  # (restored after the test)
    typo.write_text("env: {PMI_REWARD_TEST_VAR: '1'}\nk_random: 2\n")  # TRL's own key: environment variables
    assert parse_args((NegativeSpec,), ["--config", str(typo)]) == (NegativeSpec(k_random=2),)
    assert os.environ["PMI_REWARD_TEST_VAR"] == "1"  # set, not taken for an option


@dataclasses.dataclass
class _Scorer:
    scorer: str = "outputs/scorer"


def test_yaml_booleans_and_containers_mean_what_the_option_s_dataclass_means(tmp_path, capsys):
    """A YAML bool for a text option became the text "True"/"False": TRL's GRPOConfig maps ``scale_rewards: false`` to
    "none" (the text "False" failed at GRPO's first step, after the models loaded) and transformers reads
    ``fsdp: false`` (the text failed at parse). TRL's and transformers' options now take the YAML's value as TRL's
    parser hands it; ours refuse a bool, list or mapping that no flag gives by name (a list or mapping had ended in a
    traceback, exit code 1)."""
    from trl import GRPOConfig

    config = tmp_path / "c.yaml"
    for value, scaling in (("false", "none"), ("true", "group"), ("batch", "batch")):
        config.write_text(f"scale_rewards: {value}\nfsdp: false\nuse_cpu: true\nreport_to: none\n")
        (cfg,) = parse_args((GRPOConfig,), ["--config", str(config), "--output_dir", str(tmp_path / "out")])
        assert (cfg.scale_rewards, cfg.fsdp) == (scaling, False), value
    for yaml_text in ("name: true", "name: no", "name: [a, b]", "best_of_n: {a: 1}", "best_of_n: [[1]]"):
        config.write_text(yaml_text + "\n")
        with pytest.raises(ValueError, match=f"--config {config}: (name|best_of_n): "):
            parse_args([_Typed], ["--config", str(config)])
    score = ["score", "--input", "i.csv", "--output", str(tmp_path / "o.csv"), "--config", str(config)]
    judge = ["evaluate-policy", "--output_dir", str(tmp_path / "ep"), "--config", str(config)]
    for argv, yaml_text, message in (
        (score, "scorer: false", "scorer: false, but this option takes text (quote it if the text is meant)"),
        (score, "scorer: [outputs/a, outputs/b]", "scorer: a list, but this option takes text"),
        (judge, "judges:\n  minilm: outputs/x", "judges: a mapping, but this option takes a list"),
        (judge, "judge_val_auc: [{lm-pmi: 0.886}]", "judge_val_auc: a mapping as an item, but this option takes"),
        (judge, "judges: [[a, b]]", "judges: a list as an item, but this option takes a list of single values"),
    ):
        config.write_text(yaml_text + "\n")
        assert main(argv) == 2, yaml_text
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"--config {config}: {message}" in err, err
    # a value a later --config overrides is not the one used: layering is not refused for it
    later = tmp_path / "later.yaml"
    later.write_text("scorer: outputs/x\n")
    config.write_text("scorer: false\n")
    (args,) = parse_args([_Scorer], ["--config", str(config), "--config", str(later)])
    assert args.scorer == "outputs/x"
