"""Typed pipeline configuration, loaded from YAML with `--set key=value` overrides.

One model per stage; every field has a default that runs on a 2-core laptop, and the same
file scales out by changing values (workers, GPUs, s3:// paths), never code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from harnessrl.errors import ConfigError
from harnessrl.precision import Compute, Precision, identity_precision, normalise
from harnessrl.tool_naming import ToolFrom


def _named(allowed):
    """A precision setting: the names of harnessrl.precision, its aliases (bf16, fp32) accepted."""
    return Annotated[allowed, BeforeValidator(normalise)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DataConfig(_Strict):
    """Sources: files, directories, globs, `s3://` URIs, or `builtin:twx-train|twx-test`."""

    train: list[str]
    heldout: list[str] = Field(default_factory=list)
    format: Literal["native", "openai-chat", "openai-responses", "anthropic", "atif", "auto"] = "native"
    outcomes: str | None = Field(None, description="JSONL of {episode_id, success, score} joined by native id")
    max_line_bytes: int | None = Field(None, ge=1024, description="a longer log line is quarantined (line_too_long), "
                                                                      "never read whole (None: ingest's 64 MiB)")


class RenderConfig(_Strict):
    """How a state is written as text: the task, the last `window` (action, result) pairs, the observation."""

    window: int = Field(4, ge=0)
    max_chars: int = Field(2000, ge=200)
    tool_from: ToolFrom = Field(
        "calls", description="an action's tool: `name(...)` tool calls, or the first word (text games)")
    max_tokens: int | None = Field(
        None, ge=16, description="token budget of a state, counted with the encoder's tokenizer: the oldest "
                                 "history is dropped first, the task and observation always kept (None: no budget)")
    tokenizer: str | None = Field(
        None, description="encoder whose tokenizer counts max_tokens; a pipeline sets it to encoder.model")
    pin: list[str] = Field(
        default_factory=list, description="glob patterns of actions (case-insensitive) whose latest result stays "
                                          "in the state while the window slides, e.g. ['read map', 'cat *']")
    list_actions: bool = Field(False, description="a `Done:` line with every action taken so far and repeat counts")
    observation_first: bool = Field(False, description="the current observation before the task")
    # the state as segments (read by the reader head, harnessrl.heads.reader): the task, the observation, the
    # last action, every distinct earlier result (the newest first, then the longest), the actions taken
    segments: Literal["memory", "text"] = Field(
        "memory", description="memory: the segments below; text: the rendered state as one segment (the reader "
                              "reading what the frozen head reads: an ablation)")
    memory_results: int = Field(6, ge=0, description="distinct earlier results kept as segments: the newest "
                                                     "`memory_newest`, then the longest of the older ones")
    memory_newest: int = Field(3, ge=0, description="how many of the kept results are the newest ones")
    memory_actions: bool = Field(True, description="a segment listing the actions taken so far, with repeat counts")
    segment_chars: int = Field(1200, ge=50, description="characters per segment; longer ones are cut")
    details: int = Field(0, ge=0, le=64, description="the observation's lines and sentences also as segments of their "
                                                     "own (role `detail`), at most this many: a number, a recipe line "
                                                     "or an item read apart from the rest (0: off)")
    status_from: str | None = Field(
        "score", description="the field of a logged step's `info` (and of a request's history item, `status`) "
                             "that holds the source's status after the action, e.g. a game's score: the state shows "
                             "the latest as a `status` segment and marks each result with how the status moved "
                             "(None: off; states whose source gives none are unchanged)")


class EncoderConfig(_Strict):
    """The encode stage: a Ray Data actor pool running a sentence-transformers model.

    The pool adapts to the cluster at stage start (see `pipelines/encode_pool.py: plan_pool`):
    actors that do not fit beside the stage's read tasks are dropped or given a smaller CPU
    share, never left waiting; GPU options are checked against the cluster there too."""

    model: str = Field("builtin:all-MiniLM-L6-v2", description="builtin name or a local sentence-transformers folder")
    batch_size: int = Field(128, ge=1, description="texts per forward pass at max_seq_length (shorter texts: more)")
    max_seq_length: int | None = Field(None, ge=8, description="token cap per text; None = the model's own")
    max_candidates: int = Field(16, ge=0, description="untaken candidates embedded per step (for the penalty)")
    actors: int | None = Field(None, ge=1, description="fixed actor pool size; None = fit the cluster")
    min_actors: int | None = Field(None, ge=1, description="autoscaling pool: smallest size (None: max_actors)")
    max_actors: int | None = Field(None, ge=1, description="autoscaling pool: largest size (None: fit the cluster)")
    cpus_per_actor: float = Field(0.5, gt=0)
    gpus_per_actor: float = Field(0.0, ge=0, description="0: CPU actors; 1: one GPU each; 0.25: four share a GPU "
                                                          "(small models like MiniLM: one actor cannot keep a GPU busy)")
    precision: _named(Literal["auto", Precision]) = Field(
        "auto", description="model compute: auto = float16 on GPU actors, float32 on CPU actors. Opt-in: bfloat16 "
                            "(autocast; 1.8-2.4x faster on CPUs with AVX512-BF16/AMX), part of the encoder "
                            "identity, so its vectors are never mixed with float32 ones (caches, critics) and a "
                            "critic serves at the precision it was trained on; its vectors move with the batch "
                            "they are computed in (up to 1e-3), so scores are not bit-reproducible")
    dtype: Literal["float32", "float16"] = Field("float32", description="stored embedding columns")
    vectors: Literal["references", "copies"] = Field(
        "references", description="how encoded transitions hold their texts' vectors: references (row numbers into "
                                  "the run's distinct-text table `_texts`, each vector stored once; training gathers "
                                  "them a batch at a time) or copies (every row carries its vectors: 3x the disk "
                                  "and 3-4x the memory at the quickstart's size)")
    block_texts: int = Field(256, ge=16, description="distinct texts per encoder actor call (sorted by length there); "
                                                     "1024 suits GPU actors")
    cache: str | None = Field(None, description="persistent embedding cache: a local folder or s3:// URI; None = off")
    segments: bool | None = Field(None, description="also embed the texts of the state segments (the reader head's "
                                                     "semantic path); None: when train.head reads them")
    state_texts: bool | None = Field(None, description="embed the rendered state texts (what the frozen and cross "
                                                       "heads, the tool head and their OOD check read); None: unless "
                                                       "train.head is reader")

    @model_validator(mode="after")
    def _check(self) -> "EncoderConfig":
        if self.actors is not None and (self.min_actors is not None or self.max_actors is not None):
            raise ValueError("set either actors (a fixed pool) or min_actors/max_actors (an autoscaling pool), not both")
        if self.min_actors is not None and self.max_actors is not None and self.min_actors > self.max_actors:
            raise ValueError(f"min_actors ({self.min_actors}) is larger than max_actors ({self.max_actors})")
        if self.gpus_per_actor > 1:
            raise ValueError(f"gpus_per_actor {self.gpus_per_actor}: one encoder actor uses at most one GPU; "
                             "set 1 (or a fraction to share a GPU) and let the pool grow to the cluster's GPUs")
        if self.precision == "float16" and self.gpus_per_actor == 0:
            raise ValueError("precision float16 needs GPU actors (gpus_per_actor > 0); on CPUs use auto or float32")
        if self.cache is not None:
            cache = self.cache.strip()
            if not cache:
                raise ValueError("cache: empty; use a local folder, an s3:// URI, or leave it unset")
            if "://" in cache and not cache.startswith(("s3://", "file://")):
                raise ValueError(f"cache {cache!r}: use a local folder or an s3:// URI")
        return self

    @property
    def identity_precision(self) -> str:
        """The precision named in the encoder identity (harnessrl.precision.identity_precision)."""
        return identity_precision(self.precision)


class CrossHeadConfig(_Strict):
    """The cross-encoder head (train.head: cross): the pipeline's encoder fine-tuned on (state, action) pairs."""

    layers: int = Field(6, ge=1, le=48, description="first transformer layers of the encoder kept (fewer: faster, "
                                                    "weaker; MiniLM has 6)")
    max_length: int = Field(256, ge=16, le=512, description="tokens per (state, action) pair; the longer text is cut "
                                                                  "first (the state, unless the action is longer)")
    batch_size: int = Field(32, ge=2, description="states per step over all workers (the cross head's own batch: "
                                                  "train.batch_size is the frozen head's)")
    trunk_lr: float = Field(3e-5, gt=0, description="learning rate of the trunk (train.lr is the heads')")


