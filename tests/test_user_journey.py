"""A new user's first mistakes, each ended by one message that names the mistake and the fix (review round 27):
a reward server's key missing or mistyped on the trainer's side, ``rft``/``dpo`` on a CPU-only machine with bf16
unset, a scorer folder given as a policy or an encoder, the RL commands' default scorer, a misspelt shipped model."""

import json
import logging
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
import yaml

from pmi_reward.cli.main import main
from pmi_reward.configs import parse_args
from pmi_reward.policy import rft, trainers
from pmi_reward.rewards.remote import API_KEY_ENV, RemotePMIReward, RemoteRewardError
from pmi_reward.scoring import models
from pmi_reward.scoring.scorer import DEFAULT_SCORER, FORMAT, ScorerLoadError

ROOT = Path(__file__).resolve().parents[1]
KEY = "the-right-key"


# -- 1. an API key refused from the start raises; one refused after an answer does not stop the run --------------


class _KeyedServer(BaseHTTPRequestHandler):
    """A reward server stand-in that answers only ``Authorization: Bearer <accepted>`` (else ``refusal``, as
    ``pmi-reward serve`` answers 401); ``accepted`` can change between calls (a key rotated mid-run). ``health``:
    ``"guarded"`` (``/health`` needs the key too, as ``pmi-reward serve``'s), ``"open"`` (answered without one, as a
    proxy leaves a load balancer's health path) or a status ``/health`` always gets (403: a gateway exposing
    ``/score`` alone, as AWS API Gateway answers a route it lacks)."""

    protocol_version = "HTTP/1.1"
    accepted, refusal, health = KEY, 401, "guarded"

    def log_message(self, *args):
        pass

    def _send(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _answer(self, payload: dict) -> None:
        if self.headers.get("Authorization") != f"Bearer {type(self).accepted}":
            self._send(type(self).refusal, {"error": "missing or wrong API key"})
        else:
            self._send(200, payload)

    def do_GET(self):
        payload = {"scorer": {"trained_context_turns": 3}, "reward_options": {"max_chars": 100_000}}
        if type(self).health == "open":
            self._send(200, payload)
        elif isinstance(type(self).health, int):
            self._send(type(self).health, {"message": "Missing Authentication Token"})
        else:
            self._answer(payload)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self._answer({"scores": [1.5] * len(body["pairs"])})


@pytest.fixture
def keyed_server(stub_http_server):
    """Starts a ``_KeyedServer`` (its own subclass, so that tests may change what it accepts); (url, handler)."""

    def start(refusal: int = 401, health: str | int = "guarded"):
        return stub_http_server(_KeyedServer, accepted=KEY, refusal=refusal, health=health)

    return start


def test_a_missing_or_wrong_key_raises_at_the_first_call_whatever_on_failure_says(tiny_scorer, monkeypatch):
    """README's set-up without the key exported on the trainer's host (or mistyped): every call returned None for
    every sample (zero advantage, a whole run learning nothing) with a warning. Against ``pmi-reward serve``'s own
    server, the first call now raises, naming where the key comes from and never the key."""
    from pmi_reward.serving.server import RewardServer, ServerConfig

    server = RewardServer(tiny_scorer, ServerConfig(port=0, api_key=KEY)).start()
    try:
        monkeypatch.delenv(API_KEY_ENV, raising=False)
        with pytest.raises(RemoteRewardError, match=r"HTTP 401.*no API key was sent \(neither api_key= nor \$PMI_REW"):
            RemotePMIReward(server.url).score_sync(["I love jazz."], ["Coltrane!"])
        for on_failure in ("none", "raise"):
            with pytest.raises(RemoteRewardError, match=r"the API key from api_key was refused") as info:
                RemotePMIReward(server.url, api_key="a-typo", on_failure=on_failure).score_sync(["c"], ["x"])
            assert "a-typo" not in str(info.value) and "$PMI_REWARD_API_KEY" in str(info.value)
            assert type(info.value).__name__ == "RemoteKeyError" and info.value.status == 401
        monkeypatch.setenv(API_KEY_ENV, "env-typo")
        with pytest.raises(RemoteRewardError, match=r"the API key from \$PMI_REWARD_API_KEY was refused") as info:
            RemotePMIReward(server.url).score_sync(["c"], ["x"])
        assert "env-typo" not in str(info.value)
        assert RemotePMIReward(server.url, api_key=KEY).score_sync(["c"], ["x"])[0] is not None  # the right key
    finally:
        server.close()


@pytest.mark.parametrize("refusal", [401, 403])
def test_a_key_refused_after_an_answer_is_an_ordinary_failure(keyed_server, refusal, caplog):
    """A key rotated on the server mid-run must not crash a long run: once a request of the reward has been
    answered, a refusal gives None with a warning (``on_failure="none"``) as other failures do; a 403 (a gateway's
    refusal) is read as a 401."""
    url, handler = keyed_server(refusal)
    reward = RemotePMIReward(url, api_key=KEY, retries=0)
    assert reward.score_sync(["c", "c"], ["x", "y"]) == [1.5, 1.5]
    handler.accepted = "a-rotated-key"
    with caplog.at_level(logging.WARNING):
        assert reward.score_sync(["c", "c"], ["x", "y"]) == [None, None]
    assert f"HTTP {refusal}" in caplog.text and "returning None" in caplog.text
    raising = RemotePMIReward(url, api_key="a-rotated-key", retries=0, on_failure="raise")
    assert raising.score_sync(["c"], ["x"]) == [1.5]
    handler.accepted = KEY
    with pytest.raises(RemoteRewardError) as info:  # on_failure="raise" raises, as for any failure
        raising.score_sync(["c"], ["x"])
    assert type(info.value).__name__ == "RemoteRewardError"  # not the key error: it had answered
    with pytest.raises(RemoteRewardError, match=f"HTTP {refusal}.*key from api_key was refused") as info:
        RemotePMIReward(url, api_key="a-rotated-key", retries=0).score_sync(["c"], ["x"])  # a stale key from the start
    assert type(info.value).__name__ == "RemoteKeyError"


@pytest.mark.parametrize("on_failure", ["none", "raise"])
def test_an_open_health_path_does_not_vouch_for_the_key(keyed_server, on_failure):
    """A proxy that answers ``/health`` without a key (a load balancer's health check) and guards ``/score``: its
    ``/health`` answer counted as "a request answered", so a wrong key from the start read as a key rotated mid-run,
    and the whole run trained on None rewards. Only a scoring request's answer proves the key."""
    url, _ = keyed_server(401, health="open")
    reward = RemotePMIReward(url, api_key="a-typo", retries=0, on_failure=on_failure)
    for _ in range(2):  # the first call and every later one
        with pytest.raises(RemoteRewardError, match=r"/score: HTTP 401.*key from api_key was refused") as info:
            reward.score_sync(["c"], ["x"])
        assert type(info.value).__name__ == "RemoteKeyError"
    assert RemotePMIReward(url, api_key=KEY, retries=0).score_sync(["c"], ["x"]) == [1.5]


def test_a_gateway_without_health_is_not_blamed_on_the_key(keyed_server):
    """A gateway exposing ``/score`` alone answers 403 for ``/health`` (AWS API Gateway's "Missing Authentication
    Token" for a route it lacks): with ``max_context_turns`` given (no turns to learn) the right key scored nothing
    and was reported refused; ``/health``'s 403 is now read as its 404/405 are. Without ``max_context_turns``,
    the key error says that passing it skips ``/health``; a wrong key is still told by ``/score``'s answer."""
    url, _ = keyed_server(403, health=403)
    assert RemotePMIReward(url, api_key=KEY, max_context_turns=3, retries=0).score_sync(["c"], ["x"]) == [1.5]
    with pytest.raises(RemoteRewardError, match=r"/score: HTTP 403.*key from api_key was refused") as info:
        RemotePMIReward(url, api_key="a-typo", max_context_turns=3, retries=0).score_sync(["c"], ["x"])
    assert type(info.value).__name__ == "RemoteKeyError"
    with pytest.raises(RemoteRewardError, match=r"/health: HTTP 403.*pass max_context_turns to skip it$") as info:
        RemotePMIReward(url, api_key=KEY, retries=0).score_sync(["c"], ["x"])
    assert type(info.value).__name__ == "RemoteKeyError"


# -- 2. rft and dpo on a CPU-only machine: an unset bf16 settled, --bf16 true refused --------------------------


@pytest.mark.parametrize("command", ["rft", "dpo"])
def test_rft_and_dpo_settle_an_unset_bf16_on_a_cpu_only_machine(command, cpu_only, tmp_path, capsys):
    """TRL's SFTConfig/DPOConfig turn an unset bf16 on, which transformers refused on a CPU-only machine, pointing to
    --use_cpu (bf16 autocast: emulated, ~25x slower on an AVX2 CPU); grpo/rloo already settled it. Now rft and dpo
    train in float32 there; --bf16 true is refused naming the flags; --use_cpu true keeps TRL's default."""
    arguments = rft.ARGUMENTS if command == "rft" else rft.DPO_ARGUMENTS
    flags = ["--output_dir", str(tmp_path), "--report_to", "none"]
    config = parse_args(arguments, flags)[3]
    assert config.bf16 is False and not config.use_cpu
    assert main([command, *flags, "--bf16", "true"]) == 2
    err = capsys.readouterr().err
    assert "--bf16 true: no GPU here computes bfloat16; pass --bf16 false" in err and "--use_cpu true" in err
    assert parse_args(arguments, [*flags, "--use_cpu", "true"])[3].bf16 is True
    assert parse_args(arguments, [*flags, "--bf16", "false"])[3].bf16 is False


def test_the_settled_configs_are_still_trls_and_pickle(tmp_path):
    """``train_rft`` tells RFT from DPO by TRL's classes, and the trainer pickles its config into each checkpoint
    (``training_args.bin``): the settled configs remain instances of TRL's, and pickle."""
    import pickle

    from trl import DPOConfig, SFTConfig

    sft = rft.RFTSFTConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[])
    dpo = rft.RFTDPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[])
    assert isinstance(sft, SFTConfig) and not isinstance(sft, DPOConfig) and isinstance(dpo, DPOConfig)
    for config in (sft, dpo):
        assert type(pickle.loads(pickle.dumps(config))) is type(config)


