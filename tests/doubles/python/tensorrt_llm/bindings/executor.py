"""TEST DOUBLE of tensorrt_llm.bindings.executor (0.12's pybind module; TensorRT cannot exist in CI): the Executor
with in-flight batching over the engine the trtllm-build double wrote, computed by the pipeline's independent
reader (the same checkpoint-to-numerics path as the ModelRunnerCpp double).

Interface as 0.12 publishes it (cpp/tensorrt_llm/pybind/executor/bindings.cpp, docs/source/executor.md;
ExecutorConfig.logits_post_processor_map's callbacks called with (request id, logits, beam tokens, stream, client id)
before each token is chosen, as examples/bindings/executor/example_logits_processor.py uses them):
Executor(model_path, ModelType, ExecutorConfig); enqueue_request(Request) -> id; await_responses(timeout=) ->
[Response] of any request; Response.request_id / has_error() / error_msg / result.output_token_ids[beam] (streaming:
the new tokens only) / result.is_final; cancel_request(id); get_latest_iteration_stats(); shutdown(). A request
longer than the engine's max_input_len, or past its max_seq_len, is an error response, as the C++ runtime answers.

Its paged KV cache is sized as 0.12's runtime sizes it: max_tokens rounded up to whole blocks of the engine's
tokens_per_block, else free_gpu_memory_fraction (default 0.9) of the free memory (the fake board's MemAvailable:
FAKE_BOARD_ROOT); it reports the allocation at INFO as the KV cache manager does ("[MemUsageChange] Allocated X GiB
for max tokens in paged KV cache (N)."), and in its KvCacheStats.

EXECUTOR_DOUBLE_FAIL_AFTER=N: the executor itself fails (await_responses raises) after N iterations.
EXECUTOR_DOUBLE_FAIL_LOAD=1: the engine cannot be loaded (as a plan TensorRT cannot deserialize on this board).
TRTLLM_RUNTIME_DOUBLE_WRONG_AT=N: a miscompiled engine (the N-th generated token of every request is off by one).
RUNTIME_DOUBLE_TAKES_BYTES / RUNTIME_DOUBLE_HOLD_S: what loading takes from the fake board, and for how long
("loaded": until shutdown).
"""
import datetime
import os
import re
import threading
from pathlib import Path

import torch

from tensorrt_llm._engine import load_engine_model
from tensorrt_llm.logger import logger

DEFAULT_FREE_FRACTION = 0.9     # 0.12, without a cap


