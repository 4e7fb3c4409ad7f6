"""The critic service: FastAPI ingress in a Ray Serve deployment, requests batched with `@serve.batch`.

Concurrent requests from many agents are gathered into one batch: every distinct text of the
batch is encoded once and all candidates are scored in one forward pass.
"""

# No `from __future__ import annotations` here: FastAPI reads the request model from the
# signature of the Serve ingress methods at class creation.
import asyncio
import logging
import os
import uuid

from fastapi import FastAPI, HTTPException
from ray import serve

from harnessrl.serving.api import (ModelInfo, ModelRef, ScoreRequest, ScoreResponse, SelectToolRequest,
                                   SelectToolResponse)

log = logging.getLogger(__name__)
APP_NAME = "harnessrl"
api = FastAPI(title="harnessrl critic", version="1", description="Score candidate next actions for LLM agents.")


@serve.deployment(ray_actor_options={"num_cpus": 0.5}, max_ongoing_requests=64)
@serve.ingress(api)
class CriticService:
    def __init__(self, model_uri: str, max_batch_size: int = 32, batch_wait_timeout_s: float = 0.01,
                 env: dict[str, str] | None = None):
        os.environ.update(env or {})
        import torch

        from harnessrl.critic import Critic

        torch.set_num_threads(1)
        self.critic = Critic.load(model_uri)
        self._score.set_max_batch_size(max_batch_size)
        self._score.set_batch_wait_timeout_s(batch_wait_timeout_s)
        self._select_tool.set_max_batch_size(max_batch_size)
        self._select_tool.set_batch_wait_timeout_s(batch_wait_timeout_s)
        self.model_ref = ModelRef(name=self.critic.name, version=self.critic.version)

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.01)
    async def _score(self, requests: list[ScoreRequest]) -> list[ScoreResponse]:
        batch = [(r.state_value(), r.candidates) for r in requests]
        # Off the event loop: encoding and the forward pass are CPU-bound.
        all_scores = await asyncio.to_thread(self.critic.score_batch, batch)
        out = []
        for scores in all_scores:
            d = self.critic.decide_scores(scores)
            out.append(ScoreResponse(scores=d.scores, best_index=d.best_index, fallback=d.fallback, reason=d.reason,
                                     model=self.model_ref, decision_id=uuid.uuid4().hex))
        return out

    @api.post("/v1/score", response_model=ScoreResponse)
    async def score(self, request: ScoreRequest) -> ScoreResponse:
        return await self._score(request)

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.01)
    async def _select_tool(self, requests: list[SelectToolRequest]) -> list[SelectToolResponse]:
        choices = await asyncio.to_thread(self.critic.select_tool_batch, [r.state_value() for r in requests])
        return [SelectToolResponse(tools=c.tools, probabilities=c.probabilities, choice=c.choice, model=self.model_ref)
                for c in choices]

    @api.post("/v1/select_tool", response_model=SelectToolResponse)
    async def select_tool(self, request: SelectToolRequest) -> SelectToolResponse:
        if self.critic.tool_head is None:
            raise HTTPException(status_code=404, detail=f"model {self.critic.name} has no tool head "
                                "(its training data called fewer than two tools)")
        return await self._select_tool(request)

    @api.get("/v1/model", response_model=ModelInfo)
    def model(self) -> ModelInfo:
        meta = self.critic.meta
        return ModelInfo(model=self.model_ref, fallback_threshold=self.critic.threshold,
                         tools=self.critic.tool_vocab if self.critic.tool_head is not None else [],
                         encoder=meta["encoder"], lineage=meta.get("lineage", {}))

    @api.get("/healthz")
    def healthz(self) -> dict:
        return {"status": "ok"}


def build_app(model_uri: str, max_batch_size: int = 32, batch_wait_timeout_s: float = 0.01):
    from harnessrl import settings

    env = {"HARNESSRL_HOME": str(settings.home()), "MLFLOW_TRACKING_URI": settings.tracking_uri()}
    return CriticService.bind(model_uri, max_batch_size, batch_wait_timeout_s, env)


def start(model_uri: str, host: str = "127.0.0.1", port: int = 8000, max_batch_size: int = 32,
          batch_wait_timeout_s: float = 0.01) -> str:
    """Deploy on the connected Ray cluster; returns the base URL once the app is running."""
    serve.start(http_options={"host": host, "port": port}, logging_config={"enable_access_log": False})
    serve.run(build_app(model_uri, max_batch_size, batch_wait_timeout_s), name=APP_NAME, route_prefix="/")
    return f"http://{host}:{port}"


def stop() -> None:
    serve.shutdown()
