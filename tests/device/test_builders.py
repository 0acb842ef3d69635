"""Several builders per target family: each build takes the first free device (a lock per device)."""

import fcntl

import pytest

from pipeline.builders import SshHost, first_free
from pipeline.errors import PipelineError


def test_first_free_builder_skips_a_busy_one(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_ARTIFACTS", str(tmp_path))
    urls = ["ssh://nvidia@orin-a", "ssh://nvidia@orin-b:2222"]
    with first_free(urls) as url:
        assert url == urls[0]
        with first_free(urls) as other:             # a second build while the first holds orin-a
            assert other == urls[1]
    busy = open(tmp_path / ".locks" / "orin-b_2222.lock", "w")  # noqa: SIM115 (held: the builder is busy)
    fcntl.flock(busy, fcntl.LOCK_EX)
    with first_free(urls) as url:
        assert url == urls[0]
    busy.close()


def test_ssh_urls_parse_and_bad_ones_are_named():
    assert SshHost.parse("ssh://nvidia@10.0.0.7:2222") == SshHost("nvidia", "10.0.0.7", 2222)
    assert SshHost.parse("ssh://orin").target == "orin" and SshHost.parse("ssh://orin").port == 22
    with pytest.raises(PipelineError, match="builder 'ssh://a@b:x' is not ssh://user@host"):
        SshHost.parse("ssh://a@b:x")


def test_recipe_builder_list_is_checked(project):
    from tests.workstation.test_graph import REPO

    text = (REPO / "recipes" / "tiny-llama-cpu.toml").read_text()
    (project.recipes / "two.toml").write_text(text.replace('builder = "offline"',
                                                           'builder = ["ssh://nvidia@orin-a", "ssh://orin-b:2222"]'))
    assert project.cli("plan", "two").returncode == 0
    (project.recipes / "bad.toml").write_text(text.replace('builder = "offline"', 'builder = ["local"]'))
    r = project.cli("plan", "bad")
    assert r.returncode == 2 and "build.builder" in r.stderr and "a list of builders holds ssh:// URLs only" in r.stderr


@pytest.mark.parametrize("url", ["ssh://a@b:x", "ssh://a@b:99999", "ssh://[::1", "ssh://a b"])
def test_recipe_and_builder_agree_on_every_url(url):
    """One grammar: a URL the recipe check accepts is one the builder parses (ssh://a@b:x once passed the recipe
    and failed only after the whole workstation run)."""
    from pipeline.recipe import parse_recipe
    from tests.workstation.test_recipe import base

    data = base()
    data["build"] = {"builder": url}
    with pytest.raises(PipelineError, match=r"build\.builder"):
        parse_recipe(data, "x.toml")
    with pytest.raises(PipelineError, match="is not ssh://user@host"):
        SshHost.parse(url)