class ReaderHeadConfig(_Strict):
    """The reader head (train.head: reader): Q and V over the state's segments (harnessrl.heads.reader)."""

    semantic: bool = Field(True, description="each segment's frozen sentence embedding, standardised per role")
    tokens: bool = Field(False, description="the token path: each segment's tokens through the encoder's word "
                                            "embeddings and a small convolution, pooled")
    match: bool = Field(True, description="per state role, the share of the candidate's tokens found there")
    dueling: bool = Field(True, description="Q = A(s, a) + B(s): the small differences between actions are not "
                                            "drowned by the spread of values between states")
    value_target: Literal["taken", "candidates", "supported"] = Field(
        "candidates", description="V(s) fit (by expectile) to Q of the taken action (plain IQL), to the best Q "
                                  "among the step's logged candidates (the value of acting as the critic will), or "
                                  "to the best among those the data took from the state's observation (supported: "
                                  "values the network only guesses do not reach V)")
    penalty_on: Literal["unseen", "unseen_here", "untaken"] = Field(
        "unseen", description="the candidate penalty (train.alpha) applies to untaken candidates never taken anywhere "
                              "in the data (unseen: one taken elsewhere learns its value there, unbiased), to those "
                              "never taken from the state's observation (unseen_here: where observations repeat, the "
                              "actions the data says nothing about there), or to every untaken candidate (as the "
                              "frozen head)")
    history_dropout: float = Field(0.25, ge=0, lt=1, description="share of training states read without their "
                                                                 "history (task and observation only, features zero), "
                                                                 "so the critic also answers agents that send none")
    dim: int = Field(128, ge=8, description="width of the segment vectors")
    conv_layers: int = Field(2, ge=0, le=8, description="token path: residual kernel-3 convolutions")
    segment_tokens: int = Field(64, ge=8, le=512, description="tokens kept per segment (token path, match)")
    batch_size: int = Field(64, ge=2, description="states per step over all workers (train.batch_size is the frozen "
                                                  "head's)")
    lr: float = Field(3e-4, gt=0)
    prior_steps: int = Field(800, ge=0, description="steps of the behaviour prior (harnessrl.behaviour_prior): the "
                                                    "logs' policy over each step's candidates, cloned after the "
                                                    "critic's training and blended by the service as score + "
                                                    "prior_weight * log pi when an agent sends no logprobs "
                                                    "(0: none; bench/README.md, 'The prior in the product')")
    prior_rows: int = Field(20000, ge=1, description="training rows (a keyed sample) the behaviour prior learns from")

    @model_validator(mode="after")
    def _check(self) -> "ReaderHeadConfig":
        if not (self.semantic or self.tokens):
            raise ValueError("the reader needs at least one of semantic, tokens")
        return self


