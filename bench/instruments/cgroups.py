"""CPU quotas for benchmarks: a process in a cgroup of its own, limited to a fraction of a core.

A *simulated core* is a CPU quota (CFS bandwidth control): ``quota`` microseconds of CPU per
``period`` microseconds, whatever the machine's load. :func:`cpu_controller` finds a writable
CPU controller, cgroup v1 (``cpu.cfs_quota_us``, ``cpu.cfs_period_us``) or cgroup v2
(``cpu.max``), or raises :class:`NoCpuController` saying why not (not mounted, not writable,
not delegated); benchmarks catch it and skip. :class:`CpuGroup` is one group: processes go in
with :meth:`CpuGroup.add` (the whole thread group moves), :meth:`CpuGroup.stat` reads how often
the quota bit, and :meth:`CpuGroup.remove` moves what is left to the parent and deletes it.

Whether a quota, not the machine, was the limit is read from the group's ``cpu.stat``: a group
that used its whole quota was throttled in most periods (``nr_throttled`` of ``nr_periods``). A
group that used less than its quota was held back by something else (the machine's other load,
its own waiting), and a measurement of it says nothing about the quota.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

PERIOD_US = 100_000  # the kernel's default CFS period


class NoCpuController(RuntimeError):
    """No CPU controller this process may create groups in (the message says why)."""


@dataclass(frozen=True, slots=True)
class Controller:
    """Where groups are made: ``root`` is a directory of the v1 ``cpu`` hierarchy, or a v2
    directory whose children have the ``cpu`` controller."""

    version: int
    root: Path
    home: Path | None = None  # v2: this process's own group, where a removed group's processes go

    def describe(self) -> str:
        return f"cgroup v{self.version} at {self.root}"


@dataclass(frozen=True, slots=True)
class CpuStat:
    """A group's counters: CFS periods elapsed, periods the quota ran out, seconds throttled."""

    periods: int
    throttled: int
    throttled_s: float

    def __sub__(self, other: CpuStat) -> CpuStat:
        return CpuStat(
            self.periods - other.periods,
            self.throttled - other.throttled,
            self.throttled_s - other.throttled_s,
        )


def _mounts(mounts: Path) -> list[tuple[Path, str, list[str]]]:
    """(mount point, type, options) of every cgroup mount."""
    found = []
    for line in mounts.read_text().splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] in ("cgroup", "cgroup2"):
            found.append((Path(fields[1]), fields[2], fields[3].split(",")))
    return found


def _v2_home(mount: Path, self_cgroup: Path) -> Path:
    """This process's own v2 cgroup directory (``0::/path`` in /proc/self/cgroup)."""
    for line in self_cgroup.read_text().splitlines():
        if line.startswith("0::"):
            return mount / line[3:].lstrip("/")
    return mount


def _writable_here(directory: Path) -> str | None:
    """None if a group can be made in ``directory``, else why not."""
    probe = directory / f"hangup-probe-{os.getpid()}"
    try:
        probe.mkdir()
    except OSError as exc:
        return f"cannot create a cgroup in {directory}: {exc.strerror}"
    probe.rmdir()
    return None


def _v2_root(mount: Path, self_cgroup: Path) -> tuple[Path | None, str]:
    """A v2 directory whose children get the ``cpu`` controller, or (None, why not): the
    parent of this process's own group (siblings of it), else the mount's root."""
    home = _v2_home(mount, self_cgroup)
    candidates = [home.parent, mount] if home != mount else [mount]
    for directory in candidates:
        controllers = directory / "cgroup.controllers"
        if not controllers.exists() or "cpu" not in controllers.read_text().split():
            continue
        enabled = (directory / "cgroup.subtree_control").read_text().split()
        if "cpu" not in enabled:
            try:
                (directory / "cgroup.subtree_control").write_text("+cpu")
            except OSError as exc:  # EBUSY: processes in a non-root group; EACCES
                return None, f"cannot enable cpu in {directory}: {exc.strerror}"
        why = _writable_here(directory)
        if why is None:
            return directory, ""
        return None, why
    return None, f"cgroup v2 at {mount}: the cpu controller is not available"


def cpu_controller(
    mounts: Path = Path("/proc/self/mounts"), self_cgroup: Path = Path("/proc/self/cgroup")
) -> Controller:
    """The first writable CPU controller: cgroup v1's ``cpu`` hierarchy, else cgroup v2.
    Raises :class:`NoCpuController` naming what was tried."""
    reasons = []
    found = _mounts(mounts) if mounts.exists() else []
    for point, kind, options in found:
        if kind == "cgroup" and "cpu" in options:
            why = _writable_here(point)
            if why is None:
                return Controller(1, point)
            reasons.append(why)
    for point, kind, _ in found:
        if kind == "cgroup2":
            root, why = _v2_root(point, self_cgroup)
            if root is not None:
                return Controller(2, root, _v2_home(point, self_cgroup))
            reasons.append(why)
    if not found:
        reasons.append("no cgroup file system is mounted")
    raise NoCpuController(
        "no writable CPU controller (cgroup v1 cpu or v2 cpu.max): " + "; ".join(reasons)
    )


