"""The server's Prometheus metrics (text format at GET /metrics), in a registry of its own per server.

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
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

disable_created_metrics()       # no *_created series: scrapers derive rates from the counters themselves

LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)


class Metrics:
    def __init__(self, stats: Callable[[], dict[str, float]], ready: Callable[[], bool]):
        self.registry = r = CollectorRegistry()
        p = "jetson_llm_"
        self.requests = Counter(p + "requests", "Requests answered, by endpoint and HTTP status",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.completion_tokens = Counter(p + "completion_tokens", "Tokens the engine generated", registry=r)
        self.ttft = Histogram(p + "time_to_first_token_seconds", "Request admitted to first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram(p + "inter_token_latency_seconds", "Between consecutive tokens of one request",
                             buckets=TOKEN_BUCKETS, registry=r)
        self.duration = Histogram(p + "request_duration_seconds", "Request admitted to its last token",
                                  buckets=LATENCY_BUCKETS, registry=r)
        self.queue = Gauge(p + "queue_depth", "Requests waiting for an engine slot", registry=r)
        self.running = Gauge(p + "requests_running", "Requests in the engine", registry=r)
        kv = Gauge(p + "kv_cache_usage_ratio", "Used fraction of the KV cache, as the runtime reports it",
                   registry=r)
        kv.set_function(lambda: stats().get("kv_cache_usage", float("nan")))
        self.truncated = Counter(p + "truncated_messages", "Chat messages dropped to fit max_input_len",
                                 registry=r)
        self.truncated_tokens = Counter(p + "truncated_tokens", "Tokens cut from the middle of an over-long prompt",
                                        registry=r)
        up = Gauge(p + "engine_ready", "1 when the engine is loaded and has not failed", registry=r)
        up.set_function(lambda: 1.0 if ready() else 0.0)

    def text(self) -> bytes:
        return generate_latest(self.registry)