# score + w * log pi: the weight of an agent's logprobs or the model's behaviour prior, by default (w = 1 measured
# best of 1, 3, 10 on TextWorldExpress: bench/README.md, "critic+bc" and "The prior in the product")
PRIOR_WEIGHT = 1.0
AUTO_STEPS = (2000, 50000)  # train.steps: auto stays within these (text Taxi needed 40,000: bench/README.md)


def _steps(value: Any) -> int | str:
    """train.steps: a positive integer or `auto` (one message for both, not one per member of the union)."""
    if value == "auto":
        return value
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip().isdigit() \
            or int(value) < 1:
        raise ValueError(f"an integer >= 1 or 'auto', not {value!r}")
    return int(value)


Steps = Annotated[int | Literal["auto"], BeforeValidator(_steps)]


class TrainConfig(_Strict):
    head: Literal["frozen", "cross", "reader"] = Field(
        "reader", description="reader: the state as segments (task, observation, results, actions), each read "
                              "through its embedding, the candidates attending over them (its tool head reads the "
                              "observation's embedding); frozen: an MLP on one embedding of the rendered state "
                              "(fastest); cross: the encoder fine-tuned on (state, action) pairs as the trunk of Q and "
                              "V (a GPU job at full size; no tool head)")
    cross: CrossHeadConfig = CrossHeadConfig()
    reader: ReaderHeadConfig = ReaderHeadConfig()
    steps: Steps = Field(
        "auto", description="gradient steps; auto: about `epochs` passes over the training rows in the head's batches, "
                            f"at least {AUTO_STEPS[0]} and at most {AUTO_STEPS[1]} (values propagate one step of an "
                            "episode per target update: more data, longer episodes need more steps)")
    epochs: float = Field(100.0, gt=0, description="passes over the training rows when steps is auto")
    batch_size: int = Field(256, ge=2)
    lr: float = Field(3e-4, gt=0)
    hidden_dim: int = Field(256, ge=8)
    gamma: float = Field(0.95, gt=0, le=1)
    expectile: float = Field(0.9, gt=0, lt=1, description="V(s) as this expectile of Q: near 1, the best in-sample "
                                                              "action's value; 0.5, the behaviour's mean")
    polyak: float = Field(0.005, gt=0, le=1)
    alpha: float = Field(0.0, ge=0, description="candidate-set penalty weight (0: none; the reader applies it to "
                                                 "unseen candidates, train.reader.penalty_on)")
    candidates_per_step: int = Field(4, ge=1, description="untaken candidates per state in each penalty batch")
    replay: Literal["stream", "memory"] = Field(
        "stream", description="how a frozen- or reader-head worker draws minibatches: stream (its shard read epoch "
                              "after epoch through a local shuffle buffer, vectors looked up per batch: memory "
                              "stays flat whatever the corpus) or memory (the shard held in memory once, "
                              "minibatches sampled uniformly: the path before issue 26, for shards that fit)")
    rows: Literal["auto", "store", "files"] = Field(
        "auto", description="where the encoded rows are read from each epoch: store (held in Ray's object store, "
                            "which spills to disk when full), files (streamed from their Parquet files, a block at a "
                            "time: no process holds the corpus), auto (store when they take at most a quarter of "
                            "the object store and at most 1 GB, else files: memory stops following the corpus)")
    shuffle_buffer: int = Field(16384, ge=0, description="rows in each worker's local shuffle buffer while it "
                                                         "streams its shard (replay: stream); 0: in stored order")
    features: bool = Field(True, description="history features (harnessrl.features) as inputs of Q")
    tool_head: Literal["awr", "iql", "cql", "none"] = Field(
        "awr", description="tool-selection head, trained when the data calls >= 2 tools: awr (policy weighted by "
                           "the critic's advantage), iql / cql (a discrete Q over tools of its own, then AWR)")
    max_tools: int = Field(64, ge=2, description="tool vocabulary cap; rarer tools share the last slot")
    awr_beta: float = Field(3.0, gt=0, description="AWR inverse temperature of the tool policy")
    precision: _named(Compute) = Field(
        "float32", description="bfloat16 (or bf16): forward passes under bfloat16 autocast (faster on GPUs and "
                               "AVX512-BF16 CPUs, less exact)")
    num_workers: int = Field(2, ge=1)
    cpus_per_worker: float = Field(0.5, gt=0)
    gpus_per_worker: float = Field(0.0, ge=0)
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK", description="where Ray Train puts the workers: PACK fills a node first; SPREAD one per node")
    checkpoint_every: int = Field(500, ge=1)
    validation_fraction: float | None = Field(
        None, ge=0, lt=1, description="share of task groups (group_id) kept out of training: the critic's held-out TD "
                                      "error every log_every steps, and the fallback and OOD thresholds are calibrated "
                                      "on them; 0: none; None: 0.1 when the data has 10 or more task groups")
    select: Literal["best", "last"] = Field(
        "last", description="with validation: export the last weights, or those of the best held-out TD error (it "
                            "favours early, undertrained critics: see bench/README.md)")
    patience: int | None = Field(
        None, ge=1, description="with validation: stop after this many validations without improvement")
    max_failures: int = Field(2, ge=0, description="worker-group restarts from the last checkpoint")
    poll_s: float = Field(0.5, gt=0, description="how often Ray Train's controller polls the workers (its "
                                                  "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S, 2 s by default there): each "
                                                  "checkpoint and the run's start and end wait for a poll")
    storage_retries: int = Field(3, ge=0, description="runs resumed after a failure of the checkpoint storage "
                                                    "(an S3 outage), which Ray Train does not retry itself")
    storage_retry_s: float = Field(10.0, ge=0, description="seconds before the first such resume (doubling)")
    log_every: int = Field(100, ge=1)
    fallback_quantile: float = Field(0.1, ge=0, le=1)
    seed: int = 0


