"""`python -m pipeline rollout plan`: the rollout's phases over an inventory, checked and printed before anything is
touched (a phase that adds no board, a target past the fleet, an unknown canary or failure type is an error here)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pipeline.fleet.phases import FAILURES, AbortCriteria, duration, fraction, plan_rollout

DESCRIPTION = """Plan a staged rollout of an engine bundle over a fleet: phases as counts or percentages of the
inventory's boards, cumulative and rounded down (1,25%,100%: a canary, a quarter of the fleet in all, then every
board), a pause or a wait between phases, and when to abort (more than --abort-failed of at least --abort-after
decided boards failed, counting the --abort-on failure types)."""


def _plan_args(p) -> None:
    p.add_argument("--inventory", required=True, metavar="FILE", help="the Ansible INI inventory (the fleet "
                   "playbook's)")
    p.add_argument("--group", default="all", help="the inventory group to update (default: every host)")
    p.add_argument("--phases", required=True, help="cumulative targets, counts or percentages, e.g. 1,25%%,100%%")
    p.add_argument("--canary", help="the first phase's boards, comma-separated (default: the inventory's first)")
    between = p.add_mutually_exclusive_group()
    between.add_argument("--pause", default="0", help="after each phase's gates pass, wait this long (30s, 10m, 1h)")
    between.add_argument("--wait", action="store_true", help="after each phase, wait for `rollout continue`")
    p.add_argument("--abort-failed", default="0%", help="the failed share of decided boards that is tolerated "
                   "(default 0%%: the first failure aborts)")
    p.add_argument("--abort-after", type=int, default=1, metavar="N",
                   help="judge the failed share once at least N boards are decided (default 1)")
    p.add_argument("--abort-on", default=",".join(FAILURES),
                   help=f"failure types that count (default all: {', '.join(FAILURES)})")
    p.add_argument("--parallel", type=int, default=1, metavar="N",
                   help="update up to N boards of a phase at once (default 1); past the abort criteria, boards "
                   "under way finish their gate and no new one starts")


def add_parser(sub) -> None:
    r = sub.add_parser("rollout", help="a staged fleet update: phases, health gates, automatic rollback",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = r.add_subparsers(dest="rollout", metavar="VERB", required=True)
    p = verbs.add_parser("plan", help="print the phases over the inventory's boards; touches nothing",
                         description=DESCRIPTION)
    _plan_args(p)
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=_plan_cmd)
    g = verbs.add_parser("run", help="roll a bundle (or a board's set) out: each board installed, gated through its "
                         "own HTTP endpoint, committed or rolled back", description=DESCRIPTION)
    g.add_argument("bundle", metavar="BUNDLE", nargs="+", help="the engine bundle (`device --out`), verified here "
                   "first; several: a board's set, installed and gated together on each board (`install B1 B2`)")
    _plan_args(g)
    _gate_args(g)
    g.add_argument("--work", required=True, help="the controller's directory: the rollout record (rollout.json) "
                   "and its lock; a killed rollout resumes from it")
    g.set_defaults(func=_run_cmd)
    c = verbs.add_parser("continue", help="go on with a rollout waiting after a phase (--wait), or resume one "
                         "whose controller stopped")
    c.add_argument("--work", required=True, help="the rollout's --work")
    _gate_args(c)
    c.set_defaults(func=_continue_cmd)
    f = sub.add_parser("fleet", help="which bundle each board of an inventory runs")
    fv = f.add_subparsers(dest="fleet", metavar="VERB", required=True)
    st = fv.add_parser("status", help="each board's installed bundle and the one kept for a rollback")
    st.add_argument("--inventory", required=True, metavar="FILE")
    st.add_argument("--group", default="all")
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=_status_cmd)


def _gate_args(p) -> None:
    p.add_argument("--start-timeout", default="120s", help="the served model must be up within this (default 120s)")
    p.add_argument("--stable", default="30s", help="... and stay up this long after its goldens (default 30s)")
    p.add_argument("--api-key", help="the boards' serve key, where they have one")
    p.add_argument("--pubkey", help="trust this public key too (the bundle's signer)")


def _planned(args):
    from pipeline.errors import PipelineError
    from pipeline.fleet.inventory import read_inventory
    if args.abort_after < 1:
        raise PipelineError(f"--abort-after {args.abort_after}: at least 1", "give a number of boards")
    boards = read_inventory(Path(args.inventory), args.group)
    abort = AbortCriteria(args.abort_after, fraction(args.abort_failed, "--abort-failed"),
                          tuple(t.strip() for t in args.abort_on.split(",") if t.strip()))
    plan = plan_rollout([b.name for b in boards], args.phases.split(","),
                        args.canary.split(",") if args.canary else None, duration(args.pause, "--pause"),
                        args.wait, abort, args.parallel)
    return boards, plan, abort


def _limits(args):
    from pipeline.fleet.health import GateLimits
    return GateLimits(float(duration(args.start_timeout, "--start-timeout")), float(duration(args.stable, "--stable")),
                      args.api_key)


def _run_cmd(args) -> int:
    from pipeline.fleet import controller
    boards, plan, _ = _planned(args)
    print("\n".join(plan.lines()), flush=True)
    return controller.run([Path(b) for b in args.bundle], boards, f"{Path(args.inventory).absolute()}#{args.group}",
                          plan, Path(args.work), _limits(args), args.pubkey, say=_say)


def _continue_cmd(args) -> int:
    from pipeline.errors import PipelineError
    from pipeline.fleet import controller
    from pipeline.fleet.inventory import read_inventory
    from pipeline.fleet.phases import RolloutPlan
    from pipeline.fleet.record import RolloutRecord
    record = RolloutRecord.load(Path(args.work))
    if record is None or record.state not in ("running", "waiting"):
        raise PipelineError(f"{args.work}: no rollout to continue ({'none' if record is None else record.state})",
                            "start one with `rollout run`")
    inventory, _, group = record.inventory.rpartition("#")
    boards = read_inventory(Path(inventory), group)
    p = record.plan
    plan = RolloutPlan(p["phases"], [str(len(x)) for x in p["phases"]], p["pause_s"], p["wait"],
                       AbortCriteria(p["abort"]["min_boards"], p["abort"]["max_failed"],
                                     tuple(p["abort"]["counted"])), p.get("parallel", 1))
    return controller.run([Path(p) for p in record.paths], boards, record.inventory, plan, Path(args.work),
                          _limits(args), args.pubkey, say=_say)


def _status_cmd(args) -> int:
    from pipeline.fleet.board import Link, installs_on, label
    from pipeline.fleet.inventory import read_inventory
    rows = []
    for board in read_inventory(Path(args.inventory), args.group):
        held = installs_on(Link(board))
        now, kept = held if held else (None, None)
        rows.append({"board": board.name, "host": f"{board.host}:{board.port}", "reachable": held is not None,
                     "bundle": label(now), "digest": now.digest if now else None, "previous": label(kept),
                     "previous_digest": kept.digest if kept else None})
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for r in rows:
        state = r["bundle"] or "nothing installed" if r["reachable"] else "unreachable"
        rollback = f"  (kept for a rollback: {r['previous']})" if r["previous"] else ""
        print(f"{r['board']:16} {r['host']:22} {state}{rollback}")
    return 0


def _say(line: str) -> None:
    import sys
    print(line, file=sys.stderr, flush=True)


def _plan_cmd(args) -> int:
    boards, plan, abort = _planned(args)
    if args.json:
        print(json.dumps({"phases": plan.phases, "targets": plan.targets, "pause_s": plan.pause_s,
                          "wait": plan.wait, "parallel": plan.parallel, "abort": {"min_boards": abort.min_boards,
                                                       "max_failed": abort.max_failed,
                                                       "counted": list(abort.counted)}}, indent=1))
    else:
        print("\n".join(plan.lines()))
    return 0
