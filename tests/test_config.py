"""Pipeline configuration: the shipped quickstart loads, `--set` overrides apply, and every bad
input is a ConfigError that says where."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from harnessrl.config import PipelineConfig, apply_overrides, load_pipeline
from harnessrl.errors import ConfigError

QUICKSTART = Path(__file__).resolve().parents[1] / "pipelines" / "quickstart.yaml"


def test_quickstart_loads():
    raw = yaml.safe_load(QUICKSTART.read_text())
    cfg = load_pipeline(QUICKSTART)
    assert isinstance(cfg, PipelineConfig)
    assert cfg.name == "quickstart"
    assert cfg.data.train == ["builtin:twx-train"] and cfg.data.heldout == ["builtin:twx-test"]
    # every value written in the file arrives in the typed config
    for section in ("render", "encoder", "train", "registry", "evaluate", "serve"):
        got = getattr(cfg, section).model_dump()
        assert {k: got[k] for k in raw[section]} == raw[section], section
    assert "lr" not in raw["train"] and cfg.train.lr == 3e-4  # a default, not in the file


def test_set_scalar_override():
    assert load_pipeline(QUICKSTART, ["train.steps=7"]).train.steps == 7


def test_set_list_override():
    assert load_pipeline(QUICKSTART, ["data.train=[a, b]"]).data.train == ["a", "b"]


def test_set_bool_and_float_overrides():
    cfg = load_pipeline(QUICKSTART, ["serve.enabled=false", "train.gamma=0.5"])
    assert cfg.serve.enabled is False and cfg.train.gamma == 0.5


def test_set_creates_nested_section(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("data:\n  train: [x]\n")
    cfg = load_pipeline(path, ["evaluate.max_heldout_steps=9", "train.seed=3"])
    assert cfg.evaluate.max_heldout_steps == 9 and cfg.train.seed == 3
    assert cfg.train.steps == "auto"


def test_later_override_wins():
    assert load_pipeline(QUICKSTART, ["train.steps=7", "train.steps=11"]).train.steps == 11


def test_apply_overrides_builds_new_nested_dict():
    assert apply_overrides({}, ["a.b.c=1", "a.b.d=[x]"]) == {"a": {"b": {"c": 1, "d": ["x"]}}}


def test_set_value_with_equals_sign_kept():
    assert apply_overrides({}, ["name=a=b"]) == {"name": "a=b"}


@pytest.mark.parametrize(
    "override, where",
    [("train.stepz=7", "train.stepz"), ("bogus=1", "bogus"), ("serve.tls.cert=x", "serve.tls")],
)
def test_unknown_key_names_the_path(override, where):
    with pytest.raises(ConfigError, match=rf"{where}\b"):
        load_pipeline(QUICKSTART, [override])


@pytest.mark.parametrize(
    "override, where",
    [("train.steps=many", "train.steps"), ("train.steps=0", "train.steps"),
     ("data.train=notalist", "data.train"), ("encoder.dtype=int8", "encoder.dtype")],
)
def test_wrong_type_or_range_is_config_error(override, where):
    with pytest.raises(ConfigError, match=rf"{where}:"):
        load_pipeline(QUICKSTART, [override])


def test_set_into_a_scalar_is_config_error():
    with pytest.raises(ConfigError, match="not a section"):
        load_pipeline(QUICKSTART, ["name.sub=1"])


def test_missing_file_is_config_error(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_pipeline(tmp_path / "nope.yaml")


def test_set_without_equals_is_config_error():
    with pytest.raises(ConfigError, match="key=value"):
        load_pipeline(QUICKSTART, ["train.steps"])


def test_set_empty_key_segment_is_config_error():
    with pytest.raises(ConfigError, match="empty key"):
        load_pipeline(QUICKSTART, ["train..steps=3"])


def test_invalid_yaml_is_config_error(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("data: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_pipeline(path)


def test_top_level_list_is_config_error(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_pipeline(path)


def test_missing_required_data_is_config_error(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("name: x\n")
    with pytest.raises(ConfigError, match="data"):
        load_pipeline(path)


@pytest.mark.parametrize("key,value", [("registry.alias", "a0.3"), ("registry.alias", "has space"),
                                       ("registry.model_name", "bad/name")])
def test_registry_names_are_validated_before_any_work(key, value):
    with pytest.raises(ConfigError, match=key):
        load_pipeline(QUICKSTART, [f"{key}={value}"])


def test_auto_steps_follow_the_rows_within_bounds():
    from harnessrl.config import AUTO_STEPS, TrainConfig
    from harnessrl.jobs.train import resolve_steps

    auto = TrainConfig(epochs=10)
    assert resolve_steps(auto, 64_000, 64) == 10_000  # 10 passes over 1,000 batches
    assert resolve_steps(auto, 100, 64) == AUTO_STEPS[0] and resolve_steps(auto, 10**9, 64) == AUTO_STEPS[1]
    assert resolve_steps(TrainConfig(steps=7), 10**9, 64) == 7
    assert TrainConfig(steps="12").steps == 12


def test_the_run_folder_is_output_dir_else_under_harnessrl_home(tmp_path, monkeypatch):
    from harnessrl.config import parse_pipeline

    monkeypatch.setenv("HARNESSRL_HOME", str(tmp_path))
    raw = {"name": "run-a", "data": {"train": ["x.jsonl"]}}
    assert parse_pipeline(raw).run_dir() == str(tmp_path / "runs" / "run-a")
    assert parse_pipeline({**raw, "output_dir": "s3://b/p"}).run_dir() == "s3://b/p"
