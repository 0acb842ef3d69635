"""A text-to-speech recipe's round trip on the workstation, up to its build (the build itself: test_tts_build.py):
[validation.round_trip] checked where the recipe is read, the transcriber recipe's fetch a stage input of the
text-to-speech recipe's goldens (the graph's one input from another recipe), and only that recipe's fetch (and the plan
that gates it) lent to a build that selects the text-to-speech recipe alone."""

import dataclasses

import pytest
from conftest import REPO

from pipeline.errors import InputError
from pipeline.graph.stage import Input, RecipeGraph, stage_deps
from pipeline.graph.stages import FETCH, GOLDENS, PLAN
from pipeline.recipe import load_recipe, parse_recipe
from pipeline.tomlcompat import load_toml_text

TTS, ASR, RNNT = "tiny-qwen3-tts", "tiny-qwen3-asr", "tiny-nemotron-asr"


def _recipes(tmp_path, *names):
    for name in names:
        (tmp_path / f"{name}.toml").write_text((REPO / "recipes" / f"{name}.toml").read_text())
    return tmp_path


def _problems(tmp_path, trip: dict, name: str = TTS) -> list:
    data = load_toml_text((REPO / "recipes" / f"{TTS}.toml").read_text())
    data["validation"]["round_trip"] = trip
    with pytest.raises(InputError) as exc:
        parse_recipe(data, str(tmp_path / f"{name}.toml"))
    return exc.value.problems


def test_the_transcriber_is_a_speech_to_text_recipe_beside_this_one(tmp_path):
    _recipes(tmp_path, ASR, "tiny-llama-cpu", "qwen3-tts-0.6b-thor")
    (p,) = _problems(tmp_path, {"transcriber": "tiny-qwen3-asr-x"})
    assert (p.field, p.value) == ("validation.round_trip.transcriber", "tiny-qwen3-asr-x")
    assert "has no recipe tiny-qwen3-asr-x.toml beside this one" in str(p) and "tiny-qwen3-asr" in p.hint
    (p,) = _problems(tmp_path, {"transcriber": "tiny-llama-cpu"})
    assert "tiny-llama-cpu" in str(p) and "is not a speech-to-text recipe: it has no [validation.speech] set" in str(p)
    (p,) = _problems(tmp_path, {"transcriber": "qwen3-tts-0.6b-thor"})     # a speaker, not a listener
    assert "is not a speech-to-text recipe" in str(p)
    (p,) = _problems(tmp_path, {"transcriber": TTS})
    assert "names this recipe" in str(p)
    (p,) = _problems(tmp_path, {"max_error_rate": 0.2})
    assert p.field == "validation.round_trip.transcriber" and "is required when [validation.round_trip] sets " \
        "max_error_rate" in str(p)
    (p,) = _problems(tmp_path, {"transcriber": "../tiny-qwen3-asr"})      # a name, never a path out of the directory
    assert p.field == "validation.round_trip.transcriber" and "a recipe's name" in str(p)
    (p,) = _problems(tmp_path, {"transcriber": ASR, "language": "English"})
    assert p.field == "validation.round_trip.language" and "ISO 639" in str(p)
    (p,) = _problems(tmp_path, {"transcriber": ASR, "max_error_rate": 2.01})
    assert p.field == "validation.round_trip.max_error_rate"
    (tmp_path / "broken.toml").write_text("[validation\n")
    (p,) = _problems(tmp_path, {"transcriber": "broken"})
    assert "does not read" in str(p)
    # the edges: 2.0 is taken, as is the shipped transcriber
    data = load_toml_text((REPO / "recipes" / f"{TTS}.toml").read_text())
    data["validation"]["round_trip"] = {"transcriber": ASR, "max_error_rate": 2.0}
    assert parse_recipe(data, str(tmp_path / f"{TTS}.toml")).validation.round_trip.max_error_rate == 2.0


def test_a_model_that_does_not_speak_is_not_heard_back(tmp_path):
    """The plan refuses a round trip on a recipe whose model does not speak (a speech-to-text one here)."""
    from pipeline.recipe import config_for, plan_recipe

    def plan(name):
        r = load_recipe(str(tmp_path / f"{name}.toml"))
        return plan_recipe(r, r.targets[0], *config_for(r, r.model))
    _recipes(tmp_path, ASR, RNNT, TTS)
    text = (tmp_path / f"{RNNT}.toml").read_text() + f'\n[validation.round_trip]\ntranscriber = "{ASR}"\n'
    (tmp_path / "rnnt-heard.toml").write_text(text)
    refused = plan("rnnt-heard")
    assert not refused.ok and any(f"names a transcriber ({ASR}), and" in r and "is not a text-to-speech model" in r
                                  for r in refused.refused), refused.refused
    assert refused.device_build_commands is None and plan(RNNT).ok and plan(TTS).ok
    (tmp_path / "text-heard.toml").write_text((REPO / "recipes" / "tiny-llama-cpu.toml").read_text()
                                              + f'\n[validation.round_trip]\ntranscriber = "{ASR}"\n')
    assert any("is not a text-to-speech model" in r for r in plan("text-heard").refused)


