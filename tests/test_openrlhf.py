"""OpenRLHF's remote reward calls replayed against ``pmi-reward serve``'s ``/get_reward``.

The client code below is upstream's, copied as it stands (comments mark each source), so that the bodies, the
HTTP clients and the way the answers are read are OpenRLHF's own:

- >= 0.9.1 (here v0.11.0 = 3c3be62): ``openrlhf/utils/agent.py``, ``SingleTurnAgentExecutor.execute`` decodes
  prompt + reply tokens and ``_fetch_rewards_via_http`` posts ONE sample per request with aiohttp, sharding the
  list over the URLs (so every extra URL gets an empty request); ``samples_generator.py``
  ``_process_response_into_experience`` wraps the answer's values in ``torch.tensor([value])``.
- <= 0.9.0 (v0.9.0 = 06ab51e): ``openrlhf/utils/remote_rm_utils.py`` ``request_api_wrapper`` posts the whole
  rollout (groups of ``n_samples_per_prompt`` in a row) with requests; ``experience_maker.py``
  ``update_samples_with_rewards`` concatenates the answers.
"""

from __future__ import annotations

import asyncio
import logging
import math
from types import SimpleNamespace

import aiohttp
import pytest
import requests
import torch

from pmi_reward.rewards.options import RewardOptions
from pmi_reward.rewards.reward import PMIReward
from pmi_reward.serving.server import RewardServer, ServerConfig

logger = logging.getLogger(__name__)

CONVERSATIONS = [
    [{"role": "user", "content": "I love jazz."}, {"role": "assistant", "content": "Me too!"},
     {"role": "user", "content": "Who is your favourite?"}],
    [{"role": "user", "content": "I just got back from a hiking trip in Yosemite."}],
]  # fmt: skip
REPLIES = [["Coltrane, for sure.", "That's interesting.", ""], ["Did you see Half Dome?", "Nice.", "I like pizza."]]


# -- upstream client code, v0.11.0 -------------------------------------------------------------------------------
async def _fetch_rewards_via_http(reward_endpoints, queries_list, prompts_list, labels_list, try_max_times=5):
    """``SingleTurnAgentExecutor._fetch_rewards_via_http`` (agent.py @ 3c3be62, lines 322-359; ``try_max_times``
    is a parameter of its inner ``_post_request`` there)."""
    num_servers = len(reward_endpoints)
    batch_size = (len(queries_list) + num_servers - 1) // num_servers
    timeout = aiohttp.ClientTimeout(total=180)

    tasks = []
    for i, rm in enumerate(reward_endpoints):
        start_idx = i * batch_size
        end_idx = min((i + 1) * batch_size, len(queries_list))
        payload = {
            "query": queries_list[start_idx:end_idx],
            "prompts": prompts_list[start_idx:end_idx],
            "labels": labels_list[start_idx:end_idx],
        }

        async def _post_request(url, data, try_max_times=try_max_times):
            for _ in range(try_max_times):
                try:
                    async with aiohttp.ClientSession(timeout=timeout) as session:  # noqa: SIM117 - upstream's code
                        async with session.post(url, json=data) as response:
                            response.raise_for_status()
                            return await response.json()
                except aiohttp.ClientError as e:
                    logger.info(f"Request error, please check: {e}")
                await asyncio.sleep(1)
            raise RuntimeError(f"Request error for {try_max_times} times, returning None. Please check the API server.")

        tasks.append(asyncio.create_task(_post_request(rm, payload)))
    return await asyncio.gather(*tasks)


