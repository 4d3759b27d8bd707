"""bench.scaling.cores's CPU quotas: where no cgroup CPU controller can be written, the benchmark
says why and measures nothing; the wheel list it installs offline covers hangup's dependencies."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from bench.instruments.cgroups import NoCpuController, RealCores, cpu_controller

REPO = Path(__file__).resolve().parents[2]


def test_no_cgroup_mounted_is_refused_saying_so(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text("proc /proc proc rw 0 0\ntmpfs /tmp tmpfs rw 0 0\n")
    with pytest.raises(NoCpuController, match="no cgroup file system is mounted"):
        cpu_controller(mounts, tmp_path / "cgroup")


def test_v2_without_the_cpu_controller_is_refused_naming_it(tmp_path: Path) -> None:
    root = tmp_path / "unified"
    root.mkdir()
    (root / "cgroup.controllers").write_text("memory pids\n")
    (root / "cgroup.subtree_control").write_text("")
    mounts = tmp_path / "mounts"
    mounts.write_text(f"cgroup2 {root} cgroup2 rw 0 0\n")
    self_cgroup = tmp_path / "cgroup"
    self_cgroup.write_text("0::/\n")
    with pytest.raises(NoCpuController, match="cpu controller is not available"):
        cpu_controller(mounts, self_cgroup)


def test_v1_cpu_hierarchy_that_cannot_be_written_is_refused(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    missing = tmp_path / "not-mounted" / "cpu"
    mounts.write_text(f"cgroup {missing} cgroup rw,cpu 0 0\n")
    with pytest.raises(NoCpuController, match=f"cannot create a cgroup in {missing}"):
        cpu_controller(mounts, tmp_path / "cgroup")


def _name(requirement: str) -> str:
    return re.split(r"[<>=;\[ ]", requirement.strip(), maxsplit=1)[0].lower()


def test_the_offline_wheel_list_has_every_runtime_dependency() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lines = (REPO / "bench" / "scaling" / "requirements.txt").read_text().splitlines()
    listed = {_name(line) for line in lines if line.strip() and not line.startswith("#")}
    assert {_name(dep) for dep in project["dependencies"]} <= listed


def _smt(cpu: int) -> tuple[str, str]:
    """Eight physical cores, two hyperthreads each: CPU n and n + 8 share core n % 8."""
    return "0", str(cpu % 8)


def test_real_cores_give_each_measured_process_a_physical_core_away_from_the_load() -> None:
    cores = RealCores(4, range(16), _smt)
    assert len({_smt(cpu) for cpu in cores.relay_cpus}) == 4
    assert _smt(0) not in {_smt(cpu) for cpu in cores.relay_cpus}
    measured = {_smt(cpu) for cpu in cores.relay_cpus}
    assert cores.load_cpus and not {_smt(cpu) for cpu in cores.load_cpus} & measured
    assert cores.load_cpus | set(cores.relay_cpus) <= set(range(16))


def test_real_cores_share_the_siblings_with_the_load_when_little_is_left() -> None:
    cores = RealCores(3, range(8), lambda cpu: ("0", str(cpu % 4)))
    assert sorted(cores.load_cpus) == sorted(set(range(8)) - set(cores.relay_cpus))


def test_too_few_cores_for_real_cores_is_refused_saying_so() -> None:
    with pytest.raises(NoCpuController, match="4 whole cores"):
        RealCores(4, range(4), lambda cpu: ("0", str(cpu)))
