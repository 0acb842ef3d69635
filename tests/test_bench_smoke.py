"""Each benchmark at a tiny size (bench/smoke.py): a change that breaks one fails the tests, and CI."""

import pytest

from bench.smoke import RUNS, scripts, smoke

pytestmark = pytest.mark.integration      # each runs as a subprocess


def test_every_benchmark_has_a_smoke_run():
    assert set(scripts()) == set(RUNS) and "quantize.py" in RUNS


@pytest.mark.parametrize("name", sorted(RUNS))
def test_the_benchmark_runs_to_its_verdict(name, request):
    # serve.py measures the default recipe, built first where it is not: the tests' own build of it (conftest's kit,
    # shared with the serve and device tests) is that recipe, built the same way
    env = request.getfixturevalue("kit")[0].env if name == "serve.py" else None
    ok, text = smoke(name, env)
    assert ok, text
