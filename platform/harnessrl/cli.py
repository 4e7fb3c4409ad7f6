"""harnessrl: learn a critic for LLM agents from their logs with offline RL, on Ray, and serve it.

Exit codes: 0 ok; 1 internal error; 2 bad arguments or configuration; 3 unreadable or unusable
data; 4 model not found or not loadable (e.g. encoder mismatch); 5 records quarantined under
`ingest --fail-on-quarantine`; 6 `lineage --verify` found a changed or missing dataset; 7 a
submitted job failed (`submit --wait`) or the cluster could not start a deployed service; 8 the
Ray cluster cannot be reached (job API or GCS address) or a local Ray cannot start; 130
interrupted. User mistakes print one line, never a stack trace.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import sys
from pathlib import Path
from typing import Any

from harnessrl import __version__, registry, settings
from harnessrl.errors import ConfigError, HarnessError

log = logging.getLogger("harnessrl")


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
    ing, tr, enc, trn, m = s["ingest"], s["transitions"], s["encode"], s.get("train"), s.get("model")
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
    ]
    if trn and m:
        lines += [
            f"train        IQL {trn['steps']} steps in {trn['seconds']:.0f} s: loss_q {trn['metrics'].get('loss_q', float('nan')):.4f}, "
            f"loss_v {trn['metrics'].get('loss_v', float('nan')):.5f}, q_mean {trn['metrics'].get('q_mean', float('nan')):.3f}; "
            f"fallback threshold {trn['fallback_threshold']:.3f}"
            + (f" (set on {trn['fallback_rows']} steps of successful episodes)" if trn.get("fallback_rows") else ""),
            *([f"warning      {trn['fallback_warning']}"] if trn.get("fallback_warning") else []),
            f"registry     {m['name']} version {m['version']} -> alias '{m['alias']}'  ({m['uri']})",
        ]
    else:
        lines.append("train        not run (--until encode): train from this encoded data with `harnessrl train`")
    if s.get("skipped"):
        lines.insert(2, f"skipped      {', '.join(s['skipped'])}: output exists for the same input and configuration "
                        "(figures below are from that run; --force reruns)")
    ev = s.get("evaluate")
    if ev:
        lines.append(heldout_line(ev))
    for i, a in enumerate(s.get("served", [])):
        now = [line for line in a["state_text"].splitlines() if line.startswith("Now: ")]
        state = (now[0][5:] if now else a["state_text"])[:60].replace("\n", " ")
        pick = a["candidates"][a["best_index"]]
        gold = f"gold '{a['expert']}'" if a.get("expert") else "no gold label"
        lines.append(f"served #{i}    '{state}' -> '{pick}' (score {a['scores'][a['best_index']]:.2f}, "
                     f"{len(a['candidates'])} candidates, {gold}, fallback {a['fallback']})")
    lines += [
        f"outputs      {settings.redact(s['output_dir'])}",
        *([f"log          {s['log']} (Ray's and MLflow's own output)"] if s.get("log") else []),
        f"mlflow       run {s['run_id']} in experiment '{s['experiment']}'; browse with: "
        f".venv/bin/mlflow ui --backend-store-uri {settings.redact(settings.tracking_uri())} --host 127.0.0.1",
        "",
    ]
    print("\n".join(lines))


def heldout_line(ev: dict[str, Any]) -> str:
    """The summary's held-out figure, or a plain statement that there is none to give."""
    if not ev.get("steps") or ev.get("gold_top1") is None:
        field = ev.get("expert_field", "the expert field")
        return (f"held-out     {ev.get('heldout_steps', 0)} steps of {ev.get('heldout_episodes', 0)} episodes, none "
                f"with an expert action at {field} among its candidates: gold-action ranking not measured "
                "(evaluate.expert_field names where the logs keep it)")
    lift = f"{ev['gold_top1'] / ev['random_top1']:.1f}x" if ev["random_top1"] else "n/a"
    prior = (f" ({ev['gold_top1_prior']:.3f} with its behaviour prior at w = {ev['prior_weight']:g}, as served)"
             if ev.get("gold_top1_prior") is not None else "")
    return (f"held-out     {ev['steps']} test-seed steps: critic ranks the gold action first {ev['gold_top1']:.3f}"
            f"{prior} vs random {ev['random_top1']:.3f} ({lift}); {ev['ms_per_step']:.1f} ms/step in-process")


