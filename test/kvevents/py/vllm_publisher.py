"""vLLM's own KV-event publisher, fed by vLLM's own block pool.

  vllm_publisher.py    one JSON command per stdin line, one JSON reply per line

Every command names a publisher ("pub"); {"op": "open", "pub": NAME, SPEC...}
builds one, {"op": "close"} shuts it down. SPEC:
  kv_events_config  the --kv-events-config value exactly as the webhook renders it
  hash_algo         the --prefix-caching-hash-algo value the webhook sets
  block_size        tokens per block (vLLM's --block-size; by default vLLM's
                    own default, CacheConfig.DEFAULT_BLOCK_SIZE: 16 in vLLM
                    0.33, 64 in 0.34)
  dp_rank           the data-parallel rank this publisher stands for (0 by default)
  num_blocks        blocks in the pool (evictions start once it is full)

Everything engine-side is vLLM's code: the KVEventsConfig class parses the
config, EventPublisherFactory.create builds the publisher for the rank
(ZmqEventPublisher: its own PUB and replay ROUTER sockets, ring, sequence
numbers, offset_endpoint_port), the hash function is
get_hash_fn_by_name(hash_algo) with init_none_hash as EngineCore calls it,
requests are vllm.v1.request.Request with get_request_block_hasher, and the
BlockStored / BlockRemoved / AllBlocksCleared events come out of
vllm.v1.core.block_pool.BlockPool (cache_full_blocks, LRU eviction in
get_new_blocks, reset_prefix_cache) and are published once per "step" as
the scheduler does: KVEventBatch(ts=time.time(), events=pool.take_events()).

Commands:
  {"op": "store", "tokens": [...]}   one request: prefix hits reused, the rest
                                     allocated (evicting LRU blocks) and cached
  {"op": "evict", "n": k}            evict the k least recently used cached blocks
  {"op": "lmcache_store", "tokens": [...]}  LMCache's MP connector storing the
                                     tokens' full chunks in its CPU tier (its
                                     own event builders)
  {"op": "clear"}                    reset_prefix_cache (AllBlocksCleared)
  {"op": "state"}                    the cached blocks, as the events name them
  {"op": "hashes", "tokens": [...]}  the event hashes of a prompt's full blocks
  {"op": "count"}                    how many blocks are cached
  {"op": "bench_prepare", ...}       test/kvbench: build a run's batches (bench_prepare below)
  {"op": "bench_warm"}, {"op": "bench_run"}   publish them (bench_publish below)
"""
import json
import sys
import time


def setup(spec):
    from vllm.config.kv_events import KVEventsConfig
    from vllm.distributed.kv_events import EventPublisherFactory, KVEventBatch, ZmqEventPublisher
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.request import Request

    config = KVEventsConfig(**json.loads(spec["kv_events_config"]))
    rank = int(spec.get("dp_rank", 0))
    publisher = EventPublisherFactory.create(config, data_parallel_rank=rank)
    if not isinstance(publisher, ZmqEventPublisher):
        raise SystemExit(f"vLLM built {type(publisher).__name__} from {spec['kv_events_config']}, not ZmqEventPublisher")
    hash_fn = get_hash_fn_by_name(spec["hash_algo"])
    kv_cache_utils.init_none_hash(hash_fn)
    from vllm.config import CacheConfig

    bs = int(spec.get("block_size", getattr(CacheConfig, "DEFAULT_BLOCK_SIZE", 16)))
    pool = BlockPool(num_gpu_blocks=int(spec.get("num_blocks", 64)) + 1, enable_caching=True,
                     hash_block_size=bs, enable_kv_cache_events=True)
    hasher = kv_cache_utils.get_request_block_hasher(bs, hash_fn)
    ids = iter(range(1 << 62))

    def request(tokens):
        return Request(request_id=f"r{next(ids)}", prompt_token_ids=list(tokens),
                       sampling_params=SamplingParams(max_tokens=1), pooling_params=None, block_hasher=hasher)

    def step():
        # The scheduler's publish: one batch per step, only when there are events.
        events = pool.take_events()
        if not events:
            return None, 0
        publisher.publish(KVEventBatch(ts=time.time(), events=events))
        return events, sum(len(getattr(e, "block_hashes", ())) for e in events)

    def run_request(tokens):
        """KVCacheManager's path for one request: hits, allocate, cache, free."""
        req = request(tokens)
        hashes = req.block_hashes
        hits = []
        for h in hashes:
            blk = pool.get_cached_block(h, [0])
            if blk is None:
                break
            hits.append(blk[0])
        pool.touch(hits)
        new = pool.get_new_blocks(len(hashes) - len(hits))
        blocks = hits + new
        pool.cache_full_blocks(req, blocks, num_cached_blocks=len(hits), num_full_blocks=len(hashes),
                               block_size=bs, kv_cache_group_id=0)
        # Freed tail first, as KVCacheManager.free does: the tail is evicted first.
        pool.free_blocks(reversed(blocks))
        return hashes

    def held():
        out = []
        for blk in pool.blocks:
            if blk.block_hash is not None:
                out.append(kv_cache_utils.maybe_convert_block_hash(kv_cache_utils.get_block_hash(blk.block_hash)))
        return out

    def evict(n):
        # Least recently used first: the free queue's order.
        victims, node = [], pool.free_block_queue.fake_free_list_head.next_free_block
        while node is not None and node is not pool.free_block_queue.fake_free_list_tail and len(victims) < n:
            if node.block_hash is not None:
                victims.append(node.block_id)
            node = node.next_free_block
        pool.evict_blocks(set(victims))

    return dict(publisher=publisher, pool=pool, block_size=bs, step=step, run_request=run_request, held=held, evict=evict,
                convert=kv_cache_utils.maybe_convert_block_hash, request=request, config=config, rank=rank)


