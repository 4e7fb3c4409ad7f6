"""The critic service: FastAPI ingress in a Ray Serve deployment, requests batched with `@serve.batch`.

Concurrent requests from many agents are gathered into one batch: every distinct text of the
batch is encoded once and all candidates are scored in one forward pass. Every decision and
every feedback goes to the decision log off the request path. With `HARNESSRL_API_TOKEN` (or
`HARNESSRL_API_TOKEN_FILE`) set where the service starts, `/v1/*` needs `Authorization:
Bearer <token>` (serving/auth.py). A full queue answers 429 with Retry-After instead of growing latency; too many
candidates answer 422 and too long a text 413, both naming the setting. Every setting comes from
one `ServeConfig` (harnessrl.config), e.g. serving/serve.yaml. `GET /metrics` is Prometheus text.

Encoding happens either in each critic replica (default) or, with `serve.encoder` set, in a
separate encoder deployment (serving/encoder.py) that the critic replicas call through a
DeploymentHandle with the texts their own LRU misses.
"""

# No `from __future__ import annotations` here: FastAPI reads the request model from the
# signature of the Serve ingress methods at class creation.
import asyncio
import logging
import os
import time
import uuid
from typing import Any

import numpy as np
from fastapi import Depends, FastAPI, HTTPException, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from ray import serve

from harnessrl import api_token
from harnessrl.config import ServeConfig
from harnessrl.critic import blend
from harnessrl.serve_file import APP_NAME
from harnessrl.features import repeats_here
from harnessrl.serving import auth
from harnessrl.serving.batching import CONCURRENT_BATCHES
from harnessrl.serving.api import (FeedbackRequest, FeedbackResponse, ModelInfo, ModelRef, ScoreRequest,
                                   ScoreResponse, SelectToolRequest, SelectToolResponse)

log = logging.getLogger(__name__)
api = FastAPI(title="harnessrl critic", version="1", description="Score candidate next actions for LLM agents.")


async def _validation_error(request, exc):
    """FastAPI's own 422 handler, except that raw request bytes in the errors (a body sent as
    text/plain that is not UTF-8) are decoded with replacement, and a NaN or infinite input is
    quoted ("inf"): the default decodes the bytes strictly and cannot write JSON for NaN, and
    answers 500 (found by tests/reliability/test_serve_faults.py and test_api_security.py)."""
    import math

    from fastapi.encoders import jsonable_encoder

    errors = jsonable_encoder(exc.errors(), custom_encoder={bytes: lambda b: b.decode("utf-8", "replace"),
                                                            float: lambda f: f if math.isfinite(f) else str(f)})
    return JSONResponse(status_code=422, content={"detail": errors})


api.add_exception_handler(RequestValidationError, _validation_error)
AUTH = [Depends(auth.require_token)]
REQUEST_LIMIT: int | None = None  # ServeConfig.max_request_bytes of this process's replica


class BodyTooLarge(HTTPException):
    """Raised from `receive` once the body passes the limit. An HTTPException, so that FastAPI's
    body reading passes it on (other errors there become a 400) and answers it as a 413."""

    def __init__(self, size: str, limit: int):
        super().__init__(status_code=413, detail=f"request body is {size} bytes; this service accepts at most "
                                                 f"{limit} (serve.max_request_bytes)")


