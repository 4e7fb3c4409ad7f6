"""The encode stage (issue 8): dedupe, the persistent embedding cache (S3 on loopback), encoder
identity checks, length-aware batching and actor-pool planning (GPU options checked on CPU).

Stage runs use the session's local Ray (2 CPUs) and the transitions of the sample slice
(conftest); vectors are compared with direct `model.encode` calls of the real MiniLM.
"""

from __future__ import annotations

import json
import logging
import re
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from conftest import table as _table
from harnessrl.config import EncoderConfig, parse_pipeline
from harnessrl.embedding_cache import EmbeddingCache, bucket_of
from harnessrl.encoded_data import check_identity, read_meta
from harnessrl.encoders import ENCODER_KEY, EncoderIdentity, encoder_identity, load_encoder, text_hash
from harnessrl.errors import ConfigError, ModelError
from harnessrl.transitions import untaken_candidates

GiB = 2**30
F16_ATOL = 2e-3  # float16 has ~3 significant digits; unit vectors have entries below 1


@pytest.fixture(scope="module")
def model():
    return load_encoder(max_seq_length=128)


def _distinct(rows: pa.Table, max_candidates: int = 16) -> set[str]:
    texts = {t for c in ("state_text", "action_text", "next_state_text") for t in rows.column(c).to_pylist()}
    texts |= {t for a, cands in zip(rows.column("action_text").to_pylist(), rows.column("candidates").to_pylist())
              for t in untaken_candidates(a, cands, max_candidates)}
    return texts


@pytest.fixture(scope="module")
def s3_cache(s3):
    return f"s3://{s3['bucket']}/embedding-cache"


PROGRESS: list[str] = []  # the first run's progress lines


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def first_run(transitions, work, s3_cache):
    """float16 columns, the cache on S3 (empty at first); a progress line every 0.5 s, kept."""
    from harnessrl.pipelines.encode import encode
    from harnessrl.pipelines.encode_progress import log

    cfg = EncoderConfig(batch_size=32, max_seq_length=128, dtype="float16", cache=s3_cache, block_texts=128)
    handler, level = _Lines(), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        result = encode(str(work["dir"] / "transitions"), str(work["dir"] / "enc16"), cfg, progress_every=0.5)
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    PROGRESS[:] = [line for line in handler.lines if " texts encoded" in line]
    return cfg, result


# ---- dedupe ----------------------------------------------------------------------------------
def test_each_distinct_text_encoded_once_and_equal_to_direct(first_run, work, model):
    _, result = first_run
    from harnessrl.encoded_data import read_table

    rows = read_table(str(work["dir"] / "enc16"))
    texts = _table(work["dir"] / "enc16" / "_texts")
    distinct = _distinct(rows)
    assert result.texts_distinct == len(distinct) == texts.num_rows
    assert set(texts.column("text_hash").to_pylist()) == {text_hash(t) for t in distinct}  # each exactly once
    assert result.texts_total == sum(
        3 + len(untaken_candidates(a, c, 16))
        for a, c in zip(rows.column("action_text").to_pylist(), rows.column("candidates").to_pylist()))
    assert result.texts_encoded == len(distinct) and result.texts_cached == 0
    for col in ("state_emb", "action_emb", "next_state_emb"):
        assert str(rows.schema.field(col).type) == "fixed_size_list<element: halffloat>[384]"
    # extra transition columns pass through untouched
    source = _table(work["dir"] / "transitions")
    for col in ("tool", "features", "reward", "info"):
        assert col in rows.column_names
    by_key = {(r["episode_id"], r["step_idx"]): r for r in source.select(["episode_id", "step_idx", "features", "tool"]).to_pylist()}
    for r in rows.select(["episode_id", "step_idx", "features", "tool"]).slice(0, 50).to_pylist():
        assert by_key[(r["episode_id"], r["step_idx"])] == r

    # identical vectors to direct encoding (float32 model, stored as float16): states, actions,
    # next states and untaken candidates of a spread of rows, short and long texts alike
    enc, _ = model
    sample = rows.take(np.linspace(0, rows.num_rows - 1, 24).astype(int)).to_pylist()
    for col, emb_col in (("state_text", "state_emb"), ("action_text", "action_emb"), ("next_state_text", "next_state_emb")):
        direct = enc.encode([r[col] for r in sample])
        stored = np.array([r[emb_col] for r in sample], np.float32)
        np.testing.assert_allclose(stored, direct, atol=F16_ATOL, rtol=0)
    for r in sample[:8]:
        expected = untaken_candidates(r["action_text"], r["candidates"], 16)
        if expected:
            np.testing.assert_allclose(np.array(r["candidate_emb"], np.float32), enc.encode(expected), atol=F16_ATOL,
                                       rtol=0)
            assert len(r["candidate_features"]) == len(expected)


