"""Shared fixtures: real local control planes (etcd + kube-apiserver) for integration tests.

``sandbox3`` / ``sandbox5``
    A session-wide :class:`coordinator_sandbox.Sandbox` of 3 / 5 clusters, each in a
    temporary directory, started the first time a test asks for it and stopped at the
    end of the session (also on Ctrl-C) with no process left behind. Useful attributes:
    ``kubeconfig``, ``contexts`` (``sandbox-1`` …), ``restricted_contexts``,
    ``token_contexts``, ``token``, ``dir``, ``n``; methods ``pause(i)``, ``resume(i)``,
    ``kill(i)``, ``start(i)``, ``admin(i)``, ``mint_kubeconfig(user, groups)``.
    Whatever a test pauses or kills is resumed or restarted right after the test body,
    before any fixture is torn down, so the next test sees every cluster up.
``namespace``
    A fresh namespace (random DNS-1123 name) on every cluster of ``sandbox3``.

Missing binaries make these fixtures *fail*, not skip: run scripts/build-controlplane.sh.

Test files live by topic: ``tests/<topic>/unit/`` and ``tests/<topic>/integration/``
(lock, state, members, …). Every test in a ``unit/`` folder is marked ``unit`` and every
one in an ``integration/`` folder ``integration`` here, by folder (``scripts/test.sh -m
unit`` runs the fast half). ``tests/sim/`` (the in-memory API server, its conformance
suite and the engines on it) holds both: each of its tests carries one of the two marks
itself. A unit test that asks for a sandbox, or a test file elsewhere, stops the run
before anything starts.
"""

from __future__ import annotations

import atexit
import ctypes
import dataclasses
import secrets
import signal
import sys
import threading
from collections.abc import Generator, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import cliserver
import pytest

import coordinator_sandbox as sb
from coordinator.errors import UsageError
from coordinator_sandbox import process as sb_process
from coordinator_sandbox.records import cluster_of

_PR_SET_CHILD_SUBREAPER = 36

# Directories of the sandboxes this session started, in start order.
_started: dict[Path, sb.Sandbox] = {}


def _require_binaries() -> None:
    try:
        sb.find_binaries()
    except UsageError as err:
        pytest.fail(err.message, pytrace=False)


def _stop(directory: Path) -> None:
    handle = _started.pop(directory, None)
    if handle is not None:
        handle.down(grace=5.0)


def _stop_all() -> None:
    errors: list[BaseException] = []
    for directory in list(_started):
        try:
            _stop(directory)
        except Exception as err:  # keep stopping the others
            errors.append(err)
    if errors:
        raise errors[0]


def _heal_all() -> None:
    # Servers a `coordinator sandbox` subprocess started and stopped are our zombies now.
    sb_process.reap_exited_children(("etcd", "kube-apiserver"))
    for handle in list(_started.values()):
        if handle.exists:
            handle.heal()


