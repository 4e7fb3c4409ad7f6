"""Training on corpora larger than memory (issue 26): the train job (`jobs.train.train`, frozen head or
`--head reader`, Ray Train, the pipeline's defaults) at 100k and 1M transitions, side by side in one run:

  stream   `train.replay: stream` (the default): each worker streams its shard through a local
           shuffle buffer and gathers the vectors its rows reference, a batch at a time
  memory   `train.replay: memory`, the path before issue 26: each worker gathers its whole shard's
           vectors into memory, then samples minibatches (run at the smaller size only: at 1M it
           needs about 20 GB)

Each run reads the rows where `train.rows: auto` puts them (the object store when they take at
most a quarter of it: both sizes on a 24 GB machine); at the largest size one more run streams
them from their Parquet files (`train.rows: files`, the path of a corpus beyond the store).

Per run, in a fresh process (its own local Ray): the peak PSS of the process and every process
under it (the driver, Ray's GCS, raylet, object store and workers; by process name at the
peak), sampled every 0.25 s, and
the train job's steps/s over its last log window. Besides, the encoded data's bytes per
transition on disk in both layouts (`encoder.vectors: references | copies`) for the same rows.

The data are synthetic encoded datasets written as the encode stage writes them (the bundled
MiniLM's identity, 384-d float32 vectors): episodes of 20 steps, 10 untaken candidates per step
with their features, 8 tools, task groups of 10 episodes; every row references its texts in a
distinct-text table of --distinct texts (the same table at every size: the table follows the
distinct texts, the rows follow the transitions, and this measures the rows). For `--head reader`
the rows also hold what that head reads: each state as four segments (task, observation, last
action, one result) and the action and candidate texts, all texts of the same table.

    python bench/train.py --scale                       # the same as:
    python bench/train_scale.py                         # 100k and 1M, 300 steps each (~10 min, 2 cores)
    python bench/train_scale.py --rows 20000,200000 --steps 100 --json /tmp/scale.json
    python bench/train_scale.py --head reader           # the reader head (the default critic)

Ray binds 127.0.0.1; nothing is logged to MLflow.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

EPISODE_STEPS, GROUP_EPISODES, CANDIDATES, TOOLS = 20, 10, 10, 8
FILE_ROWS = 100_000  # rows per Parquet file of the synthetic data


# ---- synthetic encoded data ----------------------------------------------------------------------
SEGMENT_ROLES = ("task", "observation", "last", "result")  # each synthetic state's segments (the reader's rows)


def _texts(keys: np.ndarray) -> pa.Array:
    import pyarrow as pa

    return pa.array([f"text {k}" for k in keys])


def _segments(n: int, distinct: int, rng):
    """n states as the reader head's rows hold them: segments (role, age, text) naming texts of the table."""
    import pyarrow as pa

    k = len(SEGMENT_ROLES)
    struct = pa.StructArray.from_arrays(
        [pa.array(np.tile(np.array(SEGMENT_ROLES), n)), pa.array(np.tile(np.array([0, 0, 0, 1], np.int32), n)),
         _texts(rng.integers(0, distinct, n * k))], names=["role", "age", "text"])
    return pa.ListArray.from_arrays(pa.array(np.arange(0, n * k + 1, k, dtype=np.int32)), struct)


