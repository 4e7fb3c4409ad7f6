"""Encoding throughput on one corpus (issue 8), printed side by side:

  (a) naive     `model.encode` over every state, action and next-state text of every transition
                (three calls, as the seeds' snippets do), in this process, outside Ray
  (b) ceiling   one `model.encode` call over only the distinct texts (states, actions, next
                states and the untaken candidates the stage also embeds), outside Ray
  (c) stage     `harnessrl.pipelines.encode.encode` end to end: read the transitions, dedupe,
                encode on the Ray Data actor pool (actor start and model loads included),
                write `_texts/` and the encoded transitions
  (d) cached    (c) again with the persistent embedding cache filled (from (c)'s output)
  with --opt-precision P (bfloat16: the stage's opt-in CPU precision; float32 with --device cuda):
  (b') ceiling  (b) with the model at precision P
  (c') stage    (c) with `encoder.precision: P`

With --device cuda, (a) and (b) run on the GPU in float16 (what the stage's `precision: auto`
does on GPU actors), (c) runs GPU actors (--gpus-per-actor, default 1) and every figure comes
with the GPUs' utilisation (NVML, sampled with the CPU). --scale N makes the corpus N times
larger with N times the distinct texts (each copy's texts tagged with its copy number), so that
a GPU has enough to do.

then the stage's peak memory on a synthetic, highly repetitive corpus at 100k and 1M
transitions (rows sampled with replacement from the corpus's first --mem-source-rows
transitions, so distinct texts stay in the low thousands while rows reach 1M: encoding is
not what is measured there; the rows flowing through read, dedupe, attach and write are).

Same model and settings everywhere (MiniLM, --max-seq-length, --batch-size, float32 unless
said), so (a), (b) and (c) compute the same vectors. (a) and (b) get a model already loaded;
(c) pays for its actors' model loads. Every Ray part runs in a subprocess with its own local
Ray (loopback, --ray-cpus CPUs) and a time limit; its memory is the summed PSS of that
process tree (driver, raylet, GCS, workers, object store pages), sampled every 0.25 s.
Each figure comes with the share of the machine's CPU other processes used meanwhile:
on a shared machine, read it before the ratios.

    python bench/encode.py                          # a few minutes on 2 quiet cores
    python bench/encode.py --skip-memory --json /tmp/encode-bench.json
    python bench/encode.py --memory-only --mem-rows 100000,1000000 --mem-candidates 0
    python bench/encode.py --device cuda --scale 40 --batch-size 256 --skip-memory --skip-cached
    # --corpus builtin:twx-train --batch-size 32 --max-seq-length 128 --threads 2 --ray-cpus 2
    # --max-seconds S (per in-process method) --stage-timeout S (per Ray subprocess) --work-dir D
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

TICKS = os.sysconf("SC_CLK_TCK")
RENDER = {"window": 3, "max_chars": 1500, "tool_from": "first_word"}  # pipelines/quickstart.yaml


# ---- process-tree CPU and memory ---------------------------------------------------------------
def _parents() -> dict[int, int]:
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    out[int(entry)] = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    return out


def process_tree(root: int) -> list[int]:
    parents = _parents()
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo and len(found) < 10_000:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _cpu_ticks(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, ValueError, IndexError):
        return 0


def _system_ticks() -> tuple[int, int]:
    with open("/proc/stat") as fh:
        values = [int(v) for v in fh.readline().split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


class Monitor:
    """Peak summed PSS of a process tree and the CPU used by it and by everything else."""

    def __init__(self, root: int | None = None, interval: float = 0.25, memory: bool = True, gpu: bool = False):
        self.root, self.interval, self.memory = root or os.getpid(), interval, memory
        self.peak_kb, self.baseline_kb, self._ticks, self.peak_parts = 0, 0, {}, {}
        self.gpus = Gpus() if gpu else None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> int:
        total, parts = 0, {}
        for pid in process_tree(self.root):
            self._ticks[pid] = max(self._ticks.get(pid, 0), _cpu_ticks(pid))
            if self.memory:
                parts[pid] = _pss_kb(pid)
                total += parts[pid]
        if total > self.peak_kb:
            self.peak_kb, self.peak_parts = total, parts
        if self.gpus:
            self.gpus.sample()
        return total

    def top(self, n: int = 6) -> list[tuple[str, float]]:
        """The largest processes at the peak: (name, PSS MB)."""
        out = []
        for pid, kb in sorted(self.peak_parts.items(), key=lambda kv: -kv[1])[:n]:
            try:
                with open(f"/proc/{pid}/cmdline") as fh:
                    name = fh.read().replace("\0", " ").strip()[:60]
            except OSError:
                name = "(exited)"
            out.append((name, round(kb / 1024, 1)))
        return out

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self):
        self.baseline_kb = self._sample()
        self._start_ticks = dict(self._ticks)
        self._sys0, self._t0 = _system_ticks(), time.time()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=5)
        self._sample()
        self.wall = time.time() - self._t0
        busy1, total1 = _system_ticks()
        own = sum(t - self._start_ticks.get(pid, 0) for pid, t in self._ticks.items())
        elapsed = max(1, total1 - self._sys0[1])
        self.own_cpu_s = own / TICKS
        self.others_share = max(0.0, (busy1 - self._sys0[0] - own) / elapsed)

    def report(self) -> dict:
        out = {"wall_s": round(self.wall, 2), "own_cpu_s": round(self.own_cpu_s, 1),
               "others_cpu_share": round(self.others_share, 2), "peak_pss_mb": round(self.peak_kb / 1024, 1),
               "baseline_pss_mb": round(self.baseline_kb / 1024, 1)}
        return {**out, **self.gpus.report()} if self.gpus else out


class Gpus:
    """Utilisation and memory of every GPU, through NVML (nvidia-ml-py): the share of each
    sample period in which a kernel ran, and the memory in use."""

    def __init__(self):
        import pynvml

        pynvml.nvmlInit()
        self.nvml = pynvml
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        self.util: list[int] = []
        self.mem_mb = 0.0

    def sample(self) -> None:
        for h in self.handles:
            self.util.append(self.nvml.nvmlDeviceGetUtilizationRates(h).gpu)
            self.mem_mb = max(self.mem_mb, self.nvml.nvmlDeviceGetMemoryInfo(h).used / 2**20)

    def report(self) -> dict:
        util = self.util or [0]
        return {"gpu_util_mean": round(sum(util) / len(util), 1), "gpu_util_max": max(util),
                "gpu_mem_peak_mb": round(self.mem_mb), "gpus": len(self.handles)}


# ---- subprocess modes (each with its own local Ray) -----------------------------------------------
def _init_ray(cpus: int) -> None:
    import logging

    from harnessrl.ray_runtime import init_ray

    logging.basicConfig(level=logging.WARNING)
    init_ray(num_cpus=cpus)


def sub_prepare(args) -> None:
    """Ingest the corpus and build transitions with the quickstart's render settings."""
    _init_ray(args.ray_cpus)
    from harnessrl.config import RenderConfig
    from harnessrl.pipelines.ingest import ingest
    from harnessrl.pipelines.transitions import build_transitions
    from harnessrl.rewards import load_recipe

    work = Path(args.sub_dir)
    ingest([args.corpus], str(work / "ingest"))
    result = build_transitions(str(work / "ingest"), str(work / "transitions"), load_recipe("default"),
                               RenderConfig(**RENDER))
    print("RESULT " + json.dumps({"transitions": result.transitions}), flush=True)


