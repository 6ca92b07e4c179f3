#!/usr/bin/env bash
# Installs the Debian packages the tests need, when they are missing:
# redis-server and redis-sentinel (the tests start their own servers),
# chromium (the semaphores page in a browser) and prometheus, for promtool
# (the alert rules' unit tests and the lint of a worker's /metrics).
set -euo pipefail
need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v redis-sentinel >/dev/null || need+=(redis-sentinel)
command -v chromium >/dev/null || need+=(chromium)
command -v promtool >/dev/null || need+=(prometheus)
[ ${#need[@]} -eq 0 ] && exit 0
echo "installing: ${need[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
$sudo apt-get update -qq
plain=()
for p in "${need[@]}"; do [ "$p" = prometheus ] || plain+=("$p"); done
if [ ${#plain[@]} -gt 0 ]; then
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${plain[@]}" >/dev/null
fi
if [ ${#plain[@]} -lt ${#need[@]} ]; then
  # Without its recommends: they bring prometheus-node-exporter and its
  # service too.
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
# The Debian package starts a redis-server on 6379; the tests start their own.
# The prometheus package starts a Prometheus server on 9090 (where the init
# system lets it) that scrapes itself every few seconds; only promtool is
# wanted, so stop it and keep it from starting at boot.
if [ ${#plain[@]} -lt ${#need[@]} ]; then
  if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
    $sudo systemctl disable --now prometheus >/dev/null 2>&1 || true
  else
    $sudo service prometheus stop >/dev/null 2>&1 || true
    $sudo update-rc.d prometheus disable >/dev/null 2>&1 || true
  fi
fi
