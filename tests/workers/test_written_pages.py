"""The bench's copy-on-write view (``LORENZ_PROFILE_PAGES``): a fork's own pages, by cause.

A real fork of a Python process that made many objects: the child raises and lowers reference
counts, changes fields of the parent's objects, runs functions the parent never ran, and
allocates fresh memory; its report files pages under each cause, and none of them under a cause
the child did not produce.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent(
    """
    import dataclasses, gc, json, os, sys
    from lorenz.workers.written_pages import written_pages

    class Box:
        __slots__ = ("value", "name")

        def __init__(self, value, name):
            self.value, self.name = value, name

    boxes = [Box(i, str(i)) for i in range(40_000)]       # the parent's objects
    source = "\\n".join(f"def f{i}(x):\\n    return x + {i}" for i in range(2_000))
    scope = {}
    exec(source, scope)
    functions = [scope[f"f{i}"] for i in range(2_000)]
    gc.freeze()
    what = sys.argv[1]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        if what == "fields":
            for box in boxes:
                box.value = -1
        elif what == "code":
            for function in functions:
                for _ in range(20):
                    function(1)
        elif what == "fresh":
            fresh = [bytearray(4096) for _ in range(2_000)]
        elif what == "counts":
            held = list(boxes)
        elif what == "back":
            held = list(boxes)
            del held
        found = written_pages(parent=os.getppid())
        os.write(write, json.dumps(dataclasses.asdict(found)).encode())
        os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.waitpid(pid, 0)
    print(b"".join(chunks).decode())
    """
)


def report(what: str) -> dict[str, int]:
    done = subprocess.run([sys.executable, "-c", CHILD, what], capture_output=True, text=True,
                          timeout=300, check=True)
    found: dict[str, int] = json.loads(done.stdout)
    return found


PAGES = 25
"""Pages a cause must fill to count as produced (the child's own bookkeeping writes a few
pages of every kind)."""


@pytest.mark.parametrize(
    ("what", "cause"),
    [("fields", "objects"), ("code", "code"), ("fresh", "other"), ("counts", "counts"),
     ("back", "unchanged")],
)
def test_a_forks_pages_are_filed_under_what_it_did(what: str, cause: str) -> None:
    found = report(what)
    assert found[cause] >= PAGES, found
    others = {"objects", "code", "counts", "unchanged"} - {cause}
    assert all(found[other] < found[cause] for other in others), found

