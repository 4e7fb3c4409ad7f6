"""`harnessrl rewards explain`: per-step reward components of one ingested episode, read from the
episodes/steps Parquet (local, s3://, or a pipeline's output), as a table or JSON; and
`rewards show`. The command group is tested through `cli_rewards.register` on a parser of our
own; the `python -m harnessrl` test runs once `cli.py` wires the group in."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from harnessrl import cli_rewards, schemas
from harnessrl.errors import ConfigError, DataError
from harnessrl.formats import native
from harnessrl.rewards import load_recipe

DEFS = [{"name": "write_file"}, {"name": "run_tests"}]
RECORDS = [
    {"episode_id": "cg-1", "task": "Write fizzbuzz.", "tools": DEFS, "end_reason": "agent_stop",
     "outcome": {"success": True},
     "steps": [
         {"observation": "start", "info": {"tests_passed": 0, "syntax_ok": True, "style_ok": False},
          "tool_calls": [{"id": "c1", "name": "write_file", "arguments": {"path": "a.py", "content": "pass"}}]},
         {"observation": "written", "info": {"tests_passed": 2, "syntax_ok": True, "style_ok": True},
          "tool_calls": [{"id": "c2", "name": "run_tests", "arguments": {}, "is_error": True}]},
         {"observation": "2 passed", "action": "done"}]},
    {"episode_id": "tc-1", "task": "Find the file.", "tools": DEFS, "end_reason": "agent_stop",
     "outcome": {"success": False},
     "steps": [
         {"observation": "o0", "tool_calls": [{"id": "a", "name": "run_tests", "arguments": {}}]},
         {"observation": "o1", "tool_calls": [{"id": "b", "name": "shell", "arguments": {"cmd": "ls"}}],
          "reward": 0.5},
         {"observation": "o2", "tool_calls": [{"id": "c", "name": "run_tests", "arguments": {}}]}]},
    {"episode_id": "rm-1", "task": "Clean up.", "end_reason": "max_steps",
     "outcome": {"success": True},
     "steps": [{"observation": "o0", "action": "ls"},
               {"observation": "o1", "action": "rm -rf /"},
               {"observation": "o2", "action": "ls"},
               {"observation": "o3", "action": "echo done"}]},
]


def write_ingest(folder: Path, records=RECORDS) -> dict[str, str]:
    """An ingest folder as the ingest stage lays it out, built without Ray: the native reader's
    rows in the EPISODES/STEPS schemas, steps split over two files. Returns native id -> episode_id."""
    parsed = [native.parse_line(json.dumps(r).encode(), "mem.jsonl", i + 1) for i, r in enumerate(records)]
    (folder / "episodes").mkdir(parents=True)
    (folder / "steps").mkdir()
    pq.write_table(pa.Table.from_pylist([p.episode for p in parsed], schema=schemas.EPISODES),
                   folder / "episodes" / "part-0.parquet")
    steps = [s for p in parsed for s in p.steps]
    half = len(steps) // 2
    for k, chunk in enumerate((steps[:half], steps[half:])):
        pq.write_table(pa.Table.from_pylist(chunk, schema=schemas.STEPS), folder / "steps" / f"part-{k}.parquet")
    return {p.episode["native_id"]: p.episode["episode_id"] for p in parsed}


@pytest.fixture
def ingest_dir(tmp_path):
    ids = write_ingest(tmp_path / "ingest")
    return {"dir": str(tmp_path / "ingest"), "ids": ids}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="harnessrl")
    cli_rewards.register(p.add_subparsers(dest="command", required=True))
    return p


def run(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    return args.fn(args)


# ---- the explanation ----------------------------------------------------------------------------
def test_explain_by_native_id_and_episode_id_agree(ingest_dir):
    by_native = cli_rewards.explain(None, ingest_dir["dir"], "cg-1", "code-generation")
    by_id = cli_rewards.explain(None, ingest_dir["dir"], ingest_dir["ids"]["cg-1"], "code-generation")
    assert by_native == by_id
    assert by_native["episode_id"] == ingest_dir["ids"]["cg-1"] and by_native["native_id"] == "cg-1"


def test_explain_code_generation_numbers(ingest_dir):
    x = cli_rewards.explain(None, ingest_dir["dir"], "cg-1", "code-generation")
    assert x["recipe"] == {"name": "code-generation", "digest": load_recipe("code-generation").digest(),
                           "components": ["outcome", "step_cost", "tests_passed", "syntax_ok", "style_ok",
                                          "excess_length", "safety"]}
    assert [s["step_idx"] for s in x["steps"]] == [0, 1, 2]
    assert x["steps"][0]["components"] == {"step_cost": -0.01, "tests_passed": 0.0, "syntax_ok": 0.5,
                                           "style_ok": 0.0, "excess_length": 0.0, "safety": 0.0}
    assert x["steps"][1]["components"] == {"step_cost": -0.01, "tests_passed": 2.0, "syntax_ok": 0.5,
                                           "style_ok": 0.2, "excess_length": 0.0, "safety": 0.0}
    assert x["steps"][2]["components"] == {"outcome": 10.0, "step_cost": -0.01, "excess_length": 0.0, "safety": 0.0}
    assert [s["reward"] for s in x["steps"]] == pytest.approx([0.49, 2.69, 9.99])
    assert [s["return_to_go"] for s in x["steps"]] == pytest.approx([13.17, 12.68, 9.99])
    assert x["return"] == pytest.approx(13.17)
    assert [s["done"] for s in x["steps"]] == [False, False, True]
    assert x["steps"][1]["notes"] == ["tests_passed: 0 -> 2", "syntax_ok: True", "style_ok: True"]
    assert x["safety_stop"] is None and x["dropped_steps"] == []


def test_explain_tool_calling_numbers(ingest_dir):
    x = cli_rewards.explain(None, ingest_dir["dir"], "tc-1", "tool-calling")
    comps = [s["components"] for s in x["steps"]]
    assert comps[1] == {"source": 0.5, "step_cost": -0.1, "tool_error": 0.0, "invalid_tool": -1.0,
                        "repeated_action": 0.0, "safety": 0.0}
    assert comps[2]["repeated_action"] == -0.5 and comps[2]["outcome"] == -2.0
    assert [s["reward"] for s in x["steps"]] == pytest.approx([-0.1, -0.6, -2.6])
    assert x["steps"][1]["notes"] == ["source: logged reward 0.5", "invalid_tool: 'shell' not in tool_definitions"]
    assert x["steps"][2]["notes"] == ["repeated_action: same action as step 0", "outcome: failure"]


def test_explain_safety_stop_on_a_truncated_episode(ingest_dir):
    x = cli_rewards.explain(None, ingest_dir["dir"], "rm-1", "tool-calling")
    assert x["truncated"] is True and x["terminated"] is False
    assert [s["step_idx"] for s in x["steps"]] == [0, 1]
    assert x["steps"][1]["done"] is True and x["steps"][1]["truncated"] is False
    assert x["safety_stop"] == {"step_idx": 1, "pattern": load_recipe("tool-calling").safety.patterns[0]}
    assert x["dropped_steps"] == [2, 3]
    assert [s["return_to_go"] for s in x["steps"]] == pytest.approx([-5.2, -5.1])


def test_table_output(ingest_dir, capsys):
    assert run(["rewards", "explain", "--ingest", ingest_dir["dir"], "--episode", "rm-1",
                "--recipe", "tool-calling"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith(f"episode   {ingest_dir['ids']['rm-1']}  (log id rm-1")
    assert "truncated (bootstraps)" in lines[2]
    assert lines[3] == f"recipe    tool-calling {load_recipe('tool-calling').digest()}: outcome, source, step_cost, " \
                       "tool_error, invalid_tool, repeated_action, safety"
    header = lines[5].split()
    assert header == ["step", "action", "outcome", "source", "step_cost", "tool_error", "invalid_tool",
                      "repeated_action", "safety", "reward", "return_to_go", "end"]
    row1 = lines[7].split()
    assert row1[:2] == ["1", "rm"] and row1[-3:] == ["-5.1", "-5.1", "done"]
    assert lines[8].strip() == r"why: safety: matched '\brm\s+-(rf|fr)\b'; the episode ends here"
    assert "return    -5.2" in out
    assert "steps 2..3 (2) are dropped from learning" in out


def test_table_shortens_long_actions(tmp_path, capsys):
    long = {"episode_id": "long", "steps": [{"action": "x" * 300 + "\nsecond line"}], "end_reason": "agent_stop"}
    write_ingest(tmp_path / "ing", [long])
    assert run(["rewards", "explain", "--ingest", str(tmp_path / "ing"), "--episode", "long", "--width", "20"]) == 0
    row = capsys.readouterr().out.splitlines()[6]
    assert ("x" * 17 + "...") in row and "second" not in row


def test_non_finite_numbers_in_the_tables_never_make_a_nan_return(tmp_path, capsys):
    """Ingest quarantines NaN/Infinity rewards and scores; tables written some other way may still
    hold them: they count as absent, and the explanation shows no `nan`."""
    rec = {"episode_id": "nf-1", "end_reason": "agent_stop", "outcome": {"success": True, "score": 1.0},
           "steps": [{"action": "a", "reward": 1.0}, {"action": "b", "reward": 2.0}, {"action": "c"}]}
    parsed = native.parse_line(json.dumps(rec).encode(), "mem.jsonl", 1)
    parsed.steps[1]["reward"] = float("nan")
    parsed.episode["outcome_score"] = float("inf")
    (tmp_path / "i" / "episodes").mkdir(parents=True)
    (tmp_path / "i" / "steps").mkdir()
    pq.write_table(pa.Table.from_pylist([parsed.episode], schema=schemas.EPISODES), tmp_path / "i/episodes/p.parquet")
    pq.write_table(pa.Table.from_pylist(parsed.steps, schema=schemas.STEPS), tmp_path / "i/steps/p.parquet")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("outcome_score: 2.0\n")
    x = cli_rewards.explain(None, str(tmp_path / "i"), "nf-1", str(recipe))
    assert x["return"] == pytest.approx(10.0 + 1.0 - 0.3) and "source" not in x["steps"][1]["components"]
    assert "outcome_score" not in x["steps"][-1]["components"]
    assert run(["rewards", "explain", "--ingest", str(tmp_path / "i"), "--episode", "nf-1", "--recipe", str(recipe)]) == 0
    assert "nan" not in capsys.readouterr().out.lower()


def test_json_output(ingest_dir, capsys):
    assert run(["rewards", "explain", "--ingest", ingest_dir["dir"], "--episode", "tc-1", "--json"]) == 0
    x = json.loads(capsys.readouterr().out)
    assert x["recipe"]["name"] == "default"  # no --recipe, no pipeline: the default recipe
    assert [s["components"] for s in x["steps"]][-1] == {"outcome": -2.0, "step_cost": -0.1}
    assert x["ingest_dir"] == ingest_dir["dir"]


def test_show(capsys):
    assert run(["rewards", "show", "code-generation"]) == 0
    x = json.loads(capsys.readouterr().out)
    assert x["digest"] == load_recipe("code-generation").digest() and x["recipe"]["safety"]["weight"] == 5.0


# ---- errors -------------------------------------------------------------------------------------
def test_unknown_episode_is_data_error(ingest_dir):
    with pytest.raises(DataError, match=r"episode 'nope' not found .*3 episodes.*'cg-1'") as exc:
        cli_rewards.explain(None, ingest_dir["dir"], "nope")
    assert exc.value.exit_code == 3


def test_ambiguous_native_id_is_data_error(tmp_path):
    folder = tmp_path / "ing"
    ids = write_ingest(folder, RECORDS[:1])
    table = pq.read_table(folder / "episodes" / "part-0.parquet").to_pylist()
    twin = {**table[0], "episode_id": "other-format-id", "source_format": "openai-chat"}
    pq.write_table(pa.Table.from_pylist([twin], schema=schemas.EPISODES), folder / "episodes" / "part-1.parquet")
    with pytest.raises(DataError, match="log id of 2 episodes"):
        cli_rewards.explain(None, str(folder), "cg-1")
    assert cli_rewards.explain(None, str(folder), ids["cg-1"])["episode_id"] == ids["cg-1"]  # the id is exact


def test_missing_ingest_folder_is_data_error(tmp_path):
    with pytest.raises(DataError, match="no ingested episodes"):
        cli_rewards.explain(None, str(tmp_path / "absent"), "x")


@pytest.mark.parametrize("pipeline, ingest", [(None, None), ("p.yaml", "dir")])
def test_pipeline_xor_ingest(pipeline, ingest):
    with pytest.raises(ConfigError, match="either a pipeline YAML or --ingest"):
        cli_rewards.resolve(pipeline, ingest, None)


def test_set_needs_a_pipeline(ingest_dir):
    with pytest.raises(ConfigError, match="--set"):
        cli_rewards.resolve(None, ingest_dir["dir"], None, ["rewards=x"])


def test_unknown_recipe_is_config_error(ingest_dir):
    with pytest.raises(ConfigError, match="no-such"):
        cli_rewards.explain(None, ingest_dir["dir"], "cg-1", "no-such")


# ---- from a pipeline YAML ------------------------------------------------------------------------
def test_pipeline_yaml_gives_folder_and_recipe(tmp_path):
    out = tmp_path / "run"
    write_ingest(out / "ingest")
    pipe = tmp_path / "p.yaml"
    pipe.write_text(yaml.safe_dump({"name": "p", "output_dir": str(out), "data": {"train": ["x.jsonl"]},
                                    "rewards": "tool-calling"}))
    x = cli_rewards.explain(str(pipe), None, "tc-1")
    assert x["recipe"]["name"] == "tool-calling" and x["ingest_dir"] == str(out / "ingest")
    assert cli_rewards.explain(str(pipe), None, "tc-1", "default")["recipe"]["name"] == "default"
    assert cli_rewards.explain(str(pipe), None, "tc-1", None, ["rewards=code-generation"])["recipe"]["name"] == \
        "code-generation"


def test_pipeline_yaml_default_output_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESSRL_HOME", str(tmp_path / "home"))
    write_ingest(tmp_path / "home" / "runs" / "myrun" / "ingest")
    pipe = tmp_path / "p.yaml"
    pipe.write_text(yaml.safe_dump({"name": "myrun", "data": {"train": ["x.jsonl"]}}))
    assert cli_rewards.explain(str(pipe), None, "cg-1")["steps"][-1]["components"]["outcome"] == 10.0


# ---- as a process ---------------------------------------------------------------------------------
MINI_MAIN = """
import argparse, sys
from harnessrl import cli_rewards
from harnessrl.errors import HarnessError
p = argparse.ArgumentParser(prog="harnessrl")
cli_rewards.register(p.add_subparsers(dest="command", required=True))
args = p.parse_args(sys.argv[1:])
try:
    sys.exit(args.fn(args))
