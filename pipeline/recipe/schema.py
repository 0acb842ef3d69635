"""The recipe schema: every field's type, default and bounds, and the checks across fields; read strictly.

Every problem in a recipe is collected and reported at once, each naming the file, the field, the value and what to
do. Unknown keys are errors (a misspelled key silently ignored is a wrong build later), and so are versions or
revisions written as numbers (TOML reads `6.10` as 6.1).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import os
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.builders import builder_problem
from pipeline.errors import InputError, PipelineError, Problem
from pipeline.plan.targets import load_targets
from pipeline.recipe.records import CALIB_RE, MAX_PROMPT_CHARS, Setting
from pipeline.tomlcompat import TOMLDecodeError, load_toml_text
from pipeline.workstation.calibration import source_path
from pipeline.workstation.hub import COMMIT_RE
from pipeline.workstation.tinymodel import BUILTINS, DRAFT_BUILTINS

# A recipe's name becomes directory, file and doit task names: short, and no character a shell or path treats specially
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MAX_RECIPE_BYTES = 1 * 2**20        # a recipe is a few hundred bytes; a megabyte is not one


# ----------------------------------------------------------------------------------------------------------- schema
# The fields are declared once, on the records (records.py): this engine reads their annotations and Settings.
@dataclass(frozen=True)
class Field:
    """One TOML field of a table: its name, the TOML type it must have, its default and checks, and the type the
    record holds it as."""
    name: str
    type: Any               # a Python type, a tuple of them, or a record class (a table)
    default: Any
    setting: Setting
    annotation: Any


@functools.cache
def fields_of(table: type) -> tuple[Field, ...]:
    """The TOML fields a record declares (those without a Setting, e.g. a recipe's name, are not in the file)."""
    hints = typing.get_type_hints(table)
    return tuple(Field(f.name, _toml_type(hints[f.name], f.metadata["recipe"]), f.default, f.metadata["recipe"],
                       hints[f.name]) for f in dataclasses.fields(table) if "recipe" in f.metadata)


def _toml_type(annotation: Any, s: Setting) -> Any:
    if s.toml is not None:
        return s.toml
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        (annotation,) = [a for a in typing.get_args(annotation) if a is not type(None)]
    return list if typing.get_origin(annotation) is tuple else annotation


def _type_name(t) -> str:
    return {str: "a string", int: "an integer", float: "a number", bool: "true or false", list: "a list",
            dict: "a table"}.get(t, str(t))


def check_table(file: str, path: str, table: type, value: Any, problems: list[Problem]) -> dict[str, Any]:
    """Type- and range-check a table against the record declaring it; returns its values with defaults applied."""
    if value is None:
        value = {}
    if not isinstance(value, dict):
        problems.append(Problem(file, path, value, "must be a table", f"write [{path}]"))
        return {}
    known = fields_of(table)
    names = [f.name for f in known]
    for key in value:
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}?" if close else f"known keys here: {', '.join(names)}"
            problems.append(Problem(file, f"{path}.{key}" if path else key, value[key], "unknown key", hint))
    out = {}
    for f in known:
        where = f"{path}.{f.name}" if path else f.name
        if _is_table(f.type):
            out[f.name] = check_table(file, where, f.type, value.get(f.name), problems)
        else:
            out[f.name] = check_value(file, where, f, value.get(f.name), problems)
    return out


def _is_table(t: Any) -> bool:
    return isinstance(t, type) and dataclasses.is_dataclass(t)


def build(table: type, values: dict[str, Any], recipe_file: str, **given: Any) -> Any:
    """The record from a checked table's values (nested records built, converters applied); `given`: its fields
    that are not in the TOML (a recipe's name and file)."""
    kwargs = dict(given)
    for f in fields_of(table):
        v = values[f.name]
        if f.setting.convert is not None:
            kwargs[f.name] = f.setting.convert(v, recipe_file)
        elif _is_table(f.type):
            kwargs[f.name] = build(f.type, v, recipe_file)
        elif typing.get_origin(f.annotation) is tuple:
            kwargs[f.name] = tuple(v)
        else:
            kwargs[f.name] = v
    return table(**kwargs)


