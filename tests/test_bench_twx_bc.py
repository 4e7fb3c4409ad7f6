"""bench/twx_bc.py's reader rows: the expert's label that `bc-expert` learns from (bench/twx.py)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

from conftest import import_bench


def _row(episode: str, action: str, candidates: list[str], info: dict | None) -> dict:
    return {"episode_id": episode, "state_segments": [{"role": "observation", "age": 0, "text": f"obs of {episode}"}],
            "action_text": action, "candidates": candidates, "info": json.dumps(info) if info is not None else None}


def test_segment_rows_point_at_the_expert_action_and_keep_it_past_the_cut(tmp_path):
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
    out = {r["episode_id"]: r for r in twx_bc.load_segment_rows(str(tmp_path), max_candidates=2)}
    assert out["a"]["candidates"][out["a"]["expert"]] == "take key"
    assert out["b"]["candidates"] == ["go west", "go east", "take key", "look"] and out["b"]["expert"] == 3
    assert out["c"]["expert"] == 0
    assert out["d"]["expert"] is None and out["e"]["expert"] is None and out["f"]["expert"] is None
    # the taken action stays first, as the other BC scorers learn it
    assert all(r["candidates"][0] == "go west" and r["gold"] == 0 for r in out.values())
    assert out["a"]["segments"] == [("observation", 0, "obs of a")]
