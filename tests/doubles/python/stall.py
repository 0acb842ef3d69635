"""For the TEST DOUBLES: a builder or runtime that hangs, as a real one does when it deadlocks or thrashes.

DOUBLE_STALL=<phase> (build or runtime) makes that double write its pid to $DOUBLE_STALL_PIDFILE and sleep; with
DOUBLE_STALL_CHILD=1 it first starts a grandchild of the device command in a new session (as MPI launchers and
build workers do), whose pid goes to $DOUBLE_STALL_PIDFILE.child: the death signal does not reach it, the next
run's cleanup must.
"""
import os
import subprocess
import sys
import time


def stall_if_asked(phase: str) -> None:
    if os.environ.get("DOUBLE_STALL") != phase:
        return
    pidfile = os.environ["DOUBLE_STALL_PIDFILE"]
    if os.environ.get("DOUBLE_STALL_CHILD"):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
        with open(pidfile + ".child.tmp", "w") as fh:
            fh.write(str(child.pid))
        os.replace(pidfile + ".child.tmp", pidfile + ".child")
    with open(pidfile + ".tmp", "w") as fh:
        fh.write(str(os.getpid()))
    os.replace(pidfile + ".tmp", pidfile)
    time.sleep(600)
