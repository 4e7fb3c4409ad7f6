"""bench/twx.py's rerank protocol (issue 22), the parts that need no game: the agent's per-step
distribution (`harnessrl.examples.twx.behaviour_step`) and the proposals drawn from it, against
the closed form and by a chi-square goodness of fit on a constructed step; the pick rules; the
command line. The last test checks against the real service (the session's it-critic) that a
critic scorer takes the service's own ranking. The reduced rerank run is checked in
test_bench_twx.py."""

from __future__ import annotations

import math
import random

import pytest

from conftest import MODEL, free_port, import_bench

# A constructed step: the expert takes the coin; two other "take" actions are its plausible mistakes.
CANDIDATES = ["take red apple", "take blue pen", "take coin", "move north", "move south", "open fridge", "inventory"]
EXPERT = "take coin"
# chi-square critical values at p = 0.001 by degrees of freedom (scipy is no dependency)
CHI2_999 = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515, 6: 22.458}


def _kinds():
    from harnessrl.examples.twx import AGENT_KINDS

    return [(name, pe, pm) for name, _share, pe, pm in AGENT_KINDS]


def closed_form(pe: float, pm: float, expert: str | None, cands: list[str]) -> dict[str, float]:
    """The issue's P(a), written out independently of the code under test."""
    if expert is None:
        return {a: 1 / len(cands) for a in cands}
    verb = expert.split()[0]
    same = [a for a in cands if a != expert and a.split()[0] == verb]
    mistake = same or [a for a in cands if a != expert] or [expert]
    return {a: pe * (a == expert) + pm * (a in mistake) / len(mistake) + (1 - pe - pm) / len(cands) for a in cands}


def chi_square(counts: dict[str, int], probs: dict[str, float]) -> float:
    n = sum(counts.values())
    return sum((counts.get(a, 0) - n * p) ** 2 / (n * p) for a, p in probs.items())


@pytest.mark.parametrize("name,pe,pm", _kinds())
def test_the_agents_distribution_is_the_closed_form_and_sums_to_one(name, pe, pm):
    from harnessrl.examples.twx import behaviour_step

    probs = behaviour_step(pe, pm, EXPERT, CANDIDATES).probabilities()
    assert set(probs) == set(CANDIDATES)
    assert sum(probs.values()) == pytest.approx(1.0, abs=1e-12)
    assert probs == pytest.approx(closed_form(pe, pm, EXPERT, CANDIDATES), abs=1e-12)
    if pm > 0:  # the mistaken agent: each "take" alternative carries half the mistake mass
        assert probs["take red apple"] == pytest.approx(pm / 2 + (1 - pe - pm) / 7)


@pytest.mark.parametrize("name,pe,pm", _kinds())
def test_proposals_follow_the_agents_distribution_chi_square(name, pe, pm):
    """20,000 draws of K = 4 (seeded): every draw is the agent's, so the draws' histogram fits P
    (chi-square, p = 0.001 critical value); the same statistic rejects a uniform agent."""
    from harnessrl.examples.twx import behaviour_step

    rerank = import_bench("twx_rerank")
    step = behaviour_step(pe, pm, EXPERT, CANDIDATES)
    probs = step.probabilities()
    counts: dict[str, int] = dict.fromkeys(CANDIDATES, 0)
    for i in range(5000):
        seed = f"chi2:{name}:{i}"
        proposals = rerank.propose(step, 4, random.Random(seed))
        probe = random.Random(seed)
        draws = [step.sample(probe)[0] for _ in range(4)]
        # the proposals are those draws, distinct, in first-drawn order, each with its exact logprob
        assert [a for a, _ in proposals] == list(dict.fromkeys(draws))
        assert all(lp == min(0.0, math.log(probs[a])) for a, lp in proposals)
        for a in draws:
            counts[a] += 1
    df = len(CANDIDATES) - 1
    assert chi_square(counts, probs) < CHI2_999[df]
    assert chi_square(counts, {a: 1 / len(CANDIDATES) for a in CANDIDATES}) > CHI2_999[df]


