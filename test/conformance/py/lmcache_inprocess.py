"""Says whether this environment's LMCache still ships the in-process
server and adapter. Standard input: {} (unused). Standard output:
{"lmcache": version, "adapter": bool, "server_module": bool,
"server_script": bool}: whether vLLM's LMCacheConnectorV1 can import the
adapter it names (lmcache.integration.vllm.vllm_v1_adapter), whether
lmcache.v1.server imports, and whether the lmcache_server console script is
installed beside this interpreter."""
import importlib
import json
import os
import sys


def importable(name):
    try:
        importlib.import_module(name)
        return True
    except ModuleNotFoundError:
        return False


def main():
    json.load(sys.stdin)
    real_stdout, sys.stdout = sys.stdout, sys.stderr
    import lmcache
    from importlib.metadata import version

    out = {
        "lmcache": version("lmcache"),
        "adapter": importable("lmcache.integration.vllm.vllm_v1_adapter"),
        "server_module": importable("lmcache.v1.server"),
        "server_script": os.path.exists(os.path.join(os.path.dirname(sys.executable), "lmcache_server")),
    }
    del lmcache
    json.dump(out, real_stdout)


if __name__ == "__main__":
    main()
