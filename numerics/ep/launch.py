"""Process groups for the communication level: torchrun or spawn, with timeouts and clean teardown.

Two ways in:

* ``init_from_env()`` under ``torchrun`` (RANK / WORLD_SIZE / LOCAL_RANK set): NCCL when every rank
  has a GPU, else gloo.
* ``Session(world, factory)`` in one process: this process is rank 0, ranks 1..W-1 are spawned
  children; the group meets in a ``FileStore`` in a fresh temporary folder.

Either way rank 0 drives and the other ranks serve: ``CaseChannel.run(spec)`` broadcasts a case to
every rank, each rank runs it with its ``runner`` (built once per rank by ``factory(rank, world,
device, **kwargs)``; a dotted ``"module:name"`` so spawned children can import it), and rank 0 gets
every rank's result. A runner's exception becomes that rank's result (``{"error": ...}``) instead of
killing the rank. Every collective runs under the group's timeout, so a rank that stops answering
turns into an error on the others, never a hang; ``Session`` tears the group down in ``finally`` and
ends children that outlive it.

The cases and results travel over a gloo group (``control_group``), also when the payload group is
NCCL: a rank waiting for the next case then waits on the CPU, not in an NCCL kernel spinning on its
GPU. Such a kernel, from another process, time-slices that GPU against rank 0's work on it, and costs a
peer copy timed meanwhile a third of its bandwidth (``numerics.ep.bench``).

Ctrl-C belongs to rank 0. A terminal sends SIGINT to every process of its foreground group, so spawned ranks
would each stop wherever they were (their imports included) and print a traceback of their own; ``Session``
starts them ignoring SIGINT, and on Ctrl-C rank 0 ends them itself and lets the ``KeyboardInterrupt`` go on to
its command line's one line.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import multiprocessing
import os
import signal
import tempfile
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from numerics.errors import RankFailed
from numerics.rank_exit import exit_rank

STOP = "__stop__"


def _how_it_ended(exitcode: int | None, ended_by_us: bool) -> str:
    """A spawned rank's end in words (a signal by name): what the one line of ``RankFailed`` says about it."""
    if ended_by_us:
        return "stopped answering and was ended"
    if exitcode is not None and exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


def load(dotted: str):
    module, _, name = dotted.partition(":")
    return getattr(importlib.import_module(module), name)


def _device_for(backend: str, local_rank: int) -> torch.device:
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def _device_id(device: torch.device) -> dict:
    """Bind NCCL groups to their GPU up front (no guessing, no warning about it)."""
    return {"device_id": device} if device.type == "cuda" else {}


def init_from_env(timeout: datetime.timedelta, backend: str | None = None) -> tuple[int, int, torch.device]:
    """Join the group torchrun describes; returns (rank, world, device)."""
    world = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() > local_rank else "gloo"
    device = _device_for(backend, local_rank)
    dist.init_process_group(backend, timeout=timeout, **_device_id(device))
    return dist.get_rank(), world, device


def control_group(timeout: datetime.timedelta):
    """A gloo group over the same ranks for control messages (collective: every rank calls it)."""
    if dist.get_backend() == "gloo":
        return dist.group.WORLD
    return dist.new_group(backend="gloo", timeout=timeout)


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _teardown(channel: CaseChannel | None) -> None:
    """Close the case channel (if it was made), settle its control group, and leave the process group: the
    end of every rank, leading or serving, spawned or under torchrun."""
    if channel is not None:
        try:
            channel.close()
        finally:
            _settle(channel.control)
    dist.destroy_process_group()


def lead_under_torchrun(factory: str, kwargs: dict, timeout_s: float,
                        lead: Callable[[Callable[[Any], list[Any]], int, torch.device], Any]) -> Any:
    """Under torchrun: join the group, build ``factory(**kwargs)`` on every rank, and let rank 0 call
    ``lead(run, world, device)``, where ``run(spec)`` runs one spec on every rank, while the other ranks
    serve until rank 0 stops them. Tears the channel and the group down on every path. Returns
    ``lead``'s result on rank 0 and None on the others."""
    timeout = datetime.timedelta(seconds=timeout_s)
    rank, world, device = init_from_env(timeout)
    channel = None
    try:
        try:
            channel = CaseChannel(rank, world, device, factory, kwargs, control_group(timeout))
        except RankFailed:
            if rank != 0:
                return None  # rank 0 prints the set-up error as its one line
            raise
        if rank != 0:
            channel.serve()
            return None
        try:
            return lead(channel.run, world, device)
        finally:
            channel.stop()
    finally:
        _teardown(channel)


