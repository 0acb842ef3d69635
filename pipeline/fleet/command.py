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


def add_parser(sub) -> None:
    r = sub.add_parser("rollout", help="a staged fleet update: phases, health gates, rollback (plan)",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = r.add_subparsers(dest="rollout", metavar="VERB", required=True)
    p = verbs.add_parser("plan", help="print the phases over the inventory's boards; touches nothing",
                         description=DESCRIPTION)
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
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=_plan_cmd)


def _plan_cmd(args) -> int:
    from pipeline.errors import PipelineError
    from pipeline.fleet.inventory import read_inventory
    if args.abort_after < 1:
        raise PipelineError(f"--abort-after {args.abort_after}: at least 1", "give a number of boards")
    boards = read_inventory(Path(args.inventory), args.group)
    abort = AbortCriteria(args.abort_after, fraction(args.abort_failed, "--abort-failed"),
                          tuple(t.strip() for t in args.abort_on.split(",") if t.strip()))
    plan = plan_rollout([b.name for b in boards], args.phases.split(","),
                        args.canary.split(",") if args.canary else None, duration(args.pause, "--pause"),
                        args.wait, abort)
    if args.json:
        print(json.dumps({"phases": plan.phases, "targets": plan.targets, "pause_s": plan.pause_s,
                          "wait": plan.wait, "abort": {"min_boards": abort.min_boards,
                                                       "max_failed": abort.max_failed,
                                                       "counted": list(abort.counted)}}, indent=1))
    else:
        print("\n".join(plan.lines()))
    return 0
