"""A class-data archive (Java's AppCDS) for Spark drivers started on this host.

Loading and verifying Spark's, Delta's and Hadoop's classes is most of what a driver spends
before its first batch. `make setup` runs one small job (:mod:`jobs.warmup`) with
``-XX:ArchiveClassesAtExit``; later drivers map the classes it loaded from the archive
instead (``-XX:SharedArchiveFile``), and share those pages with each other.

Java drops an archive whose JDK or class path changed, silently. So the archive is keyed by a
fingerprint of both (this host's JDK, the Spark runtime's jars and Sluice's): a driver gets
the option only while the fingerprint matches, and `make setup` builds a new archive when it
does not. A driver whose class path gains S3A's jars in front (``spark.driver.extraClassPath``)
would not match it either, and gets no option. An archive is an optimisation of one host:
a host without it (or with a stale one) starts its drivers as before.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from sluice.runtime import (
    ARCHIVE,
    FINGERPRINT,
    JOBS_DIR,
    LOG4J_OPTION,
    QUIET,
    archive_folder,
    fingerprint,
    java_options,
    spark_conf,
    spark_home,
    spark_jars,
    submit_env,
)


def build(force: bool = False) -> str:
    """Run :mod:`jobs.warmup` with ``-XX:ArchiveClassesAtExit`` unless the archive is current.
    What it did, in one line."""
    from sluice.ops.submit import Submission

    home, jars = spark_home(), spark_jars()
    wanted = fingerprint(home, jars)
    if wanted is None:
        return "no class-data archive: no JDK found"
    if not force and java_options(home, jars):
        return f"class-data archive is current: {archive_folder() / ARCHIVE}"
    archive_folder().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sluice-cds-") as work:
        partial = archive_folder() / f"{ARCHIVE}.partial"
        # Without S3A's jars in front of the class path: drivers that have them get no archive.
        conf = {k: v for k, v in spark_conf().items() if not k.endswith(".extraClassPath")} | {
            "spark.driver.extraJavaOptions": f"{LOG4J_OPTION} -XX:ArchiveClassesAtExit={partial} {QUIET}",
            "spark.ui.enabled": "false",
        }
        warmup = Submission(str(JOBS_DIR / "warmup.py"), [work], "sluice-warmup", conf, jars, "local[2]")
        done = subprocess.run(
            warmup.command(),
            env=os.environ | submit_env(warmup.master),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if done.returncode != 0 or not partial.exists():
            lines = (done.stdout + done.stderr).splitlines()
            errors = [line for line in lines if "Error" in line or "Exception" in line] or lines[-1:] or ["no output"]
            raise RuntimeError(f"building the class-data archive failed (exit {done.returncode}): {errors[-1]}")
    partial.replace(archive_folder() / ARCHIVE)
    (archive_folder() / FINGERPRINT).write_text(wanted + "\n")
    size = (archive_folder() / ARCHIVE).stat().st_size
    return f"class-data archive built: {archive_folder() / ARCHIVE} ({size / 2**20:.0f} MiB)"


if __name__ == "__main__":
    try:
        print(build(force="--force" in sys.argv))
    except (RuntimeError, subprocess.TimeoutExpired, FileNotFoundError) as exc:
        # Drivers start without it, as before: an archive only makes them start sooner.
        print(f"warning: {exc}", file=sys.stderr)
