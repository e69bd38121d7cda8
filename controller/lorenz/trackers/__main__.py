"""``python -m lorenz.trackers set-state <file|id> <state> [--folder DIR]``: move a files-tracker
issue from a shell (what a person, a hook or the demo agent runs)."""

from lorenz.trackers.files import main

raise SystemExit(main())
