"""prometheus_client's multiprocess files as processes leave them, for scrapes to read: a good
one per process (written as a process writes it), and the states a file is in while its process
starts or after it was cut off."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.mmap_dict import MmapedDict, mmap_key


def write_counter(folder: Path, pid: int, family: str, value: float, **labels: str) -> Path:
    """``folder``'s counter file of process ``pid``, holding ``family_total{labels} = value``."""
    path = folder / f"counter_{pid}.db"
    key = mmap_key(family, f"{family}_total", list(labels), list(labels.values()), "test")
    values = MmapedDict(str(path))  # type: ignore[no-untyped-call]
    try:
        values.write_value(key, value, 0.0)  # type: ignore[no-untyped-call]
    finally:
        values.close()  # type: ignore[no-untyped-call]
    return path


def unreadable_files(folder: Path) -> list[str]:
    """Two files no scrape can read yet, beside ``folder``'s good ones; their names.

    - ``counter_900001.db``: empty, as prometheus_client leaves a file between creating it and
      sizing it (a process starting);
    - ``counter_900002.db``: cut in its last entry, its length field still counting the whole.
    """
    (folder / "counter_900001.db").touch()
    whole = write_counter(folder, 900002, "hangup_cut", 1.0).read_bytes()
    used = int.from_bytes(whole[:4], "little")
    (folder / "counter_900002.db").write_bytes(whole[: used - 6])
    return ["counter_900001.db", "counter_900002.db"]
