"""Lists the files LMCache's in-process server uses, to build its image.

Run by the Python environment of the tested LMCache (test/tools/python):
`python trace_lmcache_server.py PORT PROBE_SCRIPT`. It starts
lmcache_server's own main (lmcache.v1.server.__main__, the console script
the rendered container runs) on 127.0.0.1:PORT with device cpu, waits until
the port accepts, runs PROBE_SCRIPT (the rendered probe's python3 -c
script) against it in this process, then prints, as JSON, every file of a
loaded module and every file mapped into the process (shared libraries),
and the interpreter's prefixes. The image holds those files at the same
paths, plus the interpreter's whole standard library.
"""

import json
import os
import socket
import sys
import threading
import time


def main():
    port, probe = int(sys.argv[1]), sys.argv[2]
    sys.argv = ["lmcache_server", "127.0.0.1", str(port), "cpu"]
    from lmcache.v1.server.__main__ import main as server_main

    threading.Thread(target=server_main, daemon=True).start()
    deadline = time.time() + 120
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.time() > deadline:
                raise SystemExit("lmcache_server never listened")
            time.sleep(0.2)
    sys.argv = ["-c", str(port)]
    try:
        exec(compile(probe, "<probe>", "exec"), {"__name__": "__main__"})
    except SystemExit as e:
        if e.code not in (0, None):
            raise SystemExit(f"the probe failed against lmcache_server: {e.code}")
    files = set()
    for mod in list(sys.modules.values()):
        f = getattr(mod, "__file__", None)
        if f and os.path.exists(f):
            files.add(os.path.abspath(f))
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split()
            if len(parts) >= 6 and parts[5].startswith("/") and os.path.exists(parts[5]):
                files.add(parts[5])
    out = {
        "files": sorted(files),
        "executable": sys.executable,
        "prefix": sys.prefix,
        "base_prefix": sys.base_prefix,
        "stdlib": os.path.dirname(os.__file__),
    }
    sys.stdout.write(json.dumps(out))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
