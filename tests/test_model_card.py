"""The model card (harnessrl.model_card): one typed record of what makes a critic, read by every
consumer; a critic exported before the card (format 1, tests/data/critic_v1, written by the code of
that time with its scores in expected.json) still loads and scores the same."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from harnessrl.errors import ModelError
from harnessrl.model_card import CARD_VERSION, ModelCard

V1 = Path(__file__).parent / "data" / "critic_v1"


def test_a_format_1_critic_loads_and_scores_as_it_did():
    from harnessrl.critic import Critic

    critic = Critic.load(V1)
    assert critic.card.format_version == CARD_VERSION and critic.card.head == "frozen"
    assert critic.card.head_config["hidden_dim"] == 16 and critic.card.render.tool_from == "first_word"
    assert critic.card.ood is not None and critic.tool_head is not None
    for case in json.loads((V1 / "expected.json").read_text()):
        d = critic.decide(case["state"], case["candidates"])
        assert np.allclose(d.scores, case["scores"], atol=1e-5)
        assert (d.best_index, d.fallback, d.ood) == (case["best_index"], case["fallback"], case["ood"])
        t = critic.select_tool(case["state"])
        assert np.allclose(t.probabilities, case["tool_probabilities"], atol=1e-5) and t.choice == case["tool"]


def test_the_card_round_trips_and_says_what_it_reads(tmp_path):
    card = ModelCard.read(V1)
    card.save(tmp_path)
    again = ModelCard.read(tmp_path)
    assert again == card and json.loads((tmp_path / "critic.json").read_text())["format_version"] == CARD_VERSION
    assert again.identity.model_name == "builtin:all-MiniLM-L6-v2" and again.gamma == 0.95 and again.uses_features


@pytest.mark.parametrize("version", [0, 3, "2", None])
def test_an_unknown_version_is_a_model_error_naming_it(tmp_path, version):
    shutil.copytree(V1, tmp_path / "c")
    raw = json.loads((tmp_path / "c" / "critic.json").read_text())
    raw["format_version"] = version
    (tmp_path / "c" / "critic.json").write_text(json.dumps(raw))
    with pytest.raises(ModelError, match=f"critic format {version!r} is not one this version reads"):
        ModelCard.read(tmp_path / "c")


def test_a_card_with_unknown_fields_or_a_bad_render_is_a_model_error(tmp_path):
    raw = json.loads((V1 / "critic.json").read_text())
    with pytest.raises(ModelError, match="not a valid critic card.*surprise"):
        ModelCard.from_dict({**raw, "surprise": 1})
    with pytest.raises(ModelError, match="render.window"):
        ModelCard.from_dict({**raw, "render": {**raw["render"], "window": -1}})


def test_an_unknown_head_is_a_model_error(tmp_path):
    from harnessrl.model_files import load_critic_files

    shutil.copytree(V1, tmp_path / "c")
    raw = json.loads((tmp_path / "c" / "critic.json").read_text())
    (tmp_path / "c" / "critic.json").write_text(json.dumps({**raw, "head": "telepathic"}))
    with pytest.raises(ModelError, match="unknown critic head 'telepathic'"):
        load_critic_files(tmp_path / "c")
