"""The one resolver of what a user types to name a critic (`registry.model_uri` / `resolve`): its
accepted forms, its errors, and registry models found through a real MLflow store (SQLite),
alias moves included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harnessrl import registry
from harnessrl.errors import ConfigError, ModelError

NAME = "resolver-critic"


@pytest.mark.parametrize("spec, uri", [
    ("twx-critic@champion", "models:/twx-critic@champion"),
    ("twx-critic/3", "models:/twx-critic/3"),
    ("models:/twx-critic@champion", "models:/twx-critic@champion"),
    ("models:/twx-critic/12", "models:/twx-critic/12"),
])
def test_registry_forms(spec, uri):
    assert registry.model_uri(spec) == uri and registry.in_registry(uri)


def test_an_existing_folder_wins_and_is_kept_as_given(tmp_path, monkeypatch):
    folder = tmp_path / "critic@v1"  # looks like NAME@ALIAS, but it is there
    folder.mkdir()
    assert registry.model_uri(str(folder)) == str(folder) and not registry.in_registry(str(folder))
    monkeypatch.chdir(tmp_path)
    assert registry.model_uri("critic@v1") == "critic@v1"
    found = registry.resolve(folder)
    assert (found.uri, found.path, found.name, found.version) == (str(folder), str(folder), None, None)


def test_errors_name_the_forms_or_the_missing_folder():
    with pytest.raises(ConfigError, match=r"--model 'plainname': expected NAME@ALIAS, NAME/VERSION"):
        registry.model_uri("plainname", "--model")
    with pytest.raises(ModelError, match="no critic at /no/such/critic"):
        registry.model_uri("/no/such/critic")
    with pytest.raises(ModelError, match="not a registry model URI"):
        registry.model_uri("models:/name/latest")
    with pytest.raises(ModelError, match="no critic at no/such"):
        registry.resolve("no/such")  # not NAME/VERSION (no number): a path


def _tiny_critic(folder):
    from harnessrl.algorithms.iql import IQLConfig, IQLNetwork
    from harnessrl.encoders import encoder_identity
    from harnessrl.heads.frozen import FrozenScorer
    from harnessrl.model_card import ModelCard
    from harnessrl.model_files import save_critic

    iql = IQLConfig(state_dim=384, action_dim=384, hidden_dim=8)
    card = ModelCard(head="frozen", head_config=iql.to_dict(), encoder=json.loads(encoder_identity().to_json()),
                     render={"window": 2, "max_chars": 500})
    return save_critic(folder, FrozenScorer(IQLNetwork(iql)), card)


def test_registry_models_resolve_by_alias_and_version(harnessrl_home, tmp_path):
    import mlflow

    from harnessrl import settings
    from harnessrl.critic import Critic

    folder = _tiny_critic(tmp_path / "critic")
    mlflow.set_tracking_uri(settings.tracking_uri())
    with mlflow.start_run(experiment_id=registry.ensure_experiment("resolver-test")):
        first = registry.register_critic(folder, NAME, "champion", {"test": "resolve"})
        second = registry.register_critic(folder, NAME, "challenger", {"test": "resolve"})
    for spec in (f"{NAME}@champion", f"{NAME}/{first}", f"models:/{NAME}@champion"):
        found = registry.resolve(spec)
        assert (found.name, found.version) == (NAME, first), spec
        path = Path(found.path)  # downloaded once, under HARNESSRL_HOME
        assert found.uri.startswith("models:/") and harnessrl_home / "models" / NAME / first in path.parents
        assert json.loads((path / "critic.json").read_text())["reward_scale"] == 1.0
    assert registry.resolve(f"{NAME}@challenger").version == second != first
    registry.client().set_registered_model_alias(NAME, "champion", second)  # the alias moves: so does the answer
    assert registry.resolve(f"{NAME}@champion").version == second
    assert registry.resolve(f"{NAME}/{first}").version == first
    critic = Critic.load(f"{NAME}@champion", with_encoder=False)  # the short form works where a URI does
    assert (critic.name, critic.version) == (NAME, second)
    with pytest.raises(ModelError, match="not found in the registry"):
        registry.resolve("nosuch-critic@champion")
