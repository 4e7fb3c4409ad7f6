"""The reader head on a GPU beside the CPU, in one run (issue 24): gradient steps/s of the worker's
step (batch assembly from the rows' segments + the IQL update, what a Ray Train worker runs) and
states/s scored (what a service replica runs), on the same encoded data, the same seed and the same
network; and the scores of one network on both devices must agree.

No Ray and no MLflow: the head's worker and scorer are called directly, so the script runs where
only torch, transformers, pyarrow, numpy and pydantic are (a device machine). `--pack` gathers what
it reads into one folder: the encoded rows (zstd), the `_texts` table of their embeddings, and the
encoder's tokenizer with its word-embedding table in float16 (the token path's input; 23 MiB),
about 30 MiB for text Taxi's 44,690 transitions.

    python bench/tabular.py --tasks taxi --wordings b --work-dir /tmp/tab     # the encoded data
    python bench/reader_device.py --pack .dev/reader --encoded /tmp/tab/tabular-taxi-b-reader/encoded
    python bench/reader_device.py --packed .dev/reader                        # cpu (and cuda when visible)
    # device call, carry [".dev/reader", ".whl"] (pydantic's wheels), timeout_s 420:
    PYTHONPATH=platform python3 bench/reader_device.py --packed .dev/reader --threads 16 --json $OUT/r.json

Variants: the defaults (semantic + match signals), the token path on (`train.reader.tokens`), and
on a GPU `train.precision: bfloat16`. Every loop is bounded in steps and seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform"))

TOKENIZER_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
WORD_TABLE = "embeddings.word_embeddings.weight"


def pack(out: Path, encoded: Path, encoder: str) -> None:
    """The rows, their embeddings and the encoder's tokenizer + word table, in `out`."""
    import pyarrow.dataset as pads
    import pyarrow.parquet as pq
    import torch
    from safetensors.torch import save_file

    from harnessrl.encoders import resolve_model_path
    from harnessrl.heads.reader import ROW_COLUMNS, word_embeddings

    out.mkdir(parents=True, exist_ok=True)
    table = pads.dataset(str(encoded / "data"), format="parquet").to_table(columns=list(ROW_COLUMNS))
    pq.write_table(table, out / "rows.parquet", compression="zstd")
    shutil.copytree(encoded / "_texts", out / "_texts", dirs_exist_ok=True)
    folder, enc = Path(resolve_model_path(encoder)), out / "encoder"
    enc.mkdir(exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copy(folder / name, enc / name)
    save_file({WORD_TABLE: torch.from_numpy(word_embeddings(encoder)).half()}, str(enc / "model.safetensors"))
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"packed {table.num_rows} rows into {out}: {size / 2**20:.1f} MiB")


class TableReader:
    """Ray Train's DataIterator.iter_batches over one pyarrow table (local shuffle by seed)."""

    def __init__(self, table):
        self.table = table

    def __call__(self, batch_size, batch_format="pyarrow", prefetch_batches=1, local_shuffle_buffer_size=None,
                 local_shuffle_seed=None):
        t = self.table
        if local_shuffle_buffer_size:
            t = t.take(np.random.default_rng(local_shuffle_seed).permutation(t.num_rows))
        return (t.slice(i, batch_size) for i in range(0, t.num_rows, batch_size))