class CountRequests:
    """Every answer the replica gives (401s and 422s included) is counted, with its latency; a
    body larger than serve.max_request_bytes is a 413: refused before it is read when its
    Content-Length says so, else once the bytes received pass the limit (chunked bodies have no
    Content-Length). Plain ASGI (not `@app.middleware("http")`, whose BaseHTTPMiddleware adds a
    task and streams per request)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        from harnessrl.serving import metrics

        start = time.perf_counter()
        status = {"code": 500, "started": False}

        async def send_status(message):
            if message["type"] == "http.response.start":
                status["code"], status["started"] = message["status"], True
            await send(message)

        limit, received = REQUEST_LIMIT, 0

        async def receive_limited():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(f"more than {limit}", limit)
            return message

        size = next((v for k, v in scope.get("headers", ()) if k == b"content-length"), b"")
        try:
            if limit is None:
                await self.app(scope, receive, send_status)
            elif size.isdigit() and int(size) > limit:
                raise BodyTooLarge(size.decode(), limit)
            else:
                await self.app(scope, receive_limited, send_status)
        except BodyTooLarge as exc:  # by Content-Length, or from a read outside FastAPI's body parsing
            if status["started"]:
                raise
            await JSONResponse(status_code=413, content={"detail": exc.detail})(scope, receive, send_status)
        current = metrics.current()
        if current is not None:
            current.request(scope["path"], status["code"], time.perf_counter() - start)


api.add_middleware(CountRequests)


def check_limits(texts: list[tuple[str, str]], n_candidates: int, cfg: ServeConfig) -> None:
    """The configured limits, as 4xx answers that name the setting to change."""
    if n_candidates > cfg.max_candidates:
        raise HTTPException(status_code=422, detail=f"{n_candidates} candidates; this service scores at most "
                            f"{cfg.max_candidates} per request (serve.max_candidates)")
    for where, text in texts:
        if len(text) > cfg.max_text_chars:
            raise HTTPException(status_code=413, detail=f"{where} is {len(text)} characters; this service accepts "
                                f"at most {cfg.max_text_chars} per text (serve.max_text_chars)")


@serve.deployment(ray_actor_options={"num_cpus": 0.5}, max_ongoing_requests=64)
@serve.ingress(api)
class CriticService:
    def __init__(self, model_uri: str, config: dict[str, Any], env: dict[str, str] | None = None,
                 encoder=None, encoder_identity: str | None = None):
        os.environ.update(env or {})
        import torch

        from harnessrl.serving import app as module
        from harnessrl.serving import batching, metrics
        from harnessrl.serving.decision_log import DecisionLog
        from harnessrl.encoders import EncoderIdentity
        from harnessrl.serving.models import ModelSlot

        torch.set_num_threads(1)
        self.cfg = cfg = ServeConfig.model_validate(config)
        module.REQUEST_LIMIT = cfg.max_request_bytes  # the module's own global (this class is pickled by value)
        auth.install(api_token.resolve_token())  # once, at start; an empty or unreadable token fails the replica
        # with an encoder deployment (a DeploymentHandle here), the critics load no encoder of their own
        self.encoder = encoder
        identity = EncoderIdentity.from_json(encoder_identity) if encoder is not None else None
        self.champion = ModelSlot(model_uri, identity, cfg.cache_size)
        self.challenger = ModelSlot(cfg.challenger, identity, cfg.cache_size) if cfg.challenger else None
        self.encoder_stats: dict[str, Any] | None = None
        self.challenger_share = cfg.challenger_share if cfg.challenger else 0.0
        self.reload_every_s = cfg.reload_every_s
        self._reloader: asyncio.Task | None = None
        replica = serve.get_replica_context().replica_id.unique_id
        self.log = DecisionLog(cfg.decision_log, replica, fields=cfg.decision_log_fields) if cfg.decision_log else None
        # One replica per process; the middleware finds it through the module (Serve pickles this
        # class by value, so a global assigned here would not be the module's).
        self.metrics = metrics.install(metrics.ServiceMetrics(
            replica, self._caches, ["champion", "challenger"] if self.challenger else ["champion"],
            encoder_stats=(lambda: self.encoder_stats) if encoder is not None else None))
        batching.quiet_serve_batch_warning()
        for batched in (self._score, self._select_tool):
            batched.set_max_batch_size(cfg.max_batch_size)
            batched.set_batch_wait_timeout_s(cfg.batch_wait_timeout_s)
        # one model call at a time, over every batch that arrived while the previous one ran
        self._scorer = batching.Coalescer(self._score_requests, cfg.max_batch_size)
        self._tool_selector = batching.Coalescer(self._select_tool_requests, cfg.max_batch_size)

    def _caches(self):
        slots = [("champion", self.champion)] + ([("challenger", self.challenger)] if self.challenger else [])
        return [(role, slot.critic.lru.stats()) for role, slot in slots]

    @property
    def critic(self):
        return self.champion.critic

    def _slot(self, agent_id: str | None):
        from harnessrl.serving.models import routes_to_challenger

        return self.challenger if routes_to_challenger(agent_id, self.challenger_share) else self.champion

    async def _embeddings(self, critic, texts: list[str]) -> dict[str, np.ndarray] | None:
        """With an encoder deployment: the embeddings of those of `texts` the critic's LRU misses,
        computed there (awaited: the event loop keeps gathering the next batch)."""
        if self.encoder is None:
            return None
        missing = critic.uncached(texts)
        if not missing:
            return {}
        return dict(zip(missing, await self.encoder.encode.remote(missing)))

    def _weight(self, request: ScoreRequest) -> float:
        return self.cfg.prior_weight if request.prior_weight is None else request.prior_weight

    async def _score_with(self, role: str, critic, requests: list[ScoreRequest]) -> list[ScoreResponse]:
        batch = [(r.state_value(), r.candidate_texts()) for r in requests]
        prep = critic.prepare(batch)
        given = await self._embeddings(critic, prep.texts)
        # Off the event loop: encoding and the forward pass are CPU-bound; the OOD check reuses the
        # states' embeddings (one small matrix product)
        all_scores, ood = await asyncio.to_thread(critic.score_prepared, prep, None, given, True)
        agents = [r.logprobs() for r in requests]
        # the model's behaviour prior, for requests whose candidates carry no logprob of the agent's
        priors = await asyncio.to_thread(critic.prior_logprobs, prep, given) if critic.has_prior and any(
            lp is None and self._weight(r) > 0 for r, lp in zip(requests, agents)) else None
        ref = ModelRef(name=critic.name, version=critic.version)
        out = []
        for i, (request, parsed, (_, texts), scores, far) in enumerate(zip(requests, prep.parsed, batch, all_scores,
                                                                            ood)):
            source = "agent" if agents[i] is not None else "model" if priors is not None else None
            logprobs = agents[i] if source == "agent" else priors[i] if source == "model" else None
            weight = self._weight(request)
            blended = blend(scores, logprobs, weight)
            avoid = self.cfg.avoid_repeats if request.avoid_repeats is None else request.avoid_repeats
            repeats = repeats_here(parsed.history, parsed.observation, texts) if avoid else None
            # with a blend, the blend ranks; the threshold (reward units) is checked on the critic's score
            d = critic.decide_scores(scores, far, repeats, blended)
            on = blended is not None
            resp = ScoreResponse.model_construct(  # values of our own making: no validation pass
                scores=d.scores, blended_scores=blended, prior_weight=weight if on else 0.0,
                prior=source if on else None, best_index=d.best_index, fallback=d.fallback, reason=d.reason,
                ood=d.ood, repeats=d.repeats, model=ref, decision_id=uuid.uuid4().hex)
            self.metrics.decision(role, d.fallback, d.ood, on)
            if self.log:
                record = {**resp.model_dump(), "agent_id": request.agent_id, "state": request.state_value(),
                          "candidates": texts}
                if logprobs is not None:
                    record["logprobs"] = logprobs
                self.log.append("decisions", record)
            out.append(resp)
        return out

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.01, max_concurrent_batches=CONCURRENT_BATCHES)
    async def _score(self, requests: list[ScoreRequest]) -> list[ScoreResponse]:
        return await self._scorer.submit(requests)

    async def _score_requests(self, requests: list[ScoreRequest]) -> list[ScoreResponse]:
        """One model call (the Coalescer's) over the requests of one or more batches."""
        self.metrics.batch_size("/v1/score", len(requests))
        groups: dict[int, tuple] = {}
        for i, r in enumerate(requests):  # the critic is read once per group: a swap mid-batch cannot mix
            slot = self._slot(r.agent_id)
            critic = slot.critic
            role = "challenger" if slot is self.challenger else "champion"
            groups.setdefault(id(critic), (role, critic, []))[2].append(i)
        out: list[ScoreResponse | None] = [None] * len(requests)
        for role, critic, idx in groups.values():
            for i, resp in zip(idx, await self._score_with(role, critic, [requests[i] for i in idx])):
                out[i] = resp
        return out

    async def _follow_aliases(self) -> None:
        while True:
            await asyncio.sleep(self.reload_every_s)
            for slot in (self.champion, self.challenger):
                if slot is not None:
                    await asyncio.to_thread(slot.refresh)

    def _started(self) -> None:
        """Background work on the replica's event loop, started with the first request."""
        if self.log:
            self.log.start()
        if self._reloader is None and self.reload_every_s > 0:
            self._reloader = asyncio.get_running_loop().create_task(self._follow_aliases())

    @api.post("/v1/score", response_model=ScoreResponse, dependencies=AUTH)
    async def score(self, request: ScoreRequest) -> ScoreResponse:
        check_limits(request.texts(), len(request.candidates), self.cfg)
        self._started()
        return await self._score(request)

    @api.post("/v1/feedback", response_model=FeedbackResponse, status_code=202, dependencies=AUTH)
    async def feedback(self, request: FeedbackRequest) -> FeedbackResponse:
        """Recorded as given; the join with the decision happens offline, by `decision_id`."""
        if not self.log:
            raise HTTPException(status_code=404, detail="this service keeps no decision log (serve.decision_log)")
        self._started()
        self.log.append("feedback", request.model_dump())
        return FeedbackResponse(accepted=True)

    async def __del__(self):
        """Serve calls this on graceful shutdown: what is still buffered is written now."""
        if getattr(self, "_reloader", None):
            self._reloader.cancel()
        if getattr(self, "log", None):
            await self.log.close()

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.01, max_concurrent_batches=CONCURRENT_BATCHES)
    async def _select_tool(self, requests: list[SelectToolRequest]) -> list[SelectToolResponse]:
        return await self._tool_selector.submit(requests)

    async def _select_tool_requests(self, requests: list[SelectToolRequest]) -> list[SelectToolResponse]:
        self.metrics.batch_size("/v1/select_tool", len(requests))
        critic = self.critic
        states = [r.state_value() for r in requests]
        given = await self._embeddings(critic, [critic.state_text(s) for s in states])
        choices = await asyncio.to_thread(critic.select_tool_batch, states, given)
        ref = ModelRef(name=critic.name, version=critic.version)
        return [SelectToolResponse(tools=c.tools, probabilities=c.probabilities, choice=c.choice, model=ref)
                for c in choices]

    @api.post("/v1/select_tool", response_model=SelectToolResponse, dependencies=AUTH)
    async def select_tool(self, request: SelectToolRequest) -> SelectToolResponse:
        check_limits(request.texts(), 0, self.cfg)
        self._started()
        if self.critic.tool_head is None:
            raise HTTPException(status_code=404, detail=f"model {self.critic.name} has no tool head "
                                "(its training data called fewer than two tools)")
        return await self._select_tool(request)

    @api.get("/v1/model", response_model=ModelInfo, dependencies=AUTH)
    def model(self) -> ModelInfo:
        critic = self.critic
        return ModelInfo(model=self.champion.ref, fallback_threshold=critic.threshold,
                         challenger=self.challenger.ref if self.challenger else None,
                         challenger_share=self.challenger_share,
                         tools=critic.tool_vocab if critic.tool_head is not None else [],
                         behaviour_prior=critic.has_prior, prior_weight=self.cfg.prior_weight,
                         embedding_cache=critic.lru.stats(),
                         encoder=critic.card.encoder, lineage=critic.card.lineage)

    @api.get("/healthz")
    def healthz(self) -> dict:
        return {"status": "ok"}

    @api.get("/metrics", response_class=Response)
    async def prometheus(self) -> Response:
        """Open like /healthz (counts only, no request content): scrapers need no token."""
        if self.encoder is not None:  # the encoder deployment's LRU, as one of its replicas reports it
            try:
                self.encoder_stats = await asyncio.wait_for(self.encoder.stats.remote(), timeout=5)
            except Exception as exc:  # keep the last figures: a scrape must not fail on it
                log.warning("encoder deployment stats unavailable: %s", exc)
        body, content_type = self.metrics.render()
        return Response(content=body, media_type=content_type)


