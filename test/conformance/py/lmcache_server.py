"""LMCache's own protocol classes against a running lmcache_server.

Driven by test/conformance/lmcacheserver_test.go with one JSON request on
stdin; prints one JSON answer. Everything on the wire is built and parsed by
LMCache's lmcache.v1.protocol (ClientMetaMessage, ServerMetaMessage) and
keys by lmcache.utils (CacheEngineKey, parse_cache_key), the code the
engines' LMCache connector and the server run.

ops:
  protocol  {"health_hex": <the Go probe's header>, "key": <its key>}:
            what the server makes of the Go header (ClientMetaMessage
            .deserialize), LMCache's own serialization of the same HEALTH
            request, and the protocol's sizes and codes.
  put_get   {"port": p}: PUT one chunk, then EXIST and GET it back on the
            same connection (the server answers in order per connection).
  get       {"port": p}: EXIST and GET the same chunk.
"""

import json
import socket
import sys

import torch

from lmcache.utils import CacheEngineKey, parse_cache_key
from lmcache.v1.memory_management import MemoryFormat
from lmcache.v1.protocol import (
    ClientCommand,
    ClientMetaMessage,
    ServerMetaMessage,
    ServerReturnCode,
)

# One chunk: a half-precision tensor's bytes, under a key an engine would use.
KEY = CacheEngineKey("conformance/model", 1, 0, 0x5EED, torch.float16)
DATA = torch.arange(2048, dtype=torch.float16).numpy().tobytes()
SHAPE = torch.Size([2048])


def recv_all(sock, n):
    buf = bytearray()
    while len(buf) < n:
        part = sock.recv(n - len(buf))
        if not part:
            raise EOFError(f"server closed the connection after {len(buf)} of {n} bytes")
        buf.extend(part)
    return bytes(buf)


def header(command, length=0, fmt=MemoryFormat.KV_2LTD, dtype=torch.float16, shape=SHAPE):
    return ClientMetaMessage(command, KEY, length, fmt, dtype, shape).serialize()


def reply(sock):
    return ServerMetaMessage.deserialize(recv_all(sock, ServerMetaMessage.packlength()))


def exist_get(sock):
    sock.sendall(header(ClientCommand.EXIST))
    exist = reply(sock).code == ServerReturnCode.SUCCESS
    sock.sendall(header(ClientCommand.GET))
    meta = reply(sock)
    out = {"exist": exist, "get_code": int(meta.code), "equal": False}
    if meta.code == ServerReturnCode.SUCCESS:
        out["equal"] = recv_all(sock, meta.length) == DATA
        out["length"] = meta.length
    return out


def main():
    req = json.load(sys.stdin)
    op = req["op"]
    if op == "protocol":
        go = bytes.fromhex(req["health_hex"])
        parsed = ClientMetaMessage.deserialize(go)
        own = ClientMetaMessage(
            ClientCommand.HEALTH,
            parse_cache_key(req["key"]),
            0,
            MemoryFormat.UNDEFINED,
            None,
            torch.Size([0, 0, 0, 0]),
        ).serialize()
        out = {
            "command": parsed.command.name,
            "key": parsed.key.to_string(),
            "length": parsed.length,
            "own_hex": own.hex(),
            "header_size": ClientMetaMessage.packlength(),
            "reply_size": ServerMetaMessage.packlength(),
            "health": int(ClientCommand.HEALTH),
            "success": int(ServerReturnCode.SUCCESS),
            "fail": int(ServerReturnCode.FAIL),
        }
    elif op in ("put_get", "get"):
        with socket.create_connection(("127.0.0.1", req["port"]), timeout=30) as sock:
            if op == "put_get":
                sock.sendall(header(ClientCommand.PUT, len(DATA)) + DATA)
            out = exist_get(sock)
    else:
        raise SystemExit(f"unknown op {op!r}")
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