def _session_sandbox(n: int, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> sb.Sandbox:
    _require_binaries()
    directory = tmp_path_factory.mktemp(f"sandbox{n}-")
    # Registered before starting: an interrupted start-up is cleaned up as well.
    _started[directory] = sb.Sandbox(directory)
    request.addfinalizer(lambda: _stop(directory))
    return sb.up(n, directory)


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


class FirstClusters:
    """The first ``n`` clusters of a session sandbox, as a sandbox of ``n`` clusters.

    ``sandbox3`` is the first three clusters of ``sandbox5``: a worker then runs five
    idle clusters, not eight (an idle cluster costs 1.5-2 % of a core, CONTRIBUTING.md),
    and starts three fewer. Tests run one at a time on a worker and every paused or
    killed server is back before the next test, so sharing the clusters is no more than
    what the tests of one sandbox already share. What counts clusters (``n``, the
    contexts, the record) sees ``n``; the kubeconfig and the directory are the whole
    sandbox's."""

    def __init__(self, whole: sb.Sandbox, n: int) -> None:
        self._whole = whole
        self._n = n

    def __repr__(self) -> str:
        return f"FirstClusters({self._whole!r}, {self._n})"

    def __getattr__(self, name: str) -> Any:
        return getattr(self._whole, name)

    @property
    def n(self) -> int:
        return self._n

    @property
    def record(self) -> Any:
        whole = self._whole.record
        return whole.model_copy(update={"clusters": whole.clusters[: self._n]})

    @property
    def contexts(self) -> list[str]:
        return self._whole.contexts[: self._n]

    @property
    def restricted_contexts(self) -> list[str]:
        return self._whole.restricted_contexts[: self._n]

    @property
    def token_contexts(self) -> list[str]:
        return self._whole.token_contexts[: self._n]

    @property
    def servers(self) -> list[str]:
        return self._whole.servers[: self._n]

    def _index(self, index: int) -> int:
        cluster_of(self.record, index)  # the same UsageError as a sandbox of n clusters
        return index

    def status(self) -> Any:
        whole = self._whole.status()
        return dataclasses.replace(whole, clusters=[c for c in whole.clusters if c.index <= self._n])

    def pause(self, index: int, **kw: Any) -> None:
        self._whole.pause(self._index(index), **kw)

    def resume(self, index: int, **kw: Any) -> None:
        self._whole.resume(self._index(index), **kw)

    def kill(self, index: int, **kw: Any) -> None:
        self._whole.kill(self._index(index), **kw)

    def start(self, index: int) -> None:
        self._whole.start(self._index(index))

    def admin(self, index: int, **kw: Any) -> Any:
        return self._whole.admin(self._index(index), **kw)

    def context(self, index: int) -> str:
        return self._whole.context(self._index(index))

    def server(self, index: int) -> str:
        return self._whole.server(self._index(index))

    def mint_kubeconfig(self, user: str, groups: Any = (), *, clusters: Any = None, path: Any = None) -> Any:
        """A kubeconfig of ``user`` for these clusters only (by default)."""
        chosen = range(1, self._n + 1) if clusters is None else clusters
        return self._whole.mint_kubeconfig(user, groups, clusters=chosen, path=path)


@pytest.fixture(scope="session")
def sandbox3(sandbox5: sb.Sandbox) -> sb.Sandbox:
    """Three independent clusters, shared by the whole session: the first three of
    ``sandbox5`` (see FirstClusters)."""
    return FirstClusters(sandbox5, 3)  # type: ignore[return-value]


@pytest.fixture(scope="session")
def sandbox5(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> sb.Sandbox:
    """Five independent clusters, shared by the whole session (started on first use)."""
    return _session_sandbox(5, tmp_path_factory, request)


@pytest.fixture
def own_sandbox3(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> sb.Sandbox:
    """Three clusters of this test's own, stopped when it ends: for a test that changes
    what every test of the shared sandbox would see (`cluster restored` tombstones every
    coordinator lease of a cluster; the fleet view lists every deployment there)."""
    return _session_sandbox(3, tmp_path_factory, request)


@pytest.fixture
def namespace(sandbox3: sb.Sandbox) -> Iterator[str]:
    """A fresh namespace on every cluster of ``sandbox3``.

    It is left in place afterwards: without a controller-manager a deleted namespace
    would only sit in Terminating, and random names never collide.
    """
    name = "t-" + secrets.token_hex(5)
    for index in range(1, sandbox3.n + 1):
        sandbox3.admin(index).create(
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
            exist_ok=False,
        )
    yield name


_TESTS = Path(__file__).resolve().parent
_SANDBOX_FIXTURES = frozenset({"sandbox3", "sandbox5"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Marked by folder, so that no test file has to remember it.
    misplaced: list[str] = []
    for item in items:
        try:
            parts = item.path.resolve().relative_to(_TESTS).parts
        except ValueError:
            continue  # a test file outside tests/, named on the command line
        folder = parts[1] if len(parts) == 3 and parts[0] != "sim" else parts[0]
        if folder == "unit":
            item.add_marker(pytest.mark.unit)
            sandboxes = _SANDBOX_FIXTURES.intersection(getattr(item, "fixturenames", ()))
            if sandboxes or item.get_closest_marker("integration"):
                why = f"uses {', '.join(sorted(sandboxes))}" if sandboxes else "is marked integration"
                misplaced.append(f"{item.nodeid} {why}: it belongs under tests/{parts[0]}/integration/")
        elif folder == "integration":
            item.add_marker(pytest.mark.integration)
        elif folder == "sim":
            unit, integration = (item.get_closest_marker(m) is not None for m in ("unit", "integration"))
            sandboxes = _SANDBOX_FIXTURES.intersection(getattr(item, "fixturenames", ()))
            if unit == integration:
                misplaced.append(f"{item.nodeid}: a test under tests/sim/ is marked unit or integration, one of them")
            elif unit and sandboxes:
                misplaced.append(f"{item.nodeid} uses {', '.join(sorted(sandboxes))}: it is no unit test")
        else:
            misplaced.append(
                f"{item.nodeid}: a test file goes under tests/<topic>/unit/, tests/<topic>/integration/ or tests/sim/"
            )
    if misplaced:
        raise pytest.UsageError("\n".join(misplaced))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    # Undo pauses and kills right after the test body, before fixtures are torn down
    # (their teardown may need every cluster to answer).
    try:
        return (yield)
    finally:
        _heal_all()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    try:
        return (yield)
    finally:
        _heal_all()
        _restore_interrupts(item)


# Commands started by the tests inherit how this process treats SIGINT, and coordinator
# keeps a signal ignored at its start ignored (as a shell's background job expects). In
# one whole-suite run every test that sends SIGINT to a command failed at once, on both
# workers, while they pass together alone: something left SIGINT ignored or blocked in the
# worker. Each test now starts as a terminal would start it, and whoever changed it is named.
_INTERRUPTS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def _restore_interrupts(item: pytest.Item) -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    changed = []
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        changed.append("SIGINT handler")
        signal.signal(signal.SIGINT, signal.default_int_handler)
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    if any(s in blocked for s in _INTERRUPTS):
        changed.append("blocked " + ", ".join(s.name for s in _INTERRUPTS if s in blocked))
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _INTERRUPTS)
    if changed:
        import warnings

        warnings.warn(f"{item.nodeid} left {'; '.join(changed)} changed in the test process; restored", stacklevel=1)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # Fixture finalizers normally did this already; this catches interrupted sessions.
    cliserver.stop()
    _stop_all()
    sb_process.reap_exited_children(("etcd", "kube-apiserver"))


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    # A CI job killed on timeout gets SIGTERM: unwind like Ctrl-C so teardown runs.
    raise KeyboardInterrupt


def _become_subreaper() -> None:
    # Servers started by a `coordinator sandbox up` subprocess are orphaned when it
    # exits. As a child subreaper this session inherits them, so the sandbox can reap
    # them when they stop instead of leaving zombies to an init that may never reap.
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def pytest_configure(config: pytest.Config) -> None:
    if sys.platform == "linux":
        _become_subreaper()
    if threading.current_thread() is threading.main_thread():
        # A suite started under nohup (or as a script's background job) has SIGHUP (or
        # SIGINT, SIGQUIT) ignored, and every command the tests start would inherit it:
        # `lock run` keeps an ignored signal ignored, so a test's SIGHUP did nothing and
        # its child ran to the end. The commands start as a terminal would start them.
        for sig in (signal.SIGHUP, signal.SIGQUIT):
            if signal.getsignal(sig) == signal.SIG_IGN:
                signal.signal(sig, signal.SIG_DFL)
        if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, signal.SIG_IGN):
            signal.signal(signal.SIGTERM, _on_sigterm)


def _stop_all_quietly() -> None:
    try:
        _stop_all()
    except Exception as err:  # at exit there is nobody left to raise to
        print(f"coordinator sandbox cleanup failed: {err}")


atexit.register(_stop_all_quietly)
