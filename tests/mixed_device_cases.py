"""Device work given host tensors or a host generator: one call each, run on a GPU (its outcomes
recorded in `data/mixed_devices_h200.json`) and under the simulated CUDA, which must refuse what
the GPU refuses and run what it runs. From this folder, on a GPU:
`python -c 'import mixed_device_cases as m, json; print(json.dumps(m.run("cuda"), indent=1))'`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def cases(dev: str) -> dict[str, Callable[[], Any]]:
    def d(*values: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=dev)

    def h(*values: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype)

    long, flag = torch.long, torch.bool

    def x() -> torch.Tensor:
        return d(1.0, 2.0, 3.0, 4.0)

    def x2() -> torch.Tensor:
        return torch.arange(12, dtype=torch.float32).reshape(3, 4).to(dev)

    hi1, hi0, di1 = h(0, 2, dtype=long), torch.tensor(1), d(0, 2, dtype=long)
    hm, dm = h(1, 0, 1, 0, dtype=flag), d(1, 0, 1, 0, dtype=flag)
    hv1, hv0 = h(7.0, 8.0), torch.tensor(9.0)
    ones = h(1.0, 1.0, 1.0, 1.0)

    def gen() -> torch.Generator:
        return torch.Generator()

    return {
        "index_select host idx1": lambda: x().index_select(0, hi1),
        "index_select host idx0": lambda: x().index_select(0, hi0),
        "gather host idx": lambda: x().gather(0, hi1),
        "gather host idx0": lambda: x().gather(0, hi0),
        "scatter_ host idx": lambda: x().scatter_(0, hi1, d(5.0, 6.0)),
        "scatter_ host src": lambda: x().scatter_(0, di1, hv1),
        "scatter_ value host idx": lambda: x().scatter_(0, hi1, 1.0),
        "scatter_add_ host idx": lambda: x().scatter_add_(0, hi1, d(5.0, 6.0)),
        "index_add_ host idx": lambda: x().index_add_(0, hi1, d(5.0, 6.0)),
        "index_add_ host src": lambda: x().index_add_(0, di1, hv1),
        "index_copy_ host idx": lambda: x().index_copy_(0, hi1, d(5.0, 6.0)),
        "index_fill_ host idx": lambda: x().index_fill_(0, hi1, 1.0),
        "index_fill_ host idx0": lambda: x().index_fill_(0, hi0, 1.0),
        "index_fill_ host value0 dev idx": lambda: x().index_fill_(0, di1, hv0),
        "masked_fill_ host mask": lambda: x().masked_fill_(hm, 1.0),
        "masked_fill_ host mask0": lambda: x().masked_fill_(torch.tensor(True), 1.0),
        "masked_fill_ host value0": lambda: x().masked_fill_(dm, hv0),
        "masked_scatter_ host mask": lambda: x().masked_scatter_(hm, d(5.0, 6.0, 7.0, 8.0)),
        "masked_select host mask": lambda: x().masked_select(hm),
        "getitem host idx": lambda: x()[hi1],
        "getitem host idx0": lambda: x()[hi0],
        "getitem host mask": lambda: x()[hm],
        "setitem host idx host vals": lambda: x().__setitem__(hi1, hv1),
        "setitem host idx host val0": lambda: x().__setitem__(hi1, hv0),
        "setitem dev idx host vals": lambda: x().__setitem__(di1, hv1),
        "setitem host mask host val0": lambda: x().__setitem__(hm, hv0),
        "setitem host mask dev vals": lambda: x().__setitem__(hm, d(5.0, 6.0)),
        "index_put_ host idx dev vals": lambda: x().index_put_((hi1,), d(5.0, 6.0)),
        "index_put_ host idx host vals": lambda: x().index_put_((hi1,), hv1),
        "index_put_ acc host vals": lambda: x().index_put_((di1,), hv1, accumulate=True),
        "take host idx": lambda: torch.take(x(), hi1),
        "put_ host idx": lambda: x().put_(hi1, d(5.0, 6.0)),
        "embedding host idx": lambda: torch.nn.functional.embedding(hi1, x2()),
        "embedding host idx0": lambda: torch.nn.functional.embedding(hi0, x2()),
        "embedding_bag host": lambda: torch.nn.functional.embedding_bag(
            hi1, x2(), torch.tensor([0])
        ),
        "where host cond": lambda: torch.where(hm, x(), x()),
        "where host cond0": lambda: torch.where(torch.tensor(True), x(), x()),
        "where host other1": lambda: torch.where(dm, x(), h(0.0, 0.0, 0.0, 0.0)),
        "where host other0": lambda: torch.where(dm, x(), hv0),
        "searchsorted host vals": lambda: torch.searchsorted(x(), hv1),
        "searchsorted host sorted": lambda: torch.searchsorted(h(1.0, 2.0, 3.0), x()),
        "bucketize host bounds": lambda: torch.bucketize(x(), h(1.0, 2.0)),
        "repeat_interleave host repeats": lambda: x().repeat_interleave(h(1, 2, 1, 1, dtype=long)),
        "stack host": lambda: torch.stack([x(), ones]),
        "mm host": lambda: torch.mm(x2(), ones.reshape(4, 1)),
        "matmul host": lambda: x2() @ ones,
        "add_ host0": lambda: x().add_(hv0),
        "mul host0 first": lambda: hv0 * x(),
        "clamp host min0": lambda: torch.clamp(x(), min=hv0),
        "clamp host max1": lambda: torch.clamp(x(), max=ones),
        "fill_ host0": lambda: x().fill_(hv0),
        "copy_ host": lambda: x().copy_(ones),
        "lerp_ host weight0": lambda: x().lerp_(x(), hv0),
        "eq host1": lambda: torch.eq(x(), ones),
        "maximum host0": lambda: torch.maximum(x(), hv0),
        "cumsum out host": lambda: torch.cumsum(x(), 0, out=h(0.0, 0.0, 0.0, 0.0)),
        "sum into host out": lambda: torch.sum(x(), 0, out=torch.tensor(0.0)),
        "argmax out host": lambda: torch.argmax(x(), out=torch.tensor(0)),
        "multinomial cpu gen": lambda: torch.multinomial(x(), 2, generator=gen()),
        "rand cpu gen": lambda: torch.rand(4, device=dev, generator=gen()),
        "randn cpu gen": lambda: torch.randn(4, device=dev, generator=gen()),
        "randint cpu gen": lambda: torch.randint(5, (4,), device=dev, generator=gen()),
        "randperm cpu gen": lambda: torch.randperm(8, device=dev, generator=gen()),
        "uniform_ cpu gen": lambda: x().uniform_(generator=gen()),
        "exponential_ cpu gen": lambda: x().exponential_(generator=gen()),
        "normal_ cpu gen": lambda: x().normal_(generator=gen()),
        "normal tensor cpu gen": lambda: torch.normal(x(), 1.0, generator=gen()),
        "random_ cpu gen": lambda: x().random_(generator=gen()),
        "bernoulli cpu gen": lambda: torch.bernoulli(x() / 5, generator=gen()),
        "dropout fused cpu gen": lambda: torch.ops.aten._fused_dropout(x(), 0.5, gen()),
        "sort stable": lambda: torch.sort(x(), stable=True),
        "topk": lambda: torch.topk(x(), 2),
        "index_reduce_ host idx": lambda: x().index_reduce_(0, hi1, d(5.0, 6.0), "amax"),
        "narrow_copy": lambda: x().narrow_copy(0, 1, 2),
        "slice_scatter host src": lambda: torch.slice_scatter(x(), h(5.0, 6.0), 0, 0, 2),
        "select_scatter host src0": lambda: torch.select_scatter(x(), hv0, 0, 0),
        "diag_embed": lambda: torch.diag_embed(x()),
    }


def run(dev: str) -> dict[str, str]:
    """Each case's outcome: "ok", or the error's type and first line."""
    out = {}
    for name, call in cases(dev).items():
        try:
            call()
            if dev != "cpu" and torch.cuda.is_available():
                torch.cuda.synchronize()
            out[name] = "ok"
        except Exception as err:  # every failure is an outcome
            out[name] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
    return out
