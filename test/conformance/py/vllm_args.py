"""Parses engine command lines with vLLM's own argument parser.

Standard input: {"cases": [{"name": str, "argv": [str, ...]}], "fields": [str],
"models": [str], "connectors": [str]}.
Each argv is what the engine process receives (argv[0] included): `vllm
serve ...`, or `python -m vllm.entrypoints.openai.api_server ...` (also
`python -m vllm.entrypoints.cli.main serve ...`).

For each case the argv goes through the parser that entry point builds
(vllm/entrypoints/cli/main.py with the serve subcommand of
vllm/entrypoints/cli/serve.py, or the api_server entry's
FlexibleArgumentParser + make_arg_parser), the serve checks
(validate_parsed_serve_args) and AsyncEngineArgs.from_cli_args. Standard
output: one result per case with the parse error (if any), the resulting
kv_transfer_config and kv_events_config as dicts, whether the connector is in
vLLM's KVConnectorFactory registry, the prefix-caching hash algorithm, the
endpoints each data-parallel rank's ZmqEventPublisher would use and whether
it binds them, the EngineArgs attributes named in "fields", and the class
each of "connectors" loads.

The environment is offline (HF_HUB_OFFLINE=1), where EngineArgs resolves a
model id to a local snapshot: each of "models" is made an empty local folder
of that relative path in the working directory (a model already on disk),
so the parse never looks anything up.
"""

import contextlib
import dataclasses
import io
import json
import logging
import os
import sys
import tempfile
import traceback


