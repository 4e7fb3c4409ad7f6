"""The console of a pipeline run (harnessrl.console), in a fresh process: harnessrl's own lines on
the console; Ray's forwarded worker lines (fed through Ray's own log dispatcher), native writes to
fd 2, prints and warnings in the run's log file; the training loop's step lines become the train
bar's progress; progress records print as lines when stderr is not a terminal, as a bar when it is
(a pseudo-terminal here)."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
import time

PROG = r'''
import logging, os, sys, time, warnings
from pathlib import Path
from harnessrl import console
from harnessrl.cli import _setup_logging, log

_setup_logging(False)
import functools
from ray._private import worker
worker.global_worker_stdstream_dispatcher.add_handler(  # as ray.init(log_to_driver=True) does
    "ray_print_logs", functools.partial(worker.print_to_stdstream, ignore_prefix=False))
with console.Console(Path(sys.argv[1]), log) as c:
    c.attach_ray()
    with console.stage("ingest"):
        time.sleep(2.5)
    log.info("encode: 5276 transitions; 2 actors")
    for done in (0, 500, 900):  # the last report comes before the end
        log.info("encode: %d of 1000 texts encoded", done, extra=console.progress("encode", done, 1000, "texts"))
    log.info("encode: 1000 texts, 1000 distinct, in 3 s")  # the stage's own last line ends its bar
    os.write(2, b"[2026-12-01 21:05:45,825 E 9028 9028] core_worker.cc:2465: Actor with class name ...\n")
    print("Successfully registered model 'twx-critic'.")
    warnings.warn("ExecutionOptions.exclude_resources is deprecated", DeprecationWarning)
    logging.getLogger("ray.data").warning("Progress bars disabled.")
    lines = ["train: step 100/200, loss_q 0.1, loss_v 0.01, 5.00 steps/s",
             "Reporting training result 1: TrainingReport(checkpoint=None, metrics={'step': 100})",
             "Traceback (most recent call last):", "ConnectionError: Found multiple active Ray instances",
             "train: step 200/200, loss_q 0.1, loss_v 0.01, 5.00 steps/s"]
    worker.global_worker_stdstream_dispatcher.emit({"lines": lines, "pid": 4242, "is_err": False,
                                                    "actor_name": "RayTrainWorker", "task_name": None, "ip": "x"})
after = [name for name, _ in worker.global_worker_stdstream_dispatcher.handlers]
assert after == ["ray_print_logs"], after  # Ray's own printer is back once the console ends
print("SUMMARY-LINE")
'''
NOISE = ["core_worker.cc", "Successfully registered", "DeprecationWarning", "Progress bars disabled",
         "TrainingReport", "Traceback", "multiple active Ray"]


def test_console_keeps_ray_and_mlflow_output_in_the_log_file(tmp_path):
    log = tmp_path / "run.log"
    out = subprocess.run([sys.executable, "-W", "default", "-c", PROG,
                          str(log)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    console = out.stdout + out.stderr
    assert "SUMMARY-LINE" in out.stdout
    assert f"goes to {log}" in out.stderr and "encode: 5276 transitions" in out.stderr
    # not a terminal: progress records and the training loop's lines print as lines
    assert "encode: 500 of 1000 texts encoded" in out.stderr and "train: step 200/200" in out.stderr
    assert "encode: 1000 texts, 1000 distinct" in out.stderr
    for noise in NOISE:
        assert noise not in console, noise
    kept = log.read_text()
    for noise in NOISE:
        assert noise in kept, noise
    assert "(RayTrainWorker pid=4242) Reporting training result 1" in kept
    assert "encode: 5276 transitions" in kept  # harnessrl's lines too: the file is the whole record


def test_console_shows_bars_on_a_terminal(tmp_path):
    log = tmp_path / "run.log"
    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # a 120-column terminal
    proc = subprocess.Popen([sys.executable, "-c", PROG, str(log)],
                            stdin=child, stdout=child, stderr=child, close_fds=True)
    os.close(child)
    chunks = []
    deadline = time.time() + 300
    while time.time() < deadline:
        try:
            data = os.read(main, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=60)
    os.close(main)
    screen = b"".join(chunks).decode(errors="replace")
    assert proc.returncode == 0, screen[-3000:]
    assert "encode: 100%" in screen and "1000/1000" in screen  # tqdm's bar, not the progress lines
    assert "\x1b[A" not in screen  # one bar at a time: no bar is left open below another
    assert "train: 100%" in screen and "200/200" in screen
    assert "encode: 500 of 1000 texts encoded" not in screen
    assert "ingest: 00:02" in screen  # a stage without progress of its own shows its time
    for noise in NOISE:
        assert noise not in screen, noise
