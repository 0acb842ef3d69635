"""The README's family table, generated from the registry and the stacks (tests/workstation/test_families.py checks
that the README holds exactly this): families x backends x formats, or the refusal, as `python -m pipeline families`
prints."""

from __future__ import annotations

from pipeline.families import Family, registry

BEGIN, END = "<!-- families:begin (python -m pipeline families --markdown) -->", "<!-- families:end -->"


def backend_formats(backend: str) -> tuple[list[str], list[str]]:
    """Weight and KV formats a backend builds on any of its stacks, in the order the stacks list them."""
    from pipeline.plan.targets import load_targets
    weights: list[str] = []
    kv: list[str] = []
    for t in load_targets().values():
        for s in t.stacks:
            if s.backend == backend:
                weights += [w for w in s.weights if w not in weights]
                kv += [k for k in s.kv_cache if k not in kv]
    return weights, kv


def cell(fam: Family, backend: str) -> str:
    from pipeline.backends import family_support
    from pipeline.formats import DEFAULT_KV, KV_FORMATS, WEIGHT_FORMATS
    s = family_support(backend, fam.architecture)
    if s is None or s.refused is not None:
        return "refused: " + (s.refused if s is not None and s.refused else "not supported")
    weights, kv = backend_formats(backend)
    weights = [w for w in weights if w in (s.formats or weights)]
    kv = [k for k in kv if k in (s.kv_cache or kv) and k != DEFAULT_KV.name]
    out = ", ".join(WEIGHT_FORMATS[w].label for w in weights)
    out += f"; {', '.join(KV_FORMATS[k].label for k in kv)}" if kv else ""
    out += f" (towers: {s.text_only})" if s.text_only else ""
    if s.not_built:
        built = [WEIGHT_FORMATS[w].label for w in s.built_formats]
        out += f" ({', '.join(built)} built; the rest planned, not built yet)" if built else \
            " (planned, not built yet: `plan` sizes it, a build stops before calibrating)"
    if s.expert_formats:
        out += f" (routed experts: {', '.join(WEIGHT_FORMATS[w].label for w in s.expert_formats)} only)"
    return out + (" (with routed experts: planned, not built yet)" if s.experts_not_built else "")


def markdown() -> str:
    from pipeline import backends
    from pipeline.plan.targets import load_targets
    names = list(backends.NAMES)
    version = {s.backend: s.stack.backend_version for t in load_targets().values() for s in t.stacks}
    head = ["family", "architecture", "e.g."] + [f"{backends.get(n).label} ({version[n]})" for n in names]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for fam in registry().values():
        rows.append("| " + " | ".join([fam.name, f"`{fam.architecture}`", ", ".join(fam.examples)]
                                      + [cell(fam, n) for n in names]) + " |")
    rows.append("")
    rows.append("A format is built where the target's SM has it (`python -m pipeline plan` says which): Orin has no "
                "FP8 or NVFP4.")
    from pipeline.formats import KV_FORMATS, WEIGHT_FORMATS
    for n in names:
        for w in WEIGHT_FORMATS.values():
            for k in KV_FORMATS.values():
                if (why := backends.get(n).refuses_pair(w, k)) is not None:
                    rows.append("")
                    rows.append(f"{backends.get(n).label} {version[n]} does not build {w.label} weights with an "
                                f"{k.label}: {why}.")
    return "\n".join(rows) + "\n"


def readme_section(readme: str) -> str | None:
    """The generated part of the README (between the markers), or None without them."""
    if BEGIN not in readme or END not in readme:
        return None
    return readme.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"