def main():
    req = json.load(sys.stdin)
    os.chdir(tempfile.mkdtemp(prefix="vllm-args-"))
    for m in req.get("models", []):
        os.makedirs(m, exist_ok=True)
    # Everything vLLM logs goes to stderr; stdout is this program's answer.
    real_stdout = sys.stdout
    sys.stdout = sys.stderr

    from vllm import platforms

    # No GPU here: vLLM's CUDA build leaves the platform unspecified and
    # building the parser then fails to infer a device type. Pick the CPU
    # platform the way vLLM's own CLI does for `vllm bench`
    # (vllm/entrypoints/cli/main.py).
    if platforms.current_platform.is_unspecified():
        from vllm.platforms.cpu import CpuPlatform

        platforms.current_platform = CpuPlatform()

    import vllm
    from vllm.distributed.kv_events import ZmqEventPublisher
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    def cli_parser():
        # vllm/entrypoints/cli/main.py, with the serve subcommand only.
        parser = FlexibleArgumentParser(description="vLLM CLI")
        subparsers = parser.add_subparsers(required=False, dest="subparser")
        cmd = ServeSubcommand()
        cmd.subparser_init(subparsers).set_defaults(dispatch_function=cmd.cmd)
        return parser

    def api_server_parser():
        # vllm/entrypoints/launchers/api_server/entry.py main().
        return make_arg_parser(FlexibleArgumentParser(description="vLLM OpenAI-Compatible RESTful API server."))

    parsers = {}

    def parse(argv):
        prog = os.path.basename(argv[0])
        if prog == "vllm":
            kind, rest = "cli", argv[1:]
        elif prog.startswith("python") and argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]:
            kind, rest = "api_server", argv[3:]
        elif prog.startswith("python") and argv[1:3] == ["-m", "vllm.entrypoints.cli.main"]:
            kind, rest = "cli", argv[3:]
        else:
            raise ValueError(f"not a vLLM entry point: {argv[:3]}")
        if kind not in parsers:
            parsers[kind] = cli_parser() if kind == "cli" else api_server_parser()
        parser = parsers[kind]
        if kind == "cli" and rest[:1] != ["serve"]:
            raise ValueError(f"not `vllm serve`: {rest[:1]}")
        args = parser.parse_args(rest)
        validate_parsed_serve_args(args)
        if kind == "cli" and getattr(args, "model_tag", None) is not None:
            args.model = args.model_tag  # ServeSubcommand.cmd
        return AsyncEngineArgs.from_cli_args(args)

    def extensible_kv_cache(ea):
        """The extensible-KV-cache decision vLLM (0.34 and later) makes for
        this command line on a CUDA machine: VllmConfig's own resolver
        (_resolve_extensible_kv_cache, which reads the cache config, the KV
        transfer config and elastic EP) with vLLM's platform taken as CUDA
        and no IMEX channel. "error: ..." when vLLM refuses the
        combination; None when this vLLM has no extensible KV cache."""
        from types import SimpleNamespace
        from unittest import mock

        from vllm.config import CacheConfig, VllmConfig

        if not hasattr(VllmConfig, "_resolve_extensible_kv_cache"):
            return None
        import vllm.utils.vmm_driver

        cc = CacheConfig(
            enable_extensible_kv_cache=ea.enable_extensible_kv_cache,
            kv_cache_memory_bytes=ea.kv_cache_memory_bytes,
            num_gpu_blocks_override=ea.num_gpu_blocks_override,
        )
        fake = SimpleNamespace(
            cache_config=cc,
            kv_transfer_config=ea.kv_transfer_config,
            parallel_config=SimpleNamespace(enable_elastic_ep=False),
        )
        cuda = SimpleNamespace(is_cuda_alike=lambda: True, is_rocm=lambda: False)
        try:
            with mock.patch.object(platforms, "current_platform", cuda), mock.patch.object(
                vllm.utils.vmm_driver, "imex_channel_available", lambda: False
            ):
                VllmConfig._resolve_extensible_kv_cache(fake)
        except ValueError as e:
            return f"error: {e}"
        return cc.enable_extensible_kv_cache

    def as_dict(cfg):
        if cfg is None:
            return None
        return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}

    results = []
    for case in req["cases"]:
        out = {"name": case["name"], "error": "", "warnings": []}
        records = []
        handler = logging.Handler(logging.WARNING)
        handler.emit = lambda r: records.append(r.getMessage())
        vllm_logger = logging.getLogger("vllm")
        vllm_logger.addHandler(handler)
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                ea = parse(case["argv"])
        except SystemExit as e:  # argparse's error(): usage and message on stderr
            out["error"] = f"exit {e.code}: {err.getvalue().strip().splitlines()[-1:]}"
        except Exception as e:  # noqa: BLE001 - every failure is the answer
            out["error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"
        finally:
            vllm_logger.removeHandler(handler)
        out["warnings"] = records
        if not out["error"]:
            ktc = as_dict(ea.kv_transfer_config)
            kec = as_dict(ea.kv_events_config)
            out["kv_transfer_config"] = ktc
            out["kv_events_config"] = kec
            if ktc is not None and ktc.get("kv_connector"):
                out["connector_registered"] = ktc["kv_connector"] in KVConnectorFactory._registry
                # The class the engine loads for this config at start
                # (KVConnectorFactory.get_connector_class honours
                # kv_connector_module_path).
                try:
                    cls = KVConnectorFactory.get_connector_class(ea.kv_transfer_config)
                    out["connector_class"] = f"{cls.__module__}.{cls.__qualname__}"
                except Exception as e:  # noqa: BLE001
                    out["connector_class"] = f"error: {type(e).__name__}: {e}"
                # The server URL LMCache's multiprocess connector dials, read
                # from the config as its __init__ reads it.
                if ktc["kv_connector"] == "LMCacheMPConnector":
                    from lmcache.integration.vllm.lmcache_mp_connector import _ensure_transport_scheme

                    get = ea.kv_transfer_config.get_from_extra_config
                    out["mp_server_url"] = _ensure_transport_scheme(
                        f"{get('lmcache.mp.host', 'tcp://localhost')}:{get('lmcache.mp.port', 5555)}"
                    )
                    # The rest of lmcache.mp.*, resolved as LMCache's
                    # adapter does (it ignores a key it does not know, so
                    # the known names are reported too).
                    from lmcache.integration.vllm.vllm_multi_process_adapter import (
                        ExtraConfigDefault,
                        _resolve_extra_config,
                    )

                    out["mp_extra_config"] = _resolve_extra_config(ea.kv_transfer_config.kv_connector_extra_config)
                    out["mp_extra_config_names"] = [m.name for m in ExtraConfigDefault]
            out["hash_algo"] = ea.prefix_caching_hash_algo
            dp = ea.data_parallel_size
            out["data_parallel_size"] = dp
            if kec is not None:
                ranks = []
                for r in range(dp):
                    rank = {}
                    try:
                        rank["endpoint"] = ZmqEventPublisher.offset_endpoint_port(kec["endpoint"], r)
                        rank["replay_endpoint"] = ZmqEventPublisher.offset_endpoint_port(kec["replay_endpoint"], r)
                        rank["binds"] = ZmqEventPublisher._is_bind_endpoint(rank["endpoint"])
                    except Exception as e:  # noqa: BLE001
                        rank["error"] = f"{type(e).__name__}: {e}"
                    ranks.append(rank)
                out["ranks"] = ranks
            out["fields"] = {f: getattr(ea, f) for f in req.get("fields", [])}
            out["extensible_kv_cache"] = extensible_kv_cache(ea)
        results.append(out)

    # The connectors named in "connectors", loaded the way the engine does
    # at start (KVConnectorFactory.get_connector_class_by_name).
    loads = {}
    for name in req.get("connectors", []):
        try:
            cls = KVConnectorFactory.get_connector_class_by_name(name)
            loads[name] = f"{cls.__module__}.{cls.__qualname__}"
        except Exception as e:  # noqa: BLE001
            loads[name] = f"error: {type(e).__name__}: {e}"
    json.dump({"vllm": vllm.__version__, "results": results, "connector_classes": loads}, real_stdout, default=str)


if __name__ == "__main__":
    main()
