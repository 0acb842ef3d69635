"""Errors a user can act on. Each carries what went wrong and what to do; the CLI prints them without a traceback."""

from __future__ import annotations

from dataclasses import dataclass


class PipelineError(Exception):
    """An error caused by input or environment, reported to the user as text (no traceback)."""

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}\n  hint: {self.hint}" if self.hint else self.message


@dataclass(frozen=True)
class Problem:
    """One defect in an input file: where, what value, what is wrong, what to do."""

    file: str
    field: str
    value: object
    message: str
    hint: str = ""

    def __str__(self) -> str:
        # a problem with the whole file names no field or value
        text = f"{self.file}: {self.message}" if self.field == "(file)" else \
            f"{self.file}: {self.field} = {self.value!r}: {self.message}"
        return text + (f" (hint: {self.hint})" if self.hint else "")


class InputError(PipelineError):
    """Several problems in one input, reported together so the user fixes them in one pass."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        lines = [f"{len(self.problems)} problem(s):"] + [f"  - {p}" for p in self.problems]
        super().__init__("\n".join(lines))

