"""State rendering and per-episode transitions: order, budgets, rewards, end flags, and the
guarantee that training states and served states are the same text."""

from __future__ import annotations

import pytest

from harnessrl.errors import ConfigError
from harnessrl.config import RenderConfig
from harnessrl.render import Renderer, Turn
from harnessrl.rewards import RewardRecipe
from harnessrl.transitions import episode_transitions


def renderer(**settings) -> Renderer:
    """A Renderer of these settings (unvalidated: the tests use budgets below RenderConfig's minimum)."""
    return Renderer(RenderConfig.model_construct(**{**RenderConfig().model_dump(), **settings}))


def render_state(task, history, observation, window=4, max_chars=2000, **settings) -> str:
    return renderer(window=window, max_chars=max_chars, **settings).text(task, history, observation)


def state_from_request(state, window, max_chars):
    return renderer(window=window, max_chars=max_chars).parse(state).text


# ---- render_state -----------------------------------------------------------------------------
def test_render_order_and_earlier_marker():
    history = [Turn("a1", "r1"), Turn("a2", "r2"), Turn("a3", "r3")]
    text = render_state("Cook dinner.", history, "kitchen", window=2, max_chars=2000)
    assert text == "Task: Cook dinner.\nNow: kitchen\n> a3 -> r3\n> a2 -> r2\n(1 earlier steps)"


def test_render_full_window_has_no_marker():
    history = [Turn("a1", "r1"), Turn("a2", "r2")]
    text = render_state(" t ", history, " obs ", window=4)
    assert text == "Task: t\nNow: obs\n> a2 -> r2\n> a1 -> r1"


def test_newest_result_equal_to_observation_is_not_repeated():
    history = [Turn("open door", "hall"), Turn("go east", "kitchen")]
    text = render_state("t", history, "kitchen", window=4)
    assert text == "Task: t\nNow: kitchen\n> go east\n> open door -> hall"


def test_older_result_equal_to_observation_is_kept():
    history = [Turn("a1", "kitchen"), Turn("a2", "hall")]
    assert render_state("t", history, "kitchen") == "Task: t\nNow: kitchen\n> a2 -> hall\n> a1 -> kitchen"


def test_empty_task_and_observation_are_omitted():
    assert render_state("", [Turn("a", "b")], "  ") == "> a -> b"


def test_window_zero_keeps_only_marker():
    assert render_state("t", [Turn("a", "b")] * 3, "o", window=0) == "Task: t\nNow: o\n(3 earlier steps)"


def test_max_chars_truncation():
    text = render_state("x" * 50, [], "y" * 50, max_chars=20)
    assert len(text) == 20
    assert text == ("Task: " + "x" * 11) + "..."


def test_exactly_max_chars_is_not_truncated():
    text = render_state("abcd", [], "", max_chars=len("Task: abcd"))
    assert text == "Task: abcd"


# ---- state_from_request -----------------------------------------------------------------------
def test_state_from_request_dict_matches_render_state():
    req = {
        "task": "Find the key.",
        "history": [{"action": "look", "observation": "dark room"}, {"action": "light lamp", "observation": "a key"}],
        "observation": "a key",
    }
    expected = render_state("Find the key.", [Turn("look", "dark room"), Turn("light lamp", "a key")], "a key", 1, 300)
    assert state_from_request(req, 1, 300) == expected
    assert expected == "Task: Find the key.\nNow: a key\n> light lamp\n(1 earlier steps)"


def test_state_from_request_string_passes_through():
    text = "Task: anything\nNow: whatever " + "z" * 5000
    assert state_from_request(text, 1, 200) is text


@pytest.mark.parametrize("bad", [None, 3, ["task"]])
def test_state_from_request_rejects_other_types(bad):
    with pytest.raises(ConfigError):
        state_from_request(bad, 4, 2000)


# ---- episode_transitions ----------------------------------------------------------------------
OBS = ["You are in the hall.", "You are in the kitchen.", "There is a fridge."]
ACTIONS = ["go east", "look", "open fridge"]


def _episode(terminated: bool, success: bool | None = True):
    episode = {"episode_id": "e1", "task_id": "t1", "group_id": "g1", "task_text": "Find food.",
               "terminated": terminated, "truncated": not terminated, "outcome_success": success,
               "outcome_score": None}
    steps = []
    for i in range(3):
        steps.append({"step_idx": i, "obs_text": OBS[i], "action_text": ACTIONS[i],
                      "result_text": "You see milk." if i == 2 else "", "reward": [None, 1.0, 0.0][i],
                      "candidates": ["a", "b"] if i == 0 else None, "info": "{}",
                      "terminated": terminated and i == 2, "truncated": (not terminated) and i == 2})
    return episode, steps