def test_each_distinct_segment_encoded_once_for_the_reader_head(transitions, work):
    """encoder.segments (the reader head's data): every distinct text of the embedded segment roles,
    of states and next states, and every action and kept candidate lands in `_texts` once; no
    rendered state is embedded (state_texts off) and the rows reference the table."""
    from harnessrl.pipelines.encode import encode
    from harnessrl.render import EMBEDDED_ROLES

    cfg = EncoderConfig(batch_size=32, max_seq_length=128, segments=True, state_texts=False, block_texts=128)
    result = encode(str(work["dir"] / "transitions"), str(work["dir"] / "enc-segments"), cfg)
    source = _table(work["dir"] / "transitions")
    want = {s["text"] for col in ("state_segments", "next_state_segments") for row in source.column(col).to_pylist()
            for s in row if s["role"] in EMBEDDED_ROLES}
    assert want, "the sample's transitions carry segments"
    assert any(s["role"] == "detail" for row in source.column("state_segments").to_pylist() for s in row), \
        "the fixture renders the observations' details (render.details) too"
    want |= set(source.column("action_text").to_pylist())
    want |= {t for a, c in zip(source.column("action_text").to_pylist(), source.column("candidates").to_pylist())
             for t in untaken_candidates(a, c, 16)}
    texts = _table(work["dir"] / "enc-segments" / "_texts").column("text_hash").to_pylist()
    assert len(texts) == len(set(texts)) == result.texts_distinct == result.texts_encoded
    assert set(texts) == {text_hash(t) for t in want}
    assert not set(texts) & {text_hash(t) for t in source.column("state_text").to_pylist()} - {text_hash(t) for t in want}


# ---- the persistent cache ----------------------------------------------------------------------
def test_progress_lines_count_up_to_the_texts_encoded(first_run):
    """The stage reports while it encodes: counts only grow, never past what it encoded in the end."""
    _, result = first_run
    lines = PROGRESS
    assert lines, "no progress line in a run of several seconds with progress_every=0.5"
    counts = [int(re.search(r"encode: ([\d,]+) ", line).group(1).replace(",", "")) for line in lines]
    assert counts == sorted(counts) and counts[-1] <= result.texts_encoded
    scanned = [line for line in lines if " of " in line and "found so far" not in line]
    for line in scanned:  # once every file is scanned, the total is the run's
        assert f"of {result.texts_encoded:,} texts encoded" in line


def test_progress_line_before_and_after_the_scan():
    from harnessrl.pipelines.encode_progress import progress_line

    assert progress_line(512, 2000, 1, 3, 10.0) == \
        "encode: 512 texts encoded of 2,000 found so far (scanned 1/3 files), 51 texts/s"
    assert progress_line(1000, 4000, 3, 3, 20.0) == \
        "encode: 1,000 of 4,000 texts encoded (25%), 50 texts/s, about 60 s left"
    assert progress_line(1000, 100000, 3, 3, 20.0).endswith("about 33 min left")
    assert progress_line(0, 10, 3, 3, 5.0) == "encode: 0 of 10 texts encoded (0%), 0 texts/s"  # no rate, no guess
    assert progress_line(10, 10, 3, 3, 5.0) == "encode: 10 of 10 texts encoded (100%), 2 texts/s"


def test_rerun_takes_everything_from_the_cache(first_run, work):
    from harnessrl.pipelines.encode import encode

    cfg, first = first_run
    again = encode(str(work["dir"] / "transitions"), str(work["dir"] / "enc16-again"), cfg,
                   progress_every=None)  # and no progress actor
    assert again.texts_distinct == first.texts_distinct
    assert again.texts_cached == first.texts_distinct and again.texts_encoded == 0  # no model call at all
    from harnessrl.encoded_data import read_table

    key = [("episode_id", "ascending"), ("step_idx", "ascending")]
    a, b = (read_table(str(work["dir"] / d)).sort_by(key) for d in ("enc16", "enc16-again"))  # the vectors named
    for col in ("state_emb", "action_emb", "next_state_emb", "candidate_emb"):
        assert a.column(col).equals(b.column(col))
    meta = read_meta(str(work["dir"] / "enc16-again"))
    assert meta["texts_cached"] == first.texts_distinct and meta["cache"].startswith("s3://")


