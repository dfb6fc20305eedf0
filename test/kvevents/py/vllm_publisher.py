"""vLLM's own KV-event publisher, fed by vLLM's own block pool.

  vllm_publisher.py               one JSON command per stdin line, one JSON reply per line
  vllm_publisher.py bench SPEC    publish at a fixed rate (test/kvbench), report samples

Every command names a publisher ("pub"); {"op": "open", "pub": NAME, SPEC...}
builds one, {"op": "close"} shuts it down. SPEC:
  kv_events_config  the --kv-events-config value exactly as the webhook renders it
  hash_algo         the --prefix-caching-hash-algo value the webhook sets
  block_size        tokens per block (vLLM's --block-size; 16 by default)
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
  {"op": "clear"}                    reset_prefix_cache (AllBlocksCleared)
  {"op": "state"}                    the cached blocks, as the events name them
  {"op": "hashes", "tokens": [...]}  the event hashes of a prompt's full blocks
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
    bs = int(spec.get("block_size", 16))
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

    return dict(publisher=publisher, pool=pool, step=step, run_request=run_request, held=held, evict=evict,
                convert=kv_cache_utils.maybe_convert_block_hash, request=request, config=config, rank=rank)


def handler(e):
    """The serve commands of one rank's publisher."""

    def handle(c):
        op = c["op"]
        reply = {"ok": True}
        if op == "open":
            cfg = e["publisher"].get_publisher_config()
            return {"ok": True, "endpoint": cfg.endpoint, "replay_endpoint": cfg.replay_endpoint,
                    "topic": cfg.topic, "rank": e["rank"]}
        if op == "store":
            e["run_request"](c["tokens"])
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


def bench(spec):
    """Publish `rate` block events per second for `seconds`, in `steps_per_second`
    batches; every request stores `blocks_per_request` new blocks, and once the
    pool is full each one evicts as many (BlockRemoved). Batches are built by
    the block pool before the timed window, so the window measures the
    publisher and the subscriber, not Python's hashing. Prints one JSON line
    per sampled batch ({"hash", "ts"}: the first stored block of the batch and
    the batch's ts) and a summary line ({"done": ...})."""
    e = setup(spec)
    rate, seconds = float(spec["rate"]), float(spec["seconds"])
    steps = int(spec.get("steps_per_second", 100))
    bpr = int(spec.get("blocks_per_request", 4))
    bs = int(spec.get("block_size", 16))
    sample_every = int(spec.get("sample_every", 5))
    from vllm.distributed.kv_events import BlockStored, KVEventBatch
    per_step = max(1, round(rate / steps))
    total_steps = int(steps * seconds)
    # Warm the pool up to full so the steady state stores and evicts.
    counter = [0]

    def prompt():
        counter[0] += 1
        base = (counter[0] * 7919) % 150000
        return [(base + i) % 151000 for i in range(bpr * bs)]

    pool = e["pool"]
    while pool.get_num_free_blocks() > bpr and any(b.block_hash is None for b in pool.blocks[1:]):
        e["run_request"](prompt())
    pool.take_events()
    batches = []
    for _ in range(total_steps):
        made = 0
        while made < per_step:
            e["run_request"](prompt())
            made = sum(len(getattr(x, "block_hashes", ())) for x in pool.kv_event_queue)
        batches.append(pool.take_events())
    print(json.dumps({"ready": True, "batches": len(batches), "per_step": per_step}), flush=True)
    go = sys.stdin.readline()  # the driver starts the window
    if not go:
        return
    start = time.time()
    period = 1.0 / steps
    published = 0
    for i, events in enumerate(batches):
        due = start + i * period
        now = time.time()
        if due > now:
            time.sleep(due - now)
        ts = time.time()
        e["publisher"].publish(KVEventBatch(ts=ts, events=events))
        published += sum(len(getattr(x, "block_hashes", ())) for x in events)
        if i % sample_every == 0:
            first = next((x for x in events if isinstance(x, BlockStored)), None)
            if first is not None:
                print(json.dumps({"hash": str(first.block_hashes[0]), "ts": ts}), flush=True)
    elapsed = time.time() - start
    # Wait for the publisher thread to send everything before reporting.
    while e["publisher"]._event_queue.qsize() > 0:
        time.sleep(0.01)
    print(json.dumps({"done": True, "block_events": published, "seconds": elapsed,
                      "batches": len(batches)}), flush=True)
    sys.stdin.readline()
    e["publisher"].shutdown()


if __name__ == "__main__":
    if sys.argv[1:2] == ["bench"]:
        bench(json.loads(sys.argv[2]))
    else:
        serve()