def _console(args: argparse.Namespace, command: str, name: str):
    """The run's console (harnessrl.console): stage lines and bars here, the rest in a log file;
    `-v` keeps everything on the console."""
    if args.verbose:
        return contextlib.nullcontext()
    from harnessrl import console

    return console.Console(console.log_path(command, name), log)


def _pipeline(args: argparse.Namespace):
    from harnessrl.config import load_pipeline

    cfg = load_pipeline(args.pipeline, args.set)
    if getattr(args, "address", None):
        cfg.ray_address = args.address
    return cfg


def cmd_validate(args: argparse.Namespace) -> int:
    """The pipeline checked as `run` would check it before starting anything; nothing runs."""
    from harnessrl import preflight

    found = preflight.pipeline(_pipeline(args))
    print(f"{args.pipeline}: valid: pipeline '{found['pipeline']}', {found['train_files']} training file(s), "
          f"{found['heldout_files']} held-out file(s), recipe {found['recipe']} {found['recipe_digest']}, encoder "
          f"{found['encoder']} (dim {found['encoder_dim']})" + ("; serves the model after the run" if found["serves"]
                                                               else ""))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from harnessrl.jobs.pipeline import run_pipeline

    if args.dry_run:
        return cmd_validate(args)
    cfg = _pipeline(args)
    with _console(args, "run", cfg.name) as console:
        summary = run_pipeline(cfg, force=args.force, until=args.until)
    if console is not None:
        summary["log"] = str(console.path)
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        print_summary(summary)
    return 0


EXIT_QUARANTINED = 5


def cmd_ingest(args: argparse.Namespace) -> int:
    from harnessrl import preflight
    from harnessrl.pipelines.ingest import ingest
    from harnessrl.ray_runtime import init_ray

    # before Ray starts: a missing source is reported in a second
    (preflight.decision_logs if args.format == "decisions" else preflight.sources)(args.sources)
    preflight.existing(args.outcomes, "--outcomes file")
    with _console(args, "ingest", Path(args.out).name):
        init_ray(args.address)
        r = ingest(args.sources, args.out, args.format, args.outcomes, args.max_line_bytes)
    # One line by default: tools that run this read the last line of stdout as the result.
    print(json.dumps({"records_in": r.records_in, "records_ok": r.records_ok, "episodes": r.episodes,
                      "steps": r.steps, "signals": r.signals, "quarantined": r.records_quarantined,
                      "by_reason": r.by_reason, "formats": r.formats, "outcomes_joined": r.outcomes_joined, "files": r.files,
                      "raw_digest": r.raw_digest, "out": r.out_dir}, indent=2 if args.pretty else None), flush=True)
    if args.fail_on_quarantine and r.records_quarantined:
        print(f"harnessrl: {r.records_quarantined} record(s) quarantined (--fail-on-quarantine); "
              f"see {r.out_dir}/quarantine", file=sys.stderr)
        return EXIT_QUARANTINED
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from harnessrl import preflight
    from harnessrl.jobs.evaluate import evaluate
    from harnessrl.metrics import format_table
    from harnessrl.ray_runtime import init_ray

    from harnessrl.evaluation import EXPERT_FIELD

    uri = registry.model_uri(args.model, "--model")
    field = args.expert_field or EXPERT_FIELD
    weight = _prior_weight(args)
    preflight.sources(args.data, "--data source")  # before Ray starts
    with _console(args, "evaluate", uri.rsplit("/", 1)[-1]):
        init_ray(args.address)
        r = evaluate(uri, args.data, args.format, args.out, args.max_steps,
                     log_to_mlflow=not args.no_mlflow, include_seen=args.include_seen, expert_field=field,
                     prior_weight=weight)
    if args.json:
        print(json.dumps(r.summary(), indent=2, default=str))
        return 0
    print(format_table(r.metrics, title=f"{r.model['name']} version {r.model['version']}: offline evaluation"))
    if not r.metrics.get("expert_n_steps"):
        print(f"expert_top1: not measured, no held-out step has an expert action at {field}")
    for f in r.findings:
        print(f"[{f['severity']}] {f['name']}: {f['evidence']}\n    try: {f['what_to_try']}")
    print(f"report: {r.report}" + (f"  (MLflow run {r.mlflow_run_id})" if r.mlflow_run_id else ""))
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from harnessrl.jobs.pipeline import train_only

    cfg = _pipeline(args)
    with _console(args, "train", cfg.name):
        s = train_only(cfg, args.resume)
    trn, m = s["train"], s["model"]
    print(json.dumps({"run_id": m["run_id"], "resumed": s["resumed"], "steps": trn["steps"],
                      "resumed_from_step": trn["metrics"].get("resumed_from_step"),
                      "metrics": trn["metrics"], "fallback_threshold": trn["fallback_threshold"],
                      "fallback_rows": trn["fallback_rows"], "fallback_warning": trn["fallback_warning"],
                      "model": m, "evaluate": s.get("evaluate")}, indent=2))
    return 0


