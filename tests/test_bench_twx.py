"""bench/twx.py, reduced configuration, end to end: real textworld-express, the real critic
service (the session's "it-critic" from the pipeline_run fixture, served over HTTP), BC trained
on that run's encoded data; both protocols (all-actions, and the rerank protocol with every
rerank scorer and a two-weight sweep). Checks the tables' structure and invariants and the
rerank's decision log, never wall time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import import_bench, twx_unavailable

pytestmark = [pytest.mark.integration, pytest.mark.skipif(twx_unavailable() is not None, reason=str(twx_unavailable()))]
RERANK_SCORERS = "agent,agent+self,agent+critic,agent+critic+again,agent+critic+prior,agent+bc,agent+oracle"


@pytest.fixture(scope="module")
def bench(pipeline_run, tmp_path_factory):
    twx = import_bench("twx")
    out = tmp_path_factory.mktemp("bench_twx")
    argv = ["--reduced", "--model", "it-critic@champion",
            "--encoded", str(Path(pipeline_run["output_dir"]) / "encoded"),
            "--scorers", "critic,critic+bc,mix,random,bc,bc+norepeat,expert", "--bc-steps", "60",
            "--bc-prior-weight", "3",
            "--rerank-scorers", RERANK_SCORERS, "--sweep-seeds", "1", "--prior-weights", "0.5,2",
            "--json", str(out / "twx.json"), "--markdown", str(out / "twx.md"), "--report", str(out / "diagnosis")]
    assert twx.main(argv) == 0
    return {"results": json.loads((out / "twx.json").read_text()), "markdown": (out / "twx.md").read_text(),
            "twx": twx}


def test_every_scorer_played_every_seed(bench):
    res = bench["results"]
    cfg = res["config"]
    assert len(cfg["families"]) >= 2 and cfg["tiers"] == ["id", "ood"]
    played = {(e["scorer"], e["tier"], e["family"], e["seed"]) for e in res["episodes"]}
    for key, seeds in res["seeds"].items():
        tier, family = key.split("|")
        assert len(seeds) == cfg["seeds_per_family"]
        for seed in seeds:
            for scorer in cfg["scorers"]:
                assert (scorer, tier, family, seed) in played
    assert len(res["episodes"]) == len(played)


def test_norepeat_plays_as_its_scorer_until_the_rule_changes_a_choice(bench):
    """bc+norepeat is bc with the avoid_repeats rule: the same episode until a repeat is passed over."""
    eps = {(e["scorer"], e["tier"], e["family"], e["seed"]): e for e in bench["results"]["episodes"]}
    compared = 0
    for (scorer, tier, family, seed), ep in eps.items():
        if scorer != "bc+norepeat":
            assert ep["avoided"] == 0
            continue
        plain = eps[("bc", tier, family, seed)]
        if ep["avoided"] == 0:
            assert ep["actions"] == plain["actions"]
        else:
            assert ep["actions"] != plain["actions"]
            first = next(i for i, (a, b) in enumerate(zip(ep["actions"], plain["actions"])) if a != b)
            # where they part, bc took an action it had taken before (the rule passed over a repeat)
            assert plain["actions"][first] in plain["actions"][:first]
        compared += 1
    assert compared == len(bench["results"]["seeds"]) * bench["results"]["config"]["seeds_per_family"]


def test_critic_bc_plays_as_the_critic_until_bcs_prior_changes_a_choice(bench):
    """critic+bc is the critic ranking by score + w * log pi_bc: the same episode as the critic's until the
    prior moves a decision off the critic's argmax; only critic+bc counts such decisions."""
    eps = {(e["scorer"], e["tier"], e["family"], e["seed"]): e for e in bench["results"]["episodes"]}
    compared = 0
    for (scorer, tier, family, seed), ep in eps.items():
        if scorer != "critic+bc":
            assert ep["prior_changed"] == 0
            continue
        plain = eps[("critic", tier, family, seed)]
        assert (ep["actions"] == plain["actions"]) == (ep["prior_changed"] == 0)
        assert ep["decisions"] > 0
        compared += 1
    assert compared == len(bench["results"]["seeds"]) * bench["results"]["config"]["seeds_per_family"]


