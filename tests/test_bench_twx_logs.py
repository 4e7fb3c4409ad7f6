"""bench/twx.py `--logs`: the critic and BC learn from another log file, and its seeds stay out of
the tiers. No Ray, no training: the log reading, the pipeline overrides and the seed exclusion."""

from __future__ import annotations

import gzip
import json

from conftest import import_bench


def _records(lines: list[bytes]) -> list[dict]:
    return [json.loads(line) for line in lines]


def test_log_lines_reads_gzip_and_plain_files_and_defaults_to_the_bundled_logs(tmp_path):
    twx = import_bench("twx")
    bundled = twx.log_lines(None)
    assert _records(bundled) == twx.read_records("twx_train")
    (tmp_path / "logs.jsonl.gz").write_bytes(gzip.compress(b"".join(bundled[:7]) + b"\n\n"))
    (tmp_path / "logs.jsonl").write_bytes(b"".join(bundled[7:10]))
    assert twx.log_lines(str(tmp_path / "logs.jsonl.gz")) == bundled[:7]  # blank lines dropped
    assert _records(twx.log_lines(str(tmp_path / "logs.jsonl"))) == _records(bundled[7:10])


def test_overrides_train_the_critic_on_the_given_logs(tmp_path):
    twx = import_bench("twx")
    bundled = twx.log_lines(None)
    logs = tmp_path / "more.jsonl"
    logs.write_bytes(b"".join(bundled[20:60]))
    args = twx.parse_args(["--logs", str(logs), "--set", "train.steps=7"])
    overrides = twx.pipeline_overrides(args, tmp_path)
    assert f"data.train=[{logs.resolve()}]" in overrides
    assert overrides[-1] == "train.steps=7"  # the user's --set comes last, so it wins
    # reduced: the first --reduced-episodes episodes of the given logs, not of the bundled ones
    reduced = twx.pipeline_overrides(twx.parse_args(["--reduced", "--reduced-episodes", "5", "--logs", str(logs)]),
                                     tmp_path)
    subset = tmp_path / "twx_train_subset.jsonl"
    assert f"data.train=[{subset}]" in reduced
    assert _records(twx.log_lines(str(subset))) == _records(bundled[20:25])
    # without --logs the quickstart's own data.train (the bundled logs) stays
    assert not any(o.startswith("data.train=") for o in twx.pipeline_overrides(twx.parse_args([]), tmp_path))


def test_seeds_of_the_given_logs_stay_out_of_the_tiers(tmp_path):
    """A seed the extra logs used is never drawn for a tier; the bundled logs' seeds neither."""
    twx = import_bench("twx")
    from harnessrl.examples.twx_expert import _Engine

    engine = _Engine()
    try:
        before = twx.pick_seeds(engine, ["arithmetic"], ["id"], 2, twx.used_seeds(twx.known_records(None)))
        first, second = before[("id", "arithmetic")]
        episode = json.loads(twx.log_lines(None)[0])
        episode["metadata"].update(family="arithmetic", fold="train", seed=first)
        logs = tmp_path / "extra.jsonl"
        logs.write_text(json.dumps(episode) + "\n")
        used = twx.used_seeds(twx.known_records(str(logs)))
        assert ("arithmetic", "train", first) in used
        assert twx.used_seeds(twx.known_records(None)) <= used
        after = twx.pick_seeds(engine, ["arithmetic"], ["id"], 2, used)[("id", "arithmetic")]
        assert first not in after and second in after
    finally:
        engine.close()
