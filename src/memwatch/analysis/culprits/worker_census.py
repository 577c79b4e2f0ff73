"""A census inside each DataLoader worker: which attribute of the Dataset grows, per worker.

The main process cannot see a worker's heap: a per-worker cache in the Dataset (filled in
``__getitem__``, a copy per worker) shows only as the workers' private memory growing. So each
worker answers a census of its own:

* **in the worker** — a forked child of a process whose session watches workers starts a
  daemon thread (from ``os.register_at_fork``, :class:`WorkerCensus`), which waits until the
  child is a DataLoader worker (``torch.utils.data.get_worker_info()``; any other child: it
  stops within :data:`WAIT_S`), answers a first census at once (its baseline), then one more
  as soon as the main process asks (it reads the request, a word of memory shared since before
  the fork, every :data:`TICK_S`) and whenever the Dataset's containers moved (every
  :data:`POLL_S` at most): each answer says what every container gained since the latest
  request, and in each of the stretches between the requests before. Off the worker's data
  path (a thread that sleeps between reads of one word), bounded in time (a sample of the new
  elements weighed, at most :data:`MAX_ATTRS` containers, lengths read in microseconds) and in
  size (a JSON file of those entries, per worker). It touches only the Dataset's containers
  and their new elements: copy-on-write of what the worker reads stays what it was.
* **in the main process** — at each check :meth:`WorkerCensus.ask` asks (the shared word, and
  a request file for a worker forked without it) and waits a bounded few milliseconds for the
  answers to that request, so that the stretch each answer measures is the one between this
  check and the previous one, whatever the machine's load did to the workers' threads; an
  answer still missing at the deadline is read as it stands (a stretch that ended at the
  worker's latest answer). A container that grew over the stretch before the last check and
  over the one since is the evidence that confirms a worker's leak at the second check after
  its workers start (:mod:`memwatch.analysis.rules.workers`), and its name is the culprit.

What a census looks at (the Dataset's containers, by length, the new elements weighed) is
:mod:`memwatch.analysis.culprits.dataset_containers`.

Files, under ``<out_dir>/workers/``: ``request`` (the main's sequence number) and
``<pid>.json`` (each worker's latest answer); private, written atomically, read with a size cap.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import mmap
import os
import struct
import sys
import threading
import time
from typing import Any

from memwatch.analysis.culprits.dataset_containers import MAX_ATTRS, dataset_lengths, vars_of
from memwatch.analysis.culprits.growth.weigh import Scale, element_name, new_elements
from memwatch.analysis.evidence import WorkerAttr, WorkerGrowth
from memwatch.core import safefs
from memwatch.core.forking import ForkRegistry
from memwatch.core.untrusted import loads_json
from memwatch.probes import procfs

__all__ = ["MAX_ATTRS", "WAIT_S", "WorkerCensus", "dataset_lengths", "summarize"]

log = logging.getLogger("memwatch")

#: A forked child waits this long to become a DataLoader worker, then its thread ends.
WAIT_S = 30.0
#: How often a worker's thread answers again when its Dataset's containers moved (seconds, off
#: the data path): what a check that could not wait for its answers reads is at most this old.
POLL_S = 0.2
#: How often a worker's thread reads the request word (seconds: a read of 8 bytes of shared
#: memory): how late after a check a worker answers it, scheduling aside.
TICK_S = 0.01
#: How long a check waits for the answers to its request: :data:`ANSWER_WAIT_SHARE` of the
#: time since the previous check, within [:data:`ANSWER_WAIT_MIN_S`, :data:`ANSWER_WAIT_MAX_S`]
#: (at checks 4 s apart, 40 ms at most: 1 % of the run, and only while a worker is late).
ANSWER_WAIT_SHARE = 0.01
ANSWER_WAIT_MIN_S = 0.03
ANSWER_WAIT_MAX_S = 0.06
#: An answer file larger than this is not read.
MAX_ANSWER_BYTES = 64 * 1024
#: Answers read at a check (the first workers by pid).
MAX_WORKERS = 256
_REQUEST = "request"

_in_children = ForkRegistry("serve_in_child")


class WorkerCensus:
    """Both halves of the workers' censuses for one session (see the module doc)."""

    def __init__(self, directory: str, share: str = "private") -> None:
        self.directory = directory
        self.share = share
        self.seq = 0
        self._pid = os.getpid()
        self._word = _shared_word()  # the request, shared with the workers forked after this
        self._asked_at: float | None = None
        _in_children.add(self)  # (the folder is made when a check or a worker first needs it)

    # ------------------------------------------------------------------ main process
    def ask(self) -> WorkerGrowth:
        """Ask the workers for a census and read their answers (each says what grew in it over
        the stretch since the previous request), waiting a bounded few milliseconds for the
        answers to this request. Never raises."""
        now = time.monotonic()
        try:
            answers = self._read()
        except Exception as e:  # noqa: BLE001 - evidence only
            log.debug("memwatch: workers' censuses not read (%s)", e)
            answers = []
        if not answers and not self._workers_live():
            return WorkerGrowth()  # no worker to ask: no folder, no request
        self.seq += 1
        self._request()
        if answers:  # workers that answered before answer this request too
            answers = self._await(self.seq, now + self._wait_s(now), answers)
        self._asked_at = now
        return summarize(answers, self.seq)

    def _request(self) -> None:
        if self._word is not None:
            with contextlib.suppress(Exception):
                struct.pack_into("q", self._word, 0, self.seq)
        try:
            fd = safefs.open_dir(self.directory, create=True, share=self.share)
            try:
                safefs.write_atomic(fd, _REQUEST, str(self.seq).encode(), share=self.share)
            finally:
                os.close(fd)
        except Exception as e:  # noqa: BLE001
            log.debug("memwatch: workers' census not requested (%s)", e)

    def _wait_s(self, now: float) -> float:
        since = now - self._asked_at if self._asked_at is not None else 0.0
        return min(max(ANSWER_WAIT_SHARE * since, ANSWER_WAIT_MIN_S), ANSWER_WAIT_MAX_S)

    def _await(self, seq: int, deadline: float, answers: list[dict[str, Any]]
               ) -> list[dict[str, Any]]:
        """The workers' answers once every one answered request ``seq`` (or at ``deadline``,
        as they stand): a worker reads the request within :data:`TICK_S`."""
        while not all(_seq_of(d) >= seq for d in answers) and time.monotonic() < deadline:
            time.sleep(0.001)
            try:
                answers = self._read()
            except Exception as e:  # noqa: BLE001 - evidence only
                log.debug("memwatch: workers' censuses not read (%s)", e)
                return answers
        return answers

    def _workers_live(self) -> bool:
        """Some child of this process runs (a DataLoader worker may answer a request)."""
        if not sys.platform.startswith("linux"):
            return True
        return bool(procfs.children_of(os.getpid()))

    def _read(self) -> list[dict[str, Any]]:
        if not os.path.isdir(self.directory):
            return []
        names = sorted(n for n in os.listdir(self.directory)
                       if n.endswith(".json") and n[:-5].isdigit())[:MAX_WORKERS]
        out = []
        for n in names:
            if not _alive(int(n[:-5])):  # a worker gone (a pass of non-persistent workers)
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.directory, n))
                continue
            try:
                doc = loads_json(safefs.read_bounded(os.path.join(self.directory, n),
                                                     MAX_ANSWER_BYTES), n)
            except (OSError, ValueError):
                continue
            if isinstance(doc, dict) and isinstance(doc.get("attrs"), dict):
                out.append(doc)
        return out

    # ------------------------------------------------------------------ in a worker
    def serve_in_child(self) -> None:
        """Called in every forked child: serve censuses if it becomes a DataLoader worker."""
        if os.getpid() == self._pid:
            return
        t = threading.Thread(target=self._serve, name="memwatch-worker-census", daemon=True)
        t.start()

    def _serve(self) -> None:
        try:
            info = _wait_for_worker()
            if info is None:
                return
            parent = os.getppid()
            worker = _Answers(info.dataset, self._requested())
            self._answer(worker.doc(os.getpid(), int(info.id)))  # the baseline, at once
            while os.getppid() == parent:
                seq = self._next_request(worker.seq)
                if worker.update(seq):  # a new request, or containers moved
                    self._answer(worker.doc(os.getpid(), int(info.id)))
        except Exception as e:  # noqa: BLE001 - never disturb the worker
            log.debug("memwatch: worker census stopped (%s)", e)

    def _next_request(self, seen: int) -> int:
        """The latest request, once one newer than ``seen`` came (read every :data:`TICK_S`)
        or :data:`POLL_S` passed."""
        if self._word is None:  # no shared word: the request file, once a poll
            time.sleep(POLL_S)
            return self._requested()
        deadline = time.monotonic() + POLL_S
        while True:
            seq = self._requested()
            if seq > seen or time.monotonic() >= deadline:
                return seq
            time.sleep(TICK_S)

    def _requested(self) -> int:
        if self._word is not None:
            with contextlib.suppress(Exception):
                return int(struct.unpack_from("q", self._word, 0)[0])
        try:
            data = safefs.read_bounded(os.path.join(self.directory, _REQUEST), 64)
            return int(data.decode().strip() or 0)
        except (OSError, ValueError):
            return 0

    def _answer(self, doc: dict[str, Any]) -> None:
        fd = safefs.open_dir(self.directory, create=True, share=self.share)
        try:
            safefs.write_atomic(fd, f"{os.getpid()}.json", json.dumps(doc).encode(),
                                share=self.share)
        finally:
            os.close(fd)