class RegistryConfig(_Strict):
    experiment: str = "harnessrl"
    model_name: str = Field("harnessrl-critic", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    alias: str = Field("champion", pattern=r"^[A-Za-z0-9_-]+$", description="MLflow alias: letters, digits, _ and -")


class EvaluateConfig(_Strict):
    max_heldout_steps: int = Field(1000, ge=1)
    expert_field: str = Field(
        "info.expert_action", pattern=r"^[A-Za-z_][\w-]*(\.[\w-]+)*$",
        description="dotted path to the expert's action in a held-out step (`info.` reads the step's info "
                    "object, e.g. info.behaviour.expert_action); steps without one are not ranked")


class AutoscalingConfig(_Strict):
    """Ray Serve replica autoscaling (unset fields: Serve's defaults)."""

    min_replicas: int = Field(1, ge=0, description="0 lets the app scale to zero (a cold start loads the model)")
    max_replicas: int = Field(2, ge=1)
    initial_replicas: int | None = Field(None, ge=0)
    target_ongoing_requests: float = Field(16, gt=0, description="requests per replica the autoscaler aims for")
    upscale_delay_s: float | None = Field(None, ge=0)
    downscale_delay_s: float | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _check(self) -> "AutoscalingConfig":
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) is larger than max_replicas ({self.max_replicas})")
        return self