def test_the_goldens_read_the_transcriber_recipe_s_fetch(tmp_path, monkeypatch):
    """The text-to-speech goldens' key holds the transcriber recipe's fetch (another recipe's stage: the same
    content-keyed directory that recipe's own build fetches into) and how that recipe asks; its task depends on that
    recipe's fetch task. A recipe without a transcriber reads nothing of another."""
    monkeypatch.setenv("PIPELINE_ARTIFACTS", str(tmp_path / "artifacts"))
    _recipes(tmp_path, TTS, ASR, RNNT)
    tts = load_recipe(str(tmp_path / f"{TTS}.toml"))
    g = RecipeGraph(tts)
    spec = g.spec(GOLDENS)
    asr_fetch = RecipeGraph(load_recipe(str(tmp_path / f"{ASR}.toml"))).spec(FETCH)
    assert asr_fetch in spec.inputs and g.spec(FETCH) in spec.inputs
    assert spec.identity["transcriber_asks"] == ["", 32, 15]
    assert f"fetch:{ASR}" in stage_deps(GOLDENS, tts) and f"fetch:{TTS}" in stage_deps(GOLDENS, tts)
    # another transcriber: another key, another input
    rnnt = dataclasses.replace(tts, validation=dataclasses.replace(
        tts.validation, round_trip=dataclasses.replace(tts.validation.round_trip, transcriber=RNNT)))
    other = RecipeGraph(rnnt).spec(GOLDENS)
    assert other.id != spec.id and asr_fetch not in other.inputs
    assert RecipeGraph(load_recipe(str(tmp_path / f"{RNNT}.toml"))).spec(FETCH) in other.inputs
    # none named: nothing of another recipe read
    alone = dataclasses.replace(tts, validation=dataclasses.replace(
        tts.validation, round_trip=dataclasses.replace(tts.validation.round_trip, transcriber=None)))
    assert RecipeGraph(alone).spec(GOLDENS).inputs == (g.spec(FETCH),) + tuple(
        s for s in spec.inputs if s.stage not in (FETCH.name,))
    assert not [d for d in stage_deps(GOLDENS, alone) if ASR in d]
    # another recipe's input is a stage every recipe has once: a per-target one is a mistake in the table
    with pytest.raises(ValueError, match="one per recipe"):
        Input(PLAN, of=lambda r: None)


def test_a_build_of_the_speaker_alone_fetches_its_transcriber_and_builds_nothing_else_of_it(project):
    _recipes(project.recipes, TTS, ASR)
    listed = project.doit("list", "--all", f"recipe={TTS}").stdout
    tasks = {line.split()[0] for line in listed.splitlines() if ":" in line.split()[0]}
    assert {f"fetch:{ASR}", f"plan:{ASR}"} <= tasks
    assert not {f"{s}:{ASR}" for s in ("quantize", "export", "goldens", "accuracy", "package", "build")} & tasks
    # both selected: the transcriber's own tasks, once
    both = project.doit("list", "--all", f"recipe={TTS},{ASR}").stdout
    assert both.count(f"\nfetch:{ASR} ") == 1 and f"\nbuild:{ASR} " in both
    # a transcriber recipe that does not load: the speaker is refused before any stage, naming both
    (project.recipes / f"{ASR}.toml").write_text((project.recipes / f"{ASR}.toml").read_text()
                                                 .replace('targets = ["orin-nano-8gb"]', 'targets = ["orin-nano-9gb"]'))
    proc = project.doit("build", f"recipe={TTS}", check=False)
    assert proc.returncode == 2 and f"recipe {TTS} reads the fetch stage of recipe {ASR}, which is invalid" in \
        proc.stderr and "orin-nano-9gb" in proc.stderr, proc.stderr
    assert not (project.artifacts / TTS / "fetch").exists()
    # every recipe selected: the speaker is named invalid with it, and the others go on
    listed = project.doit("list", check=False)
    assert f"error: recipe {TTS} is invalid, skipped (the others go on): recipe {TTS} reads the fetch stage" in \
        listed.stderr, listed.stderr
