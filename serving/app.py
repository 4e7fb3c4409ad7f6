"""The critic service: FastAPI ingress in a Ray Serve deployment, requests batched with `@serve.batch`.

Concurrent requests from many agents are gathered into one batch: every distinct text of the
batch is encoded once and all candidates are scored in one forward pass. Every decision and
every feedback goes to the decision log off the request path. With `HARNESSRL_API_TOKEN` (or
`HARNESSRL_API_TOKEN_FILE`) set where the service starts, `/v1/*` needs `Authorization:
Bearer <token>`. A full queue answers 429 with Retry-After instead of growing latency.
"""

# No `from __future__ import annotations` here: FastAPI reads the request model from the
# signature of the Serve ingress methods at class creation.
import asyncio
import hmac
import logging
import os
import uuid
from pathlib import Path

from fastapi import Depends, FastAPI, Header, HTTPException
from ray import serve

from harnessrl.serving.api import (FeedbackRequest, FeedbackResponse, ModelInfo, ModelRef, ScoreRequest,
                                   ScoreResponse, SelectToolRequest, SelectToolResponse)

log = logging.getLogger(__name__)
APP_NAME = "harnessrl"
api = FastAPI(title="harnessrl critic", version="1", description="Score candidate next actions for LLM agents.")
TOKEN_ENV, TOKEN_FILE_ENV = "HARNESSRL_API_TOKEN", "HARNESSRL_API_TOKEN_FILE"


def _configured_token() -> str | None:
    if os.environ.get(TOKEN_FILE_ENV):
        return Path(os.environ[TOKEN_FILE_ENV]).read_text().strip() or None
    return os.environ.get(TOKEN_ENV) or None


def require_token(authorization: str | None = Header(None)) -> None:
    """401 unless the request carries the configured bearer token (no token configured: open)."""
    token = _configured_token()
    if token is None:
        return
    given = (authorization or "").removeprefix("Bearer ").strip()
    if not authorization or not authorization.startswith("Bearer ") or not hmac.compare_digest(given, token):
        raise HTTPException(status_code=401, detail="missing or wrong bearer token",
                            headers={"WWW-Authenticate": "Bearer"})


AUTH = [Depends(require_token)]