def sub_stage(args) -> None:
    """Warm the local Ray up, then run the encode stage once under the monitor. Throughput runs
    sample CPU only (`--sub-memory 0`): reading every Ray process's PSS four times a second cost
    the driver ~40 CPU s of kernel time over a 2-minute run, a third of a core taken from the
    encoder actors (seen with py-spy), which (a) and (b) never paid."""
    _init_ray(args.ray_cpus)
    import ray

    from harnessrl.config import EncoderConfig
    from harnessrl.pipelines.encode import encode

    cfg = EncoderConfig(**json.loads(args.sub_cfg))
    ray.data.read_parquet(args.sub_transitions).count()  # workers started, files in the page cache
    time.sleep(2)
    with Monitor(memory=bool(int(args.sub_memory)), gpu=cfg.gpus_per_actor > 0) as mon:
        result = encode(args.sub_transitions, args.sub_dir, cfg)
    print("RESULT " + json.dumps({**mon.report(), "top": mon.top(), "result": result.summary()}), flush=True)


def run_sub(mode: str, timeout: float, script: str = __file__, **kw) -> dict:
    """Run `script --sub MODE --key value...` in its own session (so its Ray can be stopped with
    it) and return the JSON of its `RESULT ` line; bench/ingest.py runs its subprocesses with it."""
    cmd = [sys.executable, script, "--sub", mode]
    for key, value in kw.items():
        cmd += [f"--{key.replace('_', '-')}", str(value)]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # our own subprocess and its Ray
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        raise RuntimeError(f"{mode} did not finish within {timeout:.0f} s") from None
    for line in out.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{mode} failed (exit {proc.returncode}):\n{err[-3000:]}")


