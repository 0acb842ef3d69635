import pytest

from pipeline.builders import Offline, Ssh
from pipeline.errors import InputError, PipelineError
from pipeline.recipe import Calibration, load_recipe, parse_recipe, recipe_names
from pipeline.recipe.sources import Hub

SHIPPED = ["tiny-llama-cpu", "llama3.2-3b-orin-nano", "qwen2.5-1.5b-orin-nano", "qwen3-1.7b-orin-nano-jp72",
           "llama3.1-8b-agx-orin", "llama3.1-8b-thor-fp8", "llama3.1-8b-thor-nvfp4", "llama3.1-8b-thor-nvfp4-eagle3",
           "tiny-qwen3-vl-thor", "tiny-qwen2.5-vl-orin-nano-jp72", "tiny-internvl3-thor", "tiny-qwen3_5-vl"]


def base() -> dict:
    return {"targets": ["orin-nano-8gb"],
            "model": {"source": "hf", "repo": "org/model", "revision": "0" * 40},
            "quantization": {"weights": "int4_awq"},
            "validation": {"prompts": ["hi"]}}


def problems(data: dict) -> list:
    with pytest.raises(InputError) as exc:
        parse_recipe(data, "recipes/x.toml")
    return exc.value.problems


def test_every_shipped_recipe_loads():
    assert set(SHIPPED) <= set(recipe_names())
    for name in SHIPPED:
        r = load_recipe(name)
        assert r.name == name and r.targets


def test_defaults_are_applied():
    r = parse_recipe(base(), "recipes/x.toml")
    assert r.kv_cache == "fp16"
    assert r.quantization.calibration == Calibration(source="builtin:calib-en", samples=32, seq_len=256, seed=0)
    assert r.build.builder == Offline() and not r.build.builder.builds and r.build.max_seq_len == 2048


def test_unknown_key_is_rejected_with_a_suggestion():
    data = base()
    data["quantization"]["wieghts_fmt"] = "x"
    data["quantization"]["kv_cahce"] = "int8"
    (p1, p2) = problems(data)
    assert "quantization.wieghts_fmt" in str(p1) and "unknown key" in str(p1)
    assert p2.field == "quantization.kv_cahce" and "did you mean 'kv_cache'" in str(p2)
    assert str(p2).startswith("recipes/x.toml: quantization.kv_cahce = 'int8': unknown key")


def test_version_given_as_number_is_rejected_with_quote_hint():
    data = base()
    data["model"]["revision"] = 6.2
    (p,) = problems(data)
    assert p.field == "model.revision" and p.value == 6.2
    assert "must be a string, not float" in str(p) and 'revision = "6.2"' in str(p)


def test_every_problem_is_reported_at_once():
    data = base()
    data["targets"] = ["orin-nano-9gb"]
    data["quantization"]["weights"] = "int3"
    data["build"] = {"max_batch_size": "4", "builder": "ftp://x"}
    data["validation"]["prompts"] = []
    with pytest.raises(InputError) as exc:
        parse_recipe(data, "recipes/x.toml")
    text = str(exc.value)
    assert "quantization.weights = 'int3': is not one of the allowed values" in text
    assert "build.max_batch_size = '4': must be an integer, not str" in text
    # cross-field checks run once the types are right; they are reported on the next pass
    data["quantization"]["weights"] = "int4_awq"
    data["build"]["max_batch_size"] = 4
    text = str(pytest.raises(InputError, parse_recipe, data, "recipes/x.toml").value)
    assert "targets[0] = 'orin-nano-9gb': unknown target" in text
    assert "build.builder = 'ftp://x': is not a builder" in text
    assert "validation.prompts = []: must list at least one prompt" in text
    assert text.startswith("3 problem(s):")


def test_branch_revision_needs_opt_in():
    data = base()
    data["model"]["revision"] = "main"
    (p,) = problems(data)
    assert p.field == "model.revision" and "not a 40-character commit hash" in p.message
    assert "allow_branch" in p.hint
    data["model"]["allow_branch"] = True
    assert parse_recipe(data, "x.toml").model == Hub("model", "org/model", "main", allow_branch=True)


