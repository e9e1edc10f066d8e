"""Leases on a study's units, so that runners sharing a store compute each unit once.

A runner takes a unit by creating DIR/lease.json exclusively (owner host, pid, runner id, start, heartbeat),
beats every HEARTBEAT_S while it holds it, and deletes it once the unit's record is written. A lease whose
runner is gone (a dead pid on this host, or no heartbeat for `timeout_s`, on any host) is taken over, and the
taker says so. Heartbeats compare wall clocks, so hosts sharing a store need clocks within `timeout_s`.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from af1.results import write_atomic

LEASE = "lease.json"
HEARTBEAT_S = 10.0
TIMEOUT_S = 120.0  # a lease not renewed for this long belongs to no one


class Leases:
    """This runner's leases in one store, renewed by a background thread while it holds any."""

    def __init__(self, timeout_s: float = TIMEOUT_S, heartbeat_s: float = HEARTBEAT_S) -> None:
        self.timeout_s = timeout_s
        self.heartbeat_s = heartbeat_s
        self.me = {"host": platform.node(), "pid": os.getpid(), "runner": uuid.uuid4().hex[:12]}
        self.held: set[Path] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._beater = threading.Thread(target=self._beat, name="af1-lease-heartbeat", daemon=True)

    def __enter__(self) -> Leases:
        self._beater.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._beater.join()
        for directory in list(self.held):
            self.release(directory)

    def take(self, directory: Path) -> tuple[bool, str | None]:
        """(True, None) when this runner now holds the unit; (True, why) when it took over a lease whose runner is
        gone; (False, who) when another live runner holds it."""
        lease = directory / LEASE
        directory.mkdir(parents=True, exist_ok=True)
        if self._create(lease):
            return True, None
        holder = _read(lease)
        gone = self._gone(holder)
        if gone is None:
            return False, f"held by {_who(holder)} since {holder.get('started', '?')}"
        aside = directory / f".{LEASE}.taken-{self.me['runner']}"
        try:
            os.rename(lease, aside)  # one taker wins the rename; the others find the lease gone or fresh
        except FileNotFoundError:
            return (True, None) if self._create(lease) else (False, "taken by another runner just now")
        moved = _read(aside)
        if (moved.get("runner"), moved.get("beat")) != (holder.get("runner"), holder.get("beat")):
            with contextlib.suppress(FileExistsError):  # renewed or retaken since it was read: put it back
                os.link(aside, lease)
            aside.unlink(missing_ok=True)
            return False, f"held by {_who(moved)}"
        aside.unlink(missing_ok=True)
        if not self._create(lease):
            return False, "taken by another runner just now"
        return True, f"took over from {_who(holder)}: {gone}"

    def release(self, directory: Path) -> None:
        """Give a unit back (its record written); a lease another runner took over meanwhile is left to it."""
        with self._lock:
            self.held.discard(directory)
        lease = directory / LEASE
        if _read(lease).get("runner") == self.me["runner"]:
            lease.unlink(missing_ok=True)

    def _create(self, lease: Path) -> bool:
        now = time.time()
        body = {**self.me, "started": _iso(now), "beat": now, "heartbeat": _iso(now)}
        try:
            fd = os.open(lease, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            json.dump(body, f)
        with self._lock:
            self.held.add(lease.parent)
        return True

    def _gone(self, holder: dict[str, Any]) -> str | None:
        """Why a lease's runner is gone, or None while it may still be running."""
        pid = holder.get("pid")
        if holder.get("host") == self.me["host"] and pid not in (None, self.me["pid"]) and not _alive(int(pid)):
            return f"its process {pid} on this host has ended"
        silent = time.time() - float(holder.get("beat", 0))
        if silent > self.timeout_s:
            return f"no heartbeat for {silent:.0f} s (more than {self.timeout_s:.0f} s)"
        return None

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            with self._lock:
                held = list(self.held)
            for directory in held:
                lease = directory / LEASE
                body = _read(lease)
                if body.get("runner") != self.me["runner"]:
                    continue  # released, or taken over after a stall: not renewed
                now = time.time()
                write_atomic(lease, json.dumps({**body, "beat": now, "heartbeat": _iso(now)}))


def _read(lease: Path) -> dict[str, Any]:
    """A lease's content; one being created (still empty) reads as just now, by someone."""
    try:
        return json.loads(lease.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        return {"beat": time.time()}


def _who(holder: dict[str, Any]) -> str:
    return f"runner {holder.get('runner', '?')} (pid {holder.get('pid', '?')} on {holder.get('host', '?')})"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))
