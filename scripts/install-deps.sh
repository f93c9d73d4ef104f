#!/usr/bin/env bash
# Set up everything the project needs on a fresh Debian 12 machine where we are root.
# Idempotent: it installs only what is missing, so `make test` can run it every time.
#
# 1. Debian packages: mosquitto, mosquitto-clients, nftables, iproute2, openjdk-17-jre-headless
#    (for PySpark), systemd (systemd-analyze, systemd-sysusers) and logrotate (tests/packaging check the shipped
#    unit and logrotate file offline; nothing is started), prometheus (only for its promtool, which checks the
#    shipped alert rules; Debian ships promtool in no smaller package, and the server is never started),
#    python3-venv (the packaging test's virtual environments;
#    and python3, python3-pip if absent), haproxy, nodejs and npm (tests/real/test_load_balancer_real.py: clients
#    behind HAProxy, some of them MQTT.js). `apt-get update` runs once, and only if something is missing.
# 2. This repository, editable, with the test extra: `python3 -m pip install -e '.[test]'`.
#    Skipped when build/install-deps.stamp says setup.cfg, pyproject.toml, setup.py and the C sources have not
#    changed since the last install and every requirement is still satisfied.
# 3. MQTT.js (`mqtt` from npm, version MQTTJS_VERSION) into build/node, for the load balancer test's MQTT.js
#    subscribers; skipped when it is there. Without the npm registry that step fails with a warning, and the test
#    runs paho clients in their place (it says so).
#
# The mosquitto package may start its own system service (a broker on port 1883).
# The project never uses it: tests and the demo start their own brokers with
# `mosquitto -c FILE` on ports they choose. If that daemon is running, leave it alone.
set -euo pipefail

cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
PYTHON=${PYTHON:-python3}

say() { echo "install-deps: $*"; }

# Is a Debian package installed, or is the command it provides available anyway?
have() {
    local package=$1 command=$2
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" \
        || command -v "$command" >/dev/null 2>&1
}

missing=()
have mosquitto mosquitto || missing+=(mosquitto)
have mosquitto-clients mosquitto_pub || missing+=(mosquitto-clients)
have nftables nft || missing+=(nftables)
have iproute2 ip || missing+=(iproute2)
# Java 17 for PySpark (the Spark job, federation/spark/; its tests run in `make test`).
have openjdk-17-jre-headless java || missing+=(openjdk-17-jre-headless)
# The shipped service files (packaging/), checked offline by tests/packaging/test_service_files.py. On a Debian
# host with systemd-sysv, logrotate brings nothing else (systemd-sysv meets its `cron | ... | systemd-sysv`).
have systemd systemd-analyze || missing+=(systemd)
have logrotate logrotate || missing+=(logrotate)
# promtool checks packaging/prometheus/*.yml (tests/packaging/test_monitoring.py): Debian has it only in prometheus,
# installed without its recommends (prometheus-node-exporter). On a host with systemd the package starts its server
# (port 9090), as mosquitto's does; the project never uses it: `systemctl disable --now prometheus` if unwanted.
need_promtool=false
have prometheus promtool || need_promtool=true
# The load balancer test (tests/real/test_load_balancer_real.py): HAProxy in TCP mode in front of the brokers, and
# Node.js for its MQTT.js clients. Debian's haproxy package starts its service with its own configuration, which
# listens on no port; the tests start their own haproxy on addresses they choose.
have haproxy haproxy || missing+=(haproxy)
have nodejs node || missing+=(nodejs)
have npm npm || missing+=(npm)
# Resolve the interpreter itself, not a wrapper such as a pyenv shim (faster, one answer).
if interpreter=$("$PYTHON" -c 'import sys; print(sys.executable)' 2>/dev/null); then
    "$interpreter" -c 'import pip' 2>/dev/null || missing+=(python3-pip)
    # Debian's python3 has venv's ensurepip in python3-venv (python -m build and tests/packaging make venvs).
    "$interpreter" -c 'import ensurepip' 2>/dev/null || missing+=(python3-venv)
else
    missing+=(python3 python3-pip python3-venv)
fi

if ((${#missing[@]})) || $need_promtool; then
    apt-get update -q
    if ((${#missing[@]})); then
        say "installing Debian packages: ${missing[*]}"
        apt-get install -y -q "${missing[@]}"
    fi
    if $need_promtool; then
        say "installing Debian package prometheus (for promtool), without its recommends"
        apt-get install -y -q --no-install-recommends prometheus
    fi
else
    say "Debian packages present (mosquitto, mosquitto-clients, nftables, iproute2, Java 17, systemd, logrotate, promtool, haproxy, Node.js, npm)"
fi

[[ -n ${interpreter:-} ]] || interpreter=$("$PYTHON" -c 'import sys; print(sys.executable)')
PYTHON=$interpreter

# Debian's own python3 is "externally managed" (PEP 668) and refuses pip installs.
# CI machines are throwaway and we are root, so install into it anyway.
if "$PYTHON" -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")))'; then
    export PIP_BREAK_SYSTEM_PACKAGES=1
fi

if "$PYTHON" scripts/python-deps-current.py; then
    say "Python packages up to date (delete build/install-deps.stamp to force a reinstall)"
else
    say "installing this repository: $PYTHON -m pip install -e '.[test]'"
    "$PYTHON" -m pip install --quiet --root-user-action=ignore -e '.[test]'
    "$PYTHON" scripts/python-deps-current.py --write-stamp
fi

# MQTT.js for the load balancer test (tests/lb_util.py looks for build/node/node_modules/mqtt).
MQTTJS_VERSION=5.16.0
if [[ -f build/node/node_modules/mqtt/package.json ]] \
        && grep -q "\"version\": \"$MQTTJS_VERSION\"" build/node/node_modules/mqtt/package.json; then
    say "MQTT.js $MQTTJS_VERSION present (build/node)"
elif npm install --prefix build/node --no-audit --no-fund --loglevel=error "mqtt@$MQTTJS_VERSION"; then
    say "installed MQTT.js $MQTTJS_VERSION into build/node"
else
    say "WARNING: npm could not install MQTT.js $MQTTJS_VERSION into build/node; tests/real/test_load_balancer_real.py runs paho clients in place of its MQTT.js ones"
fi
