#!/usr/bin/env bash
# The emulated testbed's system tools: nft (switch ports' ECN threshold and random loss, nftables) and
# ethtool (segmentation offloads off). Installed from the distribution's packages when run as root and
# missing; otherwise says what is missing and succeeds (without root the testbed is not used at all).
set -u
missing=()
command -v nft >/dev/null || missing+=(nftables)
command -v ethtool >/dev/null || missing+=(ethtool)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
    echo "testbed tools: ${missing[*]} not installed (needed only by the root-only namespace testbed)" >&2
    exit 0
fi
echo "testbed tools: installing ${missing[*]}" >&2
if command -v apt-get >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 \
        || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq "${missing[@]}" >/dev/null; }
elif command -v dnf >/dev/null; then
    dnf install -y -q "${missing[@]}" >/dev/null
else
    false
fi || echo "testbed tools: could not install ${missing[*]}; install them with your package manager" >&2
exit 0