async def _execute(tokenizer, endpoints, prompt, label, reply_ids, max_prompt_length=None, try_max_times=5):
    """The reward half of ``SingleTurnAgentExecutor.execute`` (agent.py @ 3c3be62, lines 205-302), with the vLLM
    generation replaced by the given reply tokens; returns the Experience fields built from the answer
    (``samples_generator.py`` ``_process_response_into_experience``, lines 287-309)."""
    prompt_token_ids = tokenizer(text=prompt, add_special_tokens=False, return_tensors="pt")["input_ids"][0].tolist()
    if max_prompt_length is not None and len(prompt_token_ids) > max_prompt_length:
        prompt_token_ids = prompt_token_ids[-max_prompt_length:]
    observation_token_ids = prompt_token_ids + reply_ids
    query = tokenizer.decode(observation_token_ids, skip_special_tokens=False)
    rewards_info_list = await _fetch_rewards_via_http(endpoints, [query], [prompt], [label], try_max_times)
    rewards_info = rewards_info_list[0] if rewards_info_list else None
    score_value = rewards_info.get("scores")
    if score_value is None:
        score_value = rewards_info.get("rewards")
    reward_val, extra_logs = rewards_info.get("rewards"), rewards_info.get("extra_logs") or {}
    info = {key: torch.tensor([value]) for key, value in extra_logs.items()}
    return SimpleNamespace(rewards=torch.tensor([reward_val]), scores=torch.tensor([score_value]), info=info)


# -- upstream client code, v0.9.0 --------------------------------------------------------------------------------
def request_api_wrapper(url, data, try_max_times=5):
    """``remote_rm_utils.request_api_wrapper`` @ 06ab51e (the ``time.sleep(1)`` between tries left out)."""
    headers = {
        "Content-Type": "application/json",
    }
    for _ in range(try_max_times):
        try:
            response = requests.post(url=url, json=data, headers=headers, timeout=180)
            response.raise_for_status()  # Raise an HTTPError for bad responses
            response = response.json()
            return response
        except requests.RequestException as e:
            logger.info(f"Request error, please check: {e}")
    raise Exception(f"Request error for {try_max_times} times, returning None. Please check the API server.")


def update_samples_with_rewards(rewards_info, samples_list):
    """``experience_maker.update_samples_with_rewards`` @ 06ab51e (lines 208-244)."""
    samples_len = [len(sample.sequences) for sample in samples_list]
    rewards_list = torch.cat([torch.as_tensor(info["rewards"]) for info in rewards_info], dim=0).split(samples_len)
    if "scores" in rewards_info[0]:
        scores_list = torch.cat([torch.as_tensor(info["scores"]) for info in rewards_info], dim=0).split(samples_len)
    else:
        scores_list = rewards_list
    if "extra_logs" in rewards_info[0]:
        merged_logs = {
            key: torch.cat(
                [torch.as_tensor(logs[key]) for logs in [info["extra_logs"] for info in rewards_info]], dim=0
            ).split(samples_len)
            for key in rewards_info[0]["extra_logs"].keys()  # noqa: SIM118 - upstream's code
        }
    for i, samples in enumerate(samples_list):
        samples.rewards = rewards_list[i]
        samples.scores = scores_list[i]
        samples.info["score"] = scores_list[i]
        samples.info["reward"] = rewards_list[i]
        if "extra_logs" in rewards_info[0]:
            for key, values in merged_logs.items():
                samples.info[key] = values[i]
    return samples_list


# -- fixtures and helpers ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def group_server(spread_scorer):
    """A server that centres rewards per group (``pmi-reward serve --center group``), on the spread scorer (whose
    replies score apart, so that centring shows)."""
    server = RewardServer(spread_scorer, ServerConfig(port=0), RewardOptions(center="group")).start()
    yield server
    server.close()


