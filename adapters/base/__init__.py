"""What every upstream adapter shares: finding and importing the engine (a checkout named by an
environment variable, or the installed package) with one-line errors, stand-ins for modules only
its real kernels and transport use, the front end around its scheduler (rejections, live requests,
token messages), and the polling and idling every `step()` does.

An adapter is then a folder of engine-specific code: which classes it runs, how a `UserMsg`
becomes the engine's request, how one `step()` is one iteration of the engine's own loop, where
its forward is stood in for, and how its books are read.

    ENGINE = Upstream(name="vLLM", package="vllm", env="VLLM_PATH",
                      marker="vllm/v1/core/sched/scheduler.py", known_api="0.34.0",
                      needed=(("vllm.v1.core.sched.async_scheduler", ("AsyncScheduler",)),))
    loaded = load(ENGINE)          # UserError (one line, exit 2) when absent or incompatible
    cls = loaded["vllm.v1.core.sched.async_scheduler"].AsyncScheduler
"""

from overlapcheck.adapters.base.checkout import Loaded, Upstream, load
from overlapcheck.adapters.base.front import FrontEnd
from overlapcheck.adapters.base.scheduler import UpstreamScheduler
from overlapcheck.adapters.base.stand_ins import install_stand_ins

__all__ = ["FrontEnd", "Loaded", "Upstream", "UpstreamScheduler", "install_stand_ins", "load"]
