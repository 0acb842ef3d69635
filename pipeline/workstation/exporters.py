"""The workstation's export step of each engine backend, registered per backend (pipeline/backends holds what the
backends are; this half holds what it runs for each). Each exporter writes the backend's payload into the job's
payload directory and returns its typed export record; tests check that every backend has one."""

from __future__ import annotations

from collections.abc import Callable

from pipeline.backends import ExportJob, edgellm, trtllm012
from pipeline.contract import ExportRecord


def _trtllm_checkpoint(job: ExportJob) -> ExportRecord:
    from pipeline.workstation.trtllm_export import export_job
    return export_job(job)


def _edgellm_onnx(job: ExportJob) -> ExportRecord:
    from pipeline.workstation.edgellm_export import export_job
    return export_job(job)


EXPORTERS: dict[str, Callable[[ExportJob], ExportRecord]] = {
    trtllm012.BACKEND.name: _trtllm_checkpoint,
    edgellm.BACKEND.name: _edgellm_onnx,
}