def test_new_data_with_old_states_encodes_only_new_texts(first_run, work, tmp_path):
    """A corpus that shares most texts with the cached run: only its new texts are encoded. Also
    a fixed pool of 2 actors x 1 CPU, which does not fit a 2-CPU Ray: it is shrunk, not hung."""
    from harnessrl.pipelines.encode import encode

    cfg, _ = first_run
    src = sorted((work["dir"] / "transitions").glob("*.parquet"))
    new_dir = tmp_path / "transitions"
    new_dir.mkdir()
    for p in src[1:]:
        shutil.copy(p, new_dir / p.name)
    changed = pq.read_table(src[0])
    states = [f"{s}\n(replayed with a new note {i})" for i, s in enumerate(changed.column("state_text").to_pylist())]
    changed = changed.set_column(changed.schema.get_field_index("state_text"), "state_text", pa.array(states))
    pq.write_table(changed, new_dir / src[0].name)
    new_texts = set(states) - _distinct(_table(work["dir"] / "transitions"))

    cfg2 = cfg.model_copy(update={"actors": 2, "cpus_per_actor": 1.0})
    result = encode(str(new_dir), str(tmp_path / "encoded"), cfg2)
    assert result.texts_encoded == len(new_texts) > 0
    assert result.texts_cached == result.texts_distinct - len(new_texts)
    assert result.actors == 2 and result.cpus_per_actor * 2 <= 1.0  # adapted to the 2-CPU cluster


def test_cached_and_seen_texts_never_reach_the_model(tmp_path):
    """The scan step, in process with a plain claim table: texts the cache holds and texts an
    earlier block claimed are dropped before the encoder pool; a retried block gets its own
    claims back. (Blocks are not sorted by length: each actor sorts its own block, see
    `length_batches`.) An encoder actor that receives nothing loads no model."""
    from harnessrl.embedding_cache import BUCKETS, emb_array
    from harnessrl.pipelines.encode_actor import _Encoder
    from harnessrl.pipelines.encode_claims import _Registry
    from harnessrl.pipelines.encode_pool import plan_pool
    from harnessrl.pipelines.encode_scan import _scan

    identity = encoder_identity(max_seq_length=128)
    cache = EmbeddingCache(str(tmp_path / "cache"), identity, "float32").open()
    cache.put([text_hash("look"), text_hash("Task: a\nNow: room")],
              emb_array(np.ones((2, identity.dim), np.float32), "float32"))

    def batch(states, actions, cands):
        return pa.table({"state_text": states, "action_text": actions, "next_state_text": states[1:] + ["end"],
                         "candidates": cands})

    first = batch(["Task: a\nNow: room", "Task: a\nNow: hall, long text"], ["look", "go north"],
                  [["look", "take key", "go north"], None])
    second = batch(["Task: a\nNow: hall, long text", "Task: a\nNow: cellar"], ["take key", "x"], [None, None])
    registry = _Registry(cache)

    def scan(b):
        out = list(_scan(b, [registry], max_candidates=16, buckets=BUCKETS, block_texts=2))
        assert all(t.num_rows <= 2 for t in out)
        return [t for part in out for t in part.column("text").to_pylist()]

    got = scan(first)
    assert sorted(got) == sorted(["Task: a\nNow: hall, long text", "go north", "take key", "end"])
    assert sorted(scan(first)) == sorted(got)  # a retried block: the same claims
    assert sorted(scan(second)) == ["Task: a\nNow: cellar", "x"]  # hall and "take key" were claimed by the first block
    summary = registry.summary()
    assert summary["n_cached"] == 2 and summary["distinct"] == 8
    assert summary["refs"] == (3 * 2 + 2) + 3 * 2  # occurrences, untaken candidates included; a retry counts once

    cfg = EncoderConfig(max_seq_length=128)
    enc = _Encoder(cfg, plan_pool(cfg, {"CPU": 2}), identity.to_json(), eager=False)
    assert enc.model is None and enc.texts_encoded == 0  # loaded at its first text only
    out = enc(pa.table({"text_hash": [text_hash("go north")], "text": ["go north"], "n_chars": [8], "bucket": [0]}))
    assert enc.texts_encoded == 1 and enc.model is not None and out.column("cached").to_pylist() == [False]