# ---- the in-process methods ----------------------------------------------------------------------
def timed_encode(model, lists: list[list[str]], batch_size: int, max_seconds: float, chunk: int = 8192,
                 gpu: bool = False) -> dict:
    """`model.encode` over each list (one call per list, or per `chunk` texts), bounded in time:
    past `max_seconds` the rest is skipped and the rate extrapolated (`complete: false`)."""
    done = total = 0
    with Monitor(memory=False, gpu=gpu) as mon:
        for texts in lists:
            total += len(texts)
            for start in range(0, len(texts), chunk):
                if mon_elapsed(mon) > max_seconds:
                    break
                part = texts[start:start + chunk]
                model.encode(part, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False)
                done += len(part)
    rep = mon.report()
    rate = done / max(rep["wall_s"], 1e-9)
    return {**rep, "texts": total, "encoded": done, "complete": done == total,
            "wall_s": round(rep["wall_s"] if done == total else total / max(rate, 1e-9), 2)}


def show(out: dict, key: str) -> None:
    """One method's figures as soon as they exist (a later failure keeps them in the log)."""
    print(f"  {key}: {json.dumps(out[key])[:400]}", flush=True)


def mon_elapsed(mon: Monitor) -> float:
    return time.time() - mon._t0


# ---- corpus ------------------------------------------------------------------------------------------
def load_texts(transitions: Path, max_candidates: int):
    import pyarrow.dataset as pads

    from harnessrl.transitions import untaken_candidates

    t = pads.dataset(str(transitions), format="parquet").to_table(
        columns=["state_text", "action_text", "next_state_text", "candidates"])
    states, actions, nexts = (t.column(c).to_pylist() for c in ("state_text", "action_text", "next_state_text"))
    distinct = dict.fromkeys(states + actions + nexts)
    for a, cands in zip(actions, t.column("candidates").to_pylist()):
        distinct.update(dict.fromkeys(untaken_candidates(a, cands, max_candidates)))
    return [states, actions, nexts], list(distinct)


def synthetic(source: Path, out: Path, rows: int, source_rows: int, seed: int = 0, per_file: int = 25_000) -> int:
    """`rows` transitions sampled with replacement from the first `source_rows` of `source`."""
    import pyarrow as pa
    import pyarrow.dataset as pads
    import pyarrow.parquet as pq

    base = pads.dataset(str(source), format="parquet").to_table()
    base = base.sort_by([("episode_id", "ascending"), ("step_idx", "ascending")]).slice(0, source_rows)
    rng = np.random.default_rng(seed)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for k, start in enumerate(range(0, rows, per_file)):
        n = min(per_file, rows - start)
        part = base.take(pa.array(rng.integers(0, base.num_rows, n)))
        part = part.set_column(part.schema.get_field_index("episode_id"), "episode_id",
                               pa.array([f"syn-{start + i:07d}" for i in range(n)]))
        part = part.set_column(part.schema.get_field_index("step_idx"), "step_idx", pa.array(np.zeros(n, np.int32)))
        pq.write_table(part, out / f"part-{k:04d}.parquet", compression="zstd")
    return rows


