"""Reward recipes: per-step reward components, the content hash, and loading by name or YAML path."""

from __future__ import annotations

import pytest

from harnessrl.errors import ConfigError
from harnessrl.rewards import RewardRecipe, load_recipe

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
    assert parts == [{"step_cost": -0.0}, {"step_cost": -0.0}, {"step_cost": -0.0, "outcome": 1.0, "outcome_score": 1.0}]


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