def loop_config(table, packed: Path, tokens: bool, bf16: bool, batch_size: int | None = None) -> dict:
    """What `ReaderHead.loop_config` and the train job give a worker, with every default of
    `TrainConfig`, for rows held in one table."""
    from harnessrl.config import TrainConfig
    from harnessrl.heads.reader import load_rows, network_config, role_stats, table_embed

    cfg = TrainConfig(reader={"tokens": tokens}, **({"precision": "bfloat16"} if bf16 else {}))
    texts_dir, encoder = str(packed / "_texts"), str(packed / "encoder")
    r, embed = cfg.reader, table_embed(texts_dir)
    dim = int(embed([table.column("action_text")[0].as_py()]).shape[1])
    feats = np.asarray(table.column("features").to_pylist(), np.float32)
    feature_dim = feats.shape[1] if cfg.features and feats.ndim == 2 else 0
    network = network_config(cfg, dim, encoder, feature_dim)
    mean, std = role_stats((load_rows([table.slice(i, 8192)]) for i in range(0, table.num_rows, 8192)), embed, dim)
    return {"network": network.to_dict(), "encoder_name": encoder, "texts_dir": texts_dir,
            "role_stats": {"mean": mean.tolist(), "std": std.tolist()},
            "feature_stats": [feats.mean(0).tolist(), feats.std(0).tolist()] if feature_dim else None,
            "batch_size": batch_size or r.batch_size, "history_dropout": r.history_dropout, "penalty_on": r.penalty_on,
            "tool_head": None, "tool_vocab": [], "candidates_per_step": cfg.candidates_per_step, "reward_scale": 0.1,
            "seed": cfg.seed, "replay": cfg.replay, "shuffle_buffer": cfg.shuffle_buffer}


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def train(config: dict, table, device: str, steps: int, warmup: int, max_s: float):
    """(steps/s, last losses, the trained network) of the worker's step on `device`."""
    import torch

    from harnessrl.heads.base import Shard
    from harnessrl.heads.reader import ReaderHead

    torch.manual_seed(config["seed"])
    setup = ReaderHead().worker(config, Shard(TableReader(table)), None, 1, device)
    critic, in_update = setup.learners.critic, [0.0]
    update = critic.update

    def timed(*a):  # the update's share of the step (the rest: drawing rows, assembling the batch)
        sync(device)
        t = time.perf_counter()
        out = update(*a)
        sync(device)
        in_update[0] += time.perf_counter() - t
        return out

    critic.update = timed
    gen = torch.Generator().manual_seed(config["seed"])
    for _ in range(warmup):
        setup.step(gen)
    sync(device)
    start, done, metrics, in_update[0] = time.perf_counter(), 0, {}, 0.0
    while done < steps and time.perf_counter() - start < max_s:
        metrics = setup.step(gen)
        done += 1
    sync(device)
    took = time.perf_counter() - start
    return done / took, in_update[0] / took, metrics, critic.core


