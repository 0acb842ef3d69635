"""Word and character error rates (pipeline/transcripts.py): exact edit counts, the corpus rate, the bootstrap
interval, the metric each language is scored by."""

import pytest

from pipeline.errors import PipelineError
from pipeline.transcripts import MAX_UNITS, edits, error_rate, metric_for, normalize, units


def test_normalization_folds_case_width_and_punctuation_but_keeps_numbers():
    assert normalize("  Hello, WORLD!  It's 10 o'clock… ") == "hello world it s 10 o clock"
    assert normalize("ＡＢＣ１２３") == "abc123"             # full-width forms (NFKC)
    assert normalize("请关闭卧室的空调。") == "请关闭卧室的空调"


def test_edit_distance_counts_substitutions_deletions_and_insertions():
    assert edits(list("kitten"), list("sitting")) == 3
    assert edits([], list("abc")) == 3 and edits(list("abc"), []) == 3
    assert edits(["the", "cat", "sat"], ["the", "cat", "sat"]) == 0
    assert edits(["a", "b", "c", "d"], ["a", "x", "c"]) == 2


def test_wer_is_the_corpus_rate_and_the_interval_brackets_it():
    pairs = [("turn on the kitchen light", "turn on the kitchen light"),
             ("set a timer for ten minutes", "set the timer for ten minutes"),   # 1 substitution of 6
             ("what is the weather", "what is weather"),                        # 1 deletion of 4
             ("play some music", "play some music please")]                     # 1 insertion of 3
    r = error_rate(pairs, "en")
    assert (r.metric, r.edits, r.units, r.utterances) == ("wer", 3, 18, 4)
    assert r.rate == pytest.approx(3 / 18)
    low, high = r.interval
    # a resample of four copies of the perfect utterance (rate 0) or of the inserting one (1/3) is rarer than 2.5%
    assert 0.0 < low < r.rate < high < 1 / 3
    assert error_rate(pairs, "en").interval == r.interval       # seeded


def test_cer_for_languages_written_without_spaces():
    assert metric_for("zh") == metric_for("zh-CN") == metric_for("ja") == "cer"
    assert metric_for("en") == metric_for("de") == "wer"
    r = error_rate([("请关闭卧室的空调。", "请关闭卧式的空调")], "zh")
    assert (r.metric, r.edits, r.units) == ("cer", 1, 8)
    assert r.rate == pytest.approx(1 / 8) and r.interval == (1 / 8, 1 / 8)   # one utterance: no spread
    assert units("a b", "cer") == ["a", "b"]


def test_a_perfect_set_scores_zero_and_an_empty_reference_set_is_refused():
    r = error_rate([("hello there", "Hello, there!")], "en")
    assert r.rate == 0.0 and r.interval == (0.0, 0.0)
    with pytest.raises(PipelineError, match="no reference words to score in 'en'"):
        error_rate([("...", "anything")], "en")
    with pytest.raises(PipelineError, match="no reference characters"):
        error_rate([], "zh")


def test_an_utterance_past_the_unit_limit_is_refused_not_computed():
    assert edits(["a"] * MAX_UNITS, ["a"]) == MAX_UNITS - 1
    with pytest.raises(PipelineError, match=f"{MAX_UNITS + 1} units"):
        edits(["a"] * (MAX_UNITS + 1), ["a"])
