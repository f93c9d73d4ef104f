"""The Spark session: local and quiet by default, whatever spark-submit chose otherwise.

Theory of operation
-------------------
`federation-analyze` starts its own JVM: we choose the master
(`local[2]` unless `--master` says otherwise) and, for local masters, bind
the driver to 127.0.0.1 with no UI, so a run opens no port beyond loopback.
Under `spark-submit` (the JVM exists already and hands us
PYSPARK_GATEWAY_PORT) the submitter's master and settings win; we only add
what is harmless everywhere: few shuffle partitions for small logs, no
console progress bar. Logs are errors only: `log4j2.properties` (beside this file) for a
JVM we start, `setLogLevel("ERROR")` for one we join.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

LOG4J_CONFIG = Path(__file__).resolve().with_name("log4j2.properties")
DEFAULT_MASTER = "local[2]"


def submitted() -> bool:
    """True when spark-submit (or the pyspark shell) started this process and owns the JVM."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def build_session(master: str | None = None, shuffle_partitions: int = 8, driver_memory: str = "3g",
                  app_name: str = "federation-convergence") -> Any:
    """A SparkSession: the existing one if any, else a new one configured as the module docstring says."""
    try:
        from pyspark.sql import SparkSession
    except ImportError as error:  # pragma: no cover - depends on the machine
        raise SystemExit(f"error: pyspark is not installed ({error}); run `pip install -e '.[spark]'` "
                         "(PySpark 4.3 needs Java 17: `apt-get install -y openjdk-17-jre-headless`)") from None
    builder = SparkSession.builder.appName(app_name)
    builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    builder = builder.config("spark.sql.session.timeZone", "UTC")
    if not submitted():
        master = master or DEFAULT_MASTER
        builder = builder.master(master)
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        builder = builder.config("spark.driver.memory", driver_memory)
        # The parallel collector: a local job is one batch, throughput is all that counts (G1, the default,
        # cost about 15% more CPU on the 10-million-event benchmark, docs/benchmarks.md). -DontCompileHugeMethods:
        # the JIT compiles methods of more than 8,000 bytecodes too; Spark generates one for the read's parse
        # and classification stage, which otherwise runs interpreted (several times slower).
        builder = builder.config("spark.driver.extraJavaOptions",
                                 f"-Dlog4j2.configurationFile={LOG4J_CONFIG.as_uri()} -XX:+UseParallelGC "
                                 "-XX:-DontCompileHugeMethods")
        if master.startswith("local"):
            os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
            builder = (builder.config("spark.driver.host", "127.0.0.1")
                       .config("spark.driver.bindAddress", "127.0.0.1")
                       .config("spark.ui.enabled", "false"))
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
