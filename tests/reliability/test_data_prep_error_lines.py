"""Issue 33, low items: ``python -m data_prep.fsdd`` reports a bad input as one ``error:`` line with exit 2, as the
``mmunlearn`` command does, and writes nothing."""

import subprocess
import sys


def test_prepare_fsdd_reports_a_missing_root_in_one_line(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "data_prep.fsdd", "--root", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines() == [f"error: corpus root {tmp_path / 'nowhere'} is not a folder"]
    assert not (tmp_path / "out").exists()
