"""The cross-encoder critic head (train.head: cross): it learns, it round-trips through the critic
folder without pickle, `Critic` scores with it, and the train job runs it on Ray Train."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from harnessrl.algorithms.cross import CrossConfig, CrossIQLNetwork, CrossLearner, CrossScorer, trunk_from_encoder
from harnessrl.config import CrossHeadConfig, TrainConfig
from harnessrl.encoders import BUILTIN_MINILM
from harnessrl.heads.cross import CrossHeadScorer
from harnessrl.model_card import ModelCard

COLORS = ["red", "blue", "green", "yellow", "white", "black"]


def _small(feature_dim: int = 2, alpha: float = 0.3, seed: int = 0) -> CrossLearner:
    torch.manual_seed(seed)
    trunk, tokenizer = trunk_from_encoder(BUILTIN_MINILM, 1, 64)
    cfg = CrossConfig(layers=1, max_length=64, hidden_dim=32, alpha=alpha, feature_dim=feature_dim, gamma=0.0,
                      trunk_lr=1e-4)
    net = CrossIQLNetwork(cfg, trunk)
    net.set_feature_stats([0.0] * feature_dim, [1.0] * feature_dim)
    return CrossLearner(cfg, net, tokenizer)


def _grid(scorer: CrossScorer) -> torch.Tensor:
    """Q of "open <a> door" in the state "you see a <c> door", for every colour pair (rows: c)."""
    states = [f"you see a {c} door" for c in COLORS for _ in COLORS]
    actions = [f"open {a} door" for _ in COLORS for a in COLORS]
    scorer.net.eval()
    return scorer.min_q(states, actions, torch.zeros(len(states), 2)).reshape(len(COLORS), len(COLORS))


def test_cross_learner_learns_which_action_matches_the_state(torch_one_thread):
    """Reward 1 for opening the door the state shows: only attention across state and action
    tells the pairs apart (every action text appears in rewarded and unrewarded pairs)."""
    rng = random.Random(0)
    learner = _small()
    before = _grid(learner.scorer)
    learner.core.train()
    for _ in range(150):
        states, actions, rewards = [], [], []
        for _ in range(16):
            c = rng.choice(COLORS)
            a = c if rng.random() < 0.5 else rng.choice([x for x in COLORS if x != c])
            states.append(f"you see a {c} door")
            actions.append(f"open {a} door")
            rewards.append(float(a == c))
        cand = [[f"open {rng.choice(COLORS)} door"] * 2 for _ in states]
        metrics = learner.update(states, actions, torch.tensor(rewards), states, torch.ones(16), torch.zeros(16, 2),
                                 cand, torch.ones(16, 2, dtype=torch.bool), torch.zeros(16, 2, 2))
    after = _grid(learner.scorer)
    assert set(metrics) >= {"loss_q", "loss_v", "cand_penalty", "td_error"}
    assert (after.argmax(1) == torch.arange(len(COLORS))).all()
    assert (before.argmax(1) == torch.arange(len(COLORS))).float().mean() < 0.5
    margin = after.diagonal() - (after.sum(1) - after.diagonal()) / (len(COLORS) - 1)
    assert margin.min() > 0.3  # matched pairs near 1, the others near 0


def _cross_card(learner: CrossLearner):
    from harnessrl.encoders import encoder_identity
    from harnessrl.model_card import ModelCard

    return ModelCard(head="cross", head_config=learner.cfg.to_dict(),
                     encoder=json.loads(encoder_identity(BUILTIN_MINILM, 64).to_json()),
                     render={"window": 3, "max_chars": 1500}, reward_scale=0.5)


def test_cross_critic_folder_round_trips_without_pickle(tmp_path, torch_one_thread):
    from harnessrl.critic import Critic
    from harnessrl.model_files import load_critic_files, save_critic

    learner = _small(feature_dim=0, alpha=0.0)
    with torch.no_grad():  # weights the bundled model does not have, so a load from it would differ
        for p in learner.core.trunk.encoder.layer[0].parameters():
            p.add_(0.01 * torch.randn_like(p))
    learner.core.eval()
    save_critic(tmp_path, CrossHeadScorer(learner.scorer), _cross_card(learner))
    trunk_files = sorted(p.name for p in (tmp_path / "trunk").iterdir())
    assert "config.json" in trunk_files and "tokenizer.json" in trunk_files
    assert not [f for f in trunk_files if f.endswith((".bin", ".pt", ".pkl", ".safetensors"))]
    assert json.loads((tmp_path / "trunk" / "config.json").read_text())["num_hidden_layers"] == 1

    scorer, card = load_critic_files(tmp_path)
    states, actions = ["you see a red door", "you see a blue door"], ["open red door", "open blue door"]
    assert torch.allclose(scorer.scorer.min_q(states, actions), learner.scorer.min_q(states, actions), atol=1e-5)

    critic = Critic(scorer, card)  # no encoder: nothing is embedded for a cross head without an OOD reference
    scores = critic.score("you see a red door", ["open red door", "open blue door"])
    expect = learner.scorer.min_q(["you see a red door"] * 2, ["open red door", "open blue door"]) / 0.5
    assert np.allclose(scores, expect.numpy(), atol=1e-4)
    q, v, v2 = critic.values(states, actions, states[::-1])
    assert np.allclose(q, learner.scorer.min_q(states, actions).numpy() / 0.5, atol=1e-4)
    assert np.allclose(v2, learner.scorer.value(states[::-1]).numpy() / 0.5, atol=1e-4)
    assert critic.prepare([("you see a red door", ["open red door"])]).texts == []


def test_cross_head_config():
    cfg = TrainConfig(head="cross", cross={"layers": 2, "max_length": 128})
    assert cfg.cross == CrossHeadConfig(layers=2, max_length=128)
    from harnessrl.config import ConfigError, parse_pipeline

    with pytest.raises(ConfigError, match="train.head"):
        parse_pipeline({"name": "x", "data": {"train": ["a.jsonl"]}, "train": {"head": "crossencoder"}}, origin="t")


@pytest.mark.integration
def test_train_job_fits_exports_evaluates_and_serves_a_cross_critic(encoded, work, sample_slice, tmp_path):
    """Two DDP workers on Ray Train, held-out validation, the exported critic loaded by
    `Critic.load` and scoring exactly as its own network does, offline evaluation, and Serve."""
    from harnessrl.critic import Critic
    from harnessrl.jobs.train import train

    cfg = TrainConfig(head="cross", cross=CrossHeadConfig(layers=1, max_length=64, batch_size=8), steps=12,
                      num_workers=2, cpus_per_worker=0.5, checkpoint_every=6, log_every=6, validation_fraction=0.3,
                      select="best", alpha=0.3, candidates_per_step=2)
    card = ModelCard(head_config={}, encoder=encoded.encoder,
                     render={"window": 3, "max_chars": 1500, "tool_from": "first_word"})
    result = train(str(work["dir"] / "encoded"), str(work["dir"] / "cross-train"), cfg, "cross-test",
                   str(work["dir"] / "cross-model"), card)
    m = result.metrics
    assert m["step"] == 12 and m["val_best_step"] in (6, 12) and np.isfinite(m["val_best_td_error"])
    assert np.isfinite(m["loss_q"]) and "cand_penalty" in m and np.isfinite(result.fallback_threshold)

    critic = Critic.load(result.model_dir)
    assert isinstance(critic.scorer, CrossHeadScorer) and critic.card.head == "cross" and critic.tool_head is None
    assert critic.card.head_config["layers"] == 1 and critic.uses_features
    state = {"task": "find the coin", "history": [], "observation": "You are in the kitchen. A door leads north."}
    decision = critic.decide(state, ["move north", "take coin", "look around"])
    assert len(decision.scores) == 3 and all(np.isfinite(decision.scores)) and decision.ood is not None
    parsed = critic.parse_state(state)
    from harnessrl.features import features_for

    f = torch.tensor(features_for(parsed.history, parsed.observation, ["move north"], "first_word"))
    direct = critic.scorer.scorer.min_q([parsed.text], ["move north"], f) / critic.reward_scale
    assert decision.scores[0] == pytest.approx(float(direct[0]), abs=1e-5)

    from harnessrl.jobs.evaluate import evaluate

    report = evaluate(result.model_dir, [str(sample_slice["test"])], "auto", str(tmp_path / "eval"),
                      log_to_mlflow=False)
    assert report.metrics["steps"] > 0 and np.isfinite(report.metrics["td_mae"])
    assert 0 <= report.metrics["expert_top1"] <= 1 and report.metrics["expert_n_steps"] > 0

    import httpx

    from conftest import free_port
    from harnessrl.serving import app as serving

    url = serving.start(result.model_dir, port=free_port())
    try:
        body = httpx.post(f"{url}/v1/score", json={"state": state, "candidates": ["move north", "take coin"]},
                          timeout=60).json()
    finally:
        serving.stop()
    assert body["scores"] == pytest.approx(critic.score(state, ["move north", "take coin"]), abs=1e-4)
    assert body["ood"] is not None


def test_text_rows_pair_each_untaken_candidate_with_its_features():
    """The encode stage keeps a prefix of each row's candidate features (train.max_candidates);
    the cross head's rows must pair the same candidates with them."""
    import pyarrow as pa

    from harnessrl.heads.cross import load_text_rows
    from harnessrl.transitions import untaken_candidates

    cands = ["go north", "take coin", "look", "open door", "inventory"]
    order = untaken_candidates("look", cands)
    feats = [[float(cands.index(c)), 1.0] for c in order][:3]  # what the encoded data keeps: a prefix
    table = pa.table({"state_text": ["s"], "action_text": ["look"], "next_state_text": ["s2"], "reward": [1.0],
                      "done": [True], "features": [[0.0, 1.0]], "candidates": [cands],
                      "candidate_features": [feats], "outcome_success": [None]})
    rows = load_text_rows([table])
    assert rows["cand"][0] == order[:3] and "look" not in rows["cand"][0]
    assert [int(f[0]) for f in rows["cand_f"][0]] == [cands.index(c) for c in rows["cand"][0]]
    assert rows["features"].shape == (1, 2) and rows["reward"].tolist() == [1.0]
    assert rows["outcome_success"].tolist() == [False]