def test_cache_roundtrip_local_and_s3(tmp_path, s3):
    identity = encoder_identity(max_seq_length=128)
    rng = np.random.default_rng(1)
    texts = [f"text {i}" for i in range(200)]
    vectors = rng.standard_normal((200, identity.dim)).astype(np.float32)
    for root in (str(tmp_path / "cache"), f"s3://{s3['bucket']}/roundtrip"):
        cache = EmbeddingCache(root, identity, "float32").open()
        assert cache.put([text_hash(t) for t in texts[:150]], vectors[:150], run="one") == 150
        assert cache.put([text_hash(t) for t in texts[100:]], vectors[100:], run="two") == 100  # overlap: harmless
        got, found = cache.get(texts + ["never seen"])
        assert found[:200].all() and not found[200]
        np.testing.assert_array_equal(got[:200], vectors)
        stats = cache.stats()
        assert stats["rows"] == 250 and stats["files"] <= 2 * cache.buckets
        buckets = {bucket_of(text_hash(t), cache.buckets) for t in texts}
        assert len(buckets) > 1  # spread over buckets: a lookup reads only its own


def test_attach_in_tasks_equals_attach_in_driver(encoded, work, tmp_path):
    """A small corpus is attached by the driver, a large one by Ray tasks: the same files either way."""
    from harnessrl.encoded_data import text_index
    from harnessrl.pipelines.encode_attach import attach_all
    from harnessrl.pipelines.encode_scan import _input_files

    src = str(work["dir"] / "transitions")
    files = _input_files(src)
    assert len(files) > 1
    index = text_index(str(work["dir"] / "encoded" / "_texts"), "float32", 384)
    meta = {ENCODER_KEY: b"{}"}
    written = {mode: attach_all(files, src, str(tmp_path / mode), index, 16, meta, in_driver=mode == "driver")
               for mode in ("driver", "tasks")}
    assert written["driver"] == written["tasks"] == encoded.rows
    for name in sorted(p.name for p in (tmp_path / "driver").iterdir()):
        here, there = pq.read_table(tmp_path / "driver" / name), pq.read_table(tmp_path / "tasks" / name)
        assert here.equals(there) and here.schema.metadata[ENCODER_KEY] == b"{}"
    ref = _table(work["dir"] / "encoded" / "data")
    assert ref.equals(_table(tmp_path / "driver").select(ref.column_names))  # as the stage wrote them


# ---- encoder identity ----------------------------------------------------------------------
def test_identity_from_files_matches_loaded_model(model):
    _, loaded = model
    assert encoder_identity(max_seq_length=128) == loaded
    assert encoder_identity().max_seq_length == load_encoder()[1].max_seq_length == 256


def test_encoder_mismatch_is_a_clear_error(encoded, work, tmp_path, model):
    from harnessrl.pipelines.encode_actor import _Encoder
    from harnessrl.pipelines.encode_pool import plan_pool

    _, identity = model
    check_identity(encoded.out_dir, identity)  # the right encoder passes
    other = EncoderIdentity(**{**json.loads(identity.to_json()), "max_seq_length": 64})
    with pytest.raises(ModelError, match="max_seq_length: 128 vs 64"):
        check_identity(encoded.out_dir, other)
    meta = pads.dataset(str(work["dir"] / "encoded" / "data"), format="parquet").schema.metadata
    assert EncoderIdentity.from_json(meta[ENCODER_KEY].decode()) == identity  # travels with the Parquet files

    # a cache folder that holds another encoder's vectors
    cache = EmbeddingCache(str(tmp_path / "c"), identity, "float32").open()
    (tmp_path / "c" / f"{identity.digest()}-float32" / "_cache.json").write_text(
        json.dumps({"encoder": json.loads(other.to_json()), "dtype": "float32", "dim": 384, "buckets": 16}))
    with pytest.raises(ModelError, match="encoder mismatch in embedding cache"):
        EmbeddingCache(cache.root, identity, "float32").open()

    # an actor whose model differs from the identity the driver expects refuses to encode
    cfg = EncoderConfig(max_seq_length=128)
    with pytest.raises(ModelError, match="encoder mismatch in encoder actor"):
        _Encoder(cfg, plan_pool(cfg, {"CPU": 2}), other.to_json(), eager=True)


