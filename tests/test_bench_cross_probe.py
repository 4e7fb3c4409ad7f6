"""bench/cross_probe.py at a tiny configuration on a hand-made corpus: the split keeps whole task
groups apart, the figures add up, and both scorers run with the real MiniLM."""

from __future__ import annotations

import json
import subprocess
import sys
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


def test_close_calls_are_choices_among_one_verb(probe):
    def step(candidates, gold):
        return {"candidates": candidates, "gold": candidates.index(gold)}

    assert probe.close_call(step(["move east", "Move west", "take coin"], "move east"))
    assert not probe.close_call(step(["move east", "move west", "take coin"], "take coin"))
    assert probe.accuracy([step(["move east", "move west"], "move east") | {"family": "coin"},
                           step(["take coin", "look"], "look") | {"family": "coin"}], [1.0, 0.0]) == {
        "all": 0.5, "close": 1.0, "families": {"coin": {"accuracy": 0.5, "steps": 2, "close": 1.0, "close_steps": 1}}}


def test_close_calls_need_none_of_the_platform_dependencies():
    """On a GPU machine with torch and sentence-transformers only: the probe imports, and names
    verbs by the platform's own rule (harnessrl.tool_naming), with pydantic, Ray and MLflow absent."""
    code = """
import sys
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"pydantic", "ray", "mlflow"}:
            raise ImportError(f"{name} is not installed here")
sys.meta_path.insert(0, Absent())
sys.path.insert(0, "bench")
import cross_probe
from harnessrl.tool_naming import tool_name
print(cross_probe.close_call({"candidates": ["  Put 3kg in box", "put(5kg)", "look"], "gold": 0}),
      tool_name("  Put 3kg in box", "first_word"), sorted(m for m in sys.modules if m.startswith("harnessrl")))
"""
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    # "put(5kg)" is the verb "put" too: the first word stops at "(", as the transitions stage names it
    assert out.stdout.split()[:2] == ["True", "put"]
    assert "harnessrl.tool_naming" in out.stdout and "harnessrl.features" not in out.stdout


def test_tiny_run_end_to_end(probe, tmp_path):
    out = probe.main(["--transitions", str(_corpus(tmp_path / "t")), "--mlp-steps", "3", "--cross-steps", "2",
                      "--layers", "1", "--max-len", "32", "--candidates", "3", "--json", str(tmp_path / "o.json")])
    assert json.loads((tmp_path / "o.json").read_text())["test_steps"] == out["test_steps"] == 6  # 2 of 8 groups
    assert out["random"]["all"] == pytest.approx(1 / 3, abs=1e-3)
    assert out["random"]["close"] == pytest.approx(1 / 3, abs=1e-3)
    for name in ("random", "frozen+mlp", "cross"):
        fams = out[name]["families"]
        assert sum(f["steps"] for f in fams.values()) == out["test_steps"]
        assert sum(f["close_steps"] for f in fams.values()) <= out["test_steps"]
        assert 0.0 <= out[name]["all"] <= 1.0 and all(0.0 <= f["accuracy"] <= 1.0 for f in fams.values())


def test_pack_carries_the_steps_and_a_float16_encoder(probe, tmp_path):
    """--pack writes what a GPU machine needs; the probe runs from it (bfloat16, stopped by time)."""
    from safetensors import safe_open

    packed = probe.main(["--transitions", str(_corpus(tmp_path / "t")), "--pack", str(tmp_path / "p")])
    assert pq.read_table(tmp_path / "p" / "steps.parquet").column_names == probe.STEP_COLUMNS
    with safe_open(str(tmp_path / "p" / "encoder" / "model.safetensors"), "pt") as f:
        assert {str(f.get_tensor(k).dtype) for k in f.keys()} == {"torch.float16"}
    assert packed["mib"] < 64  # the device's carry limit
    out = probe.main(["--transitions", str(tmp_path / "p" / "steps.parquet"), "--encoder", str(tmp_path / "p" / "encoder"),
                      "--families", "sorting", "--mlp-steps", "2", "--passes", "50", "--max-seconds", "0",
                      "--layers", "1", "--max-len", "32", "--candidates", "3", "--precision", "bfloat16"])
    assert set(out["random"]["families"]) == {"sorting"}
    assert out["cross"]["steps"] == 1 and out["cross"]["passes"] == pytest.approx(4 / out["train_steps"], abs=0.01)


def test_pack_from_logs_renders_as_the_benchmark(probe, tmp_path, ray_local, sample_slice):
    """--logs: ingest and transitions with the issue-5 rendering, one row per logged step, no encode."""
    probe.main(["--logs", str(sample_slice["train"]), "--pack", str(tmp_path / "p")])
    table = pq.read_table(tmp_path / "p" / "steps.parquet")
    logged = sum(len(json.loads(line)["steps"]) for line in sample_slice["train"].read_text().splitlines())
    assert table.num_rows == logged
    states = table.column("state_text").to_pylist()
    assert all(s.startswith("Now: ") for s in states if s)  # render.observation_first
    assert any("\nPinned > " in s for s in states) and any("\nDone: " in s for s in states)
    assert not (tmp_path / "p" / "transitions").exists()  # only what travels


def test_logs_without_pack_is_a_usage_error(probe, tmp_path):
    with pytest.raises(SystemExit) as e:
        probe.main(["--logs", str(tmp_path / "x.jsonl")])
    assert e.value.code == 2