def test_cross_learners_checkpoint_round_trip(tmp_path, torch_one_thread):
    """Resuming a cross run restores the trunk, the heads and the optimiser (there is no target copy)."""
    import pyarrow as pa

    from harnessrl.heads.cross import CrossHead

    config = {"network": CrossConfig(layers=1, max_length=32, hidden_dim=16).to_dict(), "encoder_name": BUILTIN_MINILM,
              "reward_scale": 1.0, "candidates_per_step": 2, "batch_size": 4, "seed": 0}
    rows = [pa.table({"state_text": ["a red door"], "action_text": ["open it"], "next_state_text": ["an open door"],
                      "reward": [1.0], "done": [True], "features": [[]], "candidates": [None],
                      "candidate_features": [[]], "outcome_success": [True]})]

    def learners():
        return CrossHead().worker(config, rows, None, 1, "cpu").learners

    first = learners()
    first.critic.update(["a red door"] * 4, ["open it"] * 4, torch.ones(4), ["an open door"] * 4, torch.ones(4))
    first.save(str(tmp_path), 7, {"reward_scale": 1.0})
    again = learners()
    assert again.load(str(tmp_path)) == 7
    for (name, a), b in zip(first.critic.core.state_dict().items(), again.critic.core.state_dict().values()):
        assert torch.equal(a, b), name
    assert again.critic.opt.state_dict()["state"].keys() == first.critic.opt.state_dict()["state"].keys()
    assert torch.equal(again.critic.opt.state_dict()["state"][0]["exp_avg"],
                       first.critic.opt.state_dict()["state"][0]["exp_avg"])


