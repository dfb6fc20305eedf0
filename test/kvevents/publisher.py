#!/usr/bin/python3
"""Fixture KV-event publisher in vLLM's (and SGLang's) wire format, on libzmq.

  publisher.py dump                      print {case: hex payload} for the golden-byte tests
  publisher.py serve PUB ROUTER [opts]   bind PUB and replay ROUTER; one JSON command per stdin line

Encodes as msgspec does: smallest ints, float64, tag first in maps, None
defaults omitted, map header sized by the possible keys. Runs on Debian's
python3-zmq and python3-msgpack (use /usr/bin/python3).
"""
import hashlib, json, queue, struct, sys, threading, time
import msgpack
import zmq

GENS = ["original", "medium", "lora_name", "extra_keys", "group", "spec", "newest"]

def pk(v):
    return msgpack.packb(v, use_bin_type=True)

class M:  # msgspec map struct: header width from the possible keys
    def __init__(self, width, kvs): self.width, self.kvs = width, kvs

def enc(v):
    if isinstance(v, M):
        n = len(v.kvs)
        h = bytes([0x80 | n]) if v.width < 16 else b"\xde" + struct.pack(">H", n)
        return h + b"".join(pk(k) + enc(x) for k, x in v.kvs)
    if isinstance(v, (list, tuple)):
        n = len(v)
        h = bytes([0x90 | n]) if n < 16 else (b"\xdc" + struct.pack(">H", n) if n < 65536 else b"\xdd" + struct.pack(">I", n))
        return h + b"".join(enc(x) for x in v)
    return pk(v)

def stored_fields(e, gen, engine):
    f = [("block_hashes", e["hashes"], 0), ("parent_block_hash", e.get("parent"), 0), ("token_ids", e.get("tokens", []), 0),
         ("block_size", e.get("block_size", 16), 0), ("lora_id", e.get("lora_id"), 0)]
    if engine == "sglang":
        f.append(("medium", e.get("medium"), 1))
        if e.get("metadata") is not None: f.append(("metadata", e["metadata"], 1))
        return f
    g = GENS.index(gen)
    if g >= 1: f.append(("medium", e.get("medium"), 0))
    if g >= 2: f.append(("lora_name", e.get("lora_name"), 0))
    if g >= 3: f.append(("extra_keys", e.get("extra"), 1))
    if g >= 4: f.append(("group_idx", e.get("group"), 1))
    if g >= 5: f += [("kv_cache_spec_kind", e.get("spec_kind"), 1), ("kv_cache_spec_sliding_window", e.get("sliding"), 1)]
    if g >= 6: f += [("locality", e.get("locality"), 1), ("ownership", None, 1), ("session_id", e.get("session_id"), 1),
                     ("skipped_parent_block_hash", None, 1), ("skipped_token_ids", None, 1), ("skipped_extra_keys", None, 1)]
    return f

def removed_fields(e, gen, engine):
    f = [("block_hashes", e["hashes"], 0)]
    if engine == "sglang": return f + [("medium", e.get("medium"), 1)]
    g = GENS.index(gen)
    if g >= 1: f.append(("medium", e.get("medium"), 0))
    if g >= 4: f.append(("group_idx", e.get("group"), 1))
    if g >= 6: f += [("locality", e.get("locality"), 1), ("ownership", None, 1)]
    return f

def tagged(tag, fields, map_events):
    if not map_events:
        return [tag] + [v for _, v, _ in fields]
    return M(len(fields) + 1, [("type", tag)] + [(k, v) for k, v, d in fields if not (d and v is None)])

def batch(ts, events, rank, gen="spec", engine="vllm", map_events=True, map_envelope=False):
    out = []
    for e in events:
        if e["type"] == "BlockStored": out.append(tagged("BlockStored", stored_fields(e, gen, engine), map_events))
        elif e["type"] == "BlockRemoved": out.append(tagged("BlockRemoved", removed_fields(e, gen, engine), map_events))
        else: out.append(tagged("AllBlocksCleared", [], map_events))
    if map_envelope:
        kvs = [("ts", ts), ("events", out)]
        if rank is not None: kvs.append(("attn_dp_rank" if engine == "sglang" else "data_parallel_rank", rank))
        return enc(M(3, kvs))
    return enc([ts, out, rank])

