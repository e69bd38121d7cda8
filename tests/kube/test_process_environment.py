"""The operator's own environment stays out of reach of processes of its uid (``local`` agents).

Real processes under one unprivileged uid (``setpriv``; the suite runs as root): one plays the
operator with a token in its environment, another plays an agent of the same uid and reads
``/proc/<pid>/environ``. They run the system's Python of the suite's version (the suite's own
interpreter lives where that uid cannot reach) on the project's sources and packages.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.cluster.cluster import wait_until

REPO = Path(__file__).resolve().parents[2]
NOBODY = "65534"

HOLDER = """
import sys, time
if sys.argv[1] == "hide":
    from lorenz.secrets import hide_process_environment
    assert hide_process_environment()
print("ready", flush=True)
time.sleep(120)
"""

READER = """
import sys
try:
    data = open(f"/proc/{sys.argv[1]}/environ", "rb").read()
except PermissionError:
    print("refused")
else:
    print("read" if b"OPERATOR_CLOUD_TOKEN=s3cr3t" in data else "empty")
"""


def as_nobody() -> list[str]:
    setpriv = shutil.which("setpriv")
    assert setpriv is not None, "setpriv (util-linux) is needed to run as another uid"
    if os.geteuid() != 0:
        return []  # already unprivileged: the same uid for both
    return [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


def interpreter() -> str:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    found = f"/usr/bin/{version}"
    assert Path(found).is_file(), f"{found} (the system's {version}) is needed"
    return found


def read_environ_of_a_holder(mode: str) -> str:
    packages = [p for p in sys.path if p.endswith("site-packages")]
    env = {"PATH": "/usr/bin:/bin", "OPERATOR_CLOUD_TOKEN": "s3cr3t",
           "PYTHONPATH": os.pathsep.join([str(REPO / "controller"), *packages])}
    holder = subprocess.Popen(
        [*as_nobody(), interpreter(), "-c", HOLDER, mode], stdout=subprocess.PIPE, text=True,
        env=env, cwd="/",
    )
    try:
        assert holder.stdout is not None
        stdout = holder.stdout
        wait_until(lambda: stdout.readline().strip() == "ready" or None, timeout=120,
                   message="the holder is up")
        reader = subprocess.run(
            [*as_nobody(), interpreter(), "-c", READER, str(holder.pid)], capture_output=True,
            text=True, env={"PATH": env["PATH"]}, cwd="/", timeout=60, check=True,
        )
        return reader.stdout.strip()
    finally:
        holder.kill()
        holder.wait(timeout=30)


def test_a_process_of_the_same_uid_cannot_read_the_operators_environment() -> None:
    # Without it any process of the uid reads the token, as agents could before.
    assert read_environ_of_a_holder("plain") == "read"
    assert read_environ_of_a_holder("hide") == "refused"