def check_value(file: str, path: str, f: Field, value: Any, problems: list[Problem]) -> Any:
    """Type- and range-check one value against its field; returns the value, or its default where it has none."""
    spec = f.setting
    if value is None:
        if spec.required:
            problems.append(Problem(file, path, None, "is required",
                                    spec.doc or f"add {path} = <{_type_name(f.type)}>"))
        return f.default
    want = f.type
    ok = isinstance(value, want) and not (want in (int, float) and isinstance(value, bool))
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if ok and isinstance(value, float) and not math.isfinite(value):
        # NaN compares false with everything: a NaN limit would pass any measurement
        problems.append(Problem(file, path, value, "must be a finite number", _range(spec) or spec.doc or
                                "a decimal number such as 0.9"))
        return f.default
    if not ok:
        hint = ""
        if want is str and isinstance(value, (int, float)):
            hint = f'quote it: {path.rsplit(".", 1)[-1]} = "{value}" (versions and revisions are strings)'
        problems.append(Problem(file, path, value, f"must be {_type_name(want)}, not {type(value).__name__}",
                                hint or spec.doc or f"write {path.rsplit('.', 1)[-1]} as {_type_name(want)}"))
        return f.default
    if spec.choices and value not in spec.choices:
        problems.append(Problem(file, path, value, "is not one of the allowed values",
                                f"allowed: {', '.join(map(str, spec.choices))}"))
    if spec.min is not None and value < spec.min:
        problems.append(Problem(file, path, value, f"must be at least {spec.min}", _range(spec)))
    if spec.max is not None and value > spec.max:
        problems.append(Problem(file, path, value, f"must be at most {spec.max}", _range(spec)))
    if spec.pattern is not None and not spec.pattern.fullmatch(value):
        problems.append(Problem(file, path, value, "has the wrong form", spec.pattern_hint or spec.doc or
                                f"it must match {spec.pattern.pattern}"))
    if spec.max_items is not None and isinstance(value, list) and len(value) > spec.max_items:
        problems.append(Problem(file, path, f"{len(value)} entries", f"must list at most {spec.max_items}",
                                "remove entries (or split the recipe in two)"))
    return value


def _range(spec: Setting) -> str:
    """The allowed range of a numeric field, as a hint."""
    if spec.min is not None and spec.max is not None:
        return f"allowed: {spec.min} to {spec.max}"
    if spec.min is not None:
        return f"allowed: {spec.min} or more"
    return f"allowed: up to {spec.max}" if spec.max is not None else ""


def _source_checks(file: str, table: str, m: dict, builtins: dict, problems: list[Problem]) -> None:
    """model.* and draft.*: the keys the source needs, none it does not, a pinned revision, a known builtin."""
    src = m["source"]
    need = {"hf": ("repo", "revision"), "local": ("path",), "builtin": ("name",)}.get(src, ())
    for key in need:
        if m.get(key) is None:
            problems.append(Problem(file, f"{table}.{key}", None, f"is required when {table}.source = {src!r}",
                                    f"{table}.source = {src!r} uses: {', '.join(need)}"))
    for key in ("repo", "revision", "path", "name"):
        if m.get(key) is not None and key not in need:
            problems.append(Problem(file, f"{table}.{key}", m[key], f"does not apply to {table}.source = {src!r}",
                                    f"{table}.source = {src!r} uses: {', '.join(need)}"))
    rev = m.get("revision")
    if src == "hf" and isinstance(rev, str) and not COMMIT_RE.fullmatch(rev) and not m["allow_branch"]:
        problems.append(Problem(file, f"{table}.revision", rev, "is not a 40-character commit hash",
                                "pin the commit (the resolved hash is recorded either way), "
                                f"or set {table}.allow_branch = true to follow a branch or tag"))
    if src == "builtin" and m.get("name") and m["name"] not in builtins:
        problems.append(Problem(file, f"{table}.name", m["name"], f"unknown builtin {table}",
                                f"builtins: {', '.join(builtins)}"))