def scaled(source: Path, out: Path, copies: int) -> Path:
    """`copies` copies of the transitions under `out`, each copy's texts (states, actions, next
    states, candidates) and episode ids tagged with its number: the same length distribution and
    repetition within a copy, `copies` times the rows and the distinct texts."""
    import pyarrow as pa
    import pyarrow.dataset as pads
    import pyarrow.parquet as pq

    marker = out / "_scaled.json"
    if marker.exists() and json.loads(marker.read_text()) == {"copies": copies}:
        return out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    base = pads.dataset(str(source), format="parquet").to_table()
    cols = {c: base.column(c).to_pylist() for c in ("episode_id", "state_text", "action_text", "next_state_text")}
    cands = base.column("candidates").to_pylist()
    for k in range(copies):
        tag = f"[{k}] "
        part = base
        for c, values in cols.items():
            new = [v if v is None else f"{v}#{k}" if c == "episode_id" else tag + v for v in values]
            part = part.set_column(part.schema.get_field_index(c), c, pa.array(new, pa.string()))
        part = part.set_column(part.schema.get_field_index("candidates"), "candidates",
                               pa.array([row and [tag + x for x in row] for row in cands], base.schema.field("candidates").type))
        pq.write_table(part, out / f"part-{k:04d}.parquet", compression="zstd")
    marker.write_text(json.dumps({"copies": copies}))
    return out


# ---- main -----------------------------------------------------------------------------------------
def main() -> None:
    from harnessrl.precision import COMPUTE, normalise

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default="builtin:twx-train")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-seq-length", type=int, default=128)
    ap.add_argument("--max-candidates", type=int, default=16)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="torch threads of (a) and (b)")
    ap.add_argument("--ray-cpus", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--max-seconds", type=float, default=600, help="per in-process method; the rest is extrapolated")
    ap.add_argument("--stage-timeout", type=float, default=900, help="per Ray subprocess")
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--memory-only", action="store_true", help="only the stage's peak memory at --mem-rows")
    ap.add_argument("--skip-cached", action="store_true")
    ap.add_argument("--mem-rows", default="100000,1000000")
    ap.add_argument("--mem-source-rows", type=int, default=400)
    ap.add_argument("--mem-candidates", type=int, default=0, help="untaken candidates embedded per row in the memory runs")
    ap.add_argument("--opt-precision", default=None, type=normalise, choices=COMPUTE,
                    help="also run the ceiling and the stage at this precision (bfloat16: CPU; float32: --device cuda)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="cuda: (a)/(b) on the GPU in float16, (c) on GPU actors")
    ap.add_argument("--gpus-per-actor", type=float, default=None, help="(c) with --device cuda (default 1)")
    ap.add_argument("--scale", type=int, default=1, help="N copies of the corpus with distinct texts (see above)")
    ap.add_argument("--work-dir", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--sub", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--sub-dir", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--sub-transitions", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--sub-cfg", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--sub-memory", default="1", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.sub == "prepare":
        return sub_prepare(args)
    if args.sub == "stage":
        return sub_stage(args)

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="harnessrl-bench-encode-"))
    work.mkdir(parents=True, exist_ok=True)
    marker = work / "_corpus.json"
    spec = {"corpus": args.corpus, "render": RENDER}
    if not (marker.exists() and json.loads(marker.read_text()) == spec):
        print(f"preparing transitions of {args.corpus} in {work} ...", flush=True)
        run_sub("prepare", args.stage_timeout, corpus=args.corpus, ray_cpus=args.ray_cpus, sub_dir=work)
        marker.write_text(json.dumps(spec))
    transitions = work / "transitions"
    if args.scale > 1:
        transitions = scaled(transitions, work / f"transitions-x{args.scale}", args.scale)
    gpu = args.device == "cuda"
    if args.opt_precision and (args.opt_precision == "float32") != gpu:
        ap.error("--opt-precision bfloat16 is for --device cpu, float32 for --device cuda")
    out: dict = {"corpus": args.corpus, "batch_size": args.batch_size, "max_seq_length": args.max_seq_length,
                 "threads": args.threads, "ray_cpus": args.ray_cpus, "cpus": os.cpu_count(), "scale": args.scale}
    cfg = {"batch_size": args.batch_size, "max_seq_length": args.max_seq_length, "max_candidates": args.max_candidates}
    if gpu:
        cfg["gpus_per_actor"] = args.gpus_per_actor or 1.0
    if not args.memory_only:
        throughput(args, work, transitions, cfg, out)
    if not args.skip_memory:
        out["memory"] = []
        for rows in [int(r) for r in args.mem_rows.split(",") if r]:
            print(f"memory: {rows} synthetic transitions ...", flush=True)
            syn = work / f"synthetic-{rows}"
            synthetic(transitions, syn, rows, args.mem_source_rows)
            mcfg = {**cfg, "max_candidates": args.mem_candidates, "dtype": "float16"}
            res = run_sub("stage", args.stage_timeout, ray_cpus=args.ray_cpus, sub_dir=work / f"encoded-{rows}",
                          sub_transitions=syn, sub_cfg=json.dumps(mcfg))
            out["memory"].append({"rows": rows, **res})
            shutil.rmtree(work / f"encoded-{rows}", ignore_errors=True)
            shutil.rmtree(syn, ignore_errors=True)
    print_report(out)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    if not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)


