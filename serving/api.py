"""Typed request and response models of the HTTP API (DESIGN §9); FastAPI derives the OpenAPI spec."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

MAX_CANDIDATES = 256
MAX_TEXT_CHARS = 20_000


class HistoryItem(BaseModel):
    action: str = Field(max_length=MAX_TEXT_CHARS)
    observation: str = Field("", max_length=MAX_TEXT_CHARS, description="what the action returned")


class StructuredState(BaseModel):
    """A state the service renders with the same code as training."""

    model_config = ConfigDict(extra="forbid")
    task: str = Field("", max_length=MAX_TEXT_CHARS)
    history: list[HistoryItem] = Field(default_factory=list, max_length=1000)
    observation: str = Field("", max_length=MAX_TEXT_CHARS)


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    agent_id: str | None = Field(None, max_length=200)
    state: str | StructuredState = Field(description="rendered state text, or {task, history, observation}")
    candidates: list[str] = Field(min_length=1, max_length=MAX_CANDIDATES)

    def state_value(self) -> str | dict:
        return self.state if isinstance(self.state, str) else self.state.model_dump()


class SelectToolRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    agent_id: str | None = Field(None, max_length=200)
    state: str | StructuredState = Field(description="rendered state text, or {task, history, observation}")

    def state_value(self) -> str | dict:
        return self.state if isinstance(self.state, str) else self.state.model_dump()


class ModelRef(BaseModel):
    name: str
    version: str | None


class ScoreResponse(BaseModel):
    scores: list[float] = Field(description="Q(s, a) per candidate, in reward units; higher is better")
    best_index: int
    fallback: bool = Field(description="true when the best score is below the model's threshold")
    reason: str | None = None
    ood: bool | None = Field(None, description="state farther from every training state the model keeps than its "
                                                "threshold (null: the model keeps no reference)")
    model: ModelRef
    decision_id: str


class SelectToolResponse(BaseModel):
    tools: list[str] = Field(description="the model's tool vocabulary")
    probabilities: list[float] = Field(description="the tool head's policy pi(tool | state), one per tool")
    choice: str = Field(description="the most probable tool")
    model: ModelRef


class Outcome(BaseModel):
    model_config = ConfigDict(extra="forbid")
    success: bool | None = None
    score: float | None = None


class FeedbackRequest(BaseModel):
    """What happened after a decision: joined to the decision log offline by `decision_id`."""

    model_config = ConfigDict(extra="forbid")
    decision_id: str = Field(min_length=1, max_length=64)
    agent_id: str | None = Field(None, max_length=200)
    outcome: Outcome
    detail: str | None = Field(None, max_length=MAX_TEXT_CHARS)


class FeedbackResponse(BaseModel):
    accepted: bool


class ModelInfo(BaseModel):
    model: ModelRef = Field(description="the champion")
    fallback_threshold: float | None
    challenger: ModelRef | None = Field(None, description="answers the challenger share of agents, if configured")
    challenger_share: float = 0.0
    tools: list[str] = Field(description="tool vocabulary of the tool head (empty when the model has none)")
    embedding_cache: dict[str, int] = Field(default_factory=dict, description="this replica's LRU: hits, misses, size")
    encoder: dict
    lineage: dict