def cross_checks(file: str, v: dict, problems: list[Problem]) -> None:
    """What no single field shows: targets, sources, limits against each other, builders, files, prompts."""
    targets = load_targets()
    tlist = _target_checks(file, v["targets"], targets, problems)
    _source_checks(file, "model", v["model"], BUILTINS, problems)
    _draft_checks(file, v["draft"], problems)
    if v["base_model"]["source"] is not None:
        _source_checks(file, "base_model", v["base_model"], BUILTINS, problems)
    else:
        given = [k for k in ("repo", "revision", "path", "name") if v["base_model"].get(k) is not None]
        if given:
            problems.append(Problem(file, "base_model.source", None, f"is required when [base_model] names a "
                                    f"model ({given[0]})", "hf, local or builtin, like model.source"))
    _build_checks(file, v["build"], tlist, targets, problems)
    _calibration_checks(file, v["quantization"]["calibration"]["source"], problems)
    _prompt_checks(file, v["validation"]["prompts"], problems)
    from pipeline.workstation.audio_prompts import read_recording
    from pipeline.workstation.image_prompts import read_image
    _media_checks(file, v["validation"]["images"], v["validation"]["prompts"], problems, "images", "image",
                  read_image, "builtin:red-circle")
    _media_checks(file, v["validation"]["recordings"], v["validation"]["prompts"], problems, "recordings",
                  "recording", read_recording, "builtin:chirp-1s")
    _speech_checks(file, v["validation"]["speech"], problems)
    _round_trip_checks(file, v["validation"]["round_trip"], problems)


def transcriber_file(recipe_file: str, name: str) -> Path:
    """Where a recipe's [validation.round_trip] transcriber lies: the recipe of that name beside it."""
    return Path(recipe_file).parent / f"{name}.toml"


def _round_trip_checks(file: str, trip: dict, problems: list[Problem]) -> None:
    """The transcriber a recipe beside this one, not this one, that reads as TOML and gates its transcripts on a
    speech set (what a speech-to-text recipe has: it says how its model is asked). Read, not loaded: its own checks run
    where the graph loads it, and a transcriber naming a transcriber is not followed."""
    from pipeline.recipe.records import RoundTripSettings
    name = trip.get("transcriber")
    where = "validation.round_trip.transcriber"
    if not isinstance(name, str):
        defaults = RoundTripSettings()
        given = [k for k in ("language", "max_error_rate", "max_increase") if trip.get(k) != getattr(defaults, k)]
        if given:
            problems.append(Problem(file, where, None, f"is required when [validation.round_trip] sets {given[0]}",
                                    "name the speech-to-text recipe that hears the speech, e.g. "
                                    'transcriber = "tiny-qwen3-asr"'))
        return
    path = transcriber_file(file, name)
    if path.stem == Path(file).stem:
        problems.append(Problem(file, where, name, "names this recipe", "name a speech-to-text recipe"))
        return
    if not path.is_file():
        known = sorted(p.stem for p in path.parent.glob("*.toml") if p.stem != Path(file).stem)
        problems.append(Problem(file, where, name, f"has no recipe {path.name} beside this one",
                                f"recipes there: {', '.join(known) or '(none)'}"))
        return
    try:
        data = read_toml(path, MAX_RECIPE_BYTES)
    except PipelineError as exc:
        problems.append(Problem(file, where, name, f"does not read: {exc.message}", exc.hint or "fix that recipe"))
        return
    validation = data.get("validation")
    speech = validation.get("speech") if isinstance(validation, dict) else None
    if not isinstance(speech, dict) or not isinstance(speech.get("set"), str):
        problems.append(Problem(file, where, name, "is not a speech-to-text recipe: it has no [validation.speech] set "
                                "(which says how its model is asked, and gates its transcripts)",
                                "name a Qwen3-ASR, Nemotron-3.5-ASR or Gemma 4 audio recipe"))


