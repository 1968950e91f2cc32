#!/usr/bin/env bash
# Installs what the test suite needs beyond Go modules, when it is missing:
# Debian's redis-server, chromium, prometheus (for promtool, which tests
# docs/ops/spillway-alerts.yaml) and kcat (a librdkafka client: the Kafka
# interop test).
# Idempotent; safe to run on a developer machine (it only installs as root).
set -euo pipefail

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
# The demo report's test loads the HTML in a headless Chromium.
command -v chromium >/dev/null 2>&1 || need+=(chromium)
# promtool checks and unit-tests the alert rules (telemetry's TestAlertRules).
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
# kcat produces to and reads from the embedded broker in router's
# TestKafkaInteropKcat, as a client other than Sarama.
command -v kcat >/dev/null 2>&1 || need+=(kcat)

if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "deps: missing ${need[*]}; install them (apt-get install ${need[*]}) or run as root" >&2
  exit 0
fi
echo "deps: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
