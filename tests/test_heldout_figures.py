"""The held-out figures of a pipeline run: the expert's action read at a configurable dotted
path, a plain statement (never `nan`) when the held-out data has no expert labels, and smoke
requests chosen whether or not the steps are labelled."""

from __future__ import annotations

import json
import math

import pytest

from harnessrl.cli import heldout_line, print_summary
from harnessrl.config import EvaluateConfig
from harnessrl.evaluation import expert_action, gold_rows, gold_top1, smoke_rows


def _step(ep: str, idx: int, info: dict, candidates: list[str] | None = ("look", "take coin", "go north")) -> dict:
    return {"episode_id": ep, "step_idx": idx, "state_text": f"Task: find the coin\nNow: room {idx}",
            "action_text": "look", "candidates": list(candidates) if candidates else None,
            "info": json.dumps(info), "features": None}


NESTED = [_step("e1", i, {"behaviour": {"expert_action": "take coin"}, "score": 0.1}) for i in range(6)]
FLAT = [_step("e2", i, {"expert_action": "go north"}) for i in range(4)]


def test_expert_action_at_a_dotted_path():
    row = NESTED[0]
    assert expert_action(row, "info.behaviour.expert_action") == "take coin"
    assert expert_action(row) is None  # the default, info.expert_action, is not there
    assert expert_action(FLAT[0]) == "go north"
    assert expert_action({**row, "gold": "look"}, "gold") == "look"  # a column of its own
    assert expert_action(row, "info.score") is None and expert_action(row, "info.behaviour.expert_action.x") is None
    assert expert_action({**row, "info": "{not json"}, "info.expert_action") is None


def test_gold_rows_read_the_configured_field():
    assert gold_rows(NESTED) == []
    rows = gold_rows(NESTED, expert_field="info.behaviour.expert_action")
    assert len(rows) == 6 and {r["expert"] for r in rows} == {"take coin"}
    assert len(gold_rows(NESTED + FLAT, limit=3, expert_field="info.behaviour.expert_action")) == 3
    assert [r["episode_id"] for r in gold_rows(NESTED + FLAT)] == ["e2"] * 4


@pytest.mark.parametrize("value", ["info.behaviour.expert_action", "gold", "info.a-b.c_d"])
def test_expert_field_config_accepts_dotted_paths(value):
    assert EvaluateConfig(expert_field=value).expert_field == value


@pytest.mark.parametrize("value", ["", "info.", ".x", "info..x", "info x"])
def test_expert_field_config_rejects_malformed_paths(value):
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        EvaluateConfig(expert_field=value)


def test_no_labels_means_no_figure_and_smoke_requests_still_go_out():
    assert gold_top1(critic=None, rows=[]) == {"steps": 0, "gold_top1": None, "random_top1": None}
    steps = NESTED + [_step("e3", 0, {}, candidates=None)]
    picked = smoke_rows(steps, gold_rows(steps), 3)
    assert len(picked) == 3 and all(r["expert"] is None and r["candidates"] for r in picked)
    (lone,) = [r for r in smoke_rows(steps, [], 10) if r["episode_id"] == "e3"]
    assert lone["candidates"] == ["look"]  # no candidates logged: the logged action alone
    labelled = gold_rows(steps, expert_field="info.behaviour.expert_action")
    assert smoke_rows(steps, labelled, 2) == labelled[::3][:2]
    assert smoke_rows(steps, [], 0) == [] and smoke_rows([], [], 5) == []


def _summary(evaluate: dict, served: list[dict]) -> dict:
    return {
        "pipeline": "p", "seconds": 1.0, "output_dir": "/tmp/out", "run_id": "r", "experiment": "e",
        "ingest": {"records_in": 1, "episodes": 1, "steps": 6, "records_quarantined": 0, "by_reason": {}},
        "transitions": {"recipe": "default", "recipe_digest": "sha256:x", "mean_return": 1.0, "success_rate": 0.5,
                        "transitions": 6, "episodes": 1},
        "encode": {"texts_total": 12, "texts_distinct": 8, "actors": 1, "seconds": 1.0,
                   "encoder": {"model_name": "m", "dim": 8}},
        "train": {"steps": 10, "seconds": 1.0, "metrics": {"loss_q": 0.1, "loss_v": 0.01, "q_mean": 0.2},
                  "fallback_threshold": 0.0},
        "model": {"name": "twx-critic", "version": "1", "alias": "champion", "uri": "models:/twx-critic@champion",
                  "run_id": "r", "experiment": "e"},
        "evaluate": evaluate, "served": served,
    }


def test_summary_says_plainly_that_there_are_no_labels(capsys, monkeypatch):
    from harnessrl import settings

    monkeypatch.setattr(settings, "tracking_uri", lambda: "sqlite:///x.db")
    ev = {"steps": 0, "gold_top1": None, "random_top1": None, "ms_per_step": None, "heldout_episodes": 12,
          "heldout_steps": 96, "expert_field": "info.expert_action"}
    served = [{"state_text": "Task: t\nNow: a kitchen", "candidates": ["look", "take coin"], "scores": [0.1, 0.7],
               "best_index": 1, "fallback": False, "expert": None}]
    print_summary(_summary(ev, served))
    out = capsys.readouterr().out
    assert "nan" not in out.lower()
    assert ("held-out     96 steps of 12 episodes, none with an expert action at info.expert_action among its "
            "candidates: gold-action ranking not measured") in out
    assert "served #0    'a kitchen' -> 'take coin' (score 0.70, 2 candidates, no gold label, fallback False)" in out


