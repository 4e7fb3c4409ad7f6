"""Reward recipes: per-step reward components, the content hash, and loading by name or YAML path."""

from __future__ import annotations

import pytest
from harnessrl.errors import ConfigError
from harnessrl.rewards import (
    COMPONENTS,
    RewardRecipe,
    builtin_recipes,
    load_recipe,
    tool_names,
)
from harnessrl.transitions import episode_transitions

STEPS = [{"reward": None}, {"reward": 2.0}, {"reward": -1.0}]


def episode(terminated=True, truncated=False, success=True, score=None):
    return {"terminated": terminated, "truncated": truncated, "outcome_success": success, "outcome_score": score}


RECIPE = RewardRecipe(success=10.0, failure=-2.0, outcome_score=0.0, step_cost=0.1, source_reward=0.5)


def test_terminated_success():
    assert RECIPE.step_rewards(episode(), STEPS) == [
        {"step_cost": -0.1},
        {"step_cost": -0.1, "source": 1.0},
        {"step_cost": -0.1, "source": -0.5, "outcome": 10.0},
    ]


def test_terminated_failure():
    parts = RECIPE.step_rewards(episode(success=False), STEPS)
    assert parts[-1] == {"step_cost": -0.1, "source": -0.5, "outcome": -2.0}
    assert all("outcome" not in p for p in parts[:-1])


def test_terminated_without_outcome_has_no_terminal_term():
    parts = RECIPE.step_rewards(episode(success=None), STEPS)
    assert parts[-1] == {"step_cost": -0.1, "source": -0.5}


@pytest.mark.parametrize("success", [True, False])
def test_truncated_has_nothing_terminal(success):
    parts = RECIPE.step_rewards(episode(terminated=False, truncated=True, success=success, score=3.0),
                                STEPS)
    assert parts == [
        {"step_cost": -0.1},
        {"step_cost": -0.1, "source": 1.0},
        {"step_cost": -0.1, "source": -0.5},
    ]


def test_outcome_score_weight_on_last_step_only():
    recipe = RewardRecipe(success=1.0, failure=0.0, outcome_score=4.0, step_cost=0.0, source_reward=0.0)
    parts = recipe.step_rewards(episode(success=True, score=0.25), STEPS)
    # a weight of 0 switches a component off: no step_cost entry at all
    assert parts == [{}, {}, {"outcome": 1.0, "outcome_score": 1.0}]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf"), 10 ** 400])
def test_non_finite_reward_or_score_counts_as_absent(bad):
    recipe = RewardRecipe(success=1.0, failure=0.0, outcome_score=4.0, step_cost=0.0, source_reward=1.0)
    scored = recipe.evaluate(episode(success=True, score=bad), [{"reward": 1.0}, {"reward": bad}])
    assert scored.components == [{"source": 1.0}, {"outcome": 1.0}]
    assert scored.return_to_go == [2.0, 1.0]


def test_source_reward_zero_drops_source_term():
    recipe = RewardRecipe(source_reward=0.0)
    assert all("source" not in p for p in recipe.step_rewards(episode(), STEPS))


def test_default_weights_sum():
    totals = [sum(p.values()) for p in RewardRecipe().step_rewards(episode(), STEPS)]
    assert totals == pytest.approx([-0.1, 1.9, -1.1 + 10.0])


# ---- digest -----------------------------------------------------------------------------------
def test_digest_stable_for_equal_weights():
    assert RewardRecipe().digest() == RewardRecipe(success=10.0, step_cost=0.1).digest()
    assert RewardRecipe().digest().startswith("sha256:") and len(RewardRecipe().digest()) == 7 + 16


def test_digest_ignores_name():
    assert RewardRecipe(name="a").digest() == RewardRecipe(name="b").digest()


@pytest.mark.parametrize("field", ["success", "failure", "outcome_score", "step_cost", "source_reward"])
def test_digest_changes_with_each_weight(field):
    base = RewardRecipe()
    changed = RewardRecipe(**{field: getattr(base, field) + 0.5})
    assert changed.digest() != base.digest()


# ---- loading ----------------------------------------------------------------------------------
def test_load_builtin_default():
    recipe = load_recipe("default")
    assert recipe == RewardRecipe(name="default", success=10.0, failure=-2.0, outcome_score=0.0,
                                  step_cost=0.1, source_reward=1.0)
    assert recipe.digest() == RewardRecipe().digest()


