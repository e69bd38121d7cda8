"""A daemon killed mid-day (``kill -9``) or stopped gracefully keeps the day's spend.

A real daemon (``lorenz WORKFLOW.md --feature daemon --feature durable_claims``, the sqlite
claim store) runs a ``command`` agent that keeps reporting growing costs through
``LORENZ_USAGE_FILE``; the daily cap is ``budget.max_usd_per_day``. The daemon is killed with
SIGKILL part-way to the cap (or stopped with SIGTERM); the next daemon on the same store starts
from the day's total in the ledger, not from zero, and stops the run at the cap on the combined
total: the day never spends more than the cap plus one usage update. A run in a detached worker
that outlives its daemon is adopted by the next one, which charges only what its session spent
after what the first daemon had charged.
"""

from __future__ import annotations

import datetime
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest

from lorenz.assembly import IN_PROCESS_RUNS_ENV
from lorenz.claims import store_path
from lorenz.config.settings import ClaimStoreSettings
from lorenz.policies.budget import day_key
from tests.daemon.harness import DaemonProcess, get_state, in_process, write_daemon_workflow
from tests.daemon.test_cli import lorenz
from tests.waiting import wait_until

WAIT_S = 60.0
STEP_USD = 0.05
"""What the agent's every usage line adds (one line each 0.2 s)."""
CAP_USD = 0.6

SPENDER = """\
import json, os, pathlib, sys, time
sys.stdin.read()
usage = pathlib.Path(os.environ['LORENZ_USAGE_FILE'])
n = 0
while True:
    n += 1
    with usage.open('a') as out:
        out.write(json.dumps({'input_tokens': n * 100, 'cost_usd': round(n * %r, 6)}) + '\\n')
    time.sleep(0.2)
"""


@pytest.fixture
def daemon_env(daemon_env: dict[str, str]) -> dict[str, str]:
    """In-process runs: the test is about the ledger across restarts, not where runs execute."""
    return in_process(daemon_env)


def stored_day_usd(db: Path) -> float:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        row = conn.execute(
            "SELECT usd FROM day_spend WHERE day = ?",
            (day_key(datetime.datetime.now(datetime.UTC)),),
        ).fetchone()
    finally:
        conn.close()
    return float(row[0]) if row else 0.0


def day_usd(state: dict[str, Any]) -> float:
    return float(state["budget"]["day_spend"]["usd"])


@pytest.mark.parametrize("stop", ["kill9", "sigterm"])
def test_a_restart_mid_day_keeps_the_days_spend(
    root: Path, daemon_env: dict[str, str], daemons: list[DaemonProcess], stop: str
) -> None:
    root.mkdir(parents=True)
    spender = root / "spender.py"
    spender.write_text(SPENDER % STEP_USD, encoding="utf-8")
    workflow = write_daemon_workflow(
        root,
        issues=("A-1",),
        agent_command=f"{sys.executable} {spender}",
        front_matter={
            "agent": {"max_concurrent_agents": 1},
            "budget": {"max_usd_per_day": CAP_USD},
        },
    )
    db = store_path(
        ClaimStoreSettings(), workspace_root=root / "workspaces", workflow_path=workflow.resolve()
    )
    first = DaemonProcess(workflow, env=daemon_env, output=root / "daemon-1.log")
    daemons.append(first.start())
    lease = first.wait_ready()
    # Part-way to the cap: well past the first charge, well before the cap. NB: waited for in
    # the ledger, not the state: the state counts a charge at once and the ledger stores it a
    # moment later, and a ``kill -9`` in between loses that one update (documented).
    assert get_state(lease["endpoint"])["budget"] is not None
    wait_until(
        lambda: stored_day_usd(db) >= 0.2,
        timeout=WAIT_S,
        what="the first daemon to store 0.2 USD of spend",
    )
    if stop == "kill9":
        first.kill9()
    else:
        first.terminate()
        first.wait()
    before = stored_day_usd(db)
    assert 0.2 - 1e-9 <= before < CAP_USD

    second = DaemonProcess(workflow, env=daemon_env, output=root / "daemon-2.log")
    daemons.append(second.start())
    lease = second.wait_ready()
    # It counts on from the ledger's figure and stops the run at the day's cap on the combined
    # total (blocked, not retried): had it started from zero, the day would end near
    # ``before + CAP_USD``, far above the bound below.
    state = wait_until(
        lambda: (s := get_state(lease["endpoint"]))["blocked"] and s,
        timeout=WAIT_S,
        what="the run to be stopped at the day's cap",
    )
    (blocked,) = state["blocked"]
    assert blocked["reason"] == "budget_exhausted"
    assert state["budget"]["remaining_usd"] == 0.0
    if stop == "kill9":
        # ``lorenz status`` (over the daemon's unix socket) shows the day's spend and cap.
        status = lorenz("status", "WORKFLOW.md", env=daemon_env, cwd=root)
        assert status.returncode == 0, status.stderr
        (spend_row,) = [line for line in status.stdout.splitlines() if "spend" in line]
        assert f"of {CAP_USD:g} USD (0.0000 left)" in spend_row, status.stdout
    second.terminate()
    second.wait()
    total = stored_day_usd(db)
    assert CAP_USD - 1e-9 <= total <= CAP_USD + STEP_USD + 1e-9
    assert day_usd(state) <= total + 1e-9


