"""meshlab.apply(backend="dtensor") and `meshlab check --backend dtensor` on 8 gloo processes (slow: a minute).

The small Qwen-Image of test_apply_check under the built-in strategies DTensor can express, and an uneven split
(20 rows over data x model: 3, 3, 3, 1 per half where XLA pads each of 8 shards to 3), all on one set of ranks.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.check.test_apply_check import PADDED, SMALL
from tests.conftest import REPO

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("torch", "diffusers")),
                       reason="needs torch and diffusers: pip install -e '.[xla]'"),
]

#: Built-in strategies DTensor runs (the others: see test_the_ones_it_cannot_are_refused_with_the_reason).
EXPRESSIBLE = ("data", "model", "2d", "pairs", "fsdp", "ulysses")
#: ulysses.yaml's mesh and rules as USP (the tokens over ring x seq, Ulysses over seq, the ring kept at the kernel)
USP_AS = {"  cfg: 2\n  seq: 4": "  cfg: 2\n  ring: 2\n  seq: 2", "  sequence: seq\n": "  sequence: [ring, seq]\n",
          "spec: [cfg, seq, null]": "spec: [cfg, [ring, seq], null]",
          "spec: [cfg, null, seq]": "spec: [cfg, ring, seq]"}
USP = re.compile("|".join(re.escape(k) for k in USP_AS))


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    from meshlab.models.importer.card_import import import_card, write_card
    from meshlab.check.against_dtensor import run_dtensor_checks
    from meshlab.check.setup import CheckOptions

    folder = tmp_path_factory.mktemp("dtensor")
    class_name, config = SMALL["qwen"]
    card = write_card(import_card(class_name, config, "qwen-small"), folder / "qwen-small.json")
    paths = {}
    for name in EXPRESSIBLE:
        text = (REPO / "strategies" / f"{name}.yaml").read_text()
        paths[name] = folder / f"{name}.yaml"
        paths[name].write_text(re.sub(r"(?m)^model: .*$", f"model: {card}", text))
    paths["padded"] = folder / "padded.yaml"
    paths["padded"].write_text(PADDED.format(card=card))
    paths["usp"] = folder / "usp.yaml"  # ulysses.yaml as USP: cfg 2 x ring 2 x Ulysses 2 (issue 26)
    usp, made = USP.subn(lambda m: USP_AS[m.group(0)], paths["ulysses"].read_text())
    assert made == 5, made  # the mesh, the sequence and the three rules' specs
    paths["usp"].write_text(usp)
    keys = sorted(paths)
    return dict(zip(keys, run_dtensor_checks([paths[k] for k in keys], CheckOptions(layers=2))))


@pytest.mark.parametrize("name", EXPRESSIBLE + ("usp",))
def test_every_rank_holds_its_planned_slice_and_the_forward_matches(reports, name):
    """Every rank's shards and the forward, under each layout DTensor expresses, USP (ring 2 x Ulysses 2 beside cfg
    2) too, whose re-splits DTensor runs as all-gathers (no ring passes: as XLA's partitioner, it gathers)."""
    report = reports[name]
    assert report.world == 8
    assert not report.mismatches, [p.to_json() for p in report.mismatches[:3]]
    assert report.output_agrees, (report.max_abs_error, report.tolerance)
    assert report.local_weight_bytes == report.predicted_weight_bytes
    from meshlab.check.against_dtensor import dtensor_check_document
    from meshlab.check.documents import DTensorCheckDocument

    DTensorCheckDocument.model_validate_json(json.dumps(dtensor_check_document(report)))  # as the CLI reads it back


def test_uneven_splits_follow_torch_chunk_on_each_rank(reports):
    report = reports["padded"]
    (norm,) = [p for p in report.parameters if p.name == "txt_norm.weight"]
    # split over data then model: 10 rows per data half, then 3, 3, 3, 1 of them per model rank, where XLA's flat
    # padded split of 20 into 8 gives 3, 3, 3, 3, 3, 3, 2, 0 rows of real data
    assert norm.shard_shapes == ((3,), (3,), (3,), (1,)) * 2
    assert norm.agrees and report.agrees
    # the busiest rank holds XLA's padded shard; the lightest holds less
    assert max(report.local_weight_bytes) == report.predicted_weight_bytes[0]
    assert min(report.local_weight_bytes) < max(report.local_weight_bytes)


def test_dtensor_issues_the_all_reduces_the_cost_model_predicts_for_pairs(reports):
    """Pairs splits each Linear pair column then row: one all-reduce per pair, as XLA also does."""
    report = reports["pairs"]
    predicted = report.predicted_per_block()["transformer_blocks.0"]
    assert report.collectives_per_block["transformer_blocks.0"].get("all-reduce") == predicted["all-reduce"]


@pytest.mark.parametrize("strategy, message, code", [
    ("hybrid", "DTensor cannot hold attention.qkv (activations.rules[1])", 2),
])
def test_the_ones_it_cannot_are_refused_with_the_reason(strategy, message, code):
    result = subprocess.run([sys.executable, "-m", "meshlab", "check", f"strategies/{strategy}.yaml", "--backend",
                             "dtensor", "--layers", "1"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == code, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_model_dtensor_has_no_rule_for_stops_with_the_op_named(tmp_path):
    """Wan 2.1's forward calls aten.unbind, which DTensor in torch 2.9 has no sharding rule for: exit 3, one line."""
    from meshlab.models.importer.card_import import import_card, write_card

    class_name, config = SMALL["wan"]
    card = write_card(import_card(class_name, config, "wan-small"), tmp_path / "wan-small.json")
    strategy = tmp_path / "wan.yaml"
    strategy.write_text(re.sub(r"(?m)^model: .*$", f"model: {card}",
                               (REPO / "strategies" / "wan-14b-v6e-8.yaml").read_text()))
    result = subprocess.run([sys.executable, "-m", "meshlab", "check", str(strategy), "--backend", "dtensor",
                             "--layers", "1"], cwd=REPO, capture_output=True, text=True, timeout=600)
    if result.returncode == 0:
        pytest.skip("this torch's DTensor runs Wan's forward")
    assert result.returncode == 3, result.stderr
    last = result.stderr.strip().splitlines()[-1]  # the lines before it are progress
    assert last.startswith("meshlab: error: ") and "cannot run this model's forward" in last and "unbind" in last
    assert result.stderr.count("meshlab: error") == 1 and "Traceback" not in result.stderr


def test_an_unknown_backend_is_exit_2():
    result = subprocess.run([sys.executable, "-m", "meshlab", "check", "strategies/2d.yaml", "--backend", "jax"],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "unknown backend 'jax'" in result.stderr


def test_no_rank_is_left_running_when_the_worker_dies():
    """Killing the process that started the ranks kills them too (PR_SET_PDEATHSIG); the check exits 3."""
    check = subprocess.Popen([sys.executable, "-m", "meshlab", "check", "strategies/2d.yaml", "--backend", "dtensor",
                              "--layers", "1"], cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        _watch_ranks_die_with_their_worker(check)
    finally:
        check.kill()  # a no-op once it has exited and been waited for
        check.wait()


def _watch_ranks_die_with_their_worker(check: subprocess.Popen) -> None:
    for line in check.stderr:
        if "starting 8 gloo processes" in line:
            break
    # The worker is the check's own child: the forkserver and the ranks forked from it name the worker's module
    # too (the forkserver's command line lists the modules it preloads), and are its descendants.
    worker = next((pid for pid, parent in _parents().items() if parent == check.pid
                   and "meshlab.workers.check_dtensor" in _cmdline(pid)), None)
    assert worker is not None, "the check started no dtensor worker"
    # The ranks import torch, arm their death signal, then join the gloo group. Each is stopped (SIGSTOP) once it
    # has joined, so none can finish the check and exit before all eight are seen; SIGKILL still ends a stopped one.
    # Each process is known by its pid and its start time, so that a pid the system gives again, to another test's
    # process, is neither counted nor killed.
    started: dict[int, int] = {}
    servers: dict[int, int | None] = {}  # the forkserver the ranks fork from, seen while the worker lives
    ours = {worker: _start(worker)}
    deadline = time.time() + 300
    try:
        while len(started) < 8:
            assert check.poll() is None, (f"the check ended before its ranks were seen ({len(started)} of 8 stopped, "
                                          f"{len(servers)} forkserver seen): {check.stderr.read()}")
            assert time.time() < deadline, f"the ranks did not start ({len(started)} of 8 joined)"
            servers |= {pid: _start(pid) for pid in _servers(worker) - servers.keys()}
            for pid in _ranks(worker) - started.keys():
                began = _start(pid)
                if _joined(pid) and began is not None:
                    with contextlib.suppress(ProcessLookupError):  # gone already: the check's end says why
                        os.kill(pid, signal.SIGSTOP)
                        started[pid] = began
            time.sleep(0.2)
        os.kill(worker, signal.SIGKILL)
        # the check reads the worker's output until every process holding it ends: ranks left would hold it, and
        # its stderr too (read on aside, with what the line loop above had already buffered)
        read: list[str] = []
        reader = threading.Thread(target=lambda: read.append(check.stderr.read()), daemon=True)
        reader.start()
        reader.join(timeout=120)
        if reader.is_alive():
            pytest.fail("the check did not end after its worker died: its ranks outlived it")
        rest = read[0]
        assert check.wait(timeout=60) == 3, rest
        assert "Traceback" not in rest
        deadline = time.time() + 30
        while _alive(started | servers) and time.time() < deadline:
            time.sleep(0.5)
        assert not _alive(started) and not _alive(servers)
    finally:  # nothing stopped or started is left behind, whatever failed (the ranks first: the worker may be gone)
        unseen = {pid: _start(pid) for pid in _ranks(worker)} if _alive(ours) else {}  # ranks not yet stopped
        for pid in _alive(started | unseen | servers | ours):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _ranks(worker: int) -> set[int]:
    """The rank processes `worker` started: the children of its multiprocessing forkserver (not the server itself),
    or on a CUDA host its spawned children (not its resource tracker)."""
    parents, servers = _parents(), _servers(worker)
    spawned = {pid for pid in _descendants(worker) if "multiprocessing.spawn" in _cmdline(pid)
               and "resource_tracker" not in _cmdline(pid)}
    return spawned | {pid for pid, parent in parents.items() if parent in servers}


def _servers(worker: int) -> set[int]:
    """The multiprocessing forkserver `worker` started (none on a CUDA host)."""
    return {pid for pid, parent in _parents().items() if parent == worker
            and "multiprocessing.forkserver" in _cmdline(pid)}


def _joined(pid: int) -> bool:
    """Has the rank opened a TCP socket, gloo's to the other ranks (so it is past arming PR_SET_PDEATHSIG)? A rank
    forked from a forkserver holds the server's Unix sockets from the start: those say nothing."""
    try:
        sockets = {link[len("socket:["):-1] for link in (os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir())
                   if link.startswith("socket:[")}
        tables = [Path(f"/proc/{pid}/net/{name}").read_text().splitlines()[1:] for name in ("tcp", "tcp6")]
    except OSError:
        return False
    return any(line.split()[9] in sockets for table in tables for line in table)


def _parents() -> dict[int, int]:
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    return parents


def _descendants(root: int) -> set[int]:
    parents = _parents()
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(processes: dict[int, int | None]) -> set[int]:
    """The pids of `processes` (pid: start time) still running: not gone, not a zombie, not another process since
    given the same pid."""
    return {pid for pid, began in processes.items()
            if began is not None and (stat := _stat(pid)) and _started(stat) == began and stat[0] != "Z"}


def _start(pid: int) -> int | None:
    """When the process started, in clock ticks after boot; None once it is gone."""
    stat = _stat(pid)
    return _started(stat) if stat else None


def _started(stat: list[str]) -> int:
    return int(stat[19])  # /proc/PID/stat's 22nd field


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command's name (its state first); None once the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None