def _prompt(tokenizer, messages) -> str:
    """``PromptDataset`` with ``--data.apply_chat_template``: the chat template with the generation prompt."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _reply_ids(tokenizer, reply: str, finished: bool = True) -> list[int]:
    """What vLLM returns for a reply: its tokens, with the end-of-turn token when generation stopped on it."""
    return tokenizer(text=reply + (tokenizer.eos_token if finished else ""), add_special_tokens=False)["input_ids"]


# -- >= 0.9.1: one sample per request ----------------------------------------------------------------------------
def test_current_one_sample_per_request(spread_server, spread_scorer, smol_tokenizer):
    """``n_samples_per_prompt`` concurrent executions per prompt, each its own request, as ``generate_responses``
    runs them; the rewards OpenRLHF reads equal PMIReward's on the same conversation and reply."""

    async def rollout():
        jobs = [
            _execute(smol_tokenizer, [spread_server.url + "/get_reward"], _prompt(smol_tokenizer, conv), "",
                     _reply_ids(smol_tokenizer, reply))
            for conv, replies in zip(CONVERSATIONS, REPLIES, strict=True) for reply in replies
        ]  # fmt: skip
        return await asyncio.gather(*jobs)

    before = spread_server.batcher.stats.requests
    experiences = asyncio.run(rollout())
    expected = PMIReward(spread_scorer)([c for c, rs in zip(CONVERSATIONS, REPLIES, strict=True) for _ in rs],
                                        [r for rs in REPLIES for r in rs])  # fmt: skip
    assert len({round(x, 4) for x in expected}) == 6  # every sample scores apart: a mixed-up answer would show
    got = [e.rewards.flatten().item() for e in experiences]
    assert got == pytest.approx(expected, abs=1e-5)
    assert all(e.rewards.shape == (1, 1) and e.scores.shape == (1, 1) for e in experiences)  # lists of one
    assert got[2] == -5.0 and experiences[2].info["pmi_scored"].item() == 0.0  # the empty reply
    assert all(0 <= e.scores.item() <= 1 for e in experiences)
    assert {k for e in experiences for k in e.info} == {"pmi_raw", "pmi_scored", "pmi_no_context"}
    assert spread_server.batcher.stats.requests - before <= 6  # the empty reply is not sent to the scorer


def test_current_a_rollout_burst_over_the_connection_cap(tiny_scorer, smol_tokenizer):
    """Every sample of a rollout that ends on the same decode step (all cut at ``max_tokens``) opens its own
    connection at once: 48 against a server capped at 4 connections (256 by default), with a single try each (each
    of upstream's 5 tries found the cap full too, 1 s apart, and the sample's reward was None). Every sample gets its
    reward: over the cap a connection waits for a free one."""
    server = RewardServer(tiny_scorer, ServerConfig(port=0, max_connections=4)).start()
    endpoints = [server.url + "/get_reward"]
    prompts = [_prompt(smol_tokenizer, conv) for conv in CONVERSATIONS]
    reply_ids = [_reply_ids(smol_tokenizer, f"Reply number {i}.", finished=False) for i in range(24)]

    async def rollout():
        return await asyncio.gather(*(_execute(smol_tokenizer, endpoints, p, "", r, try_max_times=1)
                                      for p in prompts for r in reply_ids))  # fmt: skip

    try:
        experiences = asyncio.run(rollout())
    finally:
        server.close()
    assert len(experiences) == 48 and all(math.isfinite(e.rewards.item()) for e in experiences)
    assert server.responses[200] == 48 and not server.responses[503]


def test_a_server_that_would_answer_null_rewards_is_refused(tiny_scorer):
    """With ``empty_score`` None an empty reply's reward was null, and upstream's ``torch.tensor([reward_val])``
    raised outside its error handling, ending the run. Such a server is refused when it is built."""
    with pytest.raises(RuntimeError, match="NoneType"):
        torch.tensor([None])  # what upstream does with a null reward
    with pytest.raises(ValueError, match="empty_score None: .* OpenRLHF cannot take a null"):
        RewardServer(tiny_scorer, ServerConfig(port=0), RewardOptions(empty_score=None))