ADOPTED_SPENDER = """\
import json, os, pathlib, sys, time
sys.stdin.read()
usage = pathlib.Path(os.environ['LORENZ_USAGE_FILE'])
spent = pathlib.Path(sys.argv[1])
n = 0
while True:
    n += 1
    cost = round(n * %r, 6)
    spent.write_text(str(cost))
    with usage.open('a') as out:
        out.write(json.dumps({'input_tokens': n * 100, 'cost_usd': cost}) + '\\n')
    time.sleep(0.2)
"""


def test_an_adopted_run_charges_only_what_its_session_spent_since_the_restart(
    root: Path, daemon_env: dict[str, str], daemons: list[DaemonProcess]
) -> None:
    """A run in a detached worker outlives its daemon (``kill -9``); the next daemon adopts it.
    The agent's session reports running totals from its start: the new daemon counts on from
    the totals its predecessor already charged (the worker's journal up to the claim's
    ``last_seq``), so the day's ledger matches what the agent spent (give or take the one
    update in flight at the kill) and the run gets its whole budget, not what is left of it
    after charging the session's first part twice."""
    env = {k: v for k, v in daemon_env.items() if k != IN_PROCESS_RUNS_ENV}
    root.mkdir(parents=True)
    spender = root / "spender.py"
    spender.write_text(ADOPTED_SPENDER % STEP_USD, encoding="utf-8")
    spent = root / "spent.txt"
    store = root / "claims.db"
    workflow = write_daemon_workflow(
        root,
        issues=("A-1",),
        agent_command=f"{sys.executable} {spender} {spent}",
        front_matter={
            "agent": {"max_concurrent_agents": 1},
            "budget": {"max_usd_per_day": CAP_USD},
            "flags": {"claim_store.path": str(store), "daemon.heartbeat_ms": 200},
        },
    )
    args = ["--feature", "daemon", "--feature", "durable_claims"]
    first = DaemonProcess(workflow, env=env, args=args, output=root / "daemon-1.log")
    daemons.append(first.start())
    lease = first.wait_ready()
    assert get_state(lease["endpoint"])["budget"] is not None
    wait_until(  # NB: in the ledger, as above
        lambda: stored_day_usd(store) >= 0.2,
        timeout=WAIT_S,
        what="the first daemon to store 0.2 USD of spend",
    )
    first.kill9()
    before = stored_day_usd(store)
    assert 0.2 - 1e-9 <= before < CAP_USD

    second = DaemonProcess(workflow, env=env, args=args, output=root / "daemon-2.log")
    daemons.append(second.start())
    lease = second.wait_ready()
    wait_until(
        lambda: "adopting the worker of a lost controller" in second.log(),
        timeout=WAIT_S,
        what="the run to be adopted",
    )
    state = wait_until(
        lambda: (s := get_state(lease["endpoint"]))["blocked"] and s,
        timeout=WAIT_S,
        what="the adopted run to be stopped at the day's cap",
    )
    (blocked,) = state["blocked"]
    assert blocked["reason"] == "budget_exhausted"
    second.terminate()
    second.wait()
    agent_spent = float(spent.read_text())
    total = stored_day_usd(store)
    # Had the session's first part been charged again, the ledger would exceed the agent's own
    # figure by ``before`` (0.2 USD or more), and the run would have stopped near
    # ``CAP_USD - before``.
    assert abs(total - agent_spent) <= STEP_USD + 1e-9, (total, agent_spent, before)
    # NB: no bound near the cap: while no daemon watched, the worker's agent kept spending;
    # the adopted run is stopped at the first relayed update past the cap.
    assert total >= CAP_USD - 1e-9
