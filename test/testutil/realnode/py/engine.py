"""The stand-in engine of the real node's engine pods (EngineProgram).

No GPU and no vLLM image fit on the test machine, so the engine
container runs this program from the image built from the locked vllm
environment (vLLM and LMCache as `make pyenv` installed them), as
`python3 engine.py ARGS...`, ARGS being the engine's arguments as the
webhook left them. Everything it checks is the engines' own code:

1. vLLM's own parser takes ARGS as `vllm serve` would (the API server's
   FlexibleArgumentParser + make_arg_parser, validate_parsed_serve_args,
   AsyncEngineArgs.from_cli_args): a refusal exits 2 with vLLM's message.
2. The cache server the --kv-transfer-config names answers, through the
   client of its connector: LMCacheConnectorV1 (the in-process server at
   LMCACHE_REMOTE_URL) gets the rendered probe's HEALTH request (PROBE);
   LMCacheMPConnector (multiprocess mode) gets LMCache's own MP request
   client (RequestClientFactory), asked get_chunk_size.
3. With EXPECT_SHM_BYTES set, /dev/shm is a tmpfs of that size.
4. With --kv-events-config, vLLM's own publisher (EventPublisherFactory,
   its ZmqEventPublisher) publishes the BlockStored events vLLM's own
   block pool makes for two prompts of PROMPT_TOKENS tokens each, at the
   endpoint the webhook set (the pod's kvevent-subscriber reads them).

Each step prints one line starting "engine:"; when all passed,
/tmp/ready exists (the pod's readiness probe) and the program waits, as
an engine keeps serving. `engine.py --trace ARGS` (the image builder)
loads everything the steps load and exits.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse


def say(*a):
    print("engine:", *a, flush=True)


def load():
    """Imports vLLM's parser, publisher and block pool and LMCache's MP
    client, with vLLM's platform set to CPU (no GPU here)."""
    from vllm import platforms

    if platforms.current_platform.is_unspecified():
        from vllm.platforms.cpu import CpuPlatform

        platforms.current_platform = CpuPlatform()
    from lmcache.v1.multiprocess.transport.factory import RequestClientFactory  # noqa: F401
    from vllm.config.kv_events import KVEventsConfig  # noqa: F401
    from vllm.distributed.kv_events import EventPublisherFactory, KVEventBatch  # noqa: F401
    from vllm.engine.arg_utils import AsyncEngineArgs  # noqa: F401
    from vllm.entrypoints.common.cli_args import make_arg_parser  # noqa: F401
    from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: F401
    from vllm.v1.core.block_pool import BlockPool  # noqa: F401
    from vllm.v1.request import Request  # noqa: F401


def parse(argv):
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    # Offline: a model id is a local folder, made here (vLLM looks it up
    # on the hub otherwise).
    os.chdir(tempfile.mkdtemp(prefix="engine-"))
    for i, a in enumerate(argv):
        if a == "--model" and i + 1 < len(argv) and not os.path.isabs(argv[i + 1]):
            os.makedirs(argv[i + 1], exist_ok=True)
    parser = make_arg_parser(FlexibleArgumentParser(description="vLLM OpenAI-Compatible RESTful API server."))
    args = parser.parse_args(argv)
    validate_parsed_serve_args(args)
    return AsyncEngineArgs.from_cli_args(args)


def reach_server(ktc):
    if ktc is None:
        say("no --kv-transfer-config")
        return
    if ktc.kv_connector == "LMCacheMPConnector":
        from lmcache.v1.multiprocess.transport.factory import RequestClientFactory

        extra = ktc.kv_connector_extra_config
        url = f"{extra['lmcache.mp.host']}:{extra['lmcache.mp.port']}"
        deadline = time.time() + 120
        while True:
            client = RequestClientFactory.create(url)
            try:
                size = client.get_chunk_size().result(timeout=5)
                break
            except Exception as e:  # the server may still be starting
                if time.time() > deadline:
                    raise SystemExit(f"engine: the MP server at {url} never answered: {e!r}")
                time.sleep(2)
            finally:
                client.close()
        say(f"LMCache MP server at {url} answered get_chunk_size: {size}")
        return
    u = urllib.parse.urlparse(os.environ["LMCACHE_REMOTE_URL"])
    probe = os.environ["PROBE"].replace("127.0.0.1", u.hostname)
    while subprocess.run([sys.executable, "-c", probe, str(u.port)]).returncode != 0:
        time.sleep(1)
    say(f"lmcache_server at {u.hostname}:{u.port} answered HEALTH")


