"""`python -m federation.spark`: the Spark job, as `federation-analyze` (federation.spark.convergence)."""

from __future__ import annotations

import sys

from federation.spark.convergence import main

sys.exit(main())
