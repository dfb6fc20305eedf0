"""SGLang's own KV-event publisher, fed by SGLang's own radix cache.

  sglang_publisher.py    one JSON command per stdin line, one JSON reply per line

Every command names a publisher ("pub"); {"op": "open", "pub": NAME, SPEC...}
builds one, {"op": "close"} shuts it down. SPEC:
  kv_events_config  the --kv-events-config value exactly as the webhook renders it
  page_size         SGLang's --page-size from the rendered command line
  dp_rank           the data-parallel rank this publisher stands for (0 by default)

Everything engine-side is SGLang's code: EventPublisherFactory.create parses
the config string with SGLang's KVEventsConfig and builds the publisher for
the rank (ZmqEventPublisher: PUB, replay ROUTER, ring, offset_endpoint_port),
the events come out of sglang.srt.mem_cache.radix_cache.RadixCache
(create_simulated: the real tree and its KVCacheEventRecorder, without GPU
memory pools; insert, LRU evict, reset) with SGLang's own page hashes, and
they are published once per step as SchedulerKvEventsPublisher does:
KVEventBatch(ts=time.time(), events=tree_cache.take_events()).

Commands:
  {"op": "store", "tokens": [...]}   insert one request's page-aligned tokens
  {"op": "evict", "n": k}            evict k pages' worth of tokens (LRU leaves)
  {"op": "clear"}                    reset the tree (AllBlocksCleared)
  {"op": "state"}                    the cached pages, as the events name them (uint64)
  {"op": "page_hashes", "tokens": [...]}
                                     a prompt's page hashes as SGLang computes them
                                     (get_hash_str, a partial last page included, as
                                     SGLang's router hashes a prompt), as the signed
                                     int64 the router sends (hash_str_to_int64)
"""
import json
import sys
import time
from array import array


class Allocator:
    """The token-to-KV pool allocator's surface the radix cache calls."""

    device = "cpu"

    def free_segment(self, *args, **kwargs):
        pass

    def free(self, *args, **kwargs):
        pass


def engine(spec):
    """One rank: the publisher the engine's factory builds from the config and
    a radix cache whose events it publishes; returns the command handler."""
    import torch
    from sglang.srt.disaggregation.kv_events import EventPublisherFactory, KVEventBatch, ZmqEventPublisher
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams
    from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
    from sglang.srt.mem_cache.utils import get_hash_str, hash_str_to_int64

    rank = int(spec.get("dp_rank", 0))
    publisher = EventPublisherFactory.create(spec["kv_events_config"], attn_dp_rank=rank)
    if not isinstance(publisher, ZmqEventPublisher):
        raise SystemExit(f"SGLang built {type(publisher).__name__} from {spec['kv_events_config']}, not ZmqEventPublisher")
    # SGLang resolves an unset --page-size per attention backend and model
    # (arg_groups hooks), so the test always renders one.
    page = int(spec["page_size"])
    cache = RadixCache.create_simulated(mock_allocator=Allocator(), page_size=page, enable_kv_cache_events=True)
    slots = iter(range(1 << 40))

    def step():
        events = cache.take_events()
        if events:
            publisher.publish(KVEventBatch(ts=time.time(), events=events))
        return events

    def held():
        out, stack = [], [cache.root_node]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if node is cache.root_node or node.evicted:
                continue
            out.extend(hash_str_to_int64(h) & ((1 << 64) - 1) for h in node.hash_value or [])
        return out

    def handle(c):
        op = c["op"]
        reply = {"ok": True}
        if op == "open":
            src = publisher.describe_local_source(page) or {}
            return {"ok": True, "endpoint": src.get("endpoint"), "replay_endpoint": src.get("replay_endpoint"),
                    "topic": src.get("topic"), "rank": rank, "page_size": page}
        if op == "store":
            toks = c["tokens"][: len(c["tokens"]) // page * page]
            value = torch.tensor([next(slots) for _ in toks], dtype=torch.int64)
            cache.insert(InsertParams(key=RadixKey(array("q", toks)), value=value))
        elif op == "evict":
            cache.evict(EvictParams(num_tokens=int(c.get("n", 1)) * page))
        elif op == "clear":
            cache.reset()
        elif op == "state":
            reply["held"] = [str(h) for h in sorted(held())]
            return reply
        elif op == "page_hashes":
            reply["hashes"] = [str(hash_str_to_int64(h)) for h in get_hash_str(list(c["tokens"]), None, page)]
            return reply
        elif op == "close":
            publisher.shutdown()
            return reply
        else:
            raise SystemExit(f"unknown op {op}")
        reply["events"] = [type(x).__name__ for x in step()]
        return reply

    return handle


def serve():
    """Commands carry "pub", a name for one rank's publisher; "open" (with the
    SPEC fields) builds it, "close" shuts it down (its sockets closed)."""
    import sglang.srt.mem_cache.radix_cache  # noqa: F401  (the engine's import, once, before "ready")
    print(json.dumps({"ready": True}), flush=True)
    engines = {}
    for line in sys.stdin:
        if not line.strip():
            continue
        c = json.loads(line)
        if c["op"] == "open":
            engines[c["pub"]] = engine(c)
        reply = engines[c["pub"]](c)
        if c["op"] == "close":
            del engines[c["pub"]]
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    serve()