def _free_memory() -> int:
    board = os.environ.get("FAKE_BOARD_ROOT")
    text = (Path(board) / "proc" / "meminfo").read_text() if board else ""
    m = re.search(r"^MemAvailable:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) * 1024 if m else 6 * 2**30


class ModelType:
    DECODER_ONLY = "DECODER_ONLY"


class KvCacheConfig:
    def __init__(self, enable_block_reuse=False, max_tokens=None, max_attention_window=None, sink_token_length=None,
                 free_gpu_memory_fraction=None, host_cache_size=None, onboard_blocks=True):
        self.max_tokens, self.free_gpu_memory_fraction = max_tokens, free_gpu_memory_fraction


class ExecutorConfig:
    def __init__(self, max_beam_width=1, scheduler_config=None, kv_cache_config=None, enable_chunked_context=False,
                 normalize_log_probs=True, iter_stats_max_iterations=1000, request_stats_max_iterations=0,
                 batching_type=None, parallel_config=None, peft_cache_config=None, logits_post_processor_map=None,
                 decoding_config=None, gpu_weights_percent=1.0):
        assert max_beam_width == 1
        self.kv_cache_config = kv_cache_config or KvCacheConfig()
        self.logits_post_processor_map = logits_post_processor_map or {}


class SamplingConfig:
    def __init__(self, beam_width=1, top_k=None, top_p=None, top_p_min=None, top_p_reset_ids=None, top_p_decay=None,
                 random_seed=None, temperature=None, min_length=None, beam_search_diversity_rate=None,
                 repetition_penalty=None, presence_penalty=None, frequency_penalty=None, length_penalty=None,
                 early_stopping=None, no_repeat_ngram_size=None):
        assert beam_width == 1
        self.top_k, self.top_p, self.random_seed, self.temperature = top_k, top_p, random_seed, temperature
        self.repetition_penalty, self.presence_penalty = repetition_penalty, presence_penalty
        self.frequency_penalty = frequency_penalty


class OutputConfig:
    def __init__(self, return_log_probs=False, return_context_logits=False, return_generation_logits=False,
                 exclude_input_from_output=False, return_encoder_output=False):
        self.return_log_probs = return_log_probs


class Request:
    def __init__(self, input_token_ids, max_new_tokens, streaming=False, sampling_config=None, output_config=None,
                 end_id=None, pad_id=None, bad_words=None, stop_words=None, embedding_bias=None,
                 external_draft_tokens_config=None, prompt_tuning_config=None, lora_config=None,
                 logits_post_processor_name=None, encoder_input_token_ids=None):
        self.input_token_ids, self.max_new_tokens, self.streaming = list(input_token_ids), max_new_tokens, streaming
        self.sampling_config = sampling_config or SamplingConfig()
        self.output_config = output_config or OutputConfig()
        self.end_id, self.stop_words = end_id, [list(w) for w in stop_words or []]
        self.logits_post_processor_name = logits_post_processor_name


class Result:
    def __init__(self, tokens, final, log_probs=None):
        self.output_token_ids, self.is_final, self.log_probs = [tokens], final, [log_probs or []]


class Response:
    def __init__(self, request_id, result=None, error=None):
        self.request_id, self.result, self.error_msg = request_id, result, error

    def has_error(self):
        return self.error_msg is not None


class KvCacheStats:
    def __init__(self, max_num_blocks, used_num_blocks, tokens_per_block):
        self.max_num_blocks, self.used_num_blocks = max_num_blocks, used_num_blocks
        self.free_num_blocks, self.tokens_per_block = max_num_blocks - used_num_blocks, tokens_per_block


class IterationStats:
    def __init__(self, kv):
        self.kv_cache_stats = kv


class Executor:
    def __init__(self, model_path, model_type, executor_config):
        from stall import stall_if_asked
        stall_if_asked("runtime")
        if os.environ.get("EXECUTOR_DOUBLE_FAIL_LOAD"):
            raise RuntimeError("[TensorRT-LLM][ERROR] Assertion failed: Failed to deserialize cuda engine "
                               f"({Path(model_path) / 'rank0.engine'})")
        self.model, self.build = load_engine_model(model_path)
        cfg = self.model.cfg
        self.vocab = cfg["vocab_size"]
        self.per_block = self.build.get("tokens_per_block", 64)
        kv = executor_config.kv_cache_config
        self._post = executor_config.logits_post_processor_map
        kv_bytes = 1 if (cfg.get("quantization") or {}).get("kv_cache_quant_algo") else 2
        per_token = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * \
            (cfg["hidden_size"] // cfg["num_attention_heads"]) * kv_bytes
        if kv.max_tokens:
            self.blocks = -(-kv.max_tokens // self.per_block)
        else:
            fraction = kv.free_gpu_memory_fraction or DEFAULT_FREE_FRACTION
            self.blocks = int(fraction * _free_memory() // (per_token * self.per_block))
        if logger.info_enabled:
            print(f"[TensorRT-LLM][INFO] Number of blocks in KV cache primary pool: {self.blocks}", flush=True)
            print(f"[TensorRT-LLM][INFO] Number of tokens per block: {self.per_block}.", flush=True)
            print(f"[TensorRT-LLM][INFO] [MemUsageChange] Allocated "
                  f"{self.blocks * self.per_block * per_token / 2**30:.2f} GiB for max tokens in paged KV cache "
                  f"({self.blocks * self.per_block}).", flush=True)
        board, hold = os.environ.get("FAKE_BOARD_ROOT"), int(os.environ.get("RUNTIME_DOUBLE_TAKES_BYTES", "0"))
        self._release = None
        if board and hold:          # the engine, KV cache and activations loaded: the board shows it
            from fakeboard import held, taking
            if os.environ.get("RUNTIME_DOUBLE_HOLD_S") == "loaded":     # until shutdown, as a served model holds it
                self._release = held(Path(board), hold)
            else:
                with taking(Path(board), hold, float(os.environ.get("RUNTIME_DOUBLE_HOLD_S", "0.8"))):
                    pass
        self._wrong_at = int(os.environ.get("TRTLLM_RUNTIME_DOUBLE_WRONG_AT", "-1"))
        self._lock = threading.Condition()
        self._active, self._out, self._next = {}, [], 0
        self._iterations, self._fail_after = 0, int(os.environ.get("EXECUTOR_DOUBLE_FAIL_AFTER", "-1"))
        self._stop = False
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def enqueue_request(self, request):
        with self._lock:
            self._next += 1
            rid = self._next
            n = len(request.input_token_ids)
            if n > self.build["max_input_len"] or n + request.max_new_tokens > self.build["max_seq_len"]:
                self._out.append(Response(rid, error=f"[TensorRT-LLM][ERROR] Assertion failed: input length {n} "
                                                     "exceeds the engine's limits"))
            else:
                seed = request.sampling_config.random_seed
                gen = torch.Generator().manual_seed(seed if seed is not None else 0)
                self._active[rid] = {"req": request, "ids": list(request.input_token_ids), "made": 0, "gen": gen,
                                     "log_probs": [], "rid": rid}
            self._lock.notify_all()
            return rid

    def cancel_request(self, rid):
        with self._lock:
            self._active.pop(rid, None)

    def await_responses(self, id=None, timeout=None):
        if 0 <= self._fail_after <= self._iterations:
            raise RuntimeError("[TensorRT-LLM][ERROR] CUDA runtime error: an illegal memory access was encountered")
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else None
        with self._lock:
            if not self._out:
                self._lock.wait(seconds)
            out, self._out = self._out, []
            return out

    def get_latest_iteration_stats(self):
        with self._lock:
            used = sum(-(-len(a["ids"]) // self.per_block) for a in self._active.values())
        return [IterationStats(KvCacheStats(self.blocks, used, self.per_block))]

    def shutdown(self):
        self._stop = True
        with self._lock:
            self._lock.notify_all()
        self._thread.join(timeout=5)
        if self._release:
            self._release()

    def _loop(self):
        while not self._stop:
            with self._lock:
                while not self._active and not self._stop:
                    self._lock.wait(0.1)
                batch = list(self._active.items())
            for rid, a in batch:        # one iteration: every request in flight advances one token
                token = self._next_token(a)
                with self._lock:
                    if rid not in self._active:
                        continue
                    a["ids"].append(token)
                    a["made"] += 1
                    req = a["req"]
                    stop = token == req.end_id or [token] in req.stop_words
                    final = stop or a["made"] >= req.max_new_tokens
                    if final:
                        del self._active[rid]
                    self._out.append(Response(rid, Result([token], final, list(a["log_probs"]))))
                    self._lock.notify_all()
            self._iterations += 1

    def _next_token(self, a):
        logits = self.model.logits(torch.tensor(a["ids"]))[-1, :self.vocab].float()
        s = a["req"].sampling_config
        seen = torch.tensor(sorted(set(a["ids"])))      # its penalties: over the whole sequence, prompt included
        if s.repetition_penalty:
            logits[seen] = torch.where(logits[seen] > 0, logits[seen] / s.repetition_penalty,
                                       logits[seen] * s.repetition_penalty)
        if s.presence_penalty or s.frequency_penalty:
            counts = torch.bincount(torch.tensor(a["ids"]), minlength=self.vocab)[:self.vocab].float()
            logits = logits - (s.frequency_penalty or 0) * counts - (s.presence_penalty or 0) * (counts > 0).float()
        name = a["req"].logits_post_processor_name
        if name is not None:        # as the executor calls it: request id, the step's logits, the beam's tokens, stream
            if name not in self._post:
                raise RuntimeError(f"[TensorRT-LLM][ERROR] no logits post-processor named {name}")
            view = logits.view(1, 1, -1)        # [beam, step, vocab], modified in place
            self._post[name](a["rid"], view, [list(a["ids"])], 0, None)
        if s.top_k == 1 or not s.temperature:
            token = int(logits.argmax())
            token = (token + 1) % self.vocab if a["made"] == self._wrong_at else token
        else:
            probs = torch.softmax(logits / s.temperature, -1)
            token = int(torch.multinomial(probs, 1, generator=a["gen"]))
        if a["req"].output_config.return_log_probs:     # cumulative, per beam, as the executor's Result holds them
            a["log_probs"].append(float(torch.log_softmax(logits, -1)[token]))
        return token