class CaseChannel:
    """Rank 0 sends cases, every rank runs them, rank 0 collects the results."""

    def __init__(self, rank: int, world: int, device: torch.device, factory: str, kwargs: dict,
                 control: Any = None):
        self.rank, self.world, self.device = rank, world, device
        self.control = control if control is not None else dist.group.WORLD
        try:
            self.runner, setup_error = load(factory)(rank, world, device, **kwargs), None
        except Exception as exc:  # noqa: BLE001 - reported to every rank, then raised
            self.runner, setup_error = None, _error_text(exc)
        errors: list[Any] = [None] * world
        dist.all_gather_object(errors, setup_error, group=self.control)
        failed = {r: e for r, e in enumerate(errors) if e}
        if failed:
            raise RankFailed("set-up failed on " + "; ".join(f"rank {r}: {e}" for r, e in failed.items()))

    def _one(self, spec: Any) -> Any:
        try:
            return self.runner(spec)
        except Exception as exc:  # noqa: BLE001 - a failing case is a result, not a dead rank
            return {"error": _error_text(exc), "traceback": traceback.format_exc(limit=8)}

    def run(self, spec: Any) -> list[Any]:
        """Rank 0 only: run ``spec`` on every rank; the list of results indexed by rank."""
        box = [spec]
        dist.broadcast_object_list(box, src=0, group=self.control)
        mine = self._one(spec)
        results: list[Any] = [None] * self.world
        dist.gather_object(mine, results, dst=0, group=self.control)
        return results

    def serve(self) -> None:
        """Ranks other than 0: run cases until rank 0 says stop."""
        while True:
            box: list[Any] = [None]
            dist.broadcast_object_list(box, src=0, group=self.control)
            if box[0] == STOP:
                return
            dist.gather_object(self._one(box[0]), None, dst=0, group=self.control)

    def stop(self) -> None:
        dist.broadcast_object_list([STOP], src=0, group=self.control)

    def close(self) -> None:
        closer = getattr(self.runner, "close", None)
        if closer:
            closer()


def _settle(group) -> None:
    """Wait (at most 10 s) until every rank has closed its runner, so no rank tears its process group
    down while a peer is still inside a collective of its own close (a child aborted with 'terminate
    called without an active exception' once under load, in the DeepEP stand-in test)."""
    try:
        dist.barrier(group=group, async_op=True).wait(datetime.timedelta(seconds=10))
    except Exception:  # a peer that is gone: nothing left to wait for
        pass


def _child(rank: int, world: int, store_path: str, backend: str, timeout_s: float, factory: str,
           kwargs: dict, threads: int) -> None:
    torch.set_num_threads(threads)
    store = dist.FileStore(store_path, world)
    device = _device_for(backend, rank)
    timeout = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout,
                            **_device_id(device))
    channel, code = None, 0
    try:
        channel = CaseChannel(rank, world, device, factory, kwargs, control_group(timeout))
        channel.serve()
    except RankFailed:  # a set-up error, which rank 0 prints as its one line
        code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            _teardown(channel)
        finally:
            exit_rank(code)  # a spawned rank ends here, without the interpreter's finalization


