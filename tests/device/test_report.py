"""The device report's measured figures: the KV cache as the runtime reports it, llm_inference's profile, and the
checks that compare them with the plan (unit level; test_device.py runs them end to end)."""


import pytest

from pipeline import backends, contract
from pipeline.device.checks import memory_checks
from pipeline.device.report import build_report, kv_check
from pipeline.device.runners import edgellm_profile
from pipeline.runtime.edgellm import EdgellmSession
from pipeline.runtime.trtllm import TrtllmSession

reported_kv_allocation = TrtllmSession.reported_kv_allocation

LOG_012 = """[TensorRT-LLM][INFO] Engine version 0.12.0 found in the config file.
[TensorRT-LLM][INFO] Number of blocks in KV cache primary pool: 8
[TensorRT-LLM][INFO] Number of tokens per block: 64.
[TensorRT-LLM][INFO] [MemUsageChange] Allocated 0.03 GiB for max tokens in paged KV cache (512).
"""


def test_the_kv_allocation_is_what_the_runtime_logged():
    kv = reported_kv_allocation(LOG_012, None)
    assert kv == {"tokens": 512, "bytes": int(0.03 * 2**30), "source": "TensorRT-LLM log: [MemUsageChange] "
                  "Allocated 0.03 GiB for max tokens in paged KV cache (512)"}
    blocks_only = "\n".join(LOG_012.splitlines()[1:3])
    assert reported_kv_allocation(blocks_only, None)["tokens"] == 8 * 64
    stats = {"max_num_blocks": 9, "tokens_per_block": 64, "used_num_blocks": 1, "free_num_blocks": 8}
    assert reported_kv_allocation("", stats)["tokens"] == 576
    assert reported_kv_allocation("[TensorRT-LLM][INFO] Using 10718 tokens in paged KV cache.", None)["tokens"] == 10718
    assert reported_kv_allocation("nothing about it", {"max_num_blocks": "x"}) is None


def _plan(batch=2, seq=256, kv_bytes=131072, backend="trtllm-0.12"):
    from pipeline.contract import BuildLimits
    from pipeline.plan.planner import PlanRequest, make_plan
    from pipeline.plan.shapes import shape_from_config
    from pipeline.plan.targets import get_target
    from tests.shared.test_planner import TINY

    rec = make_plan(PlanRequest(shape_from_config(TINY), "m", "int4_awq", "fp16", get_target("orin-nano-8gb"),
                                BuildLimits.of(batch, 128, seq), backend=backend, group_size=64))
    assert rec.memory.kv_cache == kv_bytes
    return rec


def test_the_kv_check_holds_at_the_plans_cap_and_fails_one_token_past_it():
    plan = _plan()
    trt = backends.get("trtllm-0.12")
    kv = contract.KvAllocation
    at_cap = kv_check(kv(512, 131072, "log"), plan, trt)[0]
    assert at_cap.ok and at_cap.measured == 512 and at_cap.required.startswith("<= 512 tokens (2 x 256")
    over = kv_check(kv(513, None, "log"), plan, trt)[0]
    assert not over.ok and over.by == 1
    # bytes over the plan's budget (beyond the runtime's two-decimal GiB rounding) fail too
    assert not kv_check(kv(512, 131072 + int(0.006 * 2**30), "log"), plan, trt)[0].ok
    silent = kv_check(None, plan, trt)[0]
    assert not silent.ok and silent.measured is None and "did not report" in str(silent.by)
    assert kv_check(None, plan, backends.get("edgellm")) == []     # Edge-LLM's runtime reports none: a note instead


def test_memory_checks_fail_when_nothing_measured():
    def took(taken, swapped=0):
        return contract.PhaseMemory(taken=taken, swapped=swapped, peak_rss=None, min_available=None, samples=2)
    checks = memory_checks("runtime", None, 1_000_000, 6_000_000, "usable")
    assert [c.ok for c in checks] == [False, False] and all(c.measured is None for c in checks)
    ok = memory_checks("runtime", took(1_200_000), 1_000_000, 6_000_000, "usable")
    assert [c.ok for c in ok] == [True, True]
    over = memory_checks("runtime", took(1_200_001), 1_000_000, 6_000_000, "usable")
    assert [c.ok for c in over] == [False, True] and over[0].by == 1
    # RAM only: what paged out to swap does not count against the RAM the board has
    ram = memory_checks("build", took(7_000_000, 2_000_000), None, 6_000_000, "usable", ram_only=True)
    assert ram[0].ok and ram[0].measured == 5_000_000