# --- sha256_cbor block hashes (vLLM --prefix-caching-hash-algo sha256_cbor) ---
def cbor_uint(major, n):
    if n < 24: return bytes([major << 5 | n])
    for w, ai in ((1, 24), (2, 25), (4, 26), (8, 27)):
        if n < 1 << (8 * w): return bytes([major << 5 | ai]) + n.to_bytes(w, "big")

def none_hash(seed="vllm-none-hash"):
    s = seed.encode()
    return hashlib.sha256(cbor_uint(3, len(s)) + s).digest()

def block_digest(parent, tokens):
    b = b"\x83" + cbor_uint(2, 32) + parent + cbor_uint(4, len(tokens)) + b"".join(cbor_uint(0, t) for t in tokens) + b"\xf6"
    return hashlib.sha256(b).digest()

def low64(d): return int.from_bytes(d[-8:], "big")

# --- golden cases: the note's example batch in every wire variant ---
def example(hashes_bytes=False, sglang=False):
    h1, h2 = 0x84b146b151d55111, 0xd43b57df56b58fb1
    if sglang: h1, h2 = -0x7b4eb94eae2aaeef, 0x2bc4a820a94a704f
    if hashes_bytes: h1, h2 = b"\xaa" * 24 + h1.to_bytes(8, "big"), b"\xbb" * 24 + h2.to_bytes(8, "big")
    st = {"type": "BlockStored", "hashes": [h1, h2], "parent": None, "tokens": [1, 2, 3, 4, 5, 6, 7, 8], "block_size": 4,
          "medium": "GPU", "extra": [None, None], "group": 0, "spec_kind": "full_attention"}
    if sglang: st = {"type": "BlockStored", "hashes": [h1, h2], "parent": None, "tokens": [1, 2, 3, 4, 5, 6, 7, 8], "block_size": 4, "medium": "GPU"}
    return [st, {"type": "BlockRemoved", "hashes": [h2], "medium": "GPU", "group": 0 if not sglang else None}, {"type": "AllBlocksCleared"}]

def cases():
    ts = 1757500000.25
    c = {}
    for gen in GENS:
        c["vllm-array-" + gen] = batch(ts, example(), 0, gen=gen, map_events=False)
        c["vllm-map-" + gen] = batch(ts, example(), 0, gen=gen, map_events=True)
    c["vllm-map-spec-map-envelope"] = batch(ts, example(), 0, map_envelope=True)
    c["vllm-array-spec-map-envelope"] = batch(ts, example(), 0, map_events=False, map_envelope=True)
    c["vllm-map-spec-bytes-hashes"] = batch(ts, example(hashes_bytes=True), 0)
    c["vllm-array-spec-bytes-hashes"] = batch(ts, example(hashes_bytes=True), 0, map_events=False)
    c["vllm-map-newest-all-fields"] = batch(ts, [{"type": "BlockStored", "hashes": [7], "parent": 5, "tokens": [9, 70000, 151935],
        "block_size": 3, "lora_id": 2, "medium": "CPU", "lora_name": "adapter-a", "extra": [["adapter-a", ["mm", 0], "salt"]],
        "group": 1, "spec_kind": "sliding_window", "sliding": 4096, "locality": "LOCAL", "session_id": "s1"}], 3, gen="newest")
    c["sglang-array"] = batch(ts, example(sglang=True), 1, engine="sglang", map_events=False)
    c["sglang-map"] = batch(ts, example(sglang=True), 1, engine="sglang", map_events=True)
    c["sglang-array-metadata"] = batch(ts, [{"type": "BlockStored", "hashes": [-5], "parent": -4, "tokens": [1, 2], "block_size": 2,
        "medium": "CPU_PINNED", "metadata": {"cache_salt": "x"}}], None, engine="sglang", map_events=False)
    return c

