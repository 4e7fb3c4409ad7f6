"""The ingest stage on real Ray over every log format: auto-detection per file, a pretty-printed
ATIF document as one record, unknown files quarantined, outcomes joined from a file, the CLI's
JSON summary and exit codes, and a round trip through an S3 endpoint on loopback."""

from __future__ import annotations

import gzip
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.dataset as pads
import pytest

from harnessrl import storage
from harnessrl.formats.native import Reason

pytestmark = pytest.mark.integration
SAMPLES = Path(__file__).parent / "data" / "formats"
NATIVE_IDS = {"chat-0001", "resp-conv-0001"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("formats")
    for f in SAMPLES.iterdir():
        shutil.copy(f, d / f.name)
    lines = (SAMPLES / "openai_chat.jsonl").read_bytes().splitlines()
    (d / "more_chat.jsonl").write_bytes(b"\n".join([lines[0].replace(b"chat-0001", b"chat-0002"), b"{broken"]) + b"\n")
    (d / "other.jsonl").write_bytes(b'{"hello": "world"}\n{"hello": "again"}\n')
    return d


def _table(out: str, name: str):
    fs, path = storage.filesystem(storage.join(out, name))
    return pads.dataset(path, filesystem=fs, format="parquet").to_table()


def test_auto_detects_each_file_and_accounts_for_every_record(ray_local, corpus, tmp_path):
    from harnessrl.pipelines.ingest import ingest

    r = ingest([str(corpus)], str(tmp_path / "out"), "auto")
    assert r.formats == {"anthropic": 1, "atif": 1, "openai-chat": 2, "openai-responses": 1, "unknown": 1}
    # 1 record per sample file (ATIF: the whole pretty-printed document), 2 in more_chat, 2 in other
    assert r.records_in == 8 and r.records_ok == 5 and r.records_in == r.records_ok + r.records_quarantined
    assert r.by_reason == {Reason.INVALID_JSON: 1, Reason.UNKNOWN_FORMAT: 2}
    episodes = _table(r.out_dir, "episodes").to_pylist()
    assert {e["source_format"] for e in episodes} == {"anthropic", "atif", "openai-chat", "openai-responses"}
    assert r.steps == _table(r.out_dir, "steps").num_rows > 5 * 2
    q = _table(r.out_dir, "quarantine").to_pylist()
    assert sorted((Path(x["source_uri"]).name, x["source_line"], x["reason"]) for x in q) == [
        ("more_chat.jsonl", 2, Reason.INVALID_JSON), ("other.jsonl", 1, Reason.UNKNOWN_FORMAT),
        ("other.jsonl", 2, Reason.UNKNOWN_FORMAT)]


def test_outcomes_file_is_joined_by_native_id(ray_local, corpus, tmp_path):
    from harnessrl.pipelines.ingest import ingest

    outcomes = tmp_path / "outcomes.jsonl"
    outcomes.write_text('{"episode_id": "chat-0001", "success": false, "score": 0.25}\n'
                        '{"episode_id": "nobody", "success": true}\n')
    r = ingest([str(corpus / "openai_chat.jsonl")], str(tmp_path / "out"), "openai-chat", str(outcomes))
    assert r.outcomes_joined == 1
    (ep,) = _table(r.out_dir, "episodes").to_pylist()
    assert ep["outcome_success"] is False and ep["outcome_score"] == 0.25 and ep["evaluable"]
    assert json.loads(ep["metadata"])["outcome_source"] == "outcomes_file"


def _cli(*args: str):
    return subprocess.run([sys.executable, "-m", "harnessrl", "ingest", *args], capture_output=True, text=True,
                          env=os.environ.copy(), timeout=600)


def test_cli_summary_and_exit_codes(ray_local, corpus, tmp_path):
    import ray

    address = ["--address", ray.get_runtime_context().gcs_address]
    out = _cli(str(corpus), "--out", str(tmp_path / "a"), *address)
    assert out.returncode == 0, out.stderr[-2000:]
    last = out.stdout.rstrip("\n").splitlines()[-1]  # the summary is the last line, whole
    body = json.loads(last)
    assert body["records_in"] == 8 and body["quarantined"] == 3 and body["episodes"] == 5
    assert body["by_reason"] == {"invalid_json": 1, "unknown_format": 2}
    pretty = _cli(str(corpus), "--out", str(tmp_path / "p"), "--pretty", *address)
    assert pretty.returncode == 0 and pretty.stdout.count("\n") > 10
    assert json.loads(pretty.stdout[pretty.stdout.index("{\n"):]) == {**body, "out": str(tmp_path / "p")}

    strict = _cli(str(corpus), "--out", str(tmp_path / "b"), "--fail-on-quarantine", *address)
    assert strict.returncode == 5 and "3 record(s) quarantined" in strict.stderr and "Traceback" not in strict.stderr

    missing = _cli(str(tmp_path / "nothing-here"), "--out", str(tmp_path / "c"), *address)
    assert missing.returncode == 3 and "Traceback" not in missing.stderr


def test_s3_round_trip(ray_local, corpus, s3, tmp_path):
    from harnessrl.pipelines.ingest import ingest

    for f in corpus.iterdir():
        s3["client"].upload_file(str(f), s3["bucket"], f"logs/{f.name}")
    remote = ingest([f"s3://{s3['bucket']}/logs/"], f"s3://{s3['bucket']}/ingested", "auto")
    local = ingest([str(corpus)], str(tmp_path / "local"), "auto")
    assert remote.raw_digest == local.raw_digest
    assert (remote.records_in, remote.records_ok, remote.steps, remote.by_reason) == \
        (local.records_in, local.records_ok, local.steps, local.by_reason)
    keys = [o["Key"] for o in s3["client"].list_objects_v2(Bucket=s3["bucket"], Prefix="ingested/episodes/")["Contents"]]
    files = [k for k in keys if not k.endswith("/")]  # pyarrow also writes a directory marker
    assert files and all(k.endswith(".parquet") for k in files)
    by_id = {e["episode_id"]: e["native_id"] for e in _table(remote.out_dir, "episodes").to_pylist()}
    assert NATIVE_IDS <= set(by_id.values())
    assert by_id == {e["episode_id"]: e["native_id"] for e in _table(local.out_dir, "episodes").to_pylist()}


def _careless_corpus(d: Path) -> dict[str, int]:
    """What a careless user points ingest at; returns the records each file holds."""
    native_ok = [{"episode_id": f"n{i}", "steps": [{"action": "go", "reward": 1.0}], "outcome": {"success": True}}
                 for i in range(3)]
    nan_reward = {"episode_id": "nan-r", "steps": [{"action": "go", "reward": float("nan")}]}
    inf_score = {"episode_id": "inf-s", "steps": [{"action": "go"}], "outcome": {"success": True, "score": 1e999}}
    (d / "good.jsonl").write_text("".join(json.dumps(r) + "\n" for r in native_ok + [nan_reward, inf_score]))
    chat = [{"messages": [{"role": "user", "content": f"Task {i}"}, {"role": "assistant", "content": "Done."}]}
            for i in range(2)]
    legacy = {"messages": [{"role": "user", "content": "Weather?"},
                           {"role": "assistant", "function_call": {"name": "weather", "arguments": "{}"}},
                           {"role": "function", "name": "weather", "content": "sunny"},
                           {"role": "assistant", "content": "Sunny."}]}
    (d / "export.ndjson").write_text("".join(json.dumps(r) + "\n" for r in chat + [legacy]))
    claude = {"system": "Be brief.", "messages": [{"role": "user", "content": "Hi"},
                                                   {"role": "assistant", "content": [{"type": "text", "text": "Hi."}]}]}
    (d / "claude.log").write_text(json.dumps(claude) + "\n")
    (d / "empty.jsonl").write_bytes(b"")
    packed = gzip.compress("".join(json.dumps({"episode_id": f"z{i}", "steps": [{"action": "x" * 40}]}) + "\n"
                                   for i in range(4000)).encode())
    (d / "cut.jsonl.gz").write_bytes(packed[: len(packed) // 2])
    (d / "long.jsonl").write_text(json.dumps({"episode_id": "big", "steps": [{"action": "y" * 10_000}]}) + "\n"
                                  + json.dumps({"episode_id": "small", "steps": [{"action": "go"}]}) + "\n")
    return {"good.jsonl": 5, "export.ndjson": 3, "claude.log": 1, "long.jsonl": 2}


def test_a_careless_corpus_loses_nothing_and_stores_nothing_wrong(ray_local, tmp_path):
    from harnessrl.pipelines.ingest import ingest

    (tmp_path / "logs").mkdir()
    counts = _careless_corpus(tmp_path / "logs")
    r = ingest([str(tmp_path / "logs")], str(tmp_path / "out"), "auto", max_line_bytes=4096)
    assert r.files == 6 and r.formats == {"anthropic": 1, "empty": 1, "native": 3, "openai-chat": 1}
    assert r.records_in == r.records_ok + r.records_quarantined
    cut_records = r.records_in - sum(counts.values())
    assert 1000 < cut_records < 4000  # what decompressed before the cut, then one corrupt_file row
    assert r.by_reason == {Reason.NON_FINITE_NUMBER: 2, Reason.LINE_TOO_LONG: 1, Reason.CORRUPT_FILE: 1}
    rows = _table(r.out_dir, "quarantine").to_pylist()
    q = {(Path(x["source_uri"]).name, x["reason"], x["source_line"]): x for x in rows}
    assert set(q) == {("long.jsonl", Reason.LINE_TOO_LONG, 1), ("cut.jsonl.gz", Reason.CORRUPT_FILE, cut_records),
                      ("good.jsonl", Reason.NON_FINITE_NUMBER, 4), ("good.jsonl", Reason.NON_FINITE_NUMBER, 5)}
    assert q[("long.jsonl", Reason.LINE_TOO_LONG, 1)]["raw_prefix"].startswith('{"episode_id": "big"')
    assert [q[("good.jsonl", Reason.NON_FINITE_NUMBER, n)]["detail"].split(" is ")[0] for n in (4, 5)] == \
        ["steps[0].reward", "outcome.score"]
    episodes = _table(r.out_dir, "episodes").to_pylist()
    derived = [e for e in episodes if e["source_format"] in ("openai-chat", "anthropic")]
    assert len(derived) == 4 and all(json.loads(e["metadata"])["ingest_flags"] == {"derived_episode_id": 1}
                                     for e in derived)
    steps = _table(r.out_dir, "steps").to_pylist()
    legacy = [s for s in steps if s["tool_calls"] and s["tool_calls"][0]["name"] == "weather"]
    assert len(legacy) == 1 and legacy[0]["result_text"] == "sunny"
    assert all(s["reward"] is None or math.isfinite(s["reward"]) for s in steps)

    # the derived ids are stable: the same files under other names give the same episodes
    (tmp_path / "again").mkdir()
    for f in (tmp_path / "logs").iterdir():
        shutil.copy(f, tmp_path / "again" / f"copy-{f.name}")
    again = ingest([str(tmp_path / "again")], str(tmp_path / "out2"), "auto", max_line_bytes=4096)
    assert again.raw_digest == r.raw_digest
    assert sorted(e["episode_id"] for e in _table(again.out_dir, "episodes").to_pylist()) == \
        sorted(e["episode_id"] for e in episodes)
