"""Reward recipes: named, hashed YAML weights turned into per-step rewards (DESIGN §5).

A recipe never mutates the logs; transitions are recomputed from the kept raw fields, so a
new recipe is a new transitions dataset with a new hash in its lineage.

Every component is one named entry of the recipe; a weight of 0 (or leaving the entry out)
switches it off. Per step, `evaluate` returns a dict component -> reward holding every
component that is **on and applies to that step** (its input exists: a source reward, an
`info.tests_passed`, tool calls, ...), even when its value is 0, so "checked and earned
nothing" (`syntax_ok: 0.0`) differs from "not checked" (absent). The step's reward is the
sum of its dict.

Components (name in the step dict <- YAML entry):

- `outcome` <- `success` / `failure`: at the last step of an episode that ended by itself
  (`terminated`) with a known `outcome_success`, `success` or `failure` (signed, added).
  Never on a truncated episode (it did not end: bootstrap instead), never after a safety stop.
- `outcome_score` <- `outcome_score`: weight x `outcome_score`, at the same step.
- `source` <- `source_reward`: weight x the step's own logged `reward`, when it has one.
- `step_cost` <- `step_cost`: `-step_cost` at every step.
- `tests_passed` <- `tests_passed`: weight x (`info.tests_passed` - the last count an earlier
  step reported, 0 before any), on steps that report a count. Over an episode it sums to
  weight x the final count: passing tests is rewarded once, breaking them costs it back.
- `syntax_ok`, `style_ok` <- same names: weight when `info.syntax_ok` / `info.style_ok` is
  true, 0 when false, absent when the step does not say.
- `tool_error` <- `tool_error` (a penalty, >= 0): `-weight` x the step's tool calls with
  `is_error`; on steps with tool calls.
- `invalid_tool` <- `invalid_tool` (penalty): `-weight` x the step's tool calls whose name
  is not in the episode's `tool_definitions`; only when the episode defines tools.
- `repeated_action` <- `repeated_action` (penalty): `-weight` when the step's (stripped,
  non-empty) `action_text` equals that of an earlier step of the episode.
- `excess_length` <- `excess_length: {weight, unit, limit, baseline_key, factor}` (penalty):
  `-weight` x max(0, length - allowance), length of `action_text` in `lines` or `chars`;
  allowance = `factor` x `info[baseline_key]` when the step's info has that number, else
  `limit`; absent when neither gives an allowance.
- `safety` <- `safety: {weight, patterns, terminate}` (penalty): `-weight` at a step where
  one of the regexes (Python `re.search`) matches the action text, a tool call's name, its
  arguments, or `name(arguments)`; 0 where none does. With `terminate` (default) the first
  match ends the episode: that step is terminal (done), later steps are dropped from
  learning, and no outcome term is given (the logged ending never happened). Without it,
  every matching step is penalised and the episode goes on.

A logged reward or outcome score that is not a finite number (NaN, Infinity: ingest quarantines
such records, `non_finite_number`, but tables can come from elsewhere) counts as absent, like an
`info` number that is not finite: one NaN would otherwise make every return before it NaN.

Steps are taken in `step_idx` order. The tool-calling components read the `tool_calls`
structs of the steps table (`name`, `arguments_json`, `is_error`); the `info` ones its JSON
`info` (DESIGN §4).

Penalties are written as positive sizes and subtracted (like `step_cost`); a negative
penalty is a configuration error. Bonuses (`success`, `tests_passed`, `syntax_ok`, ...) are
signed weights and added.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from harnessrl.errors import ConfigError

# The order components are reported in (explain's columns).
COMPONENTS = ("outcome", "outcome_score", "source", "step_cost", "tests_passed", "syntax_ok", "style_ok",
              "tool_error", "invalid_tool", "repeated_action", "excess_length", "safety")
# Entries of the first recipe version: always part of the digest, so existing digests stay put.
_LEGACY = ("success", "failure", "outcome_score", "step_cost", "source_reward")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ExcessLength(_Strict):
    """Penalty per line (or character) of the action text above an allowance."""

    weight: float = Field(0.0, ge=0, description="penalty per unit above the allowance (a size, subtracted)")
    unit: Literal["lines", "chars"] = "lines"
    limit: int | None = Field(None, ge=0, description="fixed allowance, used when no baseline is given")
    baseline_key: str | None = Field(None, description="info key of a per-step reference length (e.g. reference_lines)")
    factor: float = Field(1.0, gt=0, description="allowance = factor x info[baseline_key]")

    @model_validator(mode="after")
    def _needs_allowance(self) -> ExcessLength:
        if self.weight and self.limit is None and self.baseline_key is None:
            raise ValueError("excess_length needs a `limit` or a `baseline_key` to measure the excess against")
        return self


class Safety(_Strict):
    """Regexes over what a step does; a match is penalised and (by default) ends the episode."""

    weight: float = Field(0.0, ge=0, description="penalty at the matching step (a size, subtracted)")
    patterns: tuple[str, ...] = ()
    terminate: bool = True

    @field_validator("patterns")
    @classmethod
    def _compile(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        for p in patterns:
            try:
                re.compile(p)
            except re.error as exc:
                raise ValueError(f"safety pattern {p!r} is not a valid regex: {exc}") from None
        return patterns

    @model_validator(mode="after")
    def _needs_patterns(self) -> Safety:
        if self.weight and not self.patterns:
            raise ValueError("safety has a weight but no `patterns`")
        return self


@dataclass(frozen=True)
class EpisodeRewards:
    """A recipe applied to one episode. `components[t]`, `notes[t]` belong to the t-th step in
    `step_idx` order; steps after a terminating safety match are not in them."""

    components: list[dict[str, float]]
    notes: list[list[str]]
    terminate_at: int | None = None  # position of the step a safety pattern ended the episode at
    n_steps: int = 0  # steps given (kept + dropped)
    matched: str | None = None  # the safety pattern that matched
    rewards: list[float] = field(init=False)
    return_to_go: list[float] = field(init=False)

    def __post_init__(self) -> None:
        rewards = [sum(c.values()) for c in self.components]
        rtg, acc = [0.0] * len(rewards), 0.0
        for t in range(len(rewards) - 1, -1, -1):
            acc += rewards[t]
            rtg[t] = acc
        object.__setattr__(self, "rewards", rewards)
        object.__setattr__(self, "return_to_go", rtg)


class RewardRecipe(_Strict):
    name: str = "default"
    success: float = 10.0
    failure: float = -2.0
    outcome_score: float = 0.0
    step_cost: float = 0.1
    source_reward: float = 1.0
    tests_passed: float = 0.0
    syntax_ok: float = 0.0
    style_ok: float = 0.0
    tool_error: float = Field(0.0, ge=0)
    invalid_tool: float = Field(0.0, ge=0)
    repeated_action: float = Field(0.0, ge=0)
    excess_length: ExcessLength = Field(default_factory=ExcessLength)
    safety: Safety = Field(default_factory=Safety)

    def enabled(self) -> list[str]:
        """The components this recipe computes, in report order."""
        on = {
            "outcome": bool(self.success or self.failure),
            "outcome_score": bool(self.outcome_score),
            "source": bool(self.source_reward),
            "step_cost": bool(self.step_cost),
            "tests_passed": bool(self.tests_passed),
            "syntax_ok": bool(self.syntax_ok),
            "style_ok": bool(self.style_ok),
            "tool_error": bool(self.tool_error),
            "invalid_tool": bool(self.invalid_tool),
            "repeated_action": bool(self.repeated_action),
            "excess_length": bool(self.excess_length.weight),
            "safety": bool(self.safety.weight),
        }
        return [c for c in COMPONENTS if on[c]]

    def digest(self) -> str:
        """Content hash of the weights (the name is a label, not part of the identity).

        Covers every component that is on, with all its parameters; a component that is off
        computes nothing and is left out, so recipes that reward the same hash the same
        (and recipes written before a component existed keep their digest)."""
        body = self.model_dump(exclude={"name"})
        for key in list(body):
            if key in _LEGACY:
                continue
            value = body[key]
            weight = value["weight"] if isinstance(value, dict) else value
            if not weight:
                del body[key]
        text = json.dumps(body, sort_keys=True)
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]

    def step_rewards(self, episode: dict[str, Any], steps: list[dict[str, Any]]) -> list[dict[str, float]]:
        """Reward components of each kept step of one episode (see `evaluate`)."""
        return self.evaluate(episode, steps).components

    def evaluate(self, episode: dict[str, Any], steps: list[dict[str, Any]]) -> EpisodeRewards:
        """The recipe on one episode: components and notes (why) per step, in `step_idx` order,
        up to and including a terminating safety match."""
        if all("step_idx" in s for s in steps):
            steps = sorted(steps, key=lambda s: s["step_idx"])
        defined = tool_names(episode.get("tool_definitions"))
        last = len(steps) - 1
        seen_actions: dict[str, int] = {}
        tests_before: float = 0.0
        components: list[dict[str, float]] = []
        notes: list[list[str]] = []
        stop: int | None = None
        matched: str | None = None
        for i, step in enumerate(steps):
            parts: dict[str, float] = {}
            why: list[tuple[str, str]] = []  # (component, reason)
            info = _info(step.get("info"))
            action = step.get("action_text") or ""
            calls = [c for c in step.get("tool_calls") or [] if isinstance(c, dict)]

            if self.step_cost:
                parts["step_cost"] = -self.step_cost
            logged = _number(step.get("reward"))
            if self.source_reward and logged is not None:
                parts["source"] = self.source_reward * logged
                why.append(("source", f"source: logged reward {logged:g}"))

            tests = _number(info.get("tests_passed"))
            if tests is not None:
                if self.tests_passed:
                    parts["tests_passed"] = self.tests_passed * (tests - tests_before)
                    why.append(("tests_passed", f"tests_passed: {tests_before:g} -> {tests:g}"))
                tests_before = tests
            for key in ("syntax_ok", "style_ok"):
                weight, flag = getattr(self, key), info.get(key)
                if weight and isinstance(flag, (bool, int, float)):
                    parts[key] = weight if flag else 0.0
                    why.append((key, f"{key}: {bool(flag)}"))

            if self.tool_error and calls:
                errors = [c.get("name") or "?" for c in calls if c.get("is_error")]
                parts["tool_error"] = -self.tool_error * len(errors)
                if errors:
                    why.append(("tool_error", f"tool_error: {len(errors)} failed call(s): {', '.join(errors)}"))
            if self.invalid_tool and calls and defined:
                bad = [c.get("name") or "" for c in calls if (c.get("name") or "") not in defined]
                parts["invalid_tool"] = -self.invalid_tool * len(bad)
                if bad:
                    names = ", ".join(repr(b) for b in bad)
                    why.append(("invalid_tool", f"invalid_tool: {names} not in tool_definitions"))

            key = action.strip()
            if key:
                if self.repeated_action and key in seen_actions:
                    parts["repeated_action"] = -self.repeated_action
                    why.append(("repeated_action", f"repeated_action: same action as step {seen_actions[key]}"))
                elif self.repeated_action:
                    parts["repeated_action"] = 0.0
                seen_actions.setdefault(key, int(step.get("step_idx", i)))

            el = self.excess_length
            if el.weight:
                allowance = None
                base = _number(info.get(el.baseline_key)) if el.baseline_key else None
                if base is not None:
                    allowance = el.factor * base
                elif el.limit is not None:
                    allowance = float(el.limit)
                if allowance is not None:
                    length = len(action.splitlines()) if el.unit == "lines" else len(action)
                    excess = max(0.0, length - allowance)
                    parts["excess_length"] = -el.weight * excess
                    if excess:
                        why.append(("excess_length", f"excess_length: {length} {el.unit} > {allowance:g} allowed"))

            if self.safety.weight:
                hit = _first_match(self.safety.patterns, action, calls)
                if hit is not None:
                    parts["safety"] = -self.safety.weight
                    ends = "; the episode ends here" if self.safety.terminate else ""
                    why.append(("safety", f"safety: matched '{hit}'{ends}"))
                    if self.safety.terminate:
                        stop, matched = i, hit
                else:
                    parts["safety"] = 0.0

            if stop is None and i == last and episode.get("terminated"):
                success = episode.get("outcome_success")
                if self.success or self.failure:
                    if success is True:
                        parts["outcome"] = self.success
                        why.append(("outcome", "outcome: success"))
                    elif success is False:
                        parts["outcome"] = self.failure
                        why.append(("outcome", "outcome: failure"))
                score = _number(episode.get("outcome_score"))
                if self.outcome_score and score is not None:
                    parts["outcome_score"] = self.outcome_score * score
                    why.append(("outcome_score", f"outcome_score: {score:g}"))
            components.append({k: v + 0.0 for k, v in parts.items()})  # + 0.0: no -0.0 in reports
            notes.append([text for comp, text in why if parts.get(comp)])  # reasons of the nonzero terms
            if stop is not None:
                break
        return EpisodeRewards(components, notes, stop, len(steps), matched)


def tool_names(definitions: Any) -> frozenset[str]:
    """Tool names of an episode's `tool_definitions` (JSON text or parsed): native/Anthropic
    `{name}`, OpenAI `{type: function, function: {name}}`."""
    if isinstance(definitions, (str, bytes)):
        try:
            definitions = json.loads(definitions or "[]")
        except ValueError:
            return frozenset()
    if isinstance(definitions, dict):
        definitions = definitions.get("tools", [definitions])
    names = set()
    for d in definitions if isinstance(definitions, list) else []:
        if not isinstance(d, dict):
            continue
        name = d.get("name")
        if name is None and isinstance(d.get("function"), dict):
            name = d["function"].get("name")
        if isinstance(name, str) and name:
            names.add(name)
    return frozenset(names)


def _info(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw) if raw else {}
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _number(value: Any) -> float | None:
    """A finite number, else None (NaN, Infinity, an integer too large for a float, not a number)."""
    if not isinstance(value, (bool, int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _first_match(patterns: tuple[str, ...], action: str, calls: list[dict[str, Any]]) -> str | None:
    texts = [action]
    for c in calls:  # the name alone (anchored patterns), the arguments alone, and `name(arguments)`
        name, args = c.get("name") or "", c.get("arguments_json") or ""
        texts += [name, args, f"{name}({args})"]
    for p in patterns:
        if any(re.search(p, t) for t in texts):
            return p
    return None


def load_recipe(spec: str) -> RewardRecipe:
    """A recipe by builtin name (`default`, `code-generation`, `tool-calling`) or by YAML path."""
    path = Path(spec)
    if path.suffix in {".yaml", ".yml"} or path.exists():
        if not path.is_file():
            raise ConfigError(f"reward recipe not found: {spec}")
        text = path.read_text()
    else:
        try:
            text = resources.files("harnessrl").joinpath(f"recipes/{spec}.yaml").read_text()
        except FileNotFoundError:
            raise ConfigError(f"unknown builtin reward recipe {spec!r} (builtins: {', '.join(builtin_recipes())}; "
                              "or a YAML path)") from None
    try:
        return RewardRecipe.model_validate(yaml.safe_load(text) or {})
    except (yaml.YAMLError, ValidationError) as exc:
        raise ConfigError(f"invalid reward recipe {spec}: {exc}") from None


def builtin_recipes() -> list[str]:
    folder = resources.files("harnessrl").joinpath("recipes")
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))
