"""The state as segments (render.state_segments), what the reader head reads: what a state keeps,
and that training (the transitions stage) and serving (a request's history, rebuilt) give the same
segments and history features."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from harnessrl import schemas
from harnessrl.config import RenderConfig
from harnessrl.render import EMBEDDED_ROLES, Renderer, Segment, Turn, details, state_segments
from harnessrl.rewards import RewardRecipe
from harnessrl.transitions import episode_transitions

HISTORY = [Turn("read cookbook", "Ingredients: red potato, salt. Directions: dice the red potato."),
           Turn("take knife", "You take the knife."), Turn("move east", "You are in the kitchen."),
           Turn("open fridge", "The fridge holds a red potato."), Turn("take knife", "You take the knife."),
           Turn("look", "You are in the kitchen.")]


def _roles(segs) -> list[str]:
    return [s.role for s in segs]


def test_a_state_keeps_task_observation_last_action_results_and_the_actions_taken():
    segs = state_segments("Cook a meal.", HISTORY, "You are in the kitchen.")
    assert _roles(segs) == ["task", "observation", "last", "result", "result", "result", "actions"]
    assert segs[2] == Segment("last", 1, "look")
    results = [s for s in segs if s.role == "result"]
    # distinct results not already shown (the observation repeats "You are in the kitchen."), newest first
    assert [s.age for s in results] == [2, 3, 6]
    assert results[-1].text.startswith("read cookbook: Ingredients: red potato")
    assert segs[-1].text == "read cookbook; take knife (x2); move east; open fridge; look"


def test_old_long_results_outlive_newer_short_ones_within_the_budget():
    """No pin list: a recipe read long ago stays while the window of newest results moves on."""
    history = [Turn("read recipe", "a long recipe " * 20)] + [Turn(f"step {i}", f"short {i}") for i in range(8)]
    cfg = RenderConfig(memory_results=3, memory_newest=2)
    results = [s for s in state_segments("t", history, "now", cfg) if s.role == "result"]
    assert [s.age for s in results] == [1, 2, 9]
    assert results[-1].text.startswith("read recipe: a long recipe")


def test_segments_are_cut_and_empty_ones_left_out():
    segs = state_segments("", [Turn("read", "x" * 5000)], "   ", RenderConfig(segment_chars=100, memory_actions=False))
    assert _roles(segs) == ["last", "result"] and len(segs[1].text) == 100 and segs[1].text.endswith("...")
    assert state_segments("t", [], "o") == (Segment("task", 0, "t"), Segment("observation", 0, "o"))


def test_details_read_the_observations_lines_and_sentences_apart():
    obs = "Recipe #1\nIngredients: red potato, salt.\nDirections: dice the red potato. Fry it. Fry it."
    segs = state_segments("Cook.", [], obs, RenderConfig(details=4))
    assert _roles(segs) == ["task", "observation", "detail", "detail", "detail", "detail"]
    assert [s.text for s in segs[2:]] == ["Recipe #1", "Ingredients: red potato, salt.",
                                          "Directions: dice the red potato.", "Fry it."]  # distinct, at most 4
    assert details(obs, 2) == ["Recipe #1", "Ingredients: red potato, salt."]
    assert details("One sentence.", 8) == [] and details(obs, 0) == []  # nothing to tell apart; off
    assert "detail" not in _roles(state_segments("Cook.", HISTORY, obs))  # off by default
    assert "detail" in EMBEDDED_ROLES
    # a state read without its history keeps its observation's details
    from harnessrl.heads.reader_inputs import without_history
    with_history = [(s.role, s.age, s.text) for s in state_segments("Cook.", HISTORY, obs, RenderConfig(details=4))]
    assert [r for r, _, _ in without_history(with_history)] == ["task", "observation"] + ["detail"] * 4


def test_the_sources_status_is_a_segment_and_marks_each_result_with_how_it_moved():
    """A game's score after each action: the latest as the `status` segment, and each earlier result
    says whether its action raised or lowered it (the take-back loop of a text game: a placement that
    lowered the score is undone, one that raised it is not)."""
    history = [Turn("take coat", "You take the coat.", "0"), Turn("put coat in sofa", "You put the coat in the sofa.",
                                                                  "-0.1667"),
               Turn("take coat", "You take the coat again.", "0"), Turn("put coat in hanger", "Done.", "0.1667")]
    segs = state_segments("Tidy up.", history, "You are in the hall.")
    assert _roles(segs) == ["task", "observation", "last", "status", "result", "result", "result", "result", "actions"]
    assert segs[3] == Segment("status", 0, "score: 0.1667, up after the last action")
    results = {s.age: s.text for s in segs if s.role == "result"}
    assert results == {1: "put coat in hanger: Done. [score up]", 2: "take coat: You take the coat again. [score up]",
                       3: "put coat in sofa: You put the coat in the sofa. [score down]",
                       4: "take coat: You take the coat."}  # the first turn has nothing to compare with
    # the status stays when the history is dropped (what an agent sees now); off, or a source without one
    from harnessrl.heads.reader_inputs import without_history
    assert [r for r, _, _ in without_history([(s.role, s.age, s.text) for s in segs])] == \
        ["task", "observation", "status"]
    off = state_segments("Tidy up.", history, "You are in the hall.", RenderConfig(status_from=None))
    assert "status" not in _roles(off) and "[score" not in " ".join(s.text for s in off)
    plain = [Turn(t.action, t.result) for t in history]
    assert state_segments("Tidy up.", plain, "You are in the hall.") == \
        state_segments("Tidy up.", plain, "You are in the hall.", RenderConfig(status_from=None))
    # text statuses are shown as they are, without a direction
    worded = state_segments("t", [Turn("run tests", "ok", "3 failing"), Turn("fix", "ok", "all passing")], "o",
                            RenderConfig(status_from="tests"))
    assert Segment("status", 0, "tests: all passing") in worded and "[tests" not in " ".join(s.text for s in worded)


def test_the_apis_history_items_carry_the_status():
    from serving.api import StructuredState

    state = StructuredState.model_validate({"task": "t", "observation": "o", "history": [
        {"action": "a", "observation": "x", "status": 1}, {"action": "b", "observation": "y", "status": 0.5}]})
    assert Segment("status", 0, "score: 0.5, down after the last action") in Renderer().parse(state.model_dump()).segments
    assert StructuredState.model_validate({"history": [{"action": "a"}]}).model_dump()["history"][0]["status"] is None


def test_a_rendered_text_request_is_its_one_segment():
    parsed = Renderer().parse("Task: t\nNow: o")
    assert parsed.segments == (Segment("text", 0, "Task: t\nNow: o"),) and "text" in EMBEDDED_ROLES
    assert Renderer().parse(parsed) is parsed  # parsed states pass through (evaluation rows)


OBS = ["You are in the hall.", "Ingredients: red potato.\nDirections: dice it. Fry it.", "You take the knife.",
       "You are in the kitchen. A fridge is here.",
       "You take the knife."]
ACTIONS = ["read cookbook", "take knife", "move east", "take knife", "eat meal"]
SCORES = [0, 1, None, 0.5, 2]  # the game's score after each step (the third step's info has none)


@pytest.mark.parametrize("settings", [{}, {"memory_results": 1, "memory_newest": 0, "memory_actions": False},
                                      {"tool_from": "first_word", "window": 1}, {"details": 3},
                                      {"status_from": None}])
def test_serving_rebuilds_the_segments_and_features_training_saw(settings):
    episode = {"episode_id": "e", "task_id": "t", "group_id": "g", "task_text": "Cook a meal.", "terminated": True,
               "outcome_success": True, "tool_definitions": "[]"}
    steps = [{"episode_id": "e", "step_idx": i, "obs_text": OBS[i], "action_text": a,
              "candidates": [a, "look", "inventory"], "terminated": i == len(ACTIONS) - 1,
              "info": json.dumps({"score": SCORES[i]} if SCORES[i] is not None else {})}
             for i, a in enumerate(ACTIONS)]
    renderer = Renderer(RenderConfig(**settings))
    rows = episode_transitions(episode, steps, RewardRecipe(), renderer)
    pa.Table.from_pylist([{**r, "reward_components": list(r["reward_components"].items())} for r in rows],
                         schema=schemas.TRANSITIONS)  # the table's schema holds them
    for t, row in enumerate(rows):
        request = {"task": "Cook a meal.", "observation": OBS[t],
                   "history": [{"action": ACTIONS[i], "observation": OBS[i + 1], "status": SCORES[i]}
                               for i in range(t)]}
        parsed = renderer.parse(request)
        assert [{"role": s.role, "age": s.age, "text": s.text} for s in parsed.segments] == row["state_segments"]
        assert renderer.features(parsed.history, parsed.observation, [ACTIONS[t]])[0] == row["features"]
        if t + 1 < len(rows):
            assert row["next_state_segments"] == rows[t + 1]["state_segments"]
    if settings.get("status_from", "score"):  # the logged score after each step is the state's status
        assert any({"role": "status", "age": 0, "text": "score: 1, up after the last action"} in r["state_segments"]
                   for r in rows)
    else:
        assert not any(s["role"] == "status" for r in rows for s in r["state_segments"])
    if settings.get("details"):  # the observations of several sentences are read apart, in training and serving
        assert sum(s["role"] == "detail" for r in rows for s in r["state_segments"]) == 5
