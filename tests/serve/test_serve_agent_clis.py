"""The coding agents users point at a local model, against `python -m pipeline serve` on the agent profile (the
shipped tiny-agent recipe: a 32,768-token input, a 40,960-token sequence, built here): Claude Code (`claude -p`,
Anthropic's Messages API) and Codex CLI (`codex exec`, the Responses API, streamed) each finish a one-line task with
exit 0, their system prompts and tools (10-30k tokens) taken whole. The CLIs are the real ones from npm, pinned and
installed by `./bootstrap.sh --test-tools` (.venv/agent-clis); each runs with a HOME of its own. The recipe passes the
family suite too (its kit validated on the recorded Orin Nano, `serve` answering its goldens)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, build_shipped_recipe, device_on_boards

from tests.conformance import *  # noqa: F403  (the family suite, on this module's rows)
from tests.families import rows_of
from tests.serving import Served

pytestmark = pytest.mark.integration
CLIS = REPO / ".venv" / "agent-clis" / "node_modules" / ".bin"
RECIPE = "tiny-agent"
FAMILIES = rows_of(__file__)
BOARDS = {r: b for f in FAMILIES for r, b in f.boards.items()}


def cli(name: str) -> Path:
    path = CLIS / name
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} is missing: run ./bootstrap.sh --test-tools (it installs the agent CLIs from npm)")
    return path


@pytest.fixture(scope="module")
def built_agent(tmp_path_factory):
    return build_shipped_recipe(tmp_path_factory.mktemp("agent-profile") / "proj", RECIPE, BOARDS)


@pytest.fixture(scope="module")
def validated_agent(built_agent, tmp_path_factory):
    project, kits, _ = built_agent
    return device_on_boards(project, kits, BOARDS, tmp_path_factory.mktemp)


@pytest.fixture(scope="module")
def agent_server(built_agent):
    project, _, out = built_agent
    assert "batch 2, seq 40960: fits" in out, out
    s = Served([RECIPE, "--api-key", "agent-key"], project.env, REPO, project.root / "server.log")
    try:
        yield s
    finally:
        s.stop()


def _home(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    return {"HOME": str(home), "PATH": os.environ["PATH"], "LANG": "C.UTF-8", "NO_COLOR": "1"}


def _requests(server: Served, path: str, status: int) -> float:
    return server.metrics().get(f'jetson_llm_requests_total{{endpoint="{path}",status="{status}"}}', 0.0)


def test_claude_code_finishes_a_one_line_task(agent_server, tmp_path):
    before = _requests(agent_server, "/v1/messages", 200)
    env = dict(_home(tmp_path), ANTHROPIC_BASE_URL=agent_server.url, ANTHROPIC_API_KEY="agent-key",
               ANTHROPIC_SMALL_FAST_MODEL=RECIPE, DISABLE_TELEMETRY="1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
               DISABLE_AUTOUPDATER="1")
    proc = subprocess.run([str(cli("claude")), "-p", "say hi", "--model", RECIPE], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.strip() and "API Error" not in proc.stdout
    assert _requests(agent_server, "/v1/messages", 200) > before       # it spoke the Messages API, and got answers


def test_codex_exec_finishes_a_one_line_task(agent_server, tmp_path):
    before = _requests(agent_server, "/v1/responses", 200)
    env = _home(tmp_path)
    codex_home = tmp_path / "codex"
    codex_home.mkdir()
    # Codex speaks only the Responses API (wire_api "chat" is refused at config load)
    (codex_home / "config.toml").write_text(f"""model = "{RECIPE}"
model_provider = "jetson"

[model_providers.jetson]
name = "jetson"
base_url = "{agent_server.url}/v1"
wire_api = "responses"
env_key = "JETSON_API_KEY"
""")
    proc = subprocess.run([str(cli("codex")), "exec", "--skip-git-repo-check", "say hi"], cwd=tmp_path,
                          env=dict(env, CODEX_HOME=str(codex_home), JETSON_API_KEY="agent-key"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.strip() and "ERROR" not in proc.stdout + proc.stderr
    assert _requests(agent_server, "/v1/responses", 200) > before
    log = agent_server.log.read_text()
    assert "tools not offered: namespace, web_search" in log        # its hosted tools, said, not silently dropped