def serve_config(config: ServeConfig | None = None, **fields) -> ServeConfig:
    """`config` with `fields` (any ServeConfig field; `challenger_uri` is `challenger`) replaced,
    validated again; None values leave the setting as it is."""
    if "challenger_uri" in fields:
        fields["challenger"] = fields.pop("challenger_uri")
    base = (config or ServeConfig()).model_dump(exclude_unset=True)
    return ServeConfig.model_validate({**base, **{k: v for k, v in fields.items() if v is not None}})


def deployment_options(cfg: ServeConfig) -> dict[str, Any]:
    """Ray Serve deployment options of a ServeConfig (replicas, autoscaling, resources, queues)."""
    from ray.serve.config import BackpressureConfig

    opts: dict[str, Any] = {
        "max_queued_requests": cfg.max_queued_requests, "max_ongoing_requests": cfg.max_ongoing_requests,
        "backpressure_config": BackpressureConfig(status_code=429, retry_after_s=1),
        "ray_actor_options": {"num_cpus": cfg.num_cpus, "num_gpus": cfg.num_gpus},
        # No per-request access line from each replica (serve.start's logging_config reaches only
        # the proxy and controller); /metrics counts requests instead.
        "logging_config": {"enable_access_log": False},
    }
    if cfg.autoscaling is not None:
        opts["autoscaling_config"] = cfg.autoscaling.model_dump(exclude_none=True)
    else:
        opts["num_replicas"] = cfg.replicas or 1
    return opts


