"""A rank whose collective failed because another rank died (issue 45): its error is classified
``peer_failure`` and gets a bundle by default; the job's store tells it which rank failed first;
torchelastic's error file tells torchrun's summary where the bundle is; and the launcher's SIGTERM,
arriving while that bundle is being written, waits for it."""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch.distributed as dist

from memwatch.core.oom import OOM_KINDS, PEER_FAILURE, classify
from memwatch.runtime import peers
from memwatch.runtime.elastic import write_error_file
from memwatch.runtime.recorder_config import parse_bundle_on
from memwatch.testing import free_port

GLOO = ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        "[127.0.0.1]:31153. This is typically caused by a remote worker crashing.")
PEER_WORDING = [
    GLOO,
    "[../third_party/gloo/gloo/transport/tcp/pair.cc:598] Read error [10.0.0.2]:41234: "
    "Connection reset by peer",
    "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 1800000ms "
    "for recv operation to complete",
    "NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited or there was a network "
    "error, NCCL version 2.21.5\nncclRemoteError: A call failed possibly due to a network error "
    "or a remote process exiting prematurely.",
    "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=668, "
    "OpType=ALLREDUCE, NumelIn=52, NumelOut=52, Timeout(ms)=600000) ran for 600097 milliseconds "
    "before timing out.",
    "NCCL communicator was aborted on rank 3.",
    "Rank 1 failed to pass monitoredBarrier in 30000 ms",
]


@pytest.mark.parametrize("message", PEER_WORDING)
def test_backends_words_for_a_lost_peer(message: str) -> None:
    c = classify(RuntimeError(message))
    assert c.kind == PEER_FAILURE and not c.is_oom


def test_torch_distributed_errors_and_what_is_not_a_peer_failure() -> None:
    assert classify(dist.DistBackendError("ncclRemoteError: remote process exited")).kind == \
        PEER_FAILURE
    assert classify(dist.DistNetworkError("failed to recv, got 0 bytes")).kind == PEER_FAILURE
    # A DataLoader worker's half-received batch, words alone: not a collective.
    assert classify(ConnectionResetError(104, "Connection reset by peer")).kind == "other"
    assert classify(RuntimeError("Connection closed by peer")).kind == "other"
    assert classify(RuntimeError("gloo: invalid argument")).kind == "other"
    # An OOM anywhere in the chain wins: the peer failure was this rank's own OOM's consequence.
    try:
        try:
            raise RuntimeError(GLOO)
        except RuntimeError as e:
            raise MemoryError("out of memory while handling it") from e
    except MemoryError as e:
        assert classify(e).kind == "host_oom"


def test_peer_failures_get_a_bundle_by_default() -> None:
    assert parse_bundle_on("oom") == frozenset((*OOM_KINDS, PEER_FAILURE))
    assert PEER_FAILURE in parse_bundle_on("all") and PEER_FAILURE not in parse_bundle_on(
        ("host_oom",))


# ------------------------------------------------------------------ the job's failure board
def test_the_store_orders_the_jobs_failures() -> None:
    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=5))
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    job = {"id": "torchelastic-x", "attempt": 0}
    b1 = peers.FailureBoard.open(dist, job, rank=1, env=env)
    b3 = peers.FailureBoard.open(dist, job, rank=3, env=env)
    other_job = peers.FailureBoard.open(dist, {"id": "another", "attempt": 0}, rank=0, env=env)
    assert b1 is not None and b3 is not None and other_job is not None
    assert b1.first() is None
    assert b3.report("host_oom", {"rank": 1, "count": 2, "name": "node1"}, 100.0) == 1
    assert b1.report("cuda_oom", {"rank": 0, "count": 2, "name": "node0"}, 99.0) == 2
    first = b1.first()
    assert first == {"rank": 3, "node": {"rank": 1, "count": 2, "name": "node1"},
                     "kind": "host_oom", "time": 100.0}  # the first to arrive, whatever its clock
    assert other_job.first() is None  # keys of one job and attempt only
    # What a bundle records: a rank's own failure is reported; a peer failure reads the first.
    rank = {"rank": 2, "local_rank": 0, "world_size": 4, "node_rank": 1, "nnodes": 2}
    peers.use(b1)
    try:
        assert peers.on_failure(PEER_FAILURE, rank) == {"first": first, "source": "store"}
        assert peers.on_failure("host_oom", rank) is None
        assert int(server.add("memwatch/torchelastic-x/0/failures", 0)) == 3
        assert peers.on_failure(PEER_FAILURE, rank | {"world_size": 1}) is None
        fields = peers.job_fields(rank, job, PEER_FAILURE, "signal")
        assert fields["peer"] is None and fields["node"]["rank"] == 1  # a signal reports nothing
    finally:
        peers.use(None)
    assert peers.on_failure(PEER_FAILURE, rank) == {"first": None, "source": None}
    # Under torchrun the store lives in node 0's agent: once it exited, a late peer says so.
    del server
    peers.use(b1)
    try:
        gone = peers.on_failure(PEER_FAILURE, rank)
    finally:
        peers.use(None)
    assert gone is not None and gone["first"] is None and gone["source"] == "store"
    assert gone["unreachable"]
    assert peers.FailureBoard.open(dist, job, 0, env={}) is None  # init_method="tcp://..."