def test_seed_tiers_are_disjoint_from_the_logs(bench):
    twx = bench["twx"]
    used = twx.used_seeds(twx.read_records("twx_train") + twx.read_records("twx_test"))
    for key, seeds in bench["results"]["seeds"].items():
        tier, family = key.split("|")
        fold = twx.TIERS[tier]
        for seed in seeds:
            assert (family, fold, seed) not in used
            assert (seed < 20000) == (tier == "id")  # train fold 0-999, test fold 20000-20999


def test_table_invariants(bench):
    res = bench["results"]
    cfg = res["config"]
    for scorer in cfg["scorers"]:
        for tier in cfg["tiers"]:
            for family in [*cfg["families"], "all"]:
                m = res["table"][f"{scorer}|{tier}|{family}"]
                n_expected = cfg["seeds_per_family"] * (len(cfg["families"]) if family == "all" else 1)
                assert m["episodes"] == n_expected
                assert 0.0 <= m["success"] <= 1.0 and 0.0 <= m["loop_rate"] <= 1.0
                lo, hi = m["ci95"]
                assert 0.0 <= lo <= m["success"] <= hi <= 1.0
                if m["successes"]:
                    assert 1 <= m["mean_steps_to_success"] <= cfg["max_steps"]
                else:
                    assert m["mean_steps_to_success"] is None
                if scorer == "expert":
                    assert m["success"] == 1.0
                if scorer == "critic":  # the service's flags over the critic's decisions
                    assert m["fallback_rate"] is not None and 0.0 <= m["fallback_rate"] <= 1.0
                    flags = [f for e in res["episodes"] if e["scorer"] == scorer and e["tier"] == tier
                             and family in ("all", e["family"]) for f in e["ood"]]
                    assert m["ood_rate"] == pytest.approx(sum(flags) / len(flags))
                elif not scorer.startswith("critic"):
                    assert m["ood_rate"] is None
    for e in res["episodes"]:
        assert 1 <= e["steps"] <= cfg["max_steps"]
        if e["scorer"] == "critic":
            assert e["decisions"] == e["steps"]  # every step went through the service
    assert "| scorer |" in bench["markdown"] and "critic" in bench["markdown"]


def test_diagnosis_report_of_the_run(bench):
    """The run's report holds the closed-loop findings its own table implies, and is in MLflow."""
    import mlflow

    res = bench["results"]
    report = Path(res["report"])
    text = report.read_text()
    assert text.startswith("# harnessrl diagnosis") and (report.parent / "q_distribution.png").is_file()
    names = {f["name"] for f in res["findings"]}
    for tier in res["config"]["tiers"]:
        critic, mix = res["table"][f"critic|{tier}|all"], res["table"][f"mix|{tier}|all"]
        assert (f"closed_loop_gap [{tier}]" in names) == (critic["successes"] < mix["successes"])
        assert (f"action_loops [{tier}]" in names) == (critic["loop_rate"] > 0)
    for f in res["findings"]:
        assert f["evidence"] in text
    run = mlflow.get_run(res["mlflow_run_id"])
    assert run.data.metrics["id/critic/success"] == res["table"]["critic|id|all"]["success"]
    artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(run.info.run_id, "diagnosis")}
    assert "diagnosis/report.md" in artifacts


