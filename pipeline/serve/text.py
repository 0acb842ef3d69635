"""Text in and out of the served model, without torch or transformers (the engine backends run on JetPack's
Python with the [serve] extra only): the kit's tokenizer.json through `tokenizers`, its chat template through Jinja
in the sandbox transformers uses, and incremental detokenization with stop strings.

Exactness is checked, not assumed: `check_against_goldens` renders and encodes every golden prompt the way the
server will and compares with the ids the goldens were computed from (transformers' apply_chat_template and
tokenizer on the workstation). A kit whose tokenizer or template this module reads differently is refused at start.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline import contract
from pipeline.errors import PipelineError
from pipeline.families.audio import expand_recording
from pipeline.families.visual import expand_one
from pipeline.files import read_regular

TOKENIZER_MAX = 64 * 2**20        # tokenizer.json of a 256k vocabulary: ~35 MB
CONFIG_MAX = 4 * 2**20
RENDER_MAX_CHARS = 4 * 2**20     # one rendered conversation; far beyond any engine's max_input_len in characters
SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict ({"content": ...})."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _compile(template: str, where: str):
    """The template compiled as transformers compiles chat templates (utils/chat_template_utils.py): an immutable
    sandbox, trim_blocks and lstrip_blocks, loop controls, its own tojson (no HTML escaping), raise_exception and
    strftime_now."""
    from datetime import datetime

    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template)
    except jinja2.exceptions.TemplateError as exc:
        raise PipelineError(f"{where}: the chat template does not compile: {str(exc)[:160]}",
                            "rebuild the kit from a model whose chat template transformers renders") from None


@dataclass
class TextCodec:
    """The kit's tokenizer: encode, decode, render a conversation. Built with `load`."""
    tokenizer: Any                          # tokenizers.Tokenizer
    special_tokens: dict[str, str]          # bos_token, eos_token, ... as the chat template sees them
    template: Any = None                    # a compiled jinja2 Template, or None: the model has no chat template
    template_source: str = ""
    supports_tools: bool = False            # the template renders a `tools` list (a tool-calling model's)

    @classmethod
    def load(cls, tokenizer_dir: Path) -> TextCodec:
        from tokenizers import Tokenizer

        tokenizer_dir = Path(tokenizer_dir)
        path = tokenizer_dir / "tokenizer.json"
        if not path.is_file():
            raise PipelineError(f"{tokenizer_dir}: no tokenizer.json: the server reads the fast tokenizer format",
                                "use a model that publishes tokenizer.json (every current Hugging Face LLM does)")
        try:
            tok = Tokenizer.from_str(read_regular(path, TOKENIZER_MAX).decode("utf-8"))
        except (ValueError, UnicodeDecodeError, Exception) as exc:     # tokenizers raises its own Exception type
            raise PipelineError(f"{path}: not a tokenizer `tokenizers` can read ({str(exc)[:120]})",
                                "rebuild the kit; its tokenizer files are damaged") from None
        config: dict = {}
        cfg_path = tokenizer_dir / "tokenizer_config.json"
        if cfg_path.is_file():
            try:
                loaded = json.loads(read_regular(cfg_path, CONFIG_MAX))
                config = loaded if isinstance(loaded, dict) else {}
            except (ValueError, UnicodeDecodeError):
                raise PipelineError(f"{cfg_path}: not valid JSON", "rebuild the kit") from None
        special = {k: t for k in SPECIAL if (t := _token_text(config.get(k))) is not None}
        jinja = tokenizer_dir / "chat_template.jinja"      # transformers prefers it to tokenizer_config's field
        source, text = "", None
        if jinja.is_file():
            source, text = str(jinja), read_regular(jinja, CONFIG_MAX).decode("utf-8", "replace")
        elif isinstance(config.get("chat_template"), str):
            source, text = f"{cfg_path} (chat_template)", config["chat_template"]
        template = _compile(text, source) if text else None
        return cls(tok, special, template, source, bool(text and re.search(r"\btools\b", text)))

    @functools.cached_property
    def max_token_chars(self) -> int:
        """Characters of the vocabulary's longest token (added tokens included): a prompt of n characters is at
        least n / this many tokens."""
        return max((len(t) for t in self.tokenizer.get_vocab(with_added_tokens=True)), default=1) or 1

    @property
    def has_chat_template(self) -> bool:
        return self.template is not None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    @functools.cached_property
    def control_tokens(self) -> dict[str, int]:
        """The tokenizer's special (control) tokens by text: decoding skips them."""
        return {t.content: i for i, t in self.tokenizer.get_added_tokens_decoder().items() if t.special}

    @functools.cached_property
    def control_pattern(self) -> re.Pattern[str] | None:
        """Any of the tokenizer's control tokens as text (the longest first): a request's text must not hold one."""
        names = sorted(self.control_tokens, key=len, reverse=True)
        return re.compile("|".join(map(re.escape, names))) if names else None

    def decode(self, ids: Iterable[int], keep: frozenset[int] = frozenset()) -> str:
        """Text of `ids`, control tokens skipped except those in `keep` (a tool-call marker that is one)."""
        ids = list(ids)
        if not keep or not keep.intersection(ids):
            return self.tokenizer.decode(ids, skip_special_tokens=True)
        out: list[str] = []
        run: list[int] = []
        for i in ids:
            if i in keep:
                out += [self.tokenizer.decode(run, skip_special_tokens=True), self.tokenizer.id_to_token(i) or ""]
                run = []
            else:
                run.append(i)
        return "".join(out) + self.tokenizer.decode(run, skip_special_tokens=True)

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        """The conversation as transformers' apply_chat_template(add_generation_prompt=True, tokenize=False, tools=)
        renders it with this tokenizer's special tokens."""
        import jinja2

        if self.template is None:
            raise PipelineError("the model has no chat template")
        try:
            text = self.template.render(messages=messages, tools=tools or None, documents=None,
                                        add_generation_prompt=True, **self.special_tokens)
        except (jinja2.exceptions.TemplateError, TypeError, ValueError, RecursionError) as exc:
            raise PipelineError(f"the chat template refused the conversation: {str(exc)[:200]}") from None
        if len(text) > RENDER_MAX_CHARS:
            raise PipelineError(f"the chat template rendered more than {RENDER_MAX_CHARS} characters")
        return text

    def chat_ids(self, messages: list[dict[str, Any]],
                 tools: list[dict[str, Any]] | None = None) -> tuple[str, list[int]]:
        """Rendered text and ids of a conversation: the rendered text encoded without adding special tokens (the
        template holds BOS where the model wants one), as evaluate.render_prompt does for the goldens."""
        text = self.render(messages, tools)
        return text, self.encode(text, add_special_tokens=False)

    def prompt_ids(self, prompt: str) -> tuple[str, list[int]]:
        """A raw prompt's ids (the tokenizer adds BOS where the model wants one) and the text that holds those special
        tokens, for runtimes that take text and encode it without adding any (Edge-LLM's raw mode)."""
        ids = self.encode(prompt)
        return self.tokenizer.decode(ids, skip_special_tokens=False), ids