def test_next_state_of_step_is_state_of_next_step():
    episode, steps = _episode(True)
    rows = episode_transitions(episode, steps, RewardRecipe(), renderer(window=4, max_chars=2000))
    assert rows[0]["next_state_text"] == rows[1]["state_text"]
    assert rows[1]["next_state_text"] == rows[2]["state_text"]
    assert rows[2]["next_state_text"] == (
        "Task: Find food.\nNow: You see milk.\n> open fridge\n> look -> There is a fridge.\n"
        "> go east -> You are in the kitchen."
    )


def test_state_text_content():
    episode, steps = _episode(True)
    rows = episode_transitions(episode, steps, RewardRecipe(), renderer(window=4, max_chars=2000))
    assert rows[0]["state_text"] == "Task: Find food.\nNow: You are in the hall."
    assert rows[2]["state_text"] == "Task: Find food.\nNow: There is a fridge.\n> look\n> go east -> You are in the kitchen."


def test_steps_are_sorted_by_index():
    episode, steps = _episode(True)
    in_order = episode_transitions(episode, steps, RewardRecipe())
    shuffled = episode_transitions(episode, [steps[2], steps[0], steps[1]], RewardRecipe())
    assert shuffled == in_order
    assert [r["step_idx"] for r in shuffled] == [0, 1, 2]


def test_rewards_and_return_to_go_terminated_success():
    episode, steps = _episode(True, True)
    rows = episode_transitions(episode, steps, RewardRecipe())
    # step cost 0.1 each; source reward 1.0 on step 1; success 10 on the last step
    assert [r["reward"] for r in rows] == pytest.approx([-0.1, 0.9, 9.9])
    assert [r["return_to_go"] for r in rows] == pytest.approx([10.7, 10.8, 9.9])
    assert rows[2]["reward_components"] == {"step_cost": -0.1, "source": 0.0, "outcome": 10.0}


def test_rewards_terminated_failure():
    episode, steps = _episode(True, False)
    rows = episode_transitions(episode, steps, RewardRecipe())
    assert [r["reward"] for r in rows] == pytest.approx([-0.1, 0.9, -2.1])
    assert [r["return_to_go"] for r in rows] == pytest.approx([-1.3, -1.2, -2.1])


def test_rewards_truncated_have_no_outcome():
    episode, steps = _episode(False, True)
    rows = episode_transitions(episode, steps, RewardRecipe())
    assert [r["reward"] for r in rows] == pytest.approx([-0.1, 0.9, -0.1])
    assert [r["return_to_go"] for r in rows] == pytest.approx([0.7, 0.8, -0.1])


def test_done_only_on_last_step_of_terminated_episode():
    rows = episode_transitions(*_episode(True), RewardRecipe())
    assert [r["done"] for r in rows] == [False, False, True]
    assert [r["truncated"] for r in rows] == [False, False, False]


def test_truncated_only_on_last_step_of_truncated_episode():
    rows = episode_transitions(*_episode(False), RewardRecipe())
    assert [r["done"] for r in rows] == [False, False, False]
    assert [r["truncated"] for r in rows] == [False, False, True]


def test_row_passthrough_fields():
    rows = episode_transitions(*_episode(True), RewardRecipe())
    assert [r["action_text"] for r in rows] == ACTIONS
    assert {(r["episode_id"], r["task_id"], r["group_id"], r["outcome_success"]) for r in rows} == {("e1", "t1", "g1", True)}
    assert [r["candidates"] for r in rows] == [["a", "b"], None, None]


@pytest.mark.parametrize("window, max_chars", [(4, 2000), (1, 2000), (0, 2000), (2, 60)])
def test_serving_request_reproduces_training_state(window, max_chars):
    episode, steps = _episode(True)
    rows = episode_transitions(episode, steps, RewardRecipe(), renderer(window=window, max_chars=max_chars))
    for t in range(len(steps)):
        request = {
            "task": episode["task_text"],
            # what each action returned = what the agent observed next
            "history": [{"action": ACTIONS[i], "observation": OBS[i + 1]} for i in range(t)],
            "observation": OBS[t],
        }
        assert state_from_request(request, window, max_chars) == rows[t]["state_text"]


# ---- layout: pinned results, the list of actions done, observation first -------------------------
MAP_HISTORY = [Turn("read map", "map: kitchen east, garden north"), Turn("go east", "kitchen"),
               Turn("take pan", "taken"), Turn("go west", "hall"), Turn("read map", "map: garden north only"),
               Turn("go north", "garden"), Turn("look", "a garden")]


