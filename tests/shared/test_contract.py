"""The workstation <-> device contract: every record round-trips, and a bad file is one line naming the file, the
field and what was expected, never a traceback or a hang."""

import json
import os
import threading

import pytest

from pipeline import contract
from pipeline.errors import PipelineError


def plan_dict() -> dict:
    from pipeline.contract import BuildLimits
    from pipeline.plan.perf import known_shape
    from pipeline.plan.planner import PlanRequest, make_plan
    from pipeline.plan.targets import get_target

    shape = known_shape("meta-llama/Llama-3.2-3B-Instruct")
    plan = make_plan(PlanRequest(shape, "llama", "int4_awq", "fp16", get_target("agx-orin-64gb"),
                                 BuildLimits.of(1, 512, 1024)))
    return plan.to_dict()


def test_plan_round_trips_through_its_record(tmp_path):
    d = plan_dict()
    assert d["format"] == "jetson-plan/2" and "device_build_command" not in d
    record = contract.Plan.from_dict(d, "plan.json")
    assert record.limits.max_seq_len == 1024 and record.stack.tensorrt == "10.3"
    assert record.memory is not None and record.memory.build_peak == d["memory"]["build_peak"] > 0
    assert record.prediction.by_power_mode == d["prediction"]["by_power_mode"] and record.build_on_board.how
    record.dump(tmp_path / "plan.json")
    assert contract.Plan.load(tmp_path / "plan.json") == record
    assert json.loads((tmp_path / "plan.json").read_text()) == json.loads(json.dumps(d))


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.pop("limits"), "plan.json: limits: missing (expected an object (BuildLimits))"),
    (lambda d: d["limits"].update(max_seq_len="1024"), 'plan.json: limits.max_seq_len = "1024": expected an integer'),
    (lambda d: d["limits"].update(max_seq_len=True), "plan.json: limits.max_seq_len = true: expected an integer"),
    (lambda d: d.update(surprise=1), "plan.json: surprise: unknown field"),
    (lambda d: d.update(format="jetson-plan/3"), "plan.json: format = 'jetson-plan/3': made by a newer pipeline; this "
                                                 "one reads 'jetson-plan/2' and jetson-plan/1"),
    (lambda d: d.update(format="jetson-plan/0"), "an older version this pipeline no longer reads"),
    (lambda d: d["memory"].update(total="lots"), 'plan.json: memory.total = "lots": expected an integer'),
    (lambda d: d["prediction"].pop("by_power_mode"), "plan.json: prediction.by_power_mode: missing"),
    (lambda d: d.update(format="jetson-kit-manifest/1"), "(another kind of file)"),
    (lambda d: d.update(device_build_commands=[["trtllm-build", 3]]),
     "plan.json: device_build_commands[0][1] = 3: expected a string"),
])
def test_a_bad_plan_is_one_line_naming_file_field_and_expectation(edit, message):
    d = plan_dict()
    edit(d)
    with pytest.raises(contract.ContractError) as err:
        contract.Plan.from_dict(d, "plan.json")
    assert message in str(err.value) and "\n" in str(err.value)   # the message, then its hint
    assert str(err.value).count("\n") == 1


