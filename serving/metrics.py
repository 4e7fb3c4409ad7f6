"""Prometheus metrics of one replica, rendered at `GET /metrics` by `prometheus_client`.

Each replica keeps its own registry: with several replicas, a scrape through the Serve proxy
is answered by one replica (whichever the proxy picks), so the counters are that replica's
only; `harnessrl_replica_info{replica=...}` says which. For totals over replicas the same
series are also recorded through Ray's metrics (`ray.serve.metrics`): Ray's metrics agent on
each node exports them as `ray_harnessrl_*`, tagged with deployment and replica, for a
Prometheus that scrapes the nodes to sum. Requests Serve rejects before they reach a replica
(429 when the queue is full) are counted in neither: Ray Serve's own metrics
(`ray_serve_num_http_error_requests`) have them.
"""

from __future__ import annotations

from typing import Callable, Iterable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

ENDPOINTS = ("/v1/score", "/v1/select_tool", "/v1/feedback", "/v1/model", "/healthz", "/metrics")
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class _CacheCollector(Collector):
    """The critics' LRU embedding caches, read at scrape time (a model swap starts a fresh cache,
    which Prometheus sees as a counter reset)."""

    def __init__(self, caches: Callable[[], Iterable[tuple[str, dict[str, int]]]]):
        self.caches = caches

    def collect(self):
        hits = CounterMetricFamily("harnessrl_embedding_cache_hits", "texts served from the embedding LRU",
                                   labels=["model"])
        misses = CounterMetricFamily("harnessrl_embedding_cache_misses", "texts the encoder had to encode",
                                     labels=["model"])
        size = GaugeMetricFamily("harnessrl_embedding_cache_entries", "texts in the embedding LRU", labels=["model"])
        ratio = GaugeMetricFamily("harnessrl_embedding_cache_hit_ratio", "hits / (hits + misses) since the model "
                                  "was loaded", labels=["model"])
        for role, s in self.caches():
            hits.add_metric([role], s["hits"])
            misses.add_metric([role], s["misses"])
            size.add_metric([role], s["size"])
            total = s["hits"] + s["misses"]
            ratio.add_metric([role], s["hits"] / total if total else 0.0)
        yield from (hits, misses, size, ratio)


class _EncoderCollector(Collector):
    """The encoder deployment's LRU (`serve.encoder`), as one of its replicas last reported it
    (fetched by the /metrics handler before rendering)."""

    def __init__(self, stats: Callable[[], dict | None]):
        self.stats = stats

    def collect(self):
        s = self.stats()
        if not s:
            return
        for name, kind, help_, value in (
                ("harnessrl_encoder_cache_hits", CounterMetricFamily, "texts the encoder deployment served from its "
                 "LRU", s["hits"]),
                ("harnessrl_encoder_cache_misses", CounterMetricFamily, "texts the encoder deployment encoded",
                 s["misses"]),
                ("harnessrl_encoder_cache_entries", GaugeMetricFamily, "texts in the encoder deployment's LRU",
                 s["size"]),
                ("harnessrl_encoder_batches", CounterMetricFamily, "@serve.batch calls of the encoder deployment",
                 s["batches"])):
            yield kind(name, help_ + " (one replica's figure)", value=value)


class _RayMirror:
    """The same series through Ray's metrics agent, which sums nothing but exports every
    replica's series from its node: the way to totals with several replicas."""

    def __init__(self):
        from ray.serve import metrics as rm

        self.requests = rm.Counter("harnessrl_requests", "HTTP requests answered", tag_keys=("endpoint", "status"))
        self.latency = rm.Histogram("harnessrl_request_latency_seconds", "time in the replica",
                                    boundaries=list(LATENCY_BUCKETS), tag_keys=("endpoint",))
        self.batch = rm.Histogram("harnessrl_batch_size", "requests per batch", boundaries=list(BATCH_BUCKETS),
                                  tag_keys=("endpoint",))
        self.events = {name: rm.Counter(f"harnessrl_{name}", help_, tag_keys=("model",)) for name, help_ in (
            ("decisions", "scored requests"), ("fallbacks", "decisions below the fallback threshold"),
            ("ood_decisions", "decisions on out-of-distribution states"))}


class ServiceMetrics:
    def __init__(self, replica: str, caches: Callable[[], Iterable[tuple[str, dict[str, int]]]],
                 models: Iterable[str] = ("champion",), ray_metrics: bool = True,
                 encoder_stats: Callable[[], dict | None] | None = None):
        self.ray = _RayMirror() if ray_metrics else None
        self.registry = r = CollectorRegistry(auto_describe=False)
        Gauge("harnessrl_replica_info", "the replica these counters belong to", ["replica"], registry=r
              ).labels(replica).set(1)
        self.requests = Counter("harnessrl_requests", "HTTP requests answered by this replica",
                                ["endpoint", "status"], registry=r)
        self.latency = Histogram("harnessrl_request_latency_seconds", "time in the replica, request to response",
                                 ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.batch = Histogram("harnessrl_batch_size", "requests per model call (the @serve.batch batches waiting meanwhile, merged)", ["endpoint"],
                               buckets=BATCH_BUCKETS, registry=r)
        self.decisions = Counter("harnessrl_decisions", "scored requests", ["model"], registry=r)
        self.fallbacks = Counter("harnessrl_fallbacks", "decisions whose chosen candidate scored below the "
                                 "model's fallback threshold", ["model"], registry=r)
        self.ood = Counter("harnessrl_ood_decisions", "decisions on a state far from every training state",
                           ["model"], registry=r)
        self.blended = Counter("harnessrl_prior_blended_decisions", "decisions ranked by score + w * logprob",
                               ["model"], registry=r)
        r.register(_CacheCollector(caches))
        if encoder_stats is not None:
            r.register(_EncoderCollector(encoder_stats))
        for model in models:  # zeros from the start, so a rate() has a series before the first event
            for counter in (self.decisions, self.fallbacks, self.ood, self.blended):
                counter.labels(model)

    def request(self, path: str, status: int, seconds: float) -> None:
        endpoint = path if path in ENDPOINTS else "other"  # bounded label values, whatever clients send
        self.requests.labels(endpoint, str(status)).inc()
        self.latency.labels(endpoint).observe(seconds)
        if self.ray:
            self.ray.requests.inc(1, tags={"endpoint": endpoint, "status": str(status)})
            self.ray.latency.observe(seconds, tags={"endpoint": endpoint})

    def batch_size(self, endpoint: str, n: int) -> None:
        self.batch.labels(endpoint).observe(n)
        if self.ray:
            self.ray.batch.observe(n, tags={"endpoint": endpoint})

    def decision(self, model: str, fallback: bool, ood: bool | None, blended: bool) -> None:
        self.decisions.labels(model).inc()
        if fallback:
            self.fallbacks.labels(model).inc()
        if ood:
            self.ood.labels(model).inc()
        if self.ray:
            for name, happened in (("decisions", True), ("fallbacks", fallback), ("ood_decisions", bool(ood))):
                if happened:
                    self.ray.events[name].inc(1, tags={"model": model})
        if blended:
            self.blended.labels(model).inc()

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


_current: ServiceMetrics | None = None


def install(m: ServiceMetrics) -> ServiceMetrics:
    """The metrics of this process's replica, for the HTTP middleware."""
    global _current
    _current = m
    return m


def current() -> ServiceMetrics | None:
    return _current
