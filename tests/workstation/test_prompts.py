"""Validation asks what the deployed model is asked: the chat template with the generation prompt, and exactly the
ids the engine sees, for a Llama-3-style tokenizer (BOS in the template) and a Qwen-style one (no BOS), both built
offline (a BPE trained with `tokenizers`, the special tokens and chat templates of those families)."""

from types import SimpleNamespace

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from pipeline import contract
from pipeline.device.runners import edgellm_inference_input
from pipeline.workstation.evaluate import render_prompt, uses_chat_template

TEXT = ["What is the capital of France? Paris is the capital of France.", "To bake bread you need flour and water.",
        "The small computer sat on a shelf and answered questions."] * 20
LLAMA3 = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
          "{{ m['content'] }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant"
          "<|end_header_id|>\n\n{% endif %}")
QWEN = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _tokenizer(special: list[str], bos: str | None, template: str, eos: str) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(TEXT, trainers.BpeTrainer(vocab_size=400, special_tokens=special,
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    if bos:     # Llama-3's tokenizer.json: a post-processor that prepends <|begin_of_text|>
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                           special_tokens=[(bos, tok.token_to_id(bos))])
    from tokenizers import decoders
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos)
    fast.chat_template = template
    return fast


@pytest.fixture(params=["llama3", "qwen"])
def family(request):
    if request.param == "llama3":
        specials = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
        return request.param, _tokenizer(specials, "<|begin_of_text|>", LLAMA3, "<|eot_id|>")
    return request.param, _tokenizer(["<|im_start|>", "<|im_end|>", "<|endoftext|>"], None, QWEN, "<|im_end|>")


def test_chat_rendering_has_one_bos_and_ends_with_the_generation_prompt(family):
    name, tok = family
    rendered, ids = render_prompt(tok, "What is the capital of France?", chat=True)
    assert uses_chat_template(tok, SimpleNamespace(chat_template=None)) and \
        not uses_chat_template(tok, SimpleNamespace(chat_template=False))
    if name == "llama3":
        bos = tok.convert_tokens_to_ids("<|begin_of_text|>")
        assert ids[0] == bos and ids.count(bos) == 1          # the template's BOS, not a second one from encoding
        assert rendered.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    else:
        assert rendered.startswith("<|im_start|>user\n") and rendered.endswith("<|im_start|>assistant\n")
    # what transformers' own apply_chat_template(tokenize=True) gives, i.e. what the model was trained to see
    direct = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                     add_generation_prompt=True, tokenize=True)
    direct = direct["input_ids"] if hasattr(direct, "keys") else direct
    assert ids == list(direct)


def test_raw_rendering_keeps_the_bos_the_engine_would_otherwise_lose(family):
    """Raw prompts: the ids are the tokenizer's (BOS added for Llama-3); the rendered text carries that BOS, so an
    engine that encodes the text with addBos=false (Edge-LLM raw mode) sees the same ids."""
    name, tok = family
    rendered, ids = render_prompt(tok, "To bake bread you need", chat=False)
    assert tok(rendered, add_special_tokens=False)["input_ids"] == ids
    assert (ids[0] == tok.convert_tokens_to_ids("<|begin_of_text|>")) == (name == "llama3")


def test_edgellm_is_asked_what_the_goldens_asked(family):
    _, tok = family
    for chat in (True, False):
        rendered, ids = render_prompt(tok, "What is the capital of France?", chat)
        goldens = contract.Goldens(max_new_tokens=8, min_token_agreement=0.9, top_k=1, eos_token_id=None,
                                   prompts=[contract.GoldenPrompt("What is the capital of France?", ids, [], [], "",
                                                                  rendered)], chat_template=chat)
        req = edgellm_inference_input(goldens)
        assert req["apply_chat_template"] is chat and req["add_generation_prompt"] is chat
        content = req["requests"][0]["messages"][0]["content"]
        if chat:    # the runtime renders the same template over the same message
            assert tok.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                           tokenize=False) == rendered
        else:       # raw: the text already holds what the goldens held, encoded with addBos=false
            assert tok(content, add_special_tokens=False)["input_ids"] == ids


def test_short_golden_answers_are_called_a_weak_check():
    from pipeline.workstation.evaluate import weak_prompts
    def golden(prompt, ids):
        return contract.GoldenPrompt(prompt=prompt, input_ids=[1], output_ids=ids, top_logprobs=[], text="")
    goldens = contract.Goldens(max_new_tokens=32, min_token_agreement=0.9, top_k=1, eos_token_id=None, prompts=[
        golden("What is the capital of France?", [7, 2]), golden("Tell me a story", list(range(20)))])
    assert weak_prompts(goldens) == ["What is the capital of France?"]
