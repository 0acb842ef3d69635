"""Where generation stops: generation_config.json's eos ids (a list for Llama-3 Instruct), else the tokenizer's; the
0.12 runner cuts its output at the first of them, as transformers' generate does for the goldens."""

import json
from types import SimpleNamespace

from pipeline.device.trtllm_runner import _cut_at_stop
from pipeline.workstation.evaluate import stop_ids


class Tok(SimpleNamespace):
    def __len__(self):
        return 128256


def test_generation_config_eos_list_wins_over_the_tokenizer(tmp_path):
    tok = Tok(eos_token_id=128001)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [128001, 128008, 128009]}))
    assert stop_ids(tmp_path, tok) == [128001, 128008, 128009]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    assert stop_ids(tmp_path, tok) == [2]
    (tmp_path / "generation_config.json").unlink()
    assert stop_ids(tmp_path, tok) == [128001]
    assert stop_ids(tmp_path, Tok(eos_token_id=None)) == []


def test_runner_output_ends_at_the_first_stop_id():
    assert _cut_at_stop([5, 6, 128009, 7, 8], [128001, 128009]) == [5, 6, 128009]
    assert _cut_at_stop([5, 6, 7], [128001]) == [5, 6, 7]
