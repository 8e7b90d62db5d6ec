"""The search's Hypothesis example database: under which key its failures are saved, which of
Hypothesis's corpora are kept, and the saved example `explore --resume` offers first.

Hypothesis keys a test's examples by a digest of the test function's source, so every edit of
the search's example function would have left the failures saved by earlier runs unread. The
search gives its examples one fixed key instead (`DATABASE_KEY`), and `FailureDatabase` prefixes
it with what the examples mean (`SearchSpec.database_namespace`).
"""

from __future__ import annotations

from collections.abc import Iterable

from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

# NOTE: the digest Hypothesis derived from the search's example function until that function
# became a method (commit 7ded5b5): databases saved before then replay as they did.
DATABASE_KEY = bytes.fromhex(
    "706b09d4f863537812764d3e791c5097450fea2b43218f2b"
    "5033a86424215143bc406e8458e5b6e57de1f7ad95afa1b7"
)


def example_choices(data: st.DataObject) -> bytes:
    """The example's choices as Hypothesis stores them in a database (internal; b"" without)."""
    try:
        from hypothesis.database import choices_to_bytes
    except ImportError:  # pragma: no cover - another Hypothesis layout
        return b""
    conjecture = getattr(data, "conjecture_data", None)
    choices = getattr(conjecture, "choices", None)
    return b"" if choices is None else choices_to_bytes(choices)


class ResumeDatabase(ExampleDatabase):
    """A database that offers one saved example first wherever Hypothesis looks for the failures
    it should replay (the primary corpus of any test), then what `inner` holds: a search resumed
    from a counterexample file replays that file's example, fails at once and shrinks from it."""

    def __init__(self, choices: bytes, inner: ExampleDatabase | None) -> None:
        super().__init__()
        self.choices = choices
        self.inner = inner

    @staticmethod
    def _primary(key: bytes) -> bool:
        return not key.endswith((b".secondary", b".pareto"))

    def save(self, key: bytes, value: bytes) -> None:
        if self.inner is not None:
            self.inner.save(key, value)

    def fetch(self, key: bytes) -> Iterable[bytes]:
        if self._primary(key):
            yield self.choices
        if self.inner is not None:
            yield from (v for v in self.inner.fetch(key) if v != self.choices)

    def delete(self, key: bytes, value: bytes) -> None:
        if self.inner is not None:
            self.inner.delete(key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        if self.inner is not None:
            self.inner.move(src, dest, value)


class FailureDatabase(ExampleDatabase):
    """A directory example database that keeps failures (Hypothesis's primary and secondary
    corpora) and drops any pareto front of `target()` scores (the search observes none now; a
    front is replayed at the start of every run, and a search runs in rounds of a few
    examples: replaying it once cost a third of the search's throughput).

    Every key is prefixed with `namespace` (`SearchSpec.database_namespace`): Hypothesis keys
    examples by the test function alone, and the search's function is the same for every fault
    set, scenario and scheduler. Unprefixed, a run with other faults replayed the saved failures
    of the last one, found they pass, and deleted them from the database."""

    def __init__(self, path: str, namespace: bytes = b"") -> None:
        super().__init__()
        self.inner = DirectoryBasedExampleDatabase(path)
        self.namespace = namespace

    def _key(self, key: bytes) -> bytes:
        return self.namespace + b":" + key if self.namespace else key

    def save(self, key: bytes, value: bytes) -> None:
        if not key.endswith(b".pareto"):
            self.inner.save(self._key(key), value)

    def fetch(self, key: bytes) -> Iterable[bytes]:
        if key.endswith(b".pareto"):
            return iter(())
        return self.inner.fetch(self._key(key))

    def delete(self, key: bytes, value: bytes) -> None:
        self.inner.delete(self._key(key), value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        if dest.endswith(b".pareto"):
            self.inner.delete(self._key(src), value)
        else:
            self.inner.move(self._key(src), self._key(dest), value)


def open_database(folder: str | None, namespace: bytes, resume: bytes) -> ExampleDatabase | None:
    """The database a search reads and writes: the failures kept in `folder` (None: none kept)
    under `namespace`, with the `resume` example (b"": none) offered first."""
    database: ExampleDatabase | None = None
    if folder is not None:
        database = FailureDatabase(folder, namespace)
    if resume:
        database = ResumeDatabase(resume, database)
    return database