def sampling_defaults(tokenizer_dir: Path):
    """The sampling a request gets for the fields it omits: the kit's generation_config.json (the model maker's
    temperature, top_p, top_k and repetition_penalty, as vLLM and Ollama apply them), each only where it is a valid
    value, else OpenAI's defaults."""
    from pipeline.serve.protocol import OPENAI_DEFAULTS, SamplingDefaults
    path = Path(tokenizer_dir) / "generation_config.json"
    try:
        cfg = json.loads(read_regular(path, CONFIG_MAX)) if path.is_file() else None
    except (PipelineError, ValueError, UnicodeDecodeError, RecursionError):
        cfg = None
    if not isinstance(cfg, dict):
        return OPENAI_DEFAULTS

    def number(name: str, ok, default):
        v = cfg.get(name)
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) and ok(v) else default
    found = {k: cfg[k] for k in ("temperature", "top_p", "top_k", "repetition_penalty") if k in cfg}
    if not found:
        return OPENAI_DEFAULTS
    return SamplingDefaults(temperature=float(number("temperature", lambda v: 0 <= v <= 2, 1.0)),
                            top_p=float(number("top_p", lambda v: 0 < v <= 1, 1.0)),
                            top_k=int(number("top_k", lambda v: isinstance(v, int) and 0 <= v < 2**31, 0)),
                            repetition_penalty=float(number("repetition_penalty", lambda v: 0.01 <= v <= 10,
                                                            1.0)),
                            source=f"generation_config.json ({', '.join(sorted(found))})")