def throughput(args, work: Path, transitions: Path, cfg: dict, out: dict) -> None:
    """(a)-(d) into `out`."""
    gpu = args.device == "cuda"
    lists, distinct = load_texts(transitions, args.max_candidates)
    n_rows, n_naive = len(lists[0]), sum(len(x) for x in lists)
    print(f"corpus {args.corpus}: {n_rows} transitions, {n_naive} state/action/next-state texts, "
          f"{len(distinct)} distinct texts (with up to {args.max_candidates} untaken candidates per step)", flush=True)

    import torch

    from harnessrl.encoders import load_encoder

    torch.set_num_threads(args.threads)
    model, identity = load_encoder(device=args.device, max_seq_length=args.max_seq_length)
    if gpu:
        model.half()  # as the stage's GPU actors do (precision: auto)
    model.encode(distinct[:64], batch_size=args.batch_size, show_progress_bar=False)  # warm-up
    out.update({"transitions": n_rows, "naive_texts": n_naive, "distinct_texts": len(distinct),
                "encoder": json.loads(identity.to_json()), "device": torch.cuda.get_device_name(0) if gpu else "cpu"})

    print("(a) naive ...", flush=True)
    out["a_naive"] = timed_encode(model, lists, args.batch_size, args.max_seconds, gpu=gpu)
    show(out, "a_naive")
    print("(b) ceiling ...", flush=True)
    out["b_ceiling"] = timed_encode(model, [distinct], args.batch_size, args.max_seconds, gpu=gpu)
    show(out, "b_ceiling")
    if args.opt_precision:
        import copy

        from harnessrl.encoders import set_precision

        if gpu:
            opt = load_encoder(device="cuda", max_seq_length=args.max_seq_length)[0]
        else:
            opt = set_precision(copy.deepcopy(model), args.opt_precision, "cpu")
        opt.encode(distinct[:64], batch_size=args.batch_size, show_progress_bar=False)
        print(f"(b') ceiling at {args.opt_precision} ...", flush=True)
        out["b_opt"] = timed_encode(opt, [distinct], args.batch_size, args.max_seconds, gpu=gpu)
        show(out, "b_opt")
        probe = distinct[:: max(1, len(distinct) // 1000)]
        ref = model.encode(probe, batch_size=args.batch_size, convert_to_numpy=True, show_progress_bar=False)
        got = opt.encode(probe, batch_size=args.batch_size, convert_to_numpy=True, show_progress_bar=False)
        cos = (ref * got).sum(1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(got, axis=1)
        out["opt_precision"] = {"precision": args.opt_precision, "texts": len(probe),
                                "cosine_min": round(float(cos.min()), 5), "cosine_mean": round(float(cos.mean()), 5)}
        del opt
    del model
    print("(c) harnessrl encode stage ...", flush=True)
    out["c_stage"] = run_sub("stage", args.stage_timeout, ray_cpus=args.ray_cpus, sub_dir=work / "encoded",
                             sub_transitions=transitions, sub_cfg=json.dumps(cfg), sub_memory=0)
    show(out, "c_stage")
    if args.opt_precision:
        print(f"(c') harnessrl encode stage at {args.opt_precision} ...", flush=True)
        out["c_opt"] = run_sub("stage", args.stage_timeout, ray_cpus=args.ray_cpus, sub_dir=work / "encoded-opt",
                               sub_transitions=transitions,
                               sub_cfg=json.dumps({**cfg, "precision": args.opt_precision}), sub_memory=0)
        show(out, "c_opt")
        shutil.rmtree(work / "encoded-opt", ignore_errors=True)
    if not args.skip_cached:
        print("(d) stage with a filled embedding cache ...", flush=True)
        cache_root = work / "cache"
        shutil.rmtree(cache_root, ignore_errors=True)
        fill_cache(work / "encoded" / "_texts", str(cache_root), identity)
        out["d_cached"] = run_sub("stage", args.stage_timeout, ray_cpus=args.ray_cpus, sub_dir=work / "encoded-cached",
                                  sub_transitions=transitions, sub_cfg=json.dumps({**cfg, "cache": str(cache_root)}),
                                  sub_memory=0)
        show(out, "d_cached")


def fill_cache(texts_dir: Path, root: str, identity) -> None:
    import pyarrow.dataset as pads

    from harnessrl.embedding_cache import EmbeddingCache

    table = pads.dataset(str(texts_dir), format="parquet").to_table(columns=["text_hash", "emb"])
    cache = EmbeddingCache(root, identity, "float32").open()
    cache.put(table.column("text_hash").combine_chunks(), table.column("emb").combine_chunks(), run="bench")


def print_report(out: dict) -> None:
    if "a_naive" in out:
        print_throughput(out)
    if out.get("memory"):
        print_memory(out)


def print_throughput(out: dict) -> None:
    n_naive, n_distinct = out["naive_texts"], out["distinct_texts"]
    rows = [("(a) naive: model.encode per transition", out["a_naive"], n_naive, None),
            ("(b) ceiling: distinct texts, one call", out["b_ceiling"], n_naive, n_distinct),
            ("(c) harnessrl encode stage, end to end", out["c_stage"], n_naive, n_distinct)]
    if "b_opt" in out:
        p = out["opt_precision"]["precision"]
        rows.insert(2, (f"(b') ceiling at {p}", out["b_opt"], n_naive, n_distinct))
        rows.append((f"(c') stage at {p}", out["c_opt"], n_naive, n_distinct))
    if "d_cached" in out:
        rows.append(("(d) stage, embedding cache filled", out["d_cached"], n_naive, n_distinct))
    print()
    print(f"corpus {out['corpus']}: {out['transitions']} transitions, {n_naive} state/action/next-state texts, "
          f"{n_distinct} distinct texts; MiniLM max_seq_length {out['max_seq_length']}, batch {out['batch_size']}, "
          f"{out['cpus']} CPUs (torch threads {out['threads']} for a/b; Ray {out['ray_cpus']} CPUs for c/d); "
          f"device {out.get('device', 'cpu')}, corpus x{out.get('scale', 1)}")
    gpu = out.get("device", "cpu") != "cpu"
    print(f"{'method':42s} {'encoded':>8s} {'wall s':>8s} {'texts/s':>9s} {'distinct/s':>11s} {'CPU s':>8s} "
          f"{'others CPU':>10s}" + (f" {'GPU util mean/max':>18s} {'GPU MB':>7s}" if gpu else ""))
    for name, rep, texts, dist in rows:
        wall = rep["wall_s"]
        encoded = rep.get("encoded", rep.get("result", {}).get("texts_encoded", ""))
        mark = "" if rep.get("complete", True) else " (time limit: wall extrapolated from the encoded part)"
        d = f"{dist / wall:11.1f}" if dist else f"{'':>11s}"
        g = f" {rep['gpu_util_mean']:12.0f}% / {rep['gpu_util_max']:3d}% {rep['gpu_mem_peak_mb']:7d}" if "gpu_util_mean" in rep else ""
        print(f"{name:42s} {encoded!s:>8s} {wall:8.1f} {texts / wall:9.1f} {d} {rep['own_cpu_s']:8.0f} "
              f"{rep['others_cpu_share']:9.0%}{g}{mark}")
    print("texts/s: the corpus's state/action/next-state texts per second of wall time; distinct/s: its distinct "
          "texts per second; CPU s: CPU time of the method's processes (for (c)/(d) the whole local Ray); "
          "others CPU: share of the machine's CPU that other processes used meanwhile")
    for key in ("c_stage", "c_opt"):
        if key in out:
            r = out[key]["result"]
            print(f"{key}: phases (s) {r['phases']}; {r['actors']} actor(s) x {r['cpus_per_actor']:g} CPU")
    a, b, c = out["a_naive"]["wall_s"], out["b_ceiling"]["wall_s"], out["c_stage"]["wall_s"]
    out["ratios"] = {"a_over_c_wall": round(a / c, 2), "c_over_b_distinct_rate": round(b / c, 2)}
    print(f"(c) vs (a): {a / c:.2f}x faster in wall time (target >= 2.5x)")
    print(f"(c) vs (b): {b / c:.2f}x of the ceiling's distinct texts/s (target >= 0.85x)")
    if "c_opt" in out:
        p, co = out["opt_precision"], out["c_opt"]["wall_s"]
        out["ratios"].update(a_over_c_opt_wall=round(a / co, 2), c_opt_over_b_distinct_rate=round(b / co, 2),
                             c_opt_over_b_opt_distinct_rate=round(out["b_opt"]["wall_s"] / co, 2))
        print(f"(c') {p['precision']} vs (a): {a / co:.2f}x faster in wall time; {b / co:.2f}x of (b)'s "
              f"distinct texts/s, {out['b_opt']['wall_s'] / co:.2f}x of (b')'s; cosine between (b)'s and (b')'s "
              f"vectors over {p['texts']} texts: min {p['cosine_min']:.4f}, mean {p['cosine_mean']:.4f}")
    if "d_cached" in out:
        print(f"(d) vs (c): {c / out['d_cached']['wall_s']:.2f}x faster with every text in the cache "
              f"({out['d_cached']['result']['texts_cached']} cached, {out['d_cached']['result']['texts_encoded']} encoded)")


def print_memory(out: dict) -> None:
    """The memory runs' table and the 1M / 100k ratio."""
    print()
    print("stage memory, synthetic corpus (rows sampled from a few hundred transitions; float16 columns):")
    print(f"{'rows':>9s} {'distinct':>9s} {'wall s':>8s} {'peak PSS MB':>12s} {'Ray idle MB':>12s} "
          f"{'stage MB':>9s} {'driver RSS MB':>14s}")
    for m in out["memory"]:
        r = m["result"]
        print(f"{m['rows']:9d} {r['texts_distinct']:9d} {m['wall_s']:8.1f} {m['peak_pss_mb']:12.0f} "
              f"{m['baseline_pss_mb']:12.0f} {m['peak_pss_mb'] - m['baseline_pss_mb']:9.0f} "
              f"{r['driver_peak_rss_mb']:14.0f}")
    if len(out["memory"]) >= 2:
        lo, hi = out["memory"][0], out["memory"][-1]
        ratio = hi["peak_pss_mb"] / lo["peak_pss_mb"]
        stage = (hi["peak_pss_mb"] - hi["baseline_pss_mb"]) / max(1e-9, lo["peak_pss_mb"] - lo["baseline_pss_mb"])
        out.setdefault("ratios", {}).update(memory_peak=round(ratio, 2), memory_stage=round(stage, 2))
        print(f"peak memory {hi['rows']} vs {lo['rows']} rows: {ratio:.2f}x (whole Ray tree), "
              f"{stage:.2f}x (above idle Ray) (target <= 1.25x)")


if __name__ == "__main__":
    main()
