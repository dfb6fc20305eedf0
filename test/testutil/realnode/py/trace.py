"""Lists the files a program of the engine image uses, to build the image.

Run by the Python environment of the tested vLLM and LMCache
(test/tools/python), with TRACE_OUT naming the file to write:

  trace.py server PORT PROBE      LMCache's in-process server
  trace.py mp ARGV GATE PROBE     LMCache's multiprocess server
  trace.py engine ENGINE ARGS...  the stand-in engine (engine.py --trace)

server starts lmcache_server's own main (lmcache.v1.server.__main__, the
console script the rendered container runs) on 127.0.0.1:PORT with device
cpu in a thread, waits until the port accepts and runs PROBE (the rendered
probe's python3 -c script) against it in this process.

mp runs LMCache's `lmcache` console script (lmcache.cli.main) with ARGV (a
JSON list: the rendered `server` subcommand and its arguments) in the main
thread; a second thread runs PROBE (a JSON argv: the rendered exec probe)
until it passes, then the metrics gate GATE (a JSON argv, bound to
127.0.0.2 as its POD_IP) and fetches /metrics through it.

engine runs ENGINE (engine.py) with --trace and ARGS: it loads vLLM's
parser, publisher and block pool and LMCache's MP client and parses ARGS.

Each then writes to TRACE_OUT, as JSON, every file of a loaded module and
every file mapped into the process and its children (shared libraries),
and the interpreter's prefixes. The image holds those files at the same
paths, plus the interpreter's whole standard library.
"""

import json
import os
import runpy
import socket
import subprocess
import sys
import threading
import time
import urllib.request


def descendants(pid):
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                for child in f.read().split():
                    out.append(int(child))
                    out.extend(descendants(int(child)))
    except OSError:
        pass
    return out


def dump():
    files = set()
    for mod in list(sys.modules.values()):
        f = getattr(mod, "__file__", None)
        if f and os.path.exists(f):
            files.add(os.path.abspath(f))
    for pid in [os.getpid()] + descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/maps") as maps:
                for line in maps:
                    parts = line.split()
                    if len(parts) >= 6 and parts[5].startswith("/") and os.path.exists(parts[5]):
                        files.add(parts[5])
        except OSError:
            pass
    out = {
        "files": sorted(files),
        "executable": sys.executable,
        "prefix": sys.prefix,
        "base_prefix": sys.base_prefix,
        "stdlib": os.path.dirname(os.__file__),
    }
    with open(os.environ["TRACE_OUT"], "w") as f:
        json.dump(out, f)


def with_python(argv):
    return [sys.executable if a == "python3" else a for a in argv]


def server(port, probe):
    port = int(port)
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
    dump()
    os._exit(0)


def mp(argv, gate, probe):
    argv, gate, probe = json.loads(argv), with_python(json.loads(gate)), with_python(json.loads(probe))

    def watch():
        code = 1
        try:
            deadline = time.time() + 300
            while subprocess.run(probe, capture_output=True).returncode != 0:
                if time.time() > deadline:
                    raise SystemExit("the MP server's probe never passed")
                time.sleep(1)
            port = int(gate[-1])
            g = subprocess.Popen(gate, env=dict(os.environ, POD_IP="127.0.0.2"))
            try:
                for _ in range(100):
                    try:
                        with urllib.request.urlopen(f"http://127.0.0.2:{port}/metrics", timeout=5) as r:
                            if b"lmcache" not in r.read():
                                raise SystemExit("the metrics gate served no lmcache series")
                        break
                    except OSError:
                        time.sleep(0.2)
                else:
                    raise SystemExit("the metrics gate never answered")
            finally:
                g.kill()
            dump()
            code = 0
        except BaseException as e:
            print("trace:", repr(e), file=sys.stderr, flush=True)
        os._exit(code)

    threading.Thread(target=watch, daemon=True).start()
    sys.argv = ["lmcache"] + argv
    from lmcache.cli.main import main as lmcache_main

    lmcache_main()
    print("trace: lmcache server exited", file=sys.stderr, flush=True)
    os._exit(1)


def engine(program, *args):
    sys.argv = [program, "--trace", *args]
    runpy.run_path(program, run_name="__main__")
    dump()


if __name__ == "__main__":
    {"server": server, "mp": mp, "engine": engine}[sys.argv[1]](*sys.argv[2:])