class ServeEncoderConfig(_Strict):
    """`serve.encoder`: the sentence encoder as a Ray Serve deployment of its own (batched, with
    an LRU of embeddings by text hash shared by every critic replica), instead of inside each
    critic replica. It must be the encoder the critic was trained with: `model` and
    `max_seq_length` default to the model's own, and a different value is an error at startup."""

    model: str | None = Field(None, description="encoder to load (None: the one the served model names)")
    max_seq_length: int | None = Field(None, ge=8, description="token cap (None: the served model's)")
    replicas: int = Field(1, ge=1)
    num_cpus: float = Field(0.5, ge=0, description="CPUs reserved per encoder replica (torch threads: max(1, floor))")
    num_gpus: float = Field(0.0, ge=0, le=1, description="GPUs per encoder replica (a fraction shares one)")
    precision: _named(Literal["auto", "float32", "float16"]) = Field(
        "auto", description="encoder weights on a GPU: auto = float16 (a model whose vectors were made in "
                            "bfloat16 runs under bfloat16 autocast instead); on CPU the model's own precision")
    max_batch_size: int = Field(64, ge=1, description="critic batches per encoder call")
    batch_wait_timeout_s: float = Field(0.005, ge=0)
    max_ongoing_requests: int = Field(128, ge=1, description="per encoder replica (>= max_batch_size)")
    cache_size: int = Field(200_000, ge=0, description="embeddings kept per encoder replica (LRU by text hash)")

    @model_validator(mode="after")
    def _check(self) -> "ServeEncoderConfig":
        if self.precision == "float16" and self.num_gpus == 0:
            raise ValueError("precision float16 needs a GPU (num_gpus > 0); on CPUs use auto or float32")
        return self


