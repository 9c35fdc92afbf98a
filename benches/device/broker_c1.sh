#!/usr/bin/env bash
# The broker's one-client rows on a lent machine, with the runtime's
# counters (INFO mailring) after each: the broker on CPUs 0-3, one
# redis-benchmark client on CPU 8, appendfsync everysec, XADD on
# __rand_int__ keys over 100 streams, with and without a 16-deep pipeline,
# for each shard count and idle spin. Needs the bundle of
# benches/device/bundle.sh in .devbench/. `SPINS` and `SHARDS` change the
# lists (default 50,250 and 1,2,4); `N` the requests a row (100000);
# `SERVER_CPUS` and `CLIENT_CPU` the CPUs (0-3 and 8).
# Writes to $OUT/broker_c1.txt (default /tmp/out). About 30 s a setting.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PATH=$PWD/.devbench/bin:$PATH
B=$PWD/.devbench/release/mailring-broker
O=${OUT:-/tmp/out}; mkdir -p "$O"
N=${N:-100000}
{
SPINS=${SPINS:-50,250}; SHARDS=${SHARDS:-1,2,4}
S=${SERVER_CPUS:-0-3}; C=${CLIENT_CPU:-8}
for spin in ${SPINS//,/ }; do for sh in ${SHARDS//,/ }; do
  d=$(mktemp -d)
  taskset -c "$S" "$B" --port 7411 --shards "$sh" --dir "$d" --appendfsync everysec --spin-us "$spin" >/dev/null 2>&1 &
  P=$!
  sleep 0.7
  for pipe in 16 1; do
    r=$(taskset -c "$C" redis-benchmark -p 7411 -c 1 -P "$pipe" -n "$N" -r 100 -q XADD "s:__rand_int__" "*" f v 2>&1 \
      | tr '\r' '\n' | grep "requests per second" | tail -1)
    echo "spin=${spin}us shards=$sh -P $pipe: $r"
    redis-cli -p 7411 INFO mailring | grep shard | tr -d '\r' | sed 's/^/   /'
  done
  kill "$P"; wait "$P" 2>/dev/null; rm -rf "$d"
done; done
} 2>&1 | tee "$O/broker_c1.txt"
