"""Leases on a study's units, so that runners sharing a store compute each unit once: DIR/lease.json created
exclusively, touched every HEARTBEAT_S, taken over once its runner is gone (clocks must agree within timeout_s)."""

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

    def holds(self, directory: Path) -> bool:
        """Whether the unit's lease is still this runner's (not taken over while it ran)."""
        return _read(directory / LEASE).get("runner") == self.me["runner"]

    def release(self, directory: Path) -> None:
        """Give a unit back (its record written); a lease another runner took over meanwhile is left to it."""
        with self._lock:  # never between a heartbeat's look at the lease and its renewal
            self.held.discard(directory)
            if self.holds(directory):
                (directory / LEASE).unlink(missing_ok=True)

    def _create(self, lease: Path) -> bool:
        now = time.time()
        body = {**self.me, "started": _iso(now), "beat": now}
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
        """Renew each held lease by touching the very file this runner created (never rewriting it): a lease that
        another runner re-created after a take-over is another file, and is never renewed from here."""
        while not self._stop.wait(self.heartbeat_s):
            with self._lock:
                for directory in list(self.held):
                    try:
                        fd = os.open(directory / LEASE, os.O_RDONLY)
                    except OSError:
                        continue  # released, or taken aside by a taker
                    try:
                        body = json.loads(os.read(fd, 1 << 16) or b"{}")
                        if body.get("runner") == self.me["runner"]:
                            os.utime(fd)
                    except (OSError, ValueError):
                        pass  # a renewal missed is one beat late, not an error
                    finally:
                        os.close(fd)


def _read(lease: Path) -> dict[str, Any]:
    """A lease's content, its heartbeat the later of the time written in it and the file's modification time (the
    renewals touch it); one being created (still empty) is as old as its file."""
    try:
        seen = lease.stat().st_mtime
        text = lease.read_text()
    except FileNotFoundError:
        return {}
    except OSError:
        return {"beat": time.time()}
    try:
        body = json.loads(text)
    except ValueError:
        return {"beat": seen}
    return {**body, "beat": max(float(body.get("beat", 0)), seen)}


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