def test_a_trailing_newline_does_not_slip_past_a_pattern():
    """Patterns are matched to the end of the value ($ in Python's re.match lets one final newline through): a
    revision, a repo id and a recipe name with a trailing newline are refused."""
    data = base()
    data["model"]["repo"] = "org/model\n"
    assert [p.field for p in problems(data)] == ["model.repo"]
    data = base()
    data["model"]["revision"] = "0" * 40 + "\n"      # checked once the fields' types are right (a second pass)
    (p,) = problems(data)
    assert p.field == "model.revision" and "not a 40-character commit hash" in p.message
    with pytest.raises(InputError, match=r"is not a recipe name"):
        parse_recipe(base(), "recipes/x.toml", name="x\n")


def test_fields_that_do_not_apply_to_the_source():
    data = base()
    data["model"] = {"source": "local", "repo": "a/b"}
    ps = {p.field: p for p in problems(data)}
    assert "is required when model.source = 'local'" in ps["model.path"].message
    assert "does not apply to model.source = 'local'" in ps["model.repo"].message


def test_input_len_must_leave_room_and_ssh_builder_is_accepted():
    data = base()
    data["build"] = {"max_input_len": 2048, "max_seq_len": 2048}
    (p,) = problems(data)
    assert p.field == "build.max_input_len" and "below build.max_seq_len (2048)" in p.message
    data["build"] = {"builder": "ssh://nvidia@orin-agx.local:2222"}
    assert parse_recipe(data, "x.toml").build.builder == Ssh(("ssh://nvidia@orin-agx.local:2222",))


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(PipelineError, match="(?s)no recipe 'nope'.*known recipes: .*tiny-llama-cpu"):
        load_recipe("nope")
    bad = tmp_path / "bad.toml"
    bad.write_text("targets = [\n")
    with pytest.raises(InputError, match="bad.toml: is not valid TOML"):
        load_recipe(str(bad))


def test_power_mode_must_exist_on_every_target():
    data = base()
    data["targets"] = ["orin-nano-8gb-super", "orin-nano-8gb"]
    data["build"] = {"power_mode": "MAXN_SUPER"}
    (p,) = problems(data)
    assert p.field == "build.power_mode" and "target orin-nano-8gb has no such power mode" in p.message
    assert "15W" in p.hint


def test_calibration_file_must_exist(tmp_path):
    data = base()
    data["quantization"]["calibration"] = {"source": "file:calib.txt"}
    (p,) = problems(data)
    assert p.field == "quantization.calibration.source" and "no file" in p.message
    data["quantization"]["calibration"] = {"source": "file:calib.csv"}
    (p,) = problems(data)
    assert "must be a .txt or .jsonl file" in p.message
    (tmp_path / "calib.txt").write_text("some text")
    data["quantization"]["calibration"] = {"source": "file:calib.txt"}
    assert parse_recipe(data, str(tmp_path / "r.toml")).quantization.calibration.source == "file:calib.txt"


@pytest.mark.parametrize("text, kind, value", [("builtin:calib-en", "builtin", "calib-en"),
                                               ("file:data/x.jsonl", "file", "data/x.jsonl"),
                                               ("hf:org/set:train", "hf", "org/set:train")])
def test_a_text_source_is_parsed_once_into_its_kind(tmp_path, text, kind, value):
    from pipeline.texts import CORPUS_DIR, TextSource
    s = TextSource.parse(text)
    assert (s.kind, s.value, str(s)) == (kind, value, text)
    where = s.path(tmp_path / "r.toml")
    assert where == {"builtin": CORPUS_DIR / "calib-en.txt", "file": tmp_path / "data/x.jsonl", "hf": None}[kind]
    if kind == "builtin":
        assert where is not None and where.is_file()


@pytest.mark.parametrize("text", ["calib-en", "s3:bucket/x", "file:", ":x"])
def test_an_unknown_text_source_is_one_error_saying_what_is_known(text):
    from pipeline.errors import PipelineError
    from pipeline.texts import TextSource
    with pytest.raises(PipelineError, match="unknown text source") as e:
        TextSource.parse(text)
    assert "builtin:NAME, file:PATH or hf:DATASET" in e.value.hint
