#!/usr/bin/env bash
# Builds what benches/device/rows.sh needs on a lent machine that can reach
# nothing and may lack redis and taskset: the release benchmark examples and
# the broker, plus redis-server, redis-benchmark, redis-cli and taskset from
# this machine with the shared libraries they load, behind wrappers that run
# them through the bundled loader. Everything goes to .devbench/ (keep it out
# of git: `echo .devbench >> .git/info/exclude`); carry that path to the
# device and run `bash benches/device/rows.sh` there.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p mailring-broker -p mailring-bench --examples
D=.devbench
rm -rf "$D" && mkdir -p "$D/bin" "$D/lib" "$D/real" "$D/release/examples"
for ex in sessions broker_vs_redis tls_echo udp_echo http_echo; do
  cp "target/release/examples/$ex" "$D/release/examples/"
done
cp target/release/mailring-broker "$D/release/"
for tool in redis-server redis-benchmark redis-cli taskset; do
  path=$(command -v "$tool") || { echo "missing $tool: install it here first" >&2; exit 1; }
  cp "$(readlink -f "$path")" "$D/real/$tool"
  # Every library it loads, and the loader itself.
  ldd "$path" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /ld-linux/ {print $1}' | while read -r lib; do
    cp -n "$(readlink -f "$lib")" "$D/lib/$(basename "$lib")"
  done
  cat > "$D/bin/$tool" <<WRAP
#!/bin/sh
D=\$(dirname "\$(readlink -f "\$0")")/..
exec "\$D/lib/ld-linux-x86-64.so.2" --library-path "\$D/lib" "\$D/real/$tool" "\$@"
WRAP
  chmod +x "$D/bin/$tool"
done
du -sh "$D"
