"""bench/twx_ablation.py: every variant is a valid pipeline configuration that changes exactly its
ingredient from the base, and shares the base's pipeline folder unless it renders or encodes
differently. (Its table is checked on a real bench run in test_bench_twx.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import import_bench

ROOT = Path(__file__).resolve().parents[1]


def _config(ablation, name: str, tmp_path: Path, *extra: str):
    from harnessrl.config import load_pipeline

    twx = ablation.twx
    args = ablation.parse_args(["--work-dir", str(tmp_path), "--seeds-per-family", "2", *extra])
    bench_args = twx.parse_args(ablation.run_args(args, name, tmp_path))
    return bench_args, load_pipeline(ROOT / "pipelines" / "quickstart.yaml", twx.pipeline_overrides(bench_args, tmp_path))


def test_each_variant_changes_its_ingredient_only(tmp_path):
    ablation = import_bench("twx_ablation")
    base_args, base = _config(ablation, "base", tmp_path)
    assert base.render.list_actions and base.render.observation_first and base.encoder.max_seq_length == 256
    assert base.train.steps == 1000 and base.train.features and base.train.alpha == 0.3 and base.train.head == "frozen"
    assert "bc-careful" in base_args.scorers.split(",") and base_args.seeds_per_family == 2
    changed = {
        "rendering": lambda c: (c.render.pin, c.render.list_actions, c.encoder.max_seq_length) == ([], False, 128),
        "features": lambda c: c.train.features is False,
        "alpha": lambda c: c.train.alpha == 0,
        "expectile": lambda c: c.train.expectile == 0.9,
        "steps": lambda c: c.train.steps == 2000,
        "cross": lambda c: c.train.head == "cross" and c.train.cross.layers == 3,
    }
    assert set(changed) == set(ablation.VARIANTS)
    for name, check in changed.items():
        args, cfg = _config(ablation, name, tmp_path)
        assert check(cfg) and not check(base), name
        assert args.scorers == "critic,critic+norepeat" and args.protocol == "all-actions"  # no rerank per critic
        assert args.model_name == f"twx-ablation-{name}"
        same = base.model_dump(include={"data", "rewards"}) == cfg.model_dump(include={"data", "rewards"})
        assert same, name
        if name != "rendering":
            assert cfg.render == base.render and cfg.encoder == base.encoder, name


def test_only_variants_that_render_or_encode_differently_get_their_own_pipeline(tmp_path):
    ablation = import_bench("twx_ablation")
    dirs = {name: ablation.twx.parse_args(ablation.run_args(
        ablation.parse_args(["--work-dir", str(tmp_path)]), name, tmp_path)).work_dir
        for name in ["base", *ablation.VARIANTS]}
    assert dirs["rendering"] == str(tmp_path / "rendering")
    assert {d for n, d in dirs.items() if n != "rendering"} == {str(tmp_path / "shared")}


def test_user_overrides_and_logs_reach_every_run(tmp_path):
    ablation = import_bench("twx_ablation")
    logs = tmp_path / "logs.jsonl"
    logs.write_bytes(b"".join(ablation.twx.log_lines(None)[:30]))
    args, cfg = _config(ablation, "alpha", tmp_path, "--set", "train.alpha=0.5", "--logs", str(logs))
    assert cfg.train.alpha == 0.5  # the user's --set comes after the variant's
    assert cfg.data.train == [str(logs.resolve())]


def test_unknown_variant_is_a_usage_error(tmp_path):
    ablation = import_bench("twx_ablation")
    with pytest.raises(SystemExit) as exc:
        ablation.parse_args(["--work-dir", str(tmp_path), "--variants", "alpha,nope"])
    assert exc.value.code == 2
