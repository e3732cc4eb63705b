#!/usr/bin/env bash
# Writes the training text of the bundled model (models/tiny) into DIR
# (default .train/): the King James Version of the Bible from Debian's
# bible-kjv packages (public domain text; the packages' copyright file says
# so), one verse a line, chapters separated by a blank line, verse numbers
# dropped. Then make_corpus.py splits it into train / held-out chapters.
set -euo pipefail
out=${1:-.train}
mkdir -p "$out"
if ! command -v bible >/dev/null; then
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq bible-kjv >/dev/null
fi
bible -l0 -m 20000 "Ge1:1-Re22:21" > "$out/kjv_raw.txt"
python3 "$(dirname "$0")/make_corpus.py" "$out/kjv_raw.txt" "$out"