def test_a_run_stopped_after_encode_says_so_and_where_its_mlflow_run_is(capsys, monkeypatch):
    from harnessrl import settings

    monkeypatch.setattr(settings, "tracking_uri", lambda: "sqlite:///x.db")
    prepared = {k: v for k, v in _summary({}, []).items() if k not in ("train", "model", "evaluate", "served")}
    print_summary(prepared)
    out = capsys.readouterr().out
    assert "train        not run (--until encode)" in out and "registry" not in out
    assert "encode       12 texts, 8 distinct" in out and "mlflow       run r in experiment 'e'" in out


def test_summary_says_how_many_steps_the_threshold_stands_on_and_warns_when_few(capsys, monkeypatch):
    from harnessrl import diagnosis, settings

    monkeypatch.setattr(settings, "tracking_uri", lambda: "sqlite:///x.db")
    thin = diagnosis.fallback_sample(115, 0.1)
    summary = _summary({}, [])
    summary["train"] = {**summary["train"], "fallback_rows": 115,
                        "fallback_warning": f"{thin.evidence}; {thin.what_to_try}"}
    print_summary(summary)
    out = capsys.readouterr().out.splitlines()
    (train,) = [line for line in out if line.startswith("train ")]
    assert train.endswith("fallback threshold 0.000 (set on 115 steps of successful episodes)")
    warning = out.index(train) + 1  # right under the train line, before the registry's
    assert out[warning].startswith("warning      the fallback threshold is the 10% quantile of only 115")
    assert out[warning + 1].startswith("registry ")
    summary["train"] = {**summary["train"], "fallback_rows": 2000, "fallback_warning": None}
    print_summary(summary)
    assert "warning" not in capsys.readouterr().out


def test_summary_with_labels_gives_the_figure():
    ev = {"steps": 40, "gold_top1": 0.5, "random_top1": 0.25, "ms_per_step": 2.0, "heldout_episodes": 5,
          "heldout_steps": 40, "expert_field": "info.behaviour.expert_action"}
    assert heldout_line(ev) == ("held-out     40 test-seed steps: critic ranks the gold action first 0.500 vs random "
                                "0.250 (2.0x); 2.0 ms/step in-process")
    with_prior = {**ev, "gold_top1_prior": 0.625, "prior_weight": 1.0}
    assert heldout_line(with_prior) == ("held-out     40 test-seed steps: critic ranks the gold action first 0.500 "
                                        "(0.625 with its behaviour prior at w = 1, as served) vs random 0.250 (2.0x); "
                                        "2.0 ms/step in-process")


def test_evaluate_decides_held_out_steps_as_the_service_does():
    """`harnessrl evaluate`'s decision figures go through Critic.decide_scores on the served ranking:
    with a blend, the blend chooses and the fallback flag reads the chosen candidate's critic score;
    without one, the scores alone. A constructed case whose two rankings disagree on every figure."""
    from pathlib import Path

    from harnessrl.critic import Critic
    from harnessrl.jobs.evaluate import _decision_figures

    critic = Critic.load(Path(__file__).parent / "data" / "critic_v1")  # no encoder is loaded: scores are given
    t = critic.threshold
    scores = [[t + 1, t - 1], [t - 1, t + 1], [t - 2, t - 3], [t + 0.5, t + 2]]
    blended = [[0.0, 5.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]]  # chooses 1, 1, 0, 1
    dec = {"rows": [{"outcome_success": ok} for ok in (True, True, False, True)], "scores": scores,
           "blended": blended, "experts": [0, 1, None, 1]}
    served = _decision_figures(critic, dec, 2.0)
    assert served["prior_weight"] == 2.0 and served["expert_n_steps"] == 3
    assert served["expert_top1"] == 1.0 and served["expert_top1_prior"] == pytest.approx(2 / 3)
    assert served["fallback_rate"] == 0.5 and served["fallback_rate_success_decisions"] == pytest.approx(1 / 3)
    assert served["expert_miss_fallback"] == 1.0 and served["expert_miss_no_fallback"] == 0.0  # step 0 flagged
    assert served["expert_n_fallback"] == 1 and served["success_decisions"] == 3
    alone = _decision_figures(critic, {**dec, "blended": None}, 0.0)
    assert alone["prior_weight"] == 0.0 and "expert_top1_prior" not in alone
    assert alone["fallback_rate"] == 0.25 and alone["fallback_rate_success_decisions"] == 0.0
    assert alone["expert_miss_no_fallback"] == 0.0 and math.isnan(alone["expert_miss_fallback"])  # none flagged


def test_evaluate_says_when_the_threshold_stands_on_too_few_steps():
    """The evaluate report carries the train-time warning (from the card's count), next to what the
    held-out rows show; a card written before the count was kept says nothing of it."""
    from pathlib import Path

    from harnessrl.critic import Critic
    from harnessrl.jobs.evaluate import _flag_findings

    critic = Critic.load(Path(__file__).parent / "data" / "critic_v1")
    critic.card = critic.card.model_copy(update={"fallback_rows": 40})
    (f,) = _flag_findings(critic, {}, None)
    assert f.name == "fallback_sample" and "only 40 steps of successful episodes" in f.evidence
    critic.card = critic.card.model_copy(update={"fallback_rows": None})
    assert _flag_findings(critic, {}, None) == []