def test_current_extra_urls_get_an_empty_request(reward_server, tiny_scorer, smol_tokenizer):
    """With several URLs the one sample goes to the first and every other URL gets ``{"query": [], ...}``; one
    failure would cost the sample its reward, so the empty request must succeed."""
    prompt = _prompt(smol_tokenizer, CONVERSATIONS[0])
    urls = [reward_server.url + "/get_reward"] * 3
    query = smol_tokenizer.decode(
        smol_tokenizer(text=prompt, add_special_tokens=False)["input_ids"] + _reply_ids(smol_tokenizer, "Coltrane."),
        skip_special_tokens=False,
    )
    answers = asyncio.run(_fetch_rewards_via_http(urls, [query], [prompt], [""], try_max_times=1))
    assert (
        answers[1]
        == answers[2]
        == {
            "rewards": [],
            "scores": [],
            "extra_logs": {"pmi_raw": [], "pmi_scored": [], "pmi_no_context": []},
        }
    )
    expected = PMIReward(tiny_scorer)([CONVERSATIONS[0]], ["Coltrane."])
    assert answers[0]["rewards"] == pytest.approx(expected, abs=1e-5)


def test_current_left_truncated_prompt_and_truncated_reply(reward_server, smol_tokenizer):
    """A prompt over ``max_len - max_tokens`` is cut from the left, so the query no longer contains ``prompts[0]``:
    the reply is then the last assistant turn of the query. A reply cut at ``max_tokens`` has no end token."""
    prompt = _prompt(smol_tokenizer, CONVERSATIONS[0])
    cut = asyncio.run(
        _execute(smol_tokenizer, [reward_server.url + "/get_reward"], prompt, "",
                 _reply_ids(smol_tokenizer, "Coltrane, for sure.", finished=False), max_prompt_length=20)
    )  # fmt: skip
    assert math.isfinite(cut.rewards.item()) and cut.info["pmi_scored"].item() == 1.0


def test_current_reasoning_reply_with_an_opened_think_block(spread_server, spread_scorer, smol_tokenizer):
    """Templates such as Qwen3.5's end the prompt with ``<think>\\n``: the reply's answer follows ``</think>``, and a
    reply that never closes the block (cut at ``max_tokens``) is empty."""
    prompt = _prompt(smol_tokenizer, CONVERSATIONS[0]) + "<think>\n"
    endpoints = [spread_server.url + "/get_reward"]
    replies = ["They ask about jazz; name one.\n</think>\n\nColtrane, for sure.", "They ask about jazz; hmm"]

    async def both():
        return await asyncio.gather(*(_execute(smol_tokenizer, endpoints, prompt, "", _reply_ids(smol_tokenizer, r, f))
                                      for r, f in zip(replies, (True, False), strict=True)))  # fmt: skip

    done, unfinished = asyncio.run(both())
    answer = PMIReward(spread_scorer)([CONVERSATIONS[0]], ["Coltrane, for sure."])[0]
    with_reasoning = PMIReward(spread_scorer, strip_think=False)([CONVERSATIONS[0]], [replies[0]])[0]
    assert abs(answer - with_reasoning) > 1e-3  # the reasoning would move the score: scoring it would show
    assert done.rewards.item() == pytest.approx(answer, abs=1e-5)
    assert unfinished.rewards.item() == -5.0


def test_current_refuses_group_centring(group_server, smol_tokenizer, caplog):
    """``--center group`` on one-sample requests would give every sample 0.0: refused (422, with the reason in the
    body and in the server's log), never answered with zeros."""
    prompt = _prompt(smol_tokenizer, CONVERSATIONS[0])
    with (
        caplog.at_level(logging.DEBUG, logger="pmi_reward.serving.endpoints"),  # a warning first, then debug
        pytest.raises(RuntimeError, match="Request error for 1 times"),
    ):
        asyncio.run(
            _execute(smol_tokenizer, [group_server.url + "/get_reward"], prompt, "",
                     _reply_ids(smol_tokenizer, "Coltrane."), try_max_times=1)
        )  # fmt: skip
    assert "center='group'" in caplog.text and "one sample per call" in caplog.text
    body = {"query": [prompt + "Coltrane.<|im_end|>"], "prompts": [prompt], "labels": [""]}
    answer = requests.post(group_server.url + "/get_reward", json=body, timeout=30)
    assert answer.status_code == 422 and "--algo.advantage.estimator group_norm" in answer.json()["error"]
    empty = requests.post(group_server.url + "/get_reward", json={"query": [], "prompts": [], "labels": []}, timeout=30)
    assert empty.status_code == 200  # an extra URL's empty request is still fine


