"""The bench's copy-on-write view (``LORENZ_PROFILE_PAGES``): a fork's own pages, by cause.

A real fork of a Python process that made many objects: the child raises and lowers reference
counts, changes fields of the parent's objects, runs functions the parent never ran, and
allocates fresh memory; its report files pages under each cause, and none of them under a cause
the child did not produce.
"""

from __future__ import annotations

import json
import os
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



INHERITED = textwrap.dedent(
    """
    import dataclasses, gc, json, os, sys
    from lorenz.workers.written_pages import remember_frames, written_pages

    class Box:
        __slots__ = ("value", "name")

        def __init__(self, value, name):
            self.value, self.name = value, name

    boxes = [Box(i, str(i)) for i in range(40_000)]
    gc.freeze()
    writer = sys.argv[1]
    ready, go = os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:
        remember_frames()
        os.write(ready[1], b"r")
        if writer == "child":
            for box in boxes:
                box.value = -1
        os.read(go[0], 1)
        print(json.dumps(dataclasses.asdict(written_pages(parent=os.getppid()))), flush=True)
        os._exit(0)
    os.read(ready[0], 1)
    if writer == "parent":
        for box in boxes:
            box.value = -2
    os.write(go[1], b"g")
    os.waitpid(pid, 0)
    """
)


BOXES_PAGES = 300
"""Pages the 40,000 boxes fill at least (48 bytes each with the collector's links)."""


def inherited(writer: str) -> dict[str, int]:
    done = subprocess.run([sys.executable, "-c", INHERITED, writer], capture_output=True,
                          text=True, timeout=300, check=True)
    found: dict[str, int] = json.loads(done.stdout)
    return found


@pytest.mark.skipif(os.geteuid() != 0,
                    reason="/proc/self/pagemap gives page frame numbers to root only")
def test_pages_the_parent_wrote_after_the_fork_are_told_from_the_forks_own() -> None:
    by_parent, by_child = inherited("parent"), inherited("child")
    # NB: the parent's own interpreter writes ~100 pages after any fork (its reads, its wait):
    # the boxes it writes come on top of those; the child's writes are never counted.
    assert by_parent["inherited"] - by_child["inherited"] >= BOXES_PAGES, (by_parent, by_child)
    assert by_child["inherited"] < BOXES_PAGES <= by_child["objects"], (by_parent, by_child)