def encoder_plan(model_uri: str, cfg: ServeConfig):
    """(encoder name, max_seq_length, identity) of the encoder deployment: the served model's own
    encoder unless `serve.encoder` names another, which is an error (ModelError) unless it is
    the same encoder. Read from the model's and the encoder's files: no weights are loaded."""
    from harnessrl import registry
    from harnessrl.encoders import encoder_identity
    from harnessrl.model_card import ModelCard

    card = ModelCard.read(registry.resolve(model_uri).path)
    trained = card.identity
    enc = cfg.encoder
    name, max_seq = enc.model or trained.model_name, enc.max_seq_length or trained.max_seq_length
    configured = encoder_identity(name, max_seq, trained.precision)
    card.check_encoder(configured, f"serve.encoder (model={enc.model!r}, max_seq_length={enc.max_seq_length!r}) "
                                   f"against the model {model_uri}")
    return name, max_seq, configured


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def build_app(model_uri: str, config: ServeConfig | None = None):
    from harnessrl import settings
    from harnessrl.serving import encoder as encoder_deployment

    cfg = config or ServeConfig()
    if api_token.resolve_token() is None and cfg.host not in LOOPBACK:  # ConfigError: empty or unreadable
        log.warning("serving on %s without an API token: /v1/* is open to every client that reaches it (set %s "
                    "or %s)", cfg.host, api_token.TOKEN_ENV, api_token.TOKEN_FILE_ENV)
    env = {"HARNESSRL_HOME": str(settings.home()), "MLFLOW_TRACKING_URI": settings.tracking_uri()}
    env.update({k: os.environ[k] for k in (api_token.TOKEN_ENV, api_token.TOKEN_FILE_ENV) if k in os.environ})
    extra: dict[str, Any] = {}
    if cfg.encoder is not None:
        name, max_seq, identity = encoder_plan(model_uri, cfg)
        extra = {"encoder": encoder_deployment.EncoderService.options(**encoder_deployment.options(cfg.encoder)).bind(
            name, max_seq, identity.to_json(), cfg.encoder.model_dump(), env), "encoder_identity": identity.to_json()}
    return CriticService.options(**deployment_options(cfg)).bind(model_uri, cfg.model_dump(), env, **extra)


