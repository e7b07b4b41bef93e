"""Throughput and ping-pong probes run inside rank namespaces (stdlib only).

    python -m treeattn.emulate._tput recv PORT           # prints one JSON line when the sender closes
    python -m treeattn.emulate._tput send HOST PORT SECONDS
    python -m treeattn.emulate._tput echo PORT ROUNDS
    python -m treeattn.emulate._tput ping HOST PORT ROUNDS SIZE   # prints one JSON line

The receiver reports the payload rate over the transfer less its first fifth (TCP slow
start and the shaper's initial burst), which is the rate a long message sees, and samples
(monotonic clock, shared by all processes; bytes so far) every few milliseconds so that
flows measured together can be compared over the time they all ran.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import time

__all__: list[str] = []

_CHUNK = 1 << 16
_SKIP = 0.2
_SAMPLE_S = 0.005


def _listen(port: int) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((os.environ.get("TREEATTN_EMU_IP", "0.0.0.0"), port))
    s.listen(4)
    s.settimeout(30)
    return s


def _connect(host: str, port: int) -> socket.socket:
    deadline = time.monotonic() + 20
    while True:
        try:
            s = socket.create_connection((host, port), timeout=30)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return s
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def recv(port: int) -> dict:
    conn, _ = _listen(port).accept()
    conn.settimeout(30)
    buf = bytearray(1 << 20)
    marks: list[tuple[float, int]] = []
    total = 0
    while True:
        n = conn.recv_into(buf)
        if not n:
            break
        total += n
        marks.append((time.monotonic(), total))
    if len(marks) < 2:
        return {"bytes": total, "secs": 0.0, "rate_bps": 0.0, "samples": []}
    t0, t1 = marks[0][0], marks[-1][0]
    start = next(m for m in marks if m[0] >= t0 + _SKIP * (t1 - t0))
    span = t1 - start[0]
    rate = (total - start[1]) / span if span > 0 else 0.0
    samples = [marks[0]]
    for m in marks[1:]:
        if m[0] - samples[-1][0] >= _SAMPLE_S or m is marks[-1]:
            samples.append(m)
    return {"bytes": total, "secs": t1 - t0, "rate_bps": rate, "samples": samples}


def send(host: str, port: int, seconds: float) -> None:
    s = _connect(host, port)
    data = bytes(_CHUNK)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        s.sendall(data)
    s.close()


def _exact(conn: socket.socket, buf: bytearray) -> None:
    view, got = memoryview(buf), 0
    while got < len(buf):
        n = conn.recv_into(view[got:])
        if not n:
            raise ConnectionError("peer closed")
        got += n


def echo(port: int, rounds: int) -> None:
    conn, _ = _listen(port).accept()
    conn.settimeout(30)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    size = int.from_bytes(conn.recv(4), "big")
    buf = bytearray(size)
    for _ in range(rounds):
        _exact(conn, buf)
        conn.sendall(buf)


def ping(host: str, port: int, rounds: int, size: int) -> dict:
    s = _connect(host, port)
    s.sendall(size.to_bytes(4, "big"))
    buf, back = bytearray(size), bytearray(size)
    rtts = []
    for _ in range(rounds):
        t = time.perf_counter()
        s.sendall(buf)
        _exact(s, back)
        rtts.append(time.perf_counter() - t)
    keep = rtts[len(rtts) // 10:]
    return {"rounds": rounds, "size": size, "rtt_us_median": statistics.median(keep) * 1e6,
            "rtt_us_min": min(keep) * 1e6}


def main(argv: list[str]) -> None:
    mode = argv[0]
    if mode == "recv":
        print(json.dumps(recv(int(argv[1]))), flush=True)
    elif mode == "send":
        send(argv[1], int(argv[2]), float(argv[3]))
    elif mode == "echo":
        echo(int(argv[1]), int(argv[2]))
    elif mode == "ping":
        print(json.dumps(ping(argv[1], int(argv[2]), int(argv[3]), int(argv[4]))), flush=True)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