class ServeConfig(_Strict):
    """The critic service: a pipeline's `serve:` section, or a file of its own for `harnessrl serve
    --config` (serving/serve.yaml). Every setting of the service lives here, nowhere else."""

    enabled: bool = Field(True, description="pipelines: start the service at the end of a run")
    model: str | None = Field(None, description="`harnessrl serve`: NAME@ALIAS, NAME/VERSION, models:/... or a "
                                                "critic folder (a pipeline serves the model it registered)")
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    replicas: int | None = Field(None, ge=1, description="fixed replica count (default 1); not with autoscaling")
    autoscaling: AutoscalingConfig | None = Field(None, description="replicas follow the load (Ray Serve autoscaler)")
    num_cpus: float = Field(0.5, ge=0, description="CPUs reserved per replica")
    num_gpus: float = Field(0.0, ge=0, description="GPUs per replica (a fraction shares one)")
    max_batch_size: int = Field(32, ge=1)
    batch_wait_timeout_s: float = Field(0.01, ge=0)
    smoke_requests: int = Field(5, ge=0, description="held-out states scored over HTTP at the end of a run")
    decision_log: str | None = Field(None, description="folder (local or s3://) for the decision and feedback log")
    decision_log_fields: Literal["full", "hashes", "drop"] = Field(
        "full", description="what the decision log keeps of the texts an agent sends (state, candidates, agent_id, "
                            "feedback detail): full = plain text (needed to train on the log), hashes = their "
                            "SHA-256, drop = nothing")
    max_ongoing_requests: int = Field(64, ge=1, description="requests in flight per replica (>= max_batch_size)")
    max_queued_requests: int = Field(256, ge=1, description="beyond this, requests get 429 + Retry-After")
    max_candidates: int = Field(256, ge=1, le=4096, description="candidates per /v1/score request; more: 422")
    max_text_chars: int = Field(20_000, ge=1, description="characters per state or candidate text; longer: 413")
    max_request_bytes: int = Field(16 * 2**20, ge=1024, description="request body (by Content-Length); larger: 413 "
                                                                    "before the body is parsed")
    prior_weight: float = Field(PRIOR_WEIGHT, ge=0,
                                description="rank by score + prior_weight * log pi: the agent's logprob when "
                                            "candidates carry one, else the model's behaviour prior when it has "
                                            "one (0: critic only)")
    avoid_repeats: bool = Field(False, description="never choose a candidate the agent already took from the same "
                                                   "observation while another is left (requests may override)")
    challenger: str | None = Field(None, description="model URI answering `challenger_share` of agents")
    challenger_share: float = Field(0.1, ge=0, le=1, description="agents routed to the challenger by agent_id hash")
    reload_every_s: float = Field(30.0, ge=0, description="how often aliases are checked for a new version (0: never)")
    cache_size: int = Field(50_000, ge=0, description="embeddings kept per critic replica and model (LRU; 0: none)")
    encoder: ServeEncoderConfig | None = Field(
        None, description="a separate encoder deployment (None: each critic replica encodes in its own process)")

    @model_validator(mode="after")
    def _check(self) -> "ServeConfig":
        if self.replicas is not None and self.autoscaling is not None:
            raise ValueError("set either replicas (a fixed count) or autoscaling, not both")
        return self


