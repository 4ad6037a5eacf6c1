"""A process killed inside a section shared with its workers hangs nothing (issue 70, design §15).

The store's counters and give-up clock (storage/session.py) and the object cache's byte budget
(read_ahead/object_cache.py) are shared memory that the main process, its forked DataLoader
workers and the read-ahead's threads update. Their lock was multiprocessing's, a semaphore that
stays taken forever when its holder is SIGKILLed (the OOM killer): the parent's next
``counts()`` never returned. Each test forks a real process, parks it inside the section
through the function's own argument (a value whose arithmetic or comparison, run inside the
section, blocks), SIGKILLs it there, and calls the same functions in the parent under a
deadline. A scan of the source keeps any new lock-carrying multiprocessing primitive out.
"""

from __future__ import annotations

import ast
import gc
import os
import signal
import threading
import time

import pytest
from conftest import REPO

DEADLINE_S = 10


def park_forever(ready_fd: int):
    os.write(ready_fd, b"x")
    while True:
        time.sleep(60)


class ParkingName(str):
    """A counter's name whose comparison (``COUNTS.index`` inside ``count``'s section) parks."""

    ready_fd = -1

    def __eq__(self, other):
        park_forever(self.ready_fd)

    __hash__ = str.__hash__


class ParkingInt(int):
    """A size whose arithmetic with the budget's value (inside reserve's or release's section)
    parks; int's subclass, so Python asks it first."""

    ready_fd = -1

    def __radd__(self, other):
        park_forever(self.ready_fd)

    __rsub__ = __radd__


class ParkingFloat(float):
    """A clock reading whose subtraction (inside the give-up clock's section) parks."""

    ready_fd = -1

    def __sub__(self, other):
        park_forever(self.ready_fd)


def killed_inside(section) -> None:
    """Fork; the child runs ``section(ready_fd)``, which parks inside a shared section; once it
    is there, SIGKILL it and reap it."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        try:
            section(write_fd)
        finally:
            os._exit(1)
    os.close(write_fd)
    assert os.read(read_fd, 1) == b"x", "the child never reached the section"
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    os.close(read_fd)


def returns_in_time(call):
    """``call()``'s result, or a failure if it has not returned within DEADLINE_S (a hang)."""
    box = {}
    thread = threading.Thread(target=lambda: box.setdefault("value", call()), daemon=True)
    thread.start()
    thread.join(DEADLINE_S)
    assert not thread.is_alive(), f"{call} hung for {DEADLINE_S} s after a process died inside its lock"
    return box["value"]


@pytest.fixture
def session():
    from cocodet.storage import session

    session.configure({}, rank=0)
    yield session
    returns_in_time(lambda: session.configure({}, rank=0))  # a fresh start for the next test, or a failure


def test_the_store_counters_survive_a_worker_killed_while_counting(session):
    session.count("gets", 3)

    def count(ready_fd):
        ParkingName.ready_fd = ready_fd
        session.count(ParkingName("gets"))

    killed_inside(count)
    assert returns_in_time(session.counts)["gets"] == 3  # what the read-ahead and remote_summary() read
    returns_in_time(lambda: session.count("gets"))  # what the next GET does
    assert returns_in_time(session.counts)["gets"] == 4


def test_the_give_up_clock_survives_a_worker_killed_while_noting_a_failure(session):
    began = time.monotonic()

    def failing(ready_fd):
        ParkingFloat.ready_fd = ready_fd
        session._failing_for(ParkingFloat(began))  # a request that failed notes it

    killed_inside(failing)
    now = time.monotonic()
    # The next failure counts from the dead worker's, which started the clock: 0 would be a clock
    # the kill had reset, and a hang a lock the worker took with it.
    assert returns_in_time(lambda: session._failing_for(now)) == now - began > 0
    returns_in_time(session._answered)  # the next success
    assert session.down_for() == 0.0


@pytest.mark.parametrize("method", ["reserve", "release"])
def test_the_copy_budget_survives_a_worker_killed_while_reserving(tmp_path, method):
    from cocodet.read_ahead.object_cache import ObjectCache

    cache = ObjectCache(tmp_path / "copies", {}, budget=1000)
    assert cache.reserve(100)

    def section(ready_fd):
        ParkingInt.ready_fd = ready_fd
        getattr(cache, method)(ParkingInt(50))

    killed_inside(section)
    assert returns_in_time(cache.held_bytes) == 100
    assert returns_in_time(lambda: cache.reserve(200)) is True
    returns_in_time(lambda: cache.release(300))
    assert cache.held_bytes() == 0


# multiprocessing's primitives that carry a lock (a semaphore a SIGKILLed holder keeps);
# Value and Array carry one unless created with lock=False.
LOCK_CARRYING = {
    "Lock",
    "RLock",
    "Semaphore",
    "BoundedSemaphore",
    "Condition",
    "Event",
    "Barrier",
    "Queue",
    "JoinableQueue",
    "SimpleQueue",
    "Manager",
    "Value",
    "Array",
    "Pool",
}
# The ones cocodet creates on purpose, by the function that creates them, each with what handles
# a holder's death. torch's own (the DataLoader's index and result queues, its done event, its
# pin-memory thread's queue) are torch's: its watchdog notices a dead worker (SIGCHLD, the
# status check of _try_get_data), and loader/failures/worker_shutdown.py ends the others when a worker
# died holding the done event's lock.
ALLOWED = {
    ("shut_down_workers", "Event"): "a fresh done event set by the shutdown itself after a worker died: no worker "
    "is left to take its lock"
}


