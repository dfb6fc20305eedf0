"""Reads LMCACHE_* environments with LMCache's own config loader.

Standard input: {"cases": [{"name": str, "env": {NAME: value}}]}. For each
case the process environment's LMCACHE_* variables are replaced by env and
LMCacheEngineConfig.from_env() runs, then validate(): what the vLLM
integration does when no LMCACHE_CONFIG_FILE is set
(lmcache/integration/vllm/utils.py lmcache_get_or_create_config).

LMCache's converter logs a value it cannot convert ("Failed to convert ...")
and substitutes None or a default instead of failing, and it ignores
LMCACHE_* names it does not define: so every warning its loggers emit is
captured (they do not propagate to the root logger), and every name of env
is checked against the config's declared fields and aliases.

Standard output: per case the warnings, the unknown names, the error (if
from_env or validate raised), every config field as JSON, and the local disk
directories LMCache's PathSharder makes of local_disk.
"""

import json
import logging
import math
import os
import sys


def plain(v):
    """A config value as JSON can hold it (inf and nan as strings)."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


def main():
    req = json.load(sys.stdin)
    real_stdout = sys.stdout
    sys.stdout = sys.stderr

    import lmcache
    from lmcache.v1 import config as v1config
    from lmcache.v1.config import LMCacheEngineConfig

    records = []

    class Capture(logging.Handler):
        def emit(self, record):
            records.append(f"{record.name}: {record.getMessage()}")

    handler = Capture(logging.WARNING)
    # LMCache's loggers are children of "lmcache" that do not propagate:
    # attach to every one that exists, and to the parent for new ones.
    loggers = [logging.getLogger("lmcache")] + [
        lg for name, lg in logging.Logger.manager.loggerDict.items()
        if name.startswith("lmcache") and isinstance(lg, logging.Logger)
    ]
    for lg in loggers:
        lg.addHandler(handler)

    defined = set(v1config._CONFIG_DEFINITIONS)
    aliases = set(getattr(v1config, "_CONFIG_ALIASES", {}) or {})
    known = {"LMCACHE_" + n.upper() for n in defined | aliases}
    # Read by LMCache outside the config class (the loader's own switch).
    known.add("LMCACHE_CONFIG_FILE")

    results = []
    for case in req["cases"]:
        for k in [k for k in os.environ if k.startswith("LMCACHE_")]:
            del os.environ[k]
        os.environ.update(case["env"])
        del records[:]
        out = {"name": case["name"], "error": ""}
        try:
            cfg = LMCacheEngineConfig.from_env()
            cfg.validate()
            out["config"] = {n: plain(getattr(cfg, n)) for n in v1config._CONFIG_DEFINITIONS}
            if cfg.local_disk:
                # The directories LocalDiskBackend uses: local_disk is a
                # comma-separated list it shards across devices.
                from lmcache.v1.storage_backend.path_sharder import PathSharder

                out["disk_paths"] = PathSharder(
                    raw_csv=cfg.local_disk, strategy=cfg.local_disk_path_sharding, dst_device="cuda:0"
                ).all_paths
        except Exception as e:  # noqa: BLE001 - every failure is the answer
            out["error"] = f"{type(e).__name__}: {e}"
        out["warnings"] = list(records)
        out["unknown"] = sorted(k for k in case["env"] if k.startswith("LMCACHE_") and k not in known)
        results.append(out)
    version = getattr(lmcache, "__version__", "")
    json.dump({"lmcache": version, "results": results}, real_stdout, default=str)


if __name__ == "__main__":
    main()
