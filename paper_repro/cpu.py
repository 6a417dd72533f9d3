"""Where one rank's CPU went during a measured training loop: training, the loader, the rest, others.

On 2 cores with 2 ranks every thread competes with training for the same core, so a loader that
uses CPU slows training here in a way it would not on a GPU host with spare cores.  `LoopMeter`
splits the loop's wall time so a reader can tell that artifact from a batching effect:

    main     the training thread (``time.thread_time``): forward, backward, optimizer, collate,
             and the preprocessing of methods that load in that thread (Standard, GMT/BMT)
    loader   every ODB engine thread (named ``odb-engine-rank<r>``): preprocessing with
             ``num_workers=0``, grouping, the protocol; read from ``/proc/self/task/<tid>/stat``
             after every batch (so its work after an epoch's last batch, one round, is missed)
    other    the rest of this process (gloo's threads, torch's pool): process CPU - main - loader
    machine  CPU busy on the whole machine (``/proc/stat``); rank 0 subtracts every rank's process
             CPU from it, leaving what *other* programs took during the loop (``external_cores``)

Every figure is in CPU seconds; divide by the loop's wall time for a share of one core.  Outside
Linux the /proc readings are None and reported as such (``time.thread_time`` and ``getrusage``
still work).

`reference_ms` and `cpu_model` say which machine a benchmark ran on: the absolute figures of
`paper_repro.bench_runtime` (microseconds per sample, milliseconds per decision) move with the
machine (the loader's figure of one tree by a factor of two from one day to the next), so a result
file carries the time of one fixed workload beside them, and two files compare by their ratio.
"""

from __future__ import annotations

import os
import resource
import threading
import time

__all__ = ["LoopMeter", "thread_cpu_s", "machine_busy_s", "reference_ms", "cpu_model", "ENGINE_PREFIX"]

ENGINE_PREFIX = "odb-engine-rank"
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def thread_cpu_s(tid: int) -> float | None:
    """CPU seconds (user + system) of thread `tid` of this process; None once it has exited."""
    try:
        with open(f"/proc/self/task/{tid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw[raw.rindex(b")") + 2:].split()  # after "pid (comm) ": field 3 (state) is fields[0]
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime: fields 14 and 15 of proc(5)


def machine_busy_s() -> float | None:
    """CPU seconds the whole machine has been busy since boot (every core; idle and iowait excluded)."""
    try:
        with open("/proc/stat") as f:
            vals = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal (guest time is already inside user)
    return (sum(vals[:8]) - vals[3] - vals[4]) / _TICK


# What `_reference` returns: a changed workload changes it, and its times stop comparing with older files.
REFERENCE_CHECKSUM = 488884


def _reference() -> int:
    """A fixed single-threaded workload of the kind the loader's decision does (Python ints, lists, a keyed
    sort, a dict): 100,000 values from a linear congruential generator, their order, a histogram."""
    x, vals = 12345, []
    for _ in range(100_000):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        vals.append(x >> 8)
    order = sorted(range(len(vals)), key=vals.__getitem__, reverse=True)
    hist: dict[int, int] = {}
    for i in order[:50_000]:
        hist[vals[i] & 1023] = hist.get(vals[i] & 1023, 0) + i
    return sum(hist.values()) % 1_000_003


def reference_ms(repeats: int = 7) -> float:
    """Milliseconds of `_reference`, the least of `repeats` runs (the least: what the machine can do, as
    the loader's figure is the least of its passes).  Raises RuntimeError if the workload's result is not
    `REFERENCE_CHECKSUM`."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        got = _reference()
        best = min(best, time.perf_counter() - t0)
        if got != REFERENCE_CHECKSUM:
            raise RuntimeError(f"the reference workload returned {got}, not {REFERENCE_CHECKSUM}: it changed, "
                               "and its times no longer compare with older result files")
    return 1e3 * best


def cpu_model() -> str | None:
    """The CPU's model name from /proc/cpuinfo (None outside Linux or if it has none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _process_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class LoopMeter:
    """Accumulates the CPU split of one method's training loop over its epochs.

    Call ``start()`` / ``stop()`` around each epoch's loop (in the training thread) and ``poll()``
    after every batch; ``result()`` gives the totals (module docstring).
    """

    def __init__(self):
        self.wall = self.main = self.proc = 0.0
        self.machine: float | None = 0.0
        self._banked = 0.0                           # loader CPU of readings already closed
        self._engines: dict[int, list[float]] = {}   # tid -> [reading when counting began, last reading]
        self._t0 = None

    def _scan(self, rebase: bool) -> None:
        """Read every live engine thread; a thread first seen now counts from its start (0), unless
        `rebase` (the loop begins: what it did before is not this loop's)."""
        for t in threading.enumerate():
            if not t.name.startswith(ENGINE_PREFIX) or t.native_id is None:
                continue
            v = thread_cpu_s(t.native_id)
            if v is None:
                continue
            seen = self._engines.get(t.native_id)
            if seen is not None and v < seen[1]:  # the tid was reused by a new thread
                self._banked += seen[1] - seen[0]
                seen = None
            if seen is None:
                self._engines[t.native_id] = [v if rebase else 0.0, v]
            else:
                if rebase:
                    self._banked += seen[1] - seen[0]
                    seen[0] = v
                seen[1] = v

    def start(self) -> None:
        self._scan(rebase=True)
        self._t0 = (time.perf_counter(), time.thread_time(), _process_cpu_s(), machine_busy_s())

    def poll(self) -> None:
        self._scan(rebase=False)

    def stop(self) -> None:
        self._scan(rebase=False)
        w0, c0, p0, m0 = self._t0
        self.wall += time.perf_counter() - w0
        self.main += time.thread_time() - c0
        self.proc += _process_cpu_s() - p0
        m1 = machine_busy_s()
        self.machine = None if (m0 is None or m1 is None or self.machine is None) else self.machine + m1 - m0

    def result(self) -> dict:
        loader = self._banked + sum(last - first for first, last in self._engines.values())
        return {"wall_s": self.wall, "main_cpu_s": self.main, "loader_cpu_s": loader,
                "other_cpu_s": max(0.0, self.proc - self.main - loader), "proc_cpu_s": self.proc,
                "machine_busy_s": self.machine}