def _shared_word() -> mmap.mmap | None:
    """8 bytes of anonymous memory shared with every child forked after this (a request is
    read there without a system call); None where it cannot be had (the request file then)."""
    try:
        return mmap.mmap(-1, mmap.PAGESIZE)
    except (OSError, ValueError):
        return None


def _seq_of(doc: dict[str, Any]) -> int:
    seq = doc.get("seq", 0)
    return int(seq) if isinstance(seq, int | float) else 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # someone else's (not ours to judge)
    return True


def _wait_for_worker() -> Any:
    """``get_worker_info()`` once this child is a DataLoader worker, or None."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        data = sys.modules.get("torch.utils.data")
        get = getattr(data, "get_worker_info", None)
        info = get() if get is not None else None
        if info is not None:
            return info
        time.sleep(0.05)
    return None


class _Answers:
    """One worker's censuses: the lengths of its Dataset's containers at the last requests it
    saw, and now. An answer says, per container, what it gained since the latest request
    (``len_delta``, weighed) and in the stretches between the requests before, the latest first
    (``before``, ``earlier``, ``earliest``). An answer made as a request is seen also weighs
    ``recent``, what the container gained since the request before it (the stretch that just
    ended, and the few items fed since): that is the one the main process, waiting for this
    answer, reads as the stretch between its last two checks."""

    def __init__(self, dataset: Any, seq: int) -> None:
        self.dataset = dataset
        self.seq = seq
        self.refs: dict[str, tuple[Any, str]] = {}  # what each name's growth is weighed from
        self.now, self.cpu_ms = dataset_lengths(dataset, self.refs)
        self.at_request = dict(self.now)  # lengths at the latest request seen
        self.before: dict[str, int] = {}  # gained between the two latest requests
        self.earlier: dict[str, int] = {}  # ... and between the two before those
        self.earliest: dict[str, int] = {}  # ... and the stretch before that
        self.fresh = False  # this answer is the first since a new request

    def update(self, seq: int) -> bool:
        """Take the census again (at a new request: mark it). True when the answer changed."""
        self.refs = {}
        now, self.cpu_ms = dataset_lengths(self.dataset, self.refs)
        changed = now != self.now or seq > self.seq
        self.fresh = seq > self.seq
        if self.fresh:
            self.earliest, self.earlier = self.earlier, self.before
            self.before = {k: n - self.at_request[k][0] for k, (n, kind) in now.items()
                           if k in self.at_request and self.at_request[k][1] == kind}
            self.at_request = dict(now)
            self.seq = seq
        self.now = now
        return changed

    def doc(self, pid: int, worker: int) -> dict[str, Any]:
        attrs: dict[str, dict[str, Any]] = {}
        for name, (n, kind) in self.now.items():
            base = self.at_request.get(name)
            delta = n - base[0] if base is not None and base[1] == kind else 0
            before = self.before.get(name, 0)
            entry: dict[str, Any] = {"kind": kind, "len": n, "len_delta": delta,
                                     "before": before,
                                     "earlier": self.earlier.get(name, 0),
                                     "earliest": self.earliest.get(name, 0)}
            if delta > 0:
                entry["bytes_delta"], entry["element"] = self._weigh(name, kind, n, delta)
            if self.fresh and before + delta > 0:
                entry["recent"] = before + delta
                entry["recent_bytes"], entry["element"] = self._weigh(name, kind, n,
                                                                      before + delta)
            attrs[name] = entry
        return {"pid": pid, "worker": worker, "seq": self.seq, "t": time.time(),
                "dataset": type(self.dataset).__qualname__, "attrs": attrs,
                "cpu_ms": self.cpu_ms, "fresh": self.fresh}

    def _weigh(self, name: str, kind: str, n: int, delta: int) -> tuple[float, str]:
        """What a container's new elements weigh: a sample of them (16), each buffer once,
        scaled to all (no pass over the worker's heap: its pages stay shared); for an attribute
        counted over a list of objects, a sample of its values."""
        c, attr = self.refs.get(name, (None, ""))
        if c is None:
            return 0.0, ""
        scale = Scale()
        try:
            if attr:
                sample = [v[attr] for v in map(vars_of, c[::max(len(c) // 1024, 1)])
                          if attr in v][-16:]
                kind = "list"
            else:
                sample = new_elements(c, kind, delta)
            if not sample:
                return 0.0, ""
            w = sum(scale.weigh(x) for x in sample)
            last = sample[-1]
            return w / len(sample) * delta, element_name(
                last[1] if kind in ("dict", "cache") else last)
        finally:
            scale.close()


def _int(v: Any) -> int:
    return int(v) if isinstance(v, int | float) else 0


def summarize(answers: list[dict[str, Any]], seq: int | None = None) -> WorkerGrowth:
    """The workers' answers as one value: per attribute, how many workers it grew in, by how
    many elements and bytes per worker (their mean), its length now (the largest). An answer
    made as the worker saw request ``seq`` (the one this check just made) measures the stretch
    between this check and the previous one exactly: its ``recent`` is that stretch and its
    ``earlier`` the one before; any other answer is read as it stands (what grew since the
    request it saw last, and the stretches before)."""
    by_name: dict[str, list[dict[str, Any]]] = {}
    for doc in answers:
        answered = seq is not None and _seq_of(doc) >= seq and doc.get("fresh") is True
        for name, e in doc["attrs"].items():
            if isinstance(e, dict) and isinstance(e.get("len_delta"), int | float):
                by_name.setdefault(str(name), []).append(_at_check(e) if answered else e)
    attrs = _grown(by_name, "len_delta")
    if attrs:
        attrs.sort(key=lambda a: a.bytes_delta * a.workers, reverse=True)
    else:
        # None grew since the latest request a worker saw: a worker that could not answer this
        # check's request in time saw the previous one up to :data:`POLL_S` late, so where a
        # stretch between checks is shorter than that, all it made after the request counts
        # before it. Named from that stretch, its growth since 0 and unweighed.
        attrs = sorted((dataclasses.replace(a, len_delta=0) for a in _grown(by_name, "before")),
                       key=lambda a: a.before * a.workers, reverse=True)
    datasets = sorted({str(d.get("dataset", "?")) for d in answers})
    return WorkerGrowth(answered=len(answers), attrs=attrs, datasets=datasets,
                        seqs=sorted({_seq_of(d) for d in answers}))


def _at_check(e: dict[str, Any]) -> dict[str, Any]:
    """An entry answered as its worker saw this check's request, as the stretches between
    checks: the one that just ended (``recent``) is "since the last check"."""
    out = {**e, "len_delta": _int(e.get("recent")), "before": _int(e.get("earlier")),
           "earlier": _int(e.get("earliest"))}
    out["bytes_delta"] = e.get("recent_bytes", 0)
    return out


def _mean(entries: list[dict[str, Any]], key: str) -> int:
    return round(sum(_int(e.get(key)) for e in entries) / len(entries))


def _grown(by_name: dict[str, list[dict[str, Any]]], key: str) -> list[WorkerAttr]:
    """Per container, the workers' answers in which ``key`` (``len_delta``: since the latest
    request; ``before``: the stretch before it) is positive, as one value (their means)."""
    out = []
    for name, entries in by_name.items():
        grew = [e for e in entries if isinstance(e.get(key), int | float) and e[key] > 0]
        if grew:
            out.append(WorkerAttr(
                name=name, kind=str(grew[0].get("kind", "")),
                length=max(int(e.get("len", 0) or 0) for e in entries),
                len_delta=round(sum(e["len_delta"] for e in grew) / len(grew)),
                bytes_delta=sum(float(e.get("bytes_delta", 0) or 0) for e in grew) / len(grew),
                element=str(grew[-1].get("element", "") or ""), workers=len(grew),
                before=_mean(grew, "before"), earlier=_mean(grew, "earlier")))
    return out
