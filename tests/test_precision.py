"""One precision vocabulary (harnessrl.precision): float32, float16, bfloat16 everywhere, the old
spellings (train.precision: bf16 / fp32) still load and are normalised, and the rules that
follow from a precision (the identity's, float16 weights, bfloat16 autocast in training)."""

from __future__ import annotations

import pytest

from harnessrl.config import EncoderConfig, ServeEncoderConfig, TrainConfig, load_pipeline, load_serve
from harnessrl.encoders import encoder_identity
from harnessrl.errors import ConfigError
from harnessrl.precision import COMPUTE, half_weights, identity_precision, normalise


@pytest.mark.parametrize("given, name", [("bf16", "bfloat16"), ("BF16", "bfloat16"), ("fp32", "float32"),
                                         ("fp16", "float16"), (" float32 ", "float32"), ("auto", "auto"),
                                         ("int8", "int8"), (None, None), (16, 16)])
def test_normalise(given, name):
    assert normalise(given) == name


@pytest.mark.parametrize("written, train, encoder", [("bf16", "bfloat16", "bfloat16"), ("fp32", "float32", "float32"),
                                                     ("bfloat16", "bfloat16", "bfloat16"),
                                                     ("float32", "float32", "float32")])
def test_users_yaml_loads_with_either_spelling(tmp_path, written, train, encoder):
    path = tmp_path / "p.yaml"
    path.write_text(f"data: {{train: [x.jsonl]}}\ntrain: {{precision: {written}}}\nencoder: {{precision: {written}}}\n")
    cfg = load_pipeline(path)
    assert (cfg.train.precision, cfg.encoder.precision) == (train, encoder)
    assert cfg.encoder.identity_precision == encoder
    assert cfg.model_dump()["train"]["precision"] == train  # stored (MLflow params, stage keys) one way
    assert load_pipeline(path, [f"train.precision={written}"]).train.precision == train  # --set too


def test_the_train_jobs_read_the_normalised_name():
    """train.precision: bf16 (old spelling) still turns on bfloat16 autocast in the heads."""
    from harnessrl.heads.base import DriverData
    from harnessrl.heads.cross import CrossHead
    from harnessrl.heads.base import tool_head_config

    tools = ["search", "read", "search"]
    data = DriverData(ds=None, n_rows=3, feature_dim=0, feature_stats=None, reward_scale=1.0,
                      encoder_name="builtin:all-MiniLM-L6-v2")
    for written, on in (("bf16", True), ("bfloat16", True), ("fp32", False), ("float32", False)):
        cfg = TrainConfig(precision=written)
        assert tool_head_config(cfg, tools, 8, [])[0]["bf16"] is on, written
        assert CrossHead().loop_config(cfg, data)["network"]["bf16"] is on, written


def test_bad_names_are_config_errors_naming_the_choices(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("data: {train: [x.jsonl]}\ntrain: {precision: float16}\n")
    with pytest.raises(ConfigError, match=r"train.precision: Input should be 'float32' or 'bfloat16'"):
        load_pipeline(path)
    with pytest.raises(ConfigError, match=r"encoder.precision: Input should be 'auto', 'float32', 'bfloat16' or "
                                          r"'float16'"):
        load_pipeline(path, ["train.precision=fp32", "encoder.precision=int8"])
    with pytest.raises(ConfigError, match=r"encoder.precision: Input should be 'auto', 'float32' or 'float16'"):
        load_serve(None, ["encoder.precision=bf16", "encoder.num_gpus=1"])  # the served model's own decides
    assert load_serve(None, ["encoder.precision=fp16", "encoder.num_gpus=1"]).encoder.precision == "float16"
    with pytest.raises(ConfigError, match="precision"):
        encoder_identity(precision="fp16")  # weights, not a compute precision of an identity


def test_rules_that_follow_from_a_precision():
    assert COMPUTE == ("float32", "bfloat16")
    assert [identity_precision(p) for p in ("auto", "float32", "float16", "bfloat16", "bf16")] == \
        ["float32", "float32", "float32", "bfloat16", "bfloat16"]
    # float16 weights only on a GPU, never when float32 is asked for or the vectors are bfloat16 ones
    assert half_weights("auto", True, "float32") and half_weights("fp16", True, "float32")
    assert not half_weights("auto", False, "float32") and not half_weights("float32", True, "float32")
    assert not half_weights("auto", True, "bfloat16")
    # the encode stage and the encoder deployment follow the same rule
    from harnessrl.pipelines.encode_pool import plan_pool

    gpu = {"CPU": 4.0, "GPU": 1.0, "memory": 16 * 2**30}
    assert [plan_pool(EncoderConfig(gpus_per_actor=1, precision=p), gpu).half for p in ("auto", "fp16", "fp32", "bf16")] \
        == [True, True, False, False]
    assert ServeEncoderConfig(precision="FP32").precision == "float32"
    # an identity asked for by either name is the same identity (read from the model's files)
    assert encoder_identity(precision="bf16") == encoder_identity(precision="bfloat16") != encoder_identity()