def test_hostile_files_are_refused_without_hanging(tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    link = tmp_path / "zero.json"
    link.symlink_to("/dev/zero")
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (contract.MAX_RECORD_BYTES + 1))
    (tmp_path / "dir.json").mkdir()
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe{")
    (tmp_path / "deep.json").write_text("[" * 100_000)
    cases = {fifo: "not a regular file", link: "cannot be opened as a regular file",
             big: "more than the", tmp_path / "dir.json": "not a regular file",
             tmp_path / "bin.json": "not valid JSON", tmp_path / "deep.json": "not valid JSON",
             tmp_path / "missing.json": "no such file"}
    messages: dict = {}

    def load_all():
        for path in cases:
            try:
                contract.Goldens.load(path)
            except PipelineError as exc:
                messages[path] = str(exc)
    t = threading.Thread(target=load_all, daemon=True)
    t.start()
    t.join(20)
    assert not t.is_alive(), f"hung after {list(messages)}"
    for path, want in cases.items():
        assert messages[path].startswith(str(path)) and want in messages[path], (path, messages.get(path))


def test_goldens_and_board_records_round_trip(tmp_path):
    goldens = {"format": "jetson-goldens/1", "max_new_tokens": 4, "min_token_agreement": 0.9, "top_k": 2,
               "eos_token_id": None, "prompts": [{"prompt": "Hi", "input_ids": [1, 2], "output_ids": [3],
                                                  "top_logprobs": [[[3, -0.1], [4, -2.5]]], "text": "!"}]}
    g = contract.Goldens.from_dict(goldens, "goldens.json")
    assert g.prompts[0].top_logprobs[0][1] == [4.0, -2.5] and g.to_dict()["format"] == "jetson-goldens/4"
    # 1 (read and upgraded above) had near ties of the logits only: 2 says each one's cause
    tie = {"step": 0, "token_id": 4, "margin": 0.01, "text": "?"}
    old = contract.Goldens.from_dict({**goldens, "prompts": [{**goldens["prompts"][0], "near_ties": [tie]}]}, "g")
    assert (old.prompts[0].near_ties[0].cause, old.prompts[0].near_ties[0].layer) == ("logits", None)
    new = contract.Goldens.from_dict(g.to_dict(), "goldens.json")
    assert new == g
    # 2's spoken goldens had no near ties: read as none, every divergence counted (tie_margin 0)
    spoken = {"text": "Hi.", "speaker": "ryan", "language": "auto", "codes": [[1, 2]], "recording": "audio/tts-0.wav",
              "recording_sha256": "0" * 64, "rms": 0.25}
    two = contract.Goldens.from_dict({**goldens, "format": "jetson-goldens/2", "prompts": [], "synthesis": {
        "utterances": [spoken], "max_frames": 4, "sample_rate": 24000, "samples_per_frame": 1920}}, "g")
    assert two.synthesis is not None and two.synthesis.utterances[0].near_ties == [] and \
        (two.synthesis.tie_margin, two.synthesis.eos_code) == (0.0, None)
    # 3's synthesis checks carried no workstation round trip: read as none; 4's carries one, read back exactly
    three = contract.Goldens.from_dict({**goldens, "format": "jetson-goldens/3", "prompts": [], "synthesis": {
        "utterances": [spoken], "max_frames": 4, "sample_rate": 24000, "samples_per_frame": 1920}}, "g")
    assert three.synthesis is not None and three.synthesis.round_trip is None
    trip = {"transcriber": "asr", "model": "org/asr", "language": "en", "heard": ["hi"], "max_error_rate": 0.2,
            "rate": {"language": "en", "metric": "wer", "rate": 0.0, "low": 0.0, "high": 0.0, "utterances": 1}}
    four = contract.Goldens.from_dict({**three.to_dict(), "synthesis": {**three.to_dict()["synthesis"],
                                                                        "round_trip": trip}}, "g")
    assert four.synthesis is not None and four.synthesis.round_trip is not None and \
        four.synthesis.round_trip.rate.metric == "wer" and contract.Goldens.from_dict(four.to_dict(), "g") == four
    with pytest.raises(contract.ContractError, match="format = 'jetson-goldens/5': made by a newer pipeline"):
        contract.Goldens.from_dict({**g.to_dict(), "format": "jetson-goldens/5"}, "goldens.json")
    from pipeline.device.probe import probe
    from tests.device.test_probe_gate import FIX
    board = contract.Board.from_dict(probe(FIX / "agx-thor-jp70"), "probe")
    assert board.is_jetson and board.sm == "11.0" and board.name == "agx-thor"


def test_kit_manifest_of_a_packed_kit_is_the_contract(tmp_path):
    from pipeline.kit.archive import pack
    from pipeline.kit.signing import SecretKey
    from pipeline.kit.verify import check_kit

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.bin").write_bytes(b"x" * 100)
    key = SecretKey.generate()
    pack(tmp_path / "src", tmp_path / "demo", "demo", "kit", key, meta=contract.KitMeta(recipe="r", target="agx-thor"))
    m = contract.KitManifest.load(tmp_path / "demo" / contract.MANIFEST)
    assert m.files[0].path == "a.bin" and m.files[0].size == 100 and m.recipe == "r"
    assert check_kit(tmp_path / "demo", [key.public]).manifest == m
    with pytest.raises(contract.ContractError, match="kit meta: undeclared: unknown field"):
        contract.KitMeta.from_part({"undeclared": 1}, "kit meta")       # the meta is typed: read strictly too
    with pytest.raises(PipelineError, match="an engine bundle is packed by `python -m pipeline device`"):
        pack(tmp_path / "src", tmp_path / "two" / "demo", "demo", "bundle", key)
    assert not (tmp_path / "two" / "demo").exists() and list((tmp_path / "two").iterdir()) == []


def test_records_evolve_by_the_stated_rule():
    """A reader reads its own version and each older one it has an upgrade for (the upgrade is exact); a newer one
    is refused before anything is used, saying which side to update."""
    d = plan_dict()
    old = dict(d, format="jetson-plan/1", device_build_command=d["device_build_commands"][0])   # what 1 held
    assert contract.Plan.from_dict(old, "plan.json") == contract.Plan.from_dict(d, "plan.json")
    from pipeline.device.probe import probe
    from tests.device.test_probe_gate import FIX
    board = probe(FIX / "orin-nano-8gb-jp62-super")
    one = {k: v for k, v in board.items() if k != "python_packages"} | {
        "format": "jetson-board/1", "tensorrt_llm": "0.12.0", "edgellm": None}
    assert contract.Board.from_dict(one, "board.json") == contract.Board.from_dict(board, "board.json")
    for record in (contract.Plan, contract.Board, contract.Goldens, contract.KitManifest, contract.Report):
        kind, version = record.FORMAT.split("/")
        with pytest.raises(contract.ContractError, match="made by a newer pipeline.*\n.*update the pipeline on this "
                                                         "side"):
            record.from_dict({"format": f"{kind}/{int(version) + 1}"}, "x.json")