def check_shm():
    want = os.environ.get("EXPECT_SHM_BYTES")
    if not want:
        return
    st = os.statvfs("/dev/shm")
    size = st.f_blocks * st.f_frsize
    fstype = ""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4] == "/dev/shm":
                fstype = fields[fields.index("-") + 1]
    if fstype != "tmpfs" or size != int(want):
        raise SystemExit(f"engine: /dev/shm is {fstype or 'no mount'} of {size} bytes, want tmpfs of {want}")
    say(f"/dev/shm is a private tmpfs of {size} bytes")


def publish(kec, block_size):
    if kec is None or not kec.enable_kv_cache_events:
        say("no KV events")
        return
    from vllm.distributed.kv_events import EventPublisherFactory, KVEventBatch
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.request import Request

    publisher = EventPublisherFactory.create(kec, data_parallel_rank=0)
    hash_fn = get_hash_fn_by_name(os.environ.get("HASH_ALGO", "sha256"))
    kv_cache_utils.init_none_hash(hash_fn)
    pool = BlockPool(num_gpu_blocks=65, enable_caching=True, hash_block_size=block_size, enable_kv_cache_events=True)
    hasher = kv_cache_utils.get_request_block_hasher(block_size, hash_fn)
    n = int(os.environ.get("PROMPT_TOKENS", "64"))
    # The subscriber's SUB socket joins after the PUB binds: two steps
    # apart, so that a first batch sent before it joined is replayed (the
    # second's sequence number shows the gap).
    for i, first in enumerate((1000, 5000)):
        time.sleep(3)
        tokens = list(range(first, first + n))
        req = Request(request_id=f"r{i}", prompt_token_ids=tokens, sampling_params=SamplingParams(max_tokens=1),
                      pooling_params=None, block_hasher=hasher)
        full = len(req.block_hashes)
        blocks = pool.get_new_blocks(full)
        pool.cache_full_blocks(req, blocks, num_cached_blocks=0, num_full_blocks=full,
                               block_size=block_size, kv_cache_group_id=0)
        events = pool.take_events()
        publisher.publish(KVEventBatch(ts=time.time(), events=events))
        say(f"published {len(events)} events, {full} blocks of {block_size} tokens, at {kec.endpoint}")
    return publisher


def main():
    trace = sys.argv[1:2] == ["--trace"]
    argv = sys.argv[2:] if trace else sys.argv[1:]
    say("args", json.dumps(argv))
    load()
    try:
        ea = parse(argv)
    except (SystemExit, Exception) as e:
        raise SystemExit(f"engine: vLLM's parser refused the command line: {e!r}")
    ktc, kec = ea.kv_transfer_config, ea.kv_events_config
    say("vLLM parsed kv_transfer_config", json.dumps(ktc.kv_connector if ktc else None),
        "kv_events_config", json.dumps(kec.endpoint if kec and kec.enable_kv_cache_events else None),
        "block_size", ea.block_size, "hash", ea.prefix_caching_hash_algo)
    if trace:
        return
    reach_server(ktc)
    check_shm()
    from vllm.config import CacheConfig

    block_size = ea.block_size or getattr(CacheConfig, "DEFAULT_BLOCK_SIZE", 16)
    os.environ.setdefault("HASH_ALGO", ea.prefix_caching_hash_algo)
    keep = publish(kec, block_size)  # noqa: F841 (the publisher's sockets stay open)
    open("/tmp/ready", "w").close()
    say("ready")
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
