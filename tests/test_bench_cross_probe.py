"""bench/cross_probe.py at a tiny configuration on a hand-made corpus: the split keeps whole task
groups apart, the figures add up, and both scorers run with the real MiniLM."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import import_bench

@pytest.fixture(scope="module")
def probe():
    return import_bench("cross_probe")


def _corpus(path: Path) -> Path:
    rows = []
    for family, verbs in (("coin", ["take coin", "move east", "move west"]),
                          ("sorting", ["put 3kg in box", "put 5kg in box", "look"])):
        for g in range(4):
            for step in range(3):
                gold = verbs[(g + step) % 3]
                rows.append({"task_id": f"{family}/train/{g}", "state_text": f"{family} room {g}, step {step}",
                             "candidates": verbs, "info": json.dumps({"expert_action": gold})})
    rows.append({"task_id": "coin/train/9", "state_text": "no expert here", "candidates": ["look", "wait"],
                 "info": json.dumps({"behaviour": "random"})})  # dropped: no expert action
    path.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), path / "part-0.parquet")
    return path


def test_split_holds_out_whole_groups(probe, tmp_path):
    steps = probe.load_steps(str(_corpus(tmp_path / "t")))
    assert len(steps) == 24 and all(s["candidates"][s["gold"]] for s in steps)
    train, test = probe.split(steps, 0.25, 100, seed=0)
    assert len(train) + len(test) == 24
    assert not {s["group"] for s in train} & {s["group"] for s in test}


def test_tiny_run_end_to_end(probe, tmp_path):
    out = probe.main(["--transitions", str(_corpus(tmp_path / "t")), "--mlp-steps", "3", "--cross-steps", "2",
                      "--layers", "1", "--max-len", "32", "--candidates", "3", "--json", str(tmp_path / "o.json")])
    assert json.loads((tmp_path / "o.json").read_text())["test_steps"] == out["test_steps"] == 6  # 2 of 8 groups
    assert out["random"]["all"] == pytest.approx(1 / 3, abs=1e-3)
    for name in ("random", "frozen+mlp", "cross"):
        fams = out[name]["families"]
        assert sum(f["steps"] for f in fams.values()) == out["test_steps"]
        assert 0.0 <= out[name]["all"] <= 1.0 and all(0.0 <= f["accuracy"] <= 1.0 for f in fams.values())
