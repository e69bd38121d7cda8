"""What the request guard and the body bounds cost per request.

    .venv/bin/python bench/guard_bench.py [--rounds 20000]

1. ``RequestGuard.check`` on a GET (Host check only) and on a POST (Host, Origin, token,
   content type), against aiohttp's own request objects on a loopback transport.
2. ``nesting_depth`` on 64 KiB bodies (the largest the app accepts): a flat JSON object, a
   string-heavy one, and the worst case of nothing but brackets — the price of refusing a
   nesting bomb before ``json.loads`` ever sees it.
3. The token file: one write (``0600``, fsync, rename) and one read, as at every start and
   every POST whose token is not the server's own.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

from aiohttp.test_utils import make_mocked_request

from lorenz.server.bodies import MAX_BODY_BYTES, MAX_BODY_DEPTH, nesting_depth
from lorenz.server.credentials import read_token_file, write_token_file
from lorenz.server.guard import RequestGuard


def _loopback_transport() -> Any:
    transport = mock.Mock()
    sock = mock.Mock()
    sock.family = socket.AF_INET
    extra = {"socket": sock, "sockname": ("127.0.0.1", 8080), "peername": ("127.0.0.1", 5555)}
    transport.get_extra_info.side_effect = lambda name, default=None: extra.get(name, default)
    return transport


def _time_us(action: Callable[[], object], *, rounds: int) -> tuple[float, float]:
    samples: list[float] = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        action()
        samples.append((time.perf_counter_ns() - start) / 1000.0)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.95)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20000)
    args = parser.parse_args()

    guard = RequestGuard(allowed_hosts=["lorenz.internal"])
    transport = _loopback_transport()
    get = make_mocked_request(
        "GET", "/api/v1/state", headers={"Host": "127.0.0.1:8080"}, transport=transport
    )
    post = make_mocked_request(
        "POST",
        "/api/v1/refresh",
        headers={
            "Host": "127.0.0.1:8080",
            "Origin": "http://127.0.0.1:8080",
            "Authorization": f"Bearer {guard.token}",
            "Content-Type": "application/json",
            "Content-Length": "2",
        },
        transport=transport,
    )
    print(f"request guard ({args.rounds} rounds)      p50 µs   p95 µs")
    for name, request in (("GET  (Host)", get), ("POST (Host, Origin, token, type)", post)):
        p50, p95 = _time_us(lambda request=request: guard.check(request), rounds=args.rounds)
        print(f"  {name:<34} {p50:7.1f}  {p95:7.1f}")

    flat = json.dumps({f"key{n}": n for n in range(6000)})[: MAX_BODY_BYTES - 2]
    strings = json.dumps(["[{" * 20 + "x" * 60] * 800)[:MAX_BODY_BYTES]
    brackets = "[" * (MAX_BODY_BYTES // 2) + "]" * (MAX_BODY_BYTES // 2)
    rounds = max(args.rounds // 100, 20)
    print(f"nesting_depth on 64 KiB ({rounds} rounds)  p50 ms   p95 ms")
    for name, text in (("flat object", flat), ("strings full of brackets", strings),
                       ("brackets only (a bomb)", brackets)):
        p50, p95 = _time_us(
            lambda text=text: nesting_depth(text, stop_above=MAX_BODY_DEPTH), rounds=rounds
        )
        print(f"  {name:<34} {p50 / 1000:7.2f}  {p95 / 1000:7.2f}")

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "x.token"
        rounds = max(args.rounds // 100, 20)
        print(f"token file ({rounds} rounds)               p50 µs   p95 µs")
        p50, p95 = _time_us(lambda: write_token_file(path, guard.token), rounds=rounds)
        print(f"  {'write (0600, fsync, rename)':<34} {p50:7.1f}  {p95:7.1f}")
        p50, p95 = _time_us(lambda: read_token_file(path), rounds=rounds)
        print(f"  {'read':<34} {p50:7.1f}  {p95:7.1f}")


if __name__ == "__main__":
    main()
