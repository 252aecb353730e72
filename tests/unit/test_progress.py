"""Progress bars: live on a terminal, whole lines at a slow rate in logs."""

from __future__ import annotations

import io

from components import progress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_each_redraw_is_one_line_at_the_log_interval(monkeypatch):
    monkeypatch.setattr(progress, "LOG_INTERVAL_S", 0.0)
    log = io.StringIO()
    for _ in progress.progress_bar(range(3), desc="collect", unit="ep", file=log):
        pass
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and len(lines) == len(set(lines)) >= 2
    assert lines[0].startswith("collect:   0%") and "3/3" in lines[-1]


def test_off_a_terminal_the_bar_waits_for_the_interval():
    log = io.StringIO()
    bar = progress.progress_bar(total=100, desc="eval", file=log)
    assert bar.mininterval == progress.LOG_INTERVAL_S == 30.0
    bar.update(50)  # well within 30 s of the first draw: no new line
    assert len(log.getvalue().splitlines()) == 1
    bar.close()


def test_on_a_terminal_it_is_a_plain_tqdm_bar():
    tty = _Tty()
    bar = progress.progress_bar(total=2, desc="train", file=tty, mininterval=0)
    bar.update(1)
    bar.close()
    assert bar.mininterval == 0 and "\r" in tty.getvalue()  # redrawn in place


def test_disable_none_means_no_bar_off_a_terminal():
    log = io.StringIO()
    for _ in progress.progress_bar(range(3), file=log, disable=None):
        pass
    assert log.getvalue() == ""
