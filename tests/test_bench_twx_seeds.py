"""bench/twx_seeds.py: the ensemble decides through the critic's own request path and decision, and
its offline figures compare members as they are."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import MODEL, import_bench

pytestmark = pytest.mark.integration

STATE = {"task": "Find the coin.", "observation": "You are in the kitchen. To the north you see the pantry.",
         "history": [{"action": "move north", "observation": "You are in the pantry."},
                     {"action": "move south", "observation": "You are in the kitchen. To the north you see the pantry."}]}
CANDIDATES = ["move north", "look around", "open fridge", "take coin"]


@pytest.fixture(scope="module")
def critic(pipeline_run):
    from harnessrl.critic import Critic

    return Critic.load(f"models:/{MODEL}@champion")


def test_an_ensemble_of_copies_decides_as_the_critic_alone(critic):
    seeds = import_bench("twx_seeds")
    from harnessrl.serving.api import ScoreRequest

    request = ScoreRequest(agent_id="t", state=STATE, candidates=CANDIDATES)
    direct = critic.decide(request.state_value(), CANDIDATES)
    alone = seeds.EnsembleScorer([critic]).score(STATE, CANDIDATES)
    assert alone["scores"] == pytest.approx(direct.scores, abs=1e-5)
    assert alone["best_index"] == direct.best_index and alone["fallback"] == direct.fallback
    assert alone["ood"] == direct.ood
    for rank in ("mean", "lcb"):  # identical members: no spread, the same ranking
        twice = seeds.EnsembleScorer([critic, critic], rank).score(STATE, CANDIDATES)
        assert twice["scores"] == pytest.approx(alone["scores"], abs=1e-5) and twice["best_index"] == alone["best_index"]
    with pytest.raises(ValueError):
        seeds.EnsembleScorer([critic], "max")


def test_the_ensemble_passes_over_repeats_as_the_service_does(critic):
    """Every candidate but one was taken from the current observation: with avoid_repeats the one
    left is chosen whatever the scores, which do not change."""
    seeds = import_bench("twx_seeds")
    scorer = seeds.EnsembleScorer([critic])
    here = STATE["observation"]
    differs = 0
    for left in CANDIDATES:
        history = []
        for c in CANDIDATES:
            if c != left:  # taken while seeing `here`: the result of the turn before
                history += [{"action": "wait", "observation": here}, {"action": c, "observation": "Nothing happens."}]
        state = {**STATE, "history": [*history, {"action": "wait", "observation": here}]}
        plain = scorer.score(state, CANDIDATES)
        avoiding = scorer.score(state, CANDIDATES, avoid_repeats=True)
        assert CANDIDATES[avoiding["best_index"]] == left
        assert avoiding["scores"] == pytest.approx(plain["scores"], abs=1e-6)
        assert plain["best_index"] == max(range(len(CANDIDATES)), key=plain["scores"].__getitem__)
        differs += CANDIDATES[plain["best_index"]] != left
    if not differs:  # a critic may itself avoid every repeat: then the rule's effect is not visible here
        pytest.skip("the critic alone chose the one candidate not repeated in every case")


def test_offline_figures_of_identical_members_agree(critic, pipeline_run):
    seeds = import_bench("twx_seeds")
    rows = seeds.gold_rows(Path(pipeline_run["output_dir"]) / "heldout" / "transitions", 40)
    assert rows and all(r["expert"] in r["candidates"] for r in rows)
    off = seeds.offline([critic, critic], rows)
    assert off["steps"] == len(rows) and off["agreement"] == {"0-1": 1.0}
    assert off["member_top1"][0] == off["member_top1"][1] == off["mean_top1"]
    assert 0.0 <= off["mean_top1"] <= 1.0