def test_ablation_table_of_the_run(bench):
    """bench/twx_ablation.py's rows read this run's figures: one per critic run, one per baseline
    the first run played (here bc and bc+norepeat, mix, random; bc-careful was not played)."""
    ablation = import_bench("twx_ablation")
    res = bench["results"]
    rows = ablation.table_rows([("base", res), ("variant", res)])
    by_label = {r[0]: r for r in rows}
    cell = lambda s, t: f"{res['table'][f'{s}|{t}|all']['success']:.2f}"  # noqa: E731
    loops = lambda s: " / ".join(f"{res['table'][f'{s}|{t}|all']['loop_rate']:.2f}" for t in ("id", "ood"))  # noqa: E731
    # this run played the critic without the rule only: its +norepeat cells are empty
    assert by_label["base"] == ["base", cell("critic", "id"), cell("critic", "ood"), "-", "-", loops("critic")]
    assert by_label["variant"][1:] == by_label["base"][1:]
    assert by_label["bc (same seeds)"] == [
        "bc (same seeds)", cell("bc", "id"), cell("bc", "ood"), cell("bc+norepeat", "id"),
        cell("bc+norepeat", "ood"), loops("bc")]
    assert by_label["mix (same seeds)"][1:3] == [cell("mix", "id"), cell("mix", "ood")]
    assert not any(label.startswith("bc-careful") for label in by_label)
    assert len(rows) == 2 + 3  # two critic runs; bc, mix, random
    assert ablation.markdown(rows).count("\n") == len(rows) + 1


# ---- the rerank protocol (issue 22) --------------------------------------------------------------
def _rerank(bench) -> tuple[dict, dict]:
    rr = bench["results"]["rerank"]
    return rr, rr["config"]


def test_rerank_plays_every_scorer_on_the_all_actions_seeds(bench):
    res = bench["results"]
    rr, cfg = _rerank(bench)
    assert cfg["scorers"] == RERANK_SCORERS.split(",") and cfg["agents"] == ["mistaken"] and cfg["k"] == [4]
    assert cfg["families"] == res["config"]["families"] and rr["seeds"] == res["seeds"]  # the same seed draws
    played = [(e["agent"], e["k"], e["scorer"], e["tier"], e["family"], e["seed"]) for e in rr["episodes"]]
    assert len(played) == len(set(played)) == len(cfg["scorers"]) * sum(map(len, rr["seeds"].values()))
    for key, seeds in rr["seeds"].items():
        tier, family = key.split("|")
        for seed in seeds:
            for scorer in cfg["scorers"]:
                assert ("mistaken", 4, scorer, tier, family, seed) in played


def test_rerank_decision_log_follows_each_scorers_rule(bench):
    """Every step's pick, from the log: at most K distinct proposals with logprobs <= 0; the action
    taken is the pick; agent takes the first, agent+self the most likely (first of ties), agent+oracle
    the expert's when proposed, a critic scorer the service's best_index (agent+critic+prior: the
    argmax of its blended_scores); +again asks once more exactly when the first answer fell back."""
    twx = bench["twx"]
    rr, cfg = _rerank(bench)
    final = twx.rerank.final
    for e in rr["episodes"]:
        assert len(e["log"]) == e["steps"] == len(e["actions"])
        firsts = sum(bool(d.get("fallback")) for d in e["log"])
        assert e["fallbacks"] == firsts and e["decisions"] == (e["steps"] if twx.rerank.uses_critic(e["scorer"]) else 0)
        assert e["asked_again"] == (firsts if e["scorer"].endswith("+again") else 0)
        for d, action in zip(e["log"], e["actions"]):
            assert ("again" in d) == (e["scorer"].endswith("+again") and d["fallback"])
            for pick in [d, *([d["again"]] if "again" in d else [])]:
                props, lps, i = pick["proposals"], pick["logprobs"], pick["chosen"]
                assert 1 <= len(props) <= e["k"] and len(set(props)) == len(props) and len(lps) == len(props)
                assert all(lp <= 0 for lp in lps) and 0 <= i < len(props)
                base = e["scorer"].removesuffix("+again")
                if base == "agent":
                    assert i == 0
                elif base == "agent+self":
                    assert i == lps.index(max(lps))
                elif base == "agent+oracle":
                    assert i == (props.index(pick["expert"]) if pick["expert"] in props else 0)
                elif base == "agent+critic":
                    assert pick["blended"] is None and len(pick["scores"]) == len(props)
                elif base == "agent+critic+prior":
                    assert i == pick["blended"].index(max(pick["blended"]))
                    w = e["prior_weight"]
                    assert pick["blended"] == pytest.approx([s + w * lp for s, lp in zip(pick["scores"], lps)], abs=1e-4)
            assert final(d)["proposals"][final(d)["chosen"]] == action