def test_edge_cases_no_expert_no_same_verb_alternative_single_candidate():
    from harnessrl.examples.twx import behaviour_step

    rerank = import_bench("twx_rerank")
    pe, pm = 0.35, 0.55
    # no expert known: uniform over the candidates, every draw a "random" one
    step = behaviour_step(pe, pm, None, CANDIDATES)
    assert step.probabilities() == pytest.approx({a: 1 / 7 for a in CANDIDATES})
    assert {step.sample(random.Random(i))[1] for i in range(50)} == {"random"}
    # no other action with the expert's verb: the mistake is any other candidate
    probs = behaviour_step(pe, pm, "inventory", CANDIDATES).probabilities()
    assert probs == pytest.approx(closed_form(pe, pm, "inventory", CANDIDATES))
    assert probs["inventory"] == pytest.approx(pe + 0.1 / 7) and probs["move north"] == pytest.approx(pm / 6 + 0.1 / 7)
    # a single candidate: it is the expert, the mistake and the random action; logprob exactly 0
    only = behaviour_step(pe, pm, "look around", ["look around"])
    assert only.probabilities() == pytest.approx({"look around": 1.0})
    assert rerank.propose(only, 8, random.Random(0)) == [("look around", 0.0)]
    with pytest.raises(ValueError, match="at least one candidate"):
        behaviour_step(pe, pm, None, [])


def test_the_all_actions_behaviour_agents_draw_as_before():
    """bench/twx.py's behaviour_choice goes through behaviour_step now: the same RNG draws as the
    code it replaced (written out here), so the all-actions tiers play the same games."""
    twx = import_bench("twx")

    def before(kind, expert, candidates, rng):
        pe, pm = kind
        u = rng.random()
        if expert is None:
            return rng.choice(candidates)
        if u < pe:
            return expert
        if u < pe + pm:
            same = [c for c in candidates if c != expert and c.split(" ", 1)[0] == expert.split(" ", 1)[0]]
            if same:
                return rng.choice(same)
            others = [c for c in candidates if c != expert]
            return rng.choice(others) if others else expert
        return rng.choice(candidates)

    steps = [(EXPERT, CANDIDATES), (None, CANDIDATES), ("inventory", CANDIDATES), ("take coin", ["take coin"]),
             ("move north", ["move north", "move south"])]
    for kind in twx.AGENT_PROBS.values():
        old, new = random.Random(7), random.Random(7)
        for i in range(3000):
            expert, cands = steps[i % len(steps)]
            assert twx.behaviour_choice(kind, expert, cands, new) == before(kind, expert, cands, old)
        assert old.random() == new.random()  # and the streams stay in step


def test_pick_rules_without_a_service():
    rerank = import_bench("twx_rerank")
    proposals = [("move north", -2.0), ("take coin", -0.5), ("take pen", -0.5), ("look", -3.0)]
    assert rerank.pick("agent", proposals, "take coin", {}, {}) == (0, None)
    assert rerank.pick("agent+self", proposals, None, {}, {}) == (1, None)  # a tie: the first drawn
    assert rerank.pick("agent+oracle", proposals, "take pen", {}, {}) == (2, None)
    assert rerank.pick("agent+oracle", proposals, "open box", {}, {}) == (0, None)  # not proposed: first
    assert rerank.pick("agent+oracle", proposals, None, {}, {}) == (0, None)
    with pytest.raises(ValueError, match="unknown rerank scorer"):
        rerank.pick("agent+magic", proposals, None, {}, {})
    assert rerank.choose_weight({0.1: 3, 0.3: 5, 1.0: 5, 3.0: 2}) == 0.3  # most successes, the smaller of a tie


def test_decision_stats_read_the_final_pick_of_each_step():
    rerank = import_bench("twx_rerank")
    first = {"proposals": ["a", "b"], "logprobs": [-1, -1], "chosen": 0, "expert": "b", "scores": [1, 0],
             "blended": None, "fallback": True}
    again = {**first, "proposals": ["c", "b"], "chosen": 1, "fallback": False}
    ep = {"scorer": "agent+critic+again", "steps": 3, "asked_again": 1,
          "log": [{**first, "again": again}, first, {**first, "expert": None}]}
    stats = rerank.decision_stats([ep])
    assert stats["expert_proposed"] == 1.0  # both steps with a known expert had it proposed
    assert stats["expert_picked"] == 0.5  # taken after asking again, passed over on the second step
    assert stats["instead"] == [["b", "a", 1]] and stats["asked_again_rate"] == pytest.approx(1 / 3)
    assert rerank.decision_stats([{**ep, "scorer": "agent+critic"}])["asked_again_rate"] is None