def _media_checks(file: str, refs: Any, prompts: Any, problems: list[Problem], key: str, noun: str, read,
                  example: str) -> None:
    """Each image (recording) a reference that reads as a usable file (`read`: read_image or read_recording), and no
    more of them than prompts (each is asked with the prompt of its index)."""
    if not isinstance(refs, list):
        return
    if isinstance(prompts, list) and len(refs) > len(prompts):
        problems.append(Problem(file, f"validation.{key}", f"{len(refs)} {key}", f"pairs with {len(prompts)} "
                                f"prompts: each {noun} is asked with the prompt of its index",
                                f"add prompts, or remove {key}"))
    for i, ref in enumerate(refs):
        field = f"validation.{key}[{i}]"
        if not isinstance(ref, str):
            problems.append(Problem(file, field, ref, "must be a string", f'e.g. "{example}"'))
            continue
        try:
            read(ref, file, field)
        except PipelineError as exc:
            problems.append(Problem(file, field, ref, exc.message.split(f"{ref!r}", 1)[-1].strip(": ") or
                                    exc.message, exc.hint or "builtin:NAME or file:PATH"))


def _speech_checks(file: str, speech: Any, problems: list[Problem]) -> None:
    """The speech set's reference reads (a manifest: its lines), and it has utterances in each language the recipe
    declares; its recordings are read and checked by the goldens stage (a builtin set's files need not be on the
    machine that plans)."""
    if not isinstance(speech, dict) or not isinstance(speech.get("set"), str):
        if isinstance(speech, dict) and speech.get("languages"):
            problems.append(Problem(file, "validation.speech.languages", speech["languages"], "declares languages "
                                    "without a speech set to measure them on", "add validation.speech.set"))
        return
    from pipeline.workstation.speech_set import set_languages
    try:
        found = set_languages(speech["set"], file, "validation.speech.set")
    except PipelineError as exc:
        problems.append(Problem(file, "validation.speech.set", speech["set"], exc.message.split(": ", 2)[-1],
                                exc.hint or "builtin:alsa-channels or file:MANIFEST.tsv"))
        return
    for i, language in enumerate(speech.get("languages") or ()):
        if isinstance(language, str) and language.lower() not in found:
            problems.append(Problem(file, f"validation.speech.languages[{i}]", language, f"has no utterances in "
                                    f"{speech['set']} (it has {', '.join(found)})", "add recordings in that "
                                    "language to the set (file:MANIFEST.tsv), or measure it before deploying"))


def _target_checks(file: str, given: list | None, targets: dict, problems: list[Problem]) -> list:
    tlist = given or []
    if not tlist and given is not None:
        problems.append(Problem(file, "targets", tlist, "must name at least one target",
                                "see `python -m pipeline targets`"))
    for i, t in enumerate(tlist):
        if not isinstance(t, str) or t not in targets:
            problems.append(Problem(file, f"targets[{i}]", t, "unknown target", f"known: {', '.join(targets)}"))
    if len(set(map(str, tlist))) != len(tlist):
        problems.append(Problem(file, "targets", tlist, "lists a target twice", "list each target once"))
    return tlist


def _draft_checks(file: str, d: dict, problems: list[Problem]) -> None:
    given = [k for k in ("source", "repo", "revision", "path", "name") if d.get(k) is not None]
    if d["method"] is None and given:
        problems.append(Problem(file, "draft.method", None, f"is required when [draft] names a draft ({given[0]})",
                                'method = "eagle3" (a draft checkpoint of its own; "mtp" takes none)'))
    if d["method"] == "mtp":
        if given:
            problems.append(Problem(file, f"draft.{given[0]}", d[given[0]], "an MTP draft is the multi-token "
                                    "prediction layer of [model]'s own checkpoint, not a checkpoint of its own",
                                    "remove it (and source, repo, revision, path, name) from [draft]"))
        if d["max_verify_tree_size"] < d["steps"] + 1:
            problems.append(Problem(file, "draft.max_verify_tree_size", d["max_verify_tree_size"],
                                    f"the base verifies draft.steps + 1 = {d['steps'] + 1} tokens a step",
                                    f"set it to at least {d['steps'] + 1}"))
        if d["max_draft_tree_size"] < d["steps"]:
            problems.append(Problem(file, "draft.max_draft_tree_size", d["max_draft_tree_size"],
                                    f"the draft proposes draft.steps = {d['steps']} tokens a step",
                                    f"set it to at least {d['steps']}"))
    elif d["method"] is not None:
        if d["source"] is None:
            problems.append(Problem(file, "draft.source", None, "is required when draft.method is set",
                                    "hf, local or builtin, like model.source"))
        else:
            _source_checks(file, "draft", d, DRAFT_BUILTINS, problems)


