"""The server's Prometheus metrics (text format at GET /metrics), in a registry of its own per server. Every series of
a model's work carries its `model` label (a server of several models: serve/modelset.py), as vLLM's carry theirs.

    jetson_llm_requests_total{endpoint,status}      requests answered, by endpoint and HTTP status
    jetson_llm_prompt_tokens_total                  prompt tokens of admitted requests
    jetson_llm_completion_tokens_total              tokens the engine generated
    jetson_llm_time_to_first_token_seconds          request admitted -> first token (histogram)
    jetson_llm_inter_token_latency_seconds          between consecutive tokens of a request (histogram)
    jetson_llm_request_duration_seconds             request admitted -> last token (histogram)
    jetson_llm_queue_depth                          requests waiting for an engine slot
    jetson_llm_requests_running                     requests in the engine (at most max_batch_size)
    jetson_llm_kv_cache_usage_ratio                 used / total KV cache blocks, where the runtime reports them
    jetson_llm_engine_ready                         1 when the engine is loaded and has not failed
    jetson_llm_truncated_messages_total             chat messages dropped to fit max_input_len (oldest turns first)
    jetson_llm_truncated_tokens_total               tokens cut from the middle of one over-long prompt or message
    jetson_llm_model_loads_total                    engines loaded (a set's on-demand models load and unload)
    jetson_llm_model_unloads_total{reason}          engines unloaded: keep_alive, evicted (LRU, to make room), asked
    jetson_llm_planned_bytes_loaded                 the planned memory of the engines loaded now (no model label)
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

disable_created_metrics()       # no *_created series: scrapers derive rates from the counters themselves

LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)


class Metrics:
    """The server's registry: the request counter (the Gate's, per endpoint) and the model families, whose children
    each served model takes (`model`)."""

    def __init__(self):
        self.registry = r = CollectorRegistry()
        p, m = "jetson_llm_", ["model"]
        self.requests = Counter(p + "requests", "Requests answered, by endpoint and HTTP status",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens of admitted requests", m, registry=r)
        self.completion_tokens = Counter(p + "completion_tokens", "Tokens the engine generated", m, registry=r)
        self.ttft = Histogram(p + "time_to_first_token_seconds", "Request admitted to first token", m,
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram(p + "inter_token_latency_seconds", "Between consecutive tokens of one request", m,
                             buckets=TOKEN_BUCKETS, registry=r)
        self.duration = Histogram(p + "request_duration_seconds", "Request admitted to its last token", m,
                                  buckets=LATENCY_BUCKETS, registry=r)
        self.queue = Gauge(p + "queue_depth", "Requests waiting for an engine slot", m, registry=r)
        self.running = Gauge(p + "requests_running", "Requests in the engine", m, registry=r)
        self.kv = Gauge(p + "kv_cache_usage_ratio", "Used fraction of the KV cache, as the runtime reports it", m,
                        registry=r)
        self.truncated = Counter(p + "truncated_messages", "Chat messages dropped to fit max_input_len", m,
                                 registry=r)
        self.truncated_tokens = Counter(p + "truncated_tokens", "Tokens cut from the middle of an over-long prompt",
                                        m, registry=r)
        self.up = Gauge(p + "engine_ready", "1 when the engine is loaded and has not failed", m, registry=r)
        self.loads = Counter(p + "model_loads", "Engines loaded", m, registry=r)
        self.unloads = Counter(p + "model_unloads", "Engines unloaded, by why", ["model", "reason"], registry=r)
        self.planned = Gauge(p + "planned_bytes_loaded", "Planned memory of the engines loaded now", registry=r)

    def model(self, name: str, stats: Callable[[], dict[str, float]], ready: Callable[[], bool]) -> ModelMetrics:
        return ModelMetrics(self, name, stats, ready)

    def text(self) -> bytes:
        return generate_latest(self.registry)


class ModelMetrics:
    """One served model's children of the server's families (the names a Server counts with)."""

    def __init__(self, root: Metrics, name: str, stats: Callable[[], dict[str, float]], ready: Callable[[], bool]):
        self.name = name
        self.prompt_tokens = root.prompt_tokens.labels(name)
        self.completion_tokens = root.completion_tokens.labels(name)
        self.ttft, self.itl, self.duration = root.ttft.labels(name), root.itl.labels(name), root.duration.labels(name)
        self.queue, self.running = root.queue.labels(name), root.running.labels(name)
        self.truncated, self.truncated_tokens = root.truncated.labels(name), root.truncated_tokens.labels(name)
        self.loads = root.loads.labels(name)
        self._unloads = root.unloads
        root.kv.labels(name).set_function(lambda: stats().get("kv_cache_usage", float("nan")))
        root.up.labels(name).set_function(lambda: 1.0 if ready() else 0.0)

    def unloaded(self, reason: str) -> None:
        self._unloads.labels(self.name, reason).inc()