# ------------------------------------------------------------------ torchelastic's error file
def test_error_file_is_what_torchelastic_reads(tmp_path: Path) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    path = tmp_path / "error.json"
    env = {"TORCHELASTIC_ERROR_FILE": str(path)}
    try:
        raise RuntimeError(GLOO)
    except RuntimeError as e:
        e.add_note("memwatch: diagnostic bundle written to /runs/oom/b0 (look inside: ...)")
        assert write_error_file("/runs/oom/b0", "exception", e, PEER_FAILURE, env=env,
                                now=1700000000.2)
    pf = ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=str(path))
    assert pf.timestamp == 1700000001  # a consequence: the next whole second
    assert pf.message["message"].startswith("RuntimeError: [/pytorch/third_party/gloo")
    trace = pf.message["extraInfo"]["py_callstack"]
    assert "Traceback" in trace and trace.count("/runs/oom/b0") == 1
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    # A later failure of the same process replaces memwatch's own earlier story (that one was
    # recovered from) ...
    assert write_error_file("/runs/oom/b1", "exception", ValueError("x"), "other", env=env)
    assert "/runs/oom/b1" in path.read_text() and "/runs/oom/b0" not in path.read_text()
    # ... never a file someone else wrote: torchelastic's @record writes it with open("w").
    with open(path, "w") as f:
        json.dump({"message": {"message": "ValueError: x", "extraInfo": {
            "py_callstack": "Traceback ...", "timestamp": "1"}}}, f)
    mine = path.read_text()
    assert not write_error_file("/runs/oom/b9", "exception", ValueError("y"), "other", env=env)
    assert path.read_text() == mine
    path.unlink()
    assert write_error_file("/runs/oom/b2", "signal", None, None, env=env, now=5.0)
    pf = ProcessFailure(local_rank=0, pid=1, exitcode=-15, error_file=str(path))
    assert "/runs/oom/b2" in pf.message["extraInfo"]["py_callstack"] and pf.timestamp == 5
    # Nothing without the variable, for /dev/null (torchrun's --log-dir /dev/null), for bundles
    # that are not failures.
    for e in ({}, {"TORCHELASTIC_ERROR_FILE": ""}, {"TORCHELASTIC_ERROR_FILE": os.devnull}):
        assert not write_error_file("/b", "exception", ValueError("x"), "other", env=e)
    assert not write_error_file("/b", "manual", None, None, env={"TORCHELASTIC_ERROR_FILE":
                                                                  str(tmp_path / "m.json")})
    assert not (tmp_path / "m.json").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["error.json"]  # no temporary file left


SIGTERM_WHILE_WRITING = textwrap.dedent("""
    import os, signal, sys, time
    import memwatch
    from memwatch.testing import FakeDevice

    out, marker = sys.argv[1], sys.argv[2]

    class Slow:
        # A sink whose on_bundle runs inside the bundle's write: the launcher's SIGTERM comes now.
        def on_metrics(self, step, sample): pass
        def on_check(self, report): pass
        def close(self): pass
        def on_bundle(self, path, manifest):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)  # the handler has run by now (between bytecodes)
            with open(marker, "w") as f:
                f.write("the write went on after SIGTERM")

    with memwatch.watch(device=FakeDevice(total_bytes=1 << 30), workers=False, out_dir=out,
                        sinks=[Slow()]) as mw:
        for _ in range(5):
            mw.step()
        raise RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [h]:1")
""")


def test_sigterm_while_a_bundle_is_written_waits_for_it(tmp_path: Path) -> None:
    out, marker = tmp_path / "out", tmp_path / "marker"
    r = subprocess.run([sys.executable, "-c", SIGTERM_WHILE_WRITING, str(out), str(marker)],
                       capture_output=True, text=True, timeout=120,
                       env={k: v for k, v in os.environ.items()
                            if k != "TORCHELASTIC_ERROR_FILE"})
    assert r.returncode == -signal.SIGTERM, r.stderr[-3000:]  # the default action, afterwards
    assert marker.read_text() == "the write went on after SIGTERM"
    bundles = sorted((out / "oom").iterdir())
    assert len(bundles) == 1, bundles  # the peer failure's, whole; no second (signal) bundle
    m = json.loads((bundles[0] / "manifest.json").read_text())
    assert m["classification"] == PEER_FAILURE and m["complete"] is True
