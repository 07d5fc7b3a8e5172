"""Progress in a log file is whole lines: StageBar writes no carriage-return repaints when its stream is not a
terminal (one line when a stage ends, one per ``log_every`` seconds with an estimate of what remains), and is tqdm's
live bar on a terminal; the CLI turns off the libraries' own bars when stderr is a file."""

import io
import os
import subprocess
import sys

from mmunlearn.progress import StageBar, is_terminal


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_bar_in_a_log_file_is_one_line_per_stage():
    out = io.StringIO()
    for _ in StageBar(range(50), desc="scoring forget", unit="item", file=out, mininterval=0):
        pass
    text = out.getvalue()
    assert "\r" not in text
    assert text.count("\n") == 1 and text.startswith("scoring forget: 50/50 items in ")


def test_a_long_stage_in_a_log_file_says_what_remains():
    out = io.StringIO()
    bar = StageBar(total=10, desc="fine-tuning", unit="step", file=out, mininterval=0, log_every=0)
    for _ in range(4):
        bar.update(1)
    lines = out.getvalue().splitlines()
    assert lines and all("\r" not in line for line in lines)
    assert lines[-1].startswith("fine-tuning: 4/10 steps, ") and "elapsed" in lines[-1] and "left" in lines[-1]
    bar.close()
    assert out.getvalue().splitlines()[-1].startswith("fine-tuning: 4/10 steps in ")


def test_a_bar_that_vanishes_on_a_terminal_still_has_its_line_and_a_disabled_bar_writes_nothing():
    out = io.StringIO()
    for _ in StageBar(range(5), desc="checking 5 rows", unit="row", file=out, leave=False):
        pass
    assert out.getvalue().startswith("checking 5 rows: 5/5 rows in ") and out.getvalue().count("\n") == 1
    out = io.StringIO()
    for _ in StageBar(range(5), desc="off", file=out, disable=True):
        pass
    assert out.getvalue() == ""


def test_on_a_terminal_it_is_a_live_tqdm_bar():
    out = _Terminal()
    assert is_terminal(out) and not is_terminal(io.StringIO())
    for _ in StageBar(range(20), desc="live", file=out, mininterval=0):
        pass
    assert "\r" in out.getvalue() and "live" in out.getvalue()


def test_the_cli_turns_off_the_libraries_bars_when_stderr_is_a_file(tmp_path):
    code = (
        "import sys; import transformers; from mmunlearn import cli; sys.argv = ['mmunlearn', '--version']\n"
        "try:\n    cli.main(['--version'])\nexcept SystemExit:\n    pass\n"
        "from transformers.utils import logging; from huggingface_hub.utils import are_progress_bars_disabled\n"
        "print(logging.is_progress_bar_enabled(), are_progress_bars_disabled())"
    )
    with open(tmp_path / "err.log", "w") as err:
        out = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=err, text=True, check=True)
    assert out.stdout.split()[-2:] == ["False", "True"]


def test_worker_processes_after_quiet_library_bars_draw_no_plain_tqdm_bars_but_keep_stage_lines(tmp_path):
    """A worker started after quiet_library_bars() (as the parallel builds and method stages are) imports tqdm with
    TQDM_DISABLE set: a library's plain tqdm bar writes nothing, a StageBar still writes its stage line."""
    code = (
        "import sys\nfrom tqdm import tqdm\nfrom mmunlearn.progress import StageBar\n"
        "for _ in tqdm(range(3), desc='library bar', file=sys.stderr):\n    pass\n"
        "for _ in StageBar(range(3), desc='our stage', file=sys.stderr):\n    pass\n"
    )
    import os

    from mmunlearn.progress import quiet_library_bars

    before = dict(os.environ)
    try:
        quiet_library_bars()
        env = dict(os.environ)
    finally:
        os.environ.clear()
        os.environ.update(before)
    err = subprocess.run([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, text=True, check=True).stderr
    assert "library bar" not in err and "\r" not in err
    assert "our stage: 3/3 items in" in err


def test_quiet_library_bars_turns_off_plain_tqdm_bars_in_this_process_too():
    """tqdm is imported before the CLI can call quiet_library_bars (``import mmunlearn`` imports it): a library's
    plain bar made afterwards in the same process writes nothing, a StageBar still writes its stage line, and a bar
    made before the call is untouched."""
    code = (
        "import sys\nfrom tqdm import tqdm\nfrom tqdm.auto import tqdm as auto_tqdm\n"
        "from mmunlearn.progress import StageBar, quiet_library_bars\n"
        "for _ in tqdm(range(3), desc='before the call', file=sys.stderr, mininterval=0):\n    pass\n"
        "quiet_library_bars()\n"
        "for _ in tqdm(range(3), desc='library bar', file=sys.stderr):\n    pass\n"
        "for _ in auto_tqdm(range(3), desc='auto bar', file=sys.stderr):\n    pass\n"
        "for _ in StageBar(range(3), desc='our stage', file=sys.stderr):\n    pass\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"}  # a CLI test in this worker may have set it
    err = subprocess.run([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, text=True, check=True).stderr
    assert "before the call" in err
    assert "library bar" not in err and "auto bar" not in err
    assert "our stage: 3/3 items in" in err
