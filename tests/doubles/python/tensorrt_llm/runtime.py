"""TEST DOUBLE of tensorrt_llm.runtime.ModelRunnerCpp: "runs" the engine written by the trtllm-build double
(its rank0.engine holds the checkpoint's weights) with the pipeline's independent reader, greedily."""
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from pipeline.workstation.reader import CheckpointModel


class ModelRunnerCpp:
    def __init__(self, model, build):
        self.model, self.build = model, build

    @classmethod
    def from_dir(cls, engine_dir, rank=0, max_batch_size=1, max_input_len=None, max_output_len=None,
                 use_mmap=False, max_tokens_in_paged_kv_cache=None, kv_cache_free_gpu_memory_fraction=None):
        engine = json.loads((Path(engine_dir) / "config.json").read_text())
        assert max_input_len <= engine["build_config"]["max_input_len"], "input longer than the engine allows"
        # the real 0.12 reserves 90% of free memory without one of these (a Jetson's whole RAM): the double insists
        assert max_tokens_in_paged_kv_cache or kv_cache_free_gpu_memory_fraction, "KV cache left uncapped"
        tmp = Path(tempfile.mkdtemp(prefix="engine-view-"))
        try:
            (tmp / "config.json").write_text(json.dumps(engine["pretrained_config"]))
            os.symlink(Path(engine_dir).absolute() / "rank0.engine", tmp / "rank0.safetensors")
            model = CheckpointModel(tmp)     # reads the config and maps the weights: the view is not needed after
        finally:
            shutil.rmtree(tmp)
        return cls(model, engine["build_config"])

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
