"""Adapters: upstream schedulers, unmodified, as schedulers under test (`--scheduler`).

An adapter runs the upstream scheduler's own code on the simulated CUDA (`backends/torchsim`) and
replaces only what needs a real kernel or a real process around it: the engine's forward, the
tokenizer, the message transport. It never edits or copies upstream code.

`base/` holds what every adapter shares (finding the engine, one-line errors, stand-ins, the
front end, idle polling, the code roots a counterexample fingerprints). One folder per engine:
`minisgl/` (mini-sglang), `vllm/` (vLLM's v1 schedulers), `sglang/` (SGLang's `Scheduler`).
"""