def handler(e):
    """The serve commands of one rank's publisher."""

    def handle(c):
        op = c["op"]
        reply = {"ok": True}
        if op == "open":
            cfg = e["publisher"].get_publisher_config()
            import vllm

            return {"ok": True, "endpoint": cfg.endpoint, "replay_endpoint": cfg.replay_endpoint,
                    "topic": cfg.topic, "rank": e["rank"], "block_size": e["block_size"], "vllm": vllm.__version__}
        if op == "store":
            e["run_request"](c["tokens"])
        elif op == "lmcache_store":
            # LMCache's multiprocess connector storing c["tokens"] in its
            # CPU tier, as its own code builds the events: the worker
            # adapter's _build_store_kv_events (blake3 chunk hashes, one
            # BlockStored per chunk, medium CPU) and the connector's
            # get_kv_connector_kv_cache_events (vLLM's BlockStored, the
            # hash converted as vLLM's publisher expects), both called on
            # stand-ins for the state they read; vLLM's scheduler then
            # publishes them with its own events.
            from types import SimpleNamespace

            from lmcache.integration.vllm.lmcache_mp_connector import LMCacheMPConnector
            from lmcache.integration.vllm.vllm_multi_process_adapter import LMCacheMPWorkerAdapter
            from lmcache.v1.multiprocess.token_hasher import TokenHasher
            from vllm.distributed.kv_events import KVEventBatch

            chunk = int(c.get("chunk_size", 256))
            toks = list(c["tokens"])
            adapter = SimpleNamespace(_kv_event_hasher=TokenHasher(chunk_size=chunk, hash_algorithm="blake3"),
                                      lmcache_tokens_per_chunk=chunk)
            import dataclasses

            from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey

            tokens = {"token_ids": tuple(toks)}
            if "token_bytes" in {f.name for f in dataclasses.fields(IPCCacheServerKey)}:
                # LMCache 0.5.7 packs the tokens (token_codec).
                from lmcache.v1.multiprocess.token_codec import pack_token_ids

                tokens = {"token_bytes": pack_token_ids(toks)}
            key = IPCCacheServerKey(model_name="m", world_size=1, worker_id=0, start=0,
                                    end=len(toks) // chunk * chunk, request_id="r", **tokens)
            lm_events = LMCacheMPWorkerAdapter._build_store_kv_events(adapter, key)
            conn = SimpleNamespace(_enable_kv_events=True, worker_adapter=SimpleNamespace(get_kv_events=lambda: lm_events))
            events = list(LMCacheMPConnector.get_kv_connector_kv_cache_events(conn).get_all_events())
            e["publisher"].publish(KVEventBatch(ts=time.time(), events=events))
            return {"ok": True, "hashes": [str(h) for ev in events for h in ev.block_hashes],
                    "block_sizes": [ev.block_size for ev in events], "media": [ev.medium for ev in events]}
        elif op == "evict":
            e["evict"](int(c.get("n", 1)))
        elif op == "clear":
            reply["ok"] = e["pool"].reset_prefix_cache()
        elif op == "state":
            reply["held"] = [str(h) for h in sorted(e["held"]())]
            return reply
        elif op == "hashes":
            reply["hashes"] = [str(e["convert"](h)) for h in e["request"](c["tokens"]).block_hashes]
            return reply
        elif op == "bench_prepare":
            return bench_prepare(e, c)
        elif op in ("bench_warm", "bench_run"):
            return bench_publish(e, "warm" if op == "bench_warm" else "timed")
        elif op == "count":
            return {"ok": True, "held": len(e["held"]())}
        elif op == "close":
            # EngineCore's shutdown: the publisher thread drains, sockets close.
            e["publisher"].shutdown()
            return reply
        else:
            raise SystemExit(f"unknown op {op}")
        events, blocks = e["step"]()
        reply["events"] = [type(x).__name__ for x in events or []]
        reply["blocks"] = blocks
        return reply

    return handle


def serve():
    """Commands carry "pub", a name for one rank's publisher; "open" (with the
    SPEC fields) builds it, "close" shuts it down (its sockets closed)."""
    import vllm.distributed.kv_events  # noqa: F401  (the engine's import, once, before "ready")
    import vllm.v1.core.block_pool  # noqa: F401
    import vllm.v1.request  # noqa: F401
    print(json.dumps({"ready": True}), flush=True)
    engines = {}
    for line in sys.stdin:
        if not line.strip():
            continue
        c = json.loads(line)
        if c["op"] == "open":
            engines[c["pub"]] = handler(setup(c))
        reply = engines[c["pub"]](c)
        if c["op"] == "close":
            del engines[c["pub"]]
        print(json.dumps(reply), flush=True)


def bench_prepare(e, c):
    """Build the batches of one benchmark run with the block pool, before the
    timed window (so the window measures the publisher and the subscriber,
    not Python's hashing): `warm_blocks` blocks that fill the pool, then
    `seconds` x `steps_per_second` steps of `rate / steps_per_second` block
    events each; every request stores `blocks_per_request` new blocks, and
    once the pool is full each one evicts as many (BlockRemoved)."""
    from vllm.distributed.kv_events import BlockStored
    pool, bs = e["pool"], e["block_size"]
    bpr, steps = int(c.get("blocks_per_request", 4)), int(c.get("steps_per_second", 100))
    per_step = max(1, round(float(c["rate"]) / steps))
    seq = iter(range(1 << 40))

    def prompt():
        n = next(seq)
        return [(n * bpr * bs + i) % 150000 + n // 1000 * 7 for i in range(bpr * bs)]

    def batch(blocks):
        while sum(len(getattr(x, "block_hashes", ())) for x in pool.kv_event_queue) < blocks:
            e["run_request"](prompt())
        return pool.take_events()

    warm = [batch(per_step * 4) for _ in range(max(1, int(c.get("warm_blocks", 0)) // (per_step * 4)))]
    timed = [batch(per_step) for _ in range(int(steps * float(c["seconds"])))]
    e["bench"] = dict(warm=warm, timed=timed, steps=steps, sample_every=int(c.get("sample_every", 10)),
                      stored=BlockStored)
    return {"ok": True, "warm_batches": len(warm), "batches": len(timed), "per_step": per_step,
            "held": len(e["held"]())}


def bench_publish(e, which):
    """Publish the warm-up batches at once, or the timed ones at the step rate,
    printing {"sample": hash, "ts": ts} for every sample_every-th timed batch
    (its first stored block and the batch's ts, the time the scheduler made it)."""
    from vllm.distributed.kv_events import KVEventBatch
    b, pub = e["bench"], e["publisher"]
    batches = b[which]
    start, period, published = time.time(), 1.0 / b["steps"], 0
    for i, events in enumerate(batches):
        if which == "timed":
            due = start + i * period
            now = time.time()
            if due > now:
                time.sleep(due - now)
        ts = time.time()
        pub.publish(KVEventBatch(ts=ts, events=events))
        published += sum(len(getattr(x, "block_hashes", ())) for x in events)
        if which == "timed" and i % b["sample_every"] == 0:
            first = next((x for x in events if isinstance(x, b["stored"])), None)
            if first is not None:
                print(json.dumps({"sample": str(first.block_hashes[0]), "ts": ts}), flush=True)
    elapsed = time.time() - start
    while pub._event_queue.qsize() > 0:  # the publisher thread has sent them all
        time.sleep(0.005)
    return {"ok": True, "block_events": published, "seconds": elapsed, "sent_seconds": time.time() - start,
            "batches": len(batches)}


if __name__ == "__main__":
    serve()
