"""The service's front door, in-process: the real FastAPI app of serving/app.py (its middleware,
its bearer-token dependency, its request models) driven over ASGI by Starlette's TestClient,
without Ray Serve. Every answer checked here is given before a request reaches a replica's
model (401, 413, 422), so the Serve replica the routes are bound to is replaced by nothing
(`dependency_overrides` on Serve's own dependency); the same answers through a real Ray Serve
app are in test_serve_faults.py.

- the token is resolved once, at start: an empty or unreadable configured token refuses to
  start (ConfigError, exit 2 from the CLI, one line), the file is not read per request;
- any malformed Authorization header (non-ASCII, no scheme, other schemes) is a 401, never 5xx;
- the body-size limit holds on the bytes received: a chunked body without Content-Length too;
- unknown history fields are 422, and so are NaN and infinite feedback scores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

TOKEN = b"tok-0123456789abcdef"
LIMIT = 4096
STATE = {"task": "t", "history": [{"action": "look", "observation": "a room"}], "observation": "a room"}


class NoReplica(dict):
    """FastAPI dependency overrides: Ray Serve's dependency that hands each route its replica
    object (`self`; a closure, created anew each time Serve wraps the class) gives None."""

    def __init__(self):
        super().__init__(marker=None)  # non-empty: FastAPI looks overrides up only then

    def get(self, call, default=None):
        return (lambda: None) if getattr(call, "__name__", "") == "get_current_servable_instance" else default


@contextmanager
def app_client(token: bytes):
    """The real app with `token` and the body limit installed, as a replica's __init__ does."""
    from starlette.testclient import TestClient

    from harnessrl.serving import app as serving
    from harnessrl.serving import auth

    serving.api.dependency_overrides = NoReplica()
    auth.install(token)
    serving.REQUEST_LIMIT = LIMIT
    try:
        with TestClient(serving.api, raise_server_exceptions=False) as c:
            yield c
    finally:
        serving.api.dependency_overrides = {}
        auth.install(None)
        serving.REQUEST_LIMIT = None


@pytest.fixture
def client():
    with app_client(TOKEN) as c:
        yield c


AUTH = {"Authorization": "Bearer " + TOKEN.decode()}


def test_token_is_resolved_once_and_a_bad_configured_token_refuses(tmp_path):
    from harnessrl.errors import ConfigError
    from harnessrl.api_token import resolve_token

    f = tmp_path / "token"
    f.write_text("  s3cret-token\n")
    assert resolve_token({"HARNESSRL_API_TOKEN_FILE": str(f), "HARNESSRL_API_TOKEN": "other"}) == b"s3cret-token"
    assert resolve_token({"HARNESSRL_API_TOKEN": "café"}) == "café".encode()
    assert resolve_token({}) is None
    empty = tmp_path / "empty"
    empty.write_text("\n")
    bad = [({"HARNESSRL_API_TOKEN_FILE": str(empty), "HARNESSRL_API_TOKEN": "set"}, "token file is empty"),
           ({"HARNESSRL_API_TOKEN_FILE": str(tmp_path / "missing")}, "cannot read the token file"),
           ({"HARNESSRL_API_TOKEN_FILE": str(tmp_path)}, "cannot read the token file"),
           ({"HARNESSRL_API_TOKEN_FILE": ""}, "set but empty"),
           ({"HARNESSRL_API_TOKEN": "  "}, "set but empty")]
    for env, message in bad:
        with pytest.raises(ConfigError, match=message):
            resolve_token(env)


@pytest.mark.parametrize("env,message", [({"HARNESSRL_API_TOKEN_FILE": "/nonexistent/token"}, "cannot read"),
                                         ({"HARNESSRL_API_TOKEN": ""}, "set but empty")])
def test_cli_serve_refuses_to_start_with_a_bad_token(tmp_path, env, message):
    """Exit code 2 and one line, before Ray starts (no Ray in this process: seconds, not minutes)."""
    model = tmp_path / "critic"
    model.mkdir()
    full = {**os.environ, "HARNESSRL_HOME": str(tmp_path / "home"), **env}
    full.pop("RAY_ADDRESS", None)
    out = subprocess.run([sys.executable, "-m", "harnessrl", "serve", "--model", str(model)], env=full,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and message in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_token_is_not_read_per_request(client, tmp_path, monkeypatch):
    # what the environment says now does not matter: the installed token does
    monkeypatch.setenv("HARNESSRL_API_TOKEN_FILE", str(tmp_path / "gone"))
    r = client.post("/v1/score", json={"state": STATE}, headers=AUTH)
    assert r.status_code == 422  # past the token check: the body lacks candidates
    assert client.post("/v1/score", json={"state": STATE}).status_code == 401


@pytest.mark.parametrize("header", [
    "Bearer café".encode(), "Bearer " + "é" * 40, b"Bearer \xff\xfe", "Bearer", "Bearer ", "bearer",
    "Basic " + TOKEN.decode(), TOKEN.decode(), "Bearer " + TOKEN.decode()[:-1], "Bearer " + TOKEN.decode() + "x",
    "Bearer  " + TOKEN.decode() + " junk", b"Bearer \x00", "",
])
def test_malformed_or_wrong_authorization_is_401(client, header):
    raw = header if isinstance(header, bytes) else header.encode("latin-1", "replace")
    r = client.post("/v1/score", json={"state": STATE, "candidates": ["a"]}, headers={"Authorization": raw})
    assert r.status_code == 401, (header, r.status_code, r.text)
    assert r.headers["www-authenticate"] == "Bearer" and r.json()["detail"] == "missing or wrong bearer token"


@settings(max_examples=200, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=80), path=st.sampled_from(["/v1/score", "/v1/feedback", "/v1/select_tool"]))
def test_fuzzed_authorization_bytes_are_401_never_5xx(client, raw, path):
    raw = raw.replace(b"\r", b"").replace(b"\n", b"")  # a header value cannot hold a line break
    if raw.strip() == b"Bearer " + TOKEN:
        return
    r = client.post(path, json={}, headers={"Authorization": raw})
    assert r.status_code == 401, (raw, r.status_code, r.text)


