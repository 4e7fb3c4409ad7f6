"""An encoded dataset's encoder identity, read and checked in one place (harnessrl.encoded_data),
and checked where the embeddings are consumed: training (`jobs.train.train`) and the
benchmarks' behaviour cloning (`bench/twx_bc.py`). Datasets are written by hand here, small
and with the real identity of the bundled MiniLM; tests/test_encode.py checks the stage's own."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import import_bench
from harnessrl import encoded_data
from harnessrl.encoders import ENCODER_KEY, encoder_identity
from harnessrl.errors import ModelError
from harnessrl.model_card import ModelCard


def _dataset(folder, meta_identity, schema_identity=None):
    """`data/part-00000.parquet` (two rows of 384-d state embeddings, `schema_identity` in its schema)
    and the description (`encoded_data.write_meta`) naming `meta_identity`, as the encode stage writes them."""
    (folder / "data").mkdir(parents=True)
    emb = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(2 * 384, np.float32)), 384)
    table = pa.table({"state_emb": emb})
    if schema_identity is not None:
        table = table.replace_schema_metadata({ENCODER_KEY: schema_identity.to_json().encode()})
    pq.write_table(table, folder / "data" / "part-00000.parquet")
    encoded_data.write_meta(str(folder), {"encoder": json.loads(meta_identity.to_json()), "rows": 2})
    return str(folder)


def test_identity_is_read_and_checked_against_both_records(tmp_path):
    ident = encoder_identity(max_seq_length=128)
    other = replace(ident, max_seq_length=64)
    good = _dataset(tmp_path / "good", ident, ident)
    assert encoded_data.exists(good) and not encoded_data.exists(str(tmp_path / "absent"))
    assert encoded_data.read_identity(good) == ident and encoded_data.read_meta(good)["rows"] == 2
    encoded_data.check_identity(good, ident)
    with pytest.raises(ModelError, match=r"encoder mismatch in training data .*max_seq_length: 128 vs 64"):
        encoded_data.check_identity(good, other, "training data")
    # the Parquet files' own record must agree too (a dataset whose files were swapped)
    swapped = _dataset(tmp_path / "swapped", ident, other)
    with pytest.raises(ModelError, match=r"\(Parquet schema\)"):
        encoded_data.check_identity(swapped, ident)
    with pytest.raises(ModelError, match=re.escape(f"no readable encoder identity ({encoded_data.DATASET_META})")):
        encoded_data.check_identity(str(tmp_path / "absent"), ident)


def test_training_refuses_embeddings_of_another_encoder(tmp_path):
    """`train` checks first: nothing is read or started for a critic whose recorded encoder did not
    make the embeddings it would learn from."""
    from harnessrl.config import TrainConfig
    from harnessrl.jobs.train import train

    ident = encoder_identity(max_seq_length=128)
    encoded = _dataset(tmp_path / "enc", ident, ident)
    meta = ModelCard(head_config={}, encoder=json.loads(replace(ident, precision="bfloat16").to_json()))
    with pytest.raises(ModelError, match="encoder mismatch in training data .*precision: 'float32' vs 'bfloat16'"):
        train(encoded, str(tmp_path / "train"), TrainConfig(head="frozen", steps=1), "refused", str(tmp_path / "model"), meta)
    assert not (tmp_path / "train").exists() and not (tmp_path / "model").exists()


def test_behaviour_cloning_loads_the_encoder_that_made_its_data(tmp_path):
    twx_bc = import_bench("twx_bc")
    ident = encoder_identity()  # the bundled MiniLM, as its files say
    model = twx_bc.load_bc_encoder(_dataset(tmp_path / "ok", ident, ident))
    assert model.get_embedding_dimension() == 384
    foreign = replace(ident, weights_hash="sha256:0000000000000000")  # vectors of other weights
    with pytest.raises(ModelError, match="encoder mismatch in behaviour cloning on .*weights_hash"):
        twx_bc.load_bc_encoder(_dataset(tmp_path / "foreign", foreign, foreign))
