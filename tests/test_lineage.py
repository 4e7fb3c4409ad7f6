"""`harnessrl lineage`: the chain from raw logs to the registered model, verified against the data
as it is now; tampering with any dataset is caught."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from conftest import MODEL
from harnessrl import lineage
from harnessrl.cli import main

pytestmark = pytest.mark.integration
NAMES = ["raw", "episodes", "steps", "transitions", "encoded", "vectors"]  # vectors: the distinct-text table


def test_lineage_prints_the_chain_and_verifies_it(pipeline_run, capsys):
    assert main(["lineage", f"{MODEL}@champion", "--verify"]) == 0
    out = capsys.readouterr().out
    assert f"model        {MODEL} version {pipeline_run['model']['version']} (aliases: champion)" in out
    assert pipeline_run["model"]["run_id"] in out
    for name in NAMES:
        line = next(x for x in out.splitlines() if x.strip().startswith(name + " "))
        assert pipeline_run["digests"][name][:23] in line and line.endswith("[ok]"), line
    assert "verified: every digest matches" in out

    assert main(["lineage", f"{MODEL}@champion", "--json"]) == 0
    chain = json.loads(capsys.readouterr().out)
    assert [d["name"] for d in chain["datasets"]] == NAMES
    assert {d["name"]: d["recorded"] for d in chain["datasets"]} == pipeline_run["digests"]
    assert chain["encoder"]["model_name"] == "builtin:all-MiniLM-L6-v2"
    assert chain["train_config"]["steps"] == 300 and chain["reward_recipe_hash"].startswith("sha256:")


def test_verify_catches_a_tampered_dataset(pipeline_run, tmp_path):
    chain = lineage.chain(f"models:/{MODEL}@champion")
    original = next(d for d in chain.datasets if d.name == "transitions")
    copy = tmp_path / "transitions"
    shutil.copytree(original.location, copy)
    chain.datasets = [dataclasses.replace(d, location=str(copy)) if d.name == "transitions" else d
                      for d in chain.datasets]
    assert lineage.verify(chain).verified  # an identical copy verifies

    part = sorted(copy.rglob("*.parquet"))[0]
    table = pq.read_table(part)
    rewards = table.column("reward")
    table = table.set_column(table.schema.get_field_index("reward"), "reward", pc.add(rewards, 0.001))
    pq.write_table(table, part)  # one reward nudged in one file
    lineage.verify(chain)
    status = {d.name: d.status for d in chain.datasets}
    assert status == {**{n: "ok" for n in NAMES}, "transitions": "MISMATCH"}
    assert not chain.verified and "NOT verified: transitions MISMATCH" in lineage.render(chain)

    shutil.rmtree(copy)
    lineage.verify(chain)
    assert next(d for d in chain.datasets if d.name == "transitions").status == "MISSING"


def test_verify_catches_a_changed_vector_in_the_distinct_text_table(pipeline_run, tmp_path):
    """The rows reference the table, so the table is part of the chain: one vector changed is a mismatch."""
    import pyarrow as pa

    chain = lineage.chain(f"models:/{MODEL}@champion")
    original = next(d for d in chain.datasets if d.name == "vectors")
    copy = tmp_path / "_texts"
    shutil.copytree(original.location, copy)
    chain.datasets = [dataclasses.replace(d, location=str(copy)) if d.name == "vectors" else d
                      for d in chain.datasets]
    assert lineage.verify(chain).verified
    part = sorted(copy.glob("*.parquet"))[0]
    table = pq.read_table(part)
    emb = table.column("emb").combine_chunks()
    flat = emb.flatten().to_numpy(zero_copy_only=False).copy()
    flat[0] += 1e-3
    table = table.set_column(table.schema.get_field_index("emb"), "emb",
                             pa.FixedSizeListArray.from_arrays(pa.array(flat), type=emb.type))
    pq.write_table(table, part)
    lineage.verify(chain)
    assert {d.name: d.status for d in chain.datasets}["vectors"] == "MISMATCH"


def test_lineage_cli_exits_6_on_mismatch_and_4_for_an_unknown_model(pipeline_run, tmp_path, capsys):
    from harnessrl import registry

    client = registry.client()
    version = client.get_model_version_by_alias(MODEL, "champion").version
    real = client.get_model_version(MODEL, version).tags["digest.steps"]
    try:
        client.set_model_version_tag(MODEL, version, "digest.steps", "sha256:" + "0" * 64)
        assert main(["lineage", f"{MODEL}/{version}", "--verify"]) == 6
        assert "NOT verified: steps MISMATCH" in capsys.readouterr().out
    finally:
        client.set_model_version_tag(MODEL, version, "digest.steps", real)
    assert main(["lineage", "no-such-model@champion"]) == 4
    assert "not found in the registry" in capsys.readouterr().err
