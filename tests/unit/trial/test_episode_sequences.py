"""The episode player's trained sequence on tiny-qwen2-base (eos `<|endoftext|>`, ChatML) with a scripted sampler in
place of vLLM: the end-of-turn token after a turn that stopped on eos, `task.training_context` (sampled | ragen)
and `learner.loss_mask` (sampled | assistant_segments). The sampled ids are never re-encoded in any mode."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from orchestrator.trial.collect import episodes as player
from workers.envs import RagenProtocol, TextEpisode
from workers.envs.sokoban import SokobanEnv
from workers.models.loading import load_tokenizer
from workers.rollout.output import Completion, Generation
from workers.tiny.families import ENDOFTEXT, IM_END, build_family_model

LAYOUT = ["######", "#P_X_#", "#___O#", "#____#", "#____#", "######"]
ANSWERS = ["hm</think><answer>Jump</answer>", "go</think><answer>Right</answer>"]  # invalid, then valid
WARNING = "No valid action provided previously. Environment state remains the same. Please try again.\n"


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return load_tokenizer(str(build_family_model("tiny-qwen2-base", tmp_path_factory.mktemp("fam") / "m")))


def _play(tok, monkeypatch, *, training_context="sampled", loss_mask="sampled", end=ENDOFTEXT):
    """Two turns of one Sokoban episode; each turn's sample is a scripted answer ending on `end`."""
    turns = [list(tok(a, add_special_tokens=False)["input_ids"]) + [tok.convert_tokens_to_ids(end)]
             for a in ANSWERS]
    histories = []

    def sample(ctx, prompts, *, n, temperature, seeds, floor, phase="generate"):
        histories.append(prompts[0])
        ids = turns[len(histories) - 1]
        return [Generation(0, [[Completion(ids, [-0.5] * len(ids), "stop")]], len(ids))]

    monkeypatch.setattr(player, "sample", sample)
    cfg = SimpleNamespace(rollout=SimpleNamespace(max_tokens=64), model=SimpleNamespace(max_model_len=4096),
                          task=SimpleNamespace(training_context=training_context),
                          learner=SimpleNamespace(loss_mask=loss_mask))
    ep = TextEpisode(SokobanEnv(layout=LAYOUT), dynamics_seed=0, max_actions_per_turn=2, max_actions_per_episode=10,
                     max_turns=2, protocol=RagenProtocol(max_tokens=64))
    trajs, _ = player.play_episodes(SimpleNamespace(cfg=cfg, workers=[None], engines=SimpleNamespace(count=1), tokenizer=tok), [ep], seed=0, step=0,
                                    temperature=1.0)
    return trajs[0], turns, histories


def _masked(tok, t, mask) -> str:
    return tok.decode([i for i, m in zip(t.response_ids, mask, strict=True) if m])


def test_a_turn_that_stopped_on_eos_is_closed_before_the_next_user_turn(tok, monkeypatch):
    t, turns, histories = _play(tok, monkeypatch)
    text = tok.decode(t.prompt_ids + t.response_ids)
    assert text.count("<|endoftext|><|im_end|>\n<|im_start|>user\nReward:\n0\n") == 1
    assert text.endswith(ANSWERS[1] + ENDOFTEXT)
    eos, eot = tok.convert_tokens_to_ids(ENDOFTEXT), tok.convert_tokens_to_ids(IM_END)
    k = t.response_ids.index(eos)
    assert t.response_ids[k + 1] == eot and not t.loss_mask[k + 1]  # the added id is on the observation side
    assert t.response_ids[:len(turns[0])] == turns[0] and t.response_ids[-len(turns[1]):] == turns[1]
    assert [i for i, m in zip(t.response_ids, t.loss_mask, strict=True) if m] == turns[0] + turns[1]
    assert t.sampled_mask == t.loss_mask and t.context_ids == t.response_ids
    assert histories[1] == t.prompt_ids + t.response_ids[:len(histories[1]) - len(t.prompt_ids)]
    assert [lp for lp, m in zip(t.logprobs, t.loss_mask, strict=True) if m] == [-0.5] * (len(turns[0]) + len(turns[1]))


def test_a_turn_that_stopped_on_im_end_is_not_closed_twice(tok, monkeypatch):
    t, _, _ = _play(tok, monkeypatch, end=IM_END)
    text = tok.decode(t.prompt_ids + t.response_ids)
    assert "<|im_end|><|im_end|>" not in text and "</answer><|im_end|>\n<|im_start|>user\n" in text