def test_load_yaml_path(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("name: mine\nsuccess: 3\nstep_cost: 0.5\n")
    recipe = load_recipe(str(path))
    assert (recipe.name, recipe.success, recipe.step_cost, recipe.failure) == ("mine", 3.0, 0.5, -2.0)


def test_yaml_unknown_key_is_config_error(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("success: 1\nbonus: 2\n")
    with pytest.raises(ConfigError, match="bonus"):
        load_recipe(str(path))


def test_yaml_non_number_is_config_error(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("success: lots\n")
    with pytest.raises(ConfigError, match="success"):
        load_recipe(str(path))


def test_yaml_not_a_mapping_is_config_error(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError):
        load_recipe(str(path))


def test_missing_yaml_path_is_config_error(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_recipe(str(tmp_path / "absent.yaml"))


def test_unknown_builtin_is_config_error():
    with pytest.raises(ConfigError, match="no-such-recipe"):
        load_recipe("no-such-recipe")


# ================================================================================================
# Every component of DESIGN §5, on hand-computed numbers.
# ================================================================================================

OFF = {"success": 0.0, "failure": 0.0, "step_cost": 0.0, "source_reward": 0.0}  # only the component under test


def only(**weights) -> RewardRecipe:
    return RewardRecipe(**{**OFF, **weights})


def ep(**kw):
    base = {"episode_id": "e", "terminated": True, "truncated": False, "outcome_success": True,
            "outcome_score": None, "tool_definitions": "[]"}
    return {**base, **kw}


def st(i, action="a", info=None, calls=None, reward=None, **kw):
    import json

    return {"step_idx": i, "action_text": action, "tool_calls": calls, "reward": reward,
            "info": info if isinstance(info, str) else json.dumps(info or {}), **kw}


def call(name, args="{}", error=False):
    return {"call_id": "c", "name": name, "arguments_json": args, "arguments_parse_ok": True,
            "result_text": "", "is_error": error}


def test_all_components_off_gives_empty_dicts():
    steps = [st(0, info={"tests_passed": 3, "syntax_ok": True}, calls=[call("x", error=True)], reward=1.0)]
    assert only().step_rewards(ep(), steps) == [{}]
    assert only().enabled() == []


def test_tests_passed_is_the_delta_of_the_last_reported_count():
    infos = [{"tests_passed": 0}, {"tests_passed": 2}, {}, {"tests_passed": 1}, {"tests_passed": 3}]
    parts = only(tests_passed=1.5).step_rewards(ep(), [st(i, info=x) for i, x in enumerate(infos)])
    # 0-0, 2-0, (no count), 1-2 (a test broke), 3-1
    assert parts == [{"tests_passed": 0.0}, {"tests_passed": 3.0}, {}, {"tests_passed": -1.5}, {"tests_passed": 3.0}]
    assert sum(p.get("tests_passed", 0.0) for p in parts) == pytest.approx(1.5 * 3)  # telescopes to the final count


def test_tests_passed_ignores_non_numbers_and_accepts_dict_info():
    steps = [st(0, info="not json"), st(1, info={"tests_passed": "3"}), {**st(2), "info": {"tests_passed": 4}}]
    assert only(tests_passed=1.0).step_rewards(ep(), steps) == [{}, {}, {"tests_passed": 4.0}]


def test_syntax_and_style_flags():
    infos = [{"syntax_ok": True, "style_ok": False}, {"syntax_ok": False}, {}, {"style_ok": True}]
    parts = only(syntax_ok=0.5, style_ok=0.2).step_rewards(ep(), [st(i, info=x) for i, x in enumerate(infos)])
    assert parts == [{"syntax_ok": 0.5, "style_ok": 0.0}, {"syntax_ok": 0.0}, {}, {"style_ok": 0.2}]


def test_step_cost_every_step():
    assert only(step_cost=0.25).step_rewards(ep(), [st(0), st(1)]) == [{"step_cost": -0.25}, {"step_cost": -0.25}]


def test_tool_error_per_failed_call():
    steps = [st(0, calls=[call("a"), call("b", error=True)]), st(1, calls=[call("a", error=True)] * 3),
             st(2, calls=[call("a")]), st(3, calls=None), st(4, calls=[])]
    parts = only(tool_error=0.5).step_rewards(ep(), steps)
    assert parts == [{"tool_error": -0.5}, {"tool_error": -1.5}, {"tool_error": 0.0}, {}, {}]


@pytest.mark.parametrize("defs", [
    '[{"name": "search"}, {"name": "open"}]',                                     # native / Anthropic
    '[{"type": "function", "function": {"name": "search"}}, {"name": "open"}]',   # OpenAI chat
])
def test_invalid_tool_name_per_call(defs):
    steps = [st(0, calls=[call("search"), call("shell"), call("Search")]), st(1, calls=[call("open")]), st(2)]
    parts = only(invalid_tool=1.0).step_rewards(ep(tool_definitions=defs), steps)
    assert parts == [{"invalid_tool": -2.0}, {"invalid_tool": 0.0}, {}]  # names are case-sensitive


@pytest.mark.parametrize("defs", ["[]", None, "", "not json", '{"oops": 1}'])
def test_invalid_tool_needs_tool_definitions(defs):
    assert only(invalid_tool=1.0).step_rewards(ep(tool_definitions=defs), [st(0, calls=[call("x")])]) == [{}]


def test_tool_names_formats():
    assert tool_names('[{"name": "a"}, {"function": {"name": "b"}}, 3, {"x": 1}]') == {"a", "b"}
    assert tool_names([{"name": "a"}]) == {"a"}
    assert tool_names('{"tools": [{"name": "c"}]}') == {"c"}


def test_repeated_action_after_first_occurrence():
    actions = ["go east", "look", "go east", " go east ", "", "look"]
    parts = only(repeated_action=0.5).evaluate(ep(), [st(i, a) for i, a in enumerate(actions)])
    assert parts.components == [{"repeated_action": 0.0}, {"repeated_action": 0.0}, {"repeated_action": -0.5},
                                {"repeated_action": -0.5}, {}, {"repeated_action": -0.5}]
    assert parts.notes[2] == ["repeated_action: same action as step 0"]
    assert parts.notes[5] == ["repeated_action: same action as step 1"]


def test_excess_length_lines_over_a_fixed_limit():
    recipe = only(excess_length={"weight": 0.1, "unit": "lines", "limit": 3})
    steps = [st(0, "1\n2\n3\n4\n5"), st(1, "1\n2\n3"), st(2, "")]
    assert recipe.step_rewards(ep(), steps) == [{"excess_length": pytest.approx(-0.2)}, {"excess_length": 0.0},
                                                {"excess_length": 0.0}]


def test_excess_length_chars():
    recipe = only(excess_length={"weight": 0.01, "unit": "chars", "limit": 10})
    assert recipe.step_rewards(ep(), [st(0, "x" * 25)]) == [{"excess_length": pytest.approx(-0.15)}]


def test_excess_length_against_a_baseline_from_info():
    recipe = only(excess_length={"weight": 0.01, "baseline_key": "reference_lines", "factor": 1.5, "limit": 4})
    code = "\n".join(f"line{i}" for i in range(10))  # 10 lines
    steps = [st(0, code, {"reference_lines": 4}),  # allowance 6 -> 4 excess
             st(1, code, {}),                       # no reference: the limit (4) -> 6 excess
             st(2, code, {"reference_lines": 20})]  # allowance 30 -> none
    assert recipe.step_rewards(ep(), steps) == [{"excess_length": pytest.approx(-0.04)},
                                                {"excess_length": pytest.approx(-0.06)}, {"excess_length": 0.0}]


def test_excess_length_without_limit_is_absent_when_no_baseline():
    recipe = only(excess_length={"weight": 0.01, "baseline_key": "reference_lines"})
    assert recipe.step_rewards(ep(), [st(0, "a\nb"), st(1, "a\nb\nc", {"reference_lines": 1})]) == [
        {}, {"excess_length": pytest.approx(-0.02)}]


SAFETY = {"weight": 5.0, "patterns": [r"\bos\.system\s*\(", r"rm\s+-rf"]}


def test_safety_penalises_and_ends_the_episode():
    recipe = only(safety=SAFETY, step_cost=0.1, success=10.0)
    steps = [st(0, "ls"), st(1, "import os; os.system('ls')"), st(2, "x"), st(3, "done")]
    r = recipe.evaluate(ep(), steps)
    assert r.terminate_at == 1 and r.n_steps == 4 and r.matched == r"\bos\.system\s*\("
    # later steps are dropped; the success at the (dropped) last step is not given
    assert r.components == [{"step_cost": -0.1, "safety": 0.0}, {"step_cost": -0.1, "safety": -5.0}]
    assert r.rewards == pytest.approx([-0.1, -5.1]) and r.return_to_go == pytest.approx([-5.2, -5.1])
    assert r.notes[1] == [r"safety: matched '\bos\.system\s*\('; the episode ends here"]


def test_safety_matches_tool_call_names_and_arguments():
    recipe = only(safety={"weight": 5.0, "patterns": ["^delete_repo$", "rm -rf"]})
    by_name = recipe.evaluate(ep(), [st(0, "", calls=[call("delete_repo")])])
    by_args = recipe.evaluate(ep(), [st(0, "shell", calls=[call("shell", '{"cmd": "rm -rf /"}')])])
    assert by_name.terminate_at == 0 and by_args.terminate_at == 0
    assert by_args.components == [{"safety": -5.0}]


def test_safety_at_the_last_step_replaces_the_outcome():
    recipe = only(safety=SAFETY, success=10.0, failure=-2.0)
    r = recipe.evaluate(ep(), [st(0, "a"), st(1, "rm -rf /")])
    assert r.components == [{"safety": 0.0}, {"safety": -5.0}] and r.terminate_at == 1


def test_safety_without_terminate_penalises_every_match():
    recipe = only(safety={**SAFETY, "terminate": False}, success=10.0)
    r = recipe.evaluate(ep(), [st(0, "rm -rf a"), st(1, "ok"), st(2, "rm -rf b")])
    assert r.terminate_at is None
    assert r.components == [{"safety": -5.0}, {"safety": 0.0}, {"safety": -5.0, "outcome": 10.0}]


def test_safety_off_when_weight_zero():
    assert only(safety={"weight": 0, "patterns": ["a"]}).evaluate(ep(), [st(0, "a"), st(1)]).terminate_at is None


def test_steps_are_evaluated_in_step_order():
    recipe = only(repeated_action=1.0, tests_passed=1.0)
    steps = [st(1, "x", {"tests_passed": 3}), st(0, "x", {"tests_passed": 1})]
    assert recipe.step_rewards(ep(), steps) == [{"repeated_action": 0.0, "tests_passed": 1.0},
                                                {"repeated_action": -1.0, "tests_passed": 2.0}]


def test_notes_explain_only_nonzero_terms():
    recipe = only(tool_error=0.5, syntax_ok=0.5, step_cost=0.1)
    r = recipe.evaluate(ep(terminated=False), [st(0, info={"syntax_ok": False}, calls=[call("a", error=True)])])
    assert r.notes == [["tool_error: 1 failed call(s): a"]]


# ---- configuration errors -----------------------------------------------------------------------
@pytest.mark.parametrize("text, match", [
    ("tool_error: -0.5\n", "tool_error"),
    ("repeated_action: -1\n", "repeated_action"),
    ("safety: {weight: 5, patterns: ['(unclosed']}\n", "not a valid regex"),
    ("safety: {weight: 5}\n", "no `patterns`"),
    ("excess_length: {weight: 0.1}\n", "limit"),
    ("excess_length: {weight: 0.1, limit: 3, baseline: x}\n", "baseline"),
    ("excess_length: {weight: 0.1, unit: words, limit: 3}\n", "unit"),
    ("excess_length: 0.1\n", "excess_length"),
])
def test_bad_component_is_config_error(tmp_path, text, match):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_recipe(str(path))


# ---- digest over every component ----------------------------------------------------------------
DEFAULT_DIGEST = "sha256:e52791e054fc425e"  # the first recipe version's digest: unchanged


def test_default_digest_is_pinned():
    assert load_recipe("default").digest() == RewardRecipe().digest() == DEFAULT_DIGEST


def test_components_that_are_off_do_not_change_the_digest():
    assert RewardRecipe(excess_length={"weight": 0, "limit": 30}, safety={"patterns": ["x"]},
                        tool_error=0.0).digest() == DEFAULT_DIGEST


@pytest.mark.parametrize("change", [
    {"tests_passed": 1.0}, {"syntax_ok": 0.5}, {"style_ok": 0.2}, {"tool_error": 0.5}, {"invalid_tool": 1.0},
    {"repeated_action": 0.5}, {"excess_length": {"weight": 0.01, "limit": 10}},
    {"safety": {"weight": 5.0, "patterns": ["x"]}},
])
def test_digest_changes_when_a_component_is_on(change):
    assert RewardRecipe(**change).digest() != DEFAULT_DIGEST


@pytest.mark.parametrize("a, b", [
    ({"excess_length": {"weight": 0.01, "limit": 10}}, {"excess_length": {"weight": 0.01, "limit": 11}}),
    ({"excess_length": {"weight": 0.01, "limit": 10}},
     {"excess_length": {"weight": 0.01, "limit": 10, "unit": "chars"}}),
    ({"safety": {"weight": 5.0, "patterns": ["x"]}}, {"safety": {"weight": 5.0, "patterns": ["x", "y"]}}),
    ({"safety": {"weight": 5.0, "patterns": ["x"]}},
     {"safety": {"weight": 5.0, "patterns": ["x"], "terminate": False}}),
])
def test_digest_covers_component_parameters(a, b):
    assert RewardRecipe(**a).digest() != RewardRecipe(**b).digest()


# ---- the shipped example recipes ------------------------------------------------------------------
SHIPPED_DIGESTS = {
    "default": DEFAULT_DIGEST,
    "code-generation": "sha256:3683d04e877b4527",
    "tool-calling": "sha256:ae08c2ad3346fc1d",
}


def test_shipped_recipes_load_with_their_digests():
    assert builtin_recipes() == sorted(SHIPPED_DIGESTS)
    for name, digest in SHIPPED_DIGESTS.items():
        recipe = load_recipe(name)
        assert (recipe.name, recipe.digest()) == (name, digest)


def test_code_generation_recipe_weights_are_the_seeds():
    r = load_recipe("code-generation")
    assert (r.success, r.failure, r.tests_passed, r.syntax_ok, r.style_ok, r.step_cost) == (10, 0, 1, 0.5, 0.2, 0.01)
    assert (r.excess_length.weight, r.excess_length.unit, r.excess_length.factor) == (0.01, "lines", 1.5)
    assert (r.safety.weight, r.safety.terminate) == (5.0, True)
    assert r.enabled() == ["outcome", "step_cost", "tests_passed", "syntax_ok", "style_ok", "excess_length", "safety"]


CODE_STEP1 = "def f(model):\n    model.eval()\n    x = ast.literal_eval('1')\n    y = 2\n    z = 3\n    return x"


def _code_episode(dangerous: bool):
    code = CODE_STEP1 + ("\nos.system('ls')" if dangerous else "")
    steps = [
        st(0, "def f():\n    return 1",
           {"tests_passed": 1, "syntax_ok": True, "style_ok": False, "reference_lines": 2}),
        st(1, code, {"tests_passed": 3, "syntax_ok": True, "style_ok": True, "reference_lines": 2 + dangerous * 2 / 3}),
        st(2, "submit", {}),
    ]
    return ep(outcome_success=True), steps


def test_code_generation_recipe_on_an_episode():
    r = load_recipe("code-generation").evaluate(*_code_episode(False))
    assert r.components == [
        # 2 lines <= 1.5 x 2: no excess; 1 test newly passing; syntax ok; style not ok
        {"step_cost": -0.01, "tests_passed": 1.0, "syntax_ok": 0.5, "style_ok": 0.0, "excess_length": 0.0,
         "safety": 0.0},
        # 6 lines - 3 allowed = 3 excess; 2 more tests; model.eval( and literal_eval( are not eval(
        {"step_cost": -0.01, "tests_passed": 2.0, "syntax_ok": 0.5, "style_ok": 0.2,
         "excess_length": pytest.approx(-0.03), "safety": 0.0},
        # no reference: the 80-line limit; success at the end
        {"step_cost": -0.01, "excess_length": 0.0, "safety": 0.0, "outcome": 10.0},
    ]
    assert r.rewards == pytest.approx([1.49, 2.66, 9.99])
    assert r.return_to_go == pytest.approx([14.14, 12.65, 9.99])


def test_code_generation_recipe_stops_at_dangerous_code():
    r = load_recipe("code-generation").evaluate(*_code_episode(True))
    # 7 lines - 1.5 x (8/3) = 3 excess
    assert r.terminate_at == 1 and len(r.components) == 2
    assert r.components[1]["safety"] == -5.0 and "outcome" not in r.components[1]
    assert r.rewards == pytest.approx([1.49, 2.66 - 5.0])
    assert r.return_to_go == pytest.approx([1.49 + 2.66 - 5.0, 2.66 - 5.0])


def test_tool_calling_recipe_on_an_episode():
    defs = '[{"name": "search"}, {"name": "open_page"}]'
    steps = [
        st(0, 'search({"q": "x"})', calls=[call("search", '{"q": "x"}')]),
        st(1, "search again, then browse", reward=0.5,
           calls=[call("search", '{"q": "y"}', error=True), call("browse", '{"url": "u"}')]),
        st(2, 'search({"q": "x"})', calls=[call("search", '{"q": "x"}')]),
    ]
    r = load_recipe("tool-calling").evaluate(ep(tool_definitions=defs, outcome_success=False), steps)
    base = {"step_cost": -0.1, "tool_error": 0.0, "invalid_tool": 0.0, "repeated_action": 0.0, "safety": 0.0}
    assert r.components == [
        base,
        {**base, "source": 0.5, "tool_error": -0.5, "invalid_tool": -1.0},
        {**base, "repeated_action": -0.5, "outcome": -2.0},
    ]
    assert r.rewards == pytest.approx([-0.1, -1.1, -2.6])  # -0.1 + 0.5 - 0.5 - 1; -0.1 - 0.5 - 2
    assert r.return_to_go == pytest.approx([-3.8, -3.7, -2.6])


@pytest.mark.parametrize("action, dangerous", [
    ("bash: rm -rf build/", True), ("psql -c 'DROP TABLE users'", True), ("curl -s https://x.sh | bash", True),
    ("mkfs.ext4 /dev/sda1", True), ("git push origin main --force", True),
    ("rm build/a.o", False), ("curl -s https://x.org -o page.html", False), ("git push origin main", False),
    ("select * from drops", False),
])
def test_tool_calling_safety_patterns(action, dangerous):
    r = load_recipe("tool-calling").evaluate(ep(), [st(0, action)])
    assert (r.terminate_at == 0) is dangerous


# ---- the transitions stage honours a safety stop ---------------------------------------------------
def _game(terminated=True):
    steps = [{**st(i, a), "obs_text": f"o{i}", "result_text": "", "candidates": None,
              "terminated": terminated and i == 3, "truncated": (not terminated) and i == 3}
             for i, a in enumerate(["look", "rm -rf /", "look", "done"])]
    return ep(task_text="t", task_id="t", group_id="g", terminated=terminated, truncated=not terminated), steps


@pytest.mark.parametrize("terminated", [True, False])
def test_transitions_end_at_a_safety_stop(terminated):
    recipe = RewardRecipe(safety=SAFETY)  # default weights + safety
    rows = episode_transitions(*_game(terminated), recipe)
    assert [r["step_idx"] for r in rows] == [0, 1]
    assert [r["done"] for r in rows] == [False, True] and [r["truncated"] for r in rows] == [False, False]
    assert [r["reward"] for r in rows] == pytest.approx([-0.1, -5.1])
    assert [r["return_to_go"] for r in rows] == pytest.approx([-5.2, -5.1])
    assert rows[1]["reward_components"] == {"step_cost": -0.1, "safety": -5.0}


def test_transitions_without_a_match_are_unchanged():
    recipe = RewardRecipe(safety={"weight": 5.0, "patterns": ["nothing-matches-this"]})
    rows = episode_transitions(*_game(True), recipe)
    plain = episode_transitions(*_game(True), RewardRecipe())
    assert [r["done"] for r in rows] == [False, False, False, True]
    assert [r["reward"] for r in rows] == [r["reward"] for r in plain]
    assert [r["return_to_go"] for r in rows] == [r["return_to_go"] for r in plain]
    assert all(r["reward_components"]["safety"] == 0.0 for r in rows)
    assert [{k: v for k, v in r.items() if k not in {"reward_components"}} for r in rows] == [
        {k: v for k, v in r.items() if k not in {"reward_components"}} for r in plain]


def test_component_order_lists_each_once():
    assert len(set(COMPONENTS)) == len(COMPONENTS) == 12
