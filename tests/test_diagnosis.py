"""Diagnosis detectors: each fires on a constructed bad case and stays quiet on a clean one;
the report writes its Markdown and valid PNGs, and says so when a plot has no data."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harnessrl import diagnosis as D

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


# ---- Q blow-up --------------------------------------------------------------------------------
def test_q_blowup_fires_beyond_the_reward_bound():
    f = D.q_blowup([1.0, -2.0, 25.0, 3.0], reward_bound=20.0)
    assert f is not None and f.severity == "error" and f.name == "q_blowup"
    assert f.measures["q_max_abs"] == 25.0 and f.measures["share_beyond"] == pytest.approx(0.25)
    assert "25" in f.evidence and "20" in f.evidence


def test_q_blowup_counts_non_finite_values():
    f = D.q_blowup([1.0, float("inf"), float("nan")], reward_bound=20.0)
    assert f is not None and f.measures["share_beyond"] == pytest.approx(2 / 3)


def test_q_blowup_quiet_within_bound():
    assert D.q_blowup([-20.0, 0.0, 19.9], reward_bound=20.0) is None
    assert D.q_blowup([], reward_bound=20.0) is None


# ---- entropy collapse -------------------------------------------------------------------------
def test_entropy_collapse_fires_when_entropy_falls_to_near_zero():
    full = math.log(8)
    curve = [(step, full * max(0.02, 1.0 - step / 50)) for step in range(0, 100, 5)]
    f = D.entropy_collapse(curve, vocab_size=8)
    assert f is not None and f.severity == "warn"
    assert f.measures["entropy_norm_start"] == pytest.approx(1.0)
    assert f.measures["entropy_norm_end"] == pytest.approx(0.02)


def test_entropy_collapse_quiet_on_healthy_or_never_high_curves():
    full = math.log(8)
    assert D.entropy_collapse([full * v for v in (1.0, 0.8, 0.6, 0.5, 0.5)], vocab_size=8) is None
    assert D.entropy_collapse([0.01, 0.01, 0.01], vocab_size=8) is None  # low from the start: not a collapse
    assert D.entropy_collapse([1.0], vocab_size=8) is None


# ---- reward hacking ---------------------------------------------------------------------------
STEPS = list(range(0, 100, 10))


def test_reward_hacking_fires_on_rising_reward_and_flat_success():
    reward = [(s, 1.0 + 0.1 * s) for s in STEPS]
    success = [(s, 0.4 + (0.01 if i % 2 else -0.01)) for i, s in enumerate(STEPS)]
    f = D.reward_hacking(reward, success)
    assert f is not None and f.severity == "warn"
    assert f.measures["reward_trend"] == pytest.approx(1.0)
    assert f.measures["success_gain"] <= 0.02


def test_reward_hacking_fires_when_success_falls():
    f = D.reward_hacking([float(s) for s in STEPS], [0.5 - 0.003 * s for s in STEPS])
    assert f is not None and f.measures["success_gain"] == pytest.approx(-0.27)


def test_reward_hacking_quiet_when_success_rises_with_reward():
    assert D.reward_hacking([(s, s) for s in STEPS], [(s, 0.1 + 0.005 * s) for s in STEPS]) is None


def test_reward_hacking_quiet_when_reward_does_not_rise():
    assert D.reward_hacking([(s, 5.0) for s in STEPS], [(s, 0.3) for s in STEPS]) is None
    assert D.reward_hacking([1.0, 2.0, 3.0], [0.1, 0.1, 0.1]) is None  # too few points to call a trend


# ---- conflicting transitions and aliased states -----------------------------------------------
def test_conflicting_transitions_counts_pairs_and_rows():
    states = ["s1", "s1", "s1", "s2", "s2", "s3"]
    actions = ["a", "a", "b", "a", "a", "a"]
    outcomes = [(0.0, False), (1.0, True), (1.0, True), (0.0, False), (0.0, False), (1.0, True)]
    f = D.conflicting_transitions(states, actions, outcomes)
    assert f is not None and f.severity == "warn"
    assert f.measures == {"count": 1.0, "rows": 2.0, "share": pytest.approx(2 / 6)}
    assert "'s1'" in f.evidence and "'a'" in f.evidence


def test_conflicting_transitions_rare_is_info_and_clean_is_quiet():
    states = [f"s{i}" for i in range(40)] + ["s0"]
    actions = ["a"] * 41
    outcomes = [0] * 40 + [1]
    f = D.conflicting_transitions(states, actions, outcomes)
    assert f is not None and f.severity == "info" and f.measures["share"] == pytest.approx(2 / 41)
    assert D.conflicting_transitions(states, actions, [0] * 41) is None


def test_aliased_states_with_and_without_actions():
    states = ["room", "room", "hall", "hall"]
    nxt = ["dark room", "lit room", "door", "window"]
    f = D.aliased_states(states, nxt, action_texts=["look", "look", "north", "south"])
    assert f is not None and f.measures["count"] == 1.0 and f.measures["rows"] == 2.0
    assert "'room'" in f.evidence
    assert D.aliased_states(states, nxt).measures["count"] == 2.0
    assert D.aliased_states(states, ["x", "x", "y", "y"]) is None


# ---- action loops -----------------------------------------------------------------------------
def test_action_loops_rate_and_severity():
    episodes = [["look", "look", "look"], ["n", "s", "n", "s", "n", "s"], ["take key", "open door"], ["go east"]]
    f = D.action_loops(episodes)
    assert f is not None and f.severity == "warn" and f.measures["loop_rate"] == pytest.approx(0.5)
    few = [["a", "a", "a"]] + [["a", "b"]] * 19
    assert D.action_loops(few).severity == "info"
    assert D.action_loops([["a", "b", "a", "b"], ["c"]]) is None
    assert D.action_loops([]) is None


# ---- coverage and OOD -------------------------------------------------------------------------
def test_thin_coverage_fires_and_names_the_thinnest():
    f = D.thin_coverage({"t1": 50, "t2": 2, "t3": 1, "t4": 40})
    assert f is not None and f.severity == "warn" and f.measures["thin_share"] == pytest.approx(0.5)
    assert f.evidence.index("'t3'") < f.evidence.index("'t2'")
    assert D.thin_coverage([50, 40, 30, 20, 1]).severity == "info"  # 1 of 5 is under the 25% bar
    assert D.thin_coverage({"t1": 5, "t2": 9}) is None
    assert D.thin_coverage({}).severity == "error"


def test_ood_rate_levels():
    assert D.ood_rate([0.1] * 9 + [0.9], threshold=0.5).severity == "warn"
    assert D.ood_rate([0.9] * 6 + [0.1] * 4, threshold=0.5).severity == "error"
    assert D.ood_rate([0.1] * 19 + [0.9], threshold=0.5) is None  # 5% is under the 10% bar
    assert D.ood_rate([], threshold=0.5) is None


# ---- report -----------------------------------------------------------------------------------
def _png_ok(path) -> bool:
    data = path.read_bytes()
    return data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR" and len(data) > 100


def test_render_report_writes_markdown_and_valid_pngs(tmp_path):
    rng = np.random.default_rng(0)
    findings = [D.q_blowup([50.0], 20.0), D.action_loops([["a", "a", "a"], ["b"]]),
                D.thin_coverage([1, 50, 50, 50, 50])]
    ret = rng.normal(size=300)
    arrays = {"q": rng.normal(size=500), "advantage": rng.normal(size=500),
              "value": ret + rng.normal(scale=0.1, size=300), "return_to_go": ret}
    curves = {"q_loss": [(s, 1.0 / (s + 1)) for s in range(20)], "td_error": [(0, 1.0), (10, 0.5)], "empty": []}
    report = D.render_report(findings, {"td": {"mae": 0.25}, "n_tasks": 3}, curves, arrays, tmp_path / "diag")
    assert report == tmp_path / "diag" / "report.md"
    text = report.read_text()
    for f in findings:
        assert f.name in text and f.what_to_try in text and f.evidence in text
    assert text.index("[ERROR] q_blowup") < text.index("[WARN] action_loops") < text.index("[INFO] thin_coverage")
    assert "| td/mae | 0.25 |" in text and "| n_tasks | 3 |" in text
    for name in ("learning_curves.png", "q_distribution.png", "advantage_hist.png", "value_vs_return.png"):
        assert _png_ok(tmp_path / "diag" / name)
        assert f"]({name})" in text
    assert "Not drawn" not in text


def test_render_report_without_data_draws_nothing_and_says_so(tmp_path):
    out = tmp_path / "diag"
    out.mkdir()
    (out / "q_distribution.png").write_bytes(b"stale")
    report = D.render_report([], {}, {"q_loss": []}, {"q": [float("nan")], "value": [], "return_to_go": []}, out)
    text = report.read_text()
    assert "No findings" in text and "_No metrics._" in text
    assert text.count("_Not drawn: no data._") == 4
    assert not list(out.glob("*.png"))


def test_render_report_rejects_unpaired_value_and_return(tmp_path):
    with pytest.raises(ValueError):
        D.render_report([], {}, None, {"value": [1.0, 2.0], "return_to_go": [1.0]}, tmp_path)


def test_served_ood_reads_the_service_flags():
    assert D.served_ood([True] + [False] * 9).severity == "warn"
    f = D.served_ood([True] * 6 + [False] * 4 + [None] * 5)  # unknown flags are not counted
    assert f.severity == "error" and f.measures["ood_rate"] == 0.6 and f.measures["decisions"] == 10
    assert D.served_ood([True] + [False] * 19) is None
    assert D.served_ood([None, None]) is None and D.served_ood([]) is None


def test_closed_loop_gap_separates_noise_from_a_real_gap():
    real = D.closed_loop_gap(2, 18, 16, 18)  # [0.03, 0.33] vs [0.67, 0.97]
    assert real.severity == "error" and real.measures["separated"] == 1.0
    assert abs(real.measures["gap"] - 14 / 18) < 1e-12
    noisy = D.closed_loop_gap(7, 18, 11, 18)  # 0.39 vs 0.61: the intervals overlap
    assert noisy.severity == "warn" and "overlap" in noisy.evidence
    assert D.closed_loop_gap(11, 18, 11, 18) is None and D.closed_loop_gap(12, 18, 11, 18) is None
    assert D.closed_loop_gap(0, 0, 3, 4) is None


def test_closed_loop_findings_of_played_episodes():
    loop = ["go north", "go south"] * 3
    episodes = ([{"scorer": "critic", "success": False, "actions": loop, "ood": [True, False]}] * 8
                + [{"scorer": "critic", "success": True, "actions": ["a", "b"], "ood": [False, False]}] * 2
                + [{"scorer": "mix", "success": True, "actions": ["a"]}] * 10
                + [{"scorer": "random", "success": False, "actions": ["a"]}] * 10)
    by_name = {f.name: f for f in D.closed_loop_findings(episodes)}
    assert set(by_name) == {"action_loops", "ood_rate", "closed_loop_gap"}  # random does worse: no finding
    assert by_name["action_loops"].measures["loop_rate"] == 0.8
    assert by_name["ood_rate"].measures["ood_rate"] == 0.4
    assert by_name["closed_loop_gap"].severity == "error" and "mix" in by_name["closed_loop_gap"].evidence
    assert D.closed_loop_findings([e for e in episodes if e["scorer"] != "critic"]) == []


def test_fallback_calibration_warns_only_beyond_five_points_and_the_sampling_error():
    assert D.fallback_calibration(0.12, 0.1, 300, 120) is None  # 2 points off
    assert D.fallback_calibration(0.17, 0.1, 30, 20) is None  # 7 points off, but 30 and 20 steps say little
    f = D.fallback_calibration(0.41, 0.1, 1000, 1000)
    assert f.name == "fallback_calibration" and f.severity == "warn" and "validation_fraction" in f.what_to_try
    assert f.measures["rate"] == 0.41 and "41.0% of 1000" in f.evidence
    low = D.fallback_calibration(0.01, 0.2, 1000, 1000)
    assert low is not None and "raise train.fallback_quantile" in low.what_to_try
    assert D.fallback_calibration(float("nan"), 0.1, 10, 10) is None and D.fallback_calibration(0.5, 0.1, 0, 10) is None


def test_fallback_separation_warns_when_flagged_choices_are_no_worse():
    assert D.fallback_separation(0.81, 0.47, 500) is None  # the flag picks out wrong choices
    f = D.fallback_separation(0.40, 0.47, 500)
    assert f.name == "fallback_separation" and f.measures["flagged"] == 500.0
    assert D.fallback_separation(0.4, 0.5, 0) is None and D.fallback_separation(float("nan"), 0.5, 3) is None


def test_served_ood_words_held_out_states():
    f = D.served_ood([True] * 3 + [False] * 7, what="the OOD check flagged {rate} of {n} held-out states")
    assert f.evidence == "the OOD check flagged 30.0% of 10 held-out states out of distribution"
    assert f.what_to_try.startswith("if these are tasks or items the logs never had, collect logs of them")


def test_fallback_sample_warns_when_the_threshold_rests_on_few_steps():
    assert D.fallback_sample(1000, 0.1) is None  # +-1.9 points
    f = D.fallback_sample(115, 0.1)  # the bundled corpus's count
    assert f.name == "fallback_sample" and f.severity == "warn" and "validation_fraction" in f.what_to_try
    assert f.measures["half_width"] == pytest.approx(0.0548, abs=1e-3) and f.measures["rows_needed"] == 139
    assert D.fallback_sample(f.measures["rows_needed"], 0.1) is None  # the count it asks for is enough
    assert D.fallback_sample(0, 0.1).severity == "error"
    assert D.fallback_sample(5, 0.0) is None  # a 0 quantile never flags: nothing to be unsure of


def test_fallback_sample_half_width_matches_thresholds_set_on_samples():
    """The stated +- is what happens: thresholds set at the 10% quantile of 115 draws flag new draws
    at rates whose 95% spread is the finding's half-width."""
    rng = np.random.default_rng(0)
    rates = [np.mean(rng.normal(size=4000) < np.quantile(rng.normal(size=115), 0.1)) for _ in range(1500)]
    spread = (np.quantile(rates, 0.975) - np.quantile(rates, 0.025)) / 2
    assert spread == pytest.approx(D.fallback_sample(115, 0.1).measures["half_width"], rel=0.2)
