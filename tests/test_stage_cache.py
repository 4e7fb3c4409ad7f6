"""Stages skip when their output exists for the same input and configuration, say so, and rerun
on any change or with --force."""

from __future__ import annotations

import numpy as np
import pytest

from harnessrl.config import parse_pipeline
from harnessrl.jobs.pipeline import run_pipeline
from harnessrl.encoded_data import read_meta, text_index
from harnessrl.jobs.stage_cache import run_stage, stage_key

pytestmark = pytest.mark.integration


def _texts(out) -> tuple[np.ndarray, np.ndarray]:
    """The run's distinct-text table: sorted keys and their vectors."""
    meta = read_meta(str(out / "encoded"))
    return text_index(str(out / "encoded" / "_texts"), meta.get("dtype", "float32"), int(meta["encoder"]["dim"]))


def _mtimes(folder):
    return {p: p.stat().st_mtime_ns for p in sorted(folder.rglob("*.parquet"))}


def test_rerun_skips_unchanged_stages_and_reruns_changed_ones(ray_local, sample_slice, tmp_path):
    out = tmp_path / "run"
    raw = {
        "name": "stage-cache", "output_dir": str(out),
        "data": {"train": [str(sample_slice["train"])], "heldout": [str(sample_slice["test"])]},
        "evaluate": {"max_heldout_steps": 50},
        "render": {"window": 3, "max_chars": 1500, "tool_from": "first_word"},
        "encoder": {"batch_size": 32, "max_seq_length": 128},
        "train": {"steps": 10, "batch_size": 32, "checkpoint_every": 10, "log_every": 10, "num_workers": 1,
                  "reader": {"prior_steps": 20}},
        "registry": {"experiment": "stage-cache", "model_name": "stage-cache-critic"},
        "serve": {"enabled": False},
    }
    first = run_pipeline(parse_pipeline(raw), until="train")  # trained and registered, not evaluated
    assert first["skipped"] == [] and first["model"]["version"] and "evaluate" not in first
    before = {stage: _mtimes(out / stage) for stage in ("ingest", "transitions", "encoded")}

    second = run_pipeline(parse_pipeline(raw))
    assert second["skipped"] == ["ingest", "transitions", "encode"]
    assert {stage: _mtimes(out / stage) for stage in before} == before  # nothing rewritten
    assert second["encode"] == first["encode"] and second["digests"] == first["digests"]
    assert second["model"]["version"] == str(int(first["model"]["version"]) + 1)  # training always runs
    assert second["evaluate"]["heldout_steps"] > 0  # and without `until`, the held-out evaluation

    raw["render"]["window"] = 2  # a render change: ingest reused, transitions and encode rerun
    third = run_pipeline(parse_pipeline(raw), until="encode")  # the data prepared, no training
    assert third["skipped"] == ["ingest"] and "train" not in third and "model" not in third
    assert third["digests"]["steps"] == first["digests"]["steps"]
    assert third["digests"]["transitions"] != first["digests"]["transitions"]
    texts_before = _texts(out)

    forced = run_pipeline(parse_pipeline(raw), force=True, until="encode")
    assert forced["skipped"] == []
    # same input and config: the same content, up to the embeddings' last bits (which texts share
    # an encoder batch varies between runs, and so does float rounding): the datasets holding
    # embeddings are compared by their texts exactly and their vectors numerically
    floats = ("encoded", "vectors")
    assert {k: v for k, v in forced["digests"].items() if k not in floats} == \
        {k: v for k, v in third["digests"].items() if k not in floats}
    assert forced["encode"]["rows"] == third["encode"]["rows"]
    texts_after = _texts(out)
    assert np.array_equal(texts_after[0], texts_before[0]) and len(texts_after[0]) > 0
    np.testing.assert_allclose(texts_after[1], texts_before[1], atol=1e-4)


def test_an_interrupted_stage_leaves_no_marker(tmp_path):
    from dataclasses import dataclass

    @dataclass
    class Result:
        n: int

    key = stage_key("demo", "input-digest", {"a": 1})
    skipped: list[str] = []
    assert run_stage(str(tmp_path), "demo", key, False, Result, lambda: Result(1), skipped) == Result(1)
    assert run_stage(str(tmp_path), "demo", key, False, Result, lambda: Result(2), skipped) == Result(1)
    assert skipped == ["demo"]

    def crash() -> Result:
        raise RuntimeError("killed mid-stage")

    with pytest.raises(RuntimeError):
        run_stage(str(tmp_path), "demo", key, True, Result, crash, skipped)
    # the old marker went before the stage started: the half-written output is not reused
    assert run_stage(str(tmp_path), "demo", key, False, Result, lambda: Result(3), skipped) == Result(3)
    assert stage_key("demo", "input-digest", {"a": 2}) != key
