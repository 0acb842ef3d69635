"""A request made ready for the engine, before any engine work: the chat rendered (tools included where the model
takes them) and fitted to max_input_len, the token budget, what the backend must apply (refused by name where it
cannot), the constraint compiled for the session (structured output, a forced tool call), and how the answer's
tool calls will be read. Every refusal is an ApiError in OpenAI's shape."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.errors import PipelineError
from pipeline.runtime.session import Constraint, Generation, Session
from pipeline.serve import history, protocol
from pipeline.serve import recordings as audio
from pipeline.serve.errors import ApiError
from pipeline.serve.images import ImageSide, RequestImage, check_profile, expand, read_images
from pipeline.serve.toolcalls import ToolCallFormat

if TYPE_CHECKING:
    from pipeline.serve.sources import Served

QUICK_CHARS = 2000      # a prompt this short is rendered and tokenized on the event loop (Preparer.quick)


@dataclass(frozen=True)
class Settings:
    api_key: str | None = None
    max_queue: int = 16
    request_timeout: float = 600.0
    max_body_bytes: int = 2 * 2**20
    allowed_hosts: frozenset[str] | None = None     # None: any Host header (a non-loopback bind)
    cors_origins: frozenset[str] = frozenset()
    public_metrics: bool = False
    truncate: bool = True           # a chat past max_input_len loses its oldest turns (else a 400)
    strict_limits: bool = False     # max_tokens past the room left is a 400 (else clamped to it)


@dataclass(frozen=True)
class Prepared:
    generation: Generation
    dropped: int = 0                # chat messages dropped to fit max_input_len
    tools: str | None = None        # why the request's tools were answered as a plain chat
    calls: ToolCallFormat | None = None     # the answer's tool calls are parsed in this format
    forced: bool = False            # the answer is a forced tool call: cut short, it is neither text nor a call
    cut: int = 0                    # tokens cut from the middle of an over-long prompt or message
    cut_chars: int = 0              # characters cut before tokenizing (a prompt past what the tokenizer is given)


class Preparer:
    """Requests for one served model, against the session `session()` returns (or raises 503 for)."""

    def __init__(self, served: Served, settings: Settings, session: Callable[[], Session]):
        self.served, self.settings, self.session = served, settings, session

    def generation(self, req: protocol.Request, chat: bool) -> Prepared:
        """The request as the engine takes it, with what was done to fit it (messages dropped, tools answered as a
        plain chat), or the ApiError that refuses it (before any work)."""
        s, limits = self.served, self.served.limits
        field = "messages" if chat else "prompt"        # the parameter a prompt error names
        self.check_control_text(req, chat)
        req, pre_dropped, cut_chars = self.bounded(req, chat)
        if req.model is not None and req.model != s.name:
            raise ApiError(404, f"the model {req.model!r} does not exist; this server serves {s.name!r}", "model",
                           "model_not_found")
        dropped, held, cut, (calls, tools) = 0, 0, 0, self.tool_mode(req)
        images, heard = self.images(req), self.recordings(req)
        if chat:
            if not s.codec.has_chat_template:
                raise ApiError(400, f"{s.name} has no chat template (its tokenizer_config.json and "
                               "chat_template.jinja define none): use /v1/completions with a raw prompt",
                               "messages", "chat_template_missing")
            text, ids, dropped, held, cut = self.render(req, list(req.tools) if calls else None, images, heard)
            if calls is not None and req.tool_choice == "auto" and (len(ids) > limits.max_input_len or cut):
                # the tools' definitions leave no room for the newest turn: answered as a plain chat, as a model
                # without tool support is (Open WebUI sends its built-in tools with every chat)
                text, ids, dropped, held, cut = self.render(req, None, images, heard)
                calls, tools = None, (f"tools ignored: their definitions do not fit max_input_len = "
                                      f"{limits.max_input_len} with the chat; answered as a plain chat")
        else:
            text, ids = self.prompt(req)
            if len(ids) > limits.max_input_len and self.truncates(req):
                head, tail = history.middle(ids, len(ids) - limits.max_input_len)
                cut, ids = len(ids) - len(head) - len(tail), head + tail
                text = s.codec.tokenizer.decode(ids, skip_special_tokens=False)    # the text holding these ids
        if req.ignored:
            tools = f"{tools}; {req.ignored}" if tools else req.ignored
        if not ids:
            raise ApiError(400, "the prompt is empty", field)
        if len(ids) > limits.max_input_len:
            why = " even with only its newest turn" if dropped else ""
            raise ApiError(400, f"the prompt is {len(ids)} tokens{why}; the engine takes at most max_input_len = "
                           f"{limits.max_input_len}", field, "context_length_exceeded")
        room = limits.max_seq_len - len(ids)
        if room < 1:
            raise ApiError(400, f"the prompt of {len(ids)} tokens leaves no room under max_seq_len = "
                           f"{limits.max_seq_len}", field, "context_length_exceeded")
        if req.max_tokens is not None and req.max_tokens > room and self.settings.strict_limits:
            raise ApiError(400, f"max_tokens = {req.max_tokens} with a prompt of {len(ids)} tokens is past the "
                           f"engine's max_seq_len = {limits.max_seq_len} (at most {room} here)", "max_tokens",
                           "context_length_exceeded")
        self.check_applied(req)
        # past the room left, as many as fit: the answer ends with finish_reason "length" there
        budget = min(req.max_tokens or room, room)
        if calls is not None and req.tool_choice not in ("auto", "none"):
            guide = self.guide(calls.forced(req.tools, None if req.tool_choice == "required" else req.tool_choice),
                               "tools")
        else:
            guide = self.guide(Constraint(req.schema) if req.schema is not None else None,
                               "response_format.json_schema.schema")
        # the newest images (recordings): a chat cut to fit lost its oldest turns, and their images with them
        kept = images[len(images) - held:] if held and images else []
        if kept and s.images is not None:
            check_profile(s.images, kept)
        heard = heard[len(heard) - held:] if held and heard else []
        return Prepared(Generation(tuple(ids), text, budget, req.sampling, s.stop_ids, guide, req.logprobs,
                                   tuple(i.data for i in kept), tuple(r.wav for r in heard)),
                        pre_dropped + dropped, tools, calls,
                        calls is not None and req.tool_choice not in ("auto", "none"), cut, cut_chars)

    def check_control_text(self, req: protocol.Request, chat: bool) -> None:
        """Special tokens never come from a request's text: a chat message's text holding one of the tokenizer's
        control tokens (an end-of-turn, an image placeholder: the template would turn the text into the token) is a
        400 naming it; a raw prompt may hold control tokens (it is the prompt as the model reads it), but not the
        image (audio) placeholder, which only an image (input_audio) part may bring."""
        codec = self.served.codec
        if chat:
            pattern = codec.control_pattern
            if pattern is None:
                return
            for i, m in enumerate(req.messages):
                content = m.get("content")
                texts = [content] if isinstance(content, str) else \
                    [p.get("text", "") for p in content or [] if isinstance(p, dict)]
                for text in texts:
                    found = pattern.search(text)
                    if found:
                        raise ApiError(400, f"messages[{i}].content holds {found.group()!r}, one of the model's "
                                       "control tokens: text cannot stand for a special token (send images and "
                                       "audio as their parts)", f"messages[{i}].content", "invalid_text")
            return
        sides: tuple[ImageSide | audio.AudioSide | None, ...] = (self.served.images, self.served.audio)
        for side in sides:
            if side is not None and (side.placeholder in (req.prompt or "") or side.placeholder_id in
                                     (req.prompt_ids or ())):
                raise ApiError(400, f"prompt holds the {side.noun} placeholder {side.placeholder!r}: "
                               f"{side.noun}s enter only as {side.part} parts of a chat", "prompt", "invalid_text")

    def bound(self) -> int:
        """The characters a prompt may have before tokenizing: no token is longer than the vocabulary's longest, so
        past max_input_len of those (twice, for normalizers that compose characters) it cannot fit, whatever the
        tokenizer makes of it."""
        return 2 * self.served.limits.max_input_len * self.served.codec.max_token_chars

    def bounded(self, req: protocol.Request, chat: bool) -> tuple[protocol.Request, int, int]:
        """(the request, messages dropped, characters cut) with its text brought to `bound` characters before it is
        tokenized, where the request may be fitted: what truncation would keep is answered, and the tokenizer's
        work stays bounded (check_prompt_size refuses the rest where it may not)."""
        bound = self.bound()
        if not self.truncates(req) or _prompt_chars(req, chat) <= bound:
            return req, 0, 0
        if not chat:
            prompt = req.prompt or ""
            remove = len(prompt) - bound + len(history.ELLIPSIS)
            return dataclasses.replace(req, prompt=history.cut_text(prompt, remove)), 0, remove
        messages, dropped, cut = history.shrink_chars([dict(m) for m in req.messages], bound)
        return dataclasses.replace(req, messages=tuple(messages)), dropped, cut

    def truncates(self, req: protocol.Request) -> bool:
        """Whether an over-long prompt may be fitted (the server's --no-truncate, the request's own truncation)."""
        return self.settings.truncate and req.truncate

    def prompt(self, req: protocol.Request) -> tuple[str, list[int]]:
        """A completion's (text, ids): its string tokenized, or its token ids checked against the vocabulary."""
        codec = self.served.codec
        if req.prompt_ids is None:
            return codec.prompt_ids(req.prompt or "")
        size = codec.tokenizer.get_vocab_size(with_added_tokens=True)
        bad = next((t for t in req.prompt_ids if not 0 <= t < size), None)
        if bad is not None:
            raise ApiError(400, f"prompt: token id {bad} is not in the vocabulary (0 to {size - 1})", "prompt")
        ids = list(req.prompt_ids)
        return codec.tokenizer.decode(ids, skip_special_tokens=False), ids

    def count(self, req: protocol.Request) -> int:
        """The prompt tokens of a chat as sent (its tools where the model takes them; nothing dropped or cut):
        Anthropic's count_tokens."""
        calls, _ = self.tool_mode(req)
        images, heard = self.images(req), self.recordings(req)
        codec, side, hears = self.served.codec, self.served.images, self.served.audio
        try:
            _, ids = codec.chat_ids([dict(m) for m in req.messages], list(req.tools) if calls else None)
        except PipelineError as exc:
            raise ApiError(400, exc.message, "messages") from None
        if side is not None and images:
            return len(expand(ids, side, images))
        return len(expand(ids, hears, heard)) if hears is not None and heard else len(ids)

    def images(self, req: protocol.Request) -> list[RequestImage]:
        """The request's images read, checked and counted (a 400 naming the part), or a 400 where the served model
        or its backend takes none."""
        if not req.images:
            return []
        side = self.taken(req.images[0].param, self.served.images, "is a text model and takes no images", "images",
                          "images", "image")
        return read_images(req.images, side)

    def recordings(self, req: protocol.Request) -> list[audio.RequestRecording]:
        """The request's recordings read, checked and counted (a 400 naming the part), or a 400 where the served
        model or its backend takes none."""
        if not req.recordings:
            return []
        side = self.taken(req.recordings[0].param, self.served.audio, "has no audio encoder and takes no audio",
                          "recordings", "audio", "speech")
        session = self.session()
        most = session.recordings_per_request
        if most is not None and len(req.recordings) > most:
            extra = req.recordings[most].param
            raise ApiError(400, f"{extra}: the {session.backend} runtime takes at most {most} recording(s) per "
                           "request; send one recording per request", extra, "unsupported_parameter")
        return audio.read_recordings(req.recordings, side)

    def taken(self, first: str, side, lacks: str, applies: str, noun: str, prompts: str):
        """The served model's side for a request's images (recordings), or the 400 naming the first part where the
        model has none (`lacks`) or its runtime session does not take them (`applies`)."""
        if side is None:
            raise ApiError(400, f"{first}: {self.served.name} {lacks}", first, "unsupported_parameter")
        session = self.session()
        if applies not in session.applies:
            raise ApiError(400, f"{first}: the {session.backend} runtime session here does not take {noun} (validate "
                           f"{prompts} prompts through the device's own runtime, or serve the recipe's reference "
                           "model)", first, "unsupported_parameter")
        return side

    def render(self, req: protocol.Request, tools: list[dict[str, Any]] | None, images: list[RequestImage],
               heard: list[audio.RequestRecording] | None = None) -> tuple[str, list[int], int, int, int]:
        """(text, ids, messages dropped, images (recordings) kept, tokens cut) of the chat rendered with these tools,
        each image's (recording's) placeholder expanded to its tokens, fitted to max_input_len unless --no-truncate:
        its oldest turns dropped, then its longest message cut in the middle where the newest turn alone is too
        long."""
        codec, side, hears = self.served.codec, self.served.images, self.served.audio
        held: dict[str, int] = {}       # rendered text -> the images (recordings) it holds

        def ids_of(messages: list[dict[str, Any]]) -> tuple[str, list[int]]:
            text, ids = codec.chat_ids(messages, tools)
            if hears is not None and heard:
                held[text] = ids.count(hears.placeholder_id)
                return text, expand(ids, hears, heard)
            if side is None or not images:
                return text, ids
            held[text] = ids.count(side.placeholder_id)
            return text, expand(ids, side, images)
        limit, cut = self.served.limits.max_input_len, 0
        try:
            messages = [dict(m) for m in req.messages]
            if self.truncates(req):
                text, ids, dropped = history.fit(messages, ids_of, limit)
                if len(ids) > limit:
                    system = len(history.turns(messages)[0])
                    kept = messages[:system] + messages[system + dropped:]
                    text, ids, cut = history.cut_middle(kept, ids_of, limit, (
                        lambda t: codec.encode(t, add_special_tokens=False), codec.decode))
            else:
                (text, ids), dropped = ids_of(messages), 0
        except PipelineError as exc:
            raise ApiError(400, exc.message, "messages") from None
        return text, ids, dropped, held.get(text, 0), cut

    def check_applied(self, req: protocol.Request) -> None:
        """Every sampling extra and logprobs field the request sets is one this backend applies, else a 400 naming it
        (never silently ignored)."""
        session = self.session()
        asked = [(name, name) for name in req.sampling.extras()]        # (what the runtime must do, the field)
        if req.logprobs is not None:
            asked.append(("logprobs", "logprobs"))
            if req.logprobs > 0:        # alternatives: chat's top_logprobs, completions' logprobs > 0
                asked.append(("top_logprobs", "top_logprobs" if req.messages else "logprobs"))
        for what, field in asked:
            if what not in session.applies:
                more = " (alternatives to the chosen token)" if what != field else ""
                raise ApiError(400, f"{field}: the {session.backend} runtime does not apply it{more} (this server "
                               "refuses what it cannot apply rather than ignore it)", field, "unsupported_parameter")

    def guide(self, constraint: Constraint | None, param: str) -> Any:
        """The constraint as the session follows it (None: free text), or a 400: a schema that does not compile names
        its path; a backend that cannot constrain says so."""
        if constraint is None:
            return None
        session = self.session()
        try:
            return session.guide(constraint)
        except NotImplementedError as exc:
            what = "a forced tool call" if param == "tools" else "structured output"
            raise ApiError(400, f"{param.split('.')[0]}: {what} is not available on the {self.served.backend} "
                           f"backend here: {exc}", param.split(".")[0], "unsupported_parameter") from None
        except ValueError as exc:
            where = "the tools' parameters" if param == "tools" else param
            raise ApiError(400, f"{where} cannot be compiled into a grammar: {exc}", param, "invalid_schema") from None

    def tool_mode(self, req: protocol.Request) -> tuple[ToolCallFormat | None, str | None]:
        """(the format the answer's tool calls are parsed in, why the tools are answered as a plain chat instead):
        (None, None) when no tools were sent or tool_choice is none. A model whose chat template renders no tools, or
        whose family has no declared format, answers tool_choice auto as a plain chat (what Open WebUI needs, said in
        a header); a forced call is then a 400 naming what is missing."""
        if not req.tools or req.tool_choice == "none":
            return None, None
        fmt = self.served.tool_format
        why = "its chat template has no tool support" if not self.served.codec.supports_tools else \
            "no tool-call format is declared for its family" if fmt is None else None
        if why is None:
            return fmt, None
        if req.tool_choice != "auto":
            raise ApiError(400, f"tool_choice {req.tool_choice!r} forces a tool call, and {self.served.name} cannot "
                           f"make one: {why} ({self.served.codec.template_source or 'no chat template'})",
                           "tool_choice", "unsupported_parameter")
        return None, f"tools ignored: {why}; answered as a plain chat"

    def quick(self, req: protocol.Request, chat: bool) -> bool:
        """Whether preparing this request costs less than handing it to a thread (~0.2 ms): a prompt of at most
        QUICK_CHARS characters, no tools and no schema (a schema is compiled by the session, which may wait on its
        process). Such a request is prepared on the event loop: tokenizing 2,000 characters takes ~0.1 ms."""
        if req.tools or req.schema is not None or req.images or req.recordings:
            return False
        return _prompt_chars(req, chat) <= QUICK_CHARS

    def check_prompt_size(self, req: protocol.Request, chat: bool) -> None:
        """Refuse a prompt that cannot fit max_input_len before tokenizing it (past `bound` characters), where the
        request may not be fitted (--no-truncate; else `bounded` cuts it to the bound)."""
        limits = self.served.limits
        chars = _prompt_chars(req, chat)
        bound = self.bound()
        if chars > bound and not self.truncates(req):
            raise ApiError(400, f"the prompt is {chars} characters: more than max_input_len = {limits.max_input_len} "
                           "tokens can hold", "messages" if chat else "prompt", "context_length_exceeded")


def _prompt_chars(req: protocol.Request, chat: bool) -> int:
    """The characters of the request's prompt: its messages' contents (chat), else its prompt."""
    return sum(protocol.content_chars(m["content"]) for m in req.messages) if chat else len(req.prompt or "")
