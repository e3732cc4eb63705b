#!/usr/bin/env bash
# Installs what building and testing gemma4.c needs on Debian 12 (bookworm):
# the C libraries (one per need; README.md says why each) and the Python
# helpers some tests drive the tool with. Safe to run repeatedly.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config xz-utils git
  libcjson-dev          # JSON: config.json, tokenizer.json, HTTP bodies
  libmicrohttpd-dev     # HTTP server
  libturbojpeg0-dev libjpeg62-turbo-dev libspng-dev libwebp-dev  # image decoders
  libsndfile1-dev libmpg123-dev libsoxr-dev   # audio decoders (FLAC/Ogg/MP3), resampler
  libkissfft-dev        # FFT for log-mel features
  libcurl4-openssl-dev libssl-dev  # gemma4 pull
  libedit-dev           # line editing in gemma4 chat
  clang libclang-rt-14-dev  # fuzzers and sanitizers
  python3 python3-pip
  wamerican             # tests: the word list the bundled model's English is checked against
)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Python helpers used only by tests (never at run time).
if [ "${G4_SKIP_PIP:-0}" != 1 ]; then
  req="$(dirname "$0")/../tests/requirements.txt"
  pip=(python3 -m pip install -q --disable-pip-version-check -r "$req")
  # Debian's own python3 refuses system-wide installs (PEP 668) without this flag.
  "${pip[@]}" 2>/dev/null || "${pip[@]}" --break-system-packages
fi
