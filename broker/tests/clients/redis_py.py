"""Drives the broker with redis-py's stream API and pipelines.

Usage: python3 redis_py.py HOST PORT. Exits non-zero (with the failing
assertion) if any reply is not what a Redis 7.0 server gives.
"""
import sys

import redis

host, port = sys.argv[1], int(sys.argv[2])
r = redis.Redis(host=host, port=port, decode_responses=True)

assert r.ping() is True

# XADD / XLEN / XRANGE / XREVRANGE
ids = [r.xadd("orders", {"item": f"i{n}", "qty": n}) for n in range(5)]
assert r.xlen("orders") == 5
rows = r.xrange("orders")
assert [i for i, _ in rows] == ids
assert rows[2][1] == {"item": "i2", "qty": "2"}
assert [i for i, _ in r.xrevrange("orders", count=2)] == ids[:-3:-1]
assert r.xadd("orders", {"x": "1"}, id="9999999999999-0") == "9999999999999-0"
try:
    r.xadd("orders", {"x": "1"}, id="1-1")
    raise AssertionError("a smaller id was accepted")
except redis.ResponseError as e:
    assert "equal or smaller" in str(e), e

# Trimming
r.xadd("capped", {"n": 0}, maxlen=3, approximate=False)
for n in range(1, 10):
    r.xadd("capped", {"n": n}, maxlen=3, approximate=False)
assert r.xlen("capped") == 3
assert r.xtrim("capped", maxlen=1, approximate=False) == 2

# XREAD
got = r.xread({"orders": "0-0"}, count=2)
assert got[0][0] == "orders" and len(got[0][1]) == 2
assert r.xread({"orders": "$"}, block=50) == []

# Consumer groups
assert r.xgroup_create("orders", "billing", id="0") is True
batch = r.xreadgroup("billing", "worker-1", {"orders": ">"}, count=3)
delivered = [i for i, _ in batch[0][1]]
assert len(delivered) == 3
assert r.xack("orders", "billing", *delivered[:2]) == 2
pending = r.xpending("orders", "billing")
assert pending["pending"] == 1 and pending["min"] == delivered[2]
assert pending["consumers"] == [{"name": "worker-1", "pending": 1}]
rows = r.xpending_range("orders", "billing", min="-", max="+", count=10)
assert rows[0]["message_id"] == delivered[2] and rows[0]["times_delivered"] == 1
claimed = r.xclaim("orders", "billing", "worker-2", 0, [delivered[2]], justid=True)
assert claimed == [delivered[2]]
# With JUSTID redis-py returns only the claimed ids.
assert r.xautoclaim("orders", "billing", "worker-3", 0, "0-0", justid=True) == [delivered[2]]
cursor, entries, deleted = r.xautoclaim("orders", "billing", "worker-3", 0, "0-0")
assert cursor == "0-0" and [i for i, _ in entries] == [delivered[2]] and deleted == []
groups = r.xinfo_groups("orders")
assert groups[0]["name"] == "billing" and groups[0]["pending"] == 1
info = r.xinfo_stream("orders")
assert info["length"] == 6 and info["groups"] == 1
consumers = {c["name"] for c in r.xinfo_consumers("orders", "billing")}
assert consumers == {"worker-1", "worker-2", "worker-3"}, consumers

# INFO as redis-py parses it: the topology a client library looks for.
server_info = r.info()
assert server_info["role"] == "master", server_info
assert server_info["cluster_enabled"] == 0, server_info
assert server_info["connected_slaves"] == 0, server_info
assert server_info["used_cpu_user"] >= 0, server_info
assert r.info("replication")["role"] == "master"

# Pipelines: a transaction on one stream, and a plain pipeline over many.
with r.pipeline(transaction=True) as p:
    p.xadd("ledger", {"a": 1}, id="1-1")
    p.xadd("ledger", {"a": 2}, id="2-1")
    p.xlen("ledger")
    assert p.execute() == ["1-1", "2-1", 2]
# A transaction over two streams (redis-py's default pipeline): each
# stream gets its part, and a read in it sees both.
with r.pipeline() as p:
    p.xadd("ledger", {"a": 3}, id="3-1")
    p.xadd("audit", {"of": "3-1"}, id="3-1")
    p.xread({"ledger": "2-1", "audit": "0"})
    p.exists("ledger", "audit")
    assert p.execute() == [
        "3-1",
        "3-1",
        [["ledger", [("3-1", {"a": "3"})]], ["audit", [("3-1", {"of": "3-1"})]]],
        2,
    ]
assert r.xlen("ledger") == 3 and r.xlen("audit") == 1
with r.pipeline(transaction=False) as p:
    for n in range(20):
        p.xadd(f"fan:{n % 4}", {"n": n})
    p.xlen("fan:0")
    out = p.execute()
    assert len(out) == 21 and out[-1] == 5

assert r.exists("orders", "ledger", "nope") == 2
assert r.type("orders") == "stream"
assert sorted(r.keys("fan:*")) == [f"fan:{n}" for n in range(4)]
assert sorted(r.scan_iter(match="fan:*")) == [f"fan:{n}" for n in range(4)]
assert r.delete("fan:0", "fan:1") == 2
print("redis-py", redis.__version__, "ok")