# -- <= 0.9.0: the whole rollout in one request -------------------------------------------------------------------
def _rollout_v090(tokenizer, n: int):
    """``_generate_vllm`` + ``make_experience`` @ 06ab51e: prompts repeated ``n`` times in a row, sequences
    right-padded into micro-batches, queries decoded after ``remove_pad_token``."""
    all_prompts = sum([[_prompt(tokenizer, c)] * n for c in CONVERSATIONS], [])
    replies = [r for rs in REPLIES for r in rs[:n]]
    ids = [tokenizer(text=p, add_special_tokens=False)["input_ids"] + _reply_ids(tokenizer, r)
           for p, r in zip(all_prompts, replies, strict=True)]  # fmt: skip
    width = max(len(x) for x in ids)
    sequences = torch.tensor([x + [tokenizer.pad_token_id] * (width - len(x)) for x in ids])
    attention_mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids])
    queries = tokenizer.batch_decode([s[m.bool()] for s, m in zip(sequences, attention_mask, strict=True)],
                                     skip_special_tokens=False)  # fmt: skip
    return queries, all_prompts, replies


@pytest.mark.parametrize("center", ["none", "group"])
def test_v090_batch_request(spread_server, group_server, spread_scorer, smol_tokenizer, center):
    queries, prompts, replies = _rollout_v090(smol_tokenizer, n=3)
    url = (group_server if center == "group" else spread_server).url + "/get_reward"
    answer = request_api_wrapper(url, {"query": queries, "prompts": prompts, "labels": [""] * len(queries)})
    samples = [SimpleNamespace(sequences=torch.zeros(3, 4), info={}) for _ in range(2)]  # two micro-batches of 3
    update_samples_with_rewards([answer], samples)
    got = torch.cat([s.rewards for s in samples]).tolist()
    conversations = [c for c in CONVERSATIONS for _ in range(3)]
    raw = PMIReward(spread_scorer)(conversations, replies)
    # the replies score apart and the two prompts' means differ: order, pairing and centring all show
    assert len({round(x, 4) for x in raw}) == 6 and abs(sum(raw[:2]) / 2 - sum(raw[3:]) / 3) > 1e-2
    expected = PMIReward(spread_scorer, center=center)(conversations, replies)
    assert got == pytest.approx(expected, abs=1e-5)
    assert set(samples[0].info) == {"score", "reward", "pmi_raw", "pmi_scored", "pmi_no_context"}
    if center == "group":  # each prompt's scored replies are centred on their mean
        assert sum(got[3:]) == pytest.approx(0.0, abs=1e-4) and got[2] == -5.0
        assert got[0] + got[1] == pytest.approx(0.0, abs=1e-4)


def test_a_query_without_prompts_is_grouped_by_its_scored_context(spread_scorer):
    """Without ``prompts`` the server cuts each query to ``max_chars`` from its end before parsing it, so one prompt's
    parsed messages differ with its reply's length; its replies are still one group (the scored context), not a
    GroupError for every sample."""
    turns = [f"Turn number {i}: I went hiking in the mountains and the views were amazing, truly." for i in range(8)]
    prompt = "".join(f"<|im_start|>{('user', 'assistant')[i % 2]}\n{t}<|im_end|>\n" for i, t in enumerate(turns))
    prompt += "<|im_start|>assistant\n"
    replies = ["Nice", "Nice " + "x" * 91]  # the second's window holds less of the prompt than the first's
    server = RewardServer(spread_scorer, ServerConfig(port=0), RewardOptions(center="group", max_chars=60)).start()
    try:
        answer = requests.post(
            server.url + "/get_reward", json={"query": [prompt + r + "<|im_end|>" for r in replies]}, timeout=30
        )
    finally:
        server.close()
    assert answer.status_code == 200, answer.text
    rewards = answer.json()["rewards"]
    assert sum(rewards) == pytest.approx(0.0, abs=1e-5) and abs(rewards[0]) > 1e-4