def test_llm_inference_profile_figures_and_their_absence():
    profile = {"prefill": {"average_time_per_run_ms": 12.5}, "generation": {"tokens_per_second": 40.0},
               "peak_unified_memory_bytes": 123}
    assert edgellm_profile(profile) == {"ttft_s": 0.0125, "decode_tok_s": 40.0, "acceptance": None,
                                        "peak_unified_memory": 123.0, "vit_ms": None}
    # a request with an image: the vision stages' time per image token x tokens per image
    imaged = {**profile, "multimodal": {"total_runs": 1, "total_images": 2, "total_image_tokens": 150,
                                        "average_time_per_token_ms": 0.2}}
    assert edgellm_profile(imaged)["vit_ms"] == 15.0
    eagle = {"prefill": {"average_time_per_run_ms": 10}, "eagle_generation": {
        "average_acceptance_rate": 2.6, "overall_tokens_per_second_excluding_base_prefill": 95.5}}
    assert edgellm_profile(eagle)["acceptance"] == 2.6 and edgellm_profile(eagle)["decode_tok_s"] == 95.5
    newer = {"spec_decode_generation": eagle["eagle_generation"]}
    assert edgellm_profile(newer)["acceptance"] == 2.6
    # llm_inference without --dumpProfile writes zeros or nothing: not measured, never 0 tok/s
    for empty in ({}, [], {"prefill": {"average_time_per_run_ms": 0}, "generation": {"tokens_per_second": "x"}},
                  {"prefill": {"average_time_per_run_ms": float("inf")}}):
        assert edgellm_profile(empty) == {"ttft_s": None, "decode_tok_s": None, "acceptance": None,
                                          "peak_unified_memory": None, "vit_ms": None}


def test_a_report_says_not_measured_and_fails_rather_than_pass_on_a_guess(tmp_path):
    from pipeline.device.report import write_report

    plan = _plan()
    goldens = contract.Goldens(max_new_tokens=4, min_token_agreement=0.5, top_k=1, eos_token_id=None, prompts=[
        contract.GoldenPrompt("p", [1, 2], [3, 4, 5, 6], [], "x y z w")])
    board = _board()
    validation = contract.Validation(runtime="r", speed_source="s", prompts=[
        contract.PromptResult(prompt="p", output_ids=[3, 4, 5, 6])])
    nothing = contract.PhaseMemory(taken=None, swapped=0, peak_rss=None, min_available=None, samples=0)
    build = contract.BuildRecord(argvs=[], seconds=1.0, memory=nothing, kit_manifest_sha256="", engine_files={})
    report = build_report(goldens, validation, plan, board, build, False, None)
    failed = [c.check for c in report.checks if not c.ok]
    assert not report.ok and report.checks[0].ok
    assert failed == ["KV cache allocated by the runtime within the plan's budget",
                      "engine build memory within the plan's estimate (+20%)",
                      "engine build RAM within a headless board's usable memory (the rest may page out to swap)",
                      "runtime memory within the plan's estimate (+20%)",
                      "runtime memory within the board's usable memory (headless)"]
    write_report(tmp_path / "r", report)
    md = (tmp_path / "r" / "report.md").read_text()
    assert "| decode | not measured |" in md and "| runtime memory | not measured |" in md
    assert "not measured" in (tmp_path / "r" / "report.svg").read_text()


def test_agreement_is_on_what_the_runtime_returned():
    """Token ids from a serving session; text from llm_inference (which returns no ids); Edge-LLM's RequestEngine
    reports no KV allocation in its log."""
    golden = contract.GoldenPrompt(prompt="p", input_ids=[1], output_ids=[3, 4, 5, 6], top_logprobs=[], text="abcd")
    ids = contract.Validation(runtime="r", speed_source="s", prompts=[contract.PromptResult("p", output_ids=[3, 4, 9])])
    text = contract.Validation(runtime="r", speed_source="s", prompts=[contract.PromptResult("p", output_text="abXd")])
    assert ids.agreement_unit == "token" and text.agreement_unit == "text"
    assert backends.agreement(golden, ids.prompts[0], "token") == (0.5, None)
    assert backends.agreement(golden, text.prompts[0], "text") == (0.5, None)
    assert EdgellmSession.reported_kv_allocation(LOG_012, {"max_num_blocks": 9, "tokens_per_block": 64}) is None


def _tied_goldens(tokenizer, top_logprobs, tie=0.03):
    from pipeline.workstation.evaluate import near_ties

    ids = [int(step[0][0]) for step in top_logprobs]
    golden = contract.GoldenPrompt(prompt="p", input_ids=[1], output_ids=ids, top_logprobs=top_logprobs,
                                   text=tokenizer.decode(ids, skip_special_tokens=True),
                                   near_ties=near_ties(tokenizer, ids, top_logprobs, tie))
    return contract.Goldens(max_new_tokens=len(ids), min_token_agreement=0.9, top_k=2, eos_token_id=None,
                            prompts=[golden], tie_logprob=tie)