def _prior_weight(args: argparse.Namespace) -> float:
    """--prior-weight, checked (default: the service's, harnessrl.config.PRIOR_WEIGHT)."""
    from harnessrl.config import PRIOR_WEIGHT

    weight = PRIOR_WEIGHT if args.prior_weight is None else args.prior_weight
    if not (weight >= 0 and math.isfinite(weight)):
        raise ConfigError(f"--prior-weight must be a finite number >= 0, got {weight}")
    return weight


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
    weight = _prior_weight(args)
    critic = Critic.load(registry.model_uri(args.model, "--model"))
    d = critic.decide(state, args.candidate, prior_weight=weight)
    print(json.dumps({"scores": d.scores, "blended_scores": d.ranking,
                      "prior_weight": weight if d.ranking is not None else 0.0,
                      "best_index": d.best_index, "best": args.candidate[d.best_index],
                      "fallback": d.fallback, "reason": d.reason,
                      "model": {"name": critic.name, "version": critic.version}}, indent=2))
    return 0


ADDRESS_HELP = ("the Ray cluster to run on: HEAD:6379, auto, ray://HEAD:10001, or its dashboard http://HEAD:8265 "
                "(then its GCS at HEAD:6379); default: RAY_ADDRESS, else a local Ray on 127.0.0.1")
PRIOR_WEIGHT_HELP = ("rank by score + w * log pi of the model's behaviour prior when it has one (default: the "
                     "service's, harnessrl.config.PRIOR_WEIGHT; 0: the scores alone)")
UNTIL = ("encode", "train")  # jobs.pipeline.run_pipeline's `until`
UNTIL_HELP = ("stop after this stage: encode (prepare the data once, then `harnessrl train` it as often as wanted), "
              "train (train and register; no held-out evaluation or serve check)")
SET_HELP = "override a config value (e.g. train.steps=500); repeatable"
FORMATS = ["native", "openai-chat", "openai-responses", "anthropic", "atif", "auto"]


