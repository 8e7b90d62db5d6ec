"""The toy model: the next token is a deterministic function of the context actually read.

A scenario may script continuations (context -> next token) to put EOS exactly where it wants;
otherwise the next token is a hash of the context bytes. That hash never yields EOS; with an
`eos_probability` p > 0, a second hash of the context (so still deterministic, no RNG) says EOS
instead with probability p. Any corruption of the context the forward reads changes the token.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterable, Sequence
from hashlib import blake2b

import numpy as np

DTYPE = np.int32
assert array("i").itemsize == np.dtype(DTYPE).itemsize  # the reference's context buffer


class ToyModel:
    def __init__(
        self, vocab_size: int, eos_token_id: int, seed: int = 0, eos_probability: float = 0.0
    ) -> None:
        self.vocab_size = vocab_size
        self.eos = eos_token_id
        self.salt = seed.to_bytes(8, "little", signed=True)
        self.script: dict[bytes, int] = {}
        # EOS when the second hash, read as a 64-bit fraction, falls below p.
        self.eos_below = int(eos_probability * 2**64)
        # Keyed hashers with the key block already absorbed: a copy hashes a context as
        # `blake2b(context, key=salt)` would, without redoing the key each time.
        self._hash = hashlib.blake2b(digest_size=8, key=self.salt)
        self._coin = hashlib.blake2b(digest_size=8, key=self.salt, person=b"eos")

    def add_script(self, prompt: Sequence[int], continuation: Iterable[int]) -> None:
        """After `prompt + continuation[:k]`, the model says `continuation[k]`."""
        context = list(prompt)
        for token in continuation:
            self.script[np.asarray(context, dtype=DTYPE).tobytes()] = int(token)
            context.append(int(token))

    def next_token(self, context: np.ndarray) -> int:
        return self.next_token_of(np.ascontiguousarray(context, dtype=DTYPE).tobytes())

    def next_token_of(self, key: bytes) -> int:
        """The next token after the context whose DTYPE bytes are `key`."""
        scripted = self.script.get(key)
        if scripted is not None:
            return scripted
        return self._hashed(key)

    def _hashed(self, key: bytes | array[int]) -> int:
        """The next token of an unscripted context, from its DTYPE bytes (any buffer)."""
        digest = self._hash.copy()
        digest.update(key)
        if not self.eos_below:
            return self._next_of(digest, None)
        coin = self._coin.copy()
        coin.update(key)
        return self._next_of(digest, coin)

    def generate(self, prompt: Sequence[int], max_tokens: int, ignore_eos: bool) -> list[int]:
        """The sequential reference: the request run alone, token by token. A hash reads its
        input as a stream, so the hashers take the prompt once and then each token as it comes;
        a digest is the hash of what they read so far (the same as hashing it whole, without
        reading the context again for every token). The context is kept as bytes only for a
        scripted model's lookup."""
        start = array("i", prompt)  # C int: DTYPE's 4 bytes, in the machine's order
        digest, coin = self._hash.copy(), self._coin.copy() if self.eos_below else None
        digest.update(start)
        if coin is not None:
            coin.update(start)
        if coin is None and not self.script:
            return self._hashed_only(digest, max_tokens)
        context = start if self.script else None
        out: list[int] = []
        one = array("i", [0])
        while len(out) < max_tokens:
            scripted = self.script.get(context.tobytes()) if context is not None else None
            token = scripted if scripted is not None else self._next_of(digest, coin)
            out.append(token)
            one[0] = token
            digest.update(one)
            if coin is not None:
                coin.update(one)
            if context is not None:
                context.append(token)
            if token == self.eos and not ignore_eos:
                break
        return out

    def _hashed_only(self, digest: blake2b, max_tokens: int) -> list[int]:
        """`generate` with no script and no EOS coin (most runs): every token is `_next_of`'s
        hash, never EOS, so the output is `max_tokens` long. Its loop without a call per token:
        the reference is computed for every request of every run."""
        out: list[int] = []
        one = array("i", [0])
        update, current, from_bytes = digest.update, digest.digest, int.from_bytes
        below, eos = self.vocab_size - 1, self.eos
        for _ in range(max_tokens):
            token = from_bytes(current(), "little") % below
            token += token >= eos  # (as `_next_of`: the hash skips EOS)
            out.append(token)
            one[0] = token
            update(one)
        return out

    def _next_of(self, digest: blake2b, coin: blake2b | None) -> int:
        """The next token after the context hashers `digest` and `coin` (None: no EOS coin) have
        read so far (a digest does not end the stream)."""
        if coin is not None and int.from_bytes(coin.digest(), "little") < self.eos_below:
            return self.eos
        token = int.from_bytes(digest.digest(), "little") % (self.vocab_size - 1)
        return token + 1 if token >= self.eos else token
