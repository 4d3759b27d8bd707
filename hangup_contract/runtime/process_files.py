"""Metrics of several processes, from prometheus_client's multiprocess files, read so that a
scrape never fails.

Each process of a scaled gateway or proxy writes its counters and histograms to files in a
shared directory (``PROMETHEUS_MULTIPROC_DIR``); whoever answers a scrape merges them.
prometheus_client's own collector fails the whole scrape on one file it cannot read, and files
are routinely in such a state: a process that is starting (its supervisor just restarted it)
has created its file but not yet sized it (empty), a process killed in the middle leaves
what it left, and a live gauge's file is removed when its process is marked dead. A scrape
then answered 500, exactly while something had gone wrong.

:class:`ProcessFiles` reads every file first and merges only those it could read whole; a file
it cannot read is skipped for that scrape, reported through ``on_skipped`` (each side counts it
in ``hangup_<side>_metrics_files_skipped_total``) and logged once per file. A just-created file
is readable at the next scrape, so its process's counts are late by one scrape, never lost.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import struct
from collections.abc import Callable, Iterator

from prometheus_client.core import Metric
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from hangup_contract.runtime.logs import log_event

log = logging.getLogger("hangup.metrics.files")

_UNREADABLE = (OSError, struct.error, RuntimeError, ValueError, TypeError)
"""What reading a file that is empty, cut short, removed or not prometheus_client's raises
(``RuntimeError``: its length field points past its end; ``ValueError``: a key that is not the
JSON it should be, or bytes that are not UTF-8)."""


class ProcessFiles(Collector):
    """The merged families of every readable ``*.db`` file in ``path`` (those whose name
    ``keep`` accepts, when given). Never raises from :meth:`collect`: what cannot be read is
    skipped and reported through ``on_skipped`` with the file's name."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        on_skipped: Callable[[str], None],
        keep: Callable[[str], bool] | None = None,
    ) -> None:
        self._path = os.fspath(path)
        self._on_skipped = on_skipped
        self._keep = keep
        self._logged: set[str] = set()  # files already logged as skipped

    def collect(self) -> Iterator[Metric]:
        files = sorted(glob.glob(os.path.join(self._path, "*.db")))
        self._logged &= {os.path.basename(f) for f in files} | {"*"}  # bounded by the files
        readable = [f for f in files if self._read(f)]
        try:
            families = MultiProcessCollector.merge(readable)  # type: ignore[no-untyped-call]
        except _UNREADABLE as exc:
            # A file read whole a moment ago cannot have shrunk (they only grow); one that was
            # removed since (its process marked dead) is all that is left. Skip this scrape's
            # files rather than fail it.
            self._skipped("*", exc)
            return
        for family in families:
            if self._keep is None or self._keep(family.name):
                yield family

    def _read(self, path: str) -> bool:
        """Whether ``path`` reads whole: its length field, every entry, every key's JSON."""
        try:
            for key, _, _, _ in MmapedDict.read_all_values_from_file(path):  # type: ignore[no-untyped-call]
                _, _, labels, _ = json.loads(key)
                if not isinstance(labels, dict):
                    raise ValueError(f"labels are {type(labels).__name__}, not an object")
        except _UNREADABLE as exc:
            self._skipped(os.path.basename(path), exc)
            return False
        return True

    def _skipped(self, name: str, exc: BaseException) -> None:
        self._on_skipped(name)
        if name not in self._logged:
            self._logged.add(name)
            log_event(log, "metrics_file_skipped", logging.WARNING, file=name, error=repr(exc))