def app_builder(args: dict[str, Any]):
    """Application builder for Ray Serve config files: `import_path: harnessrl.serving.app:app_builder`
    with `args` the fields of a ServeConfig (the content of serving/serve.yaml), as in the
    serveConfigV2 of infra/k8s/rayservice.yaml or a file for `serve deploy`. It builds the same
    application as `harnessrl serve` (build_app), with the same defaults: `model` NAME@ALIAS as a
    registry URI, the decision log under $HARNESSRL_HOME/decisions unless `decision_log` is set.
    `host` and `port` are not read here: in a config file they are the file's `http_options`."""
    from harnessrl import registry, settings
    from harnessrl.config import parse_serve
    from harnessrl.errors import ConfigError

    cfg = parse_serve(dict(args or {}), origin="Serve application args")
    if not cfg.model:
        raise ConfigError(f"Serve application args: no `model` to serve ({registry.FORMS})")
    uri = registry.model_uri(cfg.model, "Serve application args: model")
    if cfg.decision_log is None:
        cfg = cfg.model_copy(update={"decision_log": str(settings.home() / "decisions")})
    return build_app(uri, cfg.model_copy(update={"model": uri}))


def start(model_uri: str | None = None, host: str | None = None, port: int | None = None, *,
          config: ServeConfig | None = None, **fields) -> str:
    """Deploy on the connected Ray cluster; returns the base URL once the app is running.

    Settings come from `config` (default: ServeConfig's defaults), then `host`, `port` and any
    other ServeConfig field given by keyword. `model_uri` defaults to `config.model`. The app
    outlives this process when Ray is a cluster joined by address (Serve's controller is detached)."""
    cfg = serve_config(config, host=host, port=port, **fields)
    uri = model_uri or cfg.model
    if not uri:
        from harnessrl.errors import ConfigError

        raise ConfigError("no model to serve: give --model or set `model` in the serve config")
    application = build_app(uri, cfg)  # first: a configuration error starts nothing
    serve.start(http_options={"host": cfg.host, "port": cfg.port}, logging_config={"enable_access_log": False})
    serve.run(application, name=APP_NAME, route_prefix="/")
    return f"http://{cfg.host}:{cfg.port}"


def stop() -> None:
    serve.shutdown()


def delete() -> None:
    """Remove the app from the cluster and leave Serve (and other apps) running."""
    serve.delete(APP_NAME)
