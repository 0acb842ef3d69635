"""The server's text layer and service unit, in process: detokenizing with stops, the systemd unit."""

from __future__ import annotations

import pytest

from pipeline.serve.command import unit_file
from pipeline.serve.text import TextCodec, TextStream


@pytest.fixture(scope="module")
def codec(tmp_path_factory) -> TextCodec:
    """A byte-level BPE tokenizer.json (what every current model ships), written here."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<eos>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the bread is baked. stop here. héllo wörld"] * 20, trainer=trainer)
    d = tmp_path_factory.mktemp("tok")
    tok.save(str(d / "tokenizer.json"))
    return TextCodec.load(d)


def _stream(codec, text, stop=(), stop_ids=()):
    ids = codec.encode(text, add_special_tokens=False)
    s = TextStream(codec, stop_ids, stop)
    deltas = [s.feed([t]) for t in ids]
    if not s.finish_reason:
        deltas.append(s.finish("length"))
    return deltas, s


def test_deltas_concatenate_to_the_text_and_never_split_a_character(codec):
    deltas, s = _stream(codec, "héllo wörld, the bread")
    assert "".join(deltas) == "héllo wörld, the bread" and s.finish_reason == "length"
    assert all("\ufffd" not in d for d in deltas)       # a UTF-8 sequence split over tokens is held back whole


def test_a_stop_string_ends_the_text_before_it_and_its_prefix_is_held_back(codec):
    deltas, s = _stream(codec, "the bread is baked. stop here. more", stop=["stop here"])
    assert "".join(deltas) == "the bread is baked. " and s.finish_reason == "stop"
    # nothing of "stop here" was ever given out, even while it was only a possible prefix
    assert not any("st" in d for d in deltas[-3:])


def test_a_stop_id_ends_the_answer_and_is_not_text(codec):
    eos = codec.tokenizer.token_to_id("<eos>")
    s = TextStream(codec, [eos], ())
    out = s.feed(codec.encode("the bread", add_special_tokens=False) + [eos] + codec.encode(" more"))
    assert out == "the bread" and s.finish_reason == "stop" and s.ids[-1] == eos


def test_the_systemd_unit_runs_the_same_command_without_the_key(tmp_path):
    from pipeline.cli import build_parser
    args = build_parser().parse_args(["serve", "/opt/engines/b", "--host", "0.0.0.0", "--api-key", "sekrit",
                                      "--max-connections", "300", "--systemd", "x.service"])
    unit = unit_file(args)
    assert "sekrit" not in unit and "--systemd" not in unit and "Restart=on-failure" in unit
    assert "-m pipeline serve /opt/engines/b --host 0.0.0.0 --port 8000" in unit and "EnvironmentFile=" in unit
    assert "--max-connections 300" in unit and "--header-timeout 10.0" in unit
    assert "LimitNOFILE=65536" in unit and "PrivateTmp=yes" in unit and "NoNewPrivileges=yes" in unit
    assert "jetson_clocks" in unit and "WantedBy=multi-user.target" in unit
    # systemd has no comments after a value: every comment is a line of its own
    assert all(not (ln.split("=", 1)[0].isalpha() and "#" in ln) for ln in unit.splitlines() if "=" in ln)


@pytest.mark.parametrize("argv", [["--api", "sekrit"], ["--api-k", "sekrit"], ["--api-key=sekrit", "--pub"]])
def test_no_option_is_taken_by_a_prefix_so_an_abbreviated_key_never_reaches_the_unit(argv, capsys):
    from pipeline.cli import build_parser
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["serve", "/opt/engines/b", *argv, "--systemd", "x.service"])
    assert exc.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err
    with pytest.raises(SystemExit):         # the top-level parser and every other command too
        build_parser().parse_args(["pull", "oci://h/r:t", "d", "--plain"])


def _goldens(prompt: str, input_ids: list[int], output_ids: list[int], text: str):
    from pipeline import contract
    return contract.Goldens(max_new_tokens=4, min_token_agreement=1.0, top_k=1, eos_token_id=None,
                            prompts=[contract.GoldenPrompt(prompt=prompt, input_ids=input_ids, output_ids=output_ids,
                                                           top_logprobs=[], text=text)])


def test_a_tokenizer_that_reads_the_goldens_otherwise_is_refused_at_start(codec):
    """What `serve` checks before serving: each golden prompt encodes to the goldens' ids and each golden answer
    decodes to their text; else it would ask the engine something validation did not check."""
    from pipeline.errors import PipelineError
    from pipeline.serve.text import check_against_goldens
    ids = codec.encode("the bread")
    answer = codec.encode(" is baked", add_special_tokens=False)
    check_against_goldens(codec, _goldens("the bread", ids, answer, " is baked"), "kit")        # as computed: taken
    with pytest.raises(PipelineError, match=rf"kit: prompt 0 \('the bread'\) encodes to {len(ids)} ids here, "
                                            rf"{len(ids) + 1} in the goldens, first different at {len(ids) - 1}"):
        check_against_goldens(codec, _goldens("the bread", ids[:-1] + [ids[-1] + 1, 7], answer, " is baked"), "kit")
    with pytest.raises(PipelineError, match=r"the golden answer to prompt 0 decodes to ' is baked' here, ' is "
                                            r"fried' in the goldens"):
        check_against_goldens(codec, _goldens("the bread", ids, answer, " is fried"), "kit")


def test_goldens_asked_with_an_image_are_refused_by_a_server_of_a_text_model(codec):
    from pipeline import contract
    from pipeline.errors import PipelineError
    from pipeline.serve.text import check_against_goldens
    g = _goldens("What is it?", codec.encode("What is it?"), [], "")
    imaged = contract.Goldens(max_new_tokens=4, min_token_agreement=1.0, top_k=1, eos_token_id=None, prompts=[
        contract.GoldenPrompt(prompt="What is it?", input_ids=g.prompts[0].input_ids, output_ids=[], top_logprobs=[],
                              text="", image="images/a.png", image_sha256="0" * 64, image_tokens=4)])
    with pytest.raises(PipelineError, match=r"kit: golden prompt 0 is asked with an image, and this model serves no "
                                            r"images"):
        check_against_goldens(codec, imaged, "kit")
