"""A process's identity (pid and start time) survives a step of the kernel's boot time."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

from lorenz.leadership.processes import Liveness, local_liveness, same_start_time


@pytest.mark.parametrize(
    ("offset", "same"),
    [
        (0.0, True),
        (0.01, True),  # psutil's 10 ms resolution
        (-0.005, True),  # the 2-decimal rounding of owner ids
        (1.0, True),  # btime moved up one second between the two readings
        (-1.0, True),
        (2.01, True),
        (0.3, False),  # another process under a reused pid
        (1.5, False),
        (-0.7, False),
        (3.0, False),  # beyond any step of btime: another process
        (50.0, False),
    ],
)
def test_a_start_time_is_the_same_within_whole_second_steps_of_the_boot_time(
    offset: float, same: bool
) -> None:
    recorded = 1796452699.61
    assert same_start_time(recorded + offset, recorded) is same


def test_a_live_process_read_one_second_off_is_alive_and_a_fraction_off_is_not() -> None:
    created = psutil.Process().create_time()
    # NB: what a peer reads after the wall clock was stepped across a second: before the
    # fix both live processes of a chaos round declared each other dead and took each
    # other's claims.
    assert local_liveness(os.getpid(), created - 1.0) is Liveness.ALIVE
    assert local_liveness(os.getpid(), created + 1.0) is Liveness.ALIVE
    assert local_liveness(os.getpid(), created) is Liveness.ALIVE
    assert local_liveness(os.getpid(), created - 0.5) is Liveness.DEAD
    assert local_liveness(os.getpid(), created - 100) is Liveness.DEAD


def test_a_gone_pid_is_dead() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert local_liveness(gone.pid, psutil.Process().create_time()) is Liveness.DEAD