# -- 3. a scorer folder given as a policy or as an encoder --------------------------------------------------


def test_a_scorer_folder_as_a_policy_is_named_a_scorer(tiny_scorer_dir, capsys):
    """As a policy (rerank best-of-n, grpo/rloo/ppo/rft/dpo, evaluate-policy), a scorer folder was refused for
    lacking a tokenizer, with the advice to save one into it; now it is named for what it is."""
    from pmi_reward.policy.loading import load_policy

    scorer = str(tiny_scorer_dir)
    with pytest.raises(FileNotFoundError, match="a pmi-reward scorer .*not a chat model .*pass it as --scorer") as info:
        load_policy(scorer, device="cpu")
    assert "tokenizer" not in str(info.value)
    assert main(["rerank", "--context", "I went hiking.", "--scorer", scorer, "--model", scorer, "--n", "2"]) == 2
    assert f"{scorer}: a pmi-reward scorer (written by `pmi-reward train`), not a chat model" in capsys.readouterr().err


def test_a_scorer_folder_as_an_encoder_is_named_a_scorer_with_its_encoder(tiny_scorer_dir, tmp_path):
    """As ``train --model`` (the encoder), a scorer folder drew transformers' "install sentencepiece or tiktoken";
    now it is named a scorer, with the encoder to build on (a fine-tuned one: the folder inside the scorer)."""
    from pmi_reward.scoring.encoder import EncoderSpec, TextEncoder

    scorer = str(tiny_scorer_dir)
    encoder = json.loads((tiny_scorer_dir / "config.json").read_text())["encoder"]["model"]
    message = rf"a pmi-reward scorer .*not a transformers model: pass it as --scorer .*give --model {encoder}$"
    for load in (
        lambda: TextEncoder(EncoderSpec(model=scorer), device="cpu"),
        lambda: TextEncoder(EncoderSpec(model=scorer, pooling="mean"), device="cpu"),
        lambda: models.load_backbone(scorer),
    ):
        with pytest.raises(FileNotFoundError, match=message):
            load()
    tuned = tmp_path / "tuned"
    tuned.mkdir()
    (tuned / "config.json").write_text(json.dumps({"format": FORMAT, "encoder": {"model": "./encoder"}}))
    with pytest.raises(FileNotFoundError, match=f"give --model {tuned / 'encoder'}$"):
        models.resolve_model(str(tuned))


