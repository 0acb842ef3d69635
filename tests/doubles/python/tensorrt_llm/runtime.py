"""TEST DOUBLE of tensorrt_llm.runtime.ModelRunnerCpp (0.12): "runs" the engine written by the trtllm-build double
(its rank0.engine holds the checkpoint's weights) with the pipeline's independent reader, greedily.

Its paged KV cache is sized as 0.12's runtime sizes it: max_tokens_in_paged_kv_cache rounded up to whole blocks of the
engine's tokens_per_block, else kv_cache_free_gpu_memory_fraction (default 0.9) of the free memory (the fake board's
MemAvailable: FAKE_BOARD_ROOT); and it reports the allocation at INFO as the KV cache manager does
("[MemUsageChange] Allocated X GiB for max tokens in paged KV cache (N)."), with the executor's KvCacheStats.
"""
import json
import math
import os
import re
import shutil
import tempfile
from pathlib import Path

import torch

from pipeline.workstation.reader import CheckpointModel
from tensorrt_llm.logger import logger

DEFAULT_FREE_FRACTION = 0.9     # 0.12 runtime/model_runner_cpp.py, without a cap


def _free_memory() -> int:
    board = os.environ.get("FAKE_BOARD_ROOT")
    text = (Path(board) / "proc" / "meminfo").read_text() if board else ""
    m = re.search(r"^MemAvailable:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) * 1024 if m else 6 * 2**30


class KvCacheStats:
    def __init__(self, max_num_blocks, tokens_per_block):
        self.max_num_blocks, self.tokens_per_block = max_num_blocks, tokens_per_block
        self.free_num_blocks, self.used_num_blocks = max_num_blocks, 0


class IterationStats:
    def __init__(self, kv):
        self.kv_cache_stats = kv


class Executor:
    def __init__(self, kv):
        self._kv = kv

    def get_latest_iteration_stats(self):
        return [IterationStats(self._kv)]


class ModelRunnerCpp:
    def __init__(self, model, build, session):
        self.model, self.build, self.session = model, build, session

    @classmethod
    def from_dir(cls, engine_dir, rank=0, max_batch_size=1, max_input_len=None, max_output_len=None,
                 use_mmap=False, max_tokens_in_paged_kv_cache=None, kv_cache_free_gpu_memory_fraction=None):
        from stall import stall_if_asked
        stall_if_asked("runtime")
        engine = json.loads((Path(engine_dir) / "config.json").read_text())
        assert max_input_len <= engine["build_config"]["max_input_len"], "input longer than the engine allows"
        cfg, build = engine["pretrained_config"], engine["build_config"]
        per_block = build.get("tokens_per_block", 64)
        kv_bytes = 1 if (cfg.get("quantization") or {}).get("kv_cache_quant_algo") else 2
        per_token = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * \
            (cfg["hidden_size"] // cfg["num_attention_heads"]) * kv_bytes
        if max_tokens_in_paged_kv_cache:
            blocks = math.ceil(max_tokens_in_paged_kv_cache / per_block)
        else:
            fraction = kv_cache_free_gpu_memory_fraction or DEFAULT_FREE_FRACTION
            blocks = int(fraction * _free_memory() // (per_token * per_block))
        if logger.info_enabled:
            print(f"[TensorRT-LLM][INFO] Number of blocks in KV cache primary pool: {blocks}", flush=True)
            print(f"[TensorRT-LLM][INFO] Number of tokens per block: {per_block}.", flush=True)
            print(f"[TensorRT-LLM][INFO] [MemUsageChange] Allocated {blocks * per_block * per_token / 2**30:.2f} GiB "
                  f"for max tokens in paged KV cache ({blocks * per_block}).", flush=True)
        board, hold = os.environ.get("FAKE_BOARD_ROOT"), int(os.environ.get("RUNTIME_DOUBLE_TAKES_BYTES", "0"))
        if board and hold:          # the engine, KV cache and activations loaded: the board shows it
            from fakeboard import taking
            with taking(Path(board), hold, float(os.environ.get("RUNTIME_DOUBLE_HOLD_S", "0.8"))):
                pass
        tmp = Path(tempfile.mkdtemp(prefix="engine-view-"))
        try:
            (tmp / "config.json").write_text(json.dumps(cfg))
            os.symlink(Path(engine_dir).absolute() / "rank0.engine", tmp / "rank0.safetensors")
            model = CheckpointModel(tmp)     # reads the config and maps the weights: the view is not needed after
        finally:
            shutil.rmtree(tmp)
        return cls(model, build, Executor(KvCacheStats(blocks, per_block)))

    def generate(self, batch_input_ids, max_new_tokens, end_id, pad_id, top_k=1, temperature=1.0,
                 output_sequence_lengths=True, return_dict=True):
        ids = batch_input_ids[0].tolist()
        vocab = self.model.cfg["vocab_size"]
        wrong_at = int(os.environ.get("TRTLLM_RUNTIME_DOUBLE_WRONG_AT", "-1"))   # a miscompiled engine
        for step in range(max_new_tokens):
            nxt = int(self.model.logits(torch.tensor(ids))[-1, :vocab].argmax())
            if step == wrong_at:
                nxt = (nxt + 1) % vocab
            ids.append(nxt)
            if nxt == end_id:
                break
        return {"output_ids": torch.tensor([[ids]]), "sequence_lengths": torch.tensor([[len(ids)]])}
