"""The adapter base (`adapters/base/`): finding an engine's tree or package with one-line errors,
stand-ins for modules only its kernels use, the front end, and the idle polling of `step()`.

The engines here are tiny fake packages written into a temporary folder, so these tests need no
upstream snapshot and cost milliseconds.
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from overlapcheck.adapters.base import FrontEnd, Upstream, UpstreamScheduler, load
from overlapcheck.adapters.base.stand_ins import StandIn
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.errors import UserError
from overlapcheck.core.messages import (
    AbortMsg,
    OutMsg,
    RejectMsg,
    SamplingParams,
    TokenMsg,
    UserMsg,
)
from overlapcheck.core.protocol import Books

_names = itertools.count()


def _engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str = "") -> Upstream:
    """A fresh fake engine package `ocfake<N>` under tmp_path/src, named by an env variable."""
    package = f"ocfake{next(_names)}"
    (tmp_path / "src" / package / "sched").mkdir(parents=True)
    (tmp_path / "src" / package / "__init__.py").write_text("")
    (tmp_path / "src" / package / "sched" / "__init__.py").write_text(
        "class Scheduler:\n    def schedule(self):\n        return 1\n" + body
    )
    monkeypatch.setenv(f"{package.upper()}_PATH", str(tmp_path))
    monkeypatch.setattr(sys, "path", list(sys.path))
    return Upstream(
        name="Fake",
        package=package,
        env=f"{package.upper()}_PATH",
        marker=f"src/{package}/sched/__init__.py",
        import_root="src",
        needed=((f"{package}.sched", ("Scheduler",)),),
        known_api="1.0",
    )


def _one_line(err: pytest.ExceptionInfo[UserError]) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


def test_a_tree_loads_and_names_its_root_as_the_code_under_test(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _engine(tmp_path, monkeypatch)
    loaded = load(engine)
    assert loaded[f"{engine.package}.sched"].Scheduler().schedule() == 1
    assert loaded.root == (tmp_path / "src").resolve()
    # the tree's root: its files read as in its repository (`src/<package>/...`), with its commit
    assert loaded.code_roots() == (tmp_path.resolve(),)
    loaded.require_methods(loaded[f"{engine.package}.sched"].Scheduler, ("schedule",))


def test_a_folder_that_is_not_a_tree_is_one_line_naming_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _engine(tmp_path, monkeypatch)
    monkeypatch.setenv(engine.env, str(tmp_path / "nowhere"))
    with pytest.raises(UserError) as err:
        load(engine)
    assert _one_line(err).startswith(f"{engine.env}=") and "is not a Fake tree" in str(err.value)


def test_no_tree_and_no_package_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = Upstream(name="Fake", package="ocfake_never_installed", env="OCFAKE_NONE", marker="x")
    monkeypatch.delenv("OCFAKE_NONE", raising=False)
    with pytest.raises(UserError) as err:
        load(engine)
    assert "Fake not found: set OCFAKE_NONE" in _one_line(err)


def test_an_unknown_api_is_one_line_naming_what_is_missing_and_the_known_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _engine(tmp_path, monkeypatch)
    wanting = Upstream(**{**_fields(engine), "needed": ((f"{engine.package}.sched", ("Gone",)),)})
    with pytest.raises(UserError) as err:
        load(wanting)
    text = _one_line(err)
    assert "is incompatible" in text and "has no Gone" in text and "knows the API of 1.0" in text
    loaded = load(engine)
    with pytest.raises(UserError) as err:
        loaded.require_methods(loaded[f"{engine.package}.sched"].Scheduler, ("step",))
    assert "Scheduler has no step" in _one_line(err)


def test_an_import_failure_of_theirs_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _engine(tmp_path, monkeypatch, body="raise ValueError('boom')\n")
    with pytest.raises(UserError) as err:
        load(engine)
    assert "is not usable" in _one_line(err) and "ValueError: boom" in str(err.value)


def test_another_copy_already_imported_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _engine(tmp_path, monkeypatch)
    load(engine)
    other = tmp_path / "other"
    (other / "src" / engine.package / "sched").mkdir(parents=True)
    (other / "src" / engine.package / "sched" / "__init__.py").write_text("")
    monkeypatch.setenv(engine.env, str(other))
    with pytest.raises(UserError) as err:
        load(engine)
    assert "another Fake is already imported" in _one_line(err)


def test_a_missing_module_is_stood_in_and_says_so_when_called(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _engine(tmp_path, monkeypatch, body="import ocfake_transport.fast as fast\n")
    stood = Upstream(
        **{**_fields(engine), "stand_ins": ("ocfake_transport", "ocfake_transport.fast")}
    )
    for name in stood.stand_ins:
        monkeypatch.delitem(sys.modules, name, raising=False)
    loaded = load(stood)
    fast = loaded[f"{engine.package}.sched"].fast
    assert isinstance(fast, StandIn)

    class Derived(fast.Socket):  # a stand-in's name can be a base class
        pass

    with pytest.raises(RuntimeError, match="overlapcheck stand-in: Fake's real"):
        fast.Socket.send(b"x")
    assert Derived.__mro__[1] is object
    for name in stood.stand_ins:
        del sys.modules[name]


def _fields(engine: Upstream) -> dict[str, object]:
    return {name: getattr(engine, name) for name in Upstream.__dataclass_fields__}


def test_the_front_end_rejects_by_the_rules_and_tracks_live_uids() -> None:
    out: list[OutMsg] = []
    front = FrontEnd(SchedulerConfig(vocab_size=100), out.append)
    ok = UserMsg(1, (3, 4), SamplingParams(max_tokens=2))
    assert front.admit(ok) and front.is_live(1)
    assert not front.admit(ok)  # the same uid again while live
    assert not front.admit(UserMsg(2, (), SamplingParams()))
    assert not front.admit(UserMsg(3, (100,), SamplingParams()))
    assert [type(m) for m in out] == [RejectMsg, RejectMsg, RejectMsg]
    assert [m.uid for m in out] == [1, 2, 3]
    front.token(1, 7, finished=False)
    front.token(1, 8, finished=True)
    assert out[-2:] == [TokenMsg(1, 7, False), TokenMsg(1, 8, True)]
    assert not front.is_live(1) and front.live_count == 0
    assert front.admit(ok) and front.abort(1) and not front.abort(1)


class _Source:
    def __init__(self, arrivals: list[tuple[float, UserMsg | AbortMsg]]) -> None:
        self.arrivals = arrivals

    def poll(self, now: float) -> list[UserMsg | AbortMsg]:
        due = [m for t, m in self.arrivals if t <= now]
        self.arrivals = [(t, m) for t, m in self.arrivals if t > now]
        return due

    def next_arrival(self) -> float | None:
        return self.arrivals[0][0] if self.arrivals else None


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0
        self.slept: list[float] = []

    def now(self) -> float:
        return self.t

    def sleep_until(self, t: float) -> None:
        self.slept.append(t)
        self.t = t


class _Polling(UpstreamScheduler):
    def step(self) -> bool:
        return self.receive(holding=False) is not None

    def books(self) -> Books:
        raise NotImplementedError


def test_receive_sleeps_until_the_next_arrival_and_ends_the_run_when_none_will_come(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = load(_engine(tmp_path, monkeypatch))
    msg = UserMsg(5, (1,), SamplingParams())
    clock = _Clock()
    idle: list[float] = []
    sched = _Polling(SchedulerConfig(), clock, _Source([(2.5, msg)]), [].append, loaded)  # type: ignore[arg-type]
    assert sched.receive(holding=True) == []  # holding: never sleeps
    assert clock.slept == []
    assert sched.receive(holding=False, on_idle=lambda: idle.append(clock.t)) == [msg]
    assert clock.slept == [2.5] and idle == [0.0]
    assert sched.receive(holding=False) is None
    assert sched.code_roots() == loaded.code_roots()


def test_a_stand_in_module_answers_a_later_probe_and_refuses_to_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A library probing for a stood-in module later in the same process (`find_spec`) gets an
    answer, not ValueError('... __spec__ is None'); calling into it says what it is."""
    import importlib.util

    from overlapcheck.adapters.base.stand_ins import install_stand_ins

    for name in ("overlapcheck_absent_ffi", "overlapcheck_absent_ffi.cpp"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    install_stand_ins(("overlapcheck_absent_ffi", "overlapcheck_absent_ffi.cpp"), "Engine")
    try:
        spec = importlib.util.find_spec("overlapcheck_absent_ffi.cpp")
        assert spec is not None and spec.name == "overlapcheck_absent_ffi.cpp"
        import overlapcheck_absent_ffi.cpp as stood_in  # type: ignore[import-not-found]

        with pytest.raises(RuntimeError, match="overlapcheck stand-in"):
            stood_in.load_library("x")
    finally:
        for name in ("overlapcheck_absent_ffi.cpp", "overlapcheck_absent_ffi"):
            sys.modules.pop(name, None)


def test_a_module_renamed_in_the_engines_history_is_found_under_either_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _engine(tmp_path, monkeypatch)
    pkg = tmp_path / "src" / fake.package
    (pkg / "old_name.py").write_text("import time\n")
    renamed = ((f"{fake.package}.new_name", f"{fake.package}.old_name"), ("time",))
    loaded = load(replace(fake, needed=(renamed,)))
    assert loaded[f"{fake.package}.new_name"].__name__ == f"{fake.package}.old_name"
    # a module that is there but fails its own import is an unusable tree, not a rename
    (pkg / "new_name.py").write_text("import ocfake_not_installed\n")
    with pytest.raises(UserError, match=r"not usable: importing .*new_name failed") as err:
        load(replace(fake, needed=(renamed,)))
    assert "ocfake_not_installed" in _one_line(err)
