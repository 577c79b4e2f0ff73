"""A census inside each DataLoader worker: which attribute of the Dataset grows, per worker.

The main process cannot see a worker's heap: a per-worker cache in the Dataset (filled in
``__getitem__``, a copy per worker) shows only as the workers' private memory growing. So each
worker answers a census of its own:

* **in the worker** — a forked child of a process whose session watches workers starts a
  daemon thread (from ``os.register_at_fork``, :class:`WorkerCensus`), which waits until the
  child is a DataLoader worker (``torch.utils.data.get_worker_info()``; any other child: it
  stops within :data:`WAIT_S`), answers a first census at once (its baseline), then one more
  whenever the main process asks and whenever the Dataset's containers moved (every
  :data:`POLL_S` at most): each answer says what every container gained since the latest
  request, and between the two requests before. Off the worker's data path (a thread that
  sleeps between polls of one file), bounded in time (a sample of the new elements weighed, at
  most :data:`MAX_ATTRS` containers, lengths read in microseconds) and in size (a JSON file of
  those entries, per worker). It touches only the Dataset's containers and their new
  elements: copy-on-write of what the worker reads stays what it was.
* **in the main process** — at each check :meth:`WorkerCensus.ask` reads the workers' latest
  answers (what grew since the previous check, and in the stretch before it) and marks the
  next stretch (a request file, written atomically). A container that grew over both is the
  evidence that confirms a worker's leak at the second check after its workers start
  (:mod:`memwatch.analysis.rules.workers`), and its name is the culprit.

What a census looks at: the Dataset's attributes, its class's, and the globals of its module
(a user's ``_CACHE = {}``), and one level into attributes that are instances of the user's
classes (``self.reader.cache``): lists, dicts, sets, deques and functools caches, by length,
the new elements weighed (:mod:`.growth.weigh`).

Files, under ``<out_dir>/workers/``: ``request`` (the main's sequence number) and
``<pid>.json`` (each worker's latest answer); private, written atomically, read with a size cap.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import sys
import threading
import time
from typing import Any

from memwatch.analysis.culprits.census.containers import (
    CACHE_TYPE,
    CONTAINER_TYPES,
    cache_size,
)
from memwatch.analysis.culprits.census.ownership import is_user_module, is_user_type
from memwatch.analysis.culprits.growth.weigh import Scale, element_name, new_elements
from memwatch.analysis.culprits.holders.referrers import key_label
from memwatch.analysis.evidence import WorkerAttr, WorkerGrowth
from memwatch.core import safefs
from memwatch.core.forking import ForkRegistry
from memwatch.core.untrusted import loads_json
from memwatch.probes import procfs

__all__ = ["MAX_ATTRS", "WAIT_S", "WorkerCensus", "dataset_lengths", "summarize"]

log = logging.getLogger("memwatch")

#: Containers one census reports (the longest first).
MAX_ATTRS = 32
#: A forked child waits this long to become a DataLoader worker, then its thread ends.
WAIT_S = 30.0
#: How often a worker's thread looks for a new request and, when its Dataset's containers
#: moved, answers again (seconds, off the data path): what a check reads is at most this old.
POLL_S = 0.2
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
        _in_children.add(self)  # (the folder is made when a check or a worker first needs it)

    # ------------------------------------------------------------------ main process
    def ask(self) -> WorkerGrowth:
        """The workers' latest answers (what grew in each since its previous census), then a
        request for the next census. Never raises."""
        try:
            answers = self._read()
        except Exception as e:  # noqa: BLE001 - evidence only
            log.debug("memwatch: workers' censuses not read (%s)", e)
            answers = []
        if not answers and not self._workers_live():
            return WorkerGrowth()  # no worker to ask: no folder, no request
        self.seq += 1
        try:
            fd = safefs.open_dir(self.directory, create=True, share=self.share)
            try:
                safefs.write_atomic(fd, _REQUEST, str(self.seq).encode(), share=self.share)
            finally:
                os.close(fd)
        except Exception as e:  # noqa: BLE001
            log.debug("memwatch: workers' census not requested (%s)", e)
        return summarize(answers)

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
                time.sleep(POLL_S)
                if worker.update(self._requested()):  # a new request, or containers moved
                    self._answer(worker.doc(os.getpid(), int(info.id)))
        except Exception as e:  # noqa: BLE001 - never disturb the worker
            log.debug("memwatch: worker census stopped (%s)", e)

    def _requested(self) -> int:
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
    """One worker's censuses: the lengths of its Dataset's containers at the last two requests
    it saw, and now. An answer says, per container, what it gained since the latest request
    (the check the main process is in the middle of: ``len_delta``, weighed), between the two
    requests before (the previous stretch between checks: ``before``) and in the stretch before
    that (``earlier``): a worker sees a request up to a poll late, so a stretch shorter than
    that (a check inside an epoch a few steps before its end) can show nothing of its own."""

    def __init__(self, dataset: Any, seq: int) -> None:
        self.dataset = dataset
        self.seq = seq
        self.refs: dict[str, tuple[Any, str]] = {}  # what each name's growth is weighed from
        self.now, self.cpu_ms = dataset_lengths(dataset, self.refs)
        self.at_request = dict(self.now)  # lengths at the latest request seen
        self.before: dict[str, int] = {}  # gained between the two latest requests
        self.earlier: dict[str, int] = {}  # ... and between the two before those
        self.weights: dict[str, tuple[float, str]] = {}

    def update(self, seq: int) -> bool:
        """Take the census again (at a new request: mark it). True when the answer changed."""
        self.refs = {}
        now, self.cpu_ms = dataset_lengths(self.dataset, self.refs)
        changed = now != self.now or seq > self.seq
        if seq > self.seq:
            self.earlier = self.before
            self.before = {k: n - self.at_request[k][0] for k, (n, kind) in now.items()
                           if k in self.at_request and self.at_request[k][1] == kind}
            self.at_request = dict(now)
            self.seq = seq
            self.weights.clear()
        self.now = now
        return changed

    def doc(self, pid: int, worker: int) -> dict[str, Any]:
        attrs: dict[str, dict[str, Any]] = {}
        for name, (n, kind) in self.now.items():
            base = self.at_request.get(name)
            delta = n - base[0] if base is not None and base[1] == kind else 0
            entry: dict[str, Any] = {"kind": kind, "len": n, "len_delta": delta,
                                     "before": self.before.get(name, 0),
                                     "earlier": self.earlier.get(name, 0)}
            if delta > 0:
                entry["bytes_delta"], entry["element"] = self._weigh(name, kind, n, delta)
            attrs[name] = entry
        return {"pid": pid, "worker": worker, "seq": self.seq, "t": time.time(),
                "dataset": type(self.dataset).__qualname__, "attrs": attrs,
                "cpu_ms": self.cpu_ms}

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
                sample = [v[attr] for v in map(_vars, c[::max(len(c) // 1024, 1)])
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


def dataset_lengths(dataset: Any, refs: dict[str, tuple[Any, str]] | None = None
                    ) -> tuple[dict[str, tuple[int, str]], float]:
    """The length of every container the Dataset keeps (see :func:`_containers`), by name,
    and the CPU milliseconds that took. A list of the user's objects (``ConcatDataset``'s
    datasets) is also counted by attribute: how many of them have each attribute set, as
    ``Element.attr`` of kind ``"attribute"`` (a ``cached_property`` that every dataset a worker
    reads fills in: eva#387). ``refs`` gets, per name, what to weigh its growth from."""
    t0 = time.thread_time()
    out: dict[str, tuple[int, str]] = {}
    for name, c, kind in _containers(dataset):
        n = cache_size(c) if kind == "cache" else len(c)
        if n is None:
            continue
        out[name] = (n, kind)
        if refs is not None:
            refs[name] = (c, "")
        if kind == "list" and n >= 2 and is_user_type(type(c[0])):
            for attr, (count, tname) in _attribute_counts(c).items():
                out[f"{tname}.{attr}"] = (count, "attribute")
                if refs is not None:
                    refs[f"{tname}.{attr}"] = (c, attr)
    return out, round((time.thread_time() - t0) * 1000.0, 3)


#: Elements of a list of the user's objects whose attributes are counted (an even sample).
POPULATION_SAMPLE = 256


def _attribute_counts(items: list[Any]) -> dict[str, tuple[int, str]]:
    """How many of ``items`` (estimated from an even sample) have each instance attribute set,
    with their class's name."""
    stride = max(len(items) // POPULATION_SAMPLE, 1)
    counts: dict[str, int] = {}
    tname = type(items[0]).__name__
    for x in items[::stride][:POPULATION_SAMPLE]:
        for k in list(_vars(x)):
            if isinstance(k, str) and not k.startswith("__"):
                counts[k] = counts.get(k, 0) + 1
    return {k: (n * stride, tname) for k, n in counts.items()}


def _containers(dataset: Any) -> list[tuple[str, Any, str]]:
    """(name, container, kind) of what the Dataset keeps, at most :data:`MAX_ATTRS`."""
    out: list[tuple[str, Any, str]] = []
    cls = type(dataset)
    # (prefix, namespace, look one level into the user's instances in it)
    spaces: list[tuple[str, dict[str, Any], bool]] = [(cls.__name__, _vars(dataset), True),
                                                      (cls.__name__, dict(vars(cls)), False)]
    mod = sys.modules.get(cls.__module__)
    if mod is not None and is_user_module(mod):
        spaces.append((cls.__module__.rsplit(".", 1)[-1], vars(mod), False))
    for prefix, ns, deeper in spaces:
        for k, v in list(ns.items()):
            if not isinstance(k, str) or k.startswith("__"):
                continue
            name = f"{prefix}.{key_label(k).strip(chr(39))}"
            kind = _kind(v)
            if kind is not None:
                out.append((name, v, kind))
            elif deeper and is_user_type(type(v)) and not isinstance(v, type):
                for k2, v2 in list(_vars(v).items()):  # one level in: self.reader.cache
                    kind2 = _kind(v2)
                    if kind2 is not None and isinstance(k2, str):
                        out.append((f"{name}.{key_label(k2).strip(chr(39))}", v2, kind2))
    seen: set[int] = set()
    unique = []
    for n, c, k in out:
        if id(c) not in seen:
            seen.add(id(c))
            unique.append((n, c, k))
    return unique[:MAX_ATTRS]


def _kind(v: Any) -> str | None:
    if type(v) is CACHE_TYPE:
        return "cache"
    return CONTAINER_TYPES.get(type(v))


def _vars(o: Any) -> dict[str, Any]:
    try:
        d = object.__getattribute__(o, "__dict__")
    except Exception:  # noqa: BLE001 - slots, proxies
        return {}
    return d if isinstance(d, dict) else {}


def _int(v: Any) -> int:
    return int(v) if isinstance(v, int | float) else 0


def summarize(answers: list[dict[str, Any]]) -> WorkerGrowth:
    """The workers' answers as one value: per attribute, how many workers it grew in, by how
    many elements and bytes per worker (their mean), its length now (the largest)."""
    by_name: dict[str, list[dict[str, Any]]] = {}
    for doc in answers:
        for name, e in doc["attrs"].items():
            if isinstance(e, dict) and isinstance(e.get("len_delta"), int | float):
                by_name.setdefault(str(name), []).append(e)
    attrs = _grown(by_name, "len_delta")
    if attrs:
        attrs.sort(key=lambda a: a.bytes_delta * a.workers, reverse=True)
    else:
        # None grew since the latest request a worker saw: a worker sees a request up to
        # :data:`POLL_S` (and its scheduling) late, so where a stretch between checks is
        # shorter than that (epochs of 0.3 s), all it made after the request counts before
        # it. Named from that stretch, its growth since 0 and unweighed.
        attrs = sorted((dataclasses.replace(a, len_delta=0) for a in _grown(by_name, "before")),
                       key=lambda a: a.before * a.workers, reverse=True)
    datasets = sorted({str(d.get("dataset", "?")) for d in answers})
    return WorkerGrowth(answered=len(answers), attrs=attrs, datasets=datasets,
                        seqs=sorted({int(d.get("seq", 0) or 0) for d in answers}))


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