def check_against_goldens(codec: TextCodec, goldens: contract.Goldens, where: str,
                          placeholder: int | None = None, audio_placeholder: int | None = None,
                          audio_wrap: tuple[int, int] | None = None) -> None:
    """Every golden prompt rendered and encoded by this codec gives the ids the goldens were computed from, and its
    golden answer decodes to the goldens' text: else the server would ask the engine something validation did not
    check, and the kit is refused. A prompt asked with an image is rendered as the server renders an image part
    (the user turn holds the image, then the text), its `placeholder` expanded to the golden's image tokens; one
    asked with a recording the same way, its `audio_placeholder` expanded to the golden's audio tokens."""
    for i, p in enumerate(goldens.prompts):
        if p.image is not None and (placeholder is None or not goldens.chat_template):
            raise PipelineError(f"{where}: golden prompt {i} is asked with an image, and this model serves no "
                                "images", "rebuild the kit")
        if p.recording is not None and (audio_placeholder is None or not goldens.chat_template):
            raise PipelineError(f"{where}: golden prompt {i} is asked with a recording, and this model serves no "
                                "audio", "rebuild the kit")
        if goldens.chat_template:
            if codec.template is None:
                raise PipelineError(f"{where}: the goldens were asked through a chat template the kit's tokenizer "
                                    "lacks", "rebuild the kit")
            media = ("image", placeholder, p.image_tokens) if p.image is not None else \
                ("audio", audio_placeholder, p.audio_tokens) if p.recording is not None else None
            if media is not None and media[1] is not None:
                _, ids = codec.chat_ids([{"role": "user", "content": [{"type": media[0]},
                                                                      {"type": "text", "text": p.prompt}]}])
                try:
                    ids = expand_one(ids, media[1], media[2] or 0) if media[0] == "image" else \
                        expand_recording(ids, media[1], media[2] or 0, audio_wrap)
                except PipelineError as exc:
                    raise PipelineError(f"{where}: prompt {i} ({p.prompt[:40]!r}): {exc.message}",
                                        "serve the kit's own tokenizer and chat template") from None
            else:
                _, ids = codec.chat_ids([{"role": "user", "content": p.prompt}])
        else:
            _, ids = codec.prompt_ids(p.prompt)
        if ids != list(p.input_ids):
            at = next((j for j, (a, b) in enumerate(zip(ids, p.input_ids, strict=False)) if a != b),
                      min(len(ids), len(p.input_ids)))
            raise PipelineError(f"{where}: prompt {i} ({p.prompt[:40]!r}) encodes to {len(ids)} ids here, "
                                f"{len(p.input_ids)} in the goldens, first different at {at}: this server would not "
                                "ask the engine what validation asked it",
                                "report this with the model's tokenizer files; serve with the tokenizer transformers "
                                "used (rebuild the kit with a tokenizer.json)")
        text = codec.decode(p.output_ids)
        if p.text is not None and text != p.text:
            raise PipelineError(f"{where}: the golden answer to prompt {i} decodes to {text[:40]!r} here, "
                                f"{p.text[:40]!r} in the goldens", "rebuild the kit")


class TextStream:
    """Token ids in, text deltas out, ending at the model's stop ids or the request's stop strings.

    Streaming and non-streaming answers both come from this one accumulator, so the deltas concatenate exactly to
    the whole answer. A delta holds back what may still change: a trailing incomplete UTF-8 sequence (decoded as
    U+FFFD) and a tail that may be the start of a stop string."""

    def __init__(self, codec: TextCodec, stop_ids: Iterable[int], stop: Iterable[str],
                 keep: frozenset[int] = frozenset()):
        self.codec, self.stop_ids, self.stop = codec, frozenset(stop_ids), tuple(s for s in stop if s)
        self.keep = keep            # control tokens kept in the text (a tool-call marker the parser looks for)
        self.ids: list[int] = []       # generated ids, the stop id included (what was computed)
        self.sent = ""                 # text given out so far
        self.finish_reason: str | None = None
        self.matched: str | None = None     # the stop string that ended the answer (Anthropic's stop_sequence)

    def _text(self) -> str:
        ids = self.ids[:-1] if self.ids and self.ids[-1] in self.stop_ids else self.ids
        return self.codec.decode(ids, self.keep)

    def feed(self, tokens: Iterable[int]) -> str:
        """The new text these tokens add; sets finish_reason to "stop" at a stop id or stop string."""
        if self.finish_reason:
            return ""
        for t in tokens:
            self.ids.append(int(t))
            if t in self.stop_ids:
                self.finish_reason = "stop"
                break
        text = self._text()
        cut = self._cut(text)
        if cut >= 0:
            self.finish_reason, text = "stop", text[:cut]
        if not self.finish_reason:
            text = text.rstrip("\ufffd")
            hold = max((k for s in self.stop for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
            text = text[:len(text) - hold]
        return self._advance(text)

    def finish(self, reason: str) -> str:
        """The rest of the text when the engine ended the request (length, or its own stop)."""
        if not self.finish_reason:
            self.finish_reason = reason
            text = self._text()
            cut = self._cut(text)
            return self._advance(text[:cut] if cut >= 0 else text)
        return ""

    def _cut(self, text: str) -> int:
        """Where the earliest stop string starts in `text` (-1: none), noting which one it is."""
        found = [(i, s) for s in self.stop if (i := text.find(s)) >= 0]
        if not found:
            return -1
        at, self.matched = min(found, key=lambda f: f[0])
        return at

    def _advance(self, text: str) -> str:
        if not text.startswith(self.sent):      # a tokenizer whose decode is not prefix-stable: never retract
            return ""
        delta, self.sent = text[len(self.sent):], text
        return delta