def score(folder: Path, config: dict, states, cands, device: str, max_s: float):
    """(states/s, scores) of the reader critic's weights in `folder`, loaded onto `device` as
    `Critic.load` loads them (`ReaderHead.load`)."""
    from harnessrl.heads.reader import ReaderHead, table_embed

    card = SimpleNamespace(head_config=config["network"], identity=SimpleNamespace(model_name=config["encoder_name"]))
    scorer, embed = ReaderHead().load(str(folder), card, device), table_embed(config["texts_dir"])
    assert scorer.device.type == device, (scorer.device, device)
    cfg = scorer.net.cfg
    f = np.zeros((sum(map(len, cands)), cfg.feature_dim), np.float32) if scorer.uses_features else None
    q = scorer._q(states[:64], cands[:64], f, embed)  # warm-up
    sync(device)
    start, n = time.perf_counter(), 0
    while n < len(states) and time.perf_counter() - start < max_s:
        q = scorer._q(states, cands, f, embed)
        n += len(states)
    sync(device)
    return n / (time.perf_counter() - start), q


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--pack", type=Path, help="gather --encoded's rows and --encoder's tokenizer here, then stop")
    p.add_argument("--encoded", type=Path, help="an encoded dataset folder (train.head: reader)")
    p.add_argument("--encoder", default="builtin:all-MiniLM-L6-v2")
    p.add_argument("--packed", type=Path, help="a folder written by --pack")
    p.add_argument("--devices", default="cpu,cuda", help="comma-separated; cuda is skipped where none is visible")
    p.add_argument("--steps", type=int, default=300, help="timed steps per variant (bounded by --max-s)")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--max-s", type=float, default=40.0, help="seconds per timed loop at most")
    p.add_argument("--score-states", type=int, default=1024)
    p.add_argument("--batch-size", type=int, help="states per step (default: train.reader.batch_size's)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.pack:
        if not args.encoded:
            p.error("--pack needs --encoded")
        pack(args.pack, args.encoded, args.encoder)
        return 0
    if not args.packed or not (args.packed / "rows.parquet").is_file():
        p.error("--packed FOLDER (written by --pack) is required")

    import pyarrow.parquet as pq
    import torch

    from harnessrl.heads.reader import ReaderHead, load_rows

    torch.set_num_threads(args.threads)
    devices = [d for d in args.devices.split(",") if d != "cuda" or torch.cuda.is_available()]
    table = pq.read_table(args.packed / "rows.parquet")
    held = load_rows([table.slice(0, args.score_states)])
    states, cands = list(held["s"]), [list(c) or [a] for c, a in zip(held["cand"], held["action"])]
    gpu = torch.cuda.get_device_name(0) if "cuda" in devices else None
    print(f"{table.num_rows} rows; devices {devices} ({gpu or 'no GPU'}); torch {torch.__version__}, "
          f"{args.threads} CPU threads; {platform.processor() or platform.machine()}", flush=True)
    variants = [("defaults", False, False), ("tokens", True, False)]
    results = []
    for name, tokens, bf16 in variants + ([("tokens, bfloat16", True, True)] if "cuda" in devices else []):
        config = loop_config(table, args.packed, tokens, bf16, args.batch_size)
        row = {"variant": name}
        nets = {}
        for device in devices if not bf16 else ["cuda"]:
            sps, share, metrics, nets[device] = train(config, table, device, args.steps, args.warmup, args.max_s)
            row[f"{device} steps/s"] = round(sps, 2)
            row[f"{device} update share"] = round(share, 2)
            row[f"{device} loss_q"] = round(float(metrics.get("loss_q", float("nan"))), 5)
            print(f"{name} on {device}: {sps:.2f} steps/s ({share:.0%} in the update), loss_q "
                  f"{row[f'{device} loss_q']}", flush=True)
        # one network (the first device's), saved, then loaded onto every device: the scores must agree
        folder = Path(tempfile.mkdtemp(prefix="reader-device-"))
        ReaderHead().save(str(folder), SimpleNamespace(net=next(iter(nets.values()))))
        scored = {}
        for device in devices:
            sps, scored[device] = score(folder, config, states, cands, device, args.max_s)
            row[f"{device} scored states/s"] = round(sps, 1)
        if len(scored) > 1:
            a, b = scored["cpu"], scored["cuda"]
            row["max |q_cpu - q_cuda|"] = float(np.abs(a - b).max())
            picks = [(int(np.argmax(a[i:i + len(c)])), int(np.argmax(b[i:i + len(c)])))
                     for i, c in zip(np.cumsum([0] + [len(c) for c in cands[:-1]]), cands)]
            row["same pick"] = float(np.mean([x == y for x, y in picks]))
            if not np.allclose(a, b, rtol=1e-3, atol=1e-3 * max(1.0, float(np.abs(a).max()))):
                print(f"FAIL: {name}: the scores differ between cpu and cuda by up to {row['max |q_cpu - q_cuda|']}")
                row["failed"] = True
        results.append(row)
    for row in results:  # the ratios, where both devices ran
        if "cpu steps/s" in row and "cuda steps/s" in row:
            row["cuda/cpu steps"] = round(row["cuda steps/s"] / row["cpu steps/s"], 2)
        if "cpu scored states/s" in row and "cuda scored states/s" in row:
            row["cuda/cpu scoring"] = round(row["cuda scored states/s"] / row["cpu scored states/s"], 2)
    print(json.dumps(results, indent=1))
    if args.json:
        args.json.write_text(json.dumps({"gpu": gpu, "threads": args.threads, "rows": table.num_rows,
                                         "torch": torch.__version__, "results": results}, indent=1))
    return 1 if any(r.get("failed") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
