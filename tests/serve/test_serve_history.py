"""Fitting a long chat into max_input_len (serve/history.py): system messages kept, the oldest whole turns dropped,
the newest always kept, at the exact edge of the limit."""

from __future__ import annotations

from pipeline.serve.history import fit, turns


def render(messages):
    """One id per character of each message, plus 2 per message for its framing (as a chat template adds)."""
    ids = [ord(c) for m in messages for c in "<>" + m["content"]]
    return "".join(m["content"] for m in messages), ids


def chat(*contents: str, system: str | None = "sys"):
    out = [{"role": "system", "content": system}] if system else []
    for i, c in enumerate(contents):
        out.append({"role": "user" if i % 2 == 0 else "assistant", "content": c})
    return out


def test_a_chat_that_fits_is_untouched():
    messages = chat("a" * 10, "b" * 10, "c" * 10)
    text, ids, dropped = fit(messages, render, len(render(messages)[1]))
    assert dropped == 0 and len(ids) == 5 + 3 * 12


def test_the_oldest_whole_turns_go_first_and_the_system_message_stays():
    messages = chat("u1" * 10, "a1" * 10, "u2" * 10, "a2" * 10, "u3")
    full = len(render(messages)[1])
    # one token less than the whole chat: the first turn (u1 + a1) goes, whole
    text, ids, dropped = fit(messages, render, full - 1)
    assert dropped == 2 and text == "sys" + "u2" * 10 + "a2" * 10 + "u3"
    # exactly what the last two turns take: they stay; one less: only the newest turn stays
    edge = len(render(chat("u2" * 10, "a2" * 10, "u3"))[1])
    assert fit(messages, render, edge)[2] == 2
    assert fit(messages, render, edge - 1)[2] == 4 and fit(messages, render, edge - 1)[0] == "sysu3"


def test_tool_results_travel_with_their_turn_and_a_newest_turn_too_long_is_returned_for_refusal():
    messages = chat("q1", system=None) + [{"role": "assistant", "content": ""}, {"role": "tool", "content": "r" * 50},
                                          {"role": "user", "content": "q2"}]
    system, parts = turns(messages)
    assert system == [] and [len(t) for t in parts] == [3, 1]
    text, ids, dropped = fit(messages, render, 10)
    assert dropped == 3 and text == "q2"
    text, ids, dropped = fit(chat("x" * 100), render, 10)
    assert len(ids) > 10 and dropped == 0       # nothing to drop: the caller refuses it


def test_sampling_defaults_come_from_generation_config_where_valid(tmp_path):
    import json

    from pipeline.serve.protocol import OPENAI_DEFAULTS, parse_completion
    from pipeline.serve.text import sampling_defaults
    assert sampling_defaults(tmp_path) is OPENAI_DEFAULTS                          # no file
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 2, "do_sample": True}))
    assert sampling_defaults(tmp_path) is OPENAI_DEFAULTS                          # nothing about sampling
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_p": 0.95, "top_k": 20}))
    d = sampling_defaults(tmp_path)
    assert (d.temperature, d.top_p, d.top_k) == (0.6, 0.95, 20) and "temperature, top_k, top_p" in d.source
    omitted = parse_completion({"prompt": "x"}, d).sampling
    assert (omitted.temperature, omitted.top_p, omitted.top_k) == (0.6, 0.95, 20)
    given = parse_completion({"prompt": "x", "temperature": 0, "top_p": 0.5, "top_k": 0}, d).sampling
    assert (given.temperature, given.top_p, given.top_k) == (0.0, 0.5, 0)
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 9, "top_p": 0, "top_k": -1}))
    d = sampling_defaults(tmp_path)         # out of range: OpenAI's value for each
    assert (d.temperature, d.top_p, d.top_k) == (1.0, 1.0, 0)
    (tmp_path / "generation_config.json").write_bytes(b"\xff{")
    assert sampling_defaults(tmp_path) is OPENAI_DEFAULTS
