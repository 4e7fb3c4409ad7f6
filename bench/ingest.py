"""Ingest throughput and peak memory at 100k and 1M steps (issue 7): does ingest stream?

Generates synthetic native-format corpora (DESIGN §4) of each size into a temporary folder:
multi-step episodes (3-40 steps) of a tool-calling agent with a task, a system prompt and tool
definitions; most steps call one or two tools with JSON arguments and get a result of a few
hundred characters, about 5% of the calls fail (`is_error`), some steps carry a reward, `info`
(tests_passed, syntax_ok) and candidates; the outcome sits on the record; 0.1% of the lines are
broken (quarantined). Same generator and seed at every size: the 1M corpus is the 100k one's
distribution, ten times longer.

Each size is ingested by `harnessrl.pipelines.ingest.ingest` in a subprocess of its own with a
local Ray (loopback, --ray-cpus CPUs), warmed up before the clock starts. The figure is the
summed PSS of that process tree (driver, raylet, GCS, Ray workers, object store pages),
sampled every 0.25 s by bench/encode.py's Monitor, plus the driver's own peak RSS. Printed:
steps/s, peak memory per size, and the ratio of the largest size's peak to the smallest's
(target: at most 1.25). Every subprocess has a time limit (--timeout).

    python bench/ingest.py                          # 100k and 1M steps
    python bench/ingest.py --sizes 100000 --json /tmp/ingest-bench.json
    # --ray-cpus 2 --timeout S (per size) --work-dir D (kept; default: a temp dir, removed)
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from encode import Monitor  # noqa: E402  (bench/encode.py: process-tree PSS monitor)
from encode import run_sub as encode_run_sub  # noqa: E402

TOOLS = [
    {"name": "search", "description": "search the repository", "parameters": {"q": {"type": "string"}}},
    {"name": "read_file", "description": "read a file", "parameters": {"path": {"type": "string"}}},
    {"name": "edit_file", "description": "replace text in a file", "parameters": {}},
    {"name": "run_tests", "description": "run the test suite", "parameters": {}},
    {"name": "list_dir", "description": "list a folder", "parameters": {}},
    {"name": "ask_user", "description": "ask a question", "parameters": {}},  # defined, rarely called
]
WORDS = ("the function returns a list of parsed records and raises when the input file is empty "
         "config loader cache timeout retry handler user session token request response stream").split()
STEPS_PER_FILE = 50_000


def _text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def _call(rng: random.Random, step: int, j: int) -> dict:
    name = rng.choice(("search", "read_file", "read_file", "edit_file", "run_tests", "list_dir"))
    args = {"search": {"q": _text(rng, 3)}, "read_file": {"path": f"src/mod_{rng.randrange(200)}.py"},
            "edit_file": {"path": f"src/mod_{rng.randrange(200)}.py", "old": _text(rng, 6), "new": _text(rng, 6)},
            "run_tests": {"k": f"test_{rng.randrange(50)}"}, "list_dir": {"path": "src"}}[name]
    error = rng.random() < 0.05
    result = f"Error: {_text(rng, 8)}" if error else _text(rng, rng.randrange(20, 90))
    return {"id": f"c{step}-{j}", "name": name, "arguments": json.dumps(args), "result": result, "is_error": error}


def episode(rng: random.Random, idx: int) -> dict:
    n = rng.randrange(3, 41)
    steps = []
    for t in range(n):
        last = t == n - 1
        step = {"observation": _text(rng, rng.randrange(10, 60)) if t == 0 or rng.random() < 0.3 else "",
                "thought": _text(rng, rng.randrange(5, 30))}
        if last:
            step["action"] = "The fix is in place and the tests pass."
            step["done"] = True
        else:
            step["tool_calls"] = [_call(rng, t, j) for j in range(1 if rng.random() < 0.8 else 2)]
        if rng.random() < 0.3:
            step["info"] = {"tests_passed": rng.randrange(0, 20), "syntax_ok": rng.random() < 0.9}
        if rng.random() < 0.2:
            step["reward"] = round(rng.uniform(-1, 1), 3)
        if rng.random() < 0.1:
            step["candidates"] = [_text(rng, 4) for _ in range(4)]
        steps.append(step)
    success = rng.random() < 0.4
    return {"episode_id": f"ep-{idx}", "task_id": f"task-{idx % 997}", "task": _text(rng, 25),
            "system_prompt": "You are a careful coding agent. " + _text(rng, 30), "tools": TOOLS,
            "steps": steps, "outcome": {"success": success, "score": float(success), "judge": "auto"},
            "end_reason": "agent_stop", "agent_name": "bench-agent", "model": "gpt-x"}


def generate(out: Path, steps: int, seed: int = 0) -> dict:
    """Write at least `steps` steps of native JSONL into `out/part-*.jsonl`; returns the counts."""
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    total = episodes = broken = files = 0
    fh, in_file = None, STEPS_PER_FILE
    while total < steps:
        if in_file >= STEPS_PER_FILE:
            if fh:
                fh.close()
            fh, in_file, files = open(out / f"part-{files:04d}.jsonl", "w"), 0, files + 1
        if rng.random() < 0.001:
            fh.write('{"episode_id": "broken", "steps": [\n')
            broken += 1
            continue
        ep = episode(rng, episodes)
        fh.write(json.dumps(ep) + "\n")
        episodes += 1
        total += len(ep["steps"])
        in_file += len(ep["steps"])
    fh.close()
    size = sum(p.stat().st_size for p in out.iterdir())
    return {"steps": total, "episodes": episodes, "broken": broken, "files": files, "mb": round(size / 2**20, 1)}


# ---- the measured subprocess -------------------------------------------------------------------------
def _pss_parts_kb(pid: int) -> dict[str, int]:
    """PSS split into anonymous memory (heaps), shared memory (Ray's object store) and files."""
    out = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                key = line.split(":")[0]
                if key in ("Pss_Anon", "Pss_Shmem", "Pss_File"):
                    out[key] = int(line.split()[1])
    except (OSError, ValueError):
        pass
    return out


class SplitMonitor(Monitor):
    """Monitor that also keeps, at the peak, how much of the PSS is heaps vs the object store."""

    peak_split: dict[str, int] = {}

    def _sample(self) -> int:
        before = self.peak_kb
        total = super()._sample()
        if self.peak_kb > before:
            split: dict[str, int] = {}
            for pid in self.peak_parts:
                for k, v in _pss_parts_kb(pid).items():
                    split[k] = split.get(k, 0) + v
            self.peak_split = split
        return total


def sub_ingest(args) -> None:
    import logging

    from harnessrl.pipelines.ingest import ingest
    from harnessrl.ray_runtime import init_ray

    logging.basicConfig(level=logging.WARNING)
    init_ray(num_cpus=args.ray_cpus)
    import ray

    ray.get([ray.remote(lambda: 0).remote() for _ in range(args.ray_cpus)])  # workers started
    time.sleep(2)
    with SplitMonitor() as mon:
        t0 = time.time()
        r = ingest([args.sub_corpus], args.sub_out, "native")
        seconds = time.time() - t0
    driver_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    split = {k.split("_")[1].lower() + "_mb": round(v / 1024) for k, v in mon.peak_split.items()}
    print("RESULT " + json.dumps({**mon.report(), "seconds": round(seconds, 1), "top": mon.top(), "peak_split": split,
                                  "driver_peak_rss_mb": round(driver_rss_mb, 1), "result": r.summary()}), flush=True)


def run_sub(timeout: float, **kw) -> dict:
    return encode_run_sub("ingest", timeout, script=__file__, **kw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100000,1000000", help="corpus sizes in steps, comma-separated")
    ap.add_argument("--ray-cpus", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=2400, help="seconds per size (generation excluded)")
    ap.add_argument("--work-dir", help="keep corpora and outputs here (default: a temp dir, removed)")
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--sub", help=argparse.SUPPRESS)  # "ingest": this is the measured subprocess
    ap.add_argument("--sub-corpus", help=argparse.SUPPRESS)
    ap.add_argument("--sub-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.sub:
        return sub_ingest(args)

    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="ingest-bench-"))
    figures = []
    try:
        for size in sizes:
            t0 = time.time()
            marker = work / f"corpus-{size}.json"  # with --work-dir, a corpus is generated once and kept
            if marker.exists():
                corpus = json.loads(marker.read_text())
            else:
                corpus = generate(work / f"corpus-{size}", size)
                marker.write_text(json.dumps(corpus))
            print(f"{size:>9,} steps: generated {corpus['episodes']:,} episodes, {corpus['broken']} broken lines, "
                  f"{corpus['files']} files, {corpus['mb']} MB in {time.time() - t0:.0f} s", flush=True)
            res = run_sub(args.timeout, ray_cpus=args.ray_cpus, sub_corpus=work / f"corpus-{size}",
                          sub_out=work / f"out-{size}")
            r = res["result"]
            assert r["steps"] == corpus["steps"] and r["records_quarantined"] == corpus["broken"], r
            row = {"size": size, **corpus, "seconds": res["seconds"], "steps_per_s": round(r["steps"] / res["seconds"]),
                   "peak_pss_mb": res["peak_pss_mb"], "baseline_pss_mb": res["baseline_pss_mb"],
                   "driver_peak_rss_mb": res["driver_peak_rss_mb"], "others_cpu_share": res["others_cpu_share"],
                   "signals": r["signals"], "top": res["top"], "peak_split": res["peak_split"]}
            figures.append(row)
            print(f"{size:>9,} steps: {row['seconds']:.0f} s, {row['steps_per_s']:,} steps/s, peak PSS "
                  f"{row['peak_pss_mb']:,.0f} MB (baseline {row['baseline_pss_mb']:,.0f} MB), driver peak RSS "
                  f"{row['driver_peak_rss_mb']:,.0f} MB, others used {row['others_cpu_share']:.0%} of the CPUs",
                  flush=True)
            print("           at the peak: " + ", ".join(f"{k} {v:,} MB" for k, v in row["peak_split"].items())
                  + " (anon: heaps; shmem: Ray's object store)", flush=True)
            print("           largest at the peak: " + ", ".join(f"{n} {mb:,.0f} MB" for n, mb in row["top"][:4]),
                  flush=True)
            shutil.rmtree(work / f"out-{size}", ignore_errors=True)
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    if len(figures) >= 2:
        small, large = figures[0], figures[-1]
        ratio = large["peak_pss_mb"] / small["peak_pss_mb"]
        print(f"peak PSS {large['size']:,} / {small['size']:,} steps: {ratio:.2f}x (target <= 1.25x: "
              f"{'met' if ratio <= 1.25 else 'missed'}); steps/s {large['steps_per_s'] / small['steps_per_s']:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