@serve.deployment(ray_actor_options={"num_cpus": 0.5}, max_ongoing_requests=64)
@serve.ingress(api)
class CriticService:
    def __init__(self, model_uri: str, max_batch_size: int = 32, batch_wait_timeout_s: float = 0.01,
                 env: dict[str, str] | None = None, decision_log: str | None = None,
                 challenger_uri: str | None = None, challenger_share: float = 0.0, reload_every_s: float = 30.0):
        os.environ.update(env or {})
        import torch

        from harnessrl.serving.decision_log import DecisionLog
        from harnessrl.serving.models import ModelSlot

        torch.set_num_threads(1)
        self.champion = ModelSlot(model_uri)
        self.challenger = ModelSlot(challenger_uri) if challenger_uri else None
        self.challenger_share = challenger_share if challenger_uri else 0.0
        self.reload_every_s = reload_every_s
        self._reloader: asyncio.Task | None = None
        replica = serve.get_replica_context().replica_id.unique_id
        self.log = DecisionLog(decision_log, replica) if decision_log else None
        self._score.set_max_batch_size(max_batch_size)
        self._score.set_batch_wait_timeout_s(batch_wait_timeout_s)
        self._select_tool.set_max_batch_size(max_batch_size)
        self._select_tool.set_batch_wait_timeout_s(batch_wait_timeout_s)

    @property
    def critic(self):
        return self.champion.critic

    def _slot(self, agent_id: str | None):
        from harnessrl.serving.models import routes_to_challenger

        return self.challenger if routes_to_challenger(agent_id, self.challenger_share) else self.champion

    async def _score_with(self, critic, requests: list[ScoreRequest]) -> list[ScoreResponse]:
        batch = [(r.state_value(), r.candidates) for r in requests]
        # Off the event loop: encoding and the forward pass are CPU-bound.
        all_scores = await asyncio.to_thread(critic.score_batch, batch)
        # the states' embeddings are in the LRU now: the OOD check costs one small matrix product
        ood = await asyncio.to_thread(critic.out_of_distribution, [s for s, _ in batch])
        ref = ModelRef(name=critic.name, version=critic.version)
        out = []
        for request, scores, far in zip(requests, all_scores, ood):
            d = critic.decide_scores(scores, far)
            resp = ScoreResponse(scores=d.scores, best_index=d.best_index, fallback=d.fallback, reason=d.reason,
                                 ood=d.ood, model=ref, decision_id=uuid.uuid4().hex)
            if self.log:
                self.log.append("decisions", {**resp.model_dump(), "agent_id": request.agent_id,
                                              "state": request.state_value(), "candidates": request.candidates})
            out.append(resp)
        return out

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.01)
    async def _score(self, requests: list[ScoreRequest]) -> list[ScoreResponse]:
        groups: dict[int, tuple] = {}
        for i, r in enumerate(requests):  # the critic is read once per group: a swap mid-batch cannot mix
            critic = self._slot(r.agent_id).critic
            groups.setdefault(id(critic), (critic, []))[1].append(i)
        out: list[ScoreResponse | None] = [None] * len(requests)
        for critic, idx in groups.values():
            for i, resp in zip(idx, await self._score_with(critic, [requests[i] for i in idx])):
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

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.01)
    async def _select_tool(self, requests: list[SelectToolRequest]) -> list[SelectToolResponse]:
        critic = self.critic
        choices = await asyncio.to_thread(critic.select_tool_batch, [r.state_value() for r in requests])
        ref = ModelRef(name=critic.name, version=critic.version)
        return [SelectToolResponse(tools=c.tools, probabilities=c.probabilities, choice=c.choice, model=ref)
                for c in choices]

    @api.post("/v1/select_tool", response_model=SelectToolResponse, dependencies=AUTH)
    async def select_tool(self, request: SelectToolRequest) -> SelectToolResponse:
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
                         embedding_cache=critic.cache_stats(),
                         encoder=critic.meta["encoder"], lineage=critic.meta.get("lineage", {}))

    @api.get("/healthz")
    def healthz(self) -> dict:
        return {"status": "ok"}


def build_app(model_uri: str, max_batch_size: int = 32, batch_wait_timeout_s: float = 0.01,
              decision_log: str | None = None, max_queued_requests: int = 256, max_ongoing_requests: int = 64,
              challenger_uri: str | None = None, challenger_share: float = 0.0, reload_every_s: float = 30.0):
    from ray.serve.config import BackpressureConfig

    from harnessrl import settings

    env = {"HARNESSRL_HOME": str(settings.home()), "MLFLOW_TRACKING_URI": settings.tracking_uri()}
    env.update({k: os.environ[k] for k in (TOKEN_ENV, TOKEN_FILE_ENV) if os.environ.get(k)})
    deployment = CriticService.options(
        max_queued_requests=max_queued_requests, max_ongoing_requests=max_ongoing_requests,
        backpressure_config=BackpressureConfig(status_code=429, retry_after_s=1))
    return deployment.bind(model_uri, max_batch_size, batch_wait_timeout_s, env, decision_log, challenger_uri,
                           challenger_share, reload_every_s)


def start(model_uri: str, host: str = "127.0.0.1", port: int = 8000, max_batch_size: int = 32,
          batch_wait_timeout_s: float = 0.01, decision_log: str | None = None, max_queued_requests: int = 256,
          max_ongoing_requests: int = 64, challenger_uri: str | None = None, challenger_share: float = 0.0,
          reload_every_s: float = 30.0) -> str:
    """Deploy on the connected Ray cluster; returns the base URL once the app is running."""
    serve.start(http_options={"host": host, "port": port}, logging_config={"enable_access_log": False})
    serve.run(build_app(model_uri, max_batch_size, batch_wait_timeout_s, decision_log, max_queued_requests,
                        max_ongoing_requests, challenger_uri, challenger_share, reload_every_s),
              name=APP_NAME, route_prefix="/")
    return f"http://{host}:{port}"


def stop() -> None:
    serve.shutdown()
