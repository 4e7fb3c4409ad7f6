"""The reader head (train.head: reader): its network reads details a pooled vector blurs, it trains
through the shared IQL objective, and a critic of it round-trips through export, `Critic.load` and
the service with equal scores; its fallback and OOD flags are calibrated on held-out tasks."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
import torch

from harnessrl.algorithms.reader import ReaderConfig, ReaderNetwork
from harnessrl.encoders import BUILTIN_MINILM

from conftest import free_port

WORD_DIM = 384


@pytest.fixture(scope="module")
def inputs():
    from harnessrl.heads.reader import _inputs

    return _inputs(ReaderConfig(tokens=True), BUILTIN_MINILM, None)


def _batch(inputs, states, candidates):
    from harnessrl.heads.reader_inputs import as_tensors, assemble

    return as_tensors(assemble(inputs, states, candidates))


def test_the_batch_holds_each_distinct_text_once_and_indexes_states_into_it(inputs):
    from harnessrl.heads.reader_inputs import assemble

    shared = ("task", 0, "Walk to the goal.")
    states = [[shared, ("observation", 0, "row 1, column 2")], [shared, ("observation", 0, "row 2, column 1")]]
    b = assemble(inputs, states, [["go north", "go west"], ["go north"]], next_states=[[shared], [shared]])
    assert b["t_mask"].shape[0] == 5  # task, two observations, two candidates: each once, next states included
    assert b["s_u"][0, 0] == b["s_u"][1, 0] == b["n_u"][0, 0]  # the task is shared, not copied
    assert b["s_u"][0, 1] != b["s_u"][1, 1]
    assert b["k_mask"].tolist() == [[True, True], [True, False]]
    assert b["c_u"][0, 0] == b["c_u"][1, 0] and b["c_u"][0, 1] != b["c_u"][0, 0]


def test_match_gives_the_share_of_the_candidates_words_found_in_each_role(inputs):
    from harnessrl.algorithms.reader import ROLE_ID
    from harnessrl.heads.reader_inputs import assemble

    b = assemble(inputs, [[("task", 0, "take the red apple"), ("observation", 0, "a kitchen")]],
                 [["take red apple", "take blue pen"]])
    task, observation = b["match"][0, :, ROLE_ID["task"]], b["match"][0, :, ROLE_ID["observation"]]
    assert task[0] == pytest.approx(1.0) and task[1] == pytest.approx(1 / 3)
    assert observation.tolist() == [0.0, 0.0]


def test_a_state_without_its_history_keeps_its_task_and_observation():
    from harnessrl.heads.reader_inputs import without_history
    from harnessrl.render import Renderer, Turn

    r = Renderer()
    full = [(s.role, s.age, s.text) for s in r.segments("Find the key.", [Turn("look", "A hall."), Turn("go north", "A cellar.")],
                                                        "A cellar. A key lies here.")]
    empty = [(s.role, s.age, s.text) for s in r.segments("Find the key.", [], "A cellar. A key lies here.")]
    assert {s[0] for s in full} > {"task", "observation"}
    assert without_history(full) == empty  # what serving builds from a request without history
    assert r.features([], "A cellar. A key lies here.", ["take key"]) == [[0.0] * 5]  # and its features are zero


def test_the_candidate_penalty_skips_candidates_taken_elsewhere_in_the_data():
    from harnessrl.heads.reader import penalty_mask

    seen = {"go north", "eat meal"}
    mask = penalty_mask([["go north", "eat meal", "eat red pepper"], ["eat meal", "go north"]], 3, seen)
    assert mask.tolist() == [[False, True], [False, False]]  # taken elsewhere, or padding: not penalised
    assert penalty_mask([["a", "b", "c"]], 3, set()).tolist() == [[True, True]]  # penalty_on: untaken


def test_the_penalty_on_unseen_here_skips_only_candidates_taken_from_the_same_observation():
    from harnessrl.heads.reader import penalty_mask, taken_here

    seen = {taken_here("At the door.", "go north"), taken_here("In the hall.", "eat meal")}
    cands = [["open door", "go north", "eat meal"], ["go north", "eat meal", "open door"]]
    mask = penalty_mask(cands, 3, seen, ["At the door.", "In the hall."])
    # "eat meal" was taken, but in the hall: at the door the data says nothing of it
    assert mask.tolist() == [[False, True], [False, True]]


def test_the_saved_weights_leave_the_word_table_to_the_encoder(tmp_path):
    from safetensors.torch import load_file

    from harnessrl.model_files import save_weights

    net = ReaderNetwork(ReaderConfig())
    save_weights(net, tmp_path / "w.safetensors")
    saved = load_file(str(tmp_path / "w.safetensors"))
    assert not any(v.numel() >= 30_000 * WORD_DIM for v in saved.values())
    assert {"sem_mean", "sem_std", "feat_mean", "feat_std"} <= set(saved)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no GPU visible"))])
def test_a_reader_critic_loads_onto_the_device_asked_for_and_scores_the_same(device, tmp_path, torch_one_thread):
    """`ReaderHead.load(device=...)` puts the network there (`Critic.load`'s device: a service replica's
    GPU), and the scorer sends its batches there: the same scores as the network in memory."""
    from types import SimpleNamespace

    from harnessrl.heads.reader import ReaderHead, ReaderScorer, _inputs

    cfg = ReaderConfig(semantic=False, tokens=True, dim=16, hidden_dim=16)
    torch.manual_seed(0)
    net = ReaderNetwork(cfg)
    for p in net.parameters():  # nothing left at its zero or unit init: every weight counts
        p.data.normal_(0, 0.3)
    ReaderHead().save(str(tmp_path), SimpleNamespace(net=net))
    card = SimpleNamespace(head_config=cfg.to_dict(), identity=SimpleNamespace(model_name=BUILTIN_MINILM))
    loaded = ReaderHead().load(str(tmp_path), card, device)
    assert loaded.device.type == device and all(p.device.type == device for p in loaded.net.parameters())
    segs = [[("task", 0, "Reach the goal."), ("observation", 0, f"You are at row {r}, column {c}.")]
            for r, c in ((1, 2), (2, 1), (3, 3))]
    cands = [["go east", "go south"], ["go north"], ["go west", "go east", "go south"]]
    want = ReaderScorer(net, _inputs(cfg, BUILTIN_MINILM, None))._q(segs, cands, None, None)
    got = loaded._q(segs, cands, None, None)
    assert got.shape == (6,) and np.ptp(want) > 1e-3
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_tokens_tell_apart_states_that_differ_in_one_number(inputs, torch_one_thread):
    """Two grid states whose sentence embeddings nearly coincide and whose best moves are opposite:
    the token path learns to rank them (a supervised check of what it can read)."""
    states = [[("task", 0, "Reach the goal."), ("observation", 0, f"You are at row {r}, column {c} of the lake.")]
              for r, c in ((1, 2), (2, 1), (3, 4), (4, 3))]
    candidates = [["go east", "go south"]] * 4
    gold = [0, 1, 0, 1]
    torch.manual_seed(0)
    net = ReaderNetwork(ReaderConfig(semantic=False, tokens=True, match=False, dim=32, hidden_dim=32))
    b, y = _batch(inputs, states, candidates), torch.tensor(gold)

    def logits():
        x = net.stream(b)
        return torch.minimum(*net.q(net.state(x, b, "s"), x, b))

    opt = torch.optim.Adam(net.parameters(), 3e-3)
    for _ in range(150):
        loss = torch.nn.functional.cross_entropy(logits(), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        assert logits().argmax(1).tolist() == gold


def test_the_observations_details_are_read(inputs, torch_one_thread):
    """With render.details, a state's lines and sentences are segments of their own (role `detail`):
    the network reads them (Q moves when one detail alone changes; that a state without its history
    keeps them is tests/test_segments.py's)."""
    from harnessrl.config import RenderConfig
    from harnessrl.render import Renderer, Turn

    r = Renderer(RenderConfig(details=8))
    obs = "The taxi is at row 2, column 3. The passenger waits at the red stand."
    state = [(s.role, s.age, s.text) for s in r.segments("Deliver.", [Turn("look", "A town.")], obs)]
    assert [s for s in state if s[0] == "detail"] == [("detail", 0, "The taxi is at row 2, column 3."),
                                                      ("detail", 0, "The passenger waits at the red stand.")]
    other = [s if s[2] != "The passenger waits at the red stand." else ("detail", 0, "The passenger waits at the blue stand.")
             for s in state]  # one detail differs, the observation segment is the same
    torch.manual_seed(0)
    net = ReaderNetwork(ReaderConfig(semantic=False, tokens=True, match=False, dim=32, hidden_dim=32))
    b = _batch(inputs, [state, other], [["drive north", "pick up the passenger"]] * 2)
    with torch.no_grad():
        x = net.stream(b)
        q = torch.minimum(*net.q(net.state(x, b, "s"), x, b))
    assert not torch.allclose(q[0], q[1])


def _reader_rows(n: int) -> tuple[list[dict], list[str]]:
    """n reader-layout transition rows over a few observations and actions, and every text they name."""
    rng = np.random.default_rng(0)
    obs = [f"You are in room {i}." for i in range(6)]
    acts = ["go north", "go south", "open door", "take key"]
    rows = []
    for i in range(n):
        o, o2 = rng.choice(obs), rng.choice(obs)
        seg = lambda text: [{"role": "task", "age": 0, "text": "Find the key."},  # noqa: E731
                            {"role": "observation", "age": 0, "text": text}]
        rows.append({"episode_id": f"e{i // 5}", "step_idx": i % 5, "state_segments": seg(o),
                     "next_state_segments": seg(o2), "action_text": acts[i % 4], "candidates": acts,
                     "features": [], "candidate_features": [], "reward": float(rng.normal()),
                     "done": i % 5 == 4, "outcome_success": i % 2 == 0, "tool": None})
    return rows, ["Find the key.", *obs, *acts]


def _worker_shard(tmp_path) -> tuple[list[dict], str]:
    """40 reader rows without candidate features (every untaken candidate is drawn: value target,
    penalty) and a `_texts` folder holding an 8-d vector for each text they name."""
    import pyarrow.parquet as pq

    from harnessrl.encoders import text_hash

    rows, texts = _reader_rows(40)
    for row in rows:
        row["candidate_features"] = None
    folder = tmp_path / "_texts"
    folder.mkdir()
    emb = np.random.default_rng(1).normal(size=(len(texts), 8)).astype(np.float32)
    pq.write_table(pa.table({"text_hash": [text_hash(t) for t in texts],
                             "emb": pa.array(emb.tolist(), pa.list_(pa.float32(), 8))}), folder / "part.parquet")
    return rows, str(folder)


def test_the_text_table_embeds_what_it_holds_and_refuses_or_hands_on_what_it_lacks(tmp_path):
    import pyarrow.parquet as pq

    from harnessrl.embedding_cache import emb_array
    from harnessrl.encoders import text_hash
    from harnessrl.errors import DataError
    from harnessrl.heads.reader import table_embed

    held = np.arange(12, dtype=np.float32).reshape(3, 4)
    pq.write_table(pa.table({"text_hash": [text_hash(t) for t in ("a", "b", "c")], "emb": emb_array(held, "float32")}),
                   tmp_path / "part-0.parquet")
    np.testing.assert_array_equal(table_embed(str(tmp_path))(["c", "a"]), held[[2, 0]])
    with pytest.raises(DataError, match="no embedding for 'x'"):
        table_embed(str(tmp_path))(["a", "x"])
    asked = []

    def fallback(texts):
        asked.append(list(texts))
        return np.full((len(texts), 4), -1.0, np.float32)

    out = table_embed(str(tmp_path), missing=fallback)(["x", "b", "y"])
    assert asked == [["x", "y"]]  # only the texts the table lacks
    np.testing.assert_array_equal(out, [[-1.0] * 4, held[1], [-1.0] * 4])
    np.testing.assert_array_equal(table_embed(str(tmp_path), missing=fallback)(["b"]), held[[1]])
    assert len(asked) == 1


def test_role_statistics_streamed_in_parts_equal_those_of_the_whole():
    from harnessrl.algorithms.reader import ROLE_ID
    from harnessrl.heads.reader import load_rows, role_stats

    rows, texts = _reader_rows(40)
    vec = {t: np.random.default_rng(i).normal(size=8) for i, t in enumerate(texts)}

    def embed(ts):
        return np.stack([vec[t] for t in ts]).astype(np.float32)

    table = pa.Table.from_pylist(rows)
    whole = role_stats([load_rows([table])], embed, 8)
    parts = role_stats((load_rows([table.slice(i, 7)]) for i in range(0, 40, 7)), embed, 8)
    np.testing.assert_allclose(parts[0], whole[0], atol=1e-6)
    np.testing.assert_allclose(parts[1], whole[1], atol=1e-6)
    observations = embed(sorted({r["state_segments"][1]["text"] for r in rows}
                                | {r["next_state_segments"][1]["text"] for r in rows}))
    np.testing.assert_allclose(whole[0][ROLE_ID["observation"]], observations.mean(0), atol=1e-5)
    np.testing.assert_allclose(whole[1][ROLE_ID["observation"]], observations.std(0), atol=1e-5)


@pytest.mark.parametrize("replay,penalty_on", [("stream", "unseen"), ("memory", "unseen"), ("stream", "unseen_here"),
                                               ("memory", "unseen_here")])
def test_a_reader_worker_streams_its_shard_or_holds_it(replay, penalty_on, tmp_path, torch_one_thread):
    """train.replay: stream reads the shard epoch after epoch (a buffer of rows, never all of them);
    memory reads it once (the penalty's set of taken pairs included) and samples from it. Both train.
    With penalty_on: unseen_here the candidate penalty reaches actions taken elsewhere but not from
    the state's room."""
    from harnessrl.heads.base import Shard
    from harnessrl.heads.reader import ReaderHead

    from conftest import ShardReader

    rows, texts_dir = _worker_shard(tmp_path)
    alpha = 0.5 if penalty_on == "unseen_here" else 0.0
    config = {"network": ReaderConfig(sem_dim=8, dim=16, hidden_dim=16, value_target="candidates",
                                      alpha=alpha).to_dict(),
              "encoder_name": BUILTIN_MINILM, "texts_dir": texts_dir, "role_stats": None,
              "batch_size": 8, "history_dropout": 0.25, "penalty_on": penalty_on, "tool_head": None,
              "tool_vocab": [], "candidates_per_step": 2, "reward_scale": 1.0, "seed": 0, "replay": replay,
              "shuffle_buffer": 16}
    reader = ShardReader(pa.Table.from_pylist(rows))
    setup = ReaderHead().worker(config, Shard(reader), None, 1, "cpu")
    before = [p.detach().clone() for p in setup.learners.critic.core.parameters()]
    gen = torch.Generator().manual_seed(0)
    metrics = [setup.step(gen) for _ in range(12)]  # 96 rows: 2.4 passes over the shard's 40
    assert all(np.isfinite(m["loss_q"]) and np.isfinite(m["loss_v"]) for m in metrics)
    assert any(not torch.equal(a, b) for a, b in zip(before, setup.learners.critic.core.parameters()))
    # the stream reads the 40 rows pass after pass (at least 3 for 96 rows drawn)
    assert reader.epochs >= 3 if replay == "stream" else reader.epochs == 1
    if alpha:  # every action is taken in some room, not every action in every room: unseen would penalise none
        assert any(m["cand_penalty"] > 0 for m in metrics), metrics


def test_the_supported_value_target_maximises_over_candidates_taken_from_the_same_observation(tmp_path, monkeypatch,
                                                                                              torch_one_thread):
    """value_target: supported: the V target's max reaches the taken action and the candidates some row
    took from the same observation, not those the data never took there."""
    from harnessrl.heads import reader as head
    from harnessrl.heads.base import Shard

    from conftest import ShardReader

    rows, texts_dir = _worker_shard(tmp_path)
    config = {"network": ReaderConfig(sem_dim=8, dim=16, hidden_dim=16, value_target="supported").to_dict(),
              "encoder_name": BUILTIN_MINILM, "texts_dir": texts_dir, "role_stats": None,
              "batch_size": 8, "history_dropout": 0.25, "penalty_on": "unseen", "tool_head": None,
              "tool_vocab": [], "candidates_per_step": 3, "reward_scale": 1.0, "seed": 0, "replay": "memory"}
    assembled, updated = [], []
    real = head.assemble
    monkeypatch.setattr(head, "assemble", lambda inp, s, c, n=None: assembled.append((s, c)) or real(inp, s, c, n))
    setup = head.ReaderHead().worker(config, Shard(ShardReader(pa.Table.from_pylist(rows))), None, 1, "cpu")
    update = setup.learners.critic.update
    setup.learners.critic.update = lambda b, *a: updated.append(b["v_mask"].numpy()) or update(b, *a)
    gen = torch.Generator().manual_seed(0)
    for _ in range(6):
        setup.step(gen)
    pairs = {(r["state_segments"][1]["text"], r["action_text"]) for r in rows}
    kept = dropped = 0
    for (states, cands), v_mask in zip(assembled, updated):
        for i, (state, cs) in enumerate(zip(states, cands)):
            obs = head.state_text(state)
            want = [True] + [(obs, c) in pairs for c in cs[1:]]
            assert v_mask[i, :len(cs)].tolist() == want and not v_mask[i, len(cs):].any()
            kept, dropped = kept + sum(want[1:]), dropped + len(want) - 1 - sum(want[1:])
    assert kept and dropped  # both kinds were drawn: the check could fail either way


@pytest.mark.integration
def test_a_reader_critic_trains_exports_loads_and_serves_with_equal_scores(ray_local, harnessrl_home, tmp_path):
    import httpx

    from harnessrl.config import parse_pipeline
    from harnessrl.critic import Critic
    from harnessrl.examples import tabular as T
    from harnessrl.jobs.evaluate import evaluate
    from harnessrl.jobs.pipeline import run_pipeline
    from harnessrl.rewards import load_recipe
    from harnessrl.serving import app as serving

    mdp = T.build("frozenlake", "a")
    weights = load_recipe("default").model_dump()
    logs, heldout = tmp_path / "train.jsonl", tmp_path / "heldout.jsonl"
    # actions named by their direction alone ("left", not "move left"): each its own tool for the tool head
    actions = [a.removeprefix("move ") for a in mdp.actions]
    # 320 episodes: each reachable state's every action logged a few times (160 left some once, and an
    # action seen once is ranked by what the network guesses, which flipped between seeds)
    for path, seed, n in ((logs, 0, 320), (heldout, 1, 60)):
        path.write_text("".join(json.dumps(e).replace('"move ', '"') + "\n"
                                for e in mdp.episodes(n, seed, 0.3, 0.95, weights, 25)))
    cfg = parse_pipeline({"name": "reader-it", "output_dir": str(tmp_path / "run"), "data": {"train": [str(logs)]},
                          "train": {"head": "reader", "steps": 2400, "log_every": 500, "checkpoint_every": 1000,
                                    "validation_fraction": 0.2, "reader": {"batch_size": 32, "prior_steps": 100}},
                          "render": {"tool_from": "first_word"},
                          "serve": {"enabled": False}, "registry": {"model_name": "reader-it"}})
    assert cfg.encoder.segments is True and cfg.encoder.state_texts is False
    summary = run_pipeline(cfg)
    critic = Critic.load(summary["model"]["uri"])
    assert critic.card.head == "reader" and critic.card.ood is not None and critic.threshold is not None

    # the CI-sized version of bench/tabular.py: asked about every reachable state with an empty
    # history, its greedy choice is optimal under the exact Q* (a random scorer's share is about 0.3)
    Q, index = mdp.q_star(cfg.train.gamma, weights), {s: i for i, s in enumerate(mdp.states)}
    everywhere = critic.score_batch([({"task": mdp.task_text, "history": [], "observation": mdp.observation(s)},
                                      actions) for s in mdp.reachable])
    optimal = [Q[index[s]][int(np.argmax(sc))] >= Q[index[s]].max() - 1e-6 for s, sc in zip(mdp.reachable, everywhere)]
    assert np.mean(optimal) >= 0.9, optimal

    states = [{"task": mdp.task_text, "history": [], "observation": mdp.observation(s)} for s in mdp.reachable[:5]]
    local = [critic.score(s, actions) for s in states]
    again = Critic.load(str(tmp_path / "run" / "model"))  # the critic folder, not the registry
    assert np.allclose([again.score(s, actions) for s in states], local, atol=1e-5)
    # the behaviour prior: saved and loaded with the critic; decide ranks by score + w * log pi_beta
    assert critic.has_prior and again.has_prior
    prep = critic.prepare([(s, actions) for s in states])
    priors = critic.prior_logprobs(prep)
    assert np.allclose(again.prior_logprobs(again.prepare([(s, actions) for s in states])), priors, atol=1e-5)
    assert all(abs(sum(np.exp(p)) - 1) < 1e-4 for p in priors)
    for s, sc, lp in zip(states, local, priors):
        blended = np.asarray(sc) + 5.0 * np.asarray(lp)
        assert critic.decide(s, actions, prior_weight=5.0).best_index == int(np.argmax(blended))
        by_default = critic.decide(s, actions)  # prior_weight 1, as the service
        assert np.allclose(by_default.ranking, np.asarray(sc) + np.asarray(lp), atol=1e-4)
        assert by_default.best_index == int(np.argmax(by_default.ranking))
        alone = critic.decide(s, actions, prior_weight=0)
        assert alone.ranking is None and alone.best_index == int(np.argmax(sc))
    # the pipeline's held-out figure is measured both ways: the scores alone, and as the service ranks
    from harnessrl.evaluation import gold_top1
    rows = [{"state": s, "candidates": actions, "expert": actions[int(np.argmax(np.asarray(sc) + np.asarray(lp)))]}
            for s, sc, lp in zip(states, local, priors)]
    ev = gold_top1(critic, rows)
    assert ev["gold_top1_prior"] == 1.0 and ev["prior_weight"] == 1.0
    assert ev["gold_top1"] == np.mean([r["expert"] == actions[int(np.argmax(sc))] for r, sc in zip(rows, local)])
    assert "gold_top1_prior" not in gold_top1(critic, rows, prior_weight=0)
    # the tool head reads the observation's embedding: one choice per state, the same after a reload
    assert set(actions) <= set(critic.tool_vocab), critic.tool_vocab
    tools = [critic.select_tool(s).probabilities for s in states]
    assert np.allclose([again.select_tool(s).probabilities for s in states], tools, atol=1e-6)


    url = serving.start(summary["model"]["uri"], "127.0.0.1", free_port())
    try:
        with httpx.Client(base_url=url, timeout=60) as http:
            info = http.get("/v1/model").json()
            assert info["behaviour_prior"] is True and info["prior_weight"] == 1.0  # the serve config's default
            for state, expect, lp in zip(states, local, priors):
                # no logprob of the agent's: the model's prior, at the service's weight (1) or the request's
                for weight in (None, 5.0):
                    body = http.post("/v1/score", json={"agent_id": "it", "state": state, "candidates": actions,
                                                        "prior_weight": weight})
                    assert body.status_code == 200, body.text
                    body, w = body.json(), weight or 1.0
                    assert np.allclose(body["scores"], expect, atol=1e-5)
                    assert body["prior_weight"] == w and body["prior"] == "model"
                    assert np.allclose(body["blended_scores"], np.asarray(expect) + w * np.asarray(lp), atol=1e-4)
                    assert body["best_index"] == int(np.argmax(body["blended_scores"]))
                off = http.post("/v1/score", json={"agent_id": "it", "state": state, "candidates": actions,
                                                   "prior_weight": 0}).json()
                assert off["blended_scores"] is None and off["prior"] is None
                assert off["best_index"] == int(np.argmax(expect))
            for state, expect in zip(states, tools):
                body = http.post("/v1/select_tool", json={"agent_id": "it", "state": state})
                assert body.status_code == 200, body.text
                assert np.allclose(body.json()["probabilities"], expect, atol=1e-5)
    finally:
        serving.stop()

    # calibrated on held-out task groups: fresh episodes of the same task get the configured share of
    # fallbacks on the steps of successful episodes and almost no OOD flags
    result = evaluate(summary["model"]["uri"], [str(heldout)], "native", str(tmp_path / "eval"), None,
                      log_to_mlflow=False, include_seen=True)
    m, q = result.metrics, critic.card.fallback_quantile
    # both sides are samples (the threshold is a quantile of card.fallback_rows held-out steps, the rate
    # a share of success_steps fresh ones): agree within three standard errors of the two counts
    n_cal, n_eval = critic.card.fallback_rows, m["success_steps"]
    assert n_cal and n_eval >= 30, (n_cal, m)
    tolerance = 3 * np.sqrt(q * (1 - q) * (1 / n_cal + 1 / n_eval)) + 1 / n_cal
    assert abs(m["fallback_rate_success_steps"] - q) <= tolerance, (tolerance, n_cal, m)
    # decided as served (the prior blended at the service's weight), the flag an agent that succeeds
    # gets is no more frequent than the calibration's share
    assert m["prior_weight"] == 1.0 and m["fallback_rate_success_decisions"] <= q + tolerance, m
    assert m["ood_rate"] <= 0.05, m