def lock_carrying_primitives() -> list[tuple[str, str, str]]:
    """(file, enclosing function, primitive) of every multiprocessing primitive with a lock
    that the source of cocodet creates, found by reading every module (not a list of files)."""
    found = []
    for path in sorted((REPO / "src" / "cocodet").rglob("*.py")):
        tree = ast.parse(path.read_text())
        imported = {
            alias.asname or alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("multiprocessing")
            for alias in node.names
            if alias.name in LOCK_CARRYING
        }
        functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if isinstance(node.func, ast.Attribute):
                receiver = ast.unparse(node.func.value)
                from_multiprocessing = "multiprocessing" in receiver or "get_context" in receiver or receiver == "mp"
            else:
                from_multiprocessing = name in imported
            if not from_multiprocessing or name not in LOCK_CARRYING:
                continue
            if name in ("Value", "Array") and any(
                k.arg == "lock" and isinstance(k.value, ast.Constant) and k.value.value is False for k in node.keywords
            ):
                continue
            inside = [f.name for f in functions if f.lineno <= node.lineno <= (f.end_lineno or f.lineno)]
            found.append((str(path.relative_to(REPO)), inside[-1] if inside else "<module>", name))
    return found


def test_no_lock_a_dead_process_can_keep_is_created_outside_the_list():
    unlisted = [(f, fn, name) for f, fn, name in lock_carrying_primitives() if (fn, name) not in ALLOWED]
    assert unlisted == [], (
        "multiprocessing primitives with a lock that a SIGKILLed holder keeps forever; use "
        "storage/claims.py's SharedLock with lock=False shared memory, or list it in ALLOWED "
        f"with what handles its holder's death: {unlisted}"
    )


def test_the_scan_finds_what_it_is_for(tmp_path, monkeypatch):
    """The scan itself: each form of creating a locked primitive is found, lock=False is not."""
    import test_dead_lock_holders as scan

    fake = tmp_path / "repo"
    (fake / "src" / "cocodet").mkdir(parents=True)
    (fake / "src" / "cocodet" / "m.py").write_text(
        "import multiprocessing\nfrom multiprocessing import Lock\n"
        "def a():\n    return multiprocessing.Value('d', 0.0)\n"
        "def b():\n    return multiprocessing.Array('d', 3, lock=False)\n"
        "def c():\n    return Lock()\n"
        "def d():\n    return multiprocessing.get_context('fork').Event()\n"
    )
    monkeypatch.setattr(scan, "REPO", fake)
    assert [(fn, name) for _, fn, name in scan.lock_carrying_primitives()] == [
        ("a", "Value"),
        ("c", "Lock"),
        ("d", "Event"),
    ]


class KilledWhileCounting(tuple):
    """The counters' names, whose lookup inside ``count``'s section kills the first loader
    worker that makes it (SIGKILL, as the OOM killer would): once, marked by a file."""

    parent, mark = 0, ""

    def index(self, name, *args):
        if os.getpid() != KilledWhileCounting.parent and not os.path.exists(KilledWhileCounting.mark):
            open(KilledWhileCounting.mark, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return tuple.index(self, name, *args)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_bucket_bench_whose_worker_dies_inside_the_counters_lock_ends_named(coco_tiny, tmp_path, monkeypatch):
    """mode=bench on an s3:// root (moto_server holding coco_tiny), run in this process so that
    its forked workers inherit the hook: the first worker to count is SIGKILLed inside the
    counters' section. The bench ends within seconds in one named error (the worker, its signal,
    what to try), and the main process's store counters still answer (before issue 70 the other
    workers' next count and the parent's counts() waited forever on the dead worker's
    semaphore: a hang until loader.timeout, then a shutdown that never returned)."""
    from conftest import run_in_process
    from moto_store import filled_store

    from cocodet.loader.failures.diagnose import LoaderFailure
    from cocodet.storage import session

    KilledWhileCounting.parent, KilledWhileCounting.mark = os.getpid(), str(tmp_path / "killed")
    monkeypatch.setattr(session, "COUNTS", KilledWhileCounting(session.COUNTS))
    started = time.monotonic()
    with filled_store(coco_tiny, "dead-holder") as (endpoint, _):
        with pytest.raises(LoaderFailure, match=r"worker \d+ ended by SIGKILL") as failed:
            run_in_process(
                [
                    "mode=bench",
                    "dataset=coco",
                    "dataset.root=s3://dead-holder",
                    f"dataset.storage_options.endpoint_url={endpoint}",
                    "dataset.image_size=128",
                    "loader=explicit",
                    "loader.num_workers=2",
                    "loader.batch_size=4",
                    "bench.batches=12",
                    "bench.warmup=0",
                    "bench.decode_probe=0",
                ],
                tmp_path / "bench",
            )
        # The error's frames hold the loader's iterator: let it go here, not in a later garbage
        # collection that torch's iterator finaliser (its workers already ended) would disturb.
        del failed
        gc.collect()
        assert os.path.exists(KilledWhileCounting.mark)  # a worker did die in there
        assert time.monotonic() - started < 120
        assert returns_in_time(session.counts)["gets"] > 0  # what remote_summary() reads