def _table(start: int, n: int, distinct: int, rng, head: str = "frozen"):
    """Rows start..start+n of the synthetic corpus in the reference layout (for the reader head: with
    the state segments, the action and candidate texts its rows name)."""
    import pyarrow as pa

    from harnessrl.features import FEATURE_NAMES

    f = len(FEATURE_NAMES)
    i = np.arange(start, start + n)
    episode, step = i // EPISODE_STEPS, i % EPISODE_STEPS
    done = step == EPISODE_STEPS - 1
    success = (episode % 3) != 0
    reward = np.where(done, np.where(success, 1.0, -1.0), -0.01).astype(np.float32)

    def lists(values: np.ndarray, width: int) -> pa.ListArray:
        return pa.ListArray.from_arrays(pa.array(np.arange(0, len(values) + 1, width, dtype=np.int32)), pa.array(values))

    tools = np.array([f"tool{k}" for k in range(TOOLS)])
    table = pa.table({
        "episode_id": pa.array([f"ep{e:08d}" for e in episode]), "step_idx": pa.array(step.astype(np.int32)),
        "group_id": pa.array([f"task{e // GROUP_EPISODES:07d}" for e in episode]),
        "tool": pa.array(tools[rng.integers(0, TOOLS, n)]),
        "defined_tools": pa.array([list(tools)] * n, pa.list_(pa.string())),
        "reward": pa.array(reward), "done": pa.array(done), "outcome_success": pa.array(success),
        "return_to_go": pa.array(np.where(success, 1.0, -1.0) - 0.01 * (EPISODE_STEPS - 1 - step)),
        "features": lists(rng.random(n * f, np.float32), f),
        "candidate_features": pa.ListArray.from_arrays(
            pa.array(np.arange(0, n * CANDIDATES + 1, CANDIDATES, dtype=np.int32)),
            lists(rng.random(n * CANDIDATES * f, np.float32), f)),
        "state_ref": pa.array(rng.integers(0, distinct, n, dtype=np.int32)),
        "action_ref": pa.array(rng.integers(0, distinct, n, dtype=np.int32)),
        "next_state_ref": pa.array(rng.integers(0, distinct, n, dtype=np.int32)),
        "candidate_ref": lists(rng.integers(0, distinct, n * CANDIDATES, dtype=np.int32), CANDIDATES),
    })
    if head == "reader":  # the texts of the references, and the segments of the states
        table = table.append_column("action_text", _texts(table.column("action_ref").to_numpy()))
        table = table.append_column("candidates", pa.ListArray.from_arrays(
            table.column("candidate_ref").chunk(0).offsets, _texts(table.column("candidate_ref").chunk(0).values)))
        table = table.append_column("state_segments", _segments(n, distinct, rng))
        table = table.append_column("next_state_segments", _segments(n, distinct, rng))
    return table


