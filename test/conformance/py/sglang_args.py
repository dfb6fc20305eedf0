"""Feeds SGLang's own server-argument parser the command lines the webhook
gives SGLang engine pods (test/conformance/sglang_test.go).

stdin: {"cases": [{"name": str, "argv": [str, ...]}], "fields": [str, ...]},
each argv what the engine process of an admitted pod receives (its
program's name first); fields are more ServerArgs fields to report (the
user's own flags).
stdout: {"sglang": version, "cases": [{"name", "accepted", "stage", "error",
"raw", "resolved", "logs", "kv_events"}]}:

- accepted: prepare_server_args parsed the arguments (argparse: choices,
  types, abbreviations) and ServerArgs.resolve_once ran SGLang's whole
  resolution pipeline (what `python -m sglang.launch_server` does before it
  starts anything) without raising. stage says where it failed ("locate",
  "parse" or "resolve"); error is the message.
- raw: the hicache_* / page_size / kv_events_config fields as parsed (what
  the command line asked for, SGLang's declared default where it is silent);
  resolved: the same fields after resolution (what SGLang runs with).
- logs: every record SGLang logged at INFO or above while resolving.
- kv_events: the resolved --kv-events-config read by SGLang's own
  KVEventsConfig.from_cli (its publisher reads it the same way), with the
  keys of the JSON it ignores.
- storage_error: for the dynamic storage backend without
  --hicache-storage-backend-extra-config, what SGLang's own
  StorageBackendFactory raises when the engine starts it (the parser
  accepts the command line; the engine then fails).

All cases run in this one process: importing SGLang takes tens of seconds.
"""

import contextlib
import io
import json
import logging
import sys
import warnings

FIELDS = [
    "enable_hierarchical_cache",
    "hicache_ratio",
    "hicache_size",
    "hicache_write_policy",
    "hicache_io_backend",
    "hicache_mem_layout",
    "hicache_storage_backend",
    "hicache_storage_prefetch_policy",
    "hicache_host_memory_mode",
    "page_size",
    "port",
    "kv_events_config",
    "disable_radix_cache",
    "hicache_storage_backend_extra_config",
]


class Records(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.INFO)
        self.records = []

    def emit(self, record):
        if record.name.startswith("sglang"):
            self.records.append(
                {"level": record.levelname, "logger": record.name, "message": record.getMessage()}
            )


def engine_args(argv):
    """The arguments SGLang's launcher hands prepare_server_args."""
    for i, a in enumerate(argv):
        if a == "-m" and i + 1 < len(argv) and argv[i + 1] == "sglang.launch_server":
            return argv[i + 2 :]
        if a.endswith("sglang") and i + 1 < len(argv) and argv[i + 1] == "serve":
            return argv[i + 2 :]
    raise ValueError("no `-m sglang.launch_server` or `sglang serve` in %r" % (argv,))


def plain(v):
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


def run(case, fields, prepare_server_args, resolution_result, KVEventsConfig):
    out = {"name": case["name"], "accepted": False, "stage": "", "error": "", "raw": {}, "resolved": {}, "logs": [], "kv_events": None, "storage_error": ""}
    try:
        args = engine_args(case["argv"])
    except ValueError as e:
        out["stage"], out["error"] = "locate", str(e)
        return out
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            sa = prepare_server_args(args)
    except SystemExit:
        # argparse prints its usage, then "prog: error: ...".
        lines = err.getvalue().strip().splitlines()
        out["stage"], out["error"] = "parse", lines[-1] if lines else "argparse exited"
        return out
    except Exception as e:  # noqa: BLE001 - any failure is the verdict
        out["stage"], out["error"] = "parse", "%s: %s" % (type(e).__name__, e)
        return out
    out["raw"] = {f: plain(getattr(sa, f)) for f in fields}
    # prepare_server_args reconfigures the root logger (basicConfig force):
    # listen after it.
    records = Records()
    root = logging.getLogger()
    root.addHandler(records)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sa.resolve_once()
    except Exception as e:  # noqa: BLE001
        out["stage"], out["error"] = "resolve", "%s: %s" % (type(e).__name__, e)
        out["logs"] = records.records
        return out
    finally:
        root.removeHandler(records)
    out["logs"] = records.records
    out["resolved"] = {f: plain(resolution_result(sa, f)) for f in fields}
    out["accepted"] = True
    if out["resolved"]["hicache_storage_backend"] == "dynamic" and out["resolved"]["hicache_storage_backend_extra_config"] is None:
        out["storage_error"] = dynamic_storage_error()
    cfg = out["resolved"]["kv_events_config"]
    if cfg:
        try:
            parsed = KVEventsConfig.from_cli(cfg)
            keys = json.loads(cfg).keys()
            out["kv_events"] = {
                "config": {k: plain(v) for k, v in parsed.model_dump().items()},
                "ignored_keys": sorted(k for k in keys if k not in type(parsed).model_fields),
            }
        except Exception as e:  # noqa: BLE001
            out["accepted"] = False
            out["stage"], out["error"] = "kv-events-config", "%s: %s" % (type(e).__name__, e)
    return out


def dynamic_storage_error():
    """What SGLang's storage factory raises for the dynamic backend with no
    extra config (HiCacheController creates its backend this way)."""
    import dataclasses

    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    required = {
        f.name: 0 if f.type == "int" else None
        for f in dataclasses.fields(HiCacheStorageConfig)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    try:
        StorageBackendFactory.create_backend("dynamic", HiCacheStorageConfig(**required), None)
    except Exception as e:  # noqa: BLE001
        return "%s: %s" % (type(e).__name__, e)
    return ""


def main():
    req = json.load(sys.stdin)
    cases = req["cases"]
    fields = FIELDS + [f for f in req.get("fields") or [] if f not in FIELDS]
    # SGLang prints to stdout in places; keep stdout for the JSON answer.
    real_stdout = sys.stdout
    sys.stdout = sys.stderr
    from importlib.metadata import version

    from sglang.srt.arg_groups.overrides import resolution_result
    from sglang.srt.disaggregation.kv_events import KVEventsConfig
    from sglang.srt.server_args import prepare_server_args

    results = [run(c, fields, prepare_server_args, resolution_result, KVEventsConfig) for c in cases]
    sys.stdout = real_stdout
    json.dump({"sglang": version("sglang"), "cases": results}, sys.stdout)


if __name__ == "__main__":
    main()
