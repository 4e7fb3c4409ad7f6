"""Checkpoints in S3: a training run writes its checkpoints (critic and tool head) to an S3
endpoint on loopback, and a second run under the same name resumes from there."""

from __future__ import annotations

import json

import pytest
from harnessrl.model_card import ModelCard

pytestmark = pytest.mark.integration


def test_checkpoints_go_to_s3_and_resume_from_there(encoded, work, s3, tmp_path):
    from harnessrl.config import TrainConfig
    from harnessrl.jobs.train import train
    from harnessrl.encoded_data import read_identity

    storage_dir = f"s3://{s3['bucket']}/runs/train"
    meta = ModelCard(head_config={}, encoder=json.loads(read_identity(encoded.out_dir).to_json()))
    cfg = TrainConfig(head="frozen", steps=40, batch_size=64, checkpoint_every=20, log_every=20, num_workers=1,
                      cpus_per_worker=0.5)
    first = train(encoded.out_dir, storage_dir, cfg, "s3-run", str(tmp_path / "m1"), meta)
    assert first.checkpoint_path.startswith(f"{s3['bucket']}/runs/train/s3-run/")
    keys = {o["Key"] for o in s3["client"].list_objects_v2(Bucket=s3["bucket"], Prefix="runs/train/s3-run/")
            ["Contents"]}
    for name in ("state.safetensors", "state.json", "tools.safetensors", "tools.json"):
        assert any(k.endswith(f"/{name}") for k in keys), name
    assert not any(k.endswith(".pkl") for k in keys if "/checkpoint_" in k)

    second = train(encoded.out_dir, storage_dir, cfg.model_copy(update={"steps": 60}), "s3-run",
                   str(tmp_path / "m2"), meta)
    assert second.metrics["resumed_from_step"] == 40 and second.metrics["step"] == 60
    assert (tmp_path / "m2" / "tool_head.safetensors").is_file()
