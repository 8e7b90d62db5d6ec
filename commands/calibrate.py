"""`overlapcheck calibrate`: fit the simulator's timing profile to a real device, or check one."""

from __future__ import annotations

import argparse
from pathlib import Path

from overlapcheck.commands.common import add_model_options, load_profile
from overlapcheck.commands.paths import output_file, output_folder
from overlapcheck.core.errors import UserError


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("calibrate", help="fit the simulator's latencies to a GPU (or check a fit)")
    p.add_argument(
        "--backend",
        choices=("cuda", "cpu"),
        default="cuda",
        help="the real engine to time: cuda (a GPU, two streams) or cpu",
    )
    add_model_options(p, prefix="")
    p.add_argument(
        "-o", "--out", default="profile.json", help="where the fitted profile goes (JSON)"
    )
    p.add_argument(
        "--check",
        metavar="PROFILE",
        help="compare sim and GPU per named scenario with this profile instead of fitting one "
        "(default: fit)",
    )
    p.add_argument(
        "--traces",
        metavar="DIR",
        type=Path,
        help="with --check: save each scenario's real and simulated traces there (for timeline) "
        "(default: not saved)",
    )
    p.set_defaults(main=main)


def main(args: argparse.Namespace) -> int:
    profile = load_profile(args.check) if args.check else None
    if args.traces is not None and profile is None:
        raise UserError("--traces goes with --check PROFILE")
    if args.traces is not None:
        output_folder(str(args.traces), "--traces")
    elif profile is None:
        output_file(args.out, "timing profile")
    try:
        from overlapcheck.backends.gpu.backend import make_torch_backend
        from overlapcheck.calibrate.gpu import calibrate, check
    except ImportError as err:
        raise UserError(
            f"calibrate needs torch and transformers ({err.name} is missing): "
            "pip install 'overlapcheck[real]'"
        ) from None
    # With the reference: it maps scripted EOS onto the model's own output (prepare.py).
    backend = make_torch_backend(args.backend, model=args.model, preset=args.preset)
    if profile is not None:
        check(backend, profile, traces=args.traces, say=print)
        return 0
    fitted = calibrate(backend, args.out)
    print(fitted.summary())
    print(f"profile written to {args.out}:")
    for name, value in fitted.profile.as_dict().items():
        print(f"  {name:<22}{value * 1e6:>10.3f} µs")
    return 0