def _build_checks(file: str, b: dict, tlist: list, targets: dict, problems: list[Problem]) -> None:
    if isinstance(b["max_input_len"], int) and isinstance(b["max_seq_len"], int) and \
            b["max_input_len"] >= b["max_seq_len"]:
        problems.append(Problem(file, "build.max_input_len", b["max_input_len"],
                                f"must be below build.max_seq_len ({b['max_seq_len']}) to leave room for output",
                                "max_input_len is the prompt's share of max_seq_len, e.g. half of it"))
    mode = b["power_mode"]
    for t in tlist:
        if mode is not None and t in targets and mode not in targets[t].bandwidth_gbs:
            problems.append(Problem(file, "build.power_mode", mode, f"target {t} has no such power mode",
                                    f"{t} modes: {', '.join(targets[t].bandwidth_gbs)}"))
    builder = b["builder"]
    why = builder_problem(builder)
    if why:
        problems.append(Problem(file, "build.builder", builder, why,
                                "use 'local', 'offline' or 'ssh://user@host[:port]' (a list: ssh:// URLs, e.g. "
                                "['ssh://nvidia@orin-a', 'ssh://nvidia@orin-b'])"))


def _calibration_checks(file: str, cal: Any, problems: list[Problem]) -> None:
    path = source_path(cal, file) if isinstance(cal, str) and CALIB_RE.match(cal) else None
    if path is None:
        return
    if path.suffix not in (".txt", ".jsonl"):
        problems.append(Problem(file, "quantization.calibration.source", cal, "must be a .txt or .jsonl file",
                                'one passage per line (.txt) or {"text": "..."} per line (.jsonl)'))
    elif not os.path.lexists(path):
        problems.append(Problem(file, "quantization.calibration.source", cal, f"no file {path}",
                                "paths are relative to the recipe file"))
    elif not path.is_file():
        problems.append(Problem(file, "quantization.calibration.source", cal, f"{path} is not a regular file",
                                "name the text file itself (not a directory, FIFO or device)"))


def _prompt_checks(file: str, prompts: Any, problems: list[Problem]) -> None:
    if not isinstance(prompts, list):
        return
    if not prompts:
        problems.append(Problem(file, "validation.prompts", prompts, "must list at least one prompt",
                                "the device validates the engine on them"))
    for i, p in enumerate(prompts):
        if not isinstance(p, str) or not p.strip():
            problems.append(Problem(file, f"validation.prompts[{i}]", p, "must be a non-empty string",
                                    'write it in quotes: "What is the capital of France?"'))
        elif len(p) > MAX_PROMPT_CHARS:
            problems.append(Problem(file, f"validation.prompts[{i}]", p[:40] + "...",
                                    f"is {len(p)} characters; at most {MAX_PROMPT_CHARS}",
                                    "a validation prompt is a sentence or a paragraph, not a document"))


def read_toml(path: Path, limit: int) -> dict:
    """A TOML file we were handed: a bounded read of a regular file, UTF-8, valid TOML, not nested past what the
    parser's recursion takes; anything else is one error naming the file."""
    from pipeline.files import read_regular

    try:
        text = read_regular(path, limit, follow=True).decode("utf-8")
    except PipelineError as exc:
        raise InputError([Problem(str(path), "(file)", None, exc.message.removeprefix(f"{path}: "),
                                  "point at the recipe's TOML file")]) from None
    except UnicodeDecodeError as exc:
        raise InputError([Problem(str(path), "(file)", None, f"is not UTF-8 text (byte {exc.start})",
                                  "save the recipe as UTF-8")]) from None
    try:
        return load_toml_text(text)
    except TOMLDecodeError as exc:
        raise InputError([Problem(str(path), "(file)", None, f"is not valid TOML: {exc}",
                                  "fix the line it names (https://toml.io)")]) from None
    except RecursionError:
        raise InputError([Problem(str(path), "(file)", None, "nests arrays or tables too deeply to be a recipe",
                                  "a recipe nests three levels at most")]) from None