def build_parser() -> argparse.ArgumentParser:
    doc = __doc__.strip().split("\n\n")
    p = argparse.ArgumentParser(prog="harnessrl", description=doc[0], epilog=" ".join(doc[1].split()))
    p.add_argument("-v", "--verbose", action="store_true",
                   help="debug logging, and Ray's and MLflow's own output on the console (else: in the run's log file)")
    p.add_argument("--version", action="version", version=f"harnessrl {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run a pipeline YAML (ingest, rewards, transitions, encode, train, register, ...)")
    run.add_argument("pipeline", help="pipeline YAML (e.g. pipelines/quickstart.yaml)")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=SET_HELP)
    run.add_argument("--address", help=ADDRESS_HELP)
    run.add_argument("--json", action="store_true", help="print the summary as JSON")
    run.add_argument("--force", action="store_true",
                     help="rerun ingest/transitions/encode even when their output exists for the same input and config")
    run.add_argument("--until", choices=UNTIL, help=UNTIL_HELP)
    run.add_argument("--dry-run", action="store_true",
                     help="check the config and its sources, recipe, encoder and token (as `validate`), run nothing")
    run.set_defaults(fn=cmd_run)

    val = sub.add_parser("validate", help="check a pipeline YAML and what it names without running it")
    val.add_argument("pipeline", help="pipeline YAML")
    val.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=SET_HELP)
    val.set_defaults(fn=cmd_validate)

    ing = sub.add_parser("ingest", help="agent logs -> episodes, steps, signals and quarantine tables (Parquet); "
                                        "prints a JSON summary on one line")
    ing.add_argument("sources", nargs="+", help="files, directories, globs, s3:// prefixes, builtin:twx-train")
    ing.add_argument("--format", default="auto", choices=[*FORMATS[:-1], "decisions", "auto"],
                     help="log format; auto detects it per file from its first record (default); decisions "
                          "reads a service's decision log folder with its feedback")
    ing.add_argument("--out", required=True, help="output folder (local or s3://)")
    ing.add_argument("--outcomes", help="JSONL of {episode_id, success, score}, joined by the log's episode id")
    ing.add_argument("--fail-on-quarantine", action="store_true",
                     help=f"exit {EXIT_QUARANTINED} when any record was quarantined (strict pipelines)")
    ing.add_argument("--max-line-bytes", type=int, metavar="N",
                     help="quarantine longer lines as line_too_long, unread (default 64 MiB)")
    ing.add_argument("--pretty", action="store_true", help="print the summary indented, for people")
    ing.add_argument("--address", help=ADDRESS_HELP)
    ing.set_defaults(fn=cmd_ingest)

    ev = sub.add_parser("evaluate", help="offline metrics and a diagnosis report of a critic on held-out logs")
    ev.add_argument("--model", required=True, help=registry.FORMS)
    ev.add_argument("--data", nargs="+", required=True, help="held-out logs: files, dirs, globs, s3://, builtin:")
    ev.add_argument("--format", default="auto", choices=FORMATS, help="log format (default: auto, detected per file)")
    ev.add_argument("--out", help="local folder for the held-out tables and the report (default: a temp dir)")
    ev.add_argument("--max-steps", type=int, help="evaluate at most this many held-out steps")
    ev.add_argument("--include-seen", action="store_true",
                    help="also score task groups the model trained on (left out by default: optimistic figures)")
    ev.add_argument("--no-mlflow", action="store_true", help="do not log an evaluation run to MLflow")
    ev.add_argument("--json", action="store_true", help="print the result as JSON")
    ev.add_argument("--expert-field", metavar="PATH",
                    help="dotted path of the expert's action in a step, e.g. info.behaviour.expert_action "
                         "(default info.expert_action)")
    ev.add_argument("--prior-weight", type=float, default=None,
                    help=PRIOR_WEIGHT_HELP + "; decisions, expert_top1_prior and the fallback rates use it")
    ev.add_argument("--address", help=ADDRESS_HELP)
    ev.set_defaults(fn=cmd_evaluate)

    from harnessrl import cli_jobs, cli_rewards, cli_serve

    cli_rewards.register(sub)
    cli_jobs.register(sub)

    tr = sub.add_parser("train", help="train and register from a pipeline's encoded data (optionally resume a run)")
    tr.add_argument("pipeline", help="pipeline YAML whose encode stage has run")
    tr.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=SET_HELP)
    tr.add_argument("--resume", metavar="RUN", help="continue this run (MLflow run id) from its last checkpoint")
    tr.add_argument("--address", help=ADDRESS_HELP)
    tr.set_defaults(fn=cmd_train)

    cli_serve.register(sub)

    score = sub.add_parser("score", help="score candidates for one state, in-process")
    score.add_argument("--model", required=True, help=registry.FORMS)
    score.add_argument("--state", required=True, help="rendered text, or JSON {task, history, observation}")
    score.add_argument("--candidate", action="append", default=[], help="a candidate action; repeatable")
    score.add_argument("--prior-weight", type=float, default=None, help=PRIOR_WEIGHT_HELP)
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
