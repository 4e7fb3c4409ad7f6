"""`harnessrl` command line. Exit codes: 0 ok, 1 internal error, 2 bad arguments or config,
3 data error (unreadable or unusable input), 4 model error (missing model, encoder mismatch),
5 records quarantined under `ingest --fail-on-quarantine`, 6 `lineage --verify` found a changed or
missing dataset, 7 a submitted job failed (`submit --wait`), 130 interrupted. User mistakes
print one clear line, never a stack trace.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from harnessrl import settings
from harnessrl.errors import ConfigError, HarnessError

log = logging.getLogger("harnessrl")


def model_uri(spec: str) -> str:
    """`NAME@ALIAS`, `NAME/VERSION`, `models:/...` or a local critic folder."""
    if spec.startswith("models:/") or Path(spec).exists():
        return spec
    if "@" in spec or "/" in spec:
        return f"models:/{spec}"
    raise ConfigError(f"--model {spec!r}: expected NAME@ALIAS, NAME/VERSION, models:/... or a critic folder")


def _setup_logging(verbose: bool) -> None:
    # Our own handler: Ray resets the root logger's level when it starts.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[harnessrl %(asctime)s] %(message)s", "%H:%M:%S"))
    log.addHandler(handler)
    log.setLevel(logging.DEBUG if verbose else logging.INFO)
    log.propagate = False
    for noisy in ("mlflow", "sentence_transformers", "httpx", "alembic", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def print_summary(s: dict[str, Any]) -> None:
    ing, tr, enc, trn = s["ingest"], s["transitions"], s["encode"], s["train"]
    m = s["model"]
    lines = [
        "",
        f"== harnessrl pipeline '{s['pipeline']}' finished in {s['seconds']:.0f} s ==",
        f"ingest       {ing['records_in']} records -> {ing['episodes']} episodes, {ing['steps']} steps; "
        f"{ing['records_quarantined']} quarantined {ing['by_reason'] or ''}",
        f"rewards      recipe '{tr['recipe']}' {tr['recipe_digest']}; mean episode return {tr['mean_return']:.2f}; "
        f"success rate in logs {tr['success_rate']:.2f}",
        f"transitions  {tr['transitions']} (s, a, r, s', done) from {tr['episodes']} episodes",
        f"encode       {enc['texts_total']} texts, {enc['texts_distinct']} distinct, encoded once each by "
        f"{enc['actors']} actor(s) in {enc['seconds']:.0f} s ({enc['encoder']['model_name']}, dim {enc['encoder']['dim']})",
        f"train        IQL {trn['steps']} steps in {trn['seconds']:.0f} s: loss_q {trn['metrics'].get('loss_q', float('nan')):.4f}, "
        f"loss_v {trn['metrics'].get('loss_v', float('nan')):.5f}, q_mean {trn['metrics'].get('q_mean', float('nan')):.3f}; "
        f"fallback threshold {trn['fallback_threshold']:.3f}",
        f"registry     {m['name']} version {m['version']} -> alias '{m['alias']}'  ({m['uri']})",
    ]
    if s.get("skipped"):
        lines.insert(2, f"skipped      {', '.join(s['skipped'])}: output exists for the same input and configuration "
                        "(figures below are from that run; --force reruns)")
    ev = s.get("evaluate")
    if ev:
        lift = ev["gold_top1"] / ev["random_top1"] if ev["random_top1"] else float("nan")
        lines.append(
            f"held-out     {ev['steps']} test-seed steps: critic ranks the gold action first {ev['gold_top1']:.3f} "
            f"vs random {ev['random_top1']:.3f} ({lift:.1f}x); {ev['ms_per_step']:.1f} ms/step in-process")
    for i, a in enumerate(s.get("served", [])):
        now = [line for line in a["state_text"].splitlines() if line.startswith("Now: ")]
        state = (now[0][5:] if now else a["state_text"])[:60].replace("\n", " ")
        pick = a["candidates"][a["best_index"]]
        lines.append(f"served #{i}    '{state}' -> '{pick}' (score {a['scores'][a['best_index']]:.2f}, "
                     f"{len(a['candidates'])} candidates, gold '{a['expert']}', fallback {a['fallback']})")
    lines += [
        f"outputs      {settings.redact(s['output_dir'])}",
        f"mlflow       run {m['run_id']} in experiment '{m['experiment']}'; browse with: "
        f".venv/bin/mlflow ui --backend-store-uri {settings.redact(settings.tracking_uri())} --host 127.0.0.1",
        "",
    ]
    print("\n".join(lines))


def cmd_run(args: argparse.Namespace) -> int:
    from harnessrl.config import load_pipeline
    from harnessrl.jobs.pipeline import run_pipeline

    cfg = load_pipeline(args.pipeline, args.set)
    if args.address:
        cfg.ray_address = args.address
    summary = run_pipeline(cfg, force=args.force)
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        print_summary(summary)
    return 0


EXIT_QUARANTINED = 5


def cmd_ingest(args: argparse.Namespace) -> int:
    from harnessrl.pipelines.ingest import ingest
    from harnessrl.ray_runtime import init_ray

    init_ray(args.address)
    r = ingest(args.sources, args.out, args.format, args.outcomes)
    print(json.dumps({"records_in": r.records_in, "records_ok": r.records_ok, "episodes": r.episodes,
                      "steps": r.steps, "signals": r.signals, "quarantined": r.records_quarantined,
                      "by_reason": r.by_reason, "formats": r.formats, "outcomes_joined": r.outcomes_joined, "files": r.files,
                      "raw_digest": r.raw_digest, "out": r.out_dir}, indent=2))
    if args.fail_on_quarantine and r.records_quarantined:
        print(f"harnessrl: {r.records_quarantined} record(s) quarantined (--fail-on-quarantine); "
              f"see {r.out_dir}/quarantine", file=sys.stderr)
        return EXIT_QUARANTINED
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from harnessrl.jobs.evaluate import evaluate
    from harnessrl.metrics import format_table
    from harnessrl.ray_runtime import init_ray

    init_ray(args.address)
    r = evaluate(model_uri(args.model), args.data, args.format, args.out, args.max_steps,
                 log_to_mlflow=not args.no_mlflow, include_seen=args.include_seen)
    if args.json:
        print(json.dumps(r.summary(), indent=2, default=str))
        return 0
    print(format_table(r.metrics, title=f"{r.model['name']} version {r.model['version']}: offline evaluation"))
    for f in r.findings:
        print(f"[{f['severity']}] {f['name']}: {f['evidence']}\n    try: {f['what_to_try']}")
    print(f"report: {r.report}" + (f"  (MLflow run {r.mlflow_run_id})" if r.mlflow_run_id else ""))
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from harnessrl.config import load_pipeline
    from harnessrl.jobs.pipeline import train_only

    cfg = load_pipeline(args.pipeline, args.set)
    if args.address:
        cfg.ray_address = args.address
    s = train_only(cfg, args.resume)
    trn, m = s["train"], s["model"]
    print(json.dumps({"run_id": m["run_id"], "resumed": s["resumed"], "steps": trn["steps"],
                      "resumed_from_step": trn["metrics"].get("resumed_from_step"),
                      "metrics": trn["metrics"], "model": m, "evaluate": s.get("evaluate")}, indent=2))
    return 0


def _serve_config(args: argparse.Namespace):
    """serve.yaml (if given), then --set, then the explicit flags: one ServeConfig, validated."""
    from harnessrl.config import load_serve

    fields = {"model": model_uri(args.model) if args.model else None, "host": args.host, "port": args.port,
              "max_batch_size": args.max_batch_size, "max_queued_requests": args.max_queued_requests,
              "challenger": model_uri(args.challenger) if args.challenger else None,
              "challenger_share": args.challenger_share, "reload_every_s": args.reload_every_s,
              "decision_log": args.decision_log}
    cfg = load_serve(args.config, args.set, fields)
    if cfg.model is None:
        raise ConfigError("no model to serve: give --model or set `model` in the --config file")
    return cfg.model_copy(update={"model": model_uri(cfg.model)})


def cmd_serve(args: argparse.Namespace) -> int:
    import os
    import signal
    import time

    from harnessrl.ray_runtime import init_ray
    from harnessrl.serving import app as serving

    if args.action == "stop":
        if not (args.address or os.environ.get("RAY_ADDRESS")):
            raise ConfigError("serve stop: give --address of the cluster the service runs on")
        init_ray(args.address)
        serving.delete()
        print(f"removed the app '{serving.APP_NAME}' from the cluster", flush=True)
        return 0
    from harnessrl.serving import auth

    cfg = _serve_config(args)  # before Ray starts: a bad config is exit code 2 at once
    auth.resolve_token()  # so is an empty or unreadable API token
    if cfg.decision_log is None:
        cfg = cfg.model_copy(update={"decision_log": str(settings.home() / "decisions")})
    if args.action == "deploy":
        if not (args.address or os.environ.get("RAY_ADDRESS")):
            raise ConfigError("serve deploy: give --address of a running Ray cluster (a local Ray would stop "
                              "with this command)")
        init_ray(args.address)
        url = serving.start(config=cfg)
        print(f"deployed {cfg.model} at {url} on the cluster; `harnessrl serve stop --address ...` removes it",
              flush=True)
        return 0
    init_ray(args.address)
    try:
        url = serving.start(config=cfg)
        print(f"serving {cfg.model} at {url}  (POST /v1/score, /v1/select_tool, /v1/feedback; GET /v1/model, "
              f"/healthz, /metrics; docs at {url}/docs); decisions logged to {cfg.decision_log}; Ctrl-C stops",
              flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the shutdown short
        print("stopping the service", flush=True)
        serving.stop()
    return 0


def cmd_score(args: argparse.Namespace) -> int:
    from harnessrl.critic import Critic

    if not args.candidate:
        raise ConfigError("give at least one --candidate")
    state: Any = args.state
    if args.state.lstrip().startswith("{"):
        try:
            state = json.loads(args.state)
        except ValueError as exc:
            raise ConfigError(f"--state looks like JSON but does not parse: {exc}") from None
    critic = Critic.load(model_uri(args.model))
    d = critic.decide(state, args.candidate)
    print(json.dumps({"scores": d.scores, "best_index": d.best_index, "best": args.candidate[d.best_index],
                      "fallback": d.fallback, "reason": d.reason,
                      "model": {"name": critic.name, "version": critic.version}}, indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="harnessrl", description=__doc__.split("\n")[0])
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a pipeline YAML (ingest, rewards, transitions, encode, train, register, ...)")
    run.add_argument("pipeline")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config value")
    run.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS or a local Ray)")
    run.add_argument("--json", action="store_true", help="print the summary as JSON")
    run.add_argument("--force", action="store_true",
                     help="rerun ingest/transitions/encode even when their output exists for the same input and config")
    run.set_defaults(fn=cmd_run)

    ing = sub.add_parser("ingest", help="agent logs -> episodes, steps, signals and quarantine tables (Parquet); "
                                        "prints a JSON summary")
    ing.add_argument("sources", nargs="+", help="files, directories, globs, s3:// prefixes, builtin:twx-train")
    ing.add_argument("--format", default="auto",
                     choices=["native", "openai-chat", "openai-responses", "anthropic", "atif", "decisions", "auto"],
                     help="log format; auto detects it per file from its first record (default); decisions "
                          "reads a service's decision log folder with its feedback")
    ing.add_argument("--out", required=True, help="output folder (local or s3://)")
    ing.add_argument("--outcomes", help="JSONL of {episode_id, success, score}, joined by the log's episode id")
    ing.add_argument("--fail-on-quarantine", action="store_true",
                     help=f"exit {EXIT_QUARANTINED} when any record was quarantined (strict pipelines)")
    ing.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS or a local Ray)")
    ing.set_defaults(fn=cmd_ingest)

    ev = sub.add_parser("evaluate", help="offline metrics and a diagnosis report of a critic on held-out logs")
    ev.add_argument("--model", required=True, help="NAME@ALIAS, NAME/VERSION, models:/... or a critic folder")
    ev.add_argument("--data", nargs="+", required=True, help="held-out logs: files, dirs, globs, s3://, builtin:")
    ev.add_argument("--format", default="auto",
                    choices=["native", "openai-chat", "openai-responses", "anthropic", "atif", "auto"])
    ev.add_argument("--out", help="local folder for the held-out tables and the report (default: a temp dir)")
    ev.add_argument("--max-steps", type=int, help="evaluate at most this many held-out steps")
    ev.add_argument("--include-seen", action="store_true",
                    help="also score task groups the model trained on (left out by default: optimistic figures)")
    ev.add_argument("--no-mlflow", action="store_true", help="do not log an evaluation run to MLflow")
    ev.add_argument("--json", action="store_true", help="print the result as JSON")
    ev.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS or a local Ray)")
    ev.set_defaults(fn=cmd_evaluate)

    from harnessrl import cli_jobs, cli_rewards

    cli_rewards.register(sub)
    cli_jobs.register(sub)

    tr = sub.add_parser("train", help="train and register from a pipeline's encoded data (optionally resume a run)")
    tr.add_argument("pipeline")
    tr.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config value")
    tr.add_argument("--resume", metavar="RUN", help="continue this run (MLflow run id) from its last checkpoint")
    tr.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS or a local Ray)")
    tr.set_defaults(fn=cmd_train)

    serve = sub.add_parser(
        "serve", help="serve a critic over HTTP with Ray Serve (run: until Ctrl-C; deploy: onto a cluster and "
                      "return; stop: remove a deployed app)",
        description="Settings: ServeConfig (harnessrl.config), from --config YAML, then --set, then these flags; "
                    "unset flags keep the file's value or ServeConfig's default.")
    serve.add_argument("action", nargs="?", default="run", choices=["run", "deploy", "stop"])
    serve.add_argument("--config", help="serve config YAML (e.g. serving/serve.yaml), validated by ServeConfig")
    serve.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config value (e.g. autoscaling.max_replicas=4)")
    serve.add_argument("--model", help="NAME@ALIAS, NAME/VERSION, models:/... or a critic folder")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--max-batch-size", type=int)
    serve.add_argument("--max-queued-requests", type=int, help="beyond this: 429 + Retry-After")
    serve.add_argument("--challenger", help="a second model (e.g. NAME@challenger) for a share of agents")
    serve.add_argument("--challenger-share", type=float, help="share of agents (by agent_id hash; default 0.1)")
    serve.add_argument("--reload-every-s", type=float,
                       help="check the aliases this often and switch to a new version without dropping requests")
    serve.add_argument("--decision-log", help="folder (local or s3://) for decisions and feedback "
                                              "(default: $HARNESSRL_HOME/decisions)")
    serve.add_argument("--address", help="Ray cluster address (deploy and stop need one)")
    serve.set_defaults(fn=cmd_serve)

    score = sub.add_parser("score", help="score candidates for one state, in-process")
    score.add_argument("--model", required=True)
    score.add_argument("--state", required=True, help="rendered text, or JSON {task, history, observation}")
    score.add_argument("--candidate", action="append", default=[])
    score.set_defaults(fn=cmd_score)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(args.verbose)
    settings.protect_tracking_uri()
    try:
        return args.fn(args)
    except HarnessError as exc:
        print(f"harnessrl: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("harnessrl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
