"""A fleet update that cannot brick a fleet: the boards of an inventory updated in phases (a canary first), each board
gated after the swap and rolled back by itself when its gate fails, the rollout aborted past its failure criteria,
and every decision recorded.

    inventory.py    the boards, read from the Ansible inventory the fleet playbook already uses
    phases.py       the rollout plan: phases as counts or percentages, the pause between them, the abort criteria
    release.py      what is rolled out: one bundle or a board's set, verified on the controller first
    board.py        one board over SSH: its settings and what its --work holds (serving now, kept for a rollback)
    controller.py   the rollout, board by board over SSH: install --keep-previous, restart, gate, commit or rollback
    health.py       a board's health gate through its own HTTP endpoint (start, goldens, stability, memory)
    record.py       the rollout record (--work/rollout.json): each board's decision; what a resumed rollout reads
    command.py      `python -m pipeline rollout plan | run | continue`, `python -m pipeline fleet status`
"""
