"""TEST DOUBLE helper: the tokenizer and chat template as Edge-LLM's C++ runtime has them beside an engine, without
transformers (the runtime links no Python; importing transformers cost each llm_inference double ~9 s of a ~24 s
run on the CI machine).

tokenizer.json runs through the `tokenizers` library, which is what transformers' PreTrainedTokenizerFast wraps
(encode without special tokens, decode skipping them: the same calls). The chat template is rendered as transformers
renders it (utils/chat_template_utils.py, _cached_compile_jinja_template and apply_chat_template): a sandboxed jinja2
environment with trim_blocks and lstrip_blocks, the loopcontrols extension, its tojson filter (no HTML escaping),
raise_exception and strftime_now, the tokenizer's special tokens passed as variables.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

SPECIAL = ("bos_token", "eos_token", "pad_token", "unk_token")


def _raise(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class EngineTokenizer:
    def __init__(self, engine_dir: Path):
        self.tokenizer = Tokenizer.from_file(str(engine_dir / "tokenizer.json"))
        config = json.loads((engine_dir / "tokenizer_config.json").read_text())
        # a special token is a string or, as some configs save it, an AddedToken's {"content": ...}
        self.special = {k: v["content"] if isinstance(v, dict) else v for k in SPECIAL
                        if isinstance(v := config.get(k), (str, dict))}
        path = engine_dir / "chat_template.jinja"
        text = path.read_text() if path.is_file() else config.get("chat_template")
        self.template = None
        if isinstance(text, str):
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=[jinja2.ext.loopcontrols])
            env.filters["tojson"] = _tojson
            env.globals["raise_exception"] = _raise
            env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
            self.template = env.from_string(text)

    def chat(self, messages: list[dict]) -> str:
        if self.template is None:
            raise SystemExit("llm_inference (double): apply_chat_template asked and the engine has no chat template")
        return self.template.render(messages=messages, add_generation_prompt=True, **self.special)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def token_id(self, token: str) -> int:
        found = self.tokenizer.token_to_id(token)
        if found is None:
            raise SystemExit(f"llm_inference (double): the tokenizer has no {token!r}")
        return found

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)