def write_dataset(out: Path, rows: int, distinct: int, seed: int, layout: str = "references",
                  head: str = "frozen") -> Path:
    """A synthetic encoded dataset at `out` (skipped when one of that size is already there)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from harnessrl import encoded_data
    from harnessrl.encoders import encoder_identity, text_hash

    meta = encoded_data.read_meta(str(out)) if encoded_data.exists(str(out)) else {}
    if meta.get("rows") == rows and meta.get("head", "frozen") == head:
        return out
    identity = encoder_identity()
    rng = np.random.default_rng(seed)
    vectors = rng.normal(size=(distinct, identity.dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    keys = np.sort(np.array([text_hash(f"text {k}") for k in range(distinct)], dtype="S32"))  # the table's order
    (out / "_texts").mkdir(parents=True, exist_ok=True)
    (out / "data").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"text_hash": pa.array(keys.astype(str)),
                             "emb": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), identity.dim)}),
                   out / "_texts" / "part-00000.parquet", compression="zstd")
    for k, start in enumerate(range(0, rows, FILE_ROWS)):
        table = _table(start, min(FILE_ROWS, rows - start), distinct, rng, head)
        if layout == "copies":
            table = encoded_data.with_vectors(table, vectors)
        pq.write_table(table, out / "data" / f"part-{k:05d}.parquet", compression="zstd", row_group_size=4096)
    encoded_data.write_meta(str(out), {"encoder": json.loads(identity.to_json()), "rows": rows, "dtype": "float32",
                                       "vectors": layout, "texts_distinct": distinct, "synthetic": True,
                                       "head": head})
    return out


def disk_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*.parquet"))


# ---- one measured run (a child process) ----------------------------------------------------------
def _pss_tree(root: int) -> dict[str, list[int]]:
    """{process name: [PSS bytes, processes, of which anonymous (heap), of which shared memory (the
    object store's pages)]} of `root` and every process below it (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(d))
            except OSError:
                continue
    by_name: dict[str, list[int]] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            with open(f"/proc/{pid}/smaps_rollup") as fh:
                kinds = {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in fh if ":" in line)
                         if k in ("Pss", "Pss_Anon", "Pss_Shmem")}
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                name = _process_name(fh.read().split(b"\0"), pid == root)
        except OSError:
            continue
        if "Pss" not in kinds:
            continue
        entry = by_name.setdefault(name, [0, 0, 0, 0])
        entry[0] += kinds["Pss"]
        entry[1] += 1
        entry[2] += kinds.get("Pss_Anon", 0)
        entry[3] += kinds.get("Pss_Shmem", 0)
    return by_name


def _process_name(argv: list[bytes], root: bool) -> str:
    """A short name for a process of the tree: the driver, a Ray worker by what it runs, a Ray daemon."""
    if root:
        return "driver"
    first = argv[0].decode(errors="replace")
    if first.startswith("ray::"):  # a Ray worker names itself by its task or actor
        return first.split(".")[0].split("(")[0].strip()
    return os.path.basename(first.split()[0]) if first else "?"


class PeakPss:
    def __init__(self, every: float = 0.25):
        self.every, self.peak, self.at_peak, self._stop = every, 0, {}, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            by_name = _pss_tree(os.getpid())
            total = sum(entry[0] for entry in by_name.values())
            if total > self.peak:
                self.peak, self.at_peak = total, by_name
            self._stop.wait(self.every)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def child(args) -> int:
    from harnessrl.config import TrainConfig
    from harnessrl.encoded_data import read_meta
    from harnessrl.jobs.train import rows_in, train
    from harnessrl.model_card import ModelCard
    from harnessrl.ray_runtime import init_ray

    work = Path(tempfile.mkdtemp(prefix="train-scale-"))
    with PeakPss() as pss:
        t0 = time.time()
        init_ray()
        cfg = TrainConfig(head=args.head, steps=args.steps, batch_size=args.batch, replay=args.child,
                          log_every=max(1, args.steps // 3), checkpoint_every=args.steps, rows=args.rows_in)
        where = rows_in(args.encoded, cfg.rows)
        card = ModelCard(head_config={}, encoder=read_meta(args.encoded)["encoder"], render={})
        result = train(args.encoded, str(work / "train"), cfg, f"scale-{args.child}", str(work / "model"), card)
        seconds = time.time() - t0
    Path(args.out).write_text(json.dumps({
        "peak_pss_mb": round(pss.peak / 2**20, 1), "rows_in": where,
        "at_peak_mb": {k: round(v[0] / 2**20, 1) for k, v in sorted(pss.at_peak.items(), key=lambda kv: -kv[1][0])},
        "processes_at_peak": {k: v[1] for k, v in pss.at_peak.items()},
        "anon_at_peak_mb": {k: round(v[2] / 2**20, 1) for k, v in pss.at_peak.items()},
        "shmem_at_peak_mb": {k: round(v[3] / 2**20, 1) for k, v in pss.at_peak.items()},
        "steps_per_s": result.metrics.get("steps_per_s"),
        "train_seconds": round(result.seconds, 1), "seconds": round(seconds, 1),
        "load_seconds": result.metrics.get("load_seconds"), "loss_q": result.metrics.get("loss_q")}))
    return 0


def measure(mode: str, encoded: Path, args, where: str = "auto") -> dict:
    out = Path(tempfile.mkstemp(suffix=".json")[1])
    cmd = [sys.executable, __file__, "--child", mode, "--encoded", str(encoded), "--steps", str(args.steps),
           "--batch", str(args.batch), "--rows-in", where, "--head", args.head, "--out", str(out)]
    load = os.getloadavg()[0]
    proc = subprocess.run(cmd, timeout=args.max_run_s)
    if proc.returncode:
        raise SystemExit(f"train_scale: the {mode} run on {encoded} failed (exit {proc.returncode})")
    return {**json.loads(out.read_text()), "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/train_scale.py", description=__doc__.split("\n")[0])
    p.add_argument("--rows", default="100000,1000000", help="comma-separated corpus sizes (transitions)")
    p.add_argument("--distinct", type=int, default=50_000, help="texts in the distinct-text table")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=256, help="the frozen head's batch (the reader's: train.reader's)")
    p.add_argument("--head", choices=("frozen", "reader"), default="frozen",
                   help="the critic head trained (reader: rows with state segments, texts looked up in the table)")
    p.add_argument("--layout-rows", type=int, default=20_000, help="rows written in both layouts for the disk size")
    p.add_argument("--no-memory", action="store_true", help="skip the replay: memory baseline")
    p.add_argument("--no-files", action="store_true",
                   help="skip the run at the largest size with the rows streamed from their files (train.rows: files)")
    p.add_argument("--max-run-s", type=float, default=1800, help="a measured run is stopped after this long")
    p.add_argument("--work-dir")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json")
    p.add_argument("--child", choices=("stream", "memory"), help=argparse.SUPPRESS)
    p.add_argument("--encoded", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--rows-in", default="auto", choices=("auto", "store", "files"),
                   help="train.rows of the streaming runs (auto: the job's own choice per size)")
    args = p.parse_args(argv)
    if args.child:
        return child(args)

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="train-scale-data-"))
    sizes = sorted(int(x) for x in args.rows.split(","))
    disk = {}
    for layout in ("references", "copies"):
        d = write_dataset(work / f"layout-{layout}", args.layout_rows, args.distinct, args.seed, layout)
        disk[layout] = disk_bytes(d / "data") / args.layout_rows
    print(f"[scale] encoded data on disk per transition: copies {disk['copies'] / 1e3:.2f} KB, references "
          f"{disk['references'] / 1e3:.2f} KB ({disk['copies'] / disk['references']:.1f}x smaller); the distinct-text "
          f"table {disk_bytes(work / 'layout-references' / '_texts') / 1e6:.1f} MB once", flush=True)
    rows = []
    for n in sizes:
        d = write_dataset(work / f"rows-{n}-{args.head}", n, args.distinct, args.seed, head=args.head)
        runs = [("stream", args.rows_in)] + ([("memory", "auto")] if n == sizes[0] and not args.no_memory else []) \
            + ([("stream", "files")] if n == sizes[-1] and len(sizes) > 1 and not args.no_files
               and args.rows_in != "files" else [])
        for mode, where in runs:
            print(f"[scale] {n:,} transitions, replay {mode}, rows {where} (uptime load {os.getloadavg()[0]:.2f}) ...",
                  flush=True)
            r = {"rows": n, "replay": mode, "setting": where, **measure(mode, d, args, where)}
            rows.append(r)
            print(f"[scale] {n:,} {mode} (rows in {r['rows_in']}): peak PSS {r['peak_pss_mb']:,.0f} MB, "
                  f"{r['steps_per_s']:.1f} steps/s, {r['seconds']:.0f} s; at the peak (MB, of which heap/object "
                  f"store): " + ", ".join(
                      f"{k} x{r['processes_at_peak'][k]} {v:,.0f} ({r['anon_at_peak_mb'][k]:,.0f}/"
                      f"{r['shmem_at_peak_mb'][k]:,.0f})" for k, v in r["at_peak_mb"].items() if v >= 50),
                  flush=True)
    print("\n| head | transitions | replay | rows in | peak PSS (MB) | steps/s | train s | load avg before/after |\n"
          "|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {args.head} | {r['rows']:,} | {r['replay']} | {r['rows_in']}{'' if r['setting'] == 'auto' else ' (set)'} | "
              f"{r['peak_pss_mb']:,.0f} | {r['steps_per_s']:.1f} | {r['train_seconds']:.0f} | "
              f"{r['load_before']}/{r['load_after']} |")
    stream = {r["rows"]: r for r in rows if r["replay"] == "stream" and r["setting"] == args.rows_in}
    ratios = {}
    if len(sizes) > 1:
        ratios["pss_largest_over_smallest"] = stream[sizes[-1]]["peak_pss_mb"] / stream[sizes[0]]["peak_pss_mb"]
        print(f"peak PSS at {sizes[-1]:,} / at {sizes[0]:,} (stream, train.rows {args.rows_in}): "
              f"{ratios['pss_largest_over_smallest']:.2f}x (target <= 1.25)")
        files = [r for r in rows if r["setting"] == "files" and args.rows_in != "files"]
        if files:
            ratios["pss_largest_files_over_smallest"] = files[0]["peak_pss_mb"] / stream[sizes[0]]["peak_pss_mb"]
            print(f"peak PSS at {sizes[-1]:,} with the rows streamed from their files (train.rows: files) / at "
                  f"{sizes[0]:,}: {ratios['pss_largest_files_over_smallest']:.2f}x")
    memory = [r for r in rows if r["replay"] == "memory"]
    if memory:
        ratios["stream_over_memory_steps"] = stream[sizes[0]]["steps_per_s"] / memory[0]["steps_per_s"]
        ratios["memory_over_stream_pss"] = memory[0]["peak_pss_mb"] / stream[sizes[0]]["peak_pss_mb"]
        print(f"steps/s at {sizes[0]:,}, stream / memory: {ratios['stream_over_memory_steps']:.2f}x (target >= 0.8); "
              f"peak PSS memory / stream {ratios['memory_over_stream_pss']:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"argv": sys.argv[1:], "disk_bytes_per_transition": disk,
                                               "rows": rows, "ratios": ratios}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
