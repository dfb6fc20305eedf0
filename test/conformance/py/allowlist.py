"""Reads, from an engine's own code, what the engineOverrides allow-list
names: its flags and its environment variables.

Standard input: {"engine": "vllm" | "sglang", "flags": [str], "env": [str]}.
"vllm" runs in the environment with vLLM and LMCache, "sglang" in SGLang's.

Flags: each is looked up in the parser the engine's server builds (vLLM:
make_arg_parser of vllm/entrypoints/cli/serve.py's serve subcommand;
SGLang: ServerArgs.add_cli_args of sglang/srt/server_args.py). The answer
per flag is whether the parser has it as an option string and its nargs
(0 for a switch, null for one value, "+" etc.).

Env: each name is looked up among what the code defines:
vLLM's vllm/envs.py environment_variables, SGLang's sglang/srt/environ.py
Envs, LMCache's config definitions (LMCACHE_<FIELD>, lmcache/v1/config.py)
and the Hugging Face Hub client's source (huggingface_hub reads HF_TOKEN,
HF_HUB_OFFLINE, ... by name). The answer per name is the owner that
defines it, or null.

Standard output: {"flags": {flag: {"known": bool, "nargs": ...}},
"env": {name: owner | null}}.
"""

import json
import os
import pathlib
import sys


def vllm_parser():
    from vllm import platforms

    # No GPU here: pick the CPU platform as vllm_args.py does.
    if platforms.current_platform.is_unspecified():
        from vllm.platforms.cpu import CpuPlatform

        platforms.current_platform = CpuPlatform()
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser())


def sglang_parser():
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return parser


def env_owners(engine):
    owners = {}
    if engine == "vllm":
        import vllm.envs

        for name in vllm.envs.environment_variables:
            owners[name] = "vLLM"
        from lmcache.v1.config import _CONFIG_DEFINITIONS

        for field in _CONFIG_DEFINITIONS:
            owners["LMCACHE_" + field.upper()] = "LMCache"
    else:
        from sglang.srt.environ import Envs

        for name in dir(Envs):
            if name.startswith("SGLANG_"):
                owners[name] = "SGLang"
    import huggingface_hub

    hub = pathlib.Path(huggingface_hub.__file__).parent
    source = "\n".join(p.read_text(errors="replace") for p in hub.rglob("*.py"))
    return owners, source


def main():
    req = json.load(sys.stdin)
    real_stdout = sys.stdout
    sys.stdout = sys.stderr
    parser = vllm_parser() if req["engine"] == "vllm" else sglang_parser()
    options = {}
    for action in parser._actions:
        for s in action.option_strings:
            options[s] = action
    flags = {}
    for f in req["flags"]:
        a = options.get(f)
        flags[f] = {"known": a is not None, "nargs": None if a is None else a.nargs}
    owners, hub_source = env_owners(req["engine"])
    env = {}
    for name in req["env"]:
        if name in owners:
            env[name] = owners[name]
        elif f'"{name}"' in hub_source:
            env[name] = "huggingface_hub"
        else:
            env[name] = None
    json.dump({"flags": flags, "env": env}, real_stdout)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