class CpuGroup:
    """One cgroup with a CPU quota of ``cores`` (None: unlimited, for accounting alone) and
    ``weight`` times the default share of the CPU when it is contended (v1 ``cpu.shares``, v2
    ``cpu.weight``): on a busy shared machine a heavier group gets its quota more often."""

    def __init__(
        self,
        controller: Controller,
        name: str,
        cores: float | None,
        period_us: int = PERIOD_US,
        weight: int = 1,
    ) -> None:
        self.controller = controller
        self.cores = cores
        self.period_us = period_us
        self.path = controller.root / name
        self.path.mkdir()
        try:
            self._limit(cores, period_us)
            if self.controller.version == 1:
                (self.path / "cpu.shares").write_text(str(1024 * weight))
            else:
                (self.path / "cpu.weight").write_text(str(min(10000, 100 * weight)))
        except OSError:
            self.path.rmdir()
            raise

    def _limit(self, cores: float | None, period_us: int) -> None:
        quota = -1 if cores is None else max(1000, round(cores * period_us))
        if self.controller.version == 1:
            (self.path / "cpu.cfs_period_us").write_text(str(period_us))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            limit = "max" if quota < 0 else str(quota)
            (self.path / "cpu.max").write_text(f"{limit} {period_us}")

    def add(self, pid: int) -> None:
        """Move process ``pid`` (every thread of it) into this group; children it starts later
        start here too."""
        (self.path / "cgroup.procs").write_text(str(pid))

    def pids(self) -> list[int]:
        return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]

    def stat(self) -> CpuStat:
        fields = dict(line.split() for line in (self.path / "cpu.stat").read_text().splitlines())
        if self.controller.version == 1:
            throttled_s = int(fields.get("throttled_time", 0)) / 1e9
        else:
            throttled_s = int(fields.get("throttled_usec", 0)) / 1e6
        return CpuStat(
            int(fields.get("nr_periods", 0)), int(fields.get("nr_throttled", 0)), throttled_s
        )

    def remove(self) -> None:
        """Move the processes still here to the parent group (v2: to this process's own, as a
        v2 group with children may hold none), then delete this one."""
        target = (self.controller.home or self.path.parent) / "cgroup.procs"
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                target.write_text(str(pid))
        try:
            self.path.rmdir()
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise


class CoreGroup(CpuGroup):
    """A simulated core that is a real one (:class:`RealCores`): no cgroup and no quota, the
    processes added pinned to ``cpus`` (every thread; ``None``: left where they are). A process
    of one busy thread then uses at most one core; nothing is throttled, so :meth:`stat` reads
    zeros, and whether a core was the limit is read from the CPU the process used."""

    def __init__(self, cpus: frozenset[int] | None) -> None:  # no cgroup: CpuGroup's state unset
        self.cpus = cpus
        self.cores = None if cpus is None else float(len(cpus))
        self._pids: list[int] = []

    def add(self, pid: int) -> None:
        self._pids.append(pid)
        if self.cpus is None:
            return
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
                os.sched_setaffinity(int(task), self.cpus)

    def pids(self) -> list[int]:
        return list(self._pids)

    def stat(self) -> CpuStat:
        return CpuStat(0, 0, 0.0)

    def remove(self) -> None:
        self._pids.clear()


def _physical_core(cpu: int) -> tuple[str, str]:
    """(package, core) of a logical CPU, or (its own number, "") where sysfs does not say."""
    topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
    try:
        return (
            (topology / "physical_package_id").read_text().strip(),
            (topology / "core_id").read_text().strip(),
        )
    except OSError:
        return str(cpu), ""


class RealCores:
    """Whole cores instead of quotas, for a machine with more cores than the processes measured
    and their load (a 16-core machine; ``bench.scaling.cores --real-cores``): ``relays`` logical
    CPUs, each on a physical core of its own and none on CPU 0's, for the measured processes
    (:meth:`group`); the others this process may use for the load (:meth:`load`), leaving the
    measured cores' hyperthread siblings idle where at least four CPUs remain without them.

    Raises :class:`NoCpuController` where there are not enough cores for that and two more.
    ``allowed`` and ``core_of`` (a CPU's physical core) are the machine's unless given."""

    def __init__(
        self,
        relays: int,
        allowed: Iterable[int] | None = None,
        core_of: Callable[[int], tuple[str, str]] = _physical_core,
    ) -> None:
        cpus = sorted(os.sched_getaffinity(0) if allowed is None else allowed)
        taken = {core_of(cpus[0])}
        mine: list[int] = []
        for cpu in cpus[1:]:
            core = core_of(cpu)
            if core not in taken and len(mine) < relays:
                taken.add(core)
                mine.append(cpu)
        rest = [cpu for cpu in cpus if cpu not in mine]
        if len(mine) < relays or len(rest) < 2:
            raise NoCpuController(
                f"{relays} whole cores and two CPUs for the load are needed; this process may "
                f"use {len(cpus)} CPUs on {len({core_of(c) for c in cpus})} physical cores"
            )
        measured = {core_of(cpu) for cpu in mine}
        apart = [cpu for cpu in rest if core_of(cpu) not in measured]
        self.relay_cpus = mine
        self.load_cpus = frozenset(apart if len(apart) >= 4 else rest)

    def group(self, index: int, threads: int = 1) -> CoreGroup:
        """The ``index``-th relay group's cores (``threads`` of them)."""
        return CoreGroup(frozenset(self.relay_cpus[index * threads : (index + 1) * threads]))

    def load(self) -> CoreGroup:
        return CoreGroup(self.load_cpus)

    def describe(self) -> str:
        return (
            f"real cores, no quota: measured processes on CPUs {self.relay_cpus} (a physical "
            f"core each), the load on CPUs {sorted(self.load_cpus)}"
        )