def test_is_scorer_dir_reads_the_scorers_format(tiny_scorer_dir, tmp_path):
    assert models.is_scorer_dir(tiny_scorer_dir)
    assert not models.is_scorer_dir(tiny_scorer_dir.parent / "encoder")  # a transformers model folder
    for name, text in (("garbage", "{not json"), ("list", "[1]"), ("other", '{"format": "x"}')):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(text)
        assert not models.is_scorer_dir(tmp_path / name)
    assert not models.is_scorer_dir(tmp_path / "missing")


# -- 4. the RL commands' default scorer is `make scorer`'s --------------------------------------------------


def test_the_rl_commands_default_scorer_is_make_scorers_and_says_how_to_make_it(tmp_path, monkeypatch):
    """README: outputs/scorer is "where the commands look by default", but grpo/rloo/ppo/rft/dpo looked for a
    recipe's scorer and, missing, said only "not a directory". Now they look where `make scorer` writes, and say so."""
    from pmi_reward.policy import ppo

    assert trainers.ScriptArguments().scorer == DEFAULT_SCORER == "outputs/scorer"
    for arguments in (rft.ARGUMENTS, rft.DPO_ARGUMENTS, ppo.ARGUMENTS):  # grpo/rloo read the same ScriptArguments
        assert parse_args(arguments, ["--use_cpu", "true", "--output_dir", str(tmp_path)])[0].scorer == DEFAULT_SCORER
    monkeypatch.chdir(tmp_path)  # no outputs/ here
    with pytest.raises(ScorerLoadError, match=r"^outputs/scorer: not a directory .*`make scorer`"):
        trainers.build_rewards(trainers.ScriptArguments())


