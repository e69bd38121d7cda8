"""Prints what the demo did: each issue's final state and the runs recorded in the event log."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml


def main(work: Path) -> int:
    print("\nIssues:")
    for path in sorted((work / "issues").glob("*.md")):
        text = path.read_text(encoding="utf-8")
        front = yaml.safe_load(text.split("---", 2)[1]) if text.startswith("---") else {}
        print(f"  {front.get('identifier', path.stem):8} {front.get('state', '?'):12} "
              f"{front.get('title', '')}")
    log = work / "lorenz-events.jsonl"
    events = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    counts: dict[str, int] = {}
    for event in events:
        counts[event["type"]] = counts.get(event["type"], 0) + 1
    print("\nEvents:")
    for kind in sorted(counts):
        print(f"  {kind:32} {counts[kind]}")
    print("\nRuns:")
    print(f"  {'at':8} {'event':18} {'issue':8} {'spend':>10}  message")
    # NB: a run's ``run_spend`` comes just before its end event (only while a budget cap is set).
    spent: dict[str, float] = {}
    total = 0.0
    for event in events:
        identifier = event.get("identifier", "")
        if event["type"] == "run_spend":
            spent[identifier] = float(event.get("usd") or 0.0)
            total += spent[identifier]
            continue
        if event["type"] in ("run_started", "run_finished", "run_failed", "workspace_cleanup"):
            usd = spent.pop(identifier, None) if event["type"] != "run_started" else None
            spend = f"${usd:.4f}" if usd is not None else ""
            print(f"  {event['at'][11:19]} {event['type']:18} {identifier:8} {spend:>10}  "
                  f"{event.get('message', '')}")
    print(f"\nSpend: ${total:.4f} in all (priced as gpt-5-mini; see docs/budgets.md)")
    done = all("state: Done" in p.read_text() or "state: Backlog" in p.read_text()
               for p in (work / "issues").glob("*.md"))
    print("\nAll active issues done." if done else "\nSome issues are not done.")
    return 0 if done else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