class PipelineConfig(_Strict):
    name: str = "pipeline"
    output_dir: str | None = Field(None, description="default: $HARNESSRL_HOME/runs/<name>")
    ray_address: str | None = None
    data: DataConfig
    rewards: str = "default"
    render: RenderConfig = Field(default_factory=RenderConfig)
    encoder: EncoderConfig = Field(default_factory=EncoderConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    registry: RegistryConfig = Field(default_factory=RegistryConfig)
    evaluate: EvaluateConfig = Field(default_factory=EvaluateConfig)
    serve: ServeConfig = Field(default_factory=ServeConfig)

    def run_dir(self) -> str:
        """Where the run's stages write: output_dir, else $HARNESSRL_HOME/runs/<name>."""
        from harnessrl import settings

        return self.output_dir or str(settings.runs_dir() / self.name)

    @model_validator(mode="after")
    def _segments(self) -> "PipelineConfig":
        """The encode stage embeds the state segments when the head reads them (encoder.segments: None)."""
        update = {}
        if self.encoder.segments is None:
            update["segments"] = self.train.head == "reader"
        if self.encoder.state_texts is None:
            update["state_texts"] = self.train.head != "reader"
        if update:
            self.encoder = self.encoder.model_copy(update=update)
        return self

    @model_validator(mode="after")
    def _render_budget(self) -> "PipelineConfig":
        """The token budget is counted with the encoder's tokenizer, and must fit what the encoder keeps."""
        if self.render.max_tokens is not None:
            if self.render.tokenizer is None:
                self.render = self.render.model_copy(update={"tokenizer": self.encoder.model})
            cap = self.encoder.max_seq_length
            if cap is not None and self.render.max_tokens > cap:
                raise ValueError(f"render.max_tokens ({self.render.max_tokens}) is larger than encoder.max_seq_length "
                                 f"({cap}): the encoder would cut the state anyway")
        return self


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `a.b.c=value` overrides; values are parsed as YAML scalars (`3`, `true`, `[a, b]`)."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        key, _, text = item.partition("=")
        parts = key.strip().split(".")
        if not all(parts):
            raise ConfigError(f"--set has an empty key segment: {item!r}")
        node = raw
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {key}: {part!r} is not a section")
            node = child
        node[parts[-1]] = yaml.safe_load(text) if text.strip() else ""
    return raw


def _read_yaml(path: str | Path, what: str, overrides: list[str] | None) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{what} file not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    return apply_overrides(raw, overrides or [])


def _validate(model: type[BaseModel], raw: dict[str, Any], origin: str, what: str):
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        lines = [f"{origin}: invalid {what} configuration:"]
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "(top level)"
            lines.append(f"  {where}: {err['msg']}")
        raise ConfigError("\n".join(lines)) from None


def load_pipeline(path: str | Path, overrides: list[str] | None = None) -> PipelineConfig:
    return parse_pipeline(_read_yaml(path, "pipeline", overrides), origin=str(path))


def parse_pipeline(raw: dict[str, Any], origin: str = "<config>") -> PipelineConfig:
    return _validate(PipelineConfig, raw, origin, "pipeline")


def parse_serve(raw: dict[str, Any], origin: str = "<serve config>") -> ServeConfig:
    """A ServeConfig from a mapping (e.g. the `args` of a Serve config file's application)."""
    return _validate(ServeConfig, raw, origin, "serve")


def load_serve(path: str | Path | None, overrides: list[str] | None = None,
               fields: dict[str, Any] | None = None) -> ServeConfig:
    """A service configuration (serving/serve.yaml), then `--set` overrides, then explicit
    command-line fields (None values are ignored); every layer is validated by ServeConfig."""
    raw = _read_yaml(path, "serve config", overrides) if path else apply_overrides({}, overrides or [])
    raw.update({k: v for k, v in (fields or {}).items() if v is not None})
    return _validate(ServeConfig, raw, str(path or "<serve flags>"), "serve")