def test_rerank_scorers_are_paired_on_the_same_draws(bench):
    """The proposals' RNG is keyed by (agent, seed), not by scorer: every scorer's first proposals are
    the same, and agent+critic+again plays agent+critic's game until its first fallback."""
    rr, _ = _rerank(bench)
    eps = {(e["scorer"], e["tier"], e["family"], e["seed"]): e for e in rr["episodes"]}
    for (scorer, tier, family, seed), e in eps.items():
        assert e["log"][0]["proposals"] == eps[("agent", tier, family, seed)]["log"][0]["proposals"]
        if scorer == "agent+critic+again":
            plain = eps[("agent+critic", tier, family, seed)]
            first = next((t for t, d in enumerate(e["log"]) if d["fallback"]), None)
            if first is None:
                assert e["actions"] == plain["actions"]
            else:
                assert e["actions"][:first] == plain["actions"][:first]


def test_rerank_table_sweep_and_reports(bench):
    import mlflow

    twx = bench["twx"]
    res = bench["results"]
    rr, cfg = _rerank(bench)
    per_family = cfg["seeds_per_family"] * len(cfg["tiers"])
    for scorer in cfg["scorers"]:
        for tier in [*cfg["tiers"], "all"]:
            for family in [*cfg["families"], "all"]:
                m = rr["table"][twx.rerank.cell_key("mistaken", 4, scorer, tier, family)]
                n = cfg["seeds_per_family"] * (len(cfg["families"]) if family == "all" else 1) \
                    * (len(cfg["tiers"]) if tier == "all" else 1)
                assert m["episodes"] == n and 0 <= m["ci95"][0] <= m["success"] <= m["ci95"][1] <= 1
                assert 1 <= m["mean_proposals"] <= 4
                if twx.rerank.uses_critic(scorer):
                    assert 0.0 <= m["fallback_rate"] <= 1.0
                else:
                    assert m["fallback_rate"] is None
                assert (m["asked_again_rate"] is not None) == scorer.endswith("+again")
                if scorer == "agent+oracle" and m["expert_picked"] is not None:
                    assert m["expert_picked"] == 1.0 and m["instead"] == []
        assert rr["table"][twx.rerank.cell_key("mistaken", 4, scorer, "all", "all")]["episodes"] == \
            per_family * len(cfg["families"])
    # the sweep: train-fold seeds in no tier and in no log, both weights tried, the winner used
    sweep = rr["sweep"]["mistaken|k4"]
    assert set(sweep["successes"]) == {"0.5", "2"} and sweep["chosen"] in (0.5, 2.0)
    assert rr["prior_weights"]["mistaken|k4"] == sweep["chosen"]
    assert all(e["prior_weight"] == sweep["chosen"] for e in rr["episodes"] if e["scorer"] == "agent+critic+prior")
    used = twx.used_seeds(twx.read_records("twx_train") + twx.read_records("twx_test"))
    for family, seeds in rr["sweep_seeds"].items():
        assert len(seeds) == 1 and all(s < 20000 and (family, "train", s) not in used for s in seeds)
        assert not set(seeds) & set(rr["seeds"][f"id|{family}"])
        assert sweep["successes"]["0.5"][1] == len(cfg["families"])
    # the tables in the markdown and the report, the figures in MLflow
    assert "Rerank protocol" in bench["markdown"] and "agent+critic+prior" in bench["markdown"]
    report = Path(res["report"]).read_text()
    assert "## Rerank protocol" in report and "Prior-weight sweep" in report
    metrics = mlflow.get_run(res["mlflow_run_id"]).data.metrics
    cell = rr["table"][twx.rerank.cell_key("mistaken", 4, "agent+critic", "all", "all")]
    assert metrics["rerank/mistaken/k4/agent_critic/success"] == cell["success"]
