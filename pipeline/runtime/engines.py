"""Serving sessions, one per backend (SESSIONS, registered per backend as RUNNERS and EXPORTERS are): open the
engine directory of a verified bundle with the plan's limits."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pipeline import contract
from pipeline.backends import edgellm, trtllm012
from pipeline.runtime import edgellm as edgellm_session
from pipeline.runtime import trtllm as trtllm_session
from pipeline.runtime.session import Limits, Session

Opener = Callable[[Path, contract.Plan, Limits], Session]
SESSIONS: dict[str, Opener] = {trtllm012.BACKEND.name: trtllm_session.open_session,
                               edgellm.BACKEND.name: edgellm_session.open_session}