@pytest.fixture(scope="module")
def tiny_tokenizer():
    from transformers import PreTrainedTokenizerFast

    from pipeline.workstation.tinymodel import train_tokenizer

    return PreTrainedTokenizerFast(tokenizer_object=train_tokenizer(320), eos_token="<|eos|>")


def test_an_answer_that_takes_a_near_tie_agrees_as_far_as_it_can_be_compared(tiny_tokenizer):
    """A runner-up within the goldens' tie margin (0.03 nats, counted at its edge) is the model's answer too: the
    engine that takes it agrees up to there, by token id or by text; one step wider, or another token, does not."""
    steps = [[[40, -0.5], [41, -3.0]], [[42, -2.0], [43, -2.03]], [[44, -1.0], [45, -1.03001]],
             [[46, -0.1], [47, -4.0]]]
    goldens = _tied_goldens(tiny_tokenizer, steps)
    (g,) = goldens.prompts
    assert [(t.step, t.token_id, t.margin) for t in g.near_ties] == [(1, 43, 0.03)]   # 0.03001 is no tie
    tie = g.near_ties[0]
    assert tie.text == tiny_tokenizer.decode([40, 43]) and tie.text != g.text[:len(tie.text)]

    def result(ids=None, text=None):
        return contract.PromptResult("p", output_ids=ids, output_text=text)

    assert backends.agreement(g, result([40, 43, 9, 9]), "token") == (1.0, tie)
    assert backends.agreement(g, result([40, 42, 45, 9]), "token") == (0.5, None)     # 0.03001: a divergence
    assert backends.agreement(g, result([40, 41, 9, 9]), "token") == (0.25, None)     # not a runner-up in the margin
    assert backends.agreement(g, result([40, 43]), "token") == (1.0, tie)             # it stopped after the tie
    assert backends.agreement(g, result(text=tie.text + "zz"), "text") == (1.0, tie)
    other = tiny_tokenizer.decode([40, 41])
    assert backends.agreement(g, result(text=other + "zz"), "text")[1] is None

    report = build_report(goldens, contract.Validation(runtime="r", speed_source="s", prompts=[
        result([40, 43, 9, 9])]), _plan(), _board(), None, False, None)
    assert report.checks[0].ok and report.checks[0].measured == 1.0 and report.prompts[0].near_tie_at == 1
    assert any(n.startswith("the answer to 'p' took token 43 at step 2 of 4, 0.03 nats below the golden's choice "
                            "(a near tie: at most 0.03)") for n in report.notes), report.notes
    # kits written before near ties were recorded: every divergence counts, as it did
    old = contract.Goldens.from_dict({k: v for k, v in goldens.to_dict().items() if k != "tie_logprob"} | {
        "prompts": [{k: v for k, v in g.to_dict().items() if k != "near_ties"}]}, "goldens.json")
    assert backends.agreement(old.prompts[0], result([40, 43, 9, 9]), "token") == (0.25, None)


def test_the_tie_margin_widens_where_the_engine_rounds_what_flows_through_it():
    """FP16 activations: 0.03 nats; anything rounded to 8 bits or fewer (GEMM inputs, K/V, an FP8 tower): 0.1."""
    from pipeline.formats import KV_FORMATS, TOWER_FP8, UNQUANTIZED, WEIGHT_FORMATS, rounds_activations
    from pipeline.workstation.evaluate import tie_logprob

    fp16, kv16 = UNQUANTIZED.name, KV_FORMATS[UNQUANTIZED.name].name
    widened = {w for w in WEIGHT_FORMATS if tie_logprob(rounds_activations(w, kv16, fp16)) == 0.1}
    assert widened == {w.name for w in WEIGHT_FORMATS.values() if w.math != "fp16"} and "int4_awq" not in widened
    assert tie_logprob(rounds_activations("int4_awq", kv16, fp16)) == 0.03
    assert tie_logprob(rounds_activations("int4_awq", kv16, TOWER_FP8)) == 0.1
    assert all(tie_logprob(rounds_activations(fp16, kv, fp16)) == (0.03 if kv == kv16 else 0.1) for kv in KV_FORMATS)


def _board():
    return contract.Board(l4t="36.4.3", jetpack="6.2", board="b", compatible=[], soc="tegra234", sm="8.7",
                          target="orin-nano-8gb", cuda=None, tensorrt="10.3",
                          python_packages={"tensorrt_llm": "0.12.0"}, memory_total=None, memory_available=None,
                          power_mode="15W", emc_hz=None, bandwidth_gbs=None)
