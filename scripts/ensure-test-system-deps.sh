#!/usr/bin/env bash
# Installs the Debian packages the browser, PostgreSQL and Prometheus tests need, when they
# are missing and this machine can install them (root + apt-get). Where it
# cannot, it says why; those tests then skip with that reason, except under
# CI=true where they must run (and fail loudly instead).
set -u
need=()
[ -x /usr/bin/chromium ] || need+=(chromium)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
# Prometheus 2.42 (promtool) and Alertmanager 0.25 (amtool): without their recommends (no node exporter).
lean=()
{ [ -x /usr/bin/prometheus ] && [ -x /usr/bin/promtool ]; } || lean+=(prometheus)
{ [ -x /usr/bin/prometheus-alertmanager ] && [ -x /usr/bin/amtool ]; } || lean+=(prometheus-alertmanager)
[ ${#need[@]} -eq 0 ] && [ ${#lean[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "note: cannot install ${need[*]} ${lean[*]} (needs root and apt-get); browser/PostgreSQL/Prometheus tests will skip unless CI=true" >&2
  exit 0
fi
echo "installing Debian packages for the tests: ${need[*]} ${lean[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null || echo "note: apt-get update failed" >&2
if [ ${#need[@]} -gt 0 ]; then
  apt-get install -y -qq "${need[@]}" >/dev/null \
    || echo "note: apt-get install ${need[*]} failed; the tests that need them will say so" >&2
fi
if [ ${#lean[@]} -gt 0 ]; then
  apt-get install -y -qq --no-install-recommends "${lean[@]}" >/dev/null \
    || echo "note: apt-get install ${lean[*]} failed; the tests that need them will say so" >&2
fi
exit 0