def test_correct_token_passes_with_a_raw_utf8_token():
    """A token outside ASCII is compared on its bytes, as the client sent them."""
    with app_client("café-tøken".encode()) as c:
        ok = c.post("/v1/score", json={"state": STATE}, headers={"Authorization": "Bearer café-tøken".encode()})
        assert ok.status_code == 422  # authenticated; the body lacks candidates
        wrong = c.post("/v1/score", json={"state": STATE}, headers={"Authorization": "Bearer cafe-tøken".encode()})
        assert wrong.status_code == 401


def _chunks(body: dict, size: int = 1000):
    body = json.dumps(body).encode()
    for i in range(0, len(body), size):
        yield body[i:i + size]


def test_chunked_body_over_the_limit_is_413(client):
    r = client.post("/v1/score", content=_chunks({"state": "x" * 3 * LIMIT, "candidates": ["a"]}), headers={**AUTH, "content-type": "application/json"})
    assert r.status_code == 413, (r.status_code, r.text)
    assert r.json()["detail"] == f"request body is more than {LIMIT} bytes; this service accepts at most {LIMIT} " \
                                 "(serve.max_request_bytes)"
    # by Content-Length: refused before it is read, with or without a token
    big = {"state": "x" * (2 * LIMIT), "candidates": ["a"]}
    for headers in (AUTH, {}):
        r = client.post("/v1/score", json=big, headers=headers)
        assert r.status_code == 413 and r.json()["detail"].startswith("request body is ")
    # a chunked body within the limit is read and validated as usual
    small = client.post("/v1/score", content=_chunks({"state": "x" * 2000}),
                        headers={**AUTH, "content-type": "application/json"})
    assert small.status_code == 422  # read and validated (no candidates): the limit let it through
    assert small.json()["detail"][0]["loc"] == ["body", "candidates"]


def test_unknown_history_field_is_422(client):
    state = {**STATE, "history": [{"action": "look", "observation": "a room", "reward": 1}]}
    r = client.post("/v1/score", json={"state": state, "candidates": ["a"]}, headers=AUTH)
    assert r.status_code == 422, r.text
    assert any(e["type"] == "extra_forbidden" and e["loc"][-1] == "reward" for e in r.json()["detail"])


@pytest.mark.parametrize("score", [b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e999"])
def test_feedback_score_must_be_finite(client, score):
    body = b'{"decision_id": "d1", "outcome": {"success": true, "score": ' + score + b"}}"
    r = client.post("/v1/feedback", content=body, headers={**AUTH, "content-type": "application/json"})
    assert r.status_code == 422, (score, r.status_code, r.text)
    assert r.json()["detail"][0]["loc"][-1] == "score"


def test_request_models_refuse_what_the_api_refuses():
    from pydantic import ValidationError

    from harnessrl.serving.api import FeedbackRequest, HistoryItem, Outcome

    with pytest.raises(ValidationError):
        HistoryItem.model_validate({"action": "a", "extra": 1})
    for bad in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(ValidationError):
            Outcome.model_validate({"score": bad})
    assert FeedbackRequest.model_validate({"decision_id": "d", "outcome": {"score": -3.5}}).outcome.score == -3.5


def test_build_app_refuses_a_bad_token_and_forwards_a_good_one(tmp_path, monkeypatch):
    """build_app (behind `harnessrl serve`, serving.start and the Serve config file's app_builder)
    resolves the token before anything is deployed, and hands the replicas where to find it."""
    from harnessrl.config import ServeConfig
    from harnessrl.errors import ConfigError
    from harnessrl.serving.app import app_builder, build_app

    empty = tmp_path / "token"
    empty.write_text("")
    monkeypatch.setenv("HARNESSRL_API_TOKEN_FILE", str(empty))
    monkeypatch.setenv("HARNESSRL_API_TOKEN", "also-set")
    with pytest.raises(ConfigError, match="token file is empty"):
        build_app("models:/m@champion", ServeConfig())
    with pytest.raises(ConfigError, match="token file is empty"):
        app_builder({"model": "m@champion"})
    empty.write_text("tok-123\n")
    env = build_app("models:/m@champion", ServeConfig())._bound_deployment.init_args[2]
    assert env["HARNESSRL_API_TOKEN_FILE"] == str(empty)