except HarnessError as exc:
    print(f"harnessrl: error: {exc}", file=sys.stderr)
    sys.exit(exc.exit_code)
"""


def test_process_exit_codes(ingest_dir):
    ok = subprocess.run([sys.executable, "-c", MINI_MAIN, "rewards", "explain", "--ingest", ingest_dir["dir"],
                         "--episode", "cg-1", "--json"], check=False, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["native_id"] == "cg-1"
    bad = subprocess.run([sys.executable, "-c", MINI_MAIN, "rewards", "explain", "--ingest", ingest_dir["dir"],
                          "--episode", "nope"], check=False, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 3 and bad.stdout == ""
    assert bad.stderr.startswith("harnessrl: error: episode 'nope' not found") and "Traceback" not in bad.stderr


def test_python_m_harnessrl_rewards_explain(ingest_dir):
    base = [sys.executable, "-m", "harnessrl", "rewards", "explain", "--ingest", ingest_dir["dir"]]
    ok = subprocess.run(base + ["--episode", "tc-1", "--recipe", "tool-calling"], check=False,
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "invalid_tool" in ok.stdout and "why: repeated_action: same action as step 0" in ok.stdout
    bad = subprocess.run(base + ["--episode", "nope"], check=False, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 3 and "episode 'nope' not found" in bad.stderr


# ---- s3:// ------------------------------------------------------------------------------------------
def test_explain_reads_s3(tmp_path, s3):
    write_ingest(tmp_path / "ing")
    for f in (tmp_path / "ing").rglob("*.parquet"):
        s3["client"].upload_file(str(f), s3["bucket"], f"explain/ingest/{f.relative_to(tmp_path / 'ing')}")
    uri = f"s3://{s3['bucket']}/explain/ingest"
    x = cli_rewards.explain(None, uri, "tc-1", "tool-calling")
    assert [s["reward"] for s in x["steps"]] == pytest.approx([-0.1, -0.6, -2.6])
    with pytest.raises(DataError, match="not found"):
        cli_rewards.explain(None, uri, "nope")
    with pytest.raises(DataError, match="no ingested episodes"):
        cli_rewards.explain(None, f"s3://{s3['bucket']}/nothing-here", "tc-1")


# ---- agrees with what the pipeline trains on ----------------------------------------------------------
def test_explain_matches_the_transitions_stage(ray_local, tmp_path):
    """The real ingest and transitions stages (Ray Data) on the same logs: the transitions table
    holds exactly the rewards, done flags and return-to-go that `explain` prints."""
    from harnessrl.config import RenderConfig
    from harnessrl.pipelines import transitions as stage
    from harnessrl.pipelines.ingest import ingest

    logs = tmp_path / "logs.jsonl"
    logs.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    ingest([str(logs)], str(tmp_path / "ingest"), "native")
    recipe = load_recipe("tool-calling")
    stage.build_transitions(str(tmp_path / "ingest"), str(tmp_path / "tr"), recipe, RenderConfig())
    rows = pq.read_table(tmp_path / "tr").to_pylist()
    assert "tool_definitions" in stage.EPISODE_FIELDS  # else the pipeline could not compute invalid_tool
    for native_id in ("cg-1", "rm-1", "tc-1"):
        x = cli_rewards.explain(None, str(tmp_path / "ingest"), native_id, "tool-calling")
        want = [dict(s["components"]) for s in x["steps"]]
        mine = sorted((r for r in rows if r["episode_id"] == x["episode_id"]), key=lambda r: r["step_idx"])
        assert [r["step_idx"] for r in mine] == [s["step_idx"] for s in x["steps"]]
        assert [dict(r["reward_components"]) for r in mine] == want
        assert [r["reward"] for r in mine] == pytest.approx([sum(c.values()) for c in want])
        assert [r["done"] for r in mine] == [s["done"] for s in x["steps"]]
        assert [r["return_to_go"] for r in mine] == pytest.approx([s["return_to_go"] for s in x["steps"]])