# --- serve: a publisher process like vLLM's ZmqEventPublisher ---
def serve(pub_ep, router_ep, opts):
    ctx = zmq.Context()
    pub, router = ctx.socket(zmq.PUB), ctx.socket(zmq.ROUTER)
    pub.setsockopt(zmq.SNDHWM, 100000)
    pub.bind(pub_ep); router.bind(router_ep)
    topic = opts.get("topic", "kv").encode()
    legacy = opts.get("replay", "new") == "legacy"
    ring_size = int(opts.get("buffer_steps", 10000))
    bs = int(opts.get("block_size", 4))
    rank = int(opts.get("rank", 0))
    state = {"seq": 0, "ring": [], "held": {}, "order": []}
    cmds = queue.Queue()
    threading.Thread(target=lambda: [cmds.put(l) for l in sys.stdin] + [cmds.put(None)], daemon=True).start()

    def publish(events, drop):
        seq = state["seq"]; state["seq"] += 1
        payload = batch(time.time(), events, rank, gen=opts.get("gen", "spec"), map_events=opts.get("events", "map") == "map")
        state["ring"].append((seq, payload)); del state["ring"][:-ring_size]
        if not drop: pub.send_multipart([topic, seq.to_bytes(8, "big"), payload])
        return seq

    def op(c):
        kind, events = c["op"], []
        if kind == "store":  # one request: cache every full block not yet held, as one BlockStored run
            toks, parent, run, digest = c["tokens"], None, [], none_hash()
            for i in range(len(toks) // bs):
                blk = toks[i * bs:(i + 1) * bs]; pd = digest; digest = block_digest(digest, blk); h = low64(digest)
                if h in state["held"]:
                    parent = h; continue
                if not run: run_parent = low64(pd) if i > 0 else None
                run.append((h, blk)); state["held"][h] = 1; state["order"].append(h)
            if run:
                events.append({"type": "BlockStored", "hashes": [h for h, _ in run], "parent": run_parent,
                               "tokens": [t for _, b in run for t in b], "block_size": bs, "medium": "GPU",
                               "extra": [None] * len(run), "group": 0, "spec_kind": "full_attention"})
        elif kind == "evict":  # oldest first, one BlockRemoved per block like the block pool
            for h in state["order"][:c.get("n", 1)]:
                del state["held"][h]; events.append({"type": "BlockRemoved", "hashes": [h], "medium": "GPU", "group": 0})
            del state["order"][:c.get("n", 1)]
        elif kind == "clear":
            state["held"].clear(); state["order"].clear(); events.append({"type": "AllBlocksCleared"})
        elif kind == "restart":  # a new engine process: seq from 0, empty ring and cache
            state.update(seq=0, ring=[], held={}, order=[]); return {"ok": True}
        elif kind == "state":
            return {"held": sorted(str(h) for h in state["held"]), "seq": state["seq"]}
        if not events and kind != "empty": return {"ok": True, "seq": None}
        return {"ok": True, "seq": publish(events, c.get("drop", False))}

    def replay(frames):
        if len(frames) != 3: return
        ident, start = frames[0], int.from_bytes(frames[2], "big")
        for seq, payload in state["ring"]:
            if seq >= start:
                router.send_multipart([ident, b""] + ([] if legacy else [topic]) + [seq.to_bytes(8, "big"), payload])
        router.send_multipart([ident, b""] + ([] if legacy else [b""]) + [b"\xff" * 8, b""])

    print(json.dumps({"ready": True}), flush=True)
    while True:
        while router.poll(0): replay(router.recv_multipart())
        try: line = cmds.get(timeout=0.01)
        except queue.Empty: continue
        if line is None: break
        if line.strip(): print(json.dumps(op(json.loads(line))), flush=True)
    pub.close(0); router.close(0); ctx.term()

if __name__ == "__main__":
    if sys.argv[1] == "dump":
        json.dump({k: v.hex() for k, v in cases().items()}, sys.stdout, indent=1, sort_keys=True)
    else:
        serve(sys.argv[2], sys.argv[3], dict(a.split("=", 1) for a in sys.argv[4:]))
