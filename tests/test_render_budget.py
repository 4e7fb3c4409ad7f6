"""The state renderer's token budget, counted with the bundled MiniLM's own tokenizer: the oldest
history goes first, the task stays, the encoder never has to cut, and the transitions stage and
the served critic render the same text under a budget."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from harnessrl import schemas, tokens
from harnessrl.algorithms.iql import IQLConfig, IQLNetwork
from harnessrl.config import parse_pipeline
from harnessrl.critic import Critic
from harnessrl.encoders import BUILTIN_MINILM, encoder_identity
from harnessrl.errors import ConfigError
from harnessrl.pipelines.transitions import _build
from harnessrl.config import RenderConfig
from harnessrl.heads.frozen import FrozenScorer
from harnessrl.model_card import ModelCard
from harnessrl.render import Renderer, Turn


def render_state(task, history, observation, **settings) -> str:
    return Renderer(RenderConfig.model_construct(**{**RenderConfig().model_dump(), **settings})).text(
        task, history, observation)
from harnessrl.rewards import RewardRecipe

TASK = "Find the red key and open the cellar door."
HISTORY = [Turn(f"look around room {i}", f"You see a table, {i} chairs and a window facing north.") for i in range(12)]


def _tokens(text: str) -> int:
    return tokens.count_text(BUILTIN_MINILM, text)


def test_budget_drops_oldest_history_first_and_keeps_the_task():
    full = render_state(TASK, HISTORY, "a hallway", window=12, max_chars=100_000)
    assert _tokens(full) > 120
    text = render_state(TASK, HISTORY, "a hallway", window=12, max_chars=100_000, max_tokens=120,
                        tokenizer=BUILTIN_MINILM)
    assert _tokens(text) <= 120
    lines = text.split("\n")
    assert lines[:2] == [f"Task: {TASK}", "Now: a hallway"]
    kept = [line for line in lines if line.startswith("> ")]
    assert 0 < len(kept) < 12
    assert kept[0].startswith("> look around room 11")  # the newest turn is kept, the oldest go
    assert lines[-1] == f"({12 - len(kept)} earlier steps)"
    # one more turn would not have fitted: the budget is used, not just respected
    assert _tokens(render_state(TASK, HISTORY, "a hallway", window=len(kept) + 1, max_chars=100_000)) > 120


def test_line_counts_add_up_exactly_for_minilm():
    """The renderer trusts per-line counts for whitespace-splitting tokenizers: check that claim."""
    assert tokens.splits_on_whitespace(BUILTIN_MINILM)
    lines = [f"Task: {TASK}", "Now: naïve café—déjà vu, x=f(y)[0];", *(f"> {t.action} -> {t.result}" for t in HISTORY)]
    assert _tokens("\n".join(lines)) == sum(tokens.count_pieces(BUILTIN_MINILM, x) for x in lines) + 2


def test_task_is_kept_even_when_nothing_else_fits():
    text = render_state(TASK, HISTORY, "a hallway", window=12, max_tokens=16, tokenizer=BUILTIN_MINILM)
    assert text == f"Task: {TASK}\nNow: a hallway\n(12 earlier steps)"


def test_no_budget_is_the_plain_rendering_and_a_large_one_changes_nothing():
    plain = render_state(TASK, HISTORY, "a hallway", window=4)
    assert render_state(TASK, HISTORY, "a hallway", window=4, max_tokens=None) == plain
    assert render_state(TASK, HISTORY, "a hallway", window=4, max_tokens=256, tokenizer=BUILTIN_MINILM) == plain


def test_budget_without_tokenizer_is_a_config_error():
    with pytest.raises(ConfigError, match="tokenizer"):
        render_state(TASK, HISTORY, "x", max_tokens=64)


def test_pipeline_config_takes_the_encoders_tokenizer_and_refuses_a_budget_it_would_cut():
    cfg = parse_pipeline({"data": {"train": ["x"]}, "render": {"max_tokens": 100}})
    assert cfg.render.tokenizer == BUILTIN_MINILM
    assert parse_pipeline({"data": {"train": ["x"]}}).render.tokenizer is None
    with pytest.raises(ConfigError, match="max_seq_length"):
        parse_pipeline({"data": {"train": ["x"]}, "render": {"max_tokens": 200}, "encoder": {"max_seq_length": 128}})


def test_training_and_serving_render_identical_states_under_a_budget():
    cfg = parse_pipeline({"data": {"train": ["x"]}, "render": {"window": 10, "max_chars": 20_000, "max_tokens": 96}})
    obs = [f"room {i}: a long corridor with {i} doors, a rug and paintings of ships" for i in range(8)]
    actions = [f"open door {i}" for i in range(8)]
    steps = [{"episode_id": "e", "step_idx": i, "obs_text": obs[i], "action_text": a, "action_reasoning": "",
              "tool_calls": [], "result_text": "", "reward": None, "candidates": None, "info": "{}",
              "terminated": i == 7, "truncated": False} for i, a in enumerate(actions)]
    episode = {"episode_id": "e", "task_id": "t", "group_id": "t", "task_text": TASK, "terminated": True,
               "outcome_success": True, "outcome_score": None, "tool_definitions": "[]"}
    rows = _build(pa.Table.from_pylist(steps, schema=schemas.STEPS), {"e": episode}, RewardRecipe(), cfg.render)
    rows = sorted(rows.to_pylist(), key=lambda r: r["step_idx"])

    identity = encoder_identity(BUILTIN_MINILM)
    card = ModelCard(head="frozen", head_config=IQLConfig().to_dict(), encoder=json.loads(identity.to_json()),
                     render=cfg.render)  # as the pipeline stores it with the model
    critic = Critic(FrozenScorer(IQLNetwork(IQLConfig())), card)
    dropped = 0
    for t, row in enumerate(rows):
        request = {"task": TASK, "observation": obs[t],
                   "history": [{"action": actions[i], "observation": obs[i + 1]} for i in range(t)]}
        served = critic.render_state(request)
        assert served == row["state_text"]
        assert _tokens(served) <= 96
        dropped += "earlier steps)" in served
    assert dropped >= 3  # the budget, not the window, cut the later states