def test_pinned_result_outlives_the_window():
    plain = render_state("t", MAP_HISTORY, "a garden", window=2)
    assert "map:" not in plain
    text = render_state("t", MAP_HISTORY, "a garden", window=2, pin=["READ MAP"])
    # the latest result of the pinned action, once, right after the task and observation
    assert text.splitlines()[:3] == ["Task: t", "Now: a garden", "Pinned > read map: map: garden north only"]
    assert text.count("Pinned") == 1
    globbed = render_state("t", MAP_HISTORY, "a garden", window=2, pin=["read *", "take *"])
    assert [line for line in globbed.splitlines() if line.startswith("Pinned")] == [
        "Pinned > read map: map: garden north only", "Pinned > take pan: taken"]
    assert "Pinned" not in render_state("t", MAP_HISTORY, "a garden", window=2, pin=["open *"])


def test_pin_skips_a_result_already_shown():
    history = [Turn("go east", "kitchen"), Turn("read map", "the map")]
    assert "Pinned" not in render_state("t", history, "the map", pin=["read map"])
    history = [Turn("task", "Find the key."), Turn("go east", "kitchen")]  # the task command repeats the task
    assert "Pinned" not in render_state("Find the key.", history, "kitchen", pin=["task"])


def test_done_list_counts_repeats_in_order_of_first_use():
    text = render_state("t", MAP_HISTORY + [Turn("look", "a garden")], "a garden", window=1,
                        list_actions=True)
    assert "Done: read map (x2); go east; take pan; go west; go north; look (x2)" in text.splitlines()
    assert "Done" not in render_state("t", [], "start", list_actions=True)


def test_observation_first():
    text = render_state("t", MAP_HISTORY[:1], "hall", observation_first=True)
    assert text.splitlines()[:2] == ["Now: hall", "Task: t"]


def test_layout_reproduced_by_the_served_critic():
    """The pipeline's stage and a served Critic (layout from the model's `render` meta, as the
    pipeline stores it) give byte-identical states and the same history features."""
    import json

    import pyarrow as pa

    from harnessrl import schemas
    from harnessrl.algorithms.iql import IQLConfig, IQLNetwork
    from harnessrl.config import parse_pipeline
    from harnessrl.critic import Critic
    from harnessrl.encoders import BUILTIN_MINILM, encoder_identity
    from harnessrl.features import features_for
    from harnessrl.heads.frozen import FrozenScorer
    from harnessrl.model_card import ModelCard
    from harnessrl.pipelines.transitions import _build

    cfg = parse_pipeline({"data": {"train": ["x"]}, "render": {
        "window": 2, "pin": ["read map"], "list_actions": True, "observation_first": True, "tool_from": "first_word"}})
    obs = ["hall", *[t.result for t in MAP_HISTORY]]
    steps = [{"episode_id": "e", "step_idx": i, "obs_text": obs[i], "action_text": t.action, "action_reasoning": "",
              "tool_calls": [], "result_text": "", "reward": None, "candidates": ["look", t.action], "info": "{}",
              "terminated": i == len(MAP_HISTORY) - 1, "truncated": False} for i, t in enumerate(MAP_HISTORY)]
    episode = {"episode_id": "e", "task_id": "t", "group_id": "t", "task_text": "find the garden", "terminated": True,
               "outcome_success": True, "outcome_score": None, "tool_definitions": "[]"}
    rows = sorted(_build(pa.Table.from_pylist(steps, schema=schemas.STEPS), {"e": episode}, RewardRecipe(),
                         cfg.render).to_pylist(), key=lambda r: r["step_idx"])
    card = ModelCard(head="frozen", head_config=IQLConfig().to_dict(),
                     encoder=json.loads(encoder_identity(BUILTIN_MINILM).to_json()), render=cfg.render)
    critic = Critic(FrozenScorer(IQLNetwork(IQLConfig())), card)
    pinned = 0
    for t, row in enumerate(rows):
        request = {"task": "find the garden", "observation": obs[t],
                   "history": [{"action": MAP_HISTORY[i].action, "observation": obs[i + 1]} for i in range(t)]}
        parsed = critic.parse_state(request)
        assert parsed.text == row["state_text"]
        served = features_for(parsed.history, parsed.observation, [row["action_text"]], "first_word")[0]
        assert served == pytest.approx(row["features"], rel=1e-6)  # the table stores float32
        pinned += "Pinned > read map" in parsed.text
    assert pinned >= 4 and rows[-1]["state_text"].startswith("Now: garden\nTask: find the garden")