def test_every_rl_config_names_its_scorer():
    """The recipes' and the demo's RL configs set ``scorer:`` themselves, so the default's change moves none."""
    configs = [*ROOT.glob("recipes/**/*.yaml"), *ROOT.glob("pmi_reward/configs/**/*.yaml")]
    rl = [p for p in configs if "model_name_or_path" in (yaml.safe_load(p.read_text()) or {})]
    assert len(rl) >= 15
    assert [str(p.relative_to(ROOT)) for p in rl if "scorer" not in yaml.safe_load(p.read_text())] == []


# -- 5. a misspelt shipped model name ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("minlm", "minilm"),
        ("MiniLMM", "minilm"),
        ("smolm2", "smollm2-135m-instruct"),
        ("smollm2-135", "smollm2-135m-instruct"),
        ("mpnett", "mpnet"),
    ],
)
def test_a_misspelt_shipped_name_asks_did_you_mean_before_transformers(typo, meant, monkeypatch):
    """A bare name close to a shipped one went to transformers as a Hub id: offline, "We couldn't connect to
    'https://huggingface.co'", naming neither; online without a network, after 54 s of retries."""
    import transformers

    def no_hub(*args, **kwargs):
        raise AssertionError("transformers was asked")

    for auto in (transformers.AutoTokenizer, transformers.AutoModel, transformers.AutoConfig):
        monkeypatch.setattr(auto, "from_pretrained", no_hub)
    message = rf"^{typo}: not a shipped model \(did you mean '{meant}'\?\) nor a local folder \(shipped: minilm"
    for load in (models.resolve_model, models.load_tokenizer, models.load_backbone, models.default_pooling):
        with pytest.raises(FileNotFoundError, match=message):
            load(typo)


def test_names_far_from_a_shipped_one_or_present_here_go_on_as_before(tmp_path, monkeypatch):
    """Hub ids, with an org or without (``gpt2``, ``albert-base-v2``: 0.77 alike to ``all-mpnet-base-v2``, refused as
    a misspelling of mpnet under the first cutoff), and a local folder of a near name are not typos."""
    monkeypatch.chdir(tmp_path)
    names = ("gpt2", "distilgpt2", "bert-base-uncased", "albert-base-v2", "org/minlm")
    for name in (*names, "sentence-transformers/all-MiniLM-L12-v2"):
        assert models.resolve_model(name) == name
    (tmp_path / "minlm").mkdir()
    assert models.resolve_model("minlm") == "minlm"


def test_a_near_name_the_hub_cache_holds_goes_on_and_the_message_allows_org_less_ids(tmp_path, monkeypatch):
    """A name close to a shipped one that the Hugging Face cache holds is a Hub model downloaded before (an offline
    cluster's cache), which transformers loads: not refused as a misspelling. The message of one refused no longer
    says that every Hub model is named org/name (``gpt2`` is not)."""
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    with pytest.raises(FileNotFoundError, match=r"a Hub model: org/name, or an org-less id such as gpt2\)$"):
        models.resolve_model("minlm")
    repo = cache / "models--minlm"
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    assert models.resolve_model("minlm") == "minlm"
    with pytest.raises(FileNotFoundError, match=r"did you mean 'minilm'"):  # not held: still a misspelling
        models.resolve_model("minilmm")


def test_a_misspelt_policy_name_is_one_line(capsys):
    assert main(["rerank", "--context", "I went hiking.", "--model", "smolm2", "--n", "2"]) == 2
    assert "smolm2: not a shipped model (did you mean 'smollm2-135m-instruct'?)" in capsys.readouterr().err
