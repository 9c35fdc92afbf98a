#!/usr/bin/env bash
# The rows that still decide issues 16-18, in one lease-sized run (about
# 8 minutes at most; each part has its own time limit, so a slow one cannot
# starve the rest): the sessions' tenants1 row, TLS echo and handshakes and
# UDP echo at `PAIRS` alternating pairs (default 10, what near-parity rows
# need), the broker's 50-client pipelined rows under `everysec` on 1 shard
# at `PAIRS` pairs, and the `always` table on 1 and 2 shards at 3 pairs.
# `PARTS` runs a subset (sessions, tls, udp, everysec, always; all by
# default; `spread`, not in the default set, runs the 50-client depth-1
# rows under `everysec` on 2 shards with and without the broker's
# `--spread-connections`, at `SPREAD_PAIRS`, default 5), `ALWAYS_ROWS` the `always` rows, `EVERYSEC_ROWS`,
# `EVERYSEC_SHARDS` and `EVERYSEC_PAIRS` the `everysec` ones. The broker's threaded
# load generator sees its end only at a 250 ms tick, so the broker's rows
# send `EVERYSEC_SCALE` (30) and `ALWAYS_SCALE` (8) times their request
# counts and last seconds. Servers on CPUs 0-1 (the broker 0-3), load
# generators on 8-15. Needs the bundle of benches/device/bundle.sh in
# .devbench/ (carry it). Writes one file per part to $OUT (default
# /tmp/out).
set -uo pipefail
cd "$(dirname "$0")/../.."
ulimit -n 65536 2>/dev/null || ulimit -n 4096
export PATH=$PWD/.devbench/bin:$PATH
B=$PWD/.devbench/release/examples
O=${OUT:-/tmp/out}; mkdir -p "$O"
P=${PAIRS:-10}
PARTS=${PARTS:-sessions,tls,udp,everysec,always}
want() { [[ ",$PARTS," == *",$1,"* ]]; }
S=0,1; C=8-15
export BROKER_CLIENT_CPU=$C BROKER_CLIENT_THREADS=4 BROKER_SERVER_CPUS=0,1,2,3
{ uname -r; nproc; lscpu | grep -E "Model name|^CPU\(s\)"; } > "$O/probe.txt" 2>&1
if want sessions; then
  SESSIONS_CLIENT_THREADS=6 SESSIONS_CLIENT_CPUS=$C timeout 70 taskset -c "$S" "$B/sessions" "$P" tenants1 2>&1 | tee "$O/sessions.txt"
fi
if want tls; then
  TLS_CLIENT_CPUS=$C TLS_CLIENT_THREADS=4 timeout 110 taskset -c "$S" "$B/tls_echo" "$P" 2>&1 | tee "$O/tls.txt"
fi
if want udp; then
  UDP_CLIENT_CPUS=$C UDP_CLIENT_THREADS=4 timeout 80 taskset -c "$S" "$B/udp_echo" "$P" 2>&1 | tee "$O/udp.txt"
fi
if want everysec; then
  BROKER_ROWS=${EVERYSEC_ROWS:-xadd-c50-P16-rand,xadd-c50-P16-new} BROKER_SHARDS=${EVERYSEC_SHARDS:-1} BROKER_SCALE=${EVERYSEC_SCALE:-30} \
    timeout 300 "$B/broker_vs_redis" "${EVERYSEC_PAIRS:-$P}" everysec 2>&1 | grep -v maxclients | tee "$O/broker-everysec.txt"
fi
if want always; then
  BROKER_ROWS=${ALWAYS_ROWS:-xadd-c1,xadd-c1-rand,xadd-c1-P16,xadd-c1-P16-rand,xadd-c50,xadd-c50-rand,xadd-c50-P16,xadd-c50-P16-rand} \
    BROKER_SHARDS=1,2 BROKER_SCALE=${ALWAYS_SCALE:-8} \
    timeout 240 "$B/broker_vs_redis" 3 always 2>&1 | grep -v maxclients | tee "$O/broker-always.txt"
fi
if want spread; then
  BROKER_ROWS=${SPREAD_ROWS:-xadd-c50,xadd-c50-rand} BROKER_SHARDS="2,2 --spread-connections" BROKER_SCALE=${EVERYSEC_SCALE:-30} \
    timeout 300 "$B/broker_vs_redis" "${SPREAD_PAIRS:-5}" everysec 2>&1 | grep -v maxclients | tee "$O/broker-spread.txt"
fi
echo done
