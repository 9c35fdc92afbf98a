#!/usr/bin/env bash
# Re-measures the open issues' rows on a lent machine with 16 CPUs: servers
# on CPUs 0-1 (the broker also on 0-3 for its 4-shard rows), load generators
# on CPUs 8-15, so no client shares a server's core. Needs the bundle of
# benches/device/bundle.sh in .devbench/. Writes one file per suite to $OUT
# (default /tmp/out). About 8 minutes; `ROWS=tls,udp` runs a subset
# (tls, udp, http, sessions, broker); `SERVER_CPUS`, `CLIENT_CPUS` and
# `PAIRS` change the defaults (0,1 / 8-15 / 7), `BROKER_CPUS` and
# `BROKER_SHARD_COUNTS` the broker's (0,1,2,3 / 1,2,4).
set -uo pipefail
cd "$(dirname "$0")/../.."
ulimit -n 65536 2>/dev/null || ulimit -n 4096
export PATH=$PWD/.devbench/bin:$PATH
B=$PWD/.devbench/release/examples
O=${OUT:-/tmp/out}; mkdir -p "$O"
ROWS=${ROWS:-tls,udp,http,sessions,broker}
S=${SERVER_CPUS:-0,1}
C=${CLIENT_CPUS:-8-15}
P=${PAIRS:-7}
want() { [[ ",$ROWS," == *",$1,"* ]]; }
{ uname -r; nproc; lscpu | grep -E "Model name|^CPU\(s\)"; } > "$O/probe.txt" 2>&1
if want tls; then
  TLS_CLIENT_CPUS=$C TLS_CLIENT_THREADS=4 timeout 150 taskset -c "$S" "$B/tls_echo" "$P" 2>&1 | tee "$O/tls.txt"
fi
if want udp; then
  UDP_CLIENT_CPUS=$C UDP_CLIENT_THREADS=4 timeout 120 taskset -c "$S" "$B/udp_echo" "$P" 2>&1 | tee "$O/udp.txt"
fi
if want http; then
  HTTP_CLIENT_CPUS=$C HTTP_CLIENT_THREADS=4 timeout 120 taskset -c "$S" "$B/http_echo" "$P" 2>&1 | tee "$O/http.txt"
fi
if want sessions; then
  SESSIONS_CLIENT_THREADS=6 SESSIONS_CLIENT_CPUS=$C timeout 150 taskset -c "$S" "$B/sessions" "$P" tenants1 tenants16 echo64 stream4k 2>&1 | tee "$O/sessions.txt"
fi
if want broker; then
  BROKER_ROWS=xadd-c1-rand,xadd-c1-P16-rand,xadd-c50-P16,xadd-c50-P16-rand BROKER_SHARDS=${BROKER_SHARD_COUNTS:-1,2,4} \
    BROKER_CLIENT_CPU=$C BROKER_CLIENT_THREADS=4 BROKER_SERVER_CPUS=${BROKER_CPUS:-0,1,2,3} timeout 150 "$B/broker_vs_redis" 3 everysec 2>&1 | tee "$O/broker.txt"
fi
echo done