def test_command_line_of_the_rerank_protocol():
    twx = import_bench("twx")
    args = twx.parse_args([])
    assert args.protocol == "all-actions,rerank"
    cfg = twx.rerank_config(args, ["id", "ood"], 5)
    from harnessrl.examples.twx import FAMILIES

    assert cfg["families"] == list(FAMILIES) and cfg["k"] == [4] and cfg["agents"] == ["mistaken"]
    assert cfg["scorers"] == list(twx.rerank.SCORERS) and cfg["prior_weight"] is None
    reduced = twx.rerank_config(twx.parse_args(["--reduced"]), ["id", "ood"], 2)
    assert reduced["families"] == list(twx.REDUCED_FAMILIES) and reduced["scorers"] == list(twx.rerank.REDUCED_SCORERS)
    given = twx.rerank_config(twx.parse_args(["--k", "2,4,8", "--agents", "careful,flailing", "--families", "coin",
                                              "--prior-weight", "0.5"]), ["id"], 3)
    assert given["k"] == [2, 4, 8] and given["agents"] == ["careful", "flailing"] and given["families"] == ["coin"]
    assert given["prior_weight"] == 0.5
    for bad in (["--agents", "reckless"], ["--k", "0"], ["--k", "four"], ["--protocol", "best-of"],
                ["--rerank-scorers", "agent,agent+magic"], ["--prior-weights", "-1"], ["--prior-weight", "inf"],
                ["--protocol", ""]):
        with pytest.raises(SystemExit) as exc:
            twx.parse_args(bad)
        assert exc.value.code == 2, bad


def test_a_missing_model_is_one_line_and_its_exit_code_before_ray_starts(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "bench" / "twx.py"
    env = {**os.environ, "HARNESSRL_HOME": str(tmp_path / "home"), "RAY_ADDRESS": "127.0.0.1:1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    # RAY_ADDRESS points nowhere: reaching init_ray would fail differently (a ClusterError, exit 8)
    done = subprocess.run([sys.executable, str(script), "--protocol", "rerank", "--model", "models:/nosuch@champion",
                           "--work-dir", str(tmp_path / "w")], env=env, capture_output=True, text=True)
    assert done.returncode == 4, done.stderr
    assert "twx: error: models:/nosuch@champion: not found in the registry" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.integration
def test_a_critic_scorer_takes_the_services_blended_ranking(pipeline_run):
    """Against the real service: a large per-request prior_weight makes the service's best_index
    (the argmax of blended_scores) differ from the argmax of the critic's scores, and the rerank
    scorer takes the candidate at that best_index; with weight 0 (agent+critic) the scores rank."""
    from harnessrl.serving import app as serving

    twx = import_bench("twx")
    state = {"task": "Find the coin.", "history": [{"action": "move north", "observation": "A kitchen."}],
             "observation": "A kitchen. You see a coin and a fridge."}
    texts = ["take coin", "move south", "open fridge", "inventory"]
    url = serving.start(f"models:/{MODEL}@champion", "127.0.0.1", free_port())
    client = twx.CriticClient(url)
    try:
        plain = client.score(state, texts)
        favourite = max(range(len(texts)), key=plain["scores"].__getitem__)
        # the agent all but rules out the critic's favourite
        proposals = [(t, -60.0 if i == favourite else -0.1 * (i + 1)) for i, t in enumerate(texts)]
        chosen, body = twx.rerank.pick("agent+critic+prior", proposals, None, state, {"critic": client},
                                       prior_weight=10.0)
        assert body["prior_weight"] == 10.0 and body["blended_scores"] is not None
        best = body["best_index"]
        assert best == max(range(len(texts)), key=body["blended_scores"].__getitem__)
        assert best != max(range(len(texts)), key=body["scores"].__getitem__) == favourite
        assert chosen == best and proposals[chosen][0] == texts[best]
        chosen, body = twx.rerank.pick("agent+critic", proposals, None, state, {"critic": client}, prior_weight=10.0)
        assert body["blended_scores"] is None and body["prior_weight"] == 0.0 and chosen == favourite
    finally:
        client.close()
        serving.stop()
