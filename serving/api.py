"""Typed request and response models of the HTTP API (DESIGN §9); FastAPI derives the OpenAPI spec."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# Hard ceilings of the schema. The limits a service enforces are smaller and configurable
# (ServeConfig.max_candidates, max_text_chars), checked by the service so that the client gets
# a 422 / 413 naming the setting rather than a generic validation error.
HARD_MAX_CANDIDATES = 4096
MAX_TEXT_CHARS = 20_000  # feedback `detail` only


class HistoryItem(BaseModel):
    model_config = ConfigDict(extra="forbid")
    action: str
    observation: str = Field("", description="what the action returned")
    status: str | float | None = Field(None, description="the source's status after the action, e.g. a game's "
                                                         "score: what the logs' step info holds at the model's "
                                                         "render.status_from")


class StructuredState(BaseModel):
    """A state the service renders with the same code as training."""

    model_config = ConfigDict(extra="forbid")
    task: str = ""
    history: list[HistoryItem] = Field(default_factory=list, max_length=1000)
    observation: str = ""

    def texts(self) -> list[tuple[str, str]]:
        """(where, text) of every text field, for the service's length limit."""
        out = [("state.task", self.task), ("state.observation", self.observation)]
        for i, h in enumerate(self.history):
            out += [(f"state.history[{i}].action", h.action), (f"state.history[{i}].observation", h.observation)]
        return out


class Candidate(BaseModel):
    """A candidate with the agent's own log-probability of it, for optional prior blending."""

    model_config = ConfigDict(extra="forbid")
    text: str
    logprob: float | None = Field(None, le=0, allow_inf_nan=False,
                                  description="the agent's log-probability of this action (<= 0)")


def _state_texts(state: "str | StructuredState") -> list[tuple[str, str]]:
    return [("state", state)] if isinstance(state, str) else state.texts()


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    agent_id: str | None = Field(None, max_length=200)
    state: str | StructuredState = Field(description="rendered state text, or {task, history, observation}")
    candidates: list[str | Candidate] = Field(
        min_length=1, max_length=HARD_MAX_CANDIDATES,
        description="action texts, or {text, logprob} objects carrying the agent's own log-probability")
    avoid_repeats: bool | None = Field(
        None, description="pass over candidates already taken from the same observation (needs a structured state "
                          "with history) while another is left; null: the service's `avoid_repeats` setting")
    prior_weight: float | None = Field(
        None, ge=0, allow_inf_nan=False,
        description="weight of the candidates' logprobs in the ranking for this request (0: the critic alone); "
                    "without logprobs, those of the model's behaviour prior when it has one; null: the "
                    "service's `prior_weight` setting")

    def state_value(self) -> str | dict:
        """The state as the client sent it (a history item without a status stays without one)."""
        return self.state if isinstance(self.state, str) else self.state.model_dump(exclude_none=True)

    def candidate_texts(self) -> list[str]:
        return [c if isinstance(c, str) else c.text for c in self.candidates]

    def logprobs(self) -> list[float] | None:
        """The agent's log-probabilities when every candidate carries one, else None."""
        lps = [None if isinstance(c, str) else c.logprob for c in self.candidates]
        return None if any(lp is None for lp in lps) else lps

    def texts(self) -> list[tuple[str, str]]:
        return _state_texts(self.state) + [(f"candidates[{i}]", t) for i, t in enumerate(self.candidate_texts())]


class SelectToolRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    agent_id: str | None = Field(None, max_length=200)
    state: str | StructuredState = Field(description="rendered state text, or {task, history, observation}")

    def state_value(self) -> str | dict:
        return self.state if isinstance(self.state, str) else self.state.model_dump(exclude_none=True)

    def texts(self) -> list[tuple[str, str]]:
        return _state_texts(self.state)


class ModelRef(BaseModel):
    name: str
    version: str | None


class ScoreResponse(BaseModel):
    scores: list[float] = Field(description="the critic's Q(s, a) per candidate, in reward units; higher is better")
    blended_scores: list[float] | None = Field(
        None, description="scores + prior_weight * logprob, when the service blends and every candidate has a logprob")
    prior_weight: float = Field(0.0, description="weight of the logprobs (the agent's, else the model's behaviour "
                                                 "prior's) in the ranking (0: critic only)")
    prior: Literal["agent", "model"] | None = Field(
        None, description="whose log-probabilities were blended: the agent's (its candidates carried them) or the "
                          "model's behaviour prior (null: no blend)")
    best_index: int = Field(description="argmax of blended_scores when present, else of scores, over the candidates "
                                        "not listed in `repeats` (over all when every one is)")
    fallback: bool = Field(description="true when the critic's score of the chosen candidate is below the model's "
                                       "threshold")
    reason: str | None = None
    ood: bool | None = Field(None, description="state farther from every training state the model keeps than its "
                                                "threshold (null: the model keeps no reference)")
    repeats: list[int] | None = Field(None, description="candidates the agent already took from this observation, "
                                                        "passed over (null: avoid_repeats off)")
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
    score: float | None = Field(None, allow_inf_nan=False, description="a finite number (it may become a reward "
                                                                       "when the decision log is trained on)")


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
    behaviour_prior: bool = Field(False, description="whether the champion holds a behaviour prior, blended when an "
                                                     "agent's candidates carry no logprob (train.reader.prior_steps)")
    prior_weight: float = Field(0.0, description="the service's prior_weight setting (a request's own overrides it)")
    embedding_cache: dict[str, int] = Field(default_factory=dict, description="this replica's LRU: hits, misses, size")
    encoder: dict
    lineage: dict
