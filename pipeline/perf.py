"""`python -m pipeline.perf fit | extract REFERENCE.csv`: the decode and prefill models' data and fits.

The models live in pipeline/plan/perf.py (decode) and pipeline/plan/prefill.py (time to first token); this entry
point is the short name the README and the plan's notes use.
"""

import sys

from pipeline.plan.perf import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