def test_cross_scorer_is_safe_under_concurrent_requests(torch_one_thread):
    """The service scores batches from several threads: every result must equal the sequential one
    (nothing shared between calls, the tokeniser included, may fail or mix their inputs)."""
    from concurrent.futures import ThreadPoolExecutor

    scorer = _small(feature_dim=0, alpha=0.0).scorer
    scorer.net.eval()
    long = " ".join(f"room {i} has a door" for i in range(60))  # cut at 64 tokens: truncation differs per call kind
    jobs = [([f"you see a {c} door, step {i}. {long}"] * 3, [f"open {c} door", "wait", f"look at the {c} wall"])
            for i in range(40) for c in COLORS[:2]]

    def run(job):  # pairs (the state truncated first) and single states (longest first), as a service batch does
        return scorer.min_q(*job), scorer.value(job[0])

    expected = [run(job) for job in jobs]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(run, jobs))
    assert all(torch.allclose(g[0], e[0], atol=1e-5) and torch.allclose(g[1], e[1], atol=1e-5)
               for g, e in zip(got, expected))


def test_pairs_fit_the_budget_whichever_text_is_long(torch_one_thread):
    """A long state is cut from its end and keeps the action whole; an action longer than the
    budget (a tool call with a big argument) is cut too instead of failing the batch."""
    scorer = _small(feature_dim=0, alpha=0.0).scorer
    long = " ".join(f"word{i}" for i in range(600))
    x = scorer.pairs([long, "you see a red door", "short"], ["open red door", long, long])
    assert x["input_ids"].shape[1] == 64
    first = scorer.tokenizer.decode(x["input_ids"][0][x["attention_mask"][0].bool()])
    assert first.endswith("[SEP] open red door [SEP]") and first.startswith("[CLS] word0 word1")
    assert torch.isfinite(scorer.min_q([long, "short"], [long, "open"])).all()