def test_training_context_ragen_drops_the_warning_from_the_trained_sequence_only(tok, monkeypatch):
    sampled, _, _ = _play(tok, monkeypatch)
    t, turns, histories = _play(tok, monkeypatch, training_context="ragen")
    assert WARNING in tok.decode(histories[1]) and WARNING in tok.decode(t.context_ids)  # generation saw it
    assert WARNING not in tok.decode(t.response_ids)
    assert tok.decode(t.response_ids) == tok.decode(sampled.response_ids).replace(WARNING, "")
    assert [i for i, m in zip(t.response_ids, t.loss_mask, strict=True) if m] == turns[0] + turns[1]
    assert len(t.response_ids) == len(t.loss_mask) == len(t.logprobs) == len(t.sampled_mask)
    assert t.response_ids[t.reward_positions[0]] == turns[0][-1] and t.response_ids[t.reward_positions[1]] == turns[1][-1]


def test_assistant_segments_cover_header_prefill_and_end_of_turn_and_no_observation(tok, monkeypatch):
    sampled, _, _ = _play(tok, monkeypatch)
    t, turns, _ = _play(tok, monkeypatch, loss_mask="assistant_segments")
    assert t.prompt_ids + t.response_ids[:-1] == sampled.prompt_ids + sampled.response_ids  # the same sequence,
    assert t.response_ids[-1] == tok.convert_tokens_to_ids(IM_END)  # plus the last turn's close
    segment = "<|im_start|>assistant\n<think>{}<|endoftext|><|im_end|>"
    assert _masked(tok, t, t.loss_mask) == "".join(segment.format(a) for a in ANSWERS)
    assert _masked(tok, t, t.sampled_mask) == "".join(a + ENDOFTEXT for a in ANSWERS)
    assert tok.decode(t.prompt_ids).endswith("Max response length: 64 words (tokens).\n<|im_end|>\n")
    observation = _masked(tok, t, [not m for m in t.loss_mask])
    assert observation == "\n<|im_start|>user\n" + tok.decode(sampled.response_ids).split(
        "<|im_start|>user\n")[1].split("<|im_start|>assistant")[0]
    assert [lp for lp, s in zip(t.logprobs, t.sampled_mask, strict=True) if s] == [-0.5] * (len(turns[0]) + len(turns[1]))
    assert all(lp == 0.0 for lp, s in zip(t.logprobs, t.sampled_mask, strict=True) if not s)


def _ragen_trained(tok, answers: list[str]) -> list[int]:
    """The ids RAGEN's loss mask trains on the same episode (a reference written from RAGEN's
    ragen/llm_agent/ctx_manager.py `get_masks_and_scores`, enable_response_mask): the episode re-rendered as ChatML
    with each turn's decoded answer (special tokens skipped) after the `<think>` prefill and no trailing state;
    a token is in an assistant turn from its `<|im_start|>` up to the next one; the mask drops its last position
    and `responses` are the ids shifted by one, so each masked position trains the id after it."""
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    for i, a in enumerate(answers):
        messages.append({"role": "assistant", "content": "<think>" + a})
        if i < len(answers) - 1:
            messages.append({"role": "user", "content": "r"})
    ids = tok(tok.apply_chat_template(messages, tokenize=False), add_special_tokens=False)["input_ids"]
    start, turn, trained = tok.convert_tokens_to_ids("<|im_start|>"), 0, []
    for j in range(len(ids) - 1):
        turn += ids[j] == start
        if turn > 1 and turn % 2 == 1:
            trained.append(ids[j + 1])
    return trained


@pytest.mark.parametrize("end", [ENDOFTEXT, IM_END])
def test_assistant_segments_train_ragens_tokens_but_one_per_non_final_turn_and_eos(tok, monkeypatch, end):
    """The exact relation docs/agentic.md states: per turn RAGEN trains the same segment shifted by one (not the
    header's `<|im_start|>`, but the `\\n` after `<|im_end|>` and, after a non-final turn, the next turn's
    `<|im_start|>`), and not a sampled `<|endoftext|>` (it decodes it away). So RAGEN's count = ours + one per
    non-final turn - one per turn that stopped on eos."""
    t, _, _ = _play(tok, monkeypatch, loss_mask="assistant_segments", end=end)
    ragen = _ragen_trained(tok, ANSWERS)
    ours = [i for i, m in zip(t.response_ids, t.loss_mask, strict=True) if m]
    eos_stopped = len(ANSWERS) if end == ENDOFTEXT else 0
    assert len(ragen) == len(ours) + (len(ANSWERS) - 1) - eos_stopped
    assert tok.decode(ragen) == "".join(f"assistant\n<think>{a}<|im_end|>\n<|im_start|>" for a in ANSWERS)[
        :-len("<|im_start|>")]
    stop = ENDOFTEXT if end == ENDOFTEXT else ""
    assert tok.decode(ours) == "".join(f"<|im_start|>assistant\n<think>{a}{stop}<|im_end|>" for a in ANSWERS)