def test_cpu_precision_is_part_of_the_identity(encoded, work, model):
    """The opt-in bfloat16 CPU encoder: close to float32 vectors, but another identity, so an
    encoded dataset, cache or actor of one precision is never taken for another."""
    from harnessrl.pipelines.encode_actor import _Encoder
    from harnessrl.pipelines.encode_pool import plan_pool

    fp32, identity = model
    texts = _table(work["dir"] / "transitions").column("state_text").to_pylist()[:48]
    ref = fp32.encode(texts, batch_size=16, convert_to_numpy=True)
    assert "precision" not in identity.to_json()  # float32 identities (and cache digests) as before
    for precision in ("bfloat16",):
        quick, ident = load_encoder(max_seq_length=128, precision=precision)
        assert ident == encoder_identity(max_seq_length=128, precision=precision) != identity
        assert ident.digest() != identity.digest() and EncoderIdentity.from_json(ident.to_json()) == ident
        vecs = quick.encode(texts, batch_size=16, convert_to_numpy=True)
        assert vecs.dtype == np.float32
        cos = (vecs * ref).sum(1) / np.linalg.norm(vecs, axis=1) / np.linalg.norm(ref, axis=1)
        assert cos.min() > 0.99 and cos.mean() > 0.995, (precision, cos.min(), cos.mean())
        assert not np.allclose(vecs, ref, atol=1e-6)  # the precision really changed the computation
        with pytest.raises(ModelError, match=f"precision: 'float32' vs '{precision}'"):
            check_identity(encoded.out_dir, ident)  # float32 embeddings are not served as bfloat16 ones
    cfg = EncoderConfig(max_seq_length=128, precision="bfloat16")
    assert cfg.identity_precision == "bfloat16" and EncoderConfig().identity_precision == "float32"
    # an actor computes at the precision of the run's identity (decided once, by the driver),
    # whatever its own configuration names: one run, one precision
    actor = _Encoder(cfg, plan_pool(cfg, {"CPU": 2}), identity.to_json(), eager=True)
    got = actor.encode(texts[:8])
    np.testing.assert_allclose(got, ref[:8], atol=1e-5, rtol=0)
    assert not np.allclose(got, vecs[:8], atol=1e-5)  # not the bfloat16 vectors its configuration names
    # a GPU computes bfloat16 too (autocast, no float16 weights): such a critic serves on either
    gpu_bf16 = parse_pipeline({"data": {"train": ["x"]}, "encoder": {"precision": "bfloat16", "gpus_per_actor": 1}})
    assert gpu_bf16.encoder.identity_precision == "bfloat16"
    assert not plan_pool(gpu_bf16.encoder, {"CPU": 4, "GPU": 1}).half
    assert plan_pool(EncoderConfig(gpus_per_actor=1), {"CPU": 4, "GPU": 1}).half  # auto: float16 weights
    with pytest.raises(ConfigError, match="precision"):
        encoder_identity(max_seq_length=128, precision="int8")


def test_float32_vectors_do_not_depend_on_their_batch(work, model):
    """Why float32 stays the CPU default: a text's float32 vector is the same whichever texts share
    its batch, so training, serving and a replay score alike; bfloat16's moves with the batch
    (within cosine 0.9999 of float32, which is why it is offered, opt-in)."""
    texts = sorted(set(_table(work["dir"] / "transitions").column("state_text").to_pylist()))[:64]
    perm = np.random.default_rng(0).permutation(len(texts))

    def three_ways(enc):
        """The texts' vectors in batches of 16, in other batches of 16, and the first 8 alone."""
        one = enc.encode(texts, batch_size=16, convert_to_numpy=True)
        other = np.empty_like(one)
        other[perm] = enc.encode([texts[i] for i in perm], batch_size=16, convert_to_numpy=True)
        alone = np.stack([enc.encode([t], convert_to_numpy=True)[0] for t in texts[:8]])
        return one, other, alone

    one, other, alone = three_ways(model[0])
    np.testing.assert_allclose(other, one, atol=1e-5, rtol=0)
    np.testing.assert_allclose(alone, one[:8], atol=1e-5, rtol=0)
    one, other, alone = three_ways(load_encoder(max_seq_length=128, precision="bfloat16")[0])
    assert (one * other).sum(1).min() > 0.9999 and (alone * one[:8]).sum(1).min() > 0.9999


