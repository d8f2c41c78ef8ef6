"""The drivers' class-data archive that `make setup` builds is one Java maps (sluice.ops.cds)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from sluice.ops.submit import Submission
from sluice.runtime import class_data_options, spark_jars, submit_env

pytestmark = pytest.mark.integration


def test_a_driver_maps_the_archive_make_setup_built(tmp_path: Path) -> None:
    options = class_data_options()
    assert options, "no current class-data archive on this host: `make setup` builds it"
    app = tmp_path / "app.py"
    app.write_text("print('driver started')\n")
    # -Xshare:on: Java refuses to start instead of dropping an archive it cannot map, which it
    # otherwise does without a word (a changed class path, JDK or archive format).
    conf = {"spark.driver.extraJavaOptions": f"{options} -Xshare:on", "spark.ui.enabled": "false"}
    cmd = Submission(str(app), [], "sluice-cds-check", conf, spark_jars(), "local[1]").command()
    done = subprocess.run(
        cmd, env=os.environ | submit_env("local[1]"), capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0 and "driver started" in done.stdout, (done.stdout + done.stderr)[-3000:]