@contextlib.contextmanager
def _children_ignore_sigint() -> Iterator[None]:
    """Processes started inside the block ignore SIGINT for their whole life: an ignored signal stays ignored
    across exec (a signal mask does not: Python's process spawning resets it), and Python installs its
    KeyboardInterrupt handler only over the default action. This process ignores SIGINT too while the block
    runs, a few milliseconds of starting processes; only the main thread, where Python handles signals, changes
    anything."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:  # None: a handler not set from Python, which cannot be put back; the default is the nearest
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)


class Session:
    """``with Session(world, "pkg.mod:factory", kwargs, comm="gloo") as s: s.run(spec)``.

    Rank 0 is this process; ``kwargs`` go to the factory on every rank."""

    def __init__(self, world: int, factory: str, kwargs: dict | None = None, *, comm: str = "gloo",
                 timeout_s: float = 60.0, threads: int = 1):
        self.world, self.factory, self.comm, self.timeout_s = world, factory, comm, timeout_s
        # CPU threads per rank while the session lasts: W ranks share the machine's cores, and
        # oversubscribed intra-op threads made each rank several times slower on a 2-core CI box
        self.threads = threads
        self.kwargs = dict(kwargs or {})
        self.children: list[multiprocessing.Process] = []
        self.channel: CaseChannel | None = None

    def __enter__(self):  # -> Session
        if dist.is_initialized():
            raise RuntimeError("a process group already exists in this process; Session makes its own")
        self._tmp = tempfile.TemporaryDirectory(prefix="mxval-ep-")
        store_path = os.path.join(self._tmp.name, "store")
        ctx = multiprocessing.get_context("spawn")
        with _children_ignore_sigint():  # Ctrl-C is rank 0's (the module's docstring)
            for rank in range(1, self.world):
                p = ctx.Process(target=_child, daemon=True, args=(rank, self.world, store_path, self.comm,
                                                                  self.timeout_s, self.factory, self.kwargs,
                                                                  self.threads))
                p.start()
                self.children.append(p)
        self._threads_before = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            device = _device_for(self.comm, 0)
            timeout = datetime.timedelta(seconds=self.timeout_s)
            dist.init_process_group(self.comm, store=dist.FileStore(store_path, self.world), rank=0,
                                    world_size=self.world, timeout=timeout, **_device_id(device))
            self.channel = CaseChannel(0, self.world, device, self.factory, self.kwargs, control_group(timeout))
        except BaseException as exc:
            self.__exit__(type(exc), exc, exc.__traceback__)  # RankFailed instead, when a child has died
            raise
        return self

    def _end_children(self, timeout_s: float) -> set:
        """Wait up to ``timeout_s`` for each child to end, then end it by its handle (SIGTERM); the children ended."""
        ended = set()
        for p in self.children:
            p.join(timeout=timeout_s)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
                ended.add(p)
        return ended

    def run(self, spec: Any) -> list[Any]:
        assert self.channel is not None
        return self.channel.run(spec)

    def __exit__(self, exc_type, exc, tb) -> None:
        ended = set()
        try:
            if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
                # Ctrl-C: the ranks did not get it (they ignore SIGINT) and may be inside a case, where no stop
                # message reaches them; end them before the group goes, or each would report its lost peer
                ended = self._end_children(timeout_s=0)
            elif self.channel is not None:
                try:
                    try:
                        self.channel.stop()
                    finally:
                        try:
                            self.channel.close()
                        finally:
                            _settle(self.channel.control)
                except Exception:
                    # with an exception in flight (a rank that died), telling the ranks to stop fails ("connection
                    # closed by peer"); raised, that error would replace the one that explains it
                    if exc_type is None:
                        raise
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
            ended |= self._end_children(timeout_s=self.timeout_s)  # a child stuck past its own timeouts
            self._tmp.cleanup()
            torch.set_num_threads(self._threads_before)
        self.exitcodes = [p.exitcode for p in self.children]
        failed = [(rank, p) for rank, p in enumerate(self.children, 1) if p.exitcode or p in ended]
        if exc_type is not None and issubclass(exc_type, Exception) and not isinstance(exc, RankFailed) and failed:
            # rank 0's own error is gloo's 'Connection reset by peer [127.0.0.1]:PORT' or a timeout, which names
            # no rank: say which one ended, and how (Ctrl-C and other BaseExceptions stay what they are)
            raise RankFailed("; ".join(f"rank {rank} {_how_it_ended(p.exitcode, p in ended)}" for rank, p in failed)
                             + " during the run (its own output, if any, is above); rank 0 stopped waiting") from exc