def test_bfloat16_hint_only_where_the_cpu_has_it(monkeypatch, caplog, model):
    """The stage's hint where bfloat16 would be fast, and a warning where it would be emulated."""
    import copy

    from harnessrl import encoders
    from harnessrl.pipelines.encode_pool import bf16_hint

    assert encoders.native_bf16("processor\t: 0\nflags\t\t: fpu sse2 avx512f avx512_bf16 avx512_vnni\n")
    assert encoders.native_bf16("flags : fpu avx512f amx_bf16 amx_tile\n")
    assert not encoders.native_bf16("flags\t\t: fpu sse2 avx2 avx512f avx512_vnni\n")
    assert not encoders.native_bf16("Features\t: fp asimd bf16\n")  # not x86: emulated by torch's CPU autocast
    assert "encoder.precision: bfloat16" in bf16_hint("cpu", "float32", native=True)
    assert bf16_hint("cpu", "float32", native=False) is None
    assert bf16_hint("cpu", "bfloat16", native=True) is None and bf16_hint("cuda", "float32", native=True) is None
    for native in (True, False):
        monkeypatch.setattr(encoders, "cpu_has_native_bf16", lambda native=native: native)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="harnessrl.encoders"):
            encoders.set_precision(copy.deepcopy(model[0]), "bfloat16", "cpu")
        assert ("emulated" in caplog.text) is not native


