#!/usr/bin/env python3
"""The Spark job from a checkout: `python spark/convergence.py --events 'RUN/*.jsonl' --out DIR`.

The job lives in `federation.spark` (installed: `federation-analyze`, or
`python -m federation.spark`); this file only makes it runnable from the
repository, also as spark-submit's job file:

    spark-submit --master URL spark/convergence.py --events 'hdfs:///runs/7/*.jsonl' --out DIR

docs/spark.md is the guide, `--help` the flags.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Run as a file, this folder is sys.path[0]; the repository must come first, so that `federation` is this
# checkout's and not an installed copy.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [entry for entry in sys.path if Path(os.path.abspath(entry or ".")) != _HERE]
sys.path.insert(0, str(_HERE.parent))

from federation.spark.convergence import main  # noqa: E402 - after the path set-up above

if __name__ == "__main__":
    sys.exit(main())
