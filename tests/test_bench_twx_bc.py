"""bench/twx_bc.py's reader rows: the expert's label that `bc-expert` learns from (bench/twx.py); bc's policy as
the behaviour prior of `critic+bc`."""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import import_bench


def _row(episode: str, action: str, candidates: list[str], info: dict | None) -> dict:
    return {"episode_id": episode, "state_segments": [{"role": "observation", "age": 0, "text": f"obs of {episode}"}],
            "action_text": action, "candidates": candidates, "info": json.dumps(info) if info is not None else None}


def test_expert_examples_label_the_expert_action_and_keep_it_past_the_cut(tmp_path):
    twx_bc = import_bench("twx_bc")
    cands = ["go west", "go east", "take key", "open door", "look"]
    rows = [
        _row("a", "go west", cands, {"expert_action": "take key"}),  # among the first candidates
        _row("b", "go west", cands, {"expert_action": "look"}),  # past the cut of 2 untaken: appended
        _row("c", "go west", cands, {"expert_action": "go west"}),  # the taken action itself
        _row("d", "go west", cands, {"behaviour": "expert"}),  # no label
        _row("e", "go west", cands, {"expert_action": "eat key"}),  # not a candidate: no label
        _row("f", "go west", cands, None),
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "part-0.parquet")
    loaded = twx_bc.load_segment_rows(str(tmp_path), max_candidates=2)
    by_id = {r["episode_id"]: r for r in loaded}
    # the other BC scorers' rows are unchanged: the taken action first, the cut kept, gold 0
    assert all(r["candidates"] == ["go west", "go east", "take key"] and r["gold"] == 0 for r in loaded)
    assert by_id["a"]["segments"] == [("observation", 0, "obs of a")]
    assert [by_id[e]["expert_action"] for e in "abcdef"] == ["take key", "look", "go west", None, None, None]
    examples = {r["episode_id"]: r for r in twx_bc.expert_examples(loaded)}
    assert sorted(examples) == ["a", "b", "c"]
    assert examples["a"]["candidates"][examples["a"]["gold"]] == "take key"
    assert examples["b"]["candidates"] == ["go west", "go east", "take key", "look"] and examples["b"]["gold"] == 3
    assert examples["c"]["gold"] == 0


def test_bc_expert_asks_for_the_reader_heads_inputs():
    twx = import_bench("twx")
    assert "bc-expert" in twx.ALL_SCORERS and "bc-expert" not in twx.DEFAULT_SCORERS  # opt-in: needs labelled logs
    with pytest.raises(SystemExit, match="reader head"):
        twx.build_bc(["bc", "bc-expert"], "/nonexistent/encoded", {}, 1, None, head="frozen")


def test_a_critic_scorer_names_the_bc_scorer_it_takes_as_its_prior():
    twx = import_bench("twx")
    assert [twx.prior_bc(s) for s in ("critic+bc", "critic+bc-success+norepeat", "critic+bc-careful")] == \
        ["bc", "bc-success", "bc-careful"]
    assert twx.prior_bc("critic") is twx.prior_bc("critic+prior") is twx.prior_bc("bc-success") is None
    assert {"critic+bc-success", "critic+bc-careful"} <= set(twx.ALL_SCORERS) - set(twx.DEFAULT_SCORERS)


def test_behaviour_priors_are_the_log_softmax_of_the_logits():
    """critic+bc sends bc's log-probabilities: they normalise, keep bc's order, ignore a shift of the logits and
    never pass 0 (the service refuses a positive logprob)."""
    twx = import_bench("twx")
    texts = ["take coin", "move south", "open fridge"]
    priors = twx.behaviour_priors(texts, [2.0, -1.0, 0.5])
    assert [p["text"] for p in priors] == texts
    lp = [p["logprob"] for p in priors]
    assert sum(math.exp(x) for x in lp) == pytest.approx(1.0)
    assert lp[0] > lp[2] > lp[1] and all(x <= 0 for x in lp)
    assert lp[0] - lp[1] == pytest.approx(3.0)
    shifted = [p["logprob"] for p in twx.behaviour_priors(texts, [1002.0, 999.0, 1000.5])]  # no overflow
    assert shifted == pytest.approx(lp)
    assert [p["logprob"] for p in twx.behaviour_priors(["only"], [-7.0])] == [0.0]