# ---- batching and pool planning -----------------------------------------------------------------
def test_length_batches_group_similar_lengths():
    from harnessrl.pipelines.encode_actor import length_batches

    rng = np.random.default_rng(0)
    lengths = np.concatenate([rng.integers(5, 40, 500), rng.integers(400, 1500, 300)])
    rng.shuffle(lengths)
    batches = length_batches(lengths, batch_size=32, max_tokens=128)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(len(lengths)))  # every text once
    assert np.all(np.diff(lengths[flat]) >= 0)  # ascending length
    sizes = [len(b) for b in batches]
    assert max(sizes) > 32 and sizes[-2] == 32  # short texts: bigger batches; long ones: batch_size (last: the rest)
    for b in batches:
        longest = min(128, lengths[b].max() // 4 + 2)
        assert len(b) == 1 or len(b) * longest <= 32 * 128


def test_pool_plan_fits_small_machines():
    from harnessrl.pipelines.encode_pool import cpu_budget, plan_pool

    two = {"CPU": 2.0, "memory": 14 * GiB}
    p = plan_pool(EncoderConfig(), two)
    assert (p.min_actors, p.max_actors, p.cpus_per_actor, p.threads, p.device) == (2, 2, 0.5, 1, "cpu")
    p = plan_pool(EncoderConfig(actors=2, cpus_per_actor=1), two)  # would take both CPUs: the reads never run
    assert p.max_actors * p.cpus_per_actor <= cpu_budget(2) and p.max_actors == 2 and p.notes
    p = plan_pool(EncoderConfig(cpus_per_actor=4), two)
    assert (p.max_actors, p.cpus_per_actor, p.threads) == (1, 1.0, 2)
    p = plan_pool(EncoderConfig(actors=1), two)
    assert (p.max_actors, p.threads) == (1, 2)  # one actor uses both cores
    p = plan_pool(EncoderConfig(min_actors=1, max_actors=4), {"CPU": 8.0, "memory": 32 * GiB})
    assert (p.min_actors, p.max_actors) == (1, 4)
    assert plan_pool(EncoderConfig(), {"CPU": 64.0, "memory": 4 * GiB}, node_cpus=16).max_actors == 3  # memory-bound
    assert plan_pool(EncoderConfig(), {"CPU": 64.0, "memory": 64 * GiB}, max_blocks=3).max_actors == 3  # little work


def test_pool_plan_budgets_each_node():
    """Configuration only: 1.25-CPU actors fit a 16-CPU cluster as a whole, but on eight 2-CPU
    nodes each would leave 0.75 CPU, and Ray Data's 1-CPU ListFiles/read tasks never start."""
    from harnessrl.pipelines.encode_pool import plan_pool

    nodes = [{"CPU": 2.0, "memory": 8 * GiB} for _ in range(8)]
    cluster = {"CPU": 16.0, "memory": 64 * GiB}
    for p in (plan_pool(EncoderConfig(cpus_per_actor=1.25), cluster, nodes=nodes),
              plan_pool(EncoderConfig(cpus_per_actor=1.25), cluster, node_cpus=2)):
        assert p.cpus_per_actor <= 1.0 and p.notes  # one CPU left on every node
        assert p.max_actors == 8  # one actor per node
        assert 2 - (p.max_actors // len(nodes)) * p.cpus_per_actor >= 1
    p = plan_pool(EncoderConfig(actors=16, cpus_per_actor=1), cluster, nodes=nodes)  # two per node: half a CPU each
    assert (p.max_actors, p.cpus_per_actor) == (16, 0.5) and p.notes
    # mixed sizes: the share fits the big node; the small one takes none of them
    p = plan_pool(EncoderConfig(cpus_per_actor=1.25), {"CPU": 18.0, "memory": 64 * GiB},
                  nodes=[{"CPU": 2.0}, {"CPU": 16.0}])
    assert (p.cpus_per_actor, p.max_actors) == (1.25, 12)
    # GPUs are counted per node too: 0.5 GPU each on two 1-GPU nodes
    p = plan_pool(EncoderConfig(gpus_per_actor=0.5), {"CPU": 32.0, "GPU": 2.0, "memory": 200 * GiB},
                  nodes=[{"CPU": 16.0, "GPU": 1.0}, {"CPU": 16.0, "GPU": 1.0}])
    assert p.max_actors == 4


class _Identity:
    def __call__(self, batch):
        return batch


def test_gpu_options_validated_on_cpu(ray_local):
    """Configuration only: no GPU is used."""
    import ray

    from harnessrl.pipelines.encode_pool import plan_pool

    with pytest.raises(ConfigError, match="has 0 GPU"):
        plan_pool(EncoderConfig(gpus_per_actor=1), {"CPU": 2.0, "memory": 14 * GiB})
    gpu_cluster = {"CPU": 32.0, "GPU": 2.0, "memory": 200 * GiB}
    p = plan_pool(EncoderConfig(gpus_per_actor=0.5, batch_size=256), gpu_cluster, node_cpus=16)
    assert (p.min_actors, p.max_actors, p.gpus_per_actor, p.device, p.half) == (4, 4, 0.5, "cuda", True)
    kwargs = p.map_kwargs(256)
    assert kwargs["num_gpus"] == 0.5 and kwargs["num_cpus"] == 0.5 and kwargs["batch_size"] == 256
    assert (kwargs["compute"].min_size, kwargs["compute"].max_size) == (4, 4)
    # Ray Data accepts them: it checks GPU map arguments when the dataset is defined, before any
    # scheduling (without a batch size it refused GPU actors, seen on the first GPU run)
    ray.data.range(4).map_batches(_Identity, **kwargs)
    p = plan_pool(EncoderConfig(gpus_per_actor=1, precision="float32", max_actors=8), gpu_cluster)
    assert (p.max_actors, p.half) == (2, False) and p.notes  # 8 asked, 2 GPUs
    assert "num_gpus" not in plan_pool(EncoderConfig(), gpu_cluster).map_kwargs(256)

    base = {"data": {"train": ["x"]}}
    for encoder, message in (
        ({"precision": "float16"}, "float16 needs GPU actors"),
        ({"gpus_per_actor": 2}, "at most one GPU"),
        ({"actors": 2, "max_actors": 4}, "either actors"),
        ({"min_actors": 4, "max_actors": 2}, "larger than max_actors"),
        ({"cache": "gs://bucket/x"}, "local folder or an s3:// URI"),
        ({"dtype": "bfloat16"}, "encoder.dtype"),
    ):
        with pytest.raises(ConfigError, match=message):
            parse_pipeline({**base, "encoder": encoder})
    assert parse_pipeline({**base, "encoder": {"gpus_per_actor": 1, "precision": "float16", "min_actors": 1,
                                               "max_actors": 8, "cache": "s3://b/c"}}).encoder.max_actors == 8


def test_gpu_actors_on_a_cpu_cluster_fail_fast(transitions, work, tmp_path):
    import time

    from harnessrl.pipelines.encode import encode

    start = time.time()
    with pytest.raises(ConfigError, match="gpus_per_actor"):
        encode(str(work["dir"] / "transitions"), str(tmp_path / "out"), EncoderConfig(gpus_per_actor=1))
    assert time.time() - start < 30
