
import pytest

from pipeline.backends import token_agreement
from pipeline.errors import PipelineError
from pipeline.workstation.calibration import load_texts, token_windows
from pipeline.workstation.evaluate import advice


class ByteTok:
    eos_token_id = 0

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": list(text.encode())}


def test_sources(tmp_path):
    assert any("bake bread" in t for t in load_texts("builtin:calib-en"))
    (tmp_path / "c.txt").write_text("first passage\n\nsecond passage\n")
    assert load_texts("file:c.txt", str(tmp_path / "recipe.toml")) == ["first passage", "second passage"]
    (tmp_path / "c.jsonl").write_text('{"text": "a"}\n\n{"text": "b"}\n')
    assert load_texts(f"file:{tmp_path / 'c.jsonl'}") == ["a", "b"]
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\n{"body": "b"}\n')
    with pytest.raises(PipelineError, match=r"bad.jsonl:2: not a JSON object with a \"text\" string"):
        load_texts(f"file:{tmp_path / 'bad.jsonl'}")
    with pytest.raises(PipelineError, match=r"quantization.calibration.source = 'file:nope.txt': no file"):
        load_texts("file:nope.txt", str(tmp_path / "recipe.toml"))
    with pytest.raises(PipelineError, match="no builtin corpus 'nope'"):
        load_texts("builtin:nope")


def test_windows_are_seeded_and_sized():
    texts = ["abcdefghij" * 20]
    a = token_windows(ByteTok(), texts, samples=5, seq_len=16, seed=3)
    assert a == token_windows(ByteTok(), texts, samples=5, seq_len=16, seed=3)
    assert a != token_windows(ByteTok(), texts, samples=5, seq_len=16, seed=4)
    assert len(a) == 5 and all(len(w) == 16 for w in a)
    assert token_windows(ByteTok(), ["short"], samples=5, seq_len=16, seed=0) == [list(b"short") + [0]]


def test_token_agreement_counts_up_to_first_divergence():
    assert token_agreement([1, 2, 3, 4], [1, 2, 3, 4]) == 1.0
    assert token_agreement([1, 2, 3, 4], [1, 2, 9, 4]) == 0.5
    assert token_agreement([1, 2, 3, 4], [1, 2]) == 0.5


def test_advice_turns_numbers_into_a_recommendation():
    import dataclasses

    from pipeline import contract

    def figures(change: float, top1: float, interval: list[float]) -> contract.AccuracyFigures:
        return contract.AccuracyFigures("h", 100, 1, 10.0, 10.0 * (1 + change), change, interval, 0.99, top1)
    good = figures(0.01, 0.97, [0.005, 0.02])
    assert advice(good, "int4_awq").startswith("int4_awq keeps the model's behaviour: perplexity +1.0%")
    bad = figures(0.12, 0.8, [0.1, 0.14])
    text = advice(bad, "int4_awq")
    assert "perplexity +12.0%, top-1 agreement 80.0%" in text and "other quantization.weights" in text
    assert "int8_sq" not in text          # the advice names no fixed formats: the quality gate names measured ones
    assert "within noise" not in text
    noisy = advice(dataclasses.replace(bad, perplexity_change_interval=[-0.01, 0.25]), "int4_awq")
    assert "perplexity +12.0% (within noise: the interval holds 0)" in noisy
